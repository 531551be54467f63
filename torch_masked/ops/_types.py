"""What the front doors accept, named for their annotations (the package
ships ``py.typed``, so a user's type checker reads them)."""
from typing import Any, Protocol, Sequence, SupportsIndex, Union

import torch


class SupportsArray(Protocol):
    """A NumPy array, or anything else NumPy and torch read through ``__array__``."""

    def __array__(self) -> Any: ...


Number = Union[bool, int, float, complex]
# What a front door makes a tensor of: a tensor, a number, a (nested) list or
# tuple of numbers, or an array.
TensorLike = Union[torch.Tensor, Number, Sequence[Any], SupportsArray]
# A shape: ints (NumPy's too), torch.SymInt sizes, or a 1-D integer tensor.
Shape = Union[Sequence[SupportsIndex], torch.Tensor]
