"""masked::boolean_mask and masked::boolean_mask_backward: fake kernels and
the front door ``torch_masked.boolean_mask``.

The backward op writes the gradient slices back into zeros; its own gradient
is ``boolean_mask`` again, so every order of derivative stays inside our ops
(csrc/autograd/boolean_mask_autograd.cpp).
"""
from __future__ import annotations

from typing import SupportsIndex

import torch
from torch.overrides import handle_torch_function

from ._checks import as_integer, as_tensor, bounded_dynamic_size, check_same_device, equal_or_unknown
from ._overrides import entry_point, has_stand_in
from ._types import TensorLike


def _shape_str(shape):
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _masked_view(op, shape_name, shape, mask, axis):
    """Mirrors csrc/boolean_mask.h:masked_view; returns (normalised axis, mask.dim())."""
    torch._check_type(
        mask.dtype == torch.bool,
        lambda: f"{op}: expected mask of dtype torch.bool, got {mask.dtype}",
    )
    rank = len(shape)
    mask_dims = mask.dim()
    torch._check_value(mask_dims >= 1, lambda: f"{op}: expected mask of rank >= 1, got a 0-d mask")
    torch._check_value(
        mask_dims <= rank,
        lambda: f"{op}: expected mask.dim() <= {rank} (the rank of {shape_name}), got mask.dim()={mask_dims}",
    )
    torch._check_index(
        -rank <= axis < rank,
        lambda: f"{op}: expected axis in [{-rank}, {rank}) for {shape_name} of rank {rank}, got axis={axis}",
    )
    start = axis + rank if axis < 0 else axis
    torch._check_value(
        start + mask_dims <= rank,
        lambda: f"{op}: expected axis + mask.dim() <= {rank} (the rank of {shape_name}), "
        f"got axis={axis}{f' (dimension {start})' if axis < 0 else ''} and mask.dim()={mask_dims}",
    )
    for size, mask_size in zip(shape[start : start + mask_dims], mask.shape):
        torch._check_value(
            equal_or_unknown(size, mask_size),
            lambda: f"{op}: expected mask.shape to equal {shape_name}[{start}:{start + mask_dims}], "
            f"got mask.shape={_shape_str(mask.shape)} and {shape_name}={_shape_str(shape)}",
        )
    return start, mask_dims


@torch.library.register_fake("masked::boolean_mask")
def _boolean_mask_fake(tensor, mask, axis=0):
    check_same_device("boolean_mask", tensor=tensor, mask=mask)
    start, mask_dims = _masked_view("boolean_mask", "tensor.shape", tensor.shape, mask, axis)
    selected = bounded_dynamic_size(mask.numel())
    return tensor.new_empty([*tensor.shape[:start], selected, *tensor.shape[start + mask_dims :]])


@torch.library.register_fake("masked::boolean_mask_backward")
def _boolean_mask_backward_fake(grad, mask, input_shape, axis):
    check_same_device("boolean_mask_backward", grad=grad, mask=mask)
    start, mask_dims = _masked_view("boolean_mask_backward", "input_shape", input_shape, mask, axis)
    for size in input_shape:
        torch._check_value(
            size >= 0,
            lambda: "boolean_mask_backward: expected non-negative sizes in input_shape, "
            f"got input_shape={_shape_str(input_shape)}",
        )
    expected = [*input_shape[:start], None, *input_shape[start + mask_dims :]]

    def message():
        shape = ", ".join("n" if size is None else str(size) for size in expected)
        return f"boolean_mask_backward: expected grad of shape [{shape}], got {_shape_str(grad.shape)}"

    torch._check_value(grad.dim() == len(expected), message)
    for size, grad_size in zip(expected, grad.shape):
        if size is not None:
            torch._check_value(equal_or_unknown(size, grad_size), message)
    return grad.new_empty(input_shape)


# The op the front door calls, as its entry point.
_boolean_mask = entry_point(torch.ops.masked.boolean_mask.default)


def boolean_mask(tensor: TensorLike, mask: TensorLike, axis: SupportsIndex | None = None) -> torch.Tensor:
    """``tf.boolean_mask``: the slices of ``tensor`` where ``mask`` is true.

    ``mask`` is a bool tensor of rank K >= 1 whose shape equals
    ``tensor.shape[axis:axis + K]``; ``axis`` (default 0) may be negative and
    then counts from the end of ``tensor.shape``. The result has shape
    ``tensor.shape[:axis] + [n] + tensor.shape[axis + K:]``, ``n`` the number
    of true elements, taken in row-major order of ``mask``: for ``axis=0``
    that is NumPy's ``tensor[mask]``. Array-likes (lists, NumPy arrays) are
    accepted for both arguments. Differentiable with respect to ``tensor``.
    """
    if has_stand_in(tensor, mask, axis):
        return handle_torch_function(boolean_mask, (tensor, mask, axis), tensor, mask, axis)
    if not isinstance(tensor, torch.Tensor):
        tensor = as_tensor("boolean_mask", "tensor", tensor)
    if not isinstance(mask, torch.Tensor):
        mask = as_tensor("boolean_mask", "mask", mask, device=tensor.device)
    axis = 0 if axis is None else as_integer("boolean_mask", "axis", axis)
    return _boolean_mask(tensor, mask, axis)
