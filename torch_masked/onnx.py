"""ONNX export of the ``torch.ops.masked`` ops (needs ``onnx`` and ``onnxscript``:
``pip install torch_masked[onnx]``).

PyTorch's ONNX exporter (``torch.onnx.export(..., dynamo=True)``) translates
each operator of the exported program with an onnxscript function; for custom
ops it takes them from ``custom_translation_table``. This module holds ours::

    import torch_masked.onnx
    program = torch_masked.onnx.export(model, args, dynamic_shapes=...)
    # the same as
    program = torch.onnx.export(model, args, dynamo=True,
                                custom_translation_table=torch_masked.onnx.translation_table())

Each op maps to the standard ONNX op of the same meaning: ``Where``,
``NonZero`` (transposed: ONNX gives ``[rank, z]``), ``Compress``,
``GatherND``, ``ScatterElements`` with ``reduction="add"`` (opset 16 or
later; not ``ScatterND``, see ``_scattered``).
What ONNX cannot express fails here, at export time, with a ``ValueError``
naming the op and the case (PyTorch's exporter wraps it in its
``ConversionError``), never as a model that computes something else.

The translations are traced when a graph is exported: they see each input's
rank and dtype, and the Python values of the op's non-tensor arguments.
Importing ``torch_masked`` never imports this module.
"""
from __future__ import annotations

import os
from typing import Any, Callable

import torch
from onnxscript import ir
from onnxscript import opset18 as op

__all__ = ["export", "translation_table"]

# Scatter with duplicates needs ScatterElements's reduction="add".
_SCATTER_OPSET = 16

# The dtypes our translations promote between (where/select), as torch names them.
_TORCH_DTYPES = {
    ir.DataType.BOOL: torch.bool,
    ir.DataType.UINT8: torch.uint8,
    ir.DataType.INT8: torch.int8,
    ir.DataType.INT16: torch.int16,
    ir.DataType.INT32: torch.int32,
    ir.DataType.INT64: torch.int64,
    ir.DataType.FLOAT16: torch.float16,
    ir.DataType.BFLOAT16: torch.bfloat16,
    ir.DataType.FLOAT: torch.float32,
    ir.DataType.DOUBLE: torch.float64,
}
_ONNX_DTYPES = {torch_dtype: onnx_dtype for onnx_dtype, torch_dtype in _TORCH_DTYPES.items()}


def _refuse(op_name, case):
    raise ValueError(f"torch_masked.onnx: masked::{op_name} cannot be exported to ONNX: {case}")


def _torch_dtype(op_name, value):
    """value's (an ONNX value's) dtype as torch's, or refused where ONNX (or onnxruntime) has no such type."""
    if value.dtype not in _TORCH_DTYPES:
        _refuse(op_name, f"dtype {value.dtype} is not among the types this export promotes between "
                         f"({', '.join(str(t) for t in _TORCH_DTYPES.values())})")
    return _TORCH_DTYPES[value.dtype]


def _result_dtype(op_name, x, y, number=None):
    """torch.result_type(x, y), which our where/select compute, for ONNX values
    or numbers. `number` ("x" or "y") names the operand that is a number in
    the op's schema: one known only at run time (a SymInt, SymFloat or
    SymBool) reaches the translation as a 0-d ONNX value."""
    def example(name, value):
        # A number keeps its value, or its kind when known only at run time,
        # so that it promotes as a wrapped number does; a tensor keeps
        # whether it is 0-d, which promotes below one with dimensions of the
        # same kind.
        if isinstance(value, complex):
            _refuse(op_name, f"the number {value} is complex, and ONNX's Where has no complex types")
        if isinstance(value, (bool, int, float)):
            return value
        dtype = _torch_dtype(op_name, value)
        if name == number:
            return torch.zeros((), dtype=dtype).item()
        return torch.empty(() if _rank(value) == 0 else (1,), dtype=dtype)

    return _ONNX_DTYPES[torch.result_type(example("x", x), example("y", y))]


def _as_dtype(value, dtype):
    """value (an ONNX value) as dtype."""
    return value if value.dtype == dtype else op.Cast(value, to=dtype)


def _rank(value):
    return len(value.shape)


# --- nonzero, where(condition) -------------------------------------------------

# The types onnxruntime's NonZero takes; others are read through a cast to
# bool, which (as ONNX specifies Cast) is true for every non-zero value and
# NaN, false for +-0.0: our rule.
_NONZERO_TYPES = {ir.DataType.BOOL, ir.DataType.UINT8, ir.DataType.INT32, ir.DataType.INT64,
                  ir.DataType.FLOAT16, ir.DataType.FLOAT}


def _nonzero_rows(self):
    """ONNX NonZero: [rank, z]; a 0-d input is read as one element (rank 1)."""
    rank = _rank(self)
    if self.dtype not in _NONZERO_TYPES:
        self = op.Cast(self, to=ir.DataType.BOOL)
    if rank == 0:
        self = op.Reshape(self, op.Constant(value_ints=[1]))
    return op.NonZero(self)


def _nonzero(self):
    indices = op.Transpose(_nonzero_rows(self), perm=[1, 0])
    if _rank(self) == 0:
        # [z, 0]: the z of the one-element view, no coordinates.
        return op.Slice(indices, op.Constant(value_ints=[0]), op.Constant(value_ints=[0]),
                        op.Constant(value_ints=[1]))
    return indices


def _nonzero_tuple(self):
    rows = _nonzero_rows(self)
    # One 1-D tensor per dimension; a 0-d input gives one, of zeros, as torch's.
    return [op.Gather(rows, op.Constant(value_int=dim), axis=0) for dim in range(max(_rank(self), 1))]


def _nonzero_static(self, size, fill_value=-1):
    if not isinstance(size, int):
        _refuse("nonzero_static", f"size must be a number known at export time, got {size!r}")
    # Pad [z, rank] with `size` rows of fill_value, then keep the first `size`.
    padded = op.Pad(_nonzero(self), op.Constant(value_ints=[0, 0, size, 0]),
                    op.Constant(value=ir.tensor(torch.tensor(fill_value, dtype=torch.int64))))
    return op.Slice(padded, op.Constant(value_ints=[0]), op.Constant(value_ints=[size]),
                    op.Constant(value_ints=[0]))


# --- where(condition, x, y), select --------------------------------------------

# onnxruntime's Where has no kernel for these types (ONNX's has): each is
# selected in a wider type that holds its every value, and cast back.
_WHERE_WIDER = {ir.DataType.BOOL: ir.DataType.UINT8, ir.DataType.INT16: ir.DataType.INT32,
                ir.DataType.BFLOAT16: ir.DataType.FLOAT}


def _operand(name, value, dtype):
    """where's operand `name` (an ONNX value or a Python number) as an ONNX
    value of dtype. A number converts as eager's does (at::scalar_tensor),
    so one that dtype cannot hold is refused as eager refuses it."""
    if not isinstance(value, (bool, int, float)):
        return _as_dtype(value, dtype)
    try:
        number = torch.scalar_tensor(value, dtype=_TORCH_DTYPES[dtype])
    except (RuntimeError, OverflowError) as error:
        _refuse("where", f"{name}={value!r}: {error}")
    return op.Constant(value=ir.tensor(number))


def _selection(condition, x, y, dtype):
    """Where(condition, x, y) in dtype, the branches cast to it."""
    x, y = _operand("x", x, dtype), _operand("y", y, dtype)
    wider = _WHERE_WIDER.get(dtype)
    if wider is None:
        return op.Where(condition, x, y)
    return op.Cast(op.Where(condition, op.Cast(x, to=wider), op.Cast(y, to=wider)), to=dtype)


def _where_self(condition, x, y):
    return _selection(condition, x, y, _result_dtype("where", x, y))


def _where_number_x(condition, x, y):
    return _selection(condition, x, y, _result_dtype("where", x, y, number="x"))


def _where_number_y(condition, x, y):
    return _selection(condition, x, y, _result_dtype("where", x, y, number="y"))


def _select(condition, x, y):
    dtype = _result_dtype("select", x, y)
    if _rank(condition) == 1 and _rank(x) > 1:
        # A row condition picks whole rows: [n] -> [n, 1, ...] broadcasts along each row.
        condition = op.Unsqueeze(condition, op.Constant(value_ints=list(range(1, _rank(x)))))
    return _selection(condition, x, y, dtype)


# --- boolean_mask ----------------------------------------------------------------

def _boolean_mask(tensor, mask, axis=0):
    rank, mask_rank, dtype = _rank(tensor), _rank(mask), tensor.dtype
    axis = axis + rank if axis < 0 else axis
    if mask_rank > 1:
        # The mask's K dimensions become one: [*before, M, *after], M = mask's
        # number of elements (Size, where ReduceProd would not convert to opsets 16 and 17).
        masked_size = op.Reshape(op.Size(mask), op.Constant(value_ints=[1]))
        flat_shape = op.Concat(op.Shape(tensor, end=axis), masked_size,
                               op.Shape(tensor, start=axis + mask_rank), axis=0)
        tensor = op.Reshape(tensor, flat_shape, allowzero=1)
        mask = op.Reshape(mask, masked_size, allowzero=1)
    if dtype == ir.DataType.BFLOAT16:
        # ONNX's Compress takes no bfloat16; float holds each value exactly.
        selected = op.Compress(op.Cast(tensor, to=ir.DataType.FLOAT), mask, axis=axis)
        return op.Cast(selected, to=ir.DataType.BFLOAT16)
    return op.Compress(tensor, mask, axis=axis)


# --- gather_nd, scatter_nd, tensor_scatter_nd_add --------------------------------

def _index_depth(op_name, indices):
    """K, the last dimension of indices, which must be known at export time."""
    depth = indices.shape[-1] if _rank(indices) > 0 else None
    if not isinstance(depth, int):
        _refuse(op_name, f"the last dimension of indices (K) must be static, got shape {indices.shape}")
    return depth


def _int64(indices):
    return indices if indices.dtype == ir.DataType.INT64 else op.Cast(indices, to=ir.DataType.INT64)


def _expand(value, shape):
    """ONNX Expand; bfloat16, for which onnxruntime has no Expand, as float
    (which holds each value exactly) and cast back."""
    if value.dtype != ir.DataType.BFLOAT16:
        return op.Expand(value, shape)
    return op.Cast(op.Expand(op.Cast(value, to=ir.DataType.FLOAT), shape), to=ir.DataType.BFLOAT16)


def _index_rows(indices, depth):
    """indices as [N, K] int64 rows."""
    return op.Reshape(_int64(indices), op.Constant(value_ints=[-1, depth]))


def _all_within(data, rows, depth):
    """Whether each index row ([N, K] int64) lies within data's first K
    dimensions ([N] bool); none does where one of them has size 0."""
    within = op.And(op.GreaterOrEqual(rows, op.Constant(value_int=0)), op.Less(rows, op.Shape(data, end=depth)))
    entries_within = op.ReduceSum(op.Cast(within, to=ir.DataType.INT64), op.Constant(value_ints=[1]), keepdims=0)
    return op.Equal(entries_within, op.Constant(value_int=depth))


def _rows_in_bounds(data, indices, depth):
    """For check_bounds=False, where our kernels skip index rows out of bounds
    of data (negative ones included), GatherND would wrap them or fail, and
    the scatter's row positions (_row_positions) would name another row or
    none: whether each row of indices, as [R, K], is in bounds ([R] bool),
    and those rows ([M, K] int64)."""
    rows = _index_rows(indices, depth)
    in_bounds = _all_within(data, rows, depth)
    return in_bounds, op.Compress(rows, in_bounds, axis=0)


def _row_positions(data, rows, depth):
    """Index rows ([N, K] int64, within bounds) as positions ([N]) in data's
    first K dimensions flattened in row-major order (Horner's rule)."""
    sizes = op.Shape(data, end=depth)
    positions = op.Gather(rows, op.Constant(value_int=0), axis=1)
    for column in range(1, depth):
        size = op.Gather(sizes, op.Constant(value_int=column), axis=0)
        positions = op.Add(op.Mul(positions, size), op.Gather(rows, op.Constant(value_int=column), axis=1))
    return positions


def _gather_nd(params, indices, check_bounds=True):
    depth = _index_depth("gather_nd", indices)
    if depth == 0:
        # ONNX's GatherND needs K >= 1; K == 0 picks the whole of params for every index row.
        rows = op.Shape(indices, end=-1)
        return _expand(params, op.Concat(rows, op.Shape(params), axis=0))
    if check_bounds:
        return op.GatherND(params, _int64(indices))
    # The rows in bounds gathered, then a slice of zeros, which the others
    # read: selected by position with Gather, which takes every type (Where
    # does not).
    in_bounds, rows = _rows_in_bounds(params, indices, depth)
    slice_shape = op.Concat(op.Constant(value_ints=[1]), op.Shape(params, start=depth), axis=0)
    zeros = op.Cast(op.Expand(op.Constant(value_int=0), slice_shape), to=params.dtype)
    table = op.Concat(op.GatherND(params, rows), zeros, axis=0)
    position = op.Sub(op.CumSum(op.Cast(in_bounds, to=ir.DataType.INT64), op.Constant(value_int=0)),
                      op.Constant(value_int=1))
    position = op.Where(in_bounds, position, op.Shape(rows, end=1))
    return op.Gather(table, op.Reshape(position, op.Shape(indices, end=-1), allowzero=1), axis=0)


# Types summed in a wider one: ONNX has no bool addition (counts in int64,
# where none wraps, then != 0 is the OR), and onnxruntime's ScatterElements
# does not add float16; half and bfloat16 are summed in float and rounded
# once, as our kernels do.
_ACCUMULATE_AS = {ir.DataType.BOOL: ir.DataType.INT64, ir.DataType.FLOAT16: ir.DataType.FLOAT,
                  ir.DataType.BFLOAT16: ir.DataType.FLOAT}
# ONNX's ReduceSum (the K == 0 scatter's) has no 8- and 16-bit integers: their
# rows are summed in int64 and the sum cast back, which wraps as adding them
# in their own type does.
_REDUCE_AS = {ir.DataType.INT8: ir.DataType.INT64, ir.DataType.UINT8: ir.DataType.INT64,
              ir.DataType.INT16: ir.DataType.INT64}


def _product(sizes, count):
    """The product of a 1-D int64 tensor of `count` sizes, as a [1] tensor (1
    for none). Not ReduceProd: its axes became an input at opset 18, and the
    exporter's conversion to older opsets leaves an attribute opset 16 lacks."""
    product = op.Constant(value_ints=[1])
    for position in range(count):
        size = op.Slice(sizes, op.Constant(value_ints=[position]), op.Constant(value_ints=[position + 1]))
        product = op.Mul(product, size)
    return product


def _scatter_add(op_name, base, indices, updates, check_bounds):
    """base with updates added at indices (duplicates add up). updates's dtype
    is base's; updates comes from the graph, which knows it."""
    depth = _index_depth(op_name, indices)
    slice_shape = list(updates.shape)[_rank(indices) - 1:]
    if depth > 0 and 0 in slice_shape:
        # Slices of no elements (known at export time) add nothing, and their
        # indices are not read. (In _scattered, onnxruntime's graph optimizer
        # would fold the reshape to [rows, 0] into an invalid [-1, 0].)
        return base
    dtype = updates.dtype
    if dtype in _ACCUMULATE_AS:
        wide = _ACCUMULATE_AS[dtype]
        summed = _scattered(op.Cast(base, to=wide), indices, op.Cast(updates, to=wide), check_bounds, depth,
                            len(slice_shape))
        return op.Cast(summed, to=dtype)
    return _scattered(base, indices, updates, check_bounds, depth, len(slice_shape))


def _scattered(base, indices, updates, check_bounds, depth, slice_rank):
    """_scatter_add's sums, in a dtype ONNX adds."""
    dtype = updates.dtype
    if depth == 0:
        # K == 0: every update row adds to the whole tensor.
        leading = list(range(_rank(indices) - 1))
        if leading:
            wide = _REDUCE_AS.get(dtype, dtype)
            summed = op.ReduceSum(_as_dtype(updates, wide), op.Constant(value_ints=leading), keepdims=0)
            updates = _as_dtype(summed, dtype)
        return op.Add(base, updates)
    # ScatterElements on base viewed as [rows, slice], each update's slice
    # added along the row its index row names: onnxruntime's ScatterND splits
    # its rows between threads and, with reduction="add", loses the sums of
    # duplicate rows it adds at once (from about a megabyte of updates),
    # where its ScatterElements adds them in turn. The price: the row's
    # position repeated for each element of its slice.
    index_rank = _rank(indices) - 1
    row_count = _product(op.Shape(base, end=depth), depth)
    slice_size = _product(op.Shape(base, start=depth), slice_rank)
    table = op.Reshape(base, op.Concat(row_count, slice_size, axis=0), allowzero=1)
    update_rows = _product(op.Shape(indices, end=index_rank), index_rank)
    updates = op.Reshape(updates, op.Concat(update_rows, slice_size, axis=0), allowzero=1)
    if check_bounds:
        # ScatterND's rules, which GatherND keeps: a negative entry counts
        # from the end, and a row still outside base fails the run (its
        # position made the count of rows, which ScatterElements refuses).
        rows = _index_rows(indices, depth)
        rows = op.Where(op.Less(rows, op.Constant(value_int=0)), op.Add(rows, op.Shape(base, end=depth)), rows)
        positions = op.Where(_all_within(base, rows, depth), _row_positions(base, rows, depth), row_count)
    else:
        # Only the rows in bounds, and their updates, are scattered.
        in_bounds, rows = _rows_in_bounds(base, indices, depth)
        positions = _row_positions(base, rows, depth)
        updates = op.Compress(updates, in_bounds, axis=0)
    columns = op.Expand(op.Unsqueeze(positions, op.Constant(value_ints=[1])), op.Shape(updates))
    summed = op.ScatterElements(table, columns, updates, axis=0, reduction="add")
    return op.Reshape(summed, op.Shape(base), allowzero=1)


def _scatter_nd(indices, updates, shape, check_bounds=True):
    # Zeros made in the type the sums are made in (no bfloat16 Expand).
    dtype = _ACCUMULATE_AS.get(updates.dtype, updates.dtype)
    zero = op.Constant(value=ir.tensor(torch.zeros((), dtype=_TORCH_DTYPES[dtype])))
    return _scatter_add("scatter_nd", op.Expand(zero, shape), indices, updates, check_bounds)


def _tensor_scatter_nd_add(tensor, indices, updates, check_bounds=True):
    return _scatter_add("tensor_scatter_nd_add", tensor, indices, updates, check_bounds)


def translation_table() -> dict[torch._ops.OpOverload, Callable[..., Any]]:
    """{torch.ops.masked.<op>.<overload>: onnxscript translation}, every op and
    overload, for ``torch.onnx.export(..., custom_translation_table=)``."""
    masked = torch.ops.masked
    return {
        masked.nonzero.default: _nonzero,
        masked.nonzero_tuple.default: _nonzero_tuple,
        masked.nonzero_static.default: _nonzero_static,
        masked.where.default: _nonzero,
        masked.where.self: _where_self,
        masked.where.ScalarSelf: _where_number_x,
        masked.where.ScalarOther: _where_number_y,
        masked.select.default: _select,
        masked.boolean_mask.default: _boolean_mask,
        masked.gather_nd.default: _gather_nd,
        masked.scatter_nd.default: _scatter_nd,
        masked.tensor_scatter_nd_add.default: _tensor_scatter_nd_add,
    }


def _check_opset(program, opset_version):
    """PyTorch traces translations at opset 18 and converts the model down to
    an older opset_version afterwards, keeping 18 (with a warning) where it
    cannot; a scatter below opset 16 is refused instead."""
    if opset_version is None or opset_version >= _SCATTER_OPSET:
        return
    scatters = (torch.ops.masked.scatter_nd.default, torch.ops.masked.tensor_scatter_nd_add.default)
    for node in program.exported_program.graph.nodes:
        if node.target in scatters:
            raise ValueError(
                f"torch_masked.onnx: masked::{node.target._opname} cannot be exported to ONNX opset "
                f"{opset_version}: duplicate indices add up with ScatterElements's reduction='add', which needs "
                f"opset {_SCATTER_OPSET} or later")


# Integer types that an integer known only at run time may not fit in.
_NARROW_INTEGERS = (torch.int8, torch.uint8, torch.int16, torch.int32)


def _check_runtime_numbers(program):
    """Eager raises where a number does not fit the dtype it is converted to,
    ONNX's Cast wraps it. An integer known only at run time (x.shape[0], say)
    converted for where or select to an integer type narrower than int64 is
    refused unless the range torch.export gives it (a dimension's min and
    max, torch._check) fits that type. It reaches the op as the number
    (where.ScalarSelf, where.ScalarOther) or as an aten.full of it in the
    result dtype (our Python front door)."""
    masked = torch.ops.masked
    selections = (masked.where.self, masked.where.ScalarSelf, masked.where.ScalarOther, masked.select.default)
    for node in program.exported_program.graph.nodes:
        if node.target not in selections:
            continue
        result_dtype = node.meta["val"].dtype
        for name, operand in zip(("x", "y"), node.args[1:3]):
            dtype = result_dtype
            if isinstance(operand, torch.fx.Node) and operand.target == torch.ops.aten.full.default:
                operand, dtype = operand.args[1], operand.meta["val"].dtype
            number = operand.meta["val"] if isinstance(operand, torch.fx.Node) else None
            if not isinstance(number, torch.SymInt) or dtype not in _NARROW_INTEGERS:
                continue
            bounds = number.node.shape_env.bound_sympy(number.node.expr)
            info = torch.iinfo(dtype)
            if not info.min <= bounds.lower <= bounds.upper <= info.max:
                raise ValueError(
                    f"torch_masked.onnx: masked::{node.target._opname} cannot be exported to ONNX: {name}, an "
                    f"integer known only at run time (from {bounds.lower} to {bounds.upper}), is converted to "
                    f"{dtype}, which may not hold it: eager raises then, ONNX would wrap it. Bound it "
                    f"(torch.export.Dim's max, torch._check) or make the other operand int64")


def export(
    model: torch.nn.Module | torch.export.ExportedProgram,
    args: tuple[Any, ...] = (),
    f: str | os.PathLike[str] | None = None,
    *,
    opset_version: int | None = None,
    custom_translation_table: dict[Callable[..., Any], Any] | None = None,
    external_data: bool = True,
    **kwargs: Any,
) -> torch.onnx.ONNXProgram:
    """``torch.onnx.export(model, args, f, dynamo=True, ...)`` with the translations
    of the masked ops added to ``custom_translation_table`` (the caller's own
    entries win); returns PyTorch's ``ONNXProgram``. An ``opset_version`` below
    16 is refused (``ValueError``) when the model scatters, and so is a number
    known only at run time that where or select may convert to an integer
    type too narrow for it (_check_runtime_numbers)."""
    table = {**translation_table(), **(custom_translation_table or {})}
    program = torch.onnx.export(model, args, dynamo=True, opset_version=opset_version,
                                custom_translation_table=table, **kwargs)
    _check_opset(program, opset_version)
    _check_runtime_numbers(program)
    if f is not None:
        program.save(f, external_data=external_data)
    return program
