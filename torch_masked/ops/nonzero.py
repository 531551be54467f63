"""masked::nonzero, masked::nonzero_tuple, masked::nonzero_static: fake
kernels and the front door ``torch_masked.nonzero`` / ``nonzero_static``."""
import torch

def nonzero(input, *, as_tuple=False, out=None):
    if as_tuple:
        return tuple(torch.ops.masked.nonzero_tuple.default(input))
    return torch.ops.masked.nonzero.default(input)

def nonzero_static(input, *, size, fill_value=-1):
    return torch.ops.masked.nonzero_static.default(input, size=size, fill_value=fill_value)
