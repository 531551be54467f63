"""masked::scatter_nd, masked::gather_nd, masked::tensor_scatter_nd_add: fake
kernels and the front doors ``torch_masked.scatter_nd``, ``gather_nd`` and
``tensor_scatter_nd_add``; the fake kernels of two ops that
torch_masked/compile.py puts in compiled graphs: the raising half of
gather_nd's bounds check, masked::check_gather_nd_indices, and
tensor_scatter_nd_add's in-place form, masked::tensor_scatter_nd_add_; and
masked::check_indices_in_bounds, the three ops' bounds check as an op of its
own (in Python), which vmap and compiled graphs call where the kernels' own
check cannot raise.

Each backward is one of the other two ops (scatter <-> gather), in
csrc/autograd/scatter_nd_autograd.cpp.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch.overrides import handle_torch_function

from ._checks import as_tensor, check, check_flag, check_same_device, equal_or_unknown, integer_or_none
from ._overrides import entry_point, has_stand_in
from ._types import Shape, TensorLike

# csrc/scatter_nd_index.h:kMaxIndexDepth
MAX_INDEX_DEPTH = 25
# csrc/scatter_nd_index.h:is_addable
ADDABLE_DTYPES = {
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128,
}


def _shape_str(shape):
    """A shape as C++ prints an IntArrayRef: [2, 3]."""
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _check_indices(op, indices, shape, shape_name):
    """csrc/scatter_nd_index.h:make_geometry. Returns K."""
    torch._check_type(
        indices.dtype in (torch.int32, torch.int64),
        lambda: f"{op}: expected indices of dtype torch.int32 or torch.int64, got {indices.dtype}",
    )
    check(indices.dim() >= 1, op, "expected indices with at least one dimension, got a 0-d tensor")
    depth = indices.shape[-1]
    check(
        depth <= len(shape),
        op,
        f"expected indices.shape[-1] <= len({shape_name}) = {len(shape)}, got indices of shape "
        f"{_shape_str(indices.shape)} for {shape_name} {_shape_str(shape)}",
    )
    check(depth <= MAX_INDEX_DEPTH, op, f"expected indices.shape[-1] <= {MAX_INDEX_DEPTH}, got {depth}")
    for size in shape:
        check(size >= 0, op, f"expected non-negative sizes in {shape_name}, got {_shape_str(shape)}")
    if all(type(size) is int for size in shape):  # sizes known only at run time are checked then
        check(math.prod(size for size in shape if size) < 2**63, op,
              f"expected sizes in {shape_name} whose product, sizes of 0 left out, is less than 2**63, got "
              f"{_shape_str(shape)}")
    return depth


def _rows_shape(indices, shape, depth):
    """indices.shape[:-1] + shape[K:]"""
    return list(indices.shape[:-1]) + list(shape[depth:])


def _check_scatter(op, tensor, indices, updates, shape):
    """csrc/scatter_nd_index.h:scatter_add_op."""
    shape_name = "shape" if tensor is None else "tensor.shape"
    if tensor is None:
        check_same_device(op, indices=indices, updates=updates)
    else:
        check_same_device(op, tensor=tensor, indices=indices, updates=updates)
    depth = _check_indices(op, indices, shape, shape_name)
    torch._check_type(
        updates.dtype in ADDABLE_DTYPES,
        lambda: f"{op}: expected updates of dtype bool, uint8, int8, int16, int32, int64, float16, bfloat16, "
        f"float32, float64, complex64 or complex128, got {updates.dtype}",
    )
    if tensor is not None:
        torch._check_type(
            updates.dtype == tensor.dtype,
            lambda: f"{op}: expected updates of the dtype of tensor, {tensor.dtype}, got {updates.dtype}",
        )
    expected = _rows_shape(indices, shape, depth)
    message = (
        f"expected updates of shape indices.shape[:-1] + {shape_name}[K:] = {_shape_str(expected)}, got "
        f"updates of shape {_shape_str(updates.shape)} (indices of shape {_shape_str(indices.shape)})"
    )
    check(updates.dim() == len(expected), op, message)
    for size, wanted in zip(updates.shape, expected):
        check(equal_or_unknown(size, wanted), op, message)


@torch.library.register_fake("masked::scatter_nd")
def _scatter_nd_fake(indices, updates, shape, *, check_bounds=True):
    _check_scatter("scatter_nd", None, indices, updates, shape)
    return updates.new_empty(shape)


@torch.library.register_fake("masked::tensor_scatter_nd_add")
def _tensor_scatter_nd_add_fake(tensor, indices, updates, *, check_bounds=True):
    _check_scatter("tensor_scatter_nd_add", tensor, indices, updates, tensor.shape)
    return tensor.new_empty(tensor.shape)


@torch.library.register_fake("masked::tensor_scatter_nd_add_")
def _tensor_scatter_nd_add_in_place_fake(tensor, indices, updates, *, check_bounds=True):
    _check_scatter("tensor_scatter_nd_add", tensor, indices, updates, tensor.shape)


@torch.library.register_fake("masked::gather_nd")
def _gather_nd_fake(params, indices, *, check_bounds=True):
    check_same_device("gather_nd", params=params, indices=indices)
    depth = _check_indices("gather_nd", indices, params.shape, "params.shape")
    return params.new_empty(_rows_shape(indices, params.shape, depth))


@torch.library.register_fake("masked::check_gather_nd_indices")
def _check_gather_nd_indices_fake(indices, params_shape, out_of_bounds):
    check_same_device("check_gather_nd_indices", indices=indices, out_of_bounds=out_of_bounds)
    _check_indices("gather_nd", indices, params_shape, "params.shape")
    if out_of_bounds.dtype != torch.bool:
        raise TypeError(f"check_gather_nd_indices: expected out_of_bounds of dtype bool, got {out_of_bounds.dtype}")
    if out_of_bounds.dim() != 0:
        raise ValueError(
            f"check_gather_nd_indices: expected a 0-d out_of_bounds, got shape {list(out_of_bounds.shape)}"
        )


# Reads the indices back (as the kernels' own check does), so it is kept out
# of CUDA graphs as they are (csrc/masked.cpp:kReadsBackToHost).
@torch.library.custom_op("masked::check_indices_in_bounds", mutates_args=(), tags=(torch.Tag.cudagraph_unsafe,))
def _check_indices_in_bounds(op: str, indices: torch.Tensor, shape: Sequence[int], batch_dims: int) -> None:
    """The kernels' IndexError of `op` for the first index row outside
    `shape` (csrc/scatter_nd_index.h:raise_out_of_bounds), `indices` of shape
    [*batch (batch_dims), *rows, K], the row named within its sample. An op
    of its own, returning nothing (a side effect that Inductor keeps), for
    where the kernel's own check cannot raise it: under vmap, for every
    sample (torch_masked/transforms.py:_check_bounds), and in compiled graphs
    for a call whose result has no elements, which Inductor would drop
    (torch_masked/compile.py:_call_of_ours). Tracing its host read
    would fail, so a compiled graph calls it. One host sync, as the kernel's
    check has."""
    depth = indices.shape[-1]
    if depth == 0 or indices.numel() == 0:
        return
    # int64 even for int32 indices: a dimension may have 2**31 or more elements.
    sizes = torch.tensor(shape[:depth], dtype=torch.int64, device=indices.device)
    bad = ((indices < 0) | (indices >= sizes)).any(-1)
    if not bad.any():
        return
    position = [int(p) for p in torch.nonzero(bad)[0]]
    index = [int(v) for v in indices[tuple(position)]]
    position = position[batch_dims:]
    bad_dim = next(j for j, v in enumerate(index) if not 0 <= v < shape[j])
    where = "indices" + (f"[{', '.join(map(str, position))}]" if position else "")
    raise IndexError(
        f"{op}: expected every index within shape [{', '.join(map(str, shape))}], got "
        f"[{', '.join(map(str, index))}] at {where} ({index[bad_dim]} is out of range for dimension "
        f"{bad_dim} of size {shape[bad_dim]})"
    )


@_check_indices_in_bounds.register_fake
def _check_indices_in_bounds_fake(op, indices, shape, batch_dims):
    return None


torch.fx.node.has_side_effect(torch.ops.masked.check_indices_in_bounds.default)


def _as_tensor(op, name, value, device, partner_dtype=None):
    """A tensor unchanged (so that a wrong dtype or device is still refused by
    the op); a Python number, (nested) list or array (`op`'s argument `name`)
    made into one on `device`. Beside a tensor of `partner_dtype` it takes
    that dtype unless its values would change kind (1.7 truncated to 1, say):
    then it keeps its own, and the op refuses the pair as it refuses such
    tensors."""
    if isinstance(value, torch.Tensor):
        return value
    own = as_tensor(op, name, value, device=device)
    if partner_dtype is None or own.dtype == partner_dtype:
        return own
    if own.numel() == 0 or _keeps_kind(own.dtype, partner_dtype):
        # Made again from the values, so that torch refuses one that
        # overflows partner_dtype, as torch.tensor does.
        return as_tensor(op, name, value, dtype=partner_dtype, device=device)
    return own


def _keeps_kind(dtype, partner_dtype):
    """Whether values of `dtype` stay what they are in `partner_dtype`: no
    complex to real, floating to integer or integer to bool (the kind rule
    of torch.can_cast, which torch.compile cannot trace)."""
    if dtype.is_complex:
        return partner_dtype.is_complex
    if dtype.is_floating_point:
        return partner_dtype.is_floating_point or partner_dtype.is_complex
    return dtype == torch.bool or partner_dtype != torch.bool


def _as_index_tensor(op, indices, device):
    """Indices given as a (nested) list become an int64 tensor; a list of
    floats stays float, so that the op refuses it."""
    if isinstance(indices, torch.Tensor):
        return indices
    indices = as_tensor(op, "indices", indices, device=device)
    if indices.numel() == 0 and indices.is_floating_point():
        indices = indices.long()
    return indices


def _device_of(*values):
    return next((v.device for v in values if isinstance(v, torch.Tensor)), None)


def _dtype_of(value):
    return value.dtype if isinstance(value, torch.Tensor) else None


# The ops the front doors call, as their entry points.
_scatter_nd = entry_point(torch.ops.masked.scatter_nd.default)
_tensor_scatter_nd_add = entry_point(torch.ops.masked.tensor_scatter_nd_add.default)
_gather_nd = entry_point(torch.ops.masked.gather_nd.default)


def _call(op, name, check_bounds, *args):
    # The keyword only when it is not the default: keywords slow the call down.
    if check_bounds is True:
        return op(*args)
    check_flag(name, "check_bounds", check_bounds)
    return op(*args, check_bounds=False)


def scatter_nd(indices: TensorLike, updates: TensorLike, shape: Shape, *, check_bounds: bool = True) -> torch.Tensor:
    """A new tensor of ``shape``, zero, plus ``updates`` added at ``indices``
    (``tf.scatter_nd``). ``indices`` is int32/int64 of shape ``[..., K]``,
    ``updates`` of shape ``indices.shape[:-1] + shape[K:]``; duplicate indices
    add up (bool updates OR together). An index out of bounds is an
    IndexError; with ``check_bounds=False`` (no device sync, e.g. inside a
    CUDA graph) such rows are dropped instead. Lists are accepted for
    ``indices``, ``updates`` and ``shape``."""
    # The common call first: tensors and plain ints (the tests below cost
    # about 1 µs, a fifth of a call on ten elements), tested by a loop and
    # called directly where checked: all() of a generator and _call's frame
    # cost 0.3 µs more, the overhead benchmark's call on ten elements
    # 1.07-1.10x native's index_put where it is now 1.00-1.03x.
    if isinstance(indices, torch.Tensor) and isinstance(updates, torch.Tensor) and isinstance(shape, (list, tuple)):
        for size in shape:
            if type(size) is not int:
                break
        else:
            if check_bounds is True:
                return _scatter_nd(indices, updates, shape)
            return _call(_scatter_nd, "scatter_nd", check_bounds, indices, updates, shape)
    sizes = shape if isinstance(shape, (list, tuple)) else (shape,)  # FX traces x.shape[0] as a Proxy
    if has_stand_in(indices, updates, *sizes):
        return handle_torch_function(
            scatter_nd, (indices, updates, *sizes), indices, updates, shape, check_bounds=check_bounds
        )
    if not (isinstance(indices, torch.Tensor) and isinstance(updates, torch.Tensor)):
        device = _device_of(indices, updates)
        indices = _as_index_tensor("scatter_nd", indices, device)
        updates = _as_tensor("scatter_nd", "updates", updates, indices.device)
    if isinstance(shape, torch.Tensor):
        shape = shape.tolist()
    if not isinstance(shape, Sequence):
        raise TypeError(f"scatter_nd: expected shape to be a sequence of sizes (a list, tuple, torch.Size or "
                        f"1-D tensor), got {shape!r}")
    sizes = [size if isinstance(size, torch.SymInt) else integer_or_none(size) for size in shape]
    if any(size is None for size in sizes):
        # The op's own refusal of a float size is a long pybind11 cast error;
        # a bool would pass it as 0 or 1, where torch.zeros refuses it.
        raise TypeError(f"scatter_nd: expected shape of integers, got {list(shape)}")
    return _call(_scatter_nd, "scatter_nd", check_bounds, indices, updates, sizes)


def tensor_scatter_nd_add(
    tensor: TensorLike, indices: TensorLike, updates: TensorLike, *, check_bounds: bool = True
) -> torch.Tensor:
    """``tensor`` plus ``updates`` added at ``indices`` (out of place), as
    ``tf.tensor_scatter_nd_add``; the rules of ``scatter_nd`` apply."""
    if not (isinstance(tensor, torch.Tensor) and isinstance(indices, torch.Tensor)
            and isinstance(updates, torch.Tensor)):
        if has_stand_in(tensor, indices, updates):
            return handle_torch_function(
                tensor_scatter_nd_add, (tensor, indices, updates), tensor, indices, updates, check_bounds=check_bounds
            )
        op = "tensor_scatter_nd_add"
        tensor = _as_tensor(op, "tensor", tensor, _device_of(tensor, indices, updates), _dtype_of(updates))
        indices = _as_index_tensor(op, indices, tensor.device)
        updates = _as_tensor(op, "updates", updates, tensor.device, tensor.dtype)
    return _call(_tensor_scatter_nd_add, "tensor_scatter_nd_add", check_bounds, tensor, indices, updates)


def gather_nd(params: TensorLike, indices: TensorLike, *, check_bounds: bool = True) -> torch.Tensor:
    """The slices of ``params`` at ``indices`` (``tf.gather_nd``): shape
    ``indices.shape[:-1] + params.shape[K:]``. An index out of bounds is an
    IndexError; with ``check_bounds=False`` its rows are zeros instead."""
    if not (isinstance(params, torch.Tensor) and isinstance(indices, torch.Tensor)):
        if has_stand_in(params, indices):
            return handle_torch_function(gather_nd, (params, indices), params, indices, check_bounds=check_bounds)
        params = _as_tensor("gather_nd", "params", params, _device_of(params, indices))
        indices = _as_index_tensor("gather_nd", indices, params.device)
    return _call(_gather_nd, "gather_nd", check_bounds, params, indices)
