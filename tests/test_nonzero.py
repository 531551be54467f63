import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.library import opcheck

import torch_masked
from tests.common import (
    ALL_DTYPES,
    DEVICES,
    LARGE_SIZES,
    OTHER_DEVICES,
    WIDE_UNSIGNED_DTYPES,
    boundary_positions,
    device_name,
    draw,
    make_tensor,
    misaligned,
    non_contiguous,
    random_layout,
    random_shape,
)

SHAPES = [(), (0,), (1,), (7,), (3, 0, 2), (5, 6), (2, 3, 4), (2, 1, 3, 2), (2, 3, 1, 2, 3)]


def assert_matches_torch(x):
    """Both forms equal torch.nonzero on the same input (compared on the CPU)."""
    expected = torch.nonzero(x.cpu())
    got = torch_masked.nonzero(x)
    assert got.device == x.device and got.dtype == torch.long
    assert got.is_contiguous()  # row-major, unlike ATen's column-major CPU result
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
    expected_tuple = torch.nonzero(x.cpu(), as_tuple=True)
    got_tuple = torch_masked.nonzero(x, as_tuple=True)
    assert isinstance(got_tuple, tuple) and len(got_tuple) == len(expected_tuple)
    for g, e in zip(got_tuple, expected_tuple):
        torch.testing.assert_close(g.cpu(), e, rtol=0, atol=0)


# --- the reference pages' examples -------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_torch_reference_examples(device):
    ones = torch.tensor([1, 1, 1, 0, 1], device=device)
    diag = torch.tensor(
        [[0.6, 0.0, 0.0, 0.0], [0.0, 0.4, 0.0, 0.0], [0.0, 0.0, 1.2, 0.0], [0.0, 0.0, 0.0, -0.4]], device=device
    )
    assert torch_masked.nonzero(ones).tolist() == [[0], [1], [2], [4]]
    assert torch_masked.nonzero(diag).tolist() == [[0, 0], [1, 1], [2, 2], [3, 3]]
    assert [t.tolist() for t in torch_masked.nonzero(ones, as_tuple=True)] == [[0, 1, 2, 4]]
    assert [t.tolist() for t in torch_masked.nonzero(diag, as_tuple=True)] == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert [t.tolist() for t in torch_masked.nonzero(torch.tensor(5, device=device), as_tuple=True)] == [[0]]


@pytest.mark.parametrize("device", DEVICES)
def test_tf_where_index_mode_examples(device):
    def nz(values, **kw):
        return torch_masked.nonzero(torch.tensor(values, device=device), **kw).tolist()

    assert nz([True, False, False, True]) == [[0], [3]]
    assert nz([[1, 0, 0], [1, 0, 1]]) == [[0, 0], [1, 0], [1, 2]]
    float_tensor = [[[0.1, 0], [0, 2.2], [3.5, 1e6]], [[0, 0], [0, 0], [99, 0]]]
    assert nz(float_tensor) == [[0, 0, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [1, 2, 0]]
    assert nz([complex(0.0), complex(1.0), 0 + 1j, 1 + 1j]) == [[1], [2], [3]]


# --- values against torch.nonzero ----------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_torch_nonzero(device, dtype, shape):
    assert_matches_torch(make_tensor(shape, dtype, device, density=0.4))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", WIDE_UNSIGNED_DTYPES)
def test_wide_unsigned_matches_numpy(device, dtype):
    # torch.nonzero does not take these; NumPy is the reference.
    values = np.array([[0, 1, 2**15], [0, 0, 7]], dtype=np.uint64)
    x = torch.from_numpy(values.astype(np.int64)).to(dtype).to(device)
    assert torch_masked.nonzero(x).tolist() == np.argwhere(values).tolist()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("density", [0.0, 0.001, 0.5, 0.97, 1.0])
@pytest.mark.parametrize("shape", [(1_000_003,), (1000, 1001), (7, 333, 429)], ids=str)
def test_large_inputs_across_chunks(device, density, shape):
    # Large enough for several parallel chunks, with rows crossing chunk boundaries.
    assert_matches_torch(make_tensor(shape, torch.bool, device, density=density))


@pytest.mark.parametrize(("device", "n"), LARGE_SIZES)
def test_positions_past_int32(device, n):
    """Positions past 2**31 (and 2**32), flat and as coordinates of a 2-D
    input, where counting, dividing or writing in 32 bits would wrap."""
    positions = torch.tensor(boundary_positions(n))
    x = torch.zeros(n, dtype=torch.bool, device=device)
    x[positions.to(device)] = True
    assert torch.equal(torch_masked.nonzero(x).cpu(), positions.view(-1, 1))
    padded = torch.cat([positions, torch.tensor([-1, -1])]).view(-1, 1)
    assert torch.equal(torch_masked.nonzero_static(x, size=len(positions) + 2).cpu(), padded)
    columns = n // 4
    coordinates = torch.stack([positions // columns, positions % columns], dim=1)
    assert torch.equal(torch_masked.nonzero(x.view(4, columns)).cpu(), coordinates)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bool, torch.float16])
@pytest.mark.parametrize("skip", [1, 3])
def test_contiguous_inputs_starting_off_the_vector_width(device, dtype, skip):
    # A contiguous view one or three elements in: no load of it is aligned to
    # 16 bytes, over many tiles of CUDA's kernels.
    x = make_tensor((3 * 4096 + 5 + skip,), dtype, device, density=0.3)[skip:]
    assert x.is_contiguous() and x.data_ptr() % 16 != 0
    assert_matches_torch(x)
    expected = torch.nonzero(x.cpu())
    for size in [len(expected) // 2 + 3, len(expected) + 7]:  # ends mid-tile; padded
        got = torch_masked.nonzero_static(x, size=size, fill_value=-2).cpu()
        padded = torch.cat([expected, torch.full((size, 1), -2)])[:size]
        torch.testing.assert_close(got, padded, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("threads", [1, 2])
def test_thread_count_does_not_change_result(device, threads):
    x = make_tensor((300, 700), torch.float32, device, density=0.3)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        assert_matches_torch(x)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("device", DEVICES)
def test_zero_dim_inputs(device):
    for value, rows in [(5, 1), (0, 0)]:
        x = torch.tensor(value, device=device)
        got = torch_masked.nonzero(x)
        assert got.shape == (rows, 0)
        assert [t.tolist() for t in torch_masked.nonzero(x, as_tuple=True)] == [[0] * rows]
        assert_matches_torch(x)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_inputs(device):
    assert torch_masked.nonzero(torch.zeros(0, device=device)).shape == (0, 1)
    assert torch_masked.nonzero(torch.zeros(3, 0, 2, device=device)).shape == (0, 3)
    assert [t.shape for t in torch_masked.nonzero(torch.zeros(3, 0, device=device), as_tuple=True)] == [(0,), (0,)]
    assert torch_masked.nonzero(torch.zeros(4, 5, device=device)).shape == (0, 2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bool, torch.int32, torch.float32, torch.complex64])
def test_non_contiguous_inputs(device, dtype):
    base = make_tensor((6, 8, 5), dtype, device, density=0.4)
    views = [
        non_contiguous(base),
        base.transpose(0, 2),
        base[:, ::3, 1:],
        base[1:5, 2].unsqueeze(1).expand(4, 3, 5),
        torch.as_strided(base, (4, 4), (7, 2)),
    ]
    for view in views:
        assert_matches_torch(view)
        torch.testing.assert_close(torch_masked.nonzero(view), torch_masked.nonzero(view.contiguous()))


@pytest.mark.parametrize("device", DEVICES)
def test_random_shapes_dtypes_densities_and_layouts(device):
    """Shapes, dtypes, densities and memory layouts drawn at random (the
    kernels choose their paths by them) agree with torch.nonzero."""
    g = torch.Generator().manual_seed(12)
    for _ in range(120):
        shape = random_shape(g, draw(g, range(6)), (0, 1, 2, 3, 7, 64, 333), max_numel=50_000)
        dtype = draw(g, ALL_DTYPES)
        x = make_tensor(shape, dtype, "cpu", density=draw(g, [0.0, 0.02, 0.5, 0.98, 1.0]), generator=g)
        assert_matches_torch(random_layout(x.to(device), g))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_nan_subnormal_and_negative_zero(device, dtype):
    tiny = torch.finfo(dtype).smallest_normal / 4  # a subnormal
    x = torch.tensor([0.0, -0.0, float("nan"), tiny, -tiny, float("-inf"), 1.0], dtype=dtype, device=device)
    assert x[3] != 0  # the value really is a representable subnormal
    assert torch_masked.nonzero(x).flatten().tolist() == [2, 3, 4, 5, 6]


@pytest.mark.parametrize("device", DEVICES)
def test_float8_zeros_by_their_own_rules(device):
    """Bytes 0x00, 0x80, 0x01: 0x80 is -0.0 in float8_e4m3fn and e5m2 (zero),
    NaN in the fnuz types, which have no -0.0 (non-zero)."""
    raw = torch.tensor([0x00, 0x80, 0x01], dtype=torch.uint8, device=device)
    for dtype, expected in [(torch.float8_e4m3fn, [2]), (torch.float8_e5m2, [2]),
                            (torch.float8_e4m3fnuz, [1, 2]), (torch.float8_e5m2fnuz, [1, 2])]:
        x = raw.view(dtype)
        assert (x.float() != 0).nonzero().flatten().tolist() == expected  # torch's own reading
        assert torch_masked.nonzero(x).flatten().tolist() == expected


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bool, torch.float8_e4m3fn, torch.float8_e4m3fnuz])
def test_long_byte_inputs_of_any_bytes(device, dtype):
    """Thousands of bytes drawn from 0x00, 0x80, 0x01, 0x7f, 0xff (counted
    many at a time on the CPU): each is non-zero by its dtype's rule, as
    torch reads it (bool: every byte but 0x00)."""
    gen = torch.Generator().manual_seed(3)
    values = torch.tensor([0x00, 0x80, 0x01, 0x7F, 0xFF], dtype=torch.uint8)
    raw = values[torch.randint(0, len(values), (4099,), generator=gen)]
    x = raw.to(device).view(dtype)
    expected = torch.nonzero(raw != 0) if dtype == torch.bool else torch.nonzero(raw.view(dtype).float() != 0)
    assert torch.equal(torch_masked.nonzero(x).cpu(), expected)


@pytest.mark.parametrize("device", DEVICES + ["meta"])
@pytest.mark.parametrize("dtype", ["float8_e8m0fnu", "float4_e2m1fn_x2"])
def test_dtypes_without_a_zero_are_refused(device, dtype):
    dtype = getattr(torch, dtype)
    x = torch.zeros(4, dtype=torch.uint8, device=device).view(dtype)
    message = r"expected a dtype with a zero value and one value per element, got torch\.float"
    with pytest.raises(TypeError, match="nonzero: " + message):
        torch_masked.nonzero(x)
    with pytest.raises(TypeError, match="nonzero_tuple: " + message):
        torch_masked.nonzero(x, as_tuple=True)
    # Also where no element needs reading: no rows asked for, or a 0-d input.
    for static_input, size in [(x, 2), (x, 0), (x[0], 2)]:
        with pytest.raises(TypeError, match="nonzero_static: " + message):
            torch_masked.nonzero_static(static_input, size=size)


def test_only_tensors_are_taken():
    # As torch.nonzero: no array-likes (tf.where takes them: torch_masked.where).
    for value, shown in [(None, "NoneType"), ([1, 0], "list")]:
        with pytest.raises(TypeError, match=rf"^nonzero: expected input to be a tensor, got {shown}$"):
            torch_masked.nonzero(value)
        with pytest.raises(TypeError, match=rf"^nonzero: expected input to be a tensor, got {shown}$"):
            torch_masked.nonzero(value, as_tuple=True)
        with pytest.raises(TypeError, match=rf"^nonzero_static: expected input to be a tensor, got {shown}$"):
            torch_masked.nonzero_static(value, size=2)


def test_flags_and_sizes_of_other_types_are_refused():
    # Taken for its truth, as_tuple=None would pass as False; torch.nonzero
    # and torch.nonzero_static refuse what is not a bool or an integer too.
    x = torch.tensor([0, 1, 2])
    for flag in [None, 0, 1, "yes"]:
        with pytest.raises(TypeError, match=rf"^nonzero: expected as_tuple to be a bool, got {flag!r}$"):
            torch_masked.nonzero(x, as_tuple=flag)
    for size in [None, 2.5, True]:
        with pytest.raises(TypeError, match=rf"^nonzero_static: expected size to be an integer, got {size!r}$"):
            torch_masked.nonzero_static(x, size=size)
    with pytest.raises(TypeError, match=r"^nonzero_static: expected fill_value to be an integer, got 1.5$"):
        torch_masked.nonzero_static(x, size=3, fill_value=1.5)
    # What has __index__ is an integer, as for torch.nonzero_static.
    assert torch_masked.nonzero_static(x, size=torch.tensor(3), fill_value=torch.tensor(7)).tolist() == [[1], [2], [7]]


def test_misaligned_inputs():
    # 16-byte elements are loaded with aligned vector moves on the CPU (and
    # torch's own kernels fault on such a tensor); smaller ones load unaligned.
    x = misaligned(torch.tensor([0, 1, 0, 2], dtype=torch.complex128))
    message = r"expected input with data aligned to its element size, 16 bytes, got an address 8 bytes past"
    with pytest.raises(RuntimeError, match="nonzero: " + message):
        torch_masked.nonzero(x)
    with pytest.raises(RuntimeError, match="nonzero_static: " + message):
        torch_masked.nonzero_static(x, size=2)
    x8 = misaligned(torch.tensor([0, 1, 0, 2], dtype=torch.float64))
    assert torch_masked.nonzero(x8).tolist() == [[1], [3]]


def _refuses_more_than_25_dimensions(x):
    message = r"expected a tensor of at most 25 dimensions on CUDA, got 26"
    with pytest.raises(RuntimeError, match="nonzero: " + message):
        torch_masked.nonzero(x)
    with pytest.raises(RuntimeError, match="nonzero_tuple: " + message):
        torch_masked.nonzero(x, as_tuple=True)
    for size in (0, 2):  # also where no element needs reading
        with pytest.raises(RuntimeError, match="nonzero_static: " + message):
            torch_masked.nonzero_static(x, size=size)


@pytest.mark.cpu_kernel
def test_more_than_25_dimensions():
    """Taken on the CPU; refused on CUDA, as by ATen's CUDA nonzero (and by
    the fake kernels for CUDA tensors, which need no GPU)."""
    x = torch.ones([1] * 26)
    assert torch_masked.nonzero(x).tolist() == [[0] * 26]
    assert torch_masked.nonzero_static(x, size=2).tolist() == [[0] * 26, [-1] * 26]
    with FakeTensorMode():
        _refuses_more_than_25_dimensions(torch.ones([1] * 26, device="cuda"))


@pytest.mark.cuda
def test_more_than_25_dimensions_on_cuda():
    _refuses_more_than_25_dimensions(torch.ones([1] * 26, device="cuda"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_parts(device, dtype):
    x = torch.tensor([0j, complex(-0.0, -0.0), 1j, 2 + 0j, complex(float("nan"), 0), complex(0, 1e-310)], dtype=dtype)
    expected = [2, 3, 4] + ([5] if dtype == torch.complex128 else [])  # 1e-310 underflows to 0 in complex64
    assert torch_masked.nonzero(x.to(device)).flatten().tolist() == expected


@pytest.mark.parametrize("device", DEVICES)
def test_as_tuple_indexes_the_non_zero_values(device):
    x = make_tensor((4, 5, 6), torch.float32, device, density=0.3)
    values = x[torch_masked.nonzero(x, as_tuple=True)]
    torch.testing.assert_close(values, x[x != 0])
    outputs = torch_masked.nonzero(x, as_tuple=True)
    assert len({t.data_ptr() for t in outputs}) == len(outputs)  # separate buffers


# --- out= --------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("out_shape", [(0,), (2, 2), (100, 3)], ids=str)
def test_out_is_resized_and_filled(device, out_shape):
    x = make_tensor((5, 7), torch.int32, device, density=0.5)
    out = torch.full(out_shape, -7, dtype=torch.long, device=device)
    result = torch_masked.nonzero(x, out=out)
    assert result is out
    torch.testing.assert_close(out.cpu(), torch.nonzero(x.cpu()), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_out_errors(device):
    x = torch.tensor([1, 0, 2], device=device)
    with pytest.raises(RuntimeError, match=r"nonzero: expected out to have dtype torch.int64, got torch.float32"):
        torch_masked.nonzero(x, out=torch.empty(0, device=device))
    with pytest.raises(ValueError, match="as_tuple"):
        torch_masked.nonzero(x, as_tuple=True, out=torch.empty(0, dtype=torch.long, device=device))


@pytest.mark.parametrize("other", OTHER_DEVICES)
def test_out_on_another_device(other):
    with pytest.raises(RuntimeError, match=rf"nonzero: expected all tensors on one device, "
                                           rf"got input on cpu, out on {device_name(other)}"):
        torch_masked.nonzero(torch.ones(3), out=torch.empty(0, dtype=torch.long, device=other))


# --- nonzero_static ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.float16, torch.float64, torch.complex64])
@pytest.mark.parametrize("size", [0, 1, 5, 40, 1000])
@pytest.mark.parametrize("shape", [(), (0,), (37,), (6, 7), (3, 4, 5)], ids=str)
def test_nonzero_static_truncates_and_pads(device, dtype, size, shape):
    x = make_tensor(shape, dtype, device, density=0.5)
    for fill_value in [-1, 9]:
        got = torch_masked.nonzero_static(x, size=size, fill_value=fill_value)
        expected = torch.nonzero_static(x.cpu(), size=size, fill_value=fill_value)
        assert got.shape == (size, x.dim()) and got.dtype == torch.long
        torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_nonzero_static_large_and_non_contiguous(device):
    x = make_tensor((900, 1200), torch.bool, device, density=0.5).t()
    full = torch.nonzero(x.cpu())
    got = torch_masked.nonzero_static(x, size=600_000, fill_value=-5)
    torch.testing.assert_close(got[: full.shape[0]].cpu(), full, rtol=0, atol=0)
    assert (got[full.shape[0]:] == -5).all()
    torch.testing.assert_close(torch_masked.nonzero_static(x, size=1234).cpu(), full[:1234], rtol=0, atol=0)


def test_nonzero_static_of_size_0_traced_and_compiled():
    x = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    assert torch_masked.nonzero_static(x.to("meta"), size=0).shape == (0, 2)
    compiled = torch.compile(lambda x: torch_masked.nonzero_static(x * 2, size=0) + 1, fullgraph=True)
    torch.testing.assert_close(compiled(x), torch.nonzero_static(x, size=0) + 1, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_nonzero_static_negative_size(device):
    with pytest.raises(ValueError, match=r"nonzero_static: expected size >= 0, got size=-3"):
        torch_masked.nonzero_static(torch.ones(3, device=device), size=-3)


@pytest.mark.cuda
def test_nonzero_static_does_not_synchronise():
    x = make_tensor((1000, 1000), torch.float32, "cuda", density=0.3)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = torch_masked.nonzero_static(x, size=5000)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.testing.assert_close(got.cpu(), torch.nonzero_static(x.cpu(), size=5000), rtol=0, atol=0)


# --- opcheck and torch.compile ---------------------------------------------------------------------


def sample_inputs(device):
    for dtype in [torch.bool, torch.int64, torch.float32, torch.bfloat16, torch.complex64]:
        for shape in [(), (0,), (9,), (4, 5), (2, 0, 3), (2, 3, 2, 2), (1, 2, 1, 2, 3)]:
            yield make_tensor(shape, dtype, device, density=0.5)
    yield non_contiguous(make_tensor((5, 6), torch.float32, device))
    yield make_tensor((3, 4), torch.float32, device).t()


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for x in sample_inputs(device):
        opcheck(torch.ops.masked.nonzero.default, (x,))
        opcheck(torch.ops.masked.nonzero_tuple.default, (x,))
        opcheck(torch.ops.masked.nonzero_static.default, (x,), {"size": 7, "fill_value": -2})


def gather_non_zero(x):
    index = torch_masked.nonzero(x)
    rows = torch_masked.nonzero(x, as_tuple=True)
    static = torch_masked.nonzero_static(x, size=4)
    positive = torch_masked.where(x > 0)  # tf.where's index form, a composite of nonzero
    return x[rows] * 2, index.sum(0), static, positive.sum(0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph(device, dynamic):
    torch._dynamo.reset()
    compiled = torch.compile(gather_non_zero, fullgraph=True, dynamic=dynamic)
    # Empty inputs compile a graph of their own (Dynamo specialises a size
    # of 0), where no element is counted.
    for shape in [(5, 6), (7, 3), (0, 3), (4, 0)]:
        x = make_tensor(shape, torch.float32, device, density=0.5)
        for got, expected in zip(compiled(x), gather_non_zero(x)):
            torch.testing.assert_close(got, expected)
