"""examples/train_masked.py runs, its loss falls, its compiled step equals
its eager step, and under DDP (torchrun, two gloo processes) it follows the
single process's losses. Marked ``cpu_kernel``: the script runs in its own
processes, on csrc/cpu's kernels."""
import json
import os
import subprocess
import sys

import pytest

from distributed_ranks import ROOT, local_environment

SCRIPT = os.path.join(ROOT, "examples", "train_masked.py")
pytestmark = pytest.mark.cpu_kernel


def _train(tmp_path, launcher, *arguments):
    report = tmp_path / "report.json"
    env = dict(os.environ, **local_environment())
    subprocess.run([*launcher, SCRIPT, "--report", str(report), *arguments], timeout=400, env=env, cwd=ROOT,
                   check=True)
    return json.loads(report.read_text())


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("single"), [sys.executable], "--steps", "30")


def test_loss_falls(single):
    losses = single["losses"]
    assert len(losses) == 30
    assert losses[-1] < 0.2 * losses[0], losses


def test_compiled_step_equals_eager_step(single):
    assert single["eager_compiled_difference"] < 1e-5


def test_ddp_under_torchrun_follows_one_process(tmp_path, single):
    # --standalone: a rendezvous on a free port of this machine.
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    # Both ranks must exit cleanly too (the example destroys its process group).
    ddp = _train(tmp_path, torchrun, "--ddp", "--steps", "4")
    assert ddp["world_size"] == 2
    assert ddp["eager_compiled_difference"] < 1e-5
    assert ddp["losses"] == pytest.approx(single["losses"][:4], rel=1e-4)
