"""Shared parameters and helpers for the op tests."""

import contextlib
import math

import pytest
import torch

# Every test that takes `device` runs on the CPU and, where there is a GPU, on CUDA.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
# A device to put beside the CPU for the device-mismatch errors: every kernel,
# fake ones included, checks devices before touching data, so meta tensors
# reach the check on every machine.
OTHER_DEVICES = ["meta", pytest.param("cuda", marks=pytest.mark.cuda)]

INTEGER_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
# Unsigned types torch.nonzero itself does not take; NumPy is their reference.
WIDE_UNSIGNED_DTYPES = [torch.uint16, torch.uint32, torch.uint64]
FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
COMPLEX_DTYPES = [torch.complex64, torch.complex128]
# The dtypes every op takes (README, "What each op does"): bool, the integer types, half, bfloat16, float, double, complex.
ALL_DTYPES = [torch.bool] + INTEGER_DTYPES + FLOAT_DTYPES + COMPLEX_DTYPES


# (device, n) past 2**31 elements (n a multiple of 256), marked `large`:
# counts and offsets beyond int32's range, where a kernel counting or
# indexing in 32 bits would wrap; a quarter past it, so that the parts the
# CPU kernels split their work into start past it too. The CUDA kernels
# switch from 32-bit to 64-bit index math past 2**32 elements, so on CUDA
# that size is tested as well; on the CPU (every offset 64-bit) it would take
# more memory than a CI machine has. Each test holds a few tensors of n bytes.
PAST_INT32 = 2**31 + 2**29
PAST_UINT32 = 2**32 + 256
LARGE_SIZES = [
    pytest.param("cpu", PAST_INT32, marks=pytest.mark.large, id="cpu-2**31+2**29"),
    pytest.param("cuda", PAST_INT32, marks=[pytest.mark.large, pytest.mark.cuda], id="cuda-2**31+2**29"),
    pytest.param("cuda", PAST_UINT32, marks=[pytest.mark.large, pytest.mark.cuda], id="cuda-2**32+256"),
]


def boundary_positions(n):
    """Positions on both sides of 2**31 and 2**32 (those below n) and at the ends."""
    return sorted({p for p in (0, 5, 2**31 - 1, 2**31, 2**31 + 7, 2**32 - 1, 2**32, 2**32 + 9, n - 1) if p < n})


def repeated(pattern, n):
    """n values cycling through the 1-D `pattern` (of an odd length, so that an
    offset wrapped by 2**32 lands on a different value), built without any
    int64 tensor of n elements."""
    return pattern.repeat(n // pattern.numel() + 1)[:n]


def device_name(device):
    """How the error messages print a device ("cuda" prints as "cuda:0")."""
    return str(torch.empty(0, device=device).device)


@contextlib.contextmanager
def deterministic_algorithms():
    """torch.use_deterministic_algorithms(True) for the block."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def make_tensor(shape, dtype, device, density=0.5, generator=None):
    """Random values with about `density` of them non-zero (never all zeros by accident)."""
    keep = torch.rand(shape, generator=generator) < density
    if dtype == torch.bool:
        values = keep
    elif dtype.is_complex:
        values = torch.complex(torch.randn(shape, generator=generator), torch.randn(shape, generator=generator))
        values = values.to(dtype) * keep
    elif dtype.is_floating_point:
        values = (torch.randn(shape, generator=generator) + 0.5).to(dtype) * keep
    else:
        values = torch.randint(1, 100, shape, generator=generator).to(dtype) * keep
    return values.to(device)


def non_contiguous(t):
    """The same values as `t` in a transposed, strided layout (a genuine view)."""
    if t.dim() == 0:
        return t
    padded = torch.stack([t, torch.zeros_like(t)], dim=-1).select(-1, 0)
    assert not padded.is_contiguous() or t.numel() <= 1
    return padded


def assert_forward_ad_matches(ours, native, primal):
    """ours(dual) and native(dual), with a random forward-mode tangent on
    `primal` (torch.autograd.forward_ad), give the same value and tangent."""
    import torch.autograd.forward_ad as fwAD

    gen = torch.Generator().manual_seed(0)
    tangent = torch.randn(primal.shape, dtype=primal.dtype, generator=gen).to(primal.device)
    results = []
    for fn in (ours, native):
        with fwAD.dual_level():
            out = fwAD.unpack_dual(fn(fwAD.make_dual(primal, tangent)))
            assert out.tangent is not None
            results.append((out.primal, out.tangent))
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)


def misaligned(values):
    """A 1-D CPU tensor holding `values` whose data lies 8 bytes past a
    16-byte boundary, as torch.frombuffer makes from a buffer at such an
    offset. The bytes are copied as bytes: torch's own copy of 16-byte
    elements into such memory faults."""
    nbytes = values.numel() * values.element_size()
    storage = torch.zeros(nbytes + 16, dtype=torch.uint8)  # CPU allocations are 64-byte aligned
    t = torch.frombuffer(storage.numpy(), dtype=values.dtype, count=values.numel(), offset=8)
    t.view(torch.uint8).copy_(values.reshape(-1).view(torch.uint8))
    assert t.data_ptr() % 16 == 8
    return t


def draw(generator, choices):
    """One of `choices`, drawn with `generator`."""
    return choices[int(torch.randint(len(choices), (), generator=generator))]


def random_shape(generator, rank, sizes, max_numel=20_000):
    """A shape of `rank` dimensions drawn from `sizes`, of at most `max_numel`
    elements with its sizes of 0 counted as 1 (an empty tensor's mask or
    indices may still be as large as the other sizes make them)."""
    while True:
        shape = tuple(draw(generator, sizes) for _ in range(rank))
        if math.prod(max(size, 1) for size in shape) <= max_numel:
            return shape


def random_layout(t, generator):
    """The values of `t` in a memory layout drawn at random: contiguous;
    contiguous but a few elements into its storage (off the alignment that
    vector loads want); or strided, with its dimensions stored in a random
    order and every other element along some of them. The kernels pick their
    paths by layout; the values they give must not depend on it."""
    kind = draw(generator, ["contiguous", "offset", "strided", "strided"])
    if kind == "contiguous":
        return t.clone()
    dims = t.dim()
    order = torch.randperm(dims, generator=generator).tolist() if kind == "strided" else list(range(dims))
    steps = [draw(generator, [1, 2]) if kind == "strided" else 1 for _ in range(dims)]
    offset = draw(generator, [1, 2, 3] if kind == "offset" else [0, 1, 3])
    stored = [t.shape[d] * steps[d] for d in order]
    storage = torch.zeros(offset + math.prod(stored), dtype=t.dtype, device=t.device)
    view = storage[offset:].view(stored)[tuple(slice(None, None, steps[d]) for d in order)]
    view = view.permute([order.index(d) for d in range(dims)])
    view.copy_(t)
    return view
