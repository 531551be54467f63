"""masked::where (index mode), masked::where.self and masked::select against
torch.nonzero, torch.where, hand-worked row selections and the examples of
the tf.where and Select (Where3) reference pages."""
import decimal
import fractions
import functools
import re

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters
from torch._library import simple_registry

import torch_masked
from tests.common import (
    ALL_DTYPES,
    DEVICES,
    LARGE_SIZES,
    OTHER_DEVICES,
    assert_forward_ad_matches,
    device_name,
    draw,
    make_tensor,
    misaligned,
    non_contiguous,
    random_layout,
    random_shape,
    repeated,
)

# where(condition) is a composite of masked::nonzero: its fake-tensor checks
# need nonzero's fake kernel.
NONZERO_HAS_FAKE = simple_registry.singleton.find("masked::nonzero").fake_impl.kernel is not None
needs_nonzero_fake = pytest.mark.skipif(not NONZERO_HAS_FAKE, reason="masked::nonzero has no fake kernel yet")


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def random_condition(shape, device, seed=0):
    return (torch.rand(shape, generator=gen(seed)) < 0.5).to(device)


def assert_same(actual, expected):
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


# ---------------------------------------------------------------- index mode


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 0, 2), (4, 5), (2, 3, 4)])
def test_where_index_mode_matches_nonzero(device, dtype, shape):
    condition = make_tensor(shape, dtype, device, generator=gen())
    expected = torch.nonzero(condition)
    assert_same(torch_masked.where(condition), expected)
    assert_same(torch.ops.masked.where(condition), expected)
    assert_same(torch_masked.where(non_contiguous(condition)), expected)


@pytest.mark.parametrize("device", DEVICES)
def test_where_index_mode_reference_page(device):
    def index(condition):
        return torch_masked.where(torch.tensor(condition, device=device)).cpu().tolist()

    assert index([True, False, False, True]) == [[0], [3]]
    assert index([[1, 0, 0], [1, 0, 1]]) == [[0, 0], [1, 0], [1, 2]]
    float_tensor = [[[0.1, 0], [0, 2.2], [3.5, 1e6]], [[0, 0], [0, 0], [99, 0]]]
    assert index(float_tensor) == [[0, 0, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [1, 2, 0]]
    assert index([complex(0.0), complex(1.0), 0 + 1j, 1 + 1j]) == [[1], [2], [3]]
    # A list goes through the front door as it is.
    assert torch_masked.where([True, False, True]).tolist() == [[0], [2]]


# ---------------------------------------------------------------- where.self values

BROADCASTS = [
    # (condition, x, y)
    ((5,), (5,), (5,)),
    ((), (), ()),
    ((), (2, 3), ()),
    ((2, 3), (), (2, 3)),
    ((3,), (3, 3), (3, 1)),
    ((3, 1), (3, 4), (4,)),
    ((2, 1, 3), (4, 1), (1, 3)),
    ((1,), (2, 1, 1, 3), (5, 1)),
    ((0,), (3, 1), (1,)),
    ((2, 0), (2, 1), ()),
    ((1, 4), (3, 4), (3, 4)),  # a column condition
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shapes", BROADCASTS, ids=str)
def test_where_broadcast_matches_torch(device, shapes):
    c_shape, x_shape, y_shape = shapes
    condition = random_condition(c_shape, device)
    x = make_tensor(x_shape, torch.float32, device, generator=gen(1))
    y = make_tensor(y_shape, torch.float32, device, generator=gen(2))
    expected = torch.where(condition, x, y)
    assert_same(torch_masked.where(condition, x, y), expected)
    assert torch_masked.where(condition, x, y).is_contiguous()
    assert_same(
        torch_masked.where(non_contiguous(condition), non_contiguous(x), non_contiguous(y)), expected
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_where_every_dtype(device, dtype):
    # Same shape (the flat path, also with a single-element x or y) and
    # broadcast (the strided paths), all long enough to be cut into several
    # parallel chunks, with a tail past the last 16-byte vector.
    n = 70001
    for c_shape, x_shape, y_shape in [((n,), (n,), (n,)), ((n,), (n,), ()), ((n,), (), (n,)), ((n,), (), ()),
                                      ((301, 1), (301, 257), (257,))]:
        condition = random_condition(c_shape, device)
        x = make_tensor(x_shape, dtype, device, generator=gen(1))
        y = make_tensor(y_shape, dtype, device, generator=gen(2))
        assert_same(torch_masked.where(condition, x, y), torch.where(condition, x, y))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "layout",
    ["transposed", "sliced", "expanded", "misaligned", "misaligned_with_scalar"],
)
def test_where_strided_inputs(device, layout):
    condition = random_condition((64, 48), device)
    x = torch.randn(64, 48, generator=gen(1)).to(device)
    y = torch.randn(64, 48, generator=gen(2)).to(device)
    if layout == "transposed":
        condition, x, y = condition.t(), x.t(), y.t()
    elif layout == "sliced":
        condition, x, y = condition[::2, 1::3], x[::2, 1::3], y[::2, 1::3]
    elif layout == "expanded":
        x = x[:1].expand(64, 48)
    elif layout == "misaligned":  # one element in: no vector alignment
        condition, x, y = condition.flatten()[1:], x.flatten()[1:], y.flatten()[1:]
    else:
        condition, x, y = condition.flatten()[1:], x.flatten()[1:], y[0, 0]
    assert_same(torch_masked.where(condition, x, y), torch.where(condition, x, y))


# Sizes for shapes drawn at random: empty, size-1 (broadcast) and odd axes, and
# rows long enough (64 and 301 elements) for the row-copying paths.
RANDOM_SIZES = (0, 1, 1, 2, 3, 5, 64, 301)


def broadcast_operand_shape(out_shape, g):
    """A shape that broadcasts to out_shape: a few leading axes dropped, some
    of the others set to 1."""
    kept = out_shape[draw(g, range(len(out_shape) + 1)):]
    return tuple(1 if draw(g, [True, False, False]) else size for size in kept)


@pytest.mark.parametrize("device", DEVICES)
def test_where_random_shapes_dtypes_and_layouts(device):
    """Broadcast patterns, dtype pairs and memory layouts drawn at random (the
    kernels choose vector, row or element-wise paths by them) agree with
    torch.where on the CPU."""
    g = gen(7)
    for _ in range(150):
        out_shape = random_shape(g, draw(g, range(5)), RANDOM_SIZES)
        shapes = [broadcast_operand_shape(out_shape, g) for _ in range(3)]
        x_dtype = draw(g, ALL_DTYPES)
        y_dtype = draw(g, [x_dtype, x_dtype, draw(g, ALL_DTYPES)])
        if {x_dtype, y_dtype} & {torch.float16, torch.bfloat16} and (x_dtype.is_complex or y_dtype.is_complex):
            y_dtype = x_dtype  # 0-d pairs could make the experimental complex32 types
        condition = torch.rand(shapes[0], generator=g) < 0.5
        x = make_tensor(shapes[1], x_dtype, "cpu", generator=g)
        y = make_tensor(shapes[2], y_dtype, "cpu", generator=g)
        expected = torch.where(condition, x, y)
        laid_out = [random_layout(t.to(device), g) for t in (condition, x, y)]
        assert_same(torch_masked.where(*laid_out).cpu(), expected)


PROMOTIONS = [
    (torch.float32, torch.float64),
    (torch.int32, torch.float16),
    (torch.bool, torch.int8),
    (torch.uint8, torch.int8),
    (torch.bfloat16, torch.float16),
    (torch.float64, torch.complex64),
    (torch.int64, torch.complex128),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtypes", PROMOTIONS, ids=str)
def test_where_promotes_like_torch(device, dtypes):
    condition = random_condition((4, 5), device)
    x = make_tensor((4, 5), dtypes[0], device, generator=gen(1))
    y = make_tensor((5,), dtypes[1], device, generator=gen(2))
    assert_same(torch_masked.where(condition, x, y), torch.where(condition, x, y))
    assert_same(torch_masked.where(condition, y, x), torch.where(condition, y, x))
    # A 0-d tensor does not out-promote a dimensioned one of its kind.
    zero_d = make_tensor((), dtypes[1], device, generator=gen(3))
    assert_same(torch_masked.where(condition, x, zero_d), torch.where(condition, x, zero_d))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "dtype", [torch.bool, torch.int8, torch.int64, torch.float16, torch.bfloat16, torch.float64, torch.complex64]
)
@pytest.mark.parametrize("scalar", [True, 3, -2.5, 1 + 2j])
@pytest.mark.parametrize("rank", [0, 1])
# A complex number next to float16 (bfloat16) makes complex32 (bcomplex32),
# which torch warns is experimental.
@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.filterwarnings("ignore:BComplex32 support is experimental")
def test_where_python_scalar_promotes_like_torch(device, dtype, scalar, rank):
    condition = random_condition((3,), device)
    x = make_tensor((3,) if rank else (), dtype, device, generator=gen(1))
    for args in [(condition, x, scalar), (condition, scalar, x)]:
        try:
            expected = torch.where(*args)
        except (RuntimeError, NotImplementedError):  # a dtype without kernels here (bcomplex32 on some builds)
            with pytest.raises((RuntimeError, NotImplementedError)):
                torch_masked.where(*args)
            continue
        assert_same(torch_masked.where(*args), expected)


NUMBERS = [True, 3, -2.5, 1 + 2j]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.filterwarnings("ignore:BComplex32 support is experimental")
def test_where_number_overloads_match_torch(device, dtype):
    """where.ScalarSelf / where.ScalarOther (a number as x or y, passed to the
    kernel as a value) against torch.where with the same number: contiguous
    (the vector path on CUDA), with a tail, broadcast and strided."""
    n = 70001
    layouts = [((n,), (n,)), ((n + 1,), (n + 1,)), ((301, 1), (301, 257)), ((64, 48), (48, 64))]
    for c_shape, t_shape in layouts:
        condition = random_condition(c_shape, device)
        tensor = make_tensor(t_shape, dtype, device, generator=gen(1))
        if c_shape == (n + 1,):
            condition, tensor = condition[1:], tensor[1:]  # off the 16-byte grid
        if t_shape == (48, 64):
            tensor = tensor.t()
        for number in NUMBERS:
            for op, args in [(torch.ops.masked.where.ScalarOther, (condition, tensor, number)),
                             (torch.ops.masked.where.ScalarSelf, (condition, number, tensor))]:
                try:
                    expected = torch.where(*args)
                except (RuntimeError, NotImplementedError):  # a dtype without kernels here (bcomplex32 on some builds)
                    with pytest.raises((RuntimeError, NotImplementedError)):
                        op(*args)
                    continue
                assert_same(op(*args), expected)


def test_numbers_reach_the_kernel_as_values():
    """A number beside a tensor takes where.ScalarSelf / ScalarOther, with no
    tensor made for it (on CUDA that would be a fill on the device), and the
    gradients of where.self and select select against the number 0 (no
    zeros made)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class RecordOps(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    condition = random_condition((4,), "cpu")
    x = torch.randn(4, generator=gen(1), requires_grad=True)
    y = torch.randn(4, generator=gen(2), requires_grad=True)
    plain_x, plain_y = x.detach(), y.detach()
    with RecordOps() as recorded:
        torch_masked.where(condition, plain_x, 0.0)
        torch_masked.where(condition, 2, plain_y)
    assert recorded.ops == ["masked.where.ScalarOther", "masked.where.ScalarSelf"]
    rows = random_condition((2,), "cpu")
    for out, branches in [(torch_masked.where(condition, x, y), (x, y)),
                          (torch_masked.select(rows, x.view(2, 2), y.view(2, 2)), (x, y))]:
        with RecordOps() as recorded:
            torch.autograd.grad(out, branches, torch.ones_like(out))
        assert [op for op in recorded.ops if op.startswith("masked")] == ["masked.where.ScalarOther",
                                                                          "masked.where.ScalarSelf"]
        assert not any("zeros" in op or "full" in op or "fill" in op for op in recorded.ops)


def test_the_op_packet_picks_each_where_without_printing_a_tensor(monkeypatch):
    """torch.ops.masked.where(...) tries the overloads in the order they are
    defined, and a tensor offered for a Scalar fails with its repr() in the
    message: tried before the overload that fits, that costs 0.5 ms a call on
    ten elements. Every form picks its overload with no tensor printed, and
    gives torch.where's values."""
    printed = []
    monkeypatch.setattr(torch.Tensor, "__repr__", lambda tensor, *args, **kwargs: printed.append(tensor.shape) or "")
    condition = random_condition((5,), "cpu")
    x, y = torch.randn(5, generator=gen(1)), torch.randn(5, generator=gen(2))
    for args in [(condition, x, y), (condition, x, 0.5), (condition, -2, y)]:
        assert_same(torch.ops.masked.where(*args), torch.where(*args))
    assert_same(torch.ops.masked.where(condition), torch.nonzero(condition))
    assert printed == []


def test_where_python_numbers_follow_the_default_dtype():
    condition = random_condition((3,), "cpu")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        for dtype in (torch.bool, torch.int32, torch.float32):
            x = make_tensor((3,), dtype, "cpu", generator=gen(1))
            for number in (2.5, 1 + 2j):
                assert_same(torch_masked.where(condition, x, number), torch.where(condition, x, number))
    finally:
        torch.set_default_dtype(previous)


@pytest.mark.parametrize("dtype", [torch.bool, torch.int32, torch.float16, torch.float64, torch.complex64])
@pytest.mark.parametrize("rank", [0, 1])
# A complex number makes a complex result (complex32 next to float16), which
# inductor leaves to eager kernels.
@pytest.mark.filterwarnings("ignore:Torchinductor does not support code generation for complex")
@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_where_python_numbers_compile_without_graph_breaks(dtype, rank):
    # torch.compile cannot trace torch.result_type, so the front door works the
    # number's dtype out itself; numbers written in the code and passed in.
    torch._dynamo.reset()
    literal = torch.compile(lambda c, x: (torch_masked.where(c, x, 0.5), torch_masked.where(c, 2, x)), fullgraph=True)
    passed = torch.compile(lambda c, x, number: torch_masked.where(c, x, number), fullgraph=True, dynamic=True)
    condition = random_condition((3,), "cpu")
    x = make_tensor((3,) if rank else (), dtype, "cpu", generator=gen(1))
    for actual, expected in zip(literal(condition, x), (torch.where(condition, x, 0.5), torch.where(condition, 2, x))):
        assert_same(actual, expected)
    for number in (True, 3, -2.5, 1.5, 1 + 2j):
        assert_same(passed(condition, x, number), torch.where(condition, x, number))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, number", [(torch.float32, 1e40), (torch.uint8, 300), (torch.complex64, 1e40 - 2j)],
                         ids=str)
def test_where_number_that_does_not_fit_raises_like_torch(device, dtype, number):
    condition = random_condition((3,), device)
    x = make_tensor((3,), dtype, device, generator=gen(1))
    with pytest.raises(RuntimeError, match="overflow"):
        torch.where(condition, x, number)
    # torch's error, with the argument and the number named.
    refusal = "value cannot be converted to type .* without overflow"
    shown = {1e40: r"1e\+40", 300: "300", 1e40 - 2j: r"\(1e\+40-2j\)"}[number]
    with pytest.raises(RuntimeError, match=rf"^where: cannot make a tensor of y = {shown}: {refusal}"):
        torch_masked.where(condition, x, number)
    with pytest.raises(RuntimeError, match=rf"^where: cannot make a tensor of x = {shown}: {refusal}"):
        torch_masked.where(condition, number, x)
    # NumPy's scalars, made tensors by the front door.
    scalar = {float: np.float64, int: np.int64, complex: np.complex128}[type(number)](number)
    with pytest.raises(RuntimeError, match=rf"^where: cannot make a tensor of y = {re.escape(repr(scalar))}: {refusal}"):
        torch_masked.where(condition, x, scalar)
    with pytest.raises(RuntimeError, match=rf"^select: cannot make a tensor of y = {shown}: {refusal}"):
        torch_masked.select(condition[0], x[0], number)
    # The check that compiled graphs call for a where without elements
    # (torch_masked/compile.py:_call_of_ours) raises the same.
    for name, number_is_x in (("x", True), ("y", False)):
        with pytest.raises(RuntimeError, match=rf"^where: cannot make a tensor of {name} = {shown}: {refusal}"):
            torch.ops.masked.check_where_number(condition[:0], x[:0], number, number_is_x)


@pytest.mark.parametrize("device", DEVICES)
def test_where_scalars_only(device):
    # Two numbers take torch.result_type of the pair, as in torch.where: an
    # int past int64 beside a float, or two of them (uint64), and NumPy's
    # scalars (a float64 one counts as a Python float there).
    condition = random_condition((4,), device)
    pairs = [(1, 100), (1.5, 2), (True, False), (2, 0.5j), (2**63, 0.5), (1, np.float64(2.5)),
             (np.float32(1.5), np.int64(2))]
    for x, y in pairs:
        assert_same(torch_masked.where(condition, x, y), torch.where(condition, x, y))
        assert_same(torch_masked.select(condition[0], x, y), torch.where(condition[0], x, y))
    assert torch_masked.where(condition, 1, 2).device == condition.device
    # uint64 (torch.where has no CPU kernel for it before torch 2.14).
    picked = [2**63 if c else 2**63 + 1 for c in condition.tolist()]
    assert_same(torch_masked.where(condition, 2**63, 2**63 + 1), torch.tensor(picked, dtype=torch.uint64, device=device))
    with pytest.raises(RuntimeError, match="Promotion for uint16, uint32, uint64 types is not supported"):
        torch_masked.where(condition, 2**63, 1)  # as torch.where


@pytest.mark.parametrize("dtype", [torch.bool, torch.int32, torch.float16], ids=str)
def test_where_numpy_scalar_beside_a_tensor_is_the_python_number(dtype):
    # torch.where takes a NumPy bool for a float (int32 with np.True_ gives
    # float32 there); here it is a bool, as the Python bool is.
    condition = random_condition((5,), "cpu")
    x = make_tensor((5,), dtype, "cpu", generator=gen(1))
    for number in (np.True_, np.int64(3), np.int8(-2), np.float32(2.5), np.float64(-1.5)):
        expected = torch.where(condition, x, number.item())
        assert_same(torch_masked.where(condition, x, number), expected)
        assert_same(torch_masked.where(condition.flip(0), number, x), torch.where(condition.flip(0), number.item(), x))


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_where_scalars_only_follow_the_default_dtype():
    condition = random_condition((2,), "cpu")
    previous = torch.get_default_dtype()
    try:
        for default in (torch.float16, torch.bfloat16, torch.float64):
            torch.set_default_dtype(default)
            for x, y in [(1j, 2.5), (1, 2.5), (True, 1j)]:
                assert_same(torch_masked.where(condition, x, y), torch.where(condition, x, y))
    finally:
        torch.set_default_dtype(previous)


@pytest.mark.filterwarnings("ignore:Torchinductor does not support code generation for complex")
def test_where_scalars_only_compile_without_graph_breaks():
    # Written in the code, and passed in (then known only at run time).
    torch._dynamo.reset()
    literal = torch.compile(lambda c: (torch_masked.where(c, 2, 0.5), torch_masked.where(c, 2**63, 0.5),
                                       torch_masked.select(c[0], 1, True)), fullgraph=True)
    passed = torch.compile(lambda c, x, y: torch_masked.where(c, x, y), fullgraph=True, dynamic=True)
    condition = random_condition((3,), "cpu")
    expected = (torch.where(condition, 2, 0.5), torch.where(condition, 2**63, 0.5), torch.where(condition[0], 1, True))
    for actual, wanted in zip(literal(condition), expected):
        assert_same(actual, wanted)
    for x, y in [(2, 3), (3, 0.5), (True, 4), (1.5, 2.5), (2, 1j)]:
        assert_same(passed(condition, x, y), torch.where(condition, x, y))


def test_where_reference_page_selection():
    # TensorFlow makes int32 from Python ints; we make int64, as torch.tensor does.
    def select(condition, x, y):
        return torch_masked.where(condition, x, y).tolist()

    assert select([True, False, False, True], [1, 2, 3, 4], [100, 200, 300, 400]) == [1, 200, 300, 4]
    assert select([True, False, False, True], [1, 2, 3, 4], [100]) == [1, 100, 100, 4]
    assert select([[True, False], [False, True]], [[1, 2], [3, 4]], 100) == [[1, 100], [100, 4]]
    assert select([[True, False], [False, True]], 1, 100) == [[1, 100], [100, 1]]
    assert select(True, [1, 2, 3, 4], 100) == [1, 2, 3, 4]
    assert select(False, [1, 2, 3, 4], 100) == [100, 100, 100, 100]
    x = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    y = [[100], [200], [300]]
    assert torch_masked.where([True, False, True], x=x, y=y).tolist() == [[1, 100, 3], [4, 200, 6], [7, 300, 9]]


def test_where_numpy_agrees():
    condition = random_condition((6, 1, 5), "cpu")
    x = torch.randn(4, 5, generator=gen(1), dtype=torch.float64)
    y = torch.randn(6, 4, 1, generator=gen(2), dtype=torch.float64)
    expected = np.where(condition.numpy(), x.numpy(), y.numpy())
    np.testing.assert_array_equal(torch_masked.where(condition, x, y).numpy(), expected)


# ---------------------------------------------------------------- select values


@pytest.mark.parametrize("device", DEVICES)
def test_select_reference_page(device):
    t = torch.tensor([[1, 2], [3, 4]], device=device)
    e = torch.tensor([[5, 6], [7, 8]], device=device)
    elementwise = torch.tensor([[True, False], [False, True]], device=device)
    assert torch_masked.select(elementwise, t, e).tolist() == [[1, 6], [7, 4]]
    rows = torch.tensor([True, False], device=device)
    assert torch_masked.select(rows, t, e).tolist() == [[1, 2], [7, 8]]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_select_rows_hand_worked(device, dtype):
    x = make_tensor((5, 3, 4), dtype, device, generator=gen(1))
    y = make_tensor((5, 3, 4), dtype, device, generator=gen(2))
    rows = torch.tensor([True, False, False, True, False], device=device)
    expected = torch.stack([x[0], y[1], y[2], x[3], y[4]])
    assert_same(torch_masked.select(rows, x, y), expected)
    assert_same(torch_masked.select(non_contiguous(rows), non_contiguous(x), non_contiguous(y)), expected)
    # A scalar condition picks all of one side; a full-shape one is element-wise.
    assert_same(torch_masked.select(torch.tensor(True, device=device), x, y), x)
    assert_same(torch_masked.select(torch.tensor(False, device=device), x, y), y)
    elementwise = random_condition((5, 3, 4), device)
    assert_same(torch_masked.select(elementwise, x, y), torch.where(elementwise, x, y))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "shape", [(0,), (0, 3), (4, 0), (1,), (9,), (3000, 17), (40, 3, 700)], ids=str
)
def test_select_rows_shapes(device, shape):
    condition = random_condition(shape[:1], device)
    x = make_tensor(shape, torch.float32, device, generator=gen(1))
    y = make_tensor(shape, torch.float32, device, generator=gen(2))
    column = condition.reshape((-1,) + (1,) * (len(shape) - 1))
    assert_same(torch_masked.select(condition, x, y), torch.where(column, x, y))
    # Rows that start off the 16-byte grid (odd row lengths of bytes).
    x8, y8 = x.to(torch.uint8), y.to(torch.int8).view(torch.uint8)
    assert_same(torch_masked.select(condition, x8, y8), torch.where(column, x8, y8))
    for pick in (True, False):
        scalar = torch.tensor(pick, device=device)
        assert_same(torch_masked.select(scalar, x, y), x if pick else y)


@pytest.mark.parametrize("device", DEVICES)
def test_select_rows_of_a_slice(device):
    # Long rows whose starts are only 4-byte aligned: rows of 997 of 1000 columns.
    big_x = torch.randn(50, 1000, generator=gen(1)).to(device)
    big_y = torch.randn(50, 1000, generator=gen(2)).to(device)
    x, y = big_x[:, 3:], big_y[:, 3:]
    condition = random_condition((50,), device)
    assert_same(torch_masked.select(condition, x, y), torch.where(condition[:, None], x, y))
    assert_same(torch_masked.where(condition[:, None], x, y[0]), torch.where(condition[:, None], x, y[0]))


@pytest.mark.cuda
def test_cuda_never_synchronises():
    """No path of where or select, forward or backward, waits for the GPU
    (torch.cuda.set_sync_debug_mode would refuse it): the vector, row and
    strided kernels, a Python number, and the gradients."""
    condition = random_condition((300, 64), "cuda")
    rows = condition[:, 0].contiguous()
    x = torch.randn(300, 64, device="cuda", requires_grad=True)
    y = torch.randn(300, 64, device="cuda", requires_grad=True)
    column = torch.randn(64, device="cuda")
    upstream = torch.randn(300, 64, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        results = [
            torch_masked.where(condition, x, y),
            torch_masked.where(rows[:, None], x, column),
            torch_masked.where(condition[:1], x.t().contiguous().t(), y),
            torch_masked.where(condition, x, 0.0),
            torch_masked.select(rows, x, y),
        ]
        grads = torch.autograd.grad(results, (x, y), [upstream] * len(results))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    expected = [
        torch.where(condition, x, y),
        torch.where(rows[:, None], x, column),
        torch.where(condition[:1], x, y),
        torch.where(condition, x, 0.0),
        torch.where(rows[:, None], x, y),
    ]
    for result, reference in zip(results, expected):
        assert_same(result.detach(), reference.detach())
    expected_grads = torch.autograd.grad(expected, (x, y), [upstream] * len(expected))
    for grad, reference in zip(grads, expected_grads):
        torch.testing.assert_close(grad, reference)


@pytest.mark.parametrize("device", DEVICES)
def test_rows_more_than_the_grid_holds(device):
    """More rows (and pieces of rows) than the CUDA row kernel has warps at
    once, so each warp loops over several, loading the next condition
    ahead: select's rows; a [N, 1] condition with a [M] branch and rows of
    two pieces; and outer axes that do not merge (x transposed)."""
    condition = random_condition((40_000,), device)
    x = make_tensor((40_000, 64), torch.float32, device, generator=gen(1))
    y = make_tensor((40_000, 64), torch.float32, device, generator=gen(2))
    assert_same(torch_masked.select(condition, x, y), torch.where(condition[:, None], x, y))
    column = random_condition((12_000, 1), device, seed=3)
    wide = make_tensor((12_000, 1100), torch.float32, device, generator=gen(4))
    row = make_tensor((1100,), torch.float32, device, generator=gen(5))
    assert_same(torch_masked.where(column, wide, row), torch.where(column, wide, row))
    assert_same(torch_masked.where(column, row, wide), torch.where(column, row, wide))
    blocks = random_condition((90, 70, 1), device, seed=6)
    transposed = make_tensor((70, 90, 128), torch.float64, device, generator=gen(7)).transpose(0, 1)
    other = make_tensor((128,), torch.float64, device, generator=gen(8))
    assert_same(torch_masked.where(blocks, transposed, other), torch.where(blocks, transposed, other))


@pytest.mark.parametrize(("device", "n"), LARGE_SIZES)
@pytest.mark.parametrize("form", ["same shape", "rows", "columns"])
def test_where_past_int32_elements(device, n, form):
    """Outputs past 2**31 (and 2**32) elements through each way of moving
    them: same shapes with a number for y (the vector kernel), a [R, 1]
    condition picking rows of x or of a [256] y (the row kernel), and a
    [1, 256] condition (the strided kernel); int8, so each tensor is n bytes."""
    flags = torch.tensor([True, False, False, True, False, True, True], device=device)
    values = torch.arange(127, dtype=torch.int8, device=device)
    width = 256
    x = repeated(values, n).view(-1, width)
    if form == "same shape":
        condition, x, y = repeated(flags, n), x.view(-1), -1
    elif form == "rows":
        condition = repeated(flags, n // width).view(-1, 1)
        y = (torch.arange(width, device=device) - 128).to(torch.int8)
    else:
        condition, y = repeated(flags, width).view(1, -1), repeated(values, n // width).view(-1, 1)
    assert torch.equal(torch_masked.where(condition, x, y), torch.where(condition, x, y))


@pytest.mark.parametrize("device", DEVICES)
def test_select_random_shapes_dtypes_and_layouts(device):
    """Scalar, element-wise and row conditions over shapes, dtypes and memory
    layouts drawn at random agree with torch.where on the CPU."""
    g = gen(8)
    for _ in range(120):
        shape = random_shape(g, draw(g, range(5)), RANDOM_SIZES)
        dtype = draw(g, ALL_DTYPES)
        condition_shape = draw(g, [(), shape, shape[:1]])
        condition = torch.rand(condition_shape, generator=g) < 0.5
        x = make_tensor(shape, dtype, "cpu", generator=g)
        y = make_tensor(shape, dtype, "cpu", generator=g)
        column = condition.reshape(condition.shape + (1,) * (x.dim() - condition.dim()))
        expected = torch.where(column, x, y)
        laid_out = [random_layout(t.to(device), g) for t in (condition, x, y)]
        assert_same(torch_masked.select(*laid_out).cpu(), expected)


@pytest.mark.parametrize("device", DEVICES)
def test_select_scalars_and_promotion(device):
    assert_same(torch_masked.select(True, 1.5, 2.5), torch.tensor(1.5))
    condition = torch.tensor([True, False], device=device)
    x = torch.tensor([[1, 2], [3, 4]], dtype=torch.int32, device=device)
    y = torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64, device=device)
    assert_same(torch_masked.select(condition, x, y), torch.tensor([[1.0, 2.0], [0.5, 0.5]], dtype=torch.float64, device=device))


def test_select_nested_lists():
    # As in TensorFlow's examples: lists become tensors (integers int64).
    assert_same(torch_masked.select([True, False], [[1, 2], [3, 4]], [[5, 6], [7, 8]]),
                torch.tensor([[1, 2], [7, 8]]))
    assert_same(torch_masked.select([[True, False], [False, True]], [[1.5, 2.5], [3.5, 4.5]], [[5, 6], [7, 8]]),
                torch.tensor([[1.5, 6.0], [7.0, 4.5]]))


@pytest.mark.parametrize("device", DEVICES)
def test_condition_bytes_other_than_one_are_true(device):
    # A bool tensor viewed from other bytes: any non-zero byte is true, as in
    # boolean_mask and nonzero. Contiguous (the vector path), broadcast and rows.
    values = torch.tensor([0, 1, 2, 0x80, 0xFF], dtype=torch.uint8)
    condition_bytes = values[torch.randint(0, len(values), (300, 7), generator=gen(3))]
    condition = condition_bytes.to(device).view(torch.bool)
    canonical = (condition_bytes != 0).to(device)
    x = torch.randn(300, 7, generator=gen(1)).to(device)
    y = torch.randn(300, 7, generator=gen(2)).to(device)
    assert_same(torch_masked.where(condition, x, y), torch.where(canonical, x, y))
    assert_same(torch_masked.where(condition[:, :1], x, y[0]), torch.where(canonical[:, :1], x, y[0]))
    assert_same(torch_masked.select(condition[:, 0], x, y), torch.where(canonical[:, :1], x, y))


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device):
    c = torch.tensor([True, False], device=device)
    x = torch.ones(2, device=device)
    with pytest.raises(TypeError, match=r"where: expected condition of dtype torch.bool, got torch.float32"):
        torch_masked.where(x, x, x)
    with pytest.raises(TypeError, match=r"where: expected condition of dtype torch.bool, got torch.uint8"):
        torch_masked.where(c.to(torch.uint8), x, x)
    with pytest.raises(ValueError, match=r"where: expected both x and y or neither, got only x"):
        torch_masked.where(c, x)
    with pytest.raises(ValueError, match=r"where: expected both x and y or neither, got only y"):
        torch_masked.where(c, y=x)
    with pytest.raises(RuntimeError, match=r"where: expected condition, x and y to broadcast together, "
                                           r"got condition \[2\], x \[3\], y \[2\]"):
        torch_masked.where(c, torch.ones(3, device=device), x)
    too_deep = torch.ones([1] * 26, dtype=torch.bool, device=device)
    with pytest.raises(RuntimeError, match=r"where: expected at most 25 dimensions, got 26"):
        torch_masked.where(too_deep, x, x)
    with pytest.raises(TypeError, match=r"select: expected condition of dtype torch.bool, got torch.int64"):
        torch_masked.select(torch.tensor([1, 0], device=device), x, x)
    with pytest.raises(RuntimeError, match=r"select: expected x and y of the same shape, got x \[2\] and y \[1\]"):
        torch_masked.select(c, x, torch.ones(1, device=device))
    m = torch.ones(2, 3, device=device)
    with pytest.raises(RuntimeError, match=r"select: expected condition to be a scalar, of x's shape \[2, 3\], "
                                           r"or 1-D of length x.shape\[0\], got condition of shape \[3\]"):
        torch_masked.select(torch.ones(3, dtype=torch.bool, device=device), m, m)
    with pytest.raises(RuntimeError, match=r"got condition of shape \[2, 1\]"):
        torch_masked.select(torch.ones(2, 1, dtype=torch.bool, device=device), m, m)
    with pytest.raises(RuntimeError, match=r"got condition of shape \[1\]"):
        torch_masked.select(torch.ones(1, dtype=torch.bool, device=device), torch.tensor(1.0, device=device),
                             torch.tensor(2.0, device=device))


def test_arguments_that_make_no_tensor_are_named():
    # torch's own error for an array-like it makes no tensor of names neither
    # the op nor the argument; the front doors add both, and the value.
    c, x = torch.tensor([True, False]), torch.ones(2)
    with pytest.raises(RuntimeError, match=r"^where: cannot make a tensor of condition = None: Could not infer dtype"):
        torch_masked.where(None)
    with pytest.raises(RuntimeError, match=r"^where: cannot make a tensor of condition = \[True, None\]: "):
        torch_masked.where([True, None], x, 2.0)
    with pytest.raises(TypeError, match=r"^where: cannot make a tensor of y = 'a': "):
        torch_masked.where(c, x, "a")
    with pytest.raises(TypeError, match=r"^where: cannot make a tensor of x = \[1, \[2\]\]: "):
        torch_masked.where(c, [1, [2]], x)
    with pytest.raises(RuntimeError, match=r"^select: cannot make a tensor of condition = None: "):
        torch_masked.select(None, x, x)
    # Numbers torch.where refuses too: beside a tensor, or beside another number.
    half, two = fractions.Fraction(1, 2), decimal.Decimal(2)
    with pytest.raises(TypeError, match=r"^where: cannot make a tensor of x = Fraction\(1, 2\): "):
        torch_masked.where(c, half, x)
    with pytest.raises(TypeError, match=r"^select: cannot make a tensor of y = Decimal\('2'\): "):
        torch_masked.select(c, x, two)
    with pytest.raises(TypeError, match=r"^where: cannot make a tensor of y = Fraction\(1, 2\): "):
        torch_masked.where(c, 1.0, half)


def test_misaligned_complex128_is_refused():
    # torch.where itself faults on such a tensor.
    c = torch.tensor([True, False, True])
    x = misaligned(torch.ones(3, dtype=torch.complex128))
    y = torch.zeros(3, dtype=torch.complex128)
    with pytest.raises(RuntimeError, match=r"where: expected x with data aligned to its element size, 16 bytes, "
                                           r"got an address 8 bytes past a multiple of 16"):
        torch_masked.where(c, x, y)
    with pytest.raises(RuntimeError, match=r"select: expected y with data aligned to its element size"):
        torch_masked.select(c, y, x)
    # Elements of 8 bytes or fewer load unaligned on the CPU.
    x8 = misaligned(torch.arange(3).to(torch.complex64))
    assert torch.equal(torch_masked.where(c, x8, 0), torch.tensor([0, 0, 2], dtype=torch.complex64))


@pytest.mark.parametrize("other", OTHER_DEVICES)
def test_errors_across_devices(other):
    c = torch.tensor([True, False])
    x = torch.ones(2, device=other)
    name = device_name(other)
    with pytest.raises(RuntimeError, match=rf"where: expected all tensors on one device, got condition on cpu, "
                                           rf"x on {name}, y on {name}"):
        torch_masked.where(c, x, x)
    with pytest.raises(RuntimeError, match=rf"select: expected all tensors on one device, got condition on cpu, "
                                           rf"x on {name}, y on {name}"):
        torch_masked.select(c, x, x)
    with pytest.raises(RuntimeError, match=rf"where: expected all tensors on one device, got condition on cpu, "
                                           rf"x on {name}$"):
        torch_masked.where(c, x, 0.0)
    with pytest.raises(RuntimeError, match=rf"where: expected all tensors on one device, got condition on cpu, "
                                           rf"y on {name}$"):
        torch_masked.where(c, 1, x)


def test_fake_errors_match():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        c = torch.empty(2, dtype=torch.bool)
        with pytest.raises(TypeError, match=r"where: expected condition of dtype torch.bool, got torch.float32"):
            torch.ops.masked.where.self(torch.empty(2), torch.empty(2), torch.empty(2))
        with pytest.raises(RuntimeError, match=r"where: expected condition, x and y to broadcast together, "
                                               r"got condition \[2\], x \[3\], y \[2\]"):
            torch.ops.masked.where.self(c, torch.empty(3), torch.empty(2))
        with pytest.raises(RuntimeError, match=r"select: expected x and y of the same shape, got x \[2\] and y \[1\]"):
            torch.ops.masked.select(c, torch.empty(2), torch.empty(1))
        with pytest.raises(RuntimeError, match=r"select: expected condition to be a scalar, of x's shape \[3, 2\]"):
            torch.ops.masked.select(c, torch.empty(3, 2), torch.empty(3, 2))
        out = torch.ops.masked.where.self(c, torch.empty(3, 1, dtype=torch.int32), torch.empty((), dtype=torch.float16))
        assert out.shape == (3, 2) and out.dtype == torch.float16
        with pytest.raises(RuntimeError, match=r"where: expected condition, x and y to broadcast together, "
                                               r"got condition \[2\], x \[3\], y \[\]"):
            torch.ops.masked.where.ScalarOther(c, torch.empty(3), 1.0)
        out = torch.ops.masked.where.ScalarSelf(c, 2.5, torch.empty(3, 1, dtype=torch.int32))
        assert out.shape == (3, 2) and out.dtype == torch.float32
        too_deep = torch.empty([1] * 26, dtype=torch.bool)
        with pytest.raises(RuntimeError, match=r"where: expected at most 25 dimensions, got 26"):
            torch.ops.masked.where.self(too_deep, torch.empty(1), torch.empty(1))
        with pytest.raises(RuntimeError, match=r"select: expected at most 25 dimensions, got 26"):
            torch.ops.masked.select(c[0], too_deep, too_deep)


# ---------------------------------------------------------------- autograd


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shapes", [((3, 1), (3, 4), (4,)), ((), (2, 3), ()), ((2, 3), (2, 3), (2, 3))], ids=str)
def test_where_gradcheck(device, shapes):
    c_shape, x_shape, y_shape = shapes
    condition = random_condition(c_shape, device)
    x = torch.randn(x_shape, dtype=torch.float64, generator=gen(1)).to(device).requires_grad_()
    y = torch.randn(y_shape, dtype=torch.float64, generator=gen(2)).to(device).requires_grad_()
    fn = lambda x, y: torch.ops.masked.where.self(condition, x, y)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, y))
    assert torch.autograd.gradgradcheck(fn, (x, y))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shapes", [((3, 1), (3, 4)), ((2, 3), ()), ((), (2, 3))], ids=str)
def test_where_number_overloads_gradcheck(device, shapes):
    c_shape, t_shape = shapes
    condition = random_condition(c_shape, device)
    tensor = torch.randn(t_shape, dtype=torch.float64, generator=gen(1)).to(device).requires_grad_()
    for fn in (lambda t: torch.ops.masked.where.ScalarOther(condition, t, 2.5),
               lambda t: torch.ops.masked.where.ScalarSelf(condition, -1, t)):
        assert torch.autograd.gradcheck(fn, (tensor,))
        assert torch.autograd.gradgradcheck(fn, (tensor,))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("c_shape", [(), (4,), (4, 3)], ids=str)
def test_select_gradcheck(device, c_shape):
    condition = random_condition(c_shape, device)
    x = torch.randn(4, 3, dtype=torch.float64, generator=gen(1)).to(device).requires_grad_()
    y = torch.randn(4, 3, dtype=torch.float64, generator=gen(2)).to(device).requires_grad_()
    fn = lambda x, y: torch.ops.masked.select(condition, x, y)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, y))
    assert torch.autograd.gradgradcheck(fn, (x, y))


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_random_shapes_dtypes_and_layouts(device):
    """Gradients of where (broadcast patterns drawn at random) and select (row,
    element-wise and scalar conditions), with floating and complex branches of
    mixed dtypes in random memory layouts, equal torch.where's: each summed
    back to its branch's shape and cast to its dtype. (torch.where's own
    backward fails for a real branch of a complex result; that case is
    test_gradient_to_real_branch_of_complex_result.)"""
    g = gen(10)
    for _ in range(80):
        dtypes = draw(g, [[torch.float32, torch.float64], [torch.complex64, torch.complex128]])
        out_shape = random_shape(g, draw(g, range(4)), (1, 1, 2, 3, 5, 64), max_numel=2000)
        use_select = draw(g, [False, True])
        if use_select:
            shapes = [draw(g, [(), out_shape, out_shape[:1]]), out_shape, out_shape]
        else:
            shapes = [broadcast_operand_shape(out_shape, g) for _ in range(3)]
        condition = torch.rand(shapes[0], generator=g) < 0.5
        x = make_tensor(shapes[1], draw(g, dtypes), "cpu", generator=g).requires_grad_()
        y = make_tensor(shapes[2], draw(g, dtypes), "cpu", generator=g).requires_grad_()
        if use_select:
            expected_out = torch.where(condition.reshape(condition.shape + (1,) * (x.dim() - condition.dim())), x, y)
        else:
            expected_out = torch.where(condition, x, y)
        upstream = make_tensor(expected_out.shape, expected_out.dtype, "cpu", generator=g)
        expected = torch.autograd.grad(expected_out, (x, y), upstream)
        laid_out = [random_layout(t.detach().to(device), g).requires_grad_() for t in (x, y)]
        op = torch_masked.select if use_select else torch_masked.where
        out = op(random_layout(condition.to(device), g), *laid_out)
        actual = torch.autograd.grad(out, laid_out, random_layout(upstream.to(device), g))
        for a, e in zip(actual, expected):
            assert a.dtype == e.dtype and a.shape == e.shape
            torch.testing.assert_close(a.cpu(), e)


@pytest.mark.parametrize("device", DEVICES)
def test_forward_mode_ad(device):
    c = torch.tensor([True, False, True], device=device)
    y = torch.zeros(3, device=device)
    x = torch.ones(3, device=device)
    assert_forward_ad_matches(lambda x: torch_masked.where(c, x, y), lambda x: torch.where(c, x, y), x)
    assert_forward_ad_matches(lambda x: torch_masked.select(c, y, x), lambda x: torch.where(c, y, x), x)
    assert_forward_ad_matches(lambda x: torch_masked.where(c, x, 2.0), lambda x: torch.where(c, x, 2.0), x)


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_values_no_leak(device):
    condition = torch.tensor([[True], [False]], device=device)
    x = torch.ones(2, 3, device=device, requires_grad=True)
    y = torch.ones(3, dtype=torch.float64, device=device, requires_grad=True)
    out = torch_masked.where(condition, x, y)
    grad = torch.tensor([[float("nan"), float("inf"), 1.0], [2.0, -float("inf"), float("nan")]],
                        dtype=torch.float64, device=device)
    gx, gy = torch.autograd.grad(out, (x, y), grad)
    assert gx.dtype == torch.float32 and gx.shape == (2, 3)
    assert gy.dtype == torch.float64 and gy.shape == (3,)
    assert torch.equal(gx[1], torch.zeros(3, device=device))  # exact zeros, no NaN
    assert torch.equal(gx[0, 2:], torch.ones(1, device=device))
    assert torch.isnan(gx[0, 0]) and torch.isinf(gx[0, 1])
    assert gy[0] == 2.0 and gy[1] == -float("inf") and torch.isnan(gy[2])

    rows = torch.tensor([True, False], device=device)
    xs = torch.ones(2, 2, device=device, requires_grad=True)
    ys = torch.ones(2, 2, device=device, requires_grad=True)
    nan_grad = torch.full((2, 2), float("nan"), device=device)
    gxs, gys = torch.autograd.grad(torch_masked.select(rows, xs, ys), (xs, ys), nan_grad)
    assert torch.equal(gxs[1], torch.zeros(2, device=device)) and torch.isnan(gxs[0]).all()
    assert torch.equal(gys[0], torch.zeros(2, device=device)) and torch.isnan(gys[1]).all()


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_of_0d_branches_keeps_the_sign_of_zero(device):
    condition = torch.tensor(False, device=device)
    x = torch.tensor(1.0, device=device, requires_grad=True)
    y = torch.tensor(1.0, device=device, requires_grad=True)
    grad = torch.tensor(-0.0, device=device)
    gx, gy = torch.autograd.grad(torch_masked.where(condition, x, y), (x, y), grad)
    native_gx, native_gy = torch.autograd.grad(torch.where(condition, x, y), (x, y), grad)
    assert gx.item() == 0.0 and not torch.signbit(gx) and not torch.signbit(native_gx)
    assert gy.item() == 0.0 and torch.signbit(gy) and torch.signbit(native_gy)
    # The same through torch.func (transforms.py's own backward).
    _, pullback = torch.func.vjp(lambda x, y: torch_masked.where(condition, x, y), x.detach(), y.detach())
    fx, fy = pullback(grad)
    assert fx.item() == 0.0 and not torch.signbit(fx) and torch.signbit(fy)


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_to_real_branch_of_complex_result(device):
    condition = torch.tensor([True, False], device=device)
    x = torch.ones(2, dtype=torch.float64, device=device, requires_grad=True)
    y = torch.ones(2, dtype=torch.complex128, device=device, requires_grad=True)
    out = torch_masked.where(condition, x, y)
    assert out.dtype == torch.complex128
    out.abs().sum().backward()
    assert x.grad.dtype == torch.float64 and y.grad.dtype == torch.complex128
    assert x.grad.tolist() == [1.0, 0.0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("real_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("complex_dtype", [torch.complex64, torch.complex128])
@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_gradient_of_a_4_byte_complex_result_summed_to_a_0d_branch(device, real_dtype, complex_dtype):
    # float16 (bfloat16) beside a 0-d complex tensor makes complex32
    # (bcomplex32), which ATen cannot sum on the CPU: y's gradient is summed
    # in complex64, then given y's dtype. (torch.where's backward refuses the
    # real branch here, so the reference is worked by hand.)
    if real_dtype == torch.bfloat16 and not hasattr(torch, "bcomplex32"):
        pytest.skip("this torch makes complex64 of bfloat16 and a complex number")
    condition = torch.tensor([[True, False, True], [False, True, False]], device=device)
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=real_dtype, device=device, requires_grad=True)
    y = torch.tensor(1 + 2j, dtype=complex_dtype, device=device, requires_grad=True)
    out = torch_masked.where(condition, x, y)
    assert out.dtype == torch.where(condition, x, y).dtype and out.element_size() == 4
    upstream = torch.tensor([[1, 2j, 3], [4j, 5, 6 + 1j]], dtype=torch.complex64, device=device).to(out.dtype)
    gx, gy = torch.autograd.grad(out, (x, y), upstream)
    assert gx.dtype == real_dtype and gx.tolist() == [[1.0, 0.0, 3.0], [0.0, 5.0, 0.0]]
    assert gy.dtype == complex_dtype and gy.item() == 6 + 7j
    # The same through torch.func (transforms.py's own backward).
    loss = lambda x, y: torch.view_as_real(torch_masked.where(condition, x, y).to(torch.complex64)).sum()
    fx, fy = torch.func.grad(loss, argnums=(0, 1))(x.detach(), y.detach())
    assert fx.tolist() == condition.to(real_dtype).tolist() and fy.dtype == complex_dtype and fy.item() == 3 + 3j


# ---------------------------------------------------------------- opcheck


def sample_maker(device, requires_grad):
    """t(shape, dtype, seed): a random sample input, requiring grad where it can."""

    def t(shape, dtype=torch.float32, seed=1):
        value = make_tensor(shape, dtype, device, generator=gen(seed))
        return value.requires_grad_(requires_grad and (dtype.is_floating_point or dtype.is_complex))

    return t


def where_samples(device, requires_grad):
    t = sample_maker(device, requires_grad)
    yield random_condition((4, 5), device), t((4, 5)), t((4, 5), seed=2)
    yield random_condition((3, 1), device), t((3, 4), torch.float64), t((4,))
    yield random_condition((), device), t(()), t((2, 3))
    yield random_condition((2, 3), device), t((2, 3), torch.int32), t((3,), torch.float16)
    yield random_condition((0, 2), device), t((2,)), t((0, 1))
    yield non_contiguous(random_condition((5, 6), device)), non_contiguous(t((5, 6))), t((6,), torch.complex64)


def number_makes_complex_half(tensor, number):
    """A complex number beside a float16 or bfloat16 tensor makes an
    experimental complex32 type, which some of opcheck's tests cannot take."""
    return isinstance(number, complex) and tensor.dtype in (torch.float16, torch.bfloat16)


def select_samples(device, requires_grad):
    t = sample_maker(device, requires_grad)
    yield random_condition((4,), device), t((4, 3)), t((4, 3), seed=2)
    yield random_condition((4, 3), device), t((4, 3), torch.float64), t((4, 3))
    yield random_condition((), device), t((2, 5)), t((2, 5), seed=2)
    yield random_condition((), device), t(()), t((), torch.int64)
    yield random_condition((0,), device), t((0, 2)), t((0, 2))
    yield non_contiguous(random_condition((6,), device)), non_contiguous(t((6, 2))), t((6, 2), torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck(device, requires_grad):
    for args in where_samples(device, requires_grad):
        torch.library.opcheck(torch.ops.masked.where.self, args)
    for condition, x, y in where_samples(device, requires_grad):
        for number in NUMBERS:
            if not (number_makes_complex_half(x, number) or number_makes_complex_half(y, number)):
                torch.library.opcheck(torch.ops.masked.where.ScalarOther, (condition, x, number))
                torch.library.opcheck(torch.ops.masked.where.ScalarSelf, (condition, number, y))
    for args in select_samples(device, requires_grad):
        torch.library.opcheck(torch.ops.masked.select, args)
    for condition, x, _ in where_samples(device, requires_grad):
        for number_is_x in (True, False):
            torch.library.opcheck(torch.ops.masked.check_where_number, (condition, x, 2, number_is_x))


@needs_nonzero_fake
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_index_mode(device):
    for dtype in (torch.bool, torch.float32, torch.complex64):
        torch.library.opcheck(torch.ops.masked.where.default, (make_tensor((4, 5), dtype, device, generator=gen()),))


# ---------------------------------------------------------------- torch.compile


def training_loss(rows, condition, w, b, x):
    hidden = torch_masked.where(condition, x * w, b)  # broadcast b: [features]
    hidden = torch_masked.select(rows, hidden, torch.tanh(hidden))
    weights = torch_masked.where(rows[:, None], 1.0, 0.5)  # Python scalars through the front door
    hidden = torch_masked.where(hidden > -1, hidden, -1.0)  # a number beside a tensor: where.ScalarOther
    return (torch_masked.where(hidden > 0, hidden, 0.1 * hidden).square() * weights).sum()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_training_step(device, dynamic):
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(training_loss, fullgraph=True, dynamic=dynamic)
    # Static shapes: one batch (one graph); dynamic: a second batch must reuse it.
    for batch in (6, 9) if dynamic else (6,):
        rows = random_condition((batch,), device, seed=batch)
        condition = random_condition((batch, 1), device, seed=batch + 1)
        x = torch.randn(batch, 5, generator=gen(batch)).to(device)
        grads = []
        for fn in (training_loss, compiled):
            w = torch.randn(5, generator=gen(7)).to(device).requires_grad_()
            b = torch.randn(5, generator=gen(8)).to(device).requires_grad_()
            loss = fn(rows, condition, w, b, x)
            loss.backward()
            grads.append((loss.detach(), w.grad, b.grad))
        for eager, compiled_value in zip(*grads):
            torch.testing.assert_close(compiled_value, eager)
    assert counters["stats"]["unique_graphs"] == 1


def selection_of_selections(op, condition, x, y, mask):
    """where or select over three boolean_mask selections: to a trace, their
    lengths are three unrelated sizes known only at run time."""
    return op(*(torch_masked.boolean_mask(t, mask) for t in (condition, x, y)))


@pytest.mark.parametrize("op", [torch_masked.where, torch_masked.select], ids=["where", "select"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_with_data_dependent_sizes(op, dynamic):
    torch._dynamo.reset()
    compiled = torch.compile(selection_of_selections, fullgraph=True, dynamic=dynamic)
    for seed in (0, 1):
        condition, mask = random_condition((7, 4), "cpu", seed), random_condition((7,), "cpu", seed + 1)
        x = torch.randn(7, 4, generator=gen(seed), requires_grad=True)
        y = torch.randn(7, 4, generator=gen(seed + 2), requires_grad=True)
        result = compiled(op, condition, x, y, mask)
        x_grad, y_grad = torch.autograd.grad(result.sum(), (x, y))
        torch.testing.assert_close(result, torch.where(condition, x, y)[mask])
        torch.testing.assert_close(x_grad, (condition & mask[:, None]).float())
        torch.testing.assert_close(y_grad, (~condition & mask[:, None]).float())
        if op is torch_masked.select:  # whole rows
            rows = compiled(op, condition[:, 0], x, y, mask)
            torch.testing.assert_close(rows, torch.where(condition[:, :1], x, y)[mask])


def where_gradients(where, c, x, y):
    x, y = x.detach().requires_grad_(), y.detach().requires_grad_()
    loss = (where(c, x, y) * 2 + where(c, x, 2.0) + where(c, 3.0, y)).sum()
    return torch.autograd.grad(loss, (x, y))


@pytest.mark.parametrize("size", [1, 3])
def test_compiled_gradients_of_sizes_known_only_at_run_time(size):
    """Every size marked unbacked, a size of 1 among them: each overload's
    backward sums its branch's gradient back to the branch's shape without
    asking whether a size is 1, which such a size cannot answer (torch.where's
    gradient does not ask either)."""
    c = random_condition((size,), "cpu", seed=size)
    x, y = torch.randn(size, generator=gen(size)), torch.randn(size, generator=gen(size + 1))
    torch._dynamo.reset()
    for tensor in (c, x, y):
        torch._dynamo.decorators.mark_unbacked(tensor, 0)
    compiled = torch.compile(functools.partial(where_gradients, torch_masked.where))(c, x, y)
    for got, expected in zip(compiled, where_gradients(torch.where, c, x, y), strict=True):
        torch.testing.assert_close(got, expected)


def test_compiled_select_mismatched_data_dependent_sizes_raise():
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda c, x, y, mask, other: torch_masked.select(c, torch_masked.boolean_mask(x, mask), torch_masked.boolean_mask(y, other)),
        fullgraph=True,
    )
    c, x, mask = torch.tensor(True), torch.arange(4.0), torch.tensor([True, False, True, False])
    torch.testing.assert_close(compiled(c, x, -x, mask, mask.flip(0)), torch.tensor([0.0, 2.0]))
    with pytest.raises(RuntimeError, match=r"expected x and y of the same shape, got x \[2\] and y \[3\]"):
        compiled(c, x, -x, mask, torch.tensor([True, True, True, False]))
