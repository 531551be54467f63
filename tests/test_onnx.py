"""ONNX export (torch_masked.onnx): every op and mode exported once with a
dynamic leading dimension, run in onnxruntime on inputs of other sizes than
the export's, and compared with eager; and the cases ONNX cannot express,
refused at export time. Each export takes seconds, so one module holds the
modes of an op family."""

import warnings

import pytest
import torch

import torch_masked as tm

pytest.importorskip("onnx")
pytest.importorskip("onnxscript")
ort = pytest.importorskip("onnxruntime")
import torch_masked.onnx as masked_onnx  # noqa: E402

pytestmark = pytest.mark.deployment

N = torch.export.Dim("n", min=0)


def export(module, args, dynamic_shapes=None, **kwargs):
    with warnings.catch_warnings():
        # The exporter's notes (training mode, unused axis names) are not ours.
        warnings.simplefilter("ignore")
        return masked_onnx.export(module.eval(), args, dynamic_shapes=dynamic_shapes, verbose=False, **kwargs)


def masked_ops(program):
    """The masked:: ops the exported program kept (none decomposed away)."""
    return {str(node.target) for node in program.exported_program.graph.nodes
            if str(node.target).startswith("masked.")}


def run_onnx(program, args, threads=0):
    """The model's outputs for args, in onnxruntime on `threads` intra-op
    threads (0: its default)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(program.model_proto.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, (a.numpy() for a in args))))


def flatten(outputs):
    flat = []
    for output in outputs:
        flat += list(output) if isinstance(output, (tuple, list)) else [output]
    return flat


def check_roundtrip(module, export_args, dynamic_shapes, run_args_list, expected_ops):
    program = export(module, export_args, dynamic_shapes)
    assert masked_ops(program) == expected_ops
    for args in run_args_list:
        expected = flatten(module(*args))
        actual = run_onnx(program, args)
        assert len(actual) == len(expected)
        for got, want in zip(actual, expected):
            got = torch.from_numpy(got)
            assert got.dtype == want.dtype and got.shape == want.shape, (got, want)
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


class Nonzeros(torch.nn.Module):
    def forward(self, x, b, s, i):
        return (tm.nonzero(x), tm.nonzero(x, as_tuple=True), tm.nonzero_static(x, size=4, fill_value=-7),
                tm.where(b), tm.nonzero(s), tm.nonzero(s, as_tuple=True), tm.nonzero(i),
                # Types onnxruntime's NonZero lacks.
                tm.nonzero(x.double()), tm.nonzero(i.to(torch.int8)))


def test_nonzero_modes():
    def inputs(n, scalar):
        x = torch.tensor([[0.0, -0.0, 2.0], [float("nan"), 0.0, 1.0]]).repeat(n, 1)[:n]
        b = torch.arange(n) % 3 == 1
        i = (torch.arange(n * 6, dtype=torch.int32).reshape(n, 2, 3) % 4)
        return x, b, torch.tensor(scalar), i

    check_roundtrip(Nonzeros(), inputs(5, 3.0), ({0: N}, {0: N}, None, {0: N}),
                    [inputs(7, 0.0), inputs(1, 2.0), inputs(0, 1.0), inputs(9, 0.0)],
                    {"masked.nonzero.default", "masked.nonzero_tuple.default",
                     "masked.nonzero_static.default", "masked.where.default"})


class Selects(torch.nn.Module):
    def forward(self, c, row, scalar, x, y, xi):
        return (tm.where(c, x, y), tm.where(c[:1], x, 2), tm.where(c, 0.5, xi), tm.where(c, xi, 3),
                tm.where(c, x, True), tm.where(c, xi.to(torch.int8), -100),
                tm.select(scalar, x, y), tm.select(c, x, xi), tm.select(row, x, y), tm.select(row, xi, x),
                # A 0-d float64 beside a float32 tensor with dimensions: float32.
                tm.where(c, x, y[0, 0]),
                # Result types onnxruntime's Where lacks: bool, int16, bfloat16.
                tm.where(c, c, row[:, None]), tm.select(c, xi.to(torch.int8), xi.to(torch.uint8)),
                tm.where(c, x.to(torch.bfloat16), -1).float(),
                # Numbers known only at run time promote as numbers: int32 beside a 0-d
                # int32, float16 beside a 0-d float16; and are not frozen at export.
                tm.where(row[:1], xi[0, 0], x.shape[0]), tm.where(c[0], x.shape[0] * 0.5, x[0, 0].half()),
                tm.where(c, x.shape[0] * 0.5, x), torch.ops.masked.where.ScalarOther(row[:1], xi[0, 0], x.shape[0]),
                torch.ops.masked.where.ScalarSelf(c[0], x.shape[0] * 0.5, x[0, 0].half()))


def test_where_and_select_modes():
    def inputs(n):
        g = torch.Generator().manual_seed(n)
        c = torch.rand(n, 3, generator=g) > 0.5
        return (c, torch.rand(n, generator=g) > 0.5, torch.tensor(n % 2 == 1), torch.randn(n, 3, generator=g),
                torch.randn(n, 3, dtype=torch.float64, generator=g), torch.randint(-50, 50, (n, 3), dtype=torch.int32))

    # Bounded so that int32 holds x.shape[0] (else refused: test_runtime_integer_too_wide_refused).
    n = torch.export.Dim("n", min=0, max=2**31 - 1)
    check_roundtrip(Selects(), inputs(4), ({0: n},) * 2 + (None,) + ({0: n},) * 3, [inputs(6), inputs(3), inputs(2)],
                    {"masked.where.self", "masked.where.ScalarSelf", "masked.where.ScalarOther", "masked.select.default"})


class BooleanMasks(torch.nn.Module):
    def forward(self, t, rows, plane, last, leading, ints):
        return (tm.boolean_mask(t, rows), tm.boolean_mask(t, plane, axis=1), tm.boolean_mask(t, last, axis=-1),
                tm.boolean_mask(t, leading), tm.boolean_mask(ints, plane, axis=-2), tm.boolean_mask(rows, rows),
                # ONNX's Compress takes no bfloat16 (numpy has none either: compared as float).
                tm.boolean_mask(t.bfloat16(), rows).float(), tm.boolean_mask(t.bfloat16(), plane, axis=1).float())


def test_boolean_mask_axes_and_ranks():
    def inputs(n):
        g = torch.Generator().manual_seed(n)
        t = torch.randn(n, 4, 5, generator=g)
        return (t, torch.rand(n, generator=g) > 0.5, torch.rand(4, 5, generator=g) > 0.5,
                torch.rand(5, generator=g) > 0.3, torch.rand(n, 4, generator=g) > 0.5,
                torch.randint(0, 9, (n, 4, 5), generator=g))

    check_roundtrip(BooleanMasks(), inputs(3), ({0: N}, {0: N}, None, None, {0: N}, {0: N}),
                    [inputs(5), inputs(2), inputs(0)], {"masked.boolean_mask.default"})


class Scatters(torch.nn.Module):
    def forward(self, idx, idx32, values, slices, base, flags, whole, one):
        ints = (values * 10).to(torch.int64)
        return (tm.scatter_nd(idx, values, [4, 3]), tm.scatter_nd(idx, values.half(), [4, 3]),
                # numpy has no bfloat16: compared as float.
                tm.tensor_scatter_nd_add(base.bfloat16(), idx32, slices.bfloat16()).float(),
                tm.scatter_nd(idx, values.bfloat16(), [4, 3]).float(), tm.gather_nd(base.bfloat16(), idx).float(),
                tm.scatter_nd(idx32, slices, [4, 3]),
                tm.tensor_scatter_nd_add(base, idx, values), tm.tensor_scatter_nd_add(base, idx32, slices),
                tm.scatter_nd(idx, ints, [4, 3]), tm.gather_nd(base, idx), tm.gather_nd(base, idx32),
                tm.scatter_nd(idx, flags, [4, 3]), tm.tensor_scatter_nd_add(base > 0, idx, flags),
                # K == 0: whole-tensor updates; rank-1 indices: one index.
                tm.scatter_nd(idx[:, :0], whole, [4, 3]), tm.gather_nd(base, idx[:, :0]),
                tm.tensor_scatter_nd_add(base, one, base[0, 0]), tm.gather_nd(base, one),
                tm.scatter_nd(one[:0], base, [4, 3]),
                # K == 0 rows summed in a type ONNX's ReduceSum lacks (wrapping).
                tm.scatter_nd(idx[:, :0], (whole * 60).to(torch.int8), [4, 3]),
                tm.tensor_scatter_nd_add(base.to(torch.uint8), idx[:, :0], (whole * 90).to(torch.uint8)),
                tm.tensor_scatter_nd_add(base.to(torch.int16), idx[:, :0], (whole * 9000).to(torch.int16)),
                # bfloat16 expanded to a size known only at run time.
                tm.gather_nd(base.bfloat16(), idx[:, :0]).float(),
                tm.scatter_nd(idx32, slices.bfloat16(), [idx.shape[0] + 4, 3]).float())


def test_scatter_gather_with_duplicates():
    def inputs(n):
        g = torch.Generator().manual_seed(n)
        # Few slots for many rows: duplicates in every run.
        idx = torch.stack([torch.randint(0, 4, (n,), generator=g), torch.randint(0, 3, (n,), generator=g)], 1)
        idx32 = torch.randint(0, 4, (n, 1), generator=g, dtype=torch.int32)
        return (idx, idx32, torch.randn(n, generator=g), torch.randn(n, 3, generator=g), torch.randn(4, 3, generator=g),
                torch.rand(n, generator=g) > 0.7, torch.randn(n, 4, 3, generator=g), torch.tensor([2, 1]))

    check_roundtrip(Scatters(), inputs(5), ({0: N},) * 4 + (None,) + ({0: N},) * 2 + (None,),
                    [inputs(9), inputs(2), inputs(0)],
                    {"masked.scatter_nd.default", "masked.tensor_scatter_nd_add.default", "masked.gather_nd.default"})


class ScattersOfAMegabyte(torch.nn.Module):
    def forward(self, rows, slices, pairs, ones, base):
        return tm.scatter_nd(rows, slices, [3, 1024]), tm.tensor_scatter_nd_add(base, pairs, ones)


def test_duplicates_add_up_in_onnxruntime_threads():
    """Scatters of a megabyte or more, with duplicate rows, in an onnxruntime
    session of 2 threads: its ScatterND with reduction="add" splits the rows
    between threads there and loses sums (every run wrong, onnxruntime
    1.32); the export must add every duplicate, run after run."""
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(0, 3, (300, 1), generator=g)
    slices = torch.randint(-3, 4, (300, 1024), generator=g).float()
    pairs = torch.randint(0, 4, (500_000, 2), generator=g)
    ones = torch.ones(500_000)
    base = torch.randn(4, 4, generator=g)
    module, args = ScattersOfAMegabyte(), (rows, slices, pairs, ones, base)
    program = export(module, args)
    expected = module(*args)
    for _ in range(5):
        for got, want in zip(run_onnx(program, args, threads=2), expected):
            torch.testing.assert_close(torch.from_numpy(got), want, rtol=0, atol=1e-4)


class Scatter(torch.nn.Module):
    def forward(self, idx, values):
        return tm.scatter_nd(idx, values, [6])


class ScatterIntoPlane(torch.nn.Module):
    def forward(self, idx, values):
        return tm.scatter_nd(idx, values, [4, 3])


def test_opset_below_16_refused_for_scatter():
    """ScatterElements adds duplicates (reduction="add") from opset 16: older
    opsets are refused, not exported as a scatter that overwrites."""
    idx, values = torch.tensor([[1], [1]]), torch.tensor([1.0, 2.0])
    with pytest.raises(ValueError, match=r"masked::scatter_nd cannot be exported to ONNX opset 15.*reduction='add'"):
        export(Scatter(), (idx, values), opset_version=15)
    program = export(Scatter(), (idx, values), opset_version=16)
    assert program.model.opset_imports[""] == 16
    torch.testing.assert_close(torch.from_numpy(run_onnx(program, (idx, values))[0]), tm.scatter_nd(idx, values, [6]))


class BooleanMaskOfPlanes(torch.nn.Module):
    def forward(self, t, plane):
        return tm.boolean_mask(t, plane, axis=1)


@pytest.mark.parametrize("opset", [16, 17])
def test_boolean_mask_of_a_2d_mask_at_older_opsets(opset):
    t, plane = torch.randn(2, 4, 5), torch.rand(4, 5) > 0.5
    program = export(BooleanMaskOfPlanes(), (t, plane), opset_version=opset)
    assert program.model.opset_imports[""] == opset
    torch.testing.assert_close(torch.from_numpy(run_onnx(program, (t, plane))[0]), t[:, plane])


class NonzeroStaticOfInputSize(torch.nn.Module):
    def forward(self, x):
        return tm.nonzero_static(x, size=x.shape[0])


def test_nonzero_static_size_unknown_at_export_refused():
    with pytest.raises(Exception, match=r"masked::nonzero_static cannot be exported to ONNX: size must be a number"):
        export(NonzeroStaticOfInputSize(), (torch.ones(3),), ({0: N},))


class WhereNumber(torch.nn.Module):
    def forward(self, c, x):
        return tm.where(c, x, 1j)


class WhereComplex(torch.nn.Module):
    def forward(self, c, x):
        return tm.where(c, x, x)


def test_complex_refused():
    c = torch.tensor([True, False])
    with pytest.raises(Exception, match=r"masked::where cannot be exported to ONNX: the number 1j is complex"):
        export(WhereNumber(), (c, torch.ones(2)))
    with pytest.raises(Exception, match=r"masked.where.*self[\s\S]*complex-valued"):
        export(WhereComplex(), (c, torch.ones(2, dtype=torch.complex64)))


class Gather(torch.nn.Module):
    def forward(self, params, idx):
        return tm.gather_nd(params, idx)


def test_out_of_range_indices_follow_onnx():
    """onnxruntime does what ONNX specifies, not our IndexError: a negative
    index counts from the end, one past the dimension fails the run."""
    params = torch.arange(12.0).reshape(4, 3)
    program = export(Gather(), (params, torch.tensor([[1, 2]])), ({}, {0: N}))
    assert run_onnx(program, (params, torch.tensor([[-1, 0]])))[0].tolist() == [9.0]
    with pytest.raises(Exception, match="invalid|out of"):
        run_onnx(program, (params, torch.tensor([[4, 0]])))

    program = export(Scatter(), (torch.tensor([[1], [2]]), torch.ones(2)), ({0: N}, {0: N}))
    assert run_onnx(program, (torch.tensor([[-1]]), torch.ones(1)))[0].tolist() == [0, 0, 0, 0, 0, 1]
    with pytest.raises(Exception, match="invalid|out of"):
        run_onnx(program, (torch.tensor([[6]]), torch.ones(1)))

    # Index pairs: each entry against its own dimension, never a position in
    # the dimensions flattened ([1, 3] is not [2, 0], nor [0, -1] [0, 2]).
    program = export(ScatterIntoPlane(), (torch.tensor([[1, 2]]), torch.ones(1)), ({0: N}, {0: N}))
    plane = run_onnx(program, (torch.tensor([[-1, 0], [0, -1], [-4, -3]]), torch.tensor([1.0, 2.0, 3.0])))[0]
    assert plane.tolist() == [[3, 0, 2], [0, 0, 0], [0, 0, 0], [1, 0, 0]]
    for pair in ([1, 3], [4, 0], [0, -4], [-5, 0]):
        with pytest.raises(Exception, match="invalid|out of"):
            run_onnx(program, (torch.tensor([[0, 0], pair]), torch.ones(2)))


class Unchecked(torch.nn.Module):
    def forward(self, idx, idx32, values, slices, base, flags, table, one):
        unchecked = {"check_bounds": False}
        return (tm.gather_nd(base, idx, **unchecked), tm.gather_nd(base, idx32, **unchecked),
                tm.gather_nd(base > 0, idx, **unchecked), tm.gather_nd(base.to(torch.int16), idx, **unchecked),
                tm.gather_nd(base.bfloat16(), idx32, **unchecked).float(), tm.gather_nd(base, one, **unchecked),
                tm.scatter_nd(idx, values, [4, 3], **unchecked), tm.scatter_nd(idx32, slices, [4, 3], **unchecked),
                tm.scatter_nd(idx, flags, [4, 3], **unchecked), tm.scatter_nd(one, base[0, 0], [4, 3], **unchecked),
                tm.tensor_scatter_nd_add(base, idx, values, **unchecked),
                tm.tensor_scatter_nd_add(base.half(), idx32, slices.half(), **unchecked),
                tm.tensor_scatter_nd_add(base > 0, idx, flags, **unchecked),
                # A table whose rows may number 0 at run time: every index row out of bounds.
                tm.gather_nd(table, idx32, **unchecked), tm.gather_nd(table, idx, **unchecked),
                tm.tensor_scatter_nd_add(table, idx32, slices, **unchecked))


def test_unchecked_bounds_as_eager():
    """check_bounds=False: an index row out of bounds (a negative index
    included, not counted from the end) reads zeros and scatters nothing,
    where GatherND would wrap it or fail and the scatter's row position would
    name another row."""
    def inputs(n, rows, one):
        g = torch.Generator().manual_seed(n)
        idx = torch.stack([torch.randint(-2, 6, (n,), generator=g), torch.randint(-1, 4, (n,), generator=g)], 1)
        idx32 = torch.randint(-2, 6, (n, 1), generator=g, dtype=torch.int32)
        return (idx, idx32, torch.randn(n, generator=g), torch.randn(n, 3, generator=g), torch.randn(4, 3, generator=g),
                torch.rand(n, generator=g) > 0.5, torch.randn(rows, 3, generator=g), torch.tensor(one))

    rows = torch.export.Dim("rows", min=0)
    check_roundtrip(Unchecked(), inputs(5, 3, [2, 1]), ({0: N},) * 4 + (None, {0: N}, {0: rows}, None),
                    [inputs(40, 5, [-1, 1]), inputs(9, 0, [4, 0]), inputs(0, 2, [3, 2]), inputs(30, 1, [0, -3])],
                    {"masked.gather_nd.default", "masked.scatter_nd.default", "masked.tensor_scatter_nd_add.default"})


class WhereBigNumbers(torch.nn.Module):
    def forward(self, c, x, i):
        return (tm.where(c, x, 2**63), tm.where(c, 2**64 - 1, x), tm.where(c, i, -128),
                tm.where(c, 255, i.to(torch.uint8)))


class WhereNumberTooWide(torch.nn.Module):
    def forward(self, c, i):
        return tm.where(c, i, 200)


def test_numbers_convert_as_in_eager():
    """A number converts to the result dtype as eager converts it: one past
    int64 into float32, and one the dtype cannot hold refused, as eager
    refuses it."""
    def inputs(n):
        g = torch.Generator().manual_seed(n)
        return (torch.rand(n, generator=g) > 0.5, torch.randn(n, generator=g),
                torch.randint(-9, 9, (n,), dtype=torch.int8, generator=g))

    check_roundtrip(WhereBigNumbers(), inputs(4), ({0: N},) * 3, [inputs(7), inputs(0)],
                    {"masked.where.ScalarSelf", "masked.where.ScalarOther"})
    c, _, i = inputs(2)
    with pytest.raises(RuntimeError, match="without overflow"):
        WhereNumberTooWide()(c, i)
    with pytest.raises(Exception, match=r"masked::where cannot be exported to ONNX: y=200: .*without overflow"):
        export(WhereNumberTooWide(), (c, i))


class WhereRowCount(torch.nn.Module):
    def forward(self, c, i):
        return (tm.where(c, i, i.shape[0]), tm.select(c[0], i.shape[0] - 1, i[0]),
                torch.ops.masked.where.ScalarOther(c, i, i.shape[0]))


def test_runtime_integer_too_wide_refused():
    """An integer known only at run time is refused where its range may not
    fit the result dtype (eager raises past it, ONNX's Cast would wrap), and
    exported where it does."""
    c, i = torch.tensor([True, False, True]), torch.tensor([1, -2, 3], dtype=torch.int8)
    with pytest.raises(ValueError, match=r"masked::where cannot be exported to ONNX: y, an integer known only at "
                                         r"run time \(from 0 to int_oo\), is converted to torch.int8"):
        export(WhereRowCount(), (c, i), ({0: N}, {0: N}))
    with pytest.raises(RuntimeError, match="without overflow"):
        WhereRowCount()(c.repeat(50), i.repeat(50))  # 150 rows

    n = torch.export.Dim("n", min=0, max=127)
    check_roundtrip(WhereRowCount(), (c, i), ({0: n}, {0: n}), [(c.repeat(42), i.repeat(42)), (c[:1], i[:1])],
                    {"masked.where.self", "masked.select.default", "masked.where.ScalarOther"})
