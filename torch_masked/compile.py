"""Our ops inside graphs compiled by Inductor (``torch.compile``'s default
backend), and the switch that keeps them all opaque there.

``where`` (``where.self``, ``where.ScalarSelf``, ``where.ScalarOther``) and
``select`` get Inductor decompositions into ``aten.where``, and
``gather_nd`` an Inductor lowering (a loop of Inductor's own IR), so that
Inductor fuses them with the work around them: one loop instead of our
kernel reading operands that Inductor first wrote out, and writing a result
that Inductor then reads back. Both live in Inductor's own tables
(``torch._inductor.decomposition.decompositions``, the one it hands
AOTAutograd when it lowers a graph, and ``torch._inductor.lowering.lowerings``),
so they apply only there: eager calls run our kernels, and ``torch.export``
(hence ONNX export), which decomposes with its own table, keeps ``masked::``
ops. They keep our semantics exactly: the result dtype is
``torch.result_type(x, y)``, a number promotes as ``torch.where``'s wrapped
numbers do, ``select``'s row condition picks whole rows, the result is a new
contiguous tensor, and an index out of bounds is gather_nd's IndexError
(masked::check_gather_nd_indices, told by the fused loop) or, without
check_bounds, a row of zeros.

A decomposition or lowering declines (the op stays our kernel) where
Inductor would not keep our behaviour: a dtype outside ``FUSED_DTYPES``, a
number that does not fit the result dtype (our kernel raises for it, as
eager ``torch.where`` does), a number known only at run time whose range
the dtype may not hold (``_HOLD_EVERY``), and where's and select's shapes holding sizes known only
at run time (from ``nonzero`` or ``boolean_mask``), whose mismatch our
kernel reports by name; for gather_nd, see ``_gather_nd_lowering``.

``boolean_mask`` and ``nonzero`` stay our kernels inside compiled graphs,
and so do ``scatter_nd`` and ``tensor_scatter_nd_add`` on the CPU (a
``tensor_scatter_nd_add`` into a tensor nothing else reads adds into it in
place: ``_tensor_scatter_nd_add_into``): there they are faster than what
Inductor makes of the native equivalents (``benchmarks/bench_compiled.py``;
README, "Inside torch.compile"), and Inductor's C++ scatter would sum
float16 and bfloat16 rounding at every add, in the order its threads land,
where ours sums each destination in index order. A bool that the graph
computes for ``nonzero`` or ``boolean_mask`` reaches them written as bytes
by way of int32 on the CPU (``_bool_stored_as_bytes``), where Inductor's
own bool store branches on every element; so does the graph's output of
that bool where our ops alone read it (a mask saved for the backward).
Where Inductor generates Triton (CUDA), the scatters without check_bounds,
outside deterministic mode, are Inductor's own atomic scatter
(``_scatter_added``), with our index rule (a row out of bounds adds
nothing; negative indices never wrap): on an H200 the GPU did the same
work for both, and Inductor's chain saved the host the call of our op
(ours 1.03-1.18 of native's; Inductor's 1.00-1.05 on an H100). With
check_bounds they stay ours: the IndexError needs the bounds flag read
back either way. So do float16 and bfloat16 scatters, which our CUDA
kernel sums in float and rounds once, where Triton's atomic adds would
round at every add.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import pathlib
from typing import Callable, Iterator, NamedTuple

import sympy
import torch
from torch._library.utils import get_layout_constraint_tag
from torch.fx.experimental.symbolic_shapes import has_free_unbacked_symbols, statically_known_true

from . import _C
from ._after_import import when_imported

# The dtypes whose where Inductor generates on the CPU and CUDA alike; others
# (complex, uint16/32/64, float8) stay our kernel.
FUSED_DTYPES = frozenset(
    [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
    + [torch.float16, torch.bfloat16, torch.float32, torch.float64]
)

_opaque = False


def _fingerprint(package: pathlib.Path, extension: pathlib.Path) -> str:
    """What a compiled graph of our ops depends on besides torch: every
    module of the package (the decompositions and lowerings here, the fake
    kernels and autograd registrations of ops/) and the compiled extension,
    whose C++ backward AOTAutograd traces into the graphs it caches. The
    extension by its size and modification time: a rebuilt or reinstalled
    one has new ones, and reading its megabytes would slow every import."""
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    stat = extension.stat()
    digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


# Inductor's and AOTAutograd's on-disk caches key a graph as it is before
# decomposition, with torch's version but not ours: a graph compiled with
# other decompositions, lowerings, fake kernels or backward formulas (an
# older torch_masked, or the opaque switch) would be served as it was. So
# torch.compiler.config.cache_key_tag carries the package's fingerprint and
# the switch.
_FINGERPRINT = _fingerprint(pathlib.Path(__file__).parent, pathlib.Path(_C.__file__))
_cache_tag = ""  # what is appended to cache_key_tag now


def _update_cache_tag():
    global _cache_tag
    tag = torch.compiler.config.cache_key_tag.replace(_cache_tag, "")
    _cache_tag = f"|torch_masked.{_FINGERPRINT}" + (".opaque" if _opaque else "")
    torch.compiler.config.cache_key_tag = tag + _cache_tag


def set_opaque(enabled: bool) -> None:
    """Keep every op our opaque kernel inside compiled graphs, called as in
    eager (``True``), or let Inductor fuse ``where``, ``select`` and
    ``gather_nd``, add ``tensor_scatter_nd_add`` in place where it can, and
    generate the scatters without check_bounds where it generates Triton
    (``False``, the default).

    It is read when a graph is compiled: a function compiled before keeps its
    code until Dynamo recompiles it (``torch.compiler.reset()`` forgets every
    compiled graph). Inductor's on-disk caches see it through
    ``torch.compiler.config.cache_key_tag``, whose ``"|torch_masked.<fingerprint>"``
    ends in ``".opaque"`` while on, so a graph compiled one way is never
    served from the cache for the other."""
    global _opaque
    _opaque = bool(enabled)
    _update_cache_tag()


def is_opaque() -> bool:
    """Whether every op stays opaque in compiled graphs (see ``set_opaque``)."""
    return _opaque


@contextlib.contextmanager
def opaque(enabled: bool = True) -> Iterator[None]:
    """``set_opaque(enabled)`` for the graphs compiled inside the block."""
    before = _opaque
    set_opaque(enabled)
    try:
        yield
    finally:
        set_opaque(before)


# The dtypes that hold every value of a number known only at run time, by
# its kind (a bool's 0 and 1 fit every dtype); elsewhere its range cannot be
# checked at compile time, and our kernel checks it.
_HOLD_EVERY = {torch.SymInt: (torch.int64, torch.bfloat16, torch.float32, torch.float64),
               torch.SymFloat: (torch.float64,)}


def _number_fits(number, dtype):
    """Whether a Python number converts to `dtype` without overflow, as
    c10::checked_convert decides it for torch.where (inf and NaN fit every
    floating dtype)."""
    if isinstance(number, torch.SymBool):
        return True
    if isinstance(number, (torch.SymInt, torch.SymFloat)):
        return dtype in _HOLD_EVERY[type(number)]
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


def _first_element_stands_in(indices, shape):
    """Whether each index row's entries have a first element of `shape`'s
    indexed dimensions to stand in for a row out of bounds (in the gather)
    or to divide by (in the copy into _scatter_added's buffer): K a
    positive constant, and each size it indexes at least 1 by its range. A
    size that may be 0 (a constant 0, one known only from data, or a
    symbolic size whose range starts at 0, as `torch.export.Dim(min=0)` or
    `backed_size_oblivious` make it) has none. The range is read as it is:
    Inductor's statically_known_gt takes a backed size for positive even
    where its range starts at 0."""
    depth = indices.get_size()[-1]
    return (isinstance(depth, (int, sympy.Integer)) and 0 < int(depth) <= len(shape)
            and all(map(_at_least_one, shape[: int(depth)])))


def _at_least_one(size):
    """Whether the size's range (see _first_element_stands_in) starts at 1
    or above."""
    from torch._inductor.virtualized import V

    return V.graph.sizevars.shape_env.bound_sympy(sympy.sympify(size)).lower >= 1


def _index_entries(load_index, row, sizes):
    """The entries of index row `row` (Inductor's loader of the indices) as
    int64 values in Inductor's IR, each with the size it must lie within."""
    from torch._inductor.virtualized import ops

    return [(ops.to_dtype(load_index([*row, sympy.Integer(column)]), torch.int64), size)
            for column, size in enumerate(sizes)]


def _row_sign(row_entries):
    """The OR over the row's entries v of v | (size - 1 - v): negative iff
    some v is outside [0, size). Integer arithmetic only, which Inductor's
    vectorised C++ keeps in registers, where a chain of comparisons would
    convert masks between widths."""
    from torch._inductor.virtualized import ops

    signs = [ops.bitwise_or(v, ops.sub(ops.index_expr(size - 1, torch.int64), v)) for v, size in row_entries]
    return functools.reduce(ops.bitwise_or, signs)


def _in_bounds(row_entries):
    """Whether the row is in bounds, by its sign (_row_sign)."""
    from torch._inductor.virtualized import ops

    return ops.ge(_row_sign(row_entries), ops.constant(0, torch.int64))


def _sign_bits(row_entries):
    """The row's sign (_row_sign) shifted right 63 bits, arithmetically as
    on int64 in C++ and Triton: all ones for a row out of bounds, zeros for
    one within. Integer operations, which the masks of _masked_positions
    and _one_if_out_of_bounds are made of, in place of selects."""
    from torch._inductor.virtualized import ops

    return ops.bitwise_right_shift(_row_sign(row_entries), ops.constant(63, torch.int64))


def _one_if_out_of_bounds(row_entries):
    """An int32 1 for a row out of bounds and 0 for one within: its sign
    bits (_sign_bits) ANDed with 1 (see _any_row_out_of_bounds)."""
    from torch._inductor.virtualized import ops

    return ops.to_dtype(ops.bitwise_and(_sign_bits(row_entries), ops.constant(1, torch.int64)), torch.int32)


def _in_bounds_unsigned(row_entries):
    """Whether the row is in bounds, each entry v compared with its size as
    an unsigned 64-bit integer (a negative v is then above every size).
    Inductor's C++ vectorises no uint64 operation, so a loop with this test
    stays scalar: see _keeps_loop_scalar."""
    from torch._inductor.virtualized import ops

    tests = [ops.lt(ops.to_dtype(v, torch.uint64), ops.to_dtype(ops.index_expr(size, torch.int64), torch.uint64))
             for v, size in row_entries]
    return functools.reduce(ops.and_, tests)


def _one_if_out_of_bounds_unsigned(row_entries):
    """An int32 1 for a row out of bounds and 0 for one within, by a select
    on the unsigned test: the loop it keeps scalar has no lanes for the
    integer masks of _one_if_out_of_bounds to save."""
    from torch._inductor.virtualized import ops

    return ops.where(_in_bounds_unsigned(row_entries), ops.constant(0, torch.int32), ops.constant(1, torch.int32))


def _generates_cpp(node):
    """Whether Inductor generates C++ for node: a CPU tensor, under its C++
    backend (not Triton's)."""
    from torch._inductor import config

    return node.get_device().type == "cpu" and config.cpu_backend == "cpp"


def _keeps_loop_scalar(indices, rows, sizes, rest):
    """Whether the gather's loop on Inductor's C++ should stay scalar, as
    native ``x[i, j]``'s does: a gather of single elements (no slice
    dimensions) by index rows of K >= 2 entries laid out row after row
    (consecutive rows' entries not adjacent in memory).

    Inductor vectorises a loop unless its loads that are not contiguous are
    too large a share of its operations; it counts our bounds test's integer
    operations as work, and vectorised the chain
    (gather_nd(x, idx)*2+1).sum() of index pairs, whose vectors of entries it
    then builds from scalar loads through a stack buffer: 1.7-1.9x native's
    chain, which it leaves scalar. Scalar, ours is 0.87-1.04 of native's
    with up to seven elementwise operations after the gather. The vectorised
    loop was the faster one after a transcendental operation or more (0.80
    after a log, 0.25 after five), and from eight operations Inductor
    vectorises native's loop too, which is then 3.5x faster than our scalar
    one (benchmarks/METHODS.md). K = 1 with a strided column stays Inductor's
    choice, 1.6-1.8x native's in that chain: there Inductor vectorises
    native's from two operations after the gather, where a scalar loop
    would lose more. So do indices whose layout Inductor has not fixed."""
    if rest or not rows or len(sizes) < 2 or not _generates_cpp(indices):
        return False
    strides = indices.maybe_get_stride()
    return strides is not None and strides[-2] != 1


# ATen's reductions that, over every element of what they read (no dims,
# or all of them), share a loop with a reduction of the same elements.
_WHOLE_REDUCTIONS = frozenset(f"aten::{name}" for name in ("sum", "mean", "amax", "amin", "prod"))


def _shape_of(node):
    value = node.meta.get("val")
    return value.shape if isinstance(value, torch.Tensor) else None


def _reduced_whole(node):
    """Whether an op's FX node `node` is read only by a reduction over all
    of its elements, through elementwise ops that keep its shape and are
    each read once: (gather_nd(x, idx) * 2 + 1).sum(), or a loss's mean."""
    shape = _shape_of(node)
    while shape is not None and len(node.users) == 1:
        (node,) = node.users
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            return False
        if node.target._schema.name in _WHOLE_REDUCTIONS:
            dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
            dims = [dims] if isinstance(dims, int) else dims
            return not dims or sorted(d % len(shape) for d in dims) == list(range(len(shape)))
        if torch.Tag.pointwise not in node.target.tags or not _same_shape(_shape_of(node), shape):
            return False
    return False


def _same_shape(shape, other):
    """Whether the shapes are known equal, sizes known only at run time
    included, without a guard on them."""
    return (shape is not None and len(shape) == len(other)
            and all(statically_known_true(size == other_size) for size, other_size in zip(shape, other)))


def _checks_in_the_readers_loop(indices, rest):
    """Whether the bounds check of a gather of slices (`rest`, the slice's
    dimensions, not empty) on Inductor's C++ should reduce over every
    gathered element rather than over the rows: where the gather is read
    by a reduction over all its elements (_reduced_whole), Inductor then
    computes the check in that reduction's loop, with the row test the
    gather makes anyway, and the graph has no pass of its own for it; at
    1e6 (slices of 8, n/80 rows) 0.91 of native's chain where the pass made
    it 1.04 on an AVX-512 CPU, 0.86 for 0.99 in AVX2 code
    (benchmarks/METHODS.md). Inductor fuses no reduction with an
    elementwise node that comes after it, so for any other reader the check
    is a pass of its own, which over every element would cost that reader
    up to 1.5x in AVX2 code: there it stays a pass over the rows
    (_checks_in_a_scalar_pass). So does a slice that may have no elements,
    over which the check would find no row out of bounds."""
    from torch._inductor.virtualized import V

    node = V.graph.current_node
    return (bool(rest) and all(map(_at_least_one, rest)) and _generates_cpp(indices) and node is not None
            and node.target is torch.ops.masked.gather_nd.default and _reduced_whole(node))


def _checks_in_a_scalar_pass(indices, rest):
    """Whether the bounds check of a gather of slices (`rest`, the slice's
    dimensions, not empty) on Inductor's C++, where it is a pass of its own
    over the index rows (the check reduces over the rows, the slices'
    reader over their elements), should test each row as an unsigned
    integer, which keeps that pass scalar. Vectorised, that pass loads the int64
    entries by at::vec's partial load, which on AVX2 copies them through a
    stack buffer, and each load then waits on the two halves the compiler
    stored there: at 1e7 (slices of 8, n/80 rows) the vector pass cost
    150-180 us of a 0.6 ms chain on an AMD EPYC with AVX2, the scalar one
    about 55, as fast as the index rows stream in (benchmarks/METHODS.md)."""
    return bool(rest) and _generates_cpp(indices)


# From this many bytes of params on, our CPU kernel gathers the slices it
# takes in passes faster than Inductor's loop (1.4-1.9x at 16 MiB, 1.7-3.2x
# at 40 MiB; level or slower up to 8 MiB: benchmarks/METHODS.md).
GATHER_IN_PASSES_CPU_BYTES = 16 * 2**20


def _gathers_faster_in_passes(params, depth):
    """Whether our CPU kernel gathers params' slices (its dimensions past
    `depth`) in passes and params is large enough for that to beat
    Inductor's loop: one dimension of the slice is wider than one, its
    elements a cache line or more apart and more than a line holds (a row
    of a transposed matrix; csrc/cpu/scatter_nd_kernel.cpp, gather_into_cpu),
    and params holds GATHER_IN_PASSES_CPU_BYTES or more, all known when the
    graph compiles. Inductor's C++ loop reads from every column of params
    for each row, which from about 16 MiB on costs it more than the passes."""
    from torch._inductor.virtualized import V

    strides = params.maybe_get_stride()
    if not _generates_cpp(params) or strides is None:
        return False
    sizevars = V.graph.sizevars
    itemsize = params.get_dtype().itemsize
    wide = [(size, stride) for size, stride in zip(params.get_size()[depth:], strides[depth:])
            if not sizevars.statically_known_equals(size, 1)]
    if len(wide) != 1:
        return False
    (size, stride), line = wide[0], 64
    return (sizevars.statically_known_geq(stride * itemsize, line) and sizevars.statically_known_gt(size * itemsize, line)
            and sizevars.statically_known_geq(params.get_numel() * itemsize, GATHER_IN_PASSES_CPU_BYTES))


def _positions(row_entries, in_bounds):
    """The row's entries as Inductor's indices, those of the first row (0,
    ..., 0) where the row is out of bounds, by a select per entry: never
    wrapped nor asserted by Inductor, whose rules for a bad index are not
    ours. For the scalar loop of the unsigned test; elsewhere
    _masked_positions."""
    from torch._inductor.virtualized import ops

    zero = ops.constant(0, torch.int64)
    return [ops.indirect_indexing(ops.where(in_bounds, entry, zero), size, check=False, wrap_neg=False)
            for entry, size in row_entries]


def _masked_positions(row_entries):
    """The row's entries as Inductor's indices, those of the first row (0,
    ..., 0) where the row is out of bounds, as _positions, but with integer
    operations in place of the selects: each entry ANDed with the NOT of
    the row's sign bits (_sign_bits), all ones for a row in bounds, zeros
    for one out of bounds (Inductor computes the sign once for these and
    the row test). For slices: Inductor's C++ (torch 2.14)
    vectorises the tail of a loop (a slice narrower than a vector, or the
    last elements of a wider one) only where selects are not too large a
    share of its operations, and the selects of _positions made the gather
    of slices of 8 float32 a scalar loop, 1.9-2.1x native's chain; with the
    entries clamped into bounds, 0.85-1.01 at 1e6; masked so, 0.96-0.98 of
    the clamped chain's time at 1e7, a compare and a move fewer per bound
    (benchmarks/METHODS.md). For single elements in a vector loop, 0.56 of
    native's chain where the selects made it 0.60 (1e6, AVX-512 code; as
    fast in AVX2 code). The scalar loop of the unsigned test
    (_keeps_loop_scalar) keeps the selects: clamped, its index pairs were
    1.1-1.5x native's."""
    from torch._inductor.virtualized import ops

    keep = ops.bitwise_not(_sign_bits(row_entries))
    return [ops.indirect_indexing(ops.bitwise_and(entry, keep), size, check=False, wrap_neg=False)
            for entry, size in row_entries]


class _RowTest(NamedTuple):
    """One way to test index rows, with the positions a row reads (the
    first row's where it is out of bounds) and the check's int32 1 for a
    row out of bounds made to suit it: each chosen by measurement, in the
    functions' notes."""

    in_bounds: Callable  # (row_entries) -> bool
    positions: Callable  # (row_entries, in_bounds) -> Inductor's indices
    one_if_out_of_bounds: Callable  # (row_entries) -> int32


# For vector loops: the rows' signs and integer masks made of them.
_SIGNED_ROW_TEST = _RowTest(_in_bounds, lambda row_entries, _: _masked_positions(row_entries), _one_if_out_of_bounds)
# For the scalar loops of index pairs and of the slices' check pass of its
# own: unsigned compares and selects.
_UNSIGNED_ROW_TEST = _RowTest(_in_bounds_unsigned, _positions, _one_if_out_of_bounds_unsigned)


def _bool_stored_as_bytes(tensor, dtype, node):
    """A bool tensor that Inductor computes on its C++ backend, written as
    int32 converted to uint8, as `dtype` (uint8, or those bytes viewed as
    bool); any other tensor as it is. Inductor's vector code writes a bool
    from its mask by a choice per lane that branches on the data: 6.9 ms
    for x > 0 of 1e6 random float32, where the same bytes written by way of
    int32 take 0.20 (torch 2.14; 2.11's store as slow; benchmarks/METHODS.md).

    Where every reader of the bool's FX node `node` is one of our ops that
    take bytes (_BOOL_ARGUMENTS) or the graph's output, they all get the
    bytes: the bool's TensorBox becomes their view as bool. That includes a
    bool Inductor has already written to a buffer of its own for the
    output, as a compiled training step does with the mask that
    boolean_mask saves for its backward (8.4-8.8 ms for 1.6-2.3 at 1e6):
    the bytes are then computed as that buffer was, and the buffer, read
    by nothing, is dropped. Any other bool in a buffer (an input, another
    kernel's result, a bool Inductor's own code reads too) is kept."""
    from torch._inductor import ir
    from torch._inductor.virtualized import V, ops

    if tensor.get_dtype() != torch.bool or not _generates_cpp(tensor):
        return tensor
    read_by_ours_alone = isinstance(node, torch.fx.Node) and all(
        user.op == "output" or user.target in _BOOL_ARGUMENTS for user in node.users)
    strides = None
    if ir.is_storage_and_layout(tensor):
        storage = tensor.data if isinstance(tensor, ir.TensorBox) else None
        written = storage.data if isinstance(storage, ir.StorageBox) else None
        # The bytes are computed where our op reads them; should a buffer
        # the bool was computed from have been written in place since (a
        # reinplaced scatter; Inductor's passes put the bool's computation
        # just before its first reader, which keeps that from happening),
        # the bool's buffer stays.
        if not (read_by_ours_alone and isinstance(written, ir.ComputedBuffer)
                and isinstance(written.data, ir.Pointwise)
                and not written.get_read_names() & V.graph.mutated_buffers):
            return tensor
        load, strides = written.data.make_loader(), written.get_stride()
    else:
        load = tensor.make_loader()
    as_bytes = ir.Pointwise.create(
        device=tensor.get_device(), dtype=torch.uint8,
        inner_fn=lambda index: ops.to_dtype(ops.to_dtype(load(index), torch.int32), torch.uint8),
        ranges=list(tensor.get_size()))
    if strides is not None:  # the output's strides, which that buffer was given
        as_bytes = ir.ExternKernel.require_exact_strides(as_bytes, strides)
    as_bytes.realize()
    as_bool = ir.DtypeView.create(as_bytes, torch.bool)
    if read_by_ours_alone:
        tensor.data = as_bool
    return as_bytes if dtype == torch.uint8 else ir.TensorBox(as_bool)


# Our ops that read a bool tensor: the argument's position, and the dtype
# that _bool_stored_as_bytes hands them. nonzero and where's index mode
# read any dtype, so uint8 as it is; boolean_mask and its backward take a
# bool mask, so the bytes viewed as bool (a call of aten.view.dtype in the
# graph's wrapper).
_BOOL_ARGUMENTS = {
    torch.ops.masked.nonzero.default: (0, torch.uint8),
    torch.ops.masked.nonzero_static.default: (0, torch.uint8),
    torch.ops.masked.nonzero_tuple.default: (0, torch.uint8),
    torch.ops.masked.where.default: (0, torch.uint8),
    torch.ops.masked.boolean_mask.default: (1, torch.bool),
    torch.ops.masked.boolean_mask_backward.default: (1, torch.bool),
}


def _call_of_ours_on_bools(lowering, op):
    """Inductor's call of our kernel `op`, its bool argument
    (_BOOL_ARGUMENTS) written by way of bytes (_bool_stored_as_bytes), but
    under the switch that keeps every op opaque."""
    call = lowering.fallback_handler(op, add_to_fallback_set=False)
    bool_position, dtype = _BOOL_ARGUMENTS[op]
    # Every keyword argument named, defaults included, as in the call that
    # Inductor made of our op before it had this lowering (its layout
    # constraint named them): an AOTInductor package passes the op a value
    # for each, and its calls fail where the graph named fewer
    # ("Mismatch between ints consumed and num_ints" for nonzero_static).
    defaults = {argument.name: argument.default_value for argument in op._schema.arguments
                if argument.kwarg_only and argument.has_default_value()}

    def call_ours(*args, **kwargs):
        from torch._inductor.virtualized import V

        # The graph passes the bool positionally (no op here takes it by
        # keyword only), however the caller named it.
        if not _opaque:
            node = V.graph.current_node.args[bool_position]
            args = [_bool_stored_as_bytes(arg, dtype, node) if position == bool_position else arg
                    for position, arg in enumerate(args)]
        return call(*args, **{**defaults, **kwargs})

    return call_ours


def _call_of_ours(lowering, op, check, check_arguments):
    """Inductor's call of our kernel `op`, followed, where the result has no
    elements, by the op `check` of `check_arguments(*args, **kwargs)` (None
    where there is nothing to check): Inductor reads nothing of a tensor
    with no elements, so it would drop the call that makes one as unused,
    and with it the error an eager call raises, which `check`, a side effect
    that Inductor keeps, raises in its place. So the index ops keep their
    IndexError (_call_of_ours_checking_indices: a scatter into shape
    [0, 2], or into [8, 0] by a row past 8; native index_put's is lost so),
    and where its error for a number the dtype cannot hold
    (_where_number_check; a torch.where compiled raises it as it
    compiles)."""
    from torch._inductor.virtualized import V

    call = lowering.fallback_handler(op, add_to_fallback_set=False)
    raise_as_eager = lowering.fallback_handler(check, add_to_fallback_set=False)

    def call_ours(*args, **kwargs):
        result = call(*args, **kwargs)
        arguments = check_arguments(*args, **kwargs)
        if arguments is not None and V.graph.sizevars.statically_known_true(sympy.Eq(result.get_numel(), 0)):
            raise_as_eager(*arguments)
        return result

    return call_ours


def _call_of_ours_checking_indices(lowering, op, rows_and_shape):
    """_call_of_ours of gather_nd, scatter_nd or tensor_scatter_nd_add,
    checked where check_bounds is set by masked::check_indices_in_bounds of
    the index rows against the shape they index (`rows_and_shape(*args)`)."""
    name = op.name().split("::")[1]

    def check_arguments(*args, check_bounds):
        if not check_bounds:
            return None
        indices, shape = rows_and_shape(*args)
        return name, indices, list(shape), 0

    return _call_of_ours(lowering, op, torch.ops.masked.check_indices_in_bounds.default, check_arguments)


def _where_number_check(number_is_x):
    """check_arguments (_call_of_ours) of where.ScalarSelf (number_is_x) or
    where.ScalarOther, where its decomposition declines:
    masked::check_where_number of the condition, the tensor and the
    number."""
    if number_is_x:
        return lambda condition, number, tensor: (condition, tensor, number, True)
    return lambda condition, tensor, number: (condition, tensor, number, False)


def _any_row_out_of_bounds(device, row_entries_at, row_test, check_ranges, slices):
    """A bool scalar in Inductor's IR: whether a row is out of bounds
    anywhere over check_ranges, by `row_test` (a _RowTest) of the entries
    `row_entries_at(position)`. For elements, the greatest of the test's
    int32 1 for a row out of bounds and 0 for one within, one int32 lane
    per row in a vector loop: with the test of signs, made of integer
    operations, which at 1e6 made the chain 0.59 of native's where a
    select on the test made it 1.01 (AVX-512 code; 1.02 for 0.98 in AVX2
    code, 1.03 for 1.09 at 1e7). For slices, `any` of the test negated: in
    a pass of its own 0.96-0.98 of the greatest's time, in the reader's
    loop as fast, where for elements it was 1.1-1.2 of it
    (benchmarks/METHODS.md)."""
    from torch._inductor import ir
    from torch._inductor.virtualized import ops

    if slices:
        flag = ir.Reduction.create(
            device=device, dst_dtype=torch.bool, src_dtype=torch.bool,
            inner_fn=lambda _, position: ops.logical_not(row_test.in_bounds(row_entries_at(position))),
            ranges=[], reduction_ranges=check_ranges, reduction_type="any")
        flag.realize()  # a reduction is read through its buffer
        return flag

    greatest = ir.Reduction.create(
        device=device, dst_dtype=torch.int32, src_dtype=torch.int32,
        inner_fn=lambda _, position: row_test.one_if_out_of_bounds(row_entries_at(position)),
        ranges=[], reduction_ranges=check_ranges, reduction_type="max")
    greatest.realize()
    load_greatest = greatest.make_loader()
    return ir.Pointwise.create(
        device=device, dtype=torch.bool,
        inner_fn=lambda scalar: ops.gt(load_greatest(scalar), ops.constant(0, torch.int32)), ranges=[])


def _gather_nd_lowering(lowering):
    """masked::gather_nd as Inductor's own loop, and the op's call where it
    declines.

    The gather is a pointwise node that reads each index row and loads its
    row of params; Inductor fuses it into the loop of what reads its result,
    and what computes params into it (only the rows read). A row out of
    bounds loads params' first row instead, so its loads skip Inductor's
    own wrap of negative indices and its bounds assert (which would raise a
    RuntimeError naming neither the op nor the row), and its loop does less
    than native ``x[idx]``'s. With check_bounds, whether a row is out of
    bounds is a reduction over the same rows (for elements the greatest of
    1 for a row out of bounds, 0 for one within; for slices whether any
    row is), which Inductor computes in the same loop where the reader
    reduces over them too (a sum over the gathered rows; for slices on the
    CPU, over every gathered element: _checks_in_the_readers_loop), else in
    a pass of its own; then
    masked::check_gather_nd_indices raises gather_nd's IndexError if so
    (once that loop has run, as Inductor's own asserts raise from inside
    theirs; Inductor's Python wrapper calls it only then:
    _call_check_if_out_of_bounds). Without check_bounds, rows out of bounds
    read as zeros, as in our kernel (the loop zeroes them with check_bounds
    too, but for slices whose check shares the reader's loop).

    It declines (our kernel) for K = 0 or a K known only at run time, a
    dtype outside FUSED_DTYPES, and params with an indexed size that may be
    0 (no row to load in place of a bad one): _first_element_stands_in; and
    on the CPU for large params whose slices our kernel gathers in passes:
    _gathers_faster_in_passes."""
    from torch._inductor import ir
    from torch._inductor.virtualized import ops

    call_ours = _call_of_ours_checking_indices(lowering, torch.ops.masked.gather_nd.default,
                                               lambda params, indices: (indices, params.get_size()))
    raise_if_out_of_bounds = lowering.fallback_handler(
        torch.ops.masked.check_gather_nd_indices.default, add_to_fallback_set=False
    )

    def lower(params, indices, *, check_bounds=True):
        index_shape, params_shape = list(indices.get_size()), list(params.get_size())
        if _opaque or params.get_dtype() not in FUSED_DTYPES or not _first_element_stands_in(indices, params_shape):
            return call_ours(params, indices, check_bounds=check_bounds)
        depth = int(index_shape[-1])
        if _gathers_faster_in_passes(params, depth):
            return call_ours(params, indices, check_bounds=check_bounds)
        rows, sizes, rest = index_shape[:-1], params_shape[:depth], params_shape[depth:]
        load_index, load_params = indices.make_loader(), params.make_loader()
        dtype = params.get_dtype()

        # The gather's row test, and the check's, with the ranges the check
        # reduces over (the rows, or every gathered element).
        row_test = _UNSIGNED_ROW_TEST if _keeps_loop_scalar(indices, rows, sizes, rest) else _SIGNED_ROW_TEST
        checked_row_test, check_ranges = row_test, rows
        checks_in_the_readers_loop = _checks_in_the_readers_loop(indices, rest)
        if checks_in_the_readers_loop:
            check_ranges = [*rows, *rest]
        elif _checks_in_a_scalar_pass(indices, rest):
            checked_row_test = _UNSIGNED_ROW_TEST
        # A row out of bounds is zeroed, with check_bounds too, where the
        # IndexError follows: in Inductor's vectorised C++ the select makes
        # the reload of gathered elements a masked load, and the loop 2.3x
        # faster on an AVX-512 CPU; but not the slices whose check shares
        # the reader's loop, where the select is only work
        # (benchmarks/METHODS.md).
        zeroes_rows_out_of_bounds = not (check_bounds and checks_in_the_readers_loop)

        def gathered(position):
            row, within = position[: len(rows)], position[len(rows) :]
            row_entries = _index_entries(load_index, row, sizes)
            # A row out of bounds reads params' first row instead (there is
            # one: see the declines above).
            in_bounds = row_test.in_bounds(row_entries)
            value = load_params([*row_test.positions(row_entries, in_bounds), *within])
            return ops.where(in_bounds, value, ops.constant(0, dtype)) if zeroes_rows_out_of_bounds else value

        if check_bounds and not any(size == 0 for size in rows):  # no rows: none out of bounds
            raise_if_out_of_bounds(indices, params_shape, _any_row_out_of_bounds(
                indices.get_device(), lambda position: _index_entries(load_index, position[: len(rows)], sizes),
                checked_row_test, check_ranges, bool(rest)))
        return ir.Pointwise.create(
            device=params.get_device(), dtype=dtype, inner_fn=gathered, ranges=[*rows, *rest]
        )

    return lower


# The dtypes whose sums Triton's atomic adds make as our kernel does: not
# float16 and bfloat16, which they round at every add (a bfloat16 sum of ones
# stops at 256), where our CUDA kernel rounds once; not int64 and bool, which
# Inductor does not add atomically.
_TRITON_ATOMIC_ADD_DTYPES = frozenset([torch.float32, torch.float64, torch.int32])


def _adds_in_inductor(device, dtype, indices, sizes, check_bounds):
    """Whether a scatter of `dtype` updates at `indices` into a tensor of
    shape `sizes` is Inductor's own atomic scatter rather than our kernel:
    where Inductor generates Triton (CUDA), without check_bounds, outside
    deterministic mode (our deterministic sums; Inductor's would call
    ATen's), and with _first_element_stands_in: Inductor's copy of a tensor
    into the buffer that _scatter_added makes divides by the indexed sizes'
    product, in lanes masked off too, where a size of 0 would divide by
    zero."""
    from torch._inductor import config

    backend = {"cuda": getattr(config, "cuda_backend", "triton"), "cpu": config.cpu_backend}.get(device.type)
    return (
        not _opaque
        and not check_bounds
        and backend == "triton"
        and not torch.are_deterministic_algorithms_enabled()
        and dtype in _TRITON_ATOMIC_ADD_DTYPES
        and _first_element_stands_in(indices, sizes)
    )


def _scatter_added(lowering, base, indices, updates):
    """`base` with each row of `updates` added at its index row by
    Inductor's own atomic adds, fused with what computes the updates, in a
    new buffer. The buffer holds one slice more than the result shows, and
    a row out of bounds adds into it: dropped, as our kernel drops it
    without check_bounds. Added into an element of the result instead, even
    an identity would change one: on an H100, an atomic add of -0.0 into
    -0.0 left +0.0."""
    from torch._inductor import ir
    from torch._inductor.virtualized import V, ops

    shape = list(base.get_size())
    depth = int(indices.get_size()[-1])
    rows, sizes, rest = list(indices.get_size())[:-1], shape[:depth], shape[depth:]
    slices = sympy.Mul(*sizes)  # the slices the index rows address, one after another
    padded = lowering.constant_pad_nd(lowering.view(base, [slices, *rest]), [0, 0] * len(rest) + [0, 1])
    padded.realize()
    load_index = indices.make_loader()

    def destination(position):
        row_entries = _index_entries(load_index, position[: len(rows)], sizes)
        slice_number = row_entries[0][0]
        for entry, size in row_entries[1:]:
            slice_number = ops.add(ops.mul(slice_number, ops.index_expr(size, torch.int64)), entry)
        spare = ops.index_expr(slices, torch.int64)
        slice_or_spare = ops.where(_in_bounds(row_entries), slice_number, spare)
        return [ops.indirect_indexing(slice_or_spare, slices + 1, check=False, wrap_neg=False),
                *position[len(rows) :]]

    scatter = ir.Scatter(device=updates.get_device(), dtype=base.get_dtype(), inner_fn=updates.make_loader(),
                         ranges=list(updates.get_size()), output_indexer=destination, scatter_mode="atomic_add")
    buffer = ir.ComputedBuffer(name=None, layout=ir.MutationLayoutSHOULDREMOVE(padded), data=scatter)
    buffer.name = V.graph.register_buffer(buffer)
    V.graph.register_operation(buffer)
    return lowering.view(lowering.slice_(padded, 0, 0, slices), shape)


def _scatter_nd_lowering(lowering):
    """masked::scatter_nd as zeros and Inductor's own scatter where
    _adds_in_inductor says so; else our kernel."""
    call_ours = _call_of_ours_checking_indices(lowering, torch.ops.masked.scatter_nd.default,
                                               lambda indices, updates, shape: (indices, shape))

    def lower(indices, updates, shape, *, check_bounds=True):
        if not _adds_in_inductor(updates.get_device(), updates.get_dtype(), indices, list(shape), check_bounds):
            return call_ours(indices, updates, shape, check_bounds=check_bounds)
        zeros = lowering.full(list(shape), 0, dtype=updates.get_dtype(), device=updates.get_device())
        return _scatter_added(lowering, zeros, indices, updates)

    return lower


def _tensor_scatter_nd_add_lowering(lowering):
    """masked::tensor_scatter_nd_add as a copy of `tensor` and Inductor's own
    scatter into it where _adds_in_inductor says so; else our kernel."""
    call_ours = _call_of_ours_checking_indices(lowering, torch.ops.masked.tensor_scatter_nd_add.default,
                                               lambda tensor, indices, updates: (indices, tensor.get_size()))

    def lower(tensor, indices, updates, *, check_bounds=True):
        if not _adds_in_inductor(tensor.get_device(), tensor.get_dtype(), indices, list(tensor.get_size()),
                                 check_bounds):
            return call_ours(tensor, indices, updates, check_bounds=check_bounds)
        return _scatter_added(lowering, tensor, indices, updates)

    return lower


def _tensor_scatter_nd_add_into(tensor, indices, updates, *, check_bounds=True):
    """tensor_scatter_nd_add's sums written into `tensor` itself
    (masked::tensor_scatter_nd_add_), which is then the result.

    Inductor's reinplacing pass puts this in place of a tensor_scatter_nd_add
    whose `tensor` is made in the graph and read by nothing after it (the
    ``t * 2`` of ``tensor_scatter_nd_add(t * 2, idx, u)``), as it does for
    ``index_put``: the op then neither copies `tensor` nor allocates an
    output. A function rather than the op itself: the pass only renames the
    node's target and keeps its uses, so the target must return the tensor,
    and Inductor makes no call of a custom op that returns an input."""
    torch.ops.masked.tensor_scatter_nd_add_(tensor, indices, updates, check_bounds=check_bounds)
    return tensor


# Up to this many bytes, a CPU tensor is added into in place. Measured in
# tensor_scatter_nd_add(t * 2, idx, u) + 1 (benchmarks/METHODS.md): in place
# is faster up to 8 MiB of float32, slower from 11 MiB, where each call's
# buffers are faulted in afresh, and our own output, which asks for huge
# pages, costs less in faults than the buffer Inductor allocates for the
# `+ 1` (it never reuses a buffer written in place). Past it, a result read
# only by a reduction over all of it (_reduced_whole), which allocates no
# such buffer, is still added into in place: the copy is then only work
# (the summed chain's training step at 1e7, 0.89-0.95 of native's where the
# copy made it 0.97-1.38), whatever its size. Other sizes known only at run
# time keep the copy on the CPU.
IN_PLACE_CPU_BYTES = 8 * 2**20


def _adds_in_place(node):
    """Whether the reinplacing pass may put _tensor_scatter_nd_add_into in
    place of this tensor_scatter_nd_add node."""
    from torch._inductor.fx_utils import get_node_storage

    if _opaque:
        return False
    # The in-place op refuses updates or indices in tensor's memory (they
    # would be read after being added into): tensor_scatter_nd_add(t, i, t).
    tensor_node, indices_node, updates_node = node.args[:3]
    if get_node_storage(tensor_node) in (get_node_storage(indices_node), get_node_storage(updates_node)):
        return False
    tensor = tensor_node.meta["val"]
    # Laid out otherwise (a slice with a step), the in-place op would sum into
    # a new output and copy it in anyway, and the result would keep that
    # layout, where eager's is contiguous.
    if not statically_known_true(tensor.is_contiguous()):
        return False
    if tensor.device.type != "cpu":
        return True
    return statically_known_true(tensor.numel() * tensor.element_size() <= IN_PLACE_CPU_BYTES) or _reduced_whole(node)


def _tensor_scatter_nd_add_into_lowering(lowering):
    """_tensor_scatter_nd_add_into as a call of the in-place op that Inductor
    records as writing `tensor`'s buffer: what reads the result reads it
    after the call."""
    add_in_place = lowering.fallback_handler(torch.ops.masked.tensor_scatter_nd_add_.default,
                                             add_to_fallback_set=False)

    def lower(tensor, indices, updates, *, check_bounds=True):
        # Inductor's scatter adds into a buffer of its own (_scatter_added).
        if _adds_in_inductor(tensor.get_device(), tensor.get_dtype(), indices, list(tensor.get_size()), check_bounds):
            return _scatter_added(lowering, tensor, indices, updates)
        add_in_place(tensor, indices, updates, check_bounds=check_bounds)
        return tensor

    return lower


_CHECK_GATHER_ND_INDICES = "torch.ops.masked.check_gather_nd_indices.default"


def _call_check_if_out_of_bounds(node, writeline):
    """The bounds check's call in Inductor's Python wrapper, made only where
    the fused loop found a row out of bounds. Made every time, the call
    cost 11-14 µs a chain at 1e6 to return at once (the dispatcher's path,
    which the loop has just pushed out of the caches; benchmarks/METHODS.md),
    the flag's ``.item()`` 0.2. Inductor's C++ wrapper (``cpp_wrapper``,
    AOTInductor) makes the call every time."""
    indices, params_shape, out_of_bounds = node.codegen_args()
    writeline(f"if {out_of_bounds}.item(): {_CHECK_GATHER_ND_INDICES}({indices}, {params_shape}, {out_of_bounds})")


DECOMPOSITIONS = {
    torch.ops.masked.where.self: _where,
    torch.ops.masked.where.ScalarSelf: _where,
    torch.ops.masked.where.ScalarOther: _where,
    torch.ops.masked.select.default: _select,
}

# Loaded by the first torch.compile that uses Inductor, after its table.
_INDUCTOR_LOWERING = "torch._inductor.lowering"


def _register(lowering):
    from torch._inductor import decomposition
    from torch._inductor.codegen.custom_extern_kernel_codegen import CUSTOM_EXTERN_KERNEL_CODEGEN, CustomCodegen
    from torch._inductor.fx_passes import reinplace

    for op, decompose in DECOMPOSITIONS.items():
        decomposition.register_decomposition(op)(decompose)
        # Where a decomposition declines, the op is lowered as a call of our
        # kernel, as Inductor lowers any op it has no lowering for; but it
        # does so on its own only for ops without a decomposition.
        layout = lowering.tag_to_layout_constraint(get_layout_constraint_tag(op, with_default=True))
        lowering.make_fallback(op, layout_constraint=layout, warn=False, override_decomp=True)
    # The number overloads' fallbacks, as calls of ours that a result with no
    # elements keeps checked (make_fallback's realized inputs and layout
    # constraint kept).
    for op, number_is_x in ((torch.ops.masked.where.ScalarSelf, True), (torch.ops.masked.where.ScalarOther, False)):
        lowering.register_lowering(op, type_promotion_kind=None)(
            _call_of_ours(lowering, op, torch.ops.masked.check_where_number.default, _where_number_check(number_is_x))
        )
    for op in _BOOL_ARGUMENTS:
        lowering.register_lowering(op, type_promotion_kind=None)(_call_of_ours_on_bools(lowering, op))
    lowering.register_lowering(torch.ops.masked.gather_nd.default, type_promotion_kind=None)(
        _gather_nd_lowering(lowering)
    )
    lowering.register_lowering(torch.ops.masked.scatter_nd.default, type_promotion_kind=None)(
        _scatter_nd_lowering(lowering)
    )
    lowering.register_lowering(torch.ops.masked.tensor_scatter_nd_add.default, type_promotion_kind=None)(
        _tensor_scatter_nd_add_lowering(lowering)
    )
    lowering.register_lowering(_tensor_scatter_nd_add_into, type_promotion_kind=None)(
        _tensor_scatter_nd_add_into_lowering(lowering)
    )
    reinplace.inplaceable_ops[torch.ops.masked.tensor_scatter_nd_add.default] = reinplace.InplaceableOp(
        _tensor_scatter_nd_add_into, 0, extra_check=_adds_in_place
    )
    CUSTOM_EXTERN_KERNEL_CODEGEN[_CHECK_GATHER_ND_INDICES] = CustomCodegen(python=_call_check_if_out_of_bounds)
    # select_decomp_table() hands out a cached copy of the table.
    decomposition.fast_random_decomps.cache_clear()


# It returns nothing and only raises: without this, Inductor would drop its
# call as unused.
torch.fx.node.has_side_effect(torch.ops.masked.check_gather_nd_indices.default)
_update_cache_tag()
# Registered when Inductor's lowerings are first imported (by the first
# torch.compile that uses Inductor): importing Inductor from torch_masked
# would double its import time (1.4 s more here).
when_imported(_INDUCTOR_LOWERING, _register)
