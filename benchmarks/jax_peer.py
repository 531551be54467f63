"""The JAX side of a benchmark case, where JAX is installed and has a backend
for the run's device (the GPU for a CUDA run, the CPU for a CPU run);
otherwise `side` gives None and the rows have no JAX figure."""
import os

import torch

# By default JAX takes 75% of a GPU's memory at its first use, which the
# torch sides in the same process need.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# BENCH_JAX=0 leaves JAX out (gpu_check.sh does so where JAX cannot share
# the GPU with torch in one process).
try:
    if os.environ.get("BENCH_JAX", "1") == "0":
        raise ImportError("BENCH_JAX=0")
    import jax
    import jax.numpy as jnp
except ImportError:
    jax = jnp = None
else:
    # Without it JAX makes int64 indices int32; our ops take int64.
    jax.config.update("jax_enable_x64", True)


def device(torch_device):
    """The JAX device that matches torch_device, or None."""
    if jax is None:
        return None
    torch_device = torch.device(torch_device)
    try:
        devices = jax.devices("gpu" if torch_device.type == "cuda" else "cpu")
    except RuntimeError:  # JAX has no backend of that kind here
        return None
    if torch_device.type != "cuda":
        return devices[0]
    return devices[torch.cuda.current_device() if torch_device.index is None else torch_device.index]


def side(torch_device, fn, *args, jit=True):
    """A case's JAX side: fn (jitted unless told otherwise: what has a size
    known only from the data runs eagerly) on copies of the tensors among
    args on the matching JAX device, returning once its results are ready,
    so that a timing includes the work. Its first call, the compile, falls
    in the harness's warm-up. None where there is no matching JAX device."""
    where = device(torch_device)
    if where is None:
        return None
    fn = jax.jit(fn) if jit else fn
    args = [_copy(a, where) if isinstance(a, torch.Tensor) else a for a in args]
    return lambda: jax.block_until_ready(fn(*args))


def _copy(tensor, where):
    """A copy of tensor that JAX owns, on `where`. Imported without a copy
    first, the one import the GPU's PJRT plugin supports (asked for a copy,
    it refuses), then copied by JAX on its device."""
    shared = jax.dlpack.from_dlpack(tensor.detach().contiguous())
    return jax.device_put(shared, where, may_alias=False)
