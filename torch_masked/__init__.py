"""torch_masked: TensorFlow-style masked and index operations as PyTorch
custom operators (``torch.ops.masked.*``) with our own CPU and CUDA kernels,
fake kernels and autograd formulas.

Importing the package loads the compiled extension ``torch_masked._C`` (which
declares the schemas and registers the kernels and autograd formulas), then
registers the fake kernels and exposes the Python front door. A missing or
broken build fails here, loudly, with the original error.
"""

import torch  # noqa: F401  -- libtorch must be loaded before our extension

try:
    from . import _C  # noqa: F401
except ImportError as error:
    raise ImportError(
        "torch_masked: the compiled extension torch_masked._C could not be loaded "
        f"({error}). Build it with `pip install --no-build-isolation -e .` "
        "(see README.md) against the torch that is installed now."
    ) from error
from .ops.boolean_mask import boolean_mask
from .ops.nonzero import nonzero, nonzero_static
from .ops.scatter_nd import gather_nd, scatter_nd, tensor_scatter_nd_add
from .ops.where import select, where
from . import transforms  # noqa: F401,E402  -- the ops under torch.func
# Not in __all__: a star import would shadow the builtin compile.
from . import compile  # noqa: F401  -- Inductor decompositions (registered when Inductor loads), the opaque switch
from .sharding import register_when_dtensor_loads

register_when_dtensor_loads()

__all__ = [
    "boolean_mask",
    "nonzero",
    "nonzero_static",
    "gather_nd",
    "scatter_nd",
    "select",
    "tensor_scatter_nd_add",
    "where",
]
