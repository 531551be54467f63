import pytest
import torch


# Tests that start processes of their own (ranks, torchrun, the example's
# training runs); their modules share fixtures that start more.
STARTS_PROCESSES = ("test_distributed", "test_example")


# tryfirst: before pytest-xdist's own hook reads the groups.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """With pytest-xdist's --dist loadgroup, the tests marked `large` (about
    12 GB each) run one at a time in one worker, and so do those that start
    processes (each module's shared fixture then runs once)."""
    for item in items:
        if item.get_closest_marker("large") is not None:
            item.add_marker(pytest.mark.xdist_group("large"))
        elif item.module.__name__ in STARTS_PROCESSES:
            item.add_marker(pytest.mark.xdist_group("starts_processes"))
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
