"""torch_masked: TensorFlow-style masked and index operations as PyTorch
custom operators (``torch.ops.masked.*``) with our own CPU and CUDA kernels,
fake kernels and autograd formulas.

Importing the package loads the compiled extension ``torch_masked._C`` (which
declares the schemas and registers the kernels), then registers the fake
kernels and autograd formulas and exposes the Python front door. A missing or
broken build fails here, loudly, with the original error.
"""

import torch  # noqa: F401  -- libtorch must be loaded before our extension

from . import _C  # noqa: F401
from .ops.nonzero import nonzero, nonzero_static
from .ops.scatter_nd import gather_nd, scatter_nd, tensor_scatter_nd_add

__all__ = [
    "nonzero",
    "nonzero_static",
    "scatter_nd",
    "gather_nd",
    "tensor_scatter_nd_add",
]
