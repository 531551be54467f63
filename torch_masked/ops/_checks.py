"""Checks shared by the fake kernels (each mirrors a TORCH_CHECK in csrc/ with
the same message, so that eager, fake and compiled calls fail alike), the
data-dependent sizes they make, and the front doors' making of tensors from
array-likes and checks of their flags and integers."""

import operator

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_true, is_concrete_int


def check(cond, op, message):
    """torch._check with the op's name in front, as the C++ checks print it."""
    torch._check(cond, lambda: f"{op}: {message}")


def as_tensor(op, name, value, make=torch.as_tensor, **options):
    """make(value, **options), torch.as_tensor unless given, for a front
    door's argument given as an array-like (a number, a nested list, a NumPy
    array). Where torch makes no tensor of it (None, a string, a ragged list,
    a value the dtype cannot hold), torch's error names neither the op nor
    the argument: raised again with both, and the value."""
    try:
        return make(value, **options)
    except (TypeError, ValueError, RuntimeError) as error:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise type(error)(f"{op}: cannot make a tensor of {name} = {shown}: {error}") from error


def check_flag(op, name, value):
    """A flag argument is a bool, as torch's own functions require: taken
    for its truth, None or 0 would pass as False, and check_bounds=None
    would gather and scatter unchecked."""
    if value is not True and value is not False:
        raise TypeError(f"{op}: expected {name} to be a bool, got {value!r}")


def integer_or_none(value):
    """operator.index(value) (a 0-d integer tensor is an integer too, as
    torch takes it for a size), or None where value is not an integer: nor
    is a bool, which torch refuses for a dim or a size."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def as_integer(op, name, value):
    """An integer argument (a dim, a size) as an int (integer_or_none), with
    op and name in the TypeError where it is not one."""
    integer = integer_or_none(value)
    if integer is None:
        raise TypeError(f"{op}: expected {name} to be an integer, got {value!r}")
    return integer


def check_same_device(op, **tensors):
    """All named tensors on one device; the message names them all."""
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        listed = ", ".join(f"{name} on {dev}" for name, dev in devices.items())
        raise RuntimeError(f"{op}: expected all tensors on one device, got {listed}")


def equal_or_unknown(size, other):
    """size == other, or True where a trace cannot tell (a size known only at
    run time, from nonzero or boolean_mask). The kernel compares such sizes
    when it runs and fails with its own message; torch._check would instead
    defer them to a run-time assert saying only 'Eq(u1, u0)'. Only for sizes
    that the output's shape does not depend on."""
    return guard_or_true(size == other)


def bounded_dynamic_size(at_most):
    """A new unbacked SymInt for a size known only from the data, at most
    `at_most` where that is known when tracing (a constant, not a size
    traced as a symbol); 0 itself where nothing is counted, as
    torch.nonzero's fake kernel makes it: Inductor fails to lower a
    reduction over an unbacked size whose range is [0, 0] ("Invalid ranges
    [0:-1]"), or an index by it."""
    if not is_concrete_int(at_most):
        return torch.library.get_ctx().new_dynamic_size()
    return 0 if at_most == 0 else torch.library.get_ctx().new_dynamic_size(max=int(at_most))
