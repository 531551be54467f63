import contextlib
import fcntl
import os
import zlib

import pytest
import torch


def pytest_addoption(parser):
    parser.addoption("--torch-seed", type=int, default=0,
                     help="added to every test's seed of torch's global generator: other random values")


@pytest.fixture(autouse=True)
def seeded_global_generator(request):
    """Each test draws what it takes from torch's global generator from a
    seed of its own, made from its name: the same values in every run,
    whichever tests a pytest-xdist worker happened to run before it, so a
    failure comes back when the test is run again; --torch-seed N draws others."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()) + request.config.getoption("torch_seed"))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@contextlib.contextmanager
def one_at_a_time(lock_path):
    """Holds an exclusive lock on `lock_path` (a file every pytest-xdist
    worker of this run sees; closing it lets the lock go): one test in the
    block at a time, across them."""
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(autouse=True)
def large_test_settings(request, tmp_path_factory):
    """Tests marked `large` run one at a time, even in parallel workers (each
    holds a few GB; two at once could exhaust the memory), with 8 intra-op
    threads, so that the CPU kernels split their work into parts starting
    past 2**31, as on a machine of 8 cores (with 2, every part would start
    below it); their CUDA memory goes back to the device when they end, not
    to this process's cache."""
    if request.node.get_closest_marker("large") is None:
        yield
        return
    # Under pytest-xdist, each worker's base temporary folder is one of a
    # folder they share; in one process, tests run one at a time anyway.
    if "PYTEST_XDIST_WORKER" in os.environ:
        alone = one_at_a_time(tmp_path_factory.getbasetemp().parent / "large_tests.lock")
    else:
        alone = contextlib.nullcontext()
    with alone:
        before = torch.get_num_threads()
        torch.set_num_threads(8)
        try:
            yield
        finally:
            torch.set_num_threads(before)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
