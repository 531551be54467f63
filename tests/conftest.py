import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def large_test_settings(request):
    """Tests marked `large` run with 8 intra-op threads, so that the CPU
    kernels split their work into parts starting past 2**31, as on a machine
    of 8 cores (with 2, every part would start below it); their CUDA memory
    goes back to the device when they end, not to this process's cache."""
    if request.node.get_closest_marker("large") is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(8)
    try:
        yield
    finally:
        torch.set_num_threads(before)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
