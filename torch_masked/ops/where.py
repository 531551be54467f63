"""masked::where (index mode), masked::where.self (with its number overloads
where.ScalarSelf and where.ScalarOther) and masked::select: fake kernels and
the front doors ``torch_masked.where`` and ``torch_masked.select`` (their
gradients: csrc/autograd/where_autograd.cpp).

``where(condition)`` is a composite of ``masked::nonzero`` registered in C++
(csrc/where.cpp), so it has no fake kernel or formula of its own here.
"""
from __future__ import annotations

import functools
import numbers
from typing import overload

import torch
from torch.overrides import handle_torch_function

from ._checks import as_tensor, check, check_same_device, equal_or_unknown
from ._overrides import entry_point, has_stand_in
from ._types import TensorLike

# csrc/element_select.h: kMaxSelectDims.
MAX_SELECT_DIMS = 25


def _check_condition_dtype(op, condition):
    torch._check_type(
        condition.dtype == torch.bool,
        lambda: f"{op}: expected condition of dtype torch.bool, got {condition.dtype}",
    )


def _check_dims(op, dims):
    check(dims <= MAX_SELECT_DIMS, op, f"expected at most {MAX_SELECT_DIMS} dimensions, got {dims}")


def _shape(value):
    """A tensor's shape; a number's, ()."""
    return tuple(value.shape) if isinstance(value, torch.Tensor) else ()


def _broadcast_shape(condition, x, y):
    """NumPy broadcasting by torch.broadcast_shapes, as torch.where's fake
    kernel does it (an unbacked size, from nonzero or boolean_mask, is taken
    as not 1, its equality a deferred check; under backed_size_oblivious a
    size traced at 1 beside another is specialised to 1), with
    csrc/element_select.h's message."""
    shapes = [_shape(condition), _shape(x), _shape(y)]
    try:
        return list(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        raise RuntimeError(f"where: expected condition, x and y to broadcast together, got condition "
                           f"{list(shapes[0])}, x {list(shapes[1])}, y {list(shapes[2])}") from None


def _check_shape(op, actual, expected, message):
    """actual == expected, axis by axis, so that unbacked sizes trace."""
    check(len(actual) == len(expected), op, message)
    for a, e in zip(actual, expected):
        check(equal_or_unknown(a, e), op, message)


@torch.library.register_fake("masked::where.self")
@torch.library.register_fake("masked::where.ScalarSelf")
@torch.library.register_fake("masked::where.ScalarOther")
def _where_fake(condition, x, y):
    """where.self, and where.ScalarSelf / ScalarOther, where x or y is a number."""
    tensors = {name: t for name, t in (("condition", condition), ("x", x), ("y", y)) if isinstance(t, torch.Tensor)}
    check_same_device("where", **tensors)
    _check_condition_dtype("where", condition)
    shape = _broadcast_shape(condition, x, y)
    _check_dims("where", len(shape))
    return condition.new_empty(shape, dtype=torch.result_type(x, y))


@torch.library.custom_op("masked::check_where_number", mutates_args=())
def _check_where_number(condition: torch.Tensor, tensor: torch.Tensor, number: torch.types.Number,
                        number_is_x: bool) -> None:
    """The error of where.ScalarSelf (number_is_x) or where.ScalarOther for a
    number that the result dtype cannot hold, raised by that overload
    itself, its result dropped. An op of its own, returning nothing (a side
    effect that Inductor keeps), for compiled graphs: where a where with a
    number has a result without elements, Inductor reads nothing of it and
    would drop the call, and its error with it
    (torch_masked/compile.py:_call_of_ours)."""
    if number_is_x:
        _where_number_x(condition, number, tensor)
    else:
        _where_number_y(condition, tensor, number)


@_check_where_number.register_fake
def _check_where_number_fake(condition, tensor, number, number_is_x):
    return None


torch.fx.node.has_side_effect(torch.ops.masked.check_where_number.default)


@torch.library.register_fake("masked::select")
def _select_fake(condition, x, y):
    check_same_device("select", condition=condition, x=x, y=y)
    _check_condition_dtype("select", condition)
    _check_shape(
        "select", y.shape, x.shape, f"expected x and y of the same shape, got x {list(x.shape)} and y {list(y.shape)}"
    )
    condition_message = (
        f"expected condition to be a scalar, of x's shape {list(x.shape)}, or 1-D of length x.shape[0], "
        f"got condition of shape {list(condition.shape)}"
    )
    if condition.dim() == 1 and x.dim() >= 1:  # rows (element-wise too, for a 1-D x)
        check(equal_or_unknown(condition.shape[0], x.shape[0]), "select", condition_message)
    elif condition.dim() > 0:
        _check_shape("select", condition.shape, x.shape, condition_message)
    _check_dims("select", x.dim())
    return x.new_empty(x.shape, dtype=torch.result_type(x, y))


# Front doors.

# The overloads the front doors call, as their entry points.
_where_indices = entry_point(torch.ops.masked.where.default)
_where_self = entry_point(torch.ops.masked.where.self)
_where_number_x = entry_point(torch.ops.masked.where.ScalarSelf)
_where_number_y = entry_point(torch.ops.masked.where.ScalarOther)
_select = entry_point(torch.ops.masked.select.default)

# Kinds of numbers and dtypes, in the order of type promotion.
_BOOL, _INTEGER, _FLOATING, _COMPLEX = range(4)
# Python's numbers, and those torch.compile and torch.export trace as known
# only at run time (x.shape[0], say).
_PYTHON_NUMBERS = (bool, int, float, complex, torch.SymBool, torch.SymInt, torch.SymFloat)
_ANY_NUMBER = (numbers.Number, *_PYTHON_NUMBERS)
# torch pairs bfloat16 with bcomplex32 where it has that dtype.
_BFLOAT16_COMPLEX = getattr(torch, "bcomplex32", torch.complex64)


def _number_kind(number):
    """A Python number's kind, or a NumPy scalar's (the ABCs, tested last,
    are the slower checks)."""
    if isinstance(number, (bool, torch.SymBool)):
        return _BOOL
    if isinstance(number, (int, torch.SymInt, numbers.Integral)):
        return _INTEGER
    return _FLOATING if isinstance(number, (float, torch.SymFloat, numbers.Real)) else _COMPLEX


def _dtype_kind(dtype):
    if dtype == torch.bool:
        return _BOOL
    if dtype.is_complex:
        return _COMPLEX
    return _FLOATING if dtype.is_floating_point else _INTEGER


def _dtype_with_number(dtype, number):
    """torch.result_type(tensor of `dtype`, number) for a bool, int, float or
    complex number, from what torch.compile can trace (it cannot trace
    torch.result_type, whose result is a dtype). A number changes the
    tensor's dtype only when it is of a higher kind, and then to its kind's
    default dtype or, a complex number next to a floating tensor, to the
    complex dtype of that width."""
    kind = _number_kind(number)
    if kind <= _dtype_kind(dtype):
        return dtype
    if kind == _INTEGER:
        return torch.int64
    if kind == _FLOATING:
        return torch.get_default_dtype()
    if dtype == torch.bfloat16:
        return _BFLOAT16_COMPLEX
    return torch.promote_types(dtype if dtype.is_floating_point else torch.get_default_dtype(), torch.complex32)


# The maker of a number's 0-d tensor, built once rather than on every call.
_full_0d = functools.partial(torch.full, ())


def _as_tensor(op, name, value, partner, device):
    """`value` (`op`'s argument `name`) as a tensor on `device`.

    A number next to a tensor `partner` becomes a 0-d tensor of the dtype
    torch.where gives the pair, torch.result_type(partner, value), so that it
    promotes as torch.where's wrapped numbers do (a plain 0-d tensor of the
    default dtype would not: ``where(c, half_0d, 2.0)`` would come out
    float32). Two numbers are made by _numbers_as_tensors. Anything else
    (nested lists, NumPy arrays) goes through torch.as_tensor.

    Numbers become tensors through torch.full: a fill on the device, where
    torch.tensor would copy from the host, and on CUDA wait for the copy.
    """
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, _ANY_NUMBER) and isinstance(partner, torch.Tensor):
        if isinstance(value, _PYTHON_NUMBERS):
            return as_tensor(op, name, value, make=_full_0d, dtype=_dtype_with_number(partner.dtype, value),
                             device=device)
        # NumPy's scalars, which torch promotes in its own ways (and refuses
        # other numbers, a Fraction, say, as torch.where does).
        return as_tensor(op, name, value, make=_numpy_scalar_beside(partner), device=device)
    if type(value) in _PYTHON_NUMBERS:  # a condition, or a number known only at run time
        return torch.full((), value, device=device)
    return as_tensor(op, name, value, device=device)


def _numpy_scalar_beside(partner):
    """The maker of a NumPy scalar's 0-d tensor, of the dtype
    torch.result_type gives it beside the tensor `partner`."""
    return lambda number, **options: _full_0d(number, dtype=torch.result_type(partner, number), **options)


def _number_dtype(number):
    """The dtype torch gives a number of its own (what a bool tensor beside
    it would become, or uint64 past int64, which only a constant can be), so
    that two of them, made 0-d tensors, promote to torch.result_type(x, y)
    of the pair (errors included). NumPy's scalars count as numbers of their
    kind, as in torch.where."""
    if type(number) is int and number >= 2**63:
        return torch.uint64
    return _dtype_with_number(torch.bool, number)


def _numbers_as_tensors(op, condition, x, y):
    """Two numbers as 0-d tensors of their own dtypes: torch.full alone
    would make an int past int64 (2**63) int64, and a complex number under
    a float16 default dtype complex64."""
    device = _first_device(condition)
    return (_as_tensor(op, "condition", condition, None, device),
            as_tensor(op, "x", x, make=_full_0d, dtype=_number_dtype(x), device=device),
            as_tensor(op, "y", y, make=_full_0d, dtype=_number_dtype(y), device=device))


def _first_device(*values):
    return next((t.device for t in values if isinstance(t, torch.Tensor)), None)


def _are_numbers(x, y):
    """Both numbers: Python's, NumPy's scalars, or known only at run time."""
    return isinstance(x, _ANY_NUMBER) and isinstance(y, _ANY_NUMBER)


def _as_tensors(op, condition, x, y):
    """All three as tensors, on the device of the first one given as a tensor."""
    if _are_numbers(x, y):
        return _numbers_as_tensors(op, condition, x, y)
    device = _first_device(condition, x, y)
    return (_as_tensor(op, "condition", condition, None, device), _as_tensor(op, "x", x, y, device),
            _as_tensor(op, "y", y, x, device))


def _is_number(value):
    """A Python bool, int, float or complex, as the number overloads take it;
    not a NumPy scalar, even one deriving from float or complex (torch.ops
    refuses np.complex128 as a Scalar), nor a number known only at run time,
    which becomes a 0-d tensor of the dtype a number would give (Inductor's
    C++ wrapper, AOTInductor's, passes no symbolic Scalar to an op)."""
    return type(value) in (bool, int, float, complex)


@overload
def where(condition: TensorLike) -> torch.Tensor: ...
@overload
def where(condition: TensorLike, x: TensorLike, y: TensorLike) -> torch.Tensor: ...


def where(condition: TensorLike, x: TensorLike | None = None, y: TensorLike | None = None) -> torch.Tensor:
    """``tf.where``. With only ``condition``: the ``[z, condition.dim()]``
    int64 indices of its non-zero elements, in row-major order. With ``x`` and
    ``y``: elements of ``x`` where the bool ``condition`` is true, else of
    ``y``, all three broadcast together (NumPy rules), in the dtype
    ``torch.result_type(x, y)``. Python numbers and nested lists are accepted
    wherever a tensor is."""
    if isinstance(condition, torch.Tensor) and isinstance(x, torch.Tensor):  # the common calls, first
        if isinstance(y, torch.Tensor):
            return _where_self(condition, x, y)
        if _is_number(y):
            return _where_number_y(condition, x, y)
    if has_stand_in(condition, x, y):
        return handle_torch_function(where, (condition, x, y), condition, x, y)
    if x is None and y is None:
        if not isinstance(condition, torch.Tensor):
            condition = as_tensor("where", "condition", condition)
        return _where_indices(condition)
    if x is None or y is None:
        raise ValueError("where: expected both x and y or neither, got only " + ("x" if y is None else "y"))
    number_x, number_y = _is_number(x), _is_number(y)
    if number_x == number_y:
        return _where_self(*_as_tensors("where", condition, x, y))
    # One number: it goes to the kernel as a value (where.ScalarSelf,
    # where.ScalarOther), with no tensor made for it on the device.
    tensor = y if number_x else x
    if not (isinstance(condition, torch.Tensor) and isinstance(tensor, torch.Tensor)):
        if _are_numbers(x, y):  # the other a NumPy scalar, or known only at run time
            return _where_self(*_numbers_as_tensors("where", condition, x, y))
        device = _first_device(condition, tensor)
        condition = _as_tensor("where", "condition", condition, None, device)
        tensor = _as_tensor("where", "y" if number_x else "x", tensor, None, device)
    if number_x:
        return _where_number_x(condition, x, tensor)
    return _where_number_y(condition, tensor, y)


def select(condition: TensorLike, x: TensorLike, y: TensorLike) -> torch.Tensor:
    """TensorFlow's ``Select``: ``x`` and ``y`` of one shape; ``condition`` a
    bool scalar (all of ``x`` or all of ``y``), of ``x``'s shape (element by
    element), or 1-D of length ``x.shape[0]`` (whole rows). No other
    broadcasting. Python numbers and nested lists are accepted."""
    if isinstance(condition, torch.Tensor) and isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
        return _select(condition, x, y)  # the common call, first
    if has_stand_in(condition, x, y):
        return handle_torch_function(select, (condition, x, y), condition, x, y)
    return _select(*_as_tensors("select", condition, x, y))
