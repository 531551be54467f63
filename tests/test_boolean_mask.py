"""masked::boolean_mask and masked::boolean_mask_backward against NumPy's
``tensor[mask]`` (with the mask placed at ``axis``) and hand-worked examples
from the reference page."""
import math

import numpy as np
import pytest
import torch

import torch_masked
from tests.common import (
    ALL_DTYPES,
    DEVICES,
    LARGE_SIZES,
    OTHER_DEVICES,
    WIDE_UNSIGNED_DTYPES,
    assert_forward_ad_matches,
    boundary_positions,
    device_name,
    draw,
    make_tensor,
    misaligned,
    non_contiguous,
    random_layout,
    random_shape,
    repeated,
)

boolean_mask_op = torch.ops.masked.boolean_mask.default
backward_op = torch.ops.masked.boolean_mask_backward.default


def random_values(shape, dtype, device):
    # make_tensor's arithmetic is not implemented for the wide unsigned types;
    # their values come from int64.
    source = torch.int64 if dtype in WIDE_UNSIGNED_DTYPES else dtype
    return make_tensor(shape, source, "cpu", density=0.9).to(dtype).to(device)


def random_mask(shape, device, density=0.5):
    return (torch.rand(shape) < density).to(device)


def to_numpy(t):
    """NumPy has no bfloat16: its bits travel as int16."""
    t = t.detach().cpu()
    return t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()


def from_numpy(array, dtype):
    t = torch.from_numpy(np.ascontiguousarray(array))
    return t.view(torch.bfloat16) if dtype == torch.bfloat16 else t


def mask_index(mask, axis, rank):
    start = axis + rank if axis < 0 else axis
    return (slice(None),) * start + (to_numpy(mask),)


def reference(tensor, mask, axis=0):
    """NumPy's tensor[mask] with the mask placed at `axis`."""
    return from_numpy(to_numpy(tensor)[mask_index(mask, axis, tensor.dim())], tensor.dtype)


def backward_reference(grad, mask, input_shape, axis):
    """Zeros of input_shape with grad written at the selected slices."""
    out = np.zeros(input_shape, dtype=to_numpy(grad).dtype)
    out[mask_index(mask, axis, len(input_shape))] = to_numpy(grad)
    return from_numpy(out, grad.dtype)


def assert_same(result, expected):
    assert result.dtype == expected.dtype
    assert result.shape == expected.shape
    assert result.is_contiguous()
    np.testing.assert_array_equal(to_numpy(result), to_numpy(expected))


def assert_forward_and_backward_at_axis_0(tensor, mask, expected_mask=None):
    """boolean_mask(tensor, mask) and its backward equal the references for
    `expected_mask` (the mask itself unless given)."""
    expected_mask = mask if expected_mask is None else expected_mask
    result = boolean_mask_op(tensor, mask)
    assert_same(result, reference(tensor, expected_mask))
    shape = list(tensor.shape)
    assert_same(backward_op(result, mask, shape, 0), backward_reference(result, expected_mask, shape, 0))


@pytest.mark.parametrize("device", DEVICES)
def test_reference_page_examples(device):
    one_d = torch_masked.boolean_mask(
        torch.tensor([0, 1, 2, 3], device=device), np.array([True, False, True, False])
    )
    assert one_d.tolist() == [0, 2]
    two_d = torch_masked.boolean_mask(
        torch.tensor([[1, 2], [3, 4], [5, 6]], device=device), np.array([True, False, True])
    )
    assert two_d.tolist() == [[1, 2], [5, 6]]
    assert torch_masked.boolean_mask(
        torch.tensor([[1, 2], [3, 4], [5, 6]], device=device), [False, True, True], axis=None
    ).tolist() == [[3, 4], [5, 6]]
    # The front door takes array-likes and a 0-d integer tensor as the axis.
    assert torch_masked.boolean_mask([[1, 2], [3, 4]], [False, True], axis=torch.tensor(1)).tolist() == [[2], [4]]
    assert torch_masked.boolean_mask([[1, 2], [3, 4]], [False, True], axis=np.int64(1)).tolist() == [[2], [4]]
    # An axis that is not an integer is refused, not cut to one.
    for axis in (1.0, np.float64(1), torch.tensor(1.0)):
        with pytest.raises(TypeError):
            torch_masked.boolean_mask([[1, 2], [3, 4]], [False, True], axis=axis)


@pytest.mark.parametrize("device", DEVICES)
def test_every_rank_mask_rank_and_axis(device):
    sizes = (3, 4, 2, 5, 3)
    for rank in range(1, 6):
        tensor = random_values(sizes[:rank], torch.float32, device)
        for mask_dims in range(1, rank + 1):
            for start in range(rank - mask_dims + 1):
                mask = random_mask(sizes[start : start + mask_dims], device)
                expected = reference(tensor, mask, start)
                for axis in (start, start - rank):
                    assert_same(boolean_mask_op(tensor, mask, axis), expected)
                    assert_same(torch_masked.boolean_mask(tensor, mask, axis), expected)


# Shapes and axes that reach each way of moving slices: single elements, small
# slices moved as one wide unit or element by element, memcpy runs, several
# chunks of mask positions and several outer blocks.
LAYOUTS = [
    ((1000,), 0, 1),
    ((70_000,), 0, 1),
    ((333, 2), 0, 1),
    ((333, 3), 0, 1),
    ((3, 5, 7), 0, 2),
    ((200, 40), 0, 1),
    ((9, 70_000), 1, 1),
    ((9, 123, 2), 1, 1),
    ((2000, 37), 1, 1),
    ((4, 6, 9, 5), -3, 2),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ALL_DTYPES + WIDE_UNSIGNED_DTYPES, ids=str)
def test_dtypes_and_layouts(device, dtype):
    for shape, axis, mask_dims in LAYOUTS:
        tensor = random_values(shape, dtype, device)
        start = axis % len(shape)
        for density in (0.01, 0.5, 0.99):
            mask = random_mask(shape[start : start + mask_dims], device, density)
            result = boolean_mask_op(tensor, mask, axis)
            assert_same(result, reference(tensor, mask, axis))
            grad = random_values(result.shape, dtype, device)
            assert_same(backward_op(grad, mask, shape, axis), backward_reference(grad, mask, shape, axis))


@pytest.mark.parametrize("device", DEVICES)
def test_random_shapes_axes_dtypes_and_layouts(device):
    """Shapes, mask ranks, axes (either sign), densities, dtypes and memory
    layouts of tensor, mask and gradient drawn at random agree with NumPy,
    forward and backward (the kernels choose how to move slices by them)."""
    g = torch.Generator().manual_seed(9)
    for _ in range(150):
        rank = draw(g, range(1, 6))
        shape = random_shape(g, rank, (0, 1, 2, 3, 5, 8, 33, 600))
        mask_dims = draw(g, range(1, rank + 1))
        start = draw(g, range(rank - mask_dims + 1))
        axis = draw(g, [start, start - rank])
        dtype = draw(g, ALL_DTYPES)
        tensor = random_values(shape, dtype, device)
        mask = random_mask(shape[start : start + mask_dims], device, draw(g, [0.0, 0.05, 0.5, 0.95, 1.0]))
        result = boolean_mask_op(random_layout(tensor, g), random_layout(mask, g), axis)
        assert_same(result, reference(tensor, mask, axis))
        grad = random_values(result.shape, dtype, device)
        assert_same(
            backward_op(random_layout(grad, g), random_layout(mask, g), list(shape), axis),
            backward_reference(grad, mask, shape, axis),
        )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(1000,), (300, 3), (300, 40), (5, 300)], ids=str)
def test_all_true_and_all_false(device, shape):
    tensor = random_values(shape, torch.float32, device)
    axis = 1 if shape == (5, 300) else 0
    for value in (True, False):
        mask = torch.full((shape[axis],), value, device=device)
        result = boolean_mask_op(tensor, mask, axis)
        assert_same(result, tensor if value else reference(tensor, mask, axis))
        assert_same(backward_op(result, mask, shape, axis), tensor if value else torch.zeros_like(tensor))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "one-byte-in"])
@pytest.mark.parametrize("density", [0.01, 0.5, 0.99])
@pytest.mark.parametrize("row_shape", [(), (2,), (5,)], ids=str)
def test_long_masks_whole_and_partial_chunks(device, offset, density, row_shape):
    """Masks of several 512-flag chunks and a partial last one, starting at
    the storage's start (read 16 bytes at a time on CUDA) or one byte in;
    rows of one 4- or 8-byte unit (compacted directly) or of 20 bytes."""
    n = 512 * 7 + 37
    mask = random_mask((n + offset,), device, density)[offset:]
    assert_forward_and_backward_at_axis_0(random_values((n,) + row_shape, torch.float32, device), mask)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("density", [0.01, 0.5, 0.99])
@pytest.mark.parametrize(
    "dtype, row_shape",
    [(torch.int8, ()), (torch.float32, ()), (torch.float32, (2,)), (torch.float64, ()), (torch.complex128, ())],
    ids=str,
)
def test_long_masks_in_several_outer_blocks(device, density, dtype, row_shape):
    """A mask of many chunks, with a partial last one, at axis 1: on CUDA
    each block of the outer dimension is compacted directly when a selected
    slice is one unit of 1 to 16 bytes; forward and backward."""
    n = 512 * 9 + 37
    shape = (3, n) + row_shape
    tensor = random_values(shape, dtype, device)
    mask = random_mask((n,), device, density)
    result = boolean_mask_op(tensor, mask, 1)
    assert_same(result, reference(tensor, mask, 1))
    assert_same(backward_op(result, mask, list(shape), 1), backward_reference(result, mask, list(shape), 1))
    # One element into the storage: 2-byte slices lose their 4-byte alignment.
    base = random_values((3 * n + 1,), torch.int16, device)
    shifted = base[1:].view(3, n)
    assert_same(boolean_mask_op(shifted, mask, 1), reference(shifted, mask, 1))


@pytest.mark.parametrize(("device", "n"), LARGE_SIZES)
@pytest.mark.parametrize("form", ["1-D", "rows", "columns"])
def test_past_int32_elements(device, n, form):
    """n int8 elements past 2**31 (and 2**32), all kept but a few slices,
    among them those holding the elements on both sides of those bounds: 1-D
    (counts, mask positions and offsets past them), [n / 128, 128] rows, and
    [2, n / 2] with the mask at axis 1; then the backward puts every kept
    slice back. The expected values are the kept pieces, concatenated."""
    shape, axis = {"1-D": ((n,), 0), "rows": ((n // 128, 128), 0), "columns": ((2, n // 2), 1)}[form]
    tensor = repeated(torch.arange(127, dtype=torch.int8, device=device), n).view(shape)
    length, inner = shape[axis], n // math.prod(shape[: axis + 1])
    dropped = sorted({p // inner % length for p in boundary_positions(n)})
    mask = torch.ones(length, dtype=torch.bool, device=device)
    mask[dropped] = False
    bounds = [-1, *dropped, length]
    expected = torch.cat([tensor.narrow(axis, a + 1, b - a - 1) for a, b in zip(bounds, bounds[1:])], dim=axis)
    result = boolean_mask_op(tensor, mask, axis)
    assert torch.equal(result, expected)
    del expected
    gradient = backward_op(result, mask, list(shape), axis)
    del result
    assert torch.equal(gradient, tensor.index_fill(axis, torch.tensor(dropped, device=device), 0))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("row_shape", [(), (3,)], ids=str)
@pytest.mark.parametrize("zero_share", [0.2, 0.02])
def test_mask_bytes_other_than_one_are_true(device, row_shape, zero_share):
    """A bool tensor viewed from other bytes can hold 2, 0x80 or 0xff: each
    is true, as for torch's indexing, in the forward and the backward; with
    a fifth of the bytes zero, and with few enough (2%) that the CPU moves
    runs of true positions."""
    n = 1024 * 3 + 5
    gen = torch.Generator().manual_seed(7)
    values = torch.tensor([1, 2, 0x80, 0xFF], dtype=torch.uint8)
    mask_bytes = values[torch.randint(0, len(values), (n,), generator=gen)]
    mask_bytes[torch.rand(n, generator=gen) < zero_share] = 0
    mask = mask_bytes.to(device).view(torch.bool)
    canonical = (mask_bytes != 0).to(device)
    assert_forward_and_backward_at_axis_0(random_values((n,) + row_shape, torch.float32, device), mask, canonical)


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    cases = [
        ((0,), 0, (0,)),
        ((0, 3), 0, (0,)),
        ((5, 0), 0, (5,)),
        ((0, 5), 1, (5,)),
        ((2, 0, 4), 1, (0, 4)),
        ((4, 3, 0), -2, (3,)),
    ]
    for shape, axis, mask_shape in cases:
        tensor = torch.empty(shape, device=device)
        mask = random_mask(mask_shape, device)
        result = boolean_mask_op(tensor, mask, axis)
        assert_same(result, reference(tensor, mask, axis))
        assert_same(backward_op(result, mask, shape, axis), torch.zeros(shape))


@pytest.mark.parametrize("device", DEVICES)
def test_misaligned_storage(device):
    # A contiguous tensor that starts one element into its storage: slices of
    # 4 bytes are not 4-byte aligned there, so they move element by element.
    base = torch.arange(2 * 500 + 1, dtype=torch.int16, device=device)
    tensor = base[1:].view(500, 2)
    mask = random_mask((500,), device)
    assert_same(boolean_mask_op(tensor, mask), reference(tensor, mask))
    grad = base[1 : 1 + 2 * int(mask.sum())].view(-1, 2)
    assert_same(backward_op(grad, mask, [500, 2], 0), backward_reference(grad, mask, [500, 2], 0))


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_tensor_and_mask(device):
    tensor = random_values((6, 7, 8), torch.float64, device)
    mask = random_mask((7, 8), device)
    expected = reference(tensor, mask, 1)
    for t in (non_contiguous(tensor), tensor.transpose(0, 2).contiguous().transpose(0, 2)):
        for m in (non_contiguous(mask), mask.t().contiguous().t()):
            assert not t.is_contiguous() and not m.is_contiguous()
            assert_same(boolean_mask_op(t, m, 1), expected)
    # Expanded (stride-0) tensor and mask.
    row = random_values((1, 8), torch.float32, device).expand(6, 8)
    column_mask = torch.tensor([True, False], device=device).repeat(4)[None].expand(6, 8)
    assert_same(boolean_mask_op(row, column_mask), reference(row, column_mask))
    grad = non_contiguous(random_values((6, int(mask.sum())), torch.float64, device))
    assert_same(backward_op(grad, non_contiguous(mask), [6, 7, 8], 1), backward_reference(grad, mask, [6, 7, 8], 1))


def test_misaligned_tensor():
    # Slices move in units their alignment allows, so even complex128 data
    # 8 bytes off a 16-byte boundary is fine (torch's own kernels fault on it).
    tensor = random_values((10, 3), torch.complex128, "cpu")
    mask = random_mask((10,), "cpu")
    selected = reference(tensor, mask)
    assert_same(boolean_mask_op(misaligned(tensor).view(10, 3), mask), selected)
    grad = misaligned(selected).view(selected.shape)
    assert_same(backward_op(grad, mask, [10, 3], 0), backward_reference(selected, mask, [10, 3], 0))


@pytest.mark.parametrize("device", DEVICES + ["meta"])
def test_errors(device):
    tensor = torch.zeros(3, 4, device=device)
    mask = torch.ones(3, 4, dtype=torch.bool, device=device)
    with pytest.raises(ValueError, match=r"boolean_mask: expected mask of rank >= 1, got a 0-d mask"):
        boolean_mask_op(tensor, torch.tensor(True, device=device))
    with pytest.raises(TypeError, match=r"boolean_mask: expected mask of dtype torch.bool, got torch.float32"):
        boolean_mask_op(tensor, torch.ones(3, device=device))
    with pytest.raises(TypeError, match=r"got torch.uint8"):
        boolean_mask_op(tensor, torch.ones(3, dtype=torch.uint8, device=device))
    # Array-likes that make no tensor: the front door names the argument.
    with pytest.raises(RuntimeError, match=r"^boolean_mask: cannot make a tensor of tensor = None: "):
        torch_masked.boolean_mask(None, mask)
    with pytest.raises(TypeError, match=r"^boolean_mask: cannot make a tensor of mask = 'ab': "):
        torch_masked.boolean_mask(tensor, "ab")
    with pytest.raises(
        ValueError,
        match=r"boolean_mask: expected mask.shape to equal tensor.shape\[0:1\], got mask.shape=\[4\] "
        r"and tensor.shape=\[3, 4\]",
    ):
        boolean_mask_op(tensor, mask[0])
    with pytest.raises(ValueError, match=r"expected mask.shape to equal tensor.shape\[1:2\], got mask.shape=\[3\]"):
        boolean_mask_op(tensor, mask[:, 0], -1)
    with pytest.raises(IndexError, match=r"boolean_mask: expected axis in \[-2, 2\) for tensor.shape of rank 2, got axis=2"):
        boolean_mask_op(tensor, mask[:, 0], 2)
    with pytest.raises(IndexError, match=r"got axis=-3"):
        boolean_mask_op(tensor, mask[:, 0], -3)
    for axis in [1.0, "1", True]:  # a bool refused, as torch refuses it for a dim
        with pytest.raises(TypeError, match=rf"^boolean_mask: expected axis to be an integer, got {axis!r}$"):
            torch_masked.boolean_mask(tensor, mask[0], axis=axis)
    with pytest.raises(ValueError, match=r"expected axis \+ mask.dim\(\) <= 2 \(the rank of tensor.shape\), got axis=-1 \(dimension 1\) and mask.dim\(\)=2"):
        boolean_mask_op(tensor, mask, -1)
    with pytest.raises(ValueError, match=r"expected mask.dim\(\) <= 0 \(the rank of tensor.shape\), got mask.dim\(\)=1"):
        boolean_mask_op(torch.tensor(1.0, device=device), mask[0, :1])

    grad = torch.zeros(2, 4, device=device)
    with pytest.raises(ValueError, match=r"boolean_mask_backward: expected grad of shape \[n, 4\], got \[2, 5\]"):
        backward_op(torch.zeros(2, 5, device=device), mask[:, 0], [3, 4], 0)
    with pytest.raises(ValueError, match=r"boolean_mask_backward: expected grad of shape \[n, 4\], got \[2, 4, 1\]"):
        backward_op(grad[..., None], mask[:, 0], [3, 4], 0)
    with pytest.raises(
        ValueError, match=r"boolean_mask_backward: expected mask.shape to equal input_shape\[0:1\], got mask.shape=\[4\]"
    ):
        backward_op(grad, mask[0], [3, 4], 0)
    with pytest.raises(IndexError, match=r"boolean_mask_backward: expected axis in \[-2, 2\) for input_shape"):
        backward_op(grad, mask[0], [3, 4], 5)
    with pytest.raises(TypeError, match=r"boolean_mask_backward: expected mask of dtype torch.bool"):
        backward_op(grad, torch.ones(3, device=device), [3, 4], 0)
    with pytest.raises(
        ValueError, match=r"boolean_mask_backward: expected non-negative sizes in input_shape, got input_shape=\[3, -1\]"
    ):
        backward_op(torch.zeros(3, 4, device=device), mask[:, 0], [3, -1], 0)


@pytest.mark.cpu_kernel
@pytest.mark.parametrize("device", DEVICES)
def test_backward_checks_the_selected_count(device):
    mask = torch.tensor([True, False, True], device=device)
    if device == "cuda":
        pytest.skip("the CUDA kernel does not synchronise to learn the count; it never reads past grad instead")
    with pytest.raises(ValueError, match=r"expected grad.shape\[0\] to equal the number of true elements of mask, 2, got 3"):
        backward_op(torch.zeros(3, 4, device=device), mask, [3, 4], 0)


@pytest.mark.cuda
@pytest.mark.parametrize("row_shape", [(), (64,), (3,)], ids=str)
def test_cuda_synchronises_in_the_forward_only(row_shape):
    """The forward's one synchronisation (to learn n) is seen by
    torch.cuda.set_sync_debug_mode, as torch's x[mask] is; the backward,
    whose output shape is known, has none. Each row kind: one unit, whole
    16-byte units, and 12-byte slices (the general backward)."""
    tensor = random_values((5000,) + row_shape, torch.float32, "cuda")
    mask = random_mask((5000,), "cuda")
    grad = random_values((int(mask.sum()),) + row_shape, torch.float32, "cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            boolean_mask_op(tensor, mask)
        result = backward_op(grad, mask, list(tensor.shape), 0)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert_same(result, backward_reference(grad, mask, list(tensor.shape), 0))


@pytest.mark.parametrize("other", OTHER_DEVICES)
def test_devices_differ(other):
    tensor = torch.zeros(3, 4, device=other)
    mask = torch.ones(3, dtype=torch.bool)
    with pytest.raises(RuntimeError, match=rf"boolean_mask: expected all tensors on one device, "
                                           rf"got tensor on {device_name(other)}, mask on cpu"):
        boolean_mask_op(tensor, mask)
    with pytest.raises(RuntimeError, match=r"boolean_mask_backward: expected all tensors on one device"):
        backward_op(tensor, mask, [3, 4], 0)


def sample_inputs(device, requires_grad):
    dtype = torch.float64 if requires_grad else torch.float32

    def make(shape):
        return random_values(shape, dtype, device).requires_grad_(requires_grad)

    return [
        (make((10,)), random_mask((10,), device), 0),
        (make((6, 5)), random_mask((6,), device), 0),
        (make((6, 5)), random_mask((5,), device), -1),
        (make((3, 4, 5)), random_mask((4, 5), device), 1),
        (make((3, 4, 5)), random_mask((3, 4), device), -3),
        (make((2, 3, 17)), torch.zeros(3, dtype=torch.bool, device=device), 1),
    ]


def backward_sample_inputs(device, requires_grad):
    samples = []
    for tensor, mask, axis in sample_inputs(device, requires_grad):
        grad = boolean_mask_op(tensor.detach(), mask, axis).requires_grad_(requires_grad)
        samples.append((grad, mask, list(tensor.shape), axis))
    return samples


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck(device, requires_grad):
    for args in sample_inputs(device, requires_grad):
        torch.library.opcheck(torch.ops.masked.boolean_mask.default, args)
    for args in backward_sample_inputs(device, requires_grad):
        torch.library.opcheck(torch.ops.masked.boolean_mask_backward.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_forward_mode_ad(device):
    mask = torch.tensor([True, False, True], device=device)
    assert_forward_ad_matches(lambda t: torch_masked.boolean_mask(t, mask), lambda t: t[mask], torch.ones(3, device=device))
    assert_forward_ad_matches(
        lambda g: backward_op(g, mask, [3], 0),
        lambda g: torch.zeros(3, device=device).index_put((mask,), g),
        torch.ones(2, device=device),
    )


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_and_gradgradcheck(device):
    for tensor, mask, axis in sample_inputs(device, requires_grad=True):
        def fn(t):
            return torch_masked.boolean_mask(t, mask, axis)

        assert torch.autograd.gradcheck(fn, (tensor,))
        assert torch.autograd.gradgradcheck(fn, (tensor,))


@pytest.mark.parametrize("device", DEVICES)
def test_grad_values_and_double_backward(device):
    tensor = random_values((4, 6, 3), torch.float64, device).requires_grad_()
    mask = random_mask((6,), device)
    grad = random_values((4, int(mask.sum()), 3), torch.float64, device).requires_grad_()
    (grad_tensor,) = torch.autograd.grad(torch_masked.boolean_mask(tensor, mask, 1), tensor, grad, create_graph=True)
    assert_same(grad_tensor.detach(), backward_reference(grad.detach(), mask, [4, 6, 3], 1))
    grad_grad = random_values((4, 6, 3), torch.float64, device)
    (second,) = torch.autograd.grad(grad_tensor, grad, grad_grad)
    assert_same(second, reference(grad_grad, mask, 1))


def masked_batch_loss(x, token_mask, step_mask, weight):
    """A loss over the selected tokens of [B, T, D] activations ([B, T] mask,
    axis 0) plus one over the selected time steps ([T] mask, axis 1)."""
    tokens = torch_masked.boolean_mask(x, token_mask)
    steps = torch_masked.boolean_mask(x, step_mask, axis=1)
    return (tokens @ weight).square().sum() + (steps @ weight).tanh().sum()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_training_step(device, dynamic):
    torch._dynamo.reset()
    compiled = torch.compile(masked_batch_loss, fullgraph=True, dynamic=dynamic)
    shapes = [(4, 7, 5), (3, 9, 5)] if dynamic else [(4, 7, 5)]
    # Empty masks: a graph of their own (Dynamo specialises a size of 0),
    # where no element is counted.
    for batch, steps, features in shapes + [(4, 0, 5)]:
        x = random_values((batch, steps, features), torch.float32, device)
        weight = random_values((features, 2), torch.float32, device)
        token_mask = random_mask((batch, steps), device)
        step_mask = random_mask((steps,), device)
        grads = []
        for loss_fn in (masked_batch_loss, compiled):
            inputs = [x.clone().requires_grad_(), weight.clone().requires_grad_()]
            loss = loss_fn(inputs[0], token_mask, step_mask, inputs[1])
            loss.backward()
            grads.append((loss.detach(), inputs[0].grad, inputs[1].grad))
        for eager, compiled_value in zip(*grads):
            torch.testing.assert_close(compiled_value, eager)


@pytest.mark.xfail(
    torch.__version__ >= (2, 14),
    raises=NameError,
    strict=True,
    reason="torch 2.14's Inductor binds no size from a graph input without elements, here the gradient of the "
    "output, whose selected size its backward then names unbound (x[:, mask]'s alike; torch 2.11 binds it)",
)
def test_compiled_backward_into_an_empty_output_of_data_dependent_size():
    """The compiled graph's output itself has no elements and a selected size
    known only at run time, and the gradient flows back into it."""
    torch._dynamo.reset()

    def tripled(x, mask):
        return torch_masked.boolean_mask(x, mask, axis=1) * 3

    compiled = torch.compile(tripled, fullgraph=True, dynamic=False)
    x = torch.randn(0, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([True, False, True])
    result = compiled(x, mask)
    assert result.shape == (0, 2)
    (grad,) = torch.autograd.grad(result, x, torch.ones_like(result))
    torch.testing.assert_close(grad, torch.zeros(0, 3, dtype=torch.float64))


def mask_of_selection(x, mask, second_mask):
    """boolean_mask of a selection by a mask that is itself a selection: to a
    trace, the two lengths are unrelated sizes known only at run time."""
    return torch_masked.boolean_mask(torch_masked.boolean_mask(x, mask), torch_masked.boolean_mask(second_mask, mask))


@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_with_data_dependent_sizes(dynamic):
    torch._dynamo.reset()
    compiled = torch.compile(mask_of_selection, fullgraph=True, dynamic=dynamic)
    for seed in (0, 1):
        torch.manual_seed(seed)
        x = torch.randn(6, 5, 3, requires_grad=True)
        mask, second_mask = random_mask((6, 5), "cpu"), random_mask((6, 5), "cpu")
        result = compiled(x, mask, second_mask)
        (grad,) = torch.autograd.grad(result.square().sum(), x)
        both = mask & second_mask
        torch.testing.assert_close(result, x[both])
        torch.testing.assert_close(grad, torch.where(both[..., None], 2 * x, 0.0))


def test_compiled_mismatched_data_dependent_sizes_raise():
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda x, mask, other: torch_masked.boolean_mask(torch_masked.boolean_mask(x, mask), other), fullgraph=True
    )
    x = torch.arange(4.0)
    mask = torch.tensor([True, False, True, True])
    torch.testing.assert_close(compiled(x, mask, torch.tensor([False, True, True])), torch.tensor([2.0, 3.0]))
    with pytest.raises(ValueError, match=r"expected mask.shape to equal tensor.shape\[0:1\], got mask.shape=\[2\]"):
        compiled(x, mask, torch.tensor([True, False]))
