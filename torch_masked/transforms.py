"""The ops under PyTorch's function transforms (``torch.func.grad``, ``vjp``,
``jacrev``, ``jacfwd``, ``jvp``, ``hessian``, ``vmap`` and their nestings).

functorch refuses a C++ ``torch::autograd::Function`` (our eager autograd,
csrc/autograd/), and an op whose autograd comes from
``torch.library.register_autograd`` too (it also costs several times more per
eager call). What functorch supports is a Python ``torch.autograd.Function``
with ``setup_context``, ``backward``, ``jvp`` and ``vmap`` staticmethods.

So each op overload gets, here, a Python kernel for the dispatch key
``FuncTorchDynamicLayerFrontMode``. That key is in the dispatcher's included
set only while a transform is active, so a plain eager call never reaches
these kernels and keeps the C++ path at its cost. The kernel calls the op's
``torch.autograd.Function``: functorch runs the rule of the innermost active
transform (backward and setup_context under grad, jvp under jvp, vmap under
vmap) and calls ``forward`` one transform level down, where the same op is
called again, and so on to the plain kernels. The rules are built from our
ops, so they nest (hessian, ``vmap(grad)``).

Batching rules call the op once on the whole batch. An op whose per-sample
result has a data-dependent size (``nonzero`` of a batched tensor,
``boolean_mask`` with a batched mask) is refused, as PyTorch refuses
``x[mask]``. Before a batch dimension is moved into a call, the logical
(per-sample) shapes are checked with the op's own fake-kernel checks, so a bad
call raises the error an eager call raises, about the shapes the user wrote.

Forward-mode AD outside functorch (``torch.autograd.forward_ad``) is in C++,
csrc/autograd/records_graph.h.

Sections follow the ops' order: nonzero, where, select, boolean_mask,
scatter_nd, gather_nd, tensor_scatter_nd_add.
"""
import math

import torch

from .ops.boolean_mask import _boolean_mask_backward_fake, _masked_view
from .ops.nonzero import _nonzero_static_fake
from .ops.scatter_nd import _check_indices, _check_scatter
from .ops.where import _select_fake, _where_fake

_ops = torch.ops.masked
_lib = torch.library.Library("masked", "IMPL")


def _register(overload, function):
    """Run `overload` under every transform through the autograd.Function `function`."""
    def kernel(*args, **kwargs):  # keyword-only arguments in schema order
        return function.apply(*args, *kwargs.values())

    _lib.impl(overload, kernel, "FuncTorchDynamicLayerFrontMode")


# Shared helpers for the batching rules.


def _logical_shape(tensor, dim):
    """The per-sample shape of a tensor batched at `dim` (None: not batched)."""
    shape = list(tensor.shape)
    if dim is not None:
        del shape[dim]
    return shape


def _logical_meta(value, dim):
    """A meta tensor of the per-sample shape and dtype, for the fake kernels'
    checks; a number unchanged."""
    if not isinstance(value, torch.Tensor):
        return value
    return torch.empty(_logical_shape(value, dim), dtype=value.dtype, device="meta")


def _batch_first(tensor, dim, batch_size):
    """The tensor with its batch dimension first; an unbatched one expanded
    (a view) to the batch."""
    if dim is None:
        return tensor.expand(batch_size, *tensor.shape)
    return tensor.movedim(dim, 0)


def _padded(value, dim, rank):
    """A batched operand of a broadcasting op as [batch, 1, ..., *shape], with
    `rank` dimensions after the batch, so that it broadcasts per sample; an
    unbatched one (or a number) unchanged, as it broadcasts from the right."""
    if dim is None:
        return value
    value = value.movedim(dim, 0)
    return value.reshape(value.shape[0], *[1] * (rank + 1 - value.dim()), *value.shape[1:])


def _refuse_batched(op, what):
    raise RuntimeError(
        f"{op}: vmap over a batched {what} is not supported: each sample's result would have its own, "
        "data-dependent size (as torch refuses x[mask] and torch.nonzero under vmap)"
    )


def _with_batch_coordinate(indices, batch_size):
    """Index rows batched at dimension 0, [batch, ..., K], as rows into the
    batched shape [batch, *shape]: each row gets its sample number as its
    first coordinate, [batch, ..., K + 1]."""
    samples = torch.arange(batch_size, dtype=indices.dtype, device=indices.device)
    samples = samples.view(-1, *[1] * (indices.dim() - 1)).expand(*indices.shape[:-1], 1)
    return torch.cat([samples, indices], dim=-1)


def _every_sample(tensor):
    """A tensor's values under every enclosing transform, as a plain tensor:
    grad's and jvp's wrappers removed, each enclosing vmap's batch dimension
    placed first (innermost last); and how many batch dimensions that is."""
    functorch = torch._C._functorch
    batch_dims = 0
    while functorch.is_functorch_wrapped_tensor(tensor):
        batch_dim = functorch.maybe_get_bdim(tensor) if functorch.is_batchedtensor(tensor) else None
        tensor = functorch.get_unwrapped(tensor)
        if batch_dim is not None:
            tensor = tensor.movedim(batch_dim, 0)
            batch_dims += 1
    return tensor, batch_dims


def _check_bounds(op, indices, dim, shape):
    """The kernels' IndexError for an index row outside `shape` (the logical
    shape; csrc/scatter_nd_index.h:raise_out_of_bounds), raised here because
    a batched call's own check would name the batched shape. Indices
    batched by enclosing vmaps too are checked here for all their samples,
    since the calls made below skip the kernels' check."""
    if dim is not None:
        indices = indices.movedim(dim, 0)
    indices, batch_dims = _every_sample(indices)
    _ops.check_indices_in_bounds(op, indices, shape, batch_dims + (dim is not None))


def _to_branch(grad, shape, dtype):
    """A selection's gradient for one branch: the real part for a real branch
    of a complex result, summed back to the branch's `shape` where the op
    broadcasts (None: it does not), in the branch's dtype
    (csrc/autograd/where_autograd.cpp:to_branch)."""
    if grad.is_complex() and not dtype.is_complex:
        grad = grad.real
    # A 0-d gradient summed to a 0-d branch would still turn -0.0 into +0.0.
    if shape is not None and not (len(shape) == 0 and grad.dim() == 0):
        if grad.is_complex() and grad.element_size() < 8:  # complex32, bcomplex32: no CPU sum in ATen
            grad = grad.to(torch.complex64)
        grad = grad.sum_to_size(shape)
    return grad.to(dtype)


# nonzero, nonzero_tuple, nonzero_static and where(condition): integer
# results, nothing to differentiate; under vmap only nonzero_static, whose
# size is fixed, has a batching rule.


def _nonzero_flags(x):
    """Whether each element is non-zero, decided on the bits as the kernels
    decide (csrc/common.h): the sign bit of each floating-point part ignored
    (-0.0 is zero; NaN and subnormals count), except in the "fnuz" float8
    types, where the sign bit alone is NaN."""
    if x.dtype.is_complex:
        return _nonzero_flags(torch.view_as_real(x)).any(-1)
    bits = x.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])
    if x.dtype.is_floating_point and "fnuz" not in str(x.dtype):
        return (bits & torch.iinfo(bits.dtype).max) != 0
    return bits != 0


def _nonzero_static_batched(x, size, fill_value):
    """The first `size` non-zero positions of each x[b], as coordinates,
    padded with fill_value: [batch, size, x.dim() - 1]. Each element's rank
    among its sample's non-zeros is a cumulative sum; the first `size` go to
    their slot with our scatter_nd (integer adds: exact and deterministic),
    every other element to one spare slot per sample that is dropped. Its
    intermediates are a few int64 per element of the whole batch (O(batch *
    numel), where the kernel needs none), the price of one batched call
    without a kernel of its own."""
    batch, sample_shape = x.shape[0], x.shape[1:]
    flags = _nonzero_flags(x.reshape(batch, math.prod(sample_shape)))
    count = flags.shape[1]
    rank = flags.cumsum(1)
    slot = _ops.where.ScalarOther(flags & (rank <= size), rank - 1, size)
    slot += torch.arange(batch, device=x.device).unsqueeze(1) * (size + 1)
    # Each position stored plus one, so that an empty slot (0) becomes -1.
    positions = torch.arange(1, count + 1, device=x.device).expand(batch, count)
    first = _ops.scatter_nd(slot.reshape(-1, 1), positions.reshape(-1), [batch * (size + 1)], check_bounds=False)
    first = first.view(batch, size + 1)[:, :size] - 1
    # An empty sample has no non-zeros, so every slot is fill_value; its
    # sizes count as 1 only to keep the division below defined.
    sample_shape = [max(s, 1) for s in sample_shape]
    strides = [1] * len(sample_shape)
    for d in range(len(sample_shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * sample_shape[d + 1]
    strides = torch.tensor(strides, dtype=torch.long, device=x.device)
    sizes = torch.tensor(sample_shape, dtype=torch.long, device=x.device)
    coordinates = first.unsqueeze(-1) // strides % sizes
    return _ops.where.ScalarOther(first.unsqueeze(-1) >= 0, coordinates, fill_value)


def _index_function(op, call, name):
    """An autograd.Function for one of the integer-result ops: a
    pass-through under grad and jvp; under vmap, refused for a batched input
    (each sample would have its own number of non-zeros)."""

    def setup_context(ctx, inputs, output):
        ctx.outputs = len(output) if isinstance(output, tuple) else None

    def jvp(ctx, *tangents):
        # No tangent: one None per output.
        return None if ctx.outputs is None else (None,) * ctx.outputs

    def vmap(info, in_dims, x, *args):
        _refuse_batched(op, "input")

    return type(
        name,
        (torch.autograd.Function,),
        {
            "forward": staticmethod(lambda x, *args: call(x, *args)),
            "setup_context": staticmethod(setup_context),
            "jvp": staticmethod(jvp),
            "vmap": staticmethod(vmap),
        },
    )


def _nonzero_tuple(x):
    return tuple(_ops.nonzero_tuple(x))


Nonzero = _index_function("nonzero", _ops.nonzero.default, "Nonzero")
NonzeroTuple = _index_function("nonzero_tuple", _nonzero_tuple, "NonzeroTuple")
WhereIndices = _index_function("where", _ops.where.default, "WhereIndices")


class NonzeroStatic(torch.autograd.Function):
    @staticmethod
    def forward(x, size, fill_value=-1):
        return _ops.nonzero_static(x, size=size, fill_value=fill_value)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def jvp(ctx, *tangents):
        return None

    @staticmethod
    def vmap(info, in_dims, x, size, fill_value=-1):
        # The op's own checks (dtype, size >= 0) on one sample first.
        _nonzero_static_fake(_logical_meta(x, in_dims[0]), size=size, fill_value=fill_value)
        return _nonzero_static_batched(x.movedim(in_dims[0], 0), size, fill_value), 0


_register("nonzero", Nonzero)
_register("nonzero_tuple", NonzeroTuple)
_register("nonzero_static", NonzeroStatic)
_register("where", WhereIndices)


# where.self, where.ScalarSelf, where.ScalarOther: the gradient of a branch
# is the selection of the incoming gradient against the number 0 (exact
# zeros elsewhere), summed to the branch's shape; a number gets none. The
# tangent is the selection of the tangents, 0 standing in for a missing one.


def _where_vmap(call, in_dims, condition, x, y):
    """One broadcasting call over the batch, each batched operand padded to
    the per-sample result's rank (checked per sample first) and the branches
    brought to the per-sample result's dtype: a 0-d branch given a batch
    dimension would otherwise win the promotion over a 0-d one without."""
    logical = [_logical_meta(v, d) for v, d in zip((condition, x, y), in_dims)]
    result = _where_fake(*logical)
    x, y = (v.to(result.dtype) if isinstance(v, torch.Tensor) else v for v in (x, y))
    return call(*(_padded(v, d, result.dim()) for v, d in zip((condition, x, y), in_dims))), 0


def _where_tangent(condition, x_tangent, y_tangent, shape, dtype):
    """where(condition, x_tangent, y_tangent), a missing tangent taken as 0,
    in the result's dtype and shape."""
    if x_tangent is None and y_tangent is None:
        return None
    if y_tangent is None:
        tangent = _ops.where.ScalarOther(condition, x_tangent, 0)
    elif x_tangent is None:
        tangent = _ops.where.ScalarSelf(condition, 0, y_tangent)
    else:
        tangent = _ops.where.self(condition, x_tangent, y_tangent)
    return tangent.to(dtype).expand(shape)


def _branch_grads(ctx, condition, grad):
    """(None, x's gradient, y's gradient) of a selection by where's
    `condition`: `grad` where the branch was chosen, exact zeros elsewhere,
    each brought to its branch's ctx.branches (shape, dtype)."""
    (x_shape, x_dtype), (y_shape, y_dtype) = ctx.branches
    grad_x = grad_y = None
    if ctx.needs_input_grad[1]:
        grad_x = _to_branch(_ops.where.ScalarOther(condition, grad, 0), x_shape, x_dtype)
    if ctx.needs_input_grad[2]:
        grad_y = _to_branch(_ops.where.ScalarSelf(condition, 0, grad), y_shape, y_dtype)
    return None, grad_x, grad_y


class Where(torch.autograd.Function):
    @staticmethod
    def forward(condition, x, y):
        return _ops.where.self(condition, x, y)

    @staticmethod
    def setup_context(ctx, inputs, output):
        condition, x, y = inputs
        ctx.save_for_backward(condition)
        ctx.save_for_forward(condition)
        ctx.branches = (x.shape, x.dtype), (y.shape, y.dtype)
        ctx.result = output.shape, output.dtype

    @staticmethod
    def backward(ctx, grad):
        (condition,) = ctx.saved_tensors
        return _branch_grads(ctx, condition, grad)

    @staticmethod
    def jvp(ctx, condition_tangent, x_tangent, y_tangent):
        (condition,) = ctx.saved_tensors
        return _where_tangent(condition, x_tangent, y_tangent, *ctx.result)

    @staticmethod
    def vmap(info, in_dims, condition, x, y):
        return _where_vmap(_ops.where.self, in_dims, condition, x, y)


def _where_with_number(number_is_x):
    """where.ScalarSelf (a number for x) or where.ScalarOther (for y): the
    tensor branch's gradient and tangent are where.self's for that branch;
    the number has none."""
    op = _ops.where.ScalarSelf if number_is_x else _ops.where.ScalarOther
    tensor_at = 2 if number_is_x else 1

    class WhereWithNumber(torch.autograd.Function):
        @staticmethod
        def forward(condition, x, y):
            return op(condition, x, y)

        @staticmethod
        def setup_context(ctx, inputs, output):
            condition, tensor = inputs[0], inputs[tensor_at]
            ctx.save_for_backward(condition)
            ctx.save_for_forward(condition)
            ctx.branch = tensor.shape, tensor.dtype
            ctx.result = output.shape, output.dtype

        @staticmethod
        def backward(ctx, grad):
            (condition,) = ctx.saved_tensors
            if number_is_x:
                return None, None, _to_branch(_ops.where.ScalarSelf(condition, 0, grad), *ctx.branch)
            return None, _to_branch(_ops.where.ScalarOther(condition, grad, 0), *ctx.branch), None

        @staticmethod
        def jvp(ctx, condition_tangent, x_tangent, y_tangent):
            (condition,) = ctx.saved_tensors
            if number_is_x:
                return _where_tangent(condition, None, y_tangent, *ctx.result)
            return _where_tangent(condition, x_tangent, None, *ctx.result)

        @staticmethod
        def vmap(info, in_dims, condition, x, y):
            return _where_vmap(op, in_dims, condition, x, y)

    return WhereWithNumber


_register("where.self", Where)
_register("where.ScalarSelf", _where_with_number(number_is_x=True))
_register("where.ScalarOther", _where_with_number(number_is_x=False))


# select: as where, with a row condition as where's column [rows, 1, ...];
# x, y and each gradient share one shape, so nothing is summed.


def _condition_as_where(condition, rank, condition_rank=None):
    """csrc/element_select.h:select_condition_as_where: a row condition (1-D,
    of `condition_rank` per sample if it carries a batch dimension first)
    for an x of `rank` >= 2 as where's column [..., rows, 1, ..., 1]."""
    if (condition.dim() if condition_rank is None else condition_rank) != 1 or rank <= 1:
        return condition
    return condition.reshape(*condition.shape, *[1] * (rank - 1))


class Select(torch.autograd.Function):
    @staticmethod
    def forward(condition, x, y):
        return _ops.select(condition, x, y)

    @staticmethod
    def setup_context(ctx, inputs, output):
        condition, x, y = inputs
        ctx.save_for_backward(condition)
        ctx.save_for_forward(condition)
        # Each branch has the output's shape: nothing to sum.
        ctx.branches = (None, x.dtype), (None, y.dtype)
        ctx.result = output.shape, output.dtype

    @staticmethod
    def backward(ctx, grad):
        (condition,) = ctx.saved_tensors
        return _branch_grads(ctx, _condition_as_where(condition, grad.dim()), grad)

    @staticmethod
    def jvp(ctx, condition_tangent, x_tangent, y_tangent):
        (condition,) = ctx.saved_tensors
        shape, dtype = ctx.result
        if x_tangent is not None and y_tangent is not None:
            return _ops.select(condition, x_tangent, y_tangent)
        return _where_tangent(_condition_as_where(condition, len(shape)), x_tangent, y_tangent, shape, dtype)

    @staticmethod
    def vmap(info, in_dims, condition, x, y):
        logical = [_logical_meta(v, d) for v, d in zip((condition, x, y), in_dims)]
        rank = _select_fake(*logical).dim()
        # Per sample, select is where with the condition as where's column.
        condition_dim = in_dims[0]
        if condition_dim is not None:
            condition = condition.movedim(condition_dim, 0)
            condition_dim = 0
        condition = _condition_as_where(condition, rank, logical[0].dim())
        return _where_vmap(_ops.where.self, (condition_dim, *in_dims[1:]), condition, x, y)


_register("select", Select)


# boolean_mask and boolean_mask_backward: each is the other's gradient and
# tangent. Batched data with a shared mask is one call with the axis moved
# past the batch dimension.


class BooleanMask(torch.autograd.Function):
    @staticmethod
    def forward(tensor, mask, axis=0):
        return _ops.boolean_mask(tensor, mask, axis)

    @staticmethod
    def setup_context(ctx, inputs, output):
        tensor, mask, axis = (*inputs, 0)[:3]
        ctx.save_for_backward(mask)
        ctx.save_for_forward(mask)
        ctx.input_shape = list(tensor.shape)
        ctx.axis = axis + tensor.dim() if axis < 0 else axis

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return _ops.boolean_mask_backward(grad, mask, ctx.input_shape, ctx.axis), None, None

    @staticmethod
    def jvp(ctx, tangent, mask_tangent, axis_tangent=None):
        (mask,) = ctx.saved_tensors
        return None if tangent is None else _ops.boolean_mask(tangent, mask, ctx.axis)

    @staticmethod
    def vmap(info, in_dims, tensor, mask, axis=0):
        tensor_dim, mask_dim = in_dims[:2]
        if mask_dim is not None:
            _refuse_batched("boolean_mask", "mask")
        start, _ = _masked_view("boolean_mask", "tensor.shape", _logical_shape(tensor, tensor_dim), mask, axis)
        return _ops.boolean_mask(tensor.movedim(tensor_dim, 0), mask, start + 1), 0


class BooleanMaskBackward(torch.autograd.Function):
    @staticmethod
    def forward(grad, mask, input_shape, axis):
        return _ops.boolean_mask_backward(grad, mask, input_shape, axis)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, mask, input_shape, axis = inputs
        ctx.save_for_backward(mask)
        ctx.save_for_forward(mask)
        ctx.input_shape = input_shape
        ctx.axis = axis

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return _ops.boolean_mask(grad, mask, ctx.axis), None, None, None

    @staticmethod
    def jvp(ctx, tangent, *others):
        (mask,) = ctx.saved_tensors
        return None if tangent is None else _ops.boolean_mask_backward(tangent, mask, ctx.input_shape, ctx.axis)

    @staticmethod
    def vmap(info, in_dims, grad, mask, input_shape, axis):
        grad_dim, mask_dim = in_dims[:2]
        if mask_dim is not None or _every_sample(mask)[1] > 0:  # batched here or by an enclosing vmap
            _refuse_batched("boolean_mask_backward", "mask")
        _boolean_mask_backward_fake(_logical_meta(grad, grad_dim), mask.to("meta"), input_shape, axis)
        start = axis + len(input_shape) if axis < 0 else axis
        if mask.device.type == "cpu":  # the CPU kernel's check, which would name the batched axis
            selected, given = int(mask.sum()), grad.shape[start + (grad_dim <= start)]
            if selected != given:
                raise ValueError(
                    f"boolean_mask_backward: expected grad.shape[{start}] to equal the number of true elements "
                    f"of mask, {selected}, got {given}"
                )
        batched_shape = [info.batch_size, *input_shape]
        return _ops.boolean_mask_backward(grad.movedim(grad_dim, 0), mask, batched_shape, start + 1), 0


_register("boolean_mask", BooleanMask)
_register("boolean_mask_backward", BooleanMaskBackward)


# scatter_nd, gather_nd, tensor_scatter_nd_add: scatter's gradient is a
# gather and the other way round; tangents are the ops on the tangents; the
# backward and tangent calls skip the bounds check the forward made. Batched
# index rows get the sample number as their first coordinate, into a batched
# shape; unbatched ones address a shape with the batch dimension placed
# after the K indexed ones, so every sample's slices move together.


class ScatterNd(torch.autograd.Function):
    @staticmethod
    def forward(indices, updates, shape, check_bounds=True):
        return _ops.scatter_nd(indices, updates, shape, check_bounds=check_bounds)

    @staticmethod
    def setup_context(ctx, inputs, output):
        indices, _, shape = inputs[:3]
        ctx.save_for_backward(indices)
        ctx.save_for_forward(indices)
        ctx.shape = shape

    @staticmethod
    def backward(ctx, grad):
        (indices,) = ctx.saved_tensors
        grad_updates = _ops.gather_nd(grad, indices, check_bounds=False) if ctx.needs_input_grad[1] else None
        return None, grad_updates, None, None

    @staticmethod
    def jvp(ctx, indices_tangent, updates_tangent, *others):
        (indices,) = ctx.saved_tensors
        if updates_tangent is None:
            return None
        return _ops.scatter_nd(indices, updates_tangent, ctx.shape, check_bounds=False)

    @staticmethod
    def vmap(info, in_dims, indices, updates, shape, check_bounds=True):
        indices_dim, updates_dim = in_dims[:2]
        _check_scatter("scatter_nd", None, _logical_meta(indices, indices_dim), _logical_meta(updates, updates_dim), shape)
        if check_bounds:
            _check_bounds("scatter_nd", indices, indices_dim, shape)
        batch = info.batch_size
        if indices_dim is None:
            depth = indices.shape[-1]
            updates = updates.movedim(updates_dim, indices.dim() - 1)
            shape = [*shape[:depth], batch, *shape[depth:]]
            return _ops.scatter_nd(indices, updates, shape, check_bounds=False), depth
        indices = _with_batch_coordinate(indices.movedim(indices_dim, 0), batch)
        updates = _batch_first(updates, updates_dim, batch)
        return _ops.scatter_nd(indices, updates, [batch, *shape], check_bounds=False), 0


class GatherNd(torch.autograd.Function):
    @staticmethod
    def forward(params, indices, check_bounds=True):
        return _ops.gather_nd(params, indices, check_bounds=check_bounds)

    @staticmethod
    def setup_context(ctx, inputs, output):
        params, indices = inputs[:2]
        ctx.save_for_backward(indices)
        ctx.save_for_forward(indices)
        ctx.params_shape = list(params.shape)

    @staticmethod
    def backward(ctx, grad):
        (indices,) = ctx.saved_tensors
        grad_params = None
        if ctx.needs_input_grad[0]:
            grad_params = _ops.scatter_nd(indices, grad, ctx.params_shape, check_bounds=False)
        return grad_params, None, None

    @staticmethod
    def jvp(ctx, params_tangent, *others):
        (indices,) = ctx.saved_tensors
        return None if params_tangent is None else _ops.gather_nd(params_tangent, indices, check_bounds=False)

    @staticmethod
    def vmap(info, in_dims, params, indices, check_bounds=True):
        params_dim, indices_dim = in_dims[:2]
        params_shape = _logical_shape(params, params_dim)
        depth = _check_indices("gather_nd", _logical_meta(indices, indices_dim), params_shape, "params.shape")
        if check_bounds:
            _check_bounds("gather_nd", indices, indices_dim, params_shape)
        if indices_dim is None:
            result = _ops.gather_nd(params.movedim(params_dim, depth), indices, check_bounds=False)
            return result, indices.dim() - 1
        batch = info.batch_size
        indices = _with_batch_coordinate(indices.movedim(indices_dim, 0), batch)
        return _ops.gather_nd(_batch_first(params, params_dim, batch), indices, check_bounds=False), 0


_AUTOCAST_FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _as_autocast_casts(tensor, updates):
    """`tensor` and `updates` cast as csrc/autocast.cpp casts them under
    torch.autocast (two floating dtypes: both to the wider), for the batching
    rule's checks, which run before that kernel does."""
    if (tensor.dtype != updates.dtype and tensor.dtype in _AUTOCAST_FLOATING and updates.dtype in _AUTOCAST_FLOATING
            and torch.is_autocast_enabled(tensor.device.type)):
        wider = torch.promote_types(tensor.dtype, updates.dtype)
        return tensor.to(wider), updates.to(wider)
    return tensor, updates


class TensorScatterNdAdd(torch.autograd.Function):
    @staticmethod
    def forward(tensor, indices, updates, check_bounds=True):
        return _ops.tensor_scatter_nd_add(tensor, indices, updates, check_bounds=check_bounds)

    @staticmethod
    def setup_context(ctx, inputs, output):
        tensor, indices = inputs[:2]
        ctx.save_for_backward(indices)
        ctx.save_for_forward(indices)
        ctx.shape = list(tensor.shape)

    @staticmethod
    def backward(ctx, grad):
        (indices,) = ctx.saved_tensors
        grad_updates = _ops.gather_nd(grad, indices, check_bounds=False) if ctx.needs_input_grad[2] else None
        return grad if ctx.needs_input_grad[0] else None, None, grad_updates, None

    @staticmethod
    def jvp(ctx, tensor_tangent, indices_tangent, updates_tangent, *others):
        (indices,) = ctx.saved_tensors
        if updates_tangent is None:
            return None if tensor_tangent is None else tensor_tangent.clone()
        if tensor_tangent is None:
            return _ops.scatter_nd(indices, updates_tangent, ctx.shape, check_bounds=False)
        return _ops.tensor_scatter_nd_add(tensor_tangent, indices, updates_tangent, check_bounds=False)

    @staticmethod
    def vmap(info, in_dims, tensor, indices, updates, check_bounds=True):
        tensor_dim, indices_dim, updates_dim = in_dims[:3]
        tensor, updates = _as_autocast_casts(tensor, updates)
        shape = _logical_shape(tensor, tensor_dim)
        _check_scatter(
            "tensor_scatter_nd_add",
            _logical_meta(tensor, tensor_dim),
            _logical_meta(indices, indices_dim),
            _logical_meta(updates, updates_dim),
            shape,
        )
        if check_bounds:
            _check_bounds("tensor_scatter_nd_add", indices, indices_dim, shape)
        batch = info.batch_size
        tensor = _batch_first(tensor, tensor_dim, batch)
        if indices_dim is None:
            depth = indices.shape[-1]
            tensor = tensor.movedim(0, depth)
            updates = _batch_first(updates, updates_dim, batch).movedim(0, indices.dim() - 1)
            return _ops.tensor_scatter_nd_add(tensor, indices, updates, check_bounds=False), depth
        indices = _with_batch_coordinate(indices.movedim(indices_dim, 0), batch)
        updates = _batch_first(updates, updates_dim, batch)
        return _ops.tensor_scatter_nd_add(tensor, indices, updates, check_bounds=False), 0


_register("scatter_nd", ScatterNd)
_register("gather_nd", GatherNd)
_register("tensor_scatter_nd_add", TensorScatterNdAdd)
