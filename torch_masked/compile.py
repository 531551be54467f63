"""Our ops inside graphs compiled by Inductor (``torch.compile``'s default
backend), and the switch that keeps them all opaque there.

``where`` (``where.self``, ``where.ScalarSelf``, ``where.ScalarOther``),
``select`` and ``gather_nd`` get Inductor decompositions into ``aten.where``
and ``aten.index``, so that Inductor fuses them with the work around them:
one loop instead of our kernel reading operands that Inductor first wrote
out, and writing a result that Inductor then reads back. The decompositions
live in Inductor's own table (``torch._inductor.decomposition.decompositions``),
the one it hands AOTAutograd when it lowers a graph, so they apply only
there: eager calls run our kernels, and ``torch.export`` (hence ONNX export),
which decomposes with its own table, keeps ``masked::`` ops. They keep our
semantics exactly: the result dtype is ``torch.result_type(x, y)``, a number
promotes as ``torch.where``'s wrapped numbers do, ``select``'s row condition
picks whole rows, the result is a new contiguous tensor, and an index out of
bounds is gather_nd's IndexError (masked::check_gather_nd_indices, run
before the fused gather) or, without check_bounds, a row of zeros.

A decomposition declines (returns ``NotImplemented``, so the op stays our
kernel) where Inductor would not keep our behaviour: a dtype outside
``FUSED_DTYPES``, a number that does not fit the result dtype (our kernel
raises for it, as eager ``torch.where`` does), a number known only at run
time (its range cannot be checked), and where's and select's shapes holding
sizes known only at run time (from ``nonzero`` or ``boolean_mask``), whose
mismatch our kernel reports by name.

``scatter_nd``, ``tensor_scatter_nd_add``, ``boolean_mask`` and ``nonzero``
stay our kernels inside compiled graphs, on every device: ``boolean_mask``
and ``nonzero`` are faster there than what Inductor makes of the native
equivalents, the scatters on large outputs too
(``benchmarks/bench_compiled.py``; README, "Inside torch.compile"), and
Inductor's scatters would not keep our contract: negative indices wrap, an
out-of-range index is not our IndexError naming the row (on CUDA it is a
device assert), and sums follow the order of atomic adds.
"""
import contextlib
import hashlib
import math
import pathlib

import torch
from torch._library.utils import get_layout_constraint_tag
from torch.fx.experimental.symbolic_shapes import has_free_unbacked_symbols

from ._after_import import when_imported

# The dtypes whose where Inductor generates on the CPU and CUDA alike; others
# (complex, uint16/32/64, float8) stay our kernel.
FUSED_DTYPES = frozenset(
    [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
    + [torch.float16, torch.bfloat16, torch.float32, torch.float64]
)

_opaque = False
# Inductor's and AOTAutograd's on-disk caches key a graph as it is before
# decomposition, with torch's version but not ours: a graph compiled with
# other decompositions (an older torch_masked, or the opaque switch) would be
# served as it was. So torch.compiler.config.cache_key_tag carries a
# fingerprint of this module, which holds them all, and the switch.
_FINGERPRINT = hashlib.sha256(pathlib.Path(__file__).read_bytes()).hexdigest()[:16]
_cache_tag = ""  # what is appended to cache_key_tag now


def _update_cache_tag():
    global _cache_tag
    tag = torch.compiler.config.cache_key_tag.replace(_cache_tag, "")
    _cache_tag = f"|torch_masked.{_FINGERPRINT}" + (".opaque" if _opaque else "")
    torch.compiler.config.cache_key_tag = tag + _cache_tag


def set_opaque(enabled):
    """Keep every op our opaque kernel inside compiled graphs (``True``), or
    let Inductor fuse ``where`` and ``select`` (``False``, the default).

    It is read when a graph is compiled: a function compiled before keeps its
    code until Dynamo recompiles it (``torch.compiler.reset()`` forgets every
    compiled graph). Inductor's on-disk caches see it through
    ``torch.compiler.config.cache_key_tag``, whose ``"|torch_masked.<fingerprint>"``
    ends in ``".opaque"`` while on, so a graph compiled one way is never
    served from the cache for the other."""
    global _opaque
    _opaque = bool(enabled)
    _update_cache_tag()


def is_opaque():
    """Whether every op stays opaque in compiled graphs (see ``set_opaque``)."""
    return _opaque


@contextlib.contextmanager
def opaque(enabled=True):
    """``set_opaque(enabled)`` for the graphs compiled inside the block."""
    before = _opaque
    set_opaque(enabled)
    try:
        yield
    finally:
        set_opaque(before)


def _number_fits(number, dtype):
    """Whether a Python number converts to `dtype` without overflow, as
    c10::checked_convert decides it for torch.where (inf and NaN fit every
    floating dtype); a symbolic number cannot be checked at compile time."""
    if isinstance(number, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return False
    if dtype == torch.bool:
        return True
    if dtype.is_floating_point:
        return not math.isfinite(number) or abs(number) <= torch.finfo(dtype).max
    info = torch.iinfo(dtype)
    return info.min <= number <= info.max


def _fusable(condition, x, y, dtype):
    if _opaque or dtype not in FUSED_DTYPES:
        return False
    for value in (x, y):
        if isinstance(value, torch.Tensor):
            if value.dtype not in FUSED_DTYPES:
                return False
        elif not _number_fits(value, dtype):
            return False
    return not has_free_unbacked_symbols([t for t in (condition, x, y) if isinstance(t, torch.Tensor)])


def _converted(value, dtype):
    return value.to(dtype) if isinstance(value, torch.Tensor) else value


def _where(condition, x, y):
    """masked::where.self, where.ScalarSelf and where.ScalarOther as aten.where."""
    dtype = torch.result_type(x, y)
    if not _fusable(condition, x, y, dtype):
        return NotImplemented
    # aten.where's result follows its operands' memory layout; ours is
    # row-major, so a transposed operand costs a copy, as in our kernel.
    return torch.where(condition, _converted(x, dtype), _converted(y, dtype)).contiguous()


def _select(condition, x, y):
    """masked::select as aten.where: a 1-D condition of a tensor of higher
    rank picks rows, so it becomes [n, 1, ..., 1]; a scalar or same-shape
    condition broadcasts as it is."""
    if condition.dim() == 1 and x.dim() > 1:
        condition = condition.reshape([-1] + [1] * (x.dim() - 1))
    return _where(condition, x, y)


def _gather_nd(params, indices, *, check_bounds=True):
    """masked::gather_nd as aten.index of params' leading K dimensions, flat:
    Inductor fuses the gather into the loop of what reads its result, and
    what computes params into the gather (only the rows read). With
    check_bounds, masked::check_gather_nd_indices raises gather_nd's
    IndexError first: its result, a 0 added to the slots, keeps it before the
    loop, whose indices are then all in bounds (Inductor's own wrap of
    negative indices and its bounds assert never fire). Without, each index
    is clamped and rows out of bounds read as zeros, as in our kernel. K = 0
    (every row is all of params) and params without slots stay our kernel."""
    depth = indices.shape[-1]
    lead, rest = params.shape[:depth], params.shape[depth:]
    num_slots = math.prod(lead)
    if _opaque or params.dtype not in FUSED_DTYPES or depth == 0 or num_slots == 0:
        return NotImplemented
    slots, in_bounds = None, None
    for size, column in zip(lead, indices.unbind(-1)):
        column = column.to(torch.int64)
        if not check_bounds:
            column_in_bounds = (column >= 0) & (column < size)
            in_bounds = column_in_bounds if in_bounds is None else in_bounds & column_in_bounds
            column = column.clamp(0, size - 1)
        slots = column if slots is None else slots * size + column
    if check_bounds:
        slots = slots + torch.ops.masked.check_gather_nd_indices(indices, list(params.shape))
    # aten.index itself: Python's indexing would read a 0-d index (one row) as a number.
    gathered = torch.ops.aten.index.Tensor(params.reshape(num_slots, *rest), [slots])
    if check_bounds:
        return gathered
    in_bounds = in_bounds.reshape(in_bounds.shape + (1,) * len(rest))
    return torch.where(in_bounds, gathered, gathered.new_zeros(()))


DECOMPOSITIONS = {
    torch.ops.masked.where.self: _where,
    torch.ops.masked.where.ScalarSelf: _where,
    torch.ops.masked.where.ScalarOther: _where,
    torch.ops.masked.select.default: _select,
    torch.ops.masked.gather_nd.default: _gather_nd,
}

# Loaded by the first torch.compile that uses Inductor, after its table.
_INDUCTOR_LOWERING = "torch._inductor.lowering"


def _register(lowering):
    from torch._inductor import decomposition

    for op, decompose in DECOMPOSITIONS.items():
        decomposition.register_decomposition(op)(decompose)
        # Where a decomposition declines, the op is lowered as a call of our
        # kernel, as Inductor lowers any op it has no lowering for; but it
        # does so on its own only for ops without a decomposition.
        layout = lowering.tag_to_layout_constraint(get_layout_constraint_tag(op, with_default=True))
        lowering.make_fallback(op, layout_constraint=layout, warn=False, override_decomp=True)
    # select_decomp_table() hands out a cached copy of the table.
    decomposition.fast_random_decomps.cache_clear()


_update_cache_tag()
# Registered when Inductor's lowerings are first imported (by the first
# torch.compile that uses Inductor): importing Inductor from torch_masked
# would double its import time (1.4 s more here).
when_imported(_INDUCTOR_LOWERING, _register)
