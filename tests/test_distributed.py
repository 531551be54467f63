"""The ops on DTensors and under DistributedDataParallel, on two gloo
processes, and four for a 2x2 mesh (tests/distributed_ranks.py runs them).

Each group of processes is started once and runs many cases; the tests read
their reports. Marked ``cpu_kernel``: the processes load csrc/cpu's kernels,
never the emulated CUDA ones, so tests/cuda_emulation/run.py leaves them out.
"""
import os
import subprocess
import sys

import pytest
import torch

import distributed_ranks
from distributed_ranks import Failed, run_ranks

pytestmark = [
    pytest.mark.cpu_kernel,
    pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available"),
]

# Bounds on the whole group of processes, on a slow shared machine.
DTENSOR_TIMEOUT = 240
DDP_TIMEOUT = 300


def _reports(outcomes):
    for rank, outcome in enumerate(outcomes):
        assert not isinstance(outcome, Failed), f"rank {rank} raised {outcome.kind}: {outcome.message}\n{outcome.trace}"
    return outcomes


@pytest.fixture(scope="module")
def dtensor_report(tmp_path_factory):
    """Every DTensor case on both ranks: case -> None, or what went wrong."""
    directory = tmp_path_factory.mktemp("dtensor")
    first, second = _reports(run_ranks(distributed_ranks.dtensor_suite, 2, directory, DTENSOR_TIMEOUT))
    assert first.keys() == second.keys()
    return {name: first[name] or second[name] for name in first}


def _failures(report, prefix):
    cases = {name: problem for name, problem in report.items() if name.startswith(prefix)}
    assert cases, f"no case starts with {prefix!r}"
    return {name: problem for name, problem in cases.items() if problem is not None}


# Values equal the op on the full tensors and the output has the expected
# placements, on a 1-D mesh of 2 ranks and the 2x1 and 1x2 meshes.
@pytest.mark.parametrize(
    "op",
    ["where_", "select_", "gather_nd_", "scatter_nd_", "tensor_scatter_nd_add_", "boolean_mask_",
     "nonzero", "where_index_mode", "nonzero_static"],
)
def test_dtensor_values_and_placements(dtensor_report, op):
    assert _failures(dtensor_report, op) == {}


@pytest.mark.parametrize(
    "op", ["where", "select", "gather_nd", "scatter_nd", "tensor_scatter_nd_add", "boolean_mask"]
)
def test_dtensor_gradients(dtensor_report, op):
    assert _failures(dtensor_report, f"grad_{op}") == {}


def test_dtensor_bad_input_gives_pytorch_errors(dtensor_report):
    """DTensors on different meshes, or beside a plain tensor: PyTorch's own errors."""
    assert _failures(dtensor_report, "error_") == {}


def test_ddp_gradients_equal_one_process(tmp_path):
    """The example's model (gather_nd, where, scatter_nd, boolean_mask) under
    DDP, half the batch on each rank, eager and compiled with fullgraph=True,
    gives the gradients of one process on the whole batch."""
    for rank, differences in enumerate(_reports(run_ranks(distributed_ranks.ddp_gradients, 2, tmp_path, DDP_TIMEOUT))):
        assert differences["eager"] < 1e-6, (rank, differences)
        assert differences["compiled"] < 1e-6, (rank, differences)


def test_one_rank_raising_does_not_hang_the_other(tmp_path):
    """Rank 1 raises IndexError in the forward; rank 0, waiting in the
    gradient all-reduce, fails (its peer is gone, or the collective times
    out) instead of waiting for ever."""

    first, second = run_ranks(distributed_ranks.ddp_one_rank_raises, 2, tmp_path, 120, collective_timeout=10)
    assert isinstance(second, Failed) and second.kind == "IndexError", second
    assert "9 is out of range for dimension 0 of size 4" in second.message
    assert isinstance(first, Failed) and first.kind in ("RuntimeError", "DistBackendError"), first


def test_a_hanging_rank_is_reported_and_ended(tmp_path):
    with pytest.raises(distributed_ranks.RanksTimedOut, match=r"ranks \[1\] of 2 did not finish rank_one_hangs"):
        run_ranks(distributed_ranks.rank_one_hangs, 2, tmp_path, 20, str(tmp_path))
    for rank in (0, 1):
        with pytest.raises(ProcessLookupError):
            os.kill(int((tmp_path / f"pid{rank}").read_text()), 0)


REGISTERED = (
    "from torch.distributed.tensor import DTensor\n"
    "assert torch.ops.masked.where.self in DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs\n"
    "assert torch.ops.masked.boolean_mask.default in DTensor._op_dispatcher._custom_op_handlers\n"
)


@pytest.mark.parametrize(
    "imports",
    [
        # torch_masked alone does not load DTensor; importing it later registers the rules.
        "import sys, torch, torch_masked\nassert 'torch.distributed.tensor' not in sys.modules\n",
        "import torch, torch.distributed.tensor, torch_masked\n",
    ],
    ids=["torch_masked_first", "dtensor_first"],
)
def test_rules_registered_in_either_import_order(imports):
    env = dict(os.environ, **distributed_ranks.local_environment())
    subprocess.run([sys.executable, "-c", imports + REGISTERED], check=True, timeout=120, env=env)


def test_dtensor_on_a_2x2_mesh(tmp_path):
    """Every op on four ranks, each input's placements drawn for both mesh
    dimensions (twice sharded, sharded and Partial, Partial and replicated):
    values and gradients equal ATen's on the full tensors."""
    reports = _reports(run_ranks(distributed_ranks.dtensor_mesh_2x2, 4, tmp_path, DTENSOR_TIMEOUT, 12))
    assert all(report.keys() == reports[0].keys() for report in reports)
    assert {key.partition("[")[0] for key in reports[0]} == distributed_ranks._mesh_cases()[0].keys()
    failures = {name: next(r[name] for r in reports if r[name]) for name in reports[0] if any(r[name] for r in reports)}
    assert failures == {}
