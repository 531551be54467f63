"""nonzero: fake kernels and the front doors ``torch_masked.nonzero`` and
``torch_masked.nonzero_static``.

The 2-D form is ``masked::nonzero`` and the ``as_tuple=True`` form is the
sibling op ``masked::nonzero_tuple``: a flag's value cannot choose between
overloads of one op, so each op has one return type. Neither is
differentiable (the result is integer indices).
"""
from __future__ import annotations

from typing import Literal, overload

import torch
from torch.overrides import handle_torch_function

from ._checks import as_integer, bounded_dynamic_size, check_flag, check_same_device
from ._overrides import entry_point, has_stand_in


# Dtypes where "non-zero" means nothing: no zero value, or two values to an element.
_DTYPES_WITHOUT_NONZERO = {getattr(torch, name) for name in ("float8_e8m0fnu", "float4_e2m1fn_x2") if hasattr(torch, name)}


# The most dimensions a CUDA input may have (as ATen's CUDA nonzero).
_MAX_CUDA_DIMS = 25


def _check_input(op, input):
    # csrc/common.h:check_nonzero_dtype and csrc/cuda/nonzero_kernel.cu:check_input print the same words.
    torch._check_type(
        input.dtype not in _DTYPES_WITHOUT_NONZERO,
        lambda: f"{op}: expected a dtype with a zero value and one value per element, got {input.dtype}",
    )
    torch._check(
        input.device.type != "cuda" or input.dim() <= _MAX_CUDA_DIMS,
        lambda: f"{op}: expected a tensor of at most {_MAX_CUDA_DIMS} dimensions on CUDA, got {input.dim()}",
    )


def _index_count(input):
    """The data-dependent number of non-zero elements, as an unbacked SymInt
    bounded by the number of elements where that is known (as
    torch.nonzero's is): Inductor then indexes what reads the result in 32
    bits where they suffice; without the bound, in 64 (on an H200,
    `(nonzero(x > 0) + 1).sum()` at 1e7 spent 0.12 ms more than native's)."""
    return bounded_dynamic_size(input.numel())


@torch.library.register_fake("masked::nonzero")
def _nonzero_fake(input):
    _check_input("nonzero", input)
    # Row-major contiguous, as the CPU and CUDA kernels write it.
    return input.new_empty((_index_count(input), input.dim()), dtype=torch.long)


@torch.library.register_fake("masked::nonzero_tuple")
def _nonzero_tuple_fake(input):
    _check_input("nonzero_tuple", input)
    count = _index_count(input)
    # A 0-d input is treated as 1-D with one element.
    return [input.new_empty((count,), dtype=torch.long) for _ in range(max(input.dim(), 1))]


@torch.library.register_fake("masked::nonzero_static")
def _nonzero_static_fake(input, *, size, fill_value=-1):
    _check_input("nonzero_static", input)
    torch._check_value(size >= 0, lambda: f"nonzero_static: expected size >= 0, got size={size}")
    return input.new_empty((size, input.dim()), dtype=torch.long)


# The ops the front doors call, as their entry points.
_nonzero = entry_point(torch.ops.masked.nonzero.default)
_nonzero_tuple = entry_point(torch.ops.masked.nonzero_tuple.default)
_nonzero_static = entry_point(torch.ops.masked.nonzero_static.default)


# The result's type follows as_tuple, for type checkers.
@overload
def nonzero(input: torch.Tensor, *, as_tuple: Literal[False] = ..., out: torch.Tensor | None = ...) -> torch.Tensor: ...
@overload
def nonzero(input: torch.Tensor, *, as_tuple: Literal[True], out: None = ...) -> tuple[torch.Tensor, ...]: ...
@overload
def nonzero(
    input: torch.Tensor, *, as_tuple: bool, out: torch.Tensor | None = ...
) -> torch.Tensor | tuple[torch.Tensor, ...]: ...


def nonzero(
    input: torch.Tensor, *, as_tuple: bool = False, out: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """Indices of the non-zero elements of ``input``, as ``torch.nonzero``.

    ``as_tuple=False``: an int64 tensor of shape ``[z, input.dim()]``, one
    row-major row per non-zero element. ``as_tuple=True``: a tuple of
    ``input.dim()`` 1-D int64 tensors (one for a 0-d input), so that
    ``input[nonzero(input, as_tuple=True)]`` are the non-zero values.
    ``out`` (2-D form only) is resized and filled, as ``torch.nonzero`` does.
    Non-zero means ``!= 0``: NaN and subnormals count, ``-0.0`` does not.
    """
    if isinstance(input, torch.Tensor) and out is None and as_tuple is False:
        return _nonzero(input)  # the common call, first
    check_flag("nonzero", "as_tuple", as_tuple)
    if has_stand_in(input, out):
        return handle_torch_function(nonzero, (input, out), input, as_tuple=as_tuple, out=out)
    if not isinstance(input, torch.Tensor):  # as torch.nonzero: no array-likes
        raise TypeError(f"nonzero: expected input to be a tensor, got {type(input).__name__}")
    if as_tuple:
        if out is not None:
            raise ValueError("nonzero: out= is not supported with as_tuple=True")
        return tuple(_nonzero_tuple(input))
    result = _nonzero(input)
    if out is None:
        return result
    if out.dtype != torch.long:
        raise RuntimeError(f"nonzero: expected out to have dtype torch.int64, got {out.dtype}")
    check_same_device("nonzero", input=input, out=out)
    return out.resize_(result.shape).copy_(result)


def nonzero_static(input: torch.Tensor, *, size: int | torch.SymInt, fill_value: int = -1) -> torch.Tensor:
    """The first ``size`` rows of ``nonzero(input)``, padded with ``fill_value``:
    a ``[size, input.dim()]`` int64 tensor, computed with no host-device sync."""
    if not isinstance(input, torch.Tensor) and not has_stand_in(input):
        raise TypeError(f"nonzero_static: expected input to be a tensor, got {type(input).__name__}")
    if type(size) is not int and not isinstance(size, torch.SymInt) and not has_stand_in(size):
        size = as_integer("nonzero_static", "size", size)
    if type(fill_value) is not int:
        fill_value = as_integer("nonzero_static", "fill_value", fill_value)
    return _nonzero_static(input, size=size, fill_value=fill_value)
