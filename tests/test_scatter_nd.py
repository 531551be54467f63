"""masked::scatter_nd, masked::gather_nd, masked::tensor_scatter_nd_add (and its
in-place form, masked::tensor_scatter_nd_add_) against ATen references
(index_put_(accumulate=True), advanced indexing), NumPy's np.add.at and the
tf.scatter_nd / tf.gather_nd reference examples."""
import contextlib
import itertools
import math
import re

import numpy as np
import pytest
import torch

import torch_masked
from tests.common import (
    ALL_DTYPES,
    DEVICES,
    LARGE_SIZES,
    OTHER_DEVICES,
    assert_forward_ad_matches,
    boundary_positions,
    deterministic_algorithms,
    device_name,
    draw,
    misaligned,
    non_contiguous,
    random_layout,
    random_shape,
    repeated,
)

INDEX_DTYPES = [torch.int32, torch.int64]
# (shape, K) for every K from 0 to the rank of each shape.
SHAPES_AND_DEPTHS = [(shape, k) for shape in [(), (5,), (4, 3), (3, 2, 4)] for k in range(len(shape) + 1)]
BATCH_SHAPES = [(), (6,), (2, 3)]


def wide_dtype(dtype):
    """Where the reference sums: exact for integers and bool, float64/complex128 for floating types."""
    if dtype.is_complex:
        return torch.complex128
    if dtype.is_floating_point:
        return torch.float64
    return torch.int64


def small_values(shape, dtype, gen, whole=False):
    """Values small enough that sums of a few never overflow the narrow integer
    types; `whole`: small integers in every dtype, so that float sums of up to
    about 80 of them are exact in any order, even in bfloat16."""
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) < 0.3
    if dtype.is_complex and not whole:
        return torch.complex(torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)).to(dtype)
    if dtype.is_floating_point and not whole:
        return torch.randn(shape, generator=gen).to(dtype)
    low = 0 if dtype == torch.uint8 else -3
    return torch.randint(low, 4, shape, generator=gen).to(dtype)


def random_indices(batch, shape, k, gen, index_dtype=torch.int64, duplicates=True):
    """Indices of shape batch + [k] within shape[:k]; `duplicates` draws from few
    distinct rows so that most repeat."""
    rows = int(np.prod(batch, dtype=np.int64))
    columns = []
    for j in range(k):
        high = min(shape[j], 2) if duplicates else shape[j]
        columns.append(torch.randint(0, high, (rows,), generator=gen))
    flat = torch.stack(columns, dim=1) if k else torch.zeros(rows, 0, dtype=torch.int64)
    return flat.reshape(*batch, k).to(index_dtype)


def reference_scatter(indices, updates, shape, base=None):
    """tensor_scatter_nd_add (scatter_nd when base is None) through index_put_(accumulate=True)."""
    dtype = updates.dtype
    k = indices.shape[-1]
    rows = indices.reshape(int(np.prod(indices.shape[:-1], dtype=np.int64)), k).long().cpu()
    values = updates.cpu().reshape(rows.shape[0], *shape[k:]).to(wide_dtype(dtype))
    out = torch.zeros(shape, dtype=values.dtype) if base is None else base.cpu().to(values.dtype, copy=True)
    if k == 0:
        out += values.sum(0)
    else:
        out.index_put_(tuple(rows.t()), values, accumulate=True)
    return (out != 0) if dtype == torch.bool else out.to(dtype)


def reference_gather(params, indices):
    k = indices.shape[-1]
    params, indices = params.cpu(), indices.cpu().long()
    if k == 0:
        return params.expand(tuple(indices.shape[:-1]) + tuple(params.shape)).clone()
    return params[tuple(indices[..., j] for j in range(k))]


def assert_same(actual, expected, loose=False):
    """Equal for integers and bool, close for floating types (`loose` for long float32 sums)."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    actual = actual.cpu()
    if expected.dtype.is_floating_point or expected.dtype.is_complex:
        tolerance = 1e-3 if loose else 1e-5
        torch.testing.assert_close(actual, expected, rtol=tolerance, atol=tolerance)
    else:
        assert torch.equal(actual, expected)


def assert_scatter_matches(actual, indices, updates, shape, base=None, loose=False):
    """actual is tensor_scatter_nd_add(base, indices, updates) (scatter_nd when
    base is None). float16 and bfloat16 sums are made in float32 and rounded
    once, on every device and path: each element within half a unit in the
    last place of the exact sum (or of the smallest subnormal), plus what
    float32 sums in any order may stray, 2 * (adds + 1) * 2**-24 * (|base| +
    sum of |updates|), adds the number of updates summed into it."""
    expected = reference_scatter(indices, updates, shape, base)
    if updates.dtype not in (torch.float16, torch.bfloat16):
        assert_same(actual, expected, loose)
        return
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    wide_base = None if base is None else base.double()
    exact = reference_scatter(indices, updates.double(), shape, wide_base)
    adds = reference_scatter(indices, torch.ones_like(updates, dtype=torch.float64), shape)
    magnitude = reference_scatter(indices, updates.double().abs(), shape, None if base is None else wide_base.abs())
    info = torch.finfo(updates.dtype)
    rounding = info.eps / 2 * torch.maximum(exact.abs(), torch.tensor(info.smallest_normal, dtype=torch.float64))
    bound = rounding + 2 * (adds + 1) * 2**-24 * magnitude
    error = (actual.cpu().double() - exact).abs()
    assert (error <= bound).all(), f"error past its bound by up to {(error - bound).max().item()}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_values_every_depth_and_batch_rank(device, dtype, index_dtype):
    gen = torch.Generator().manual_seed(1)
    for (shape, k), batch, duplicates in itertools.product(SHAPES_AND_DEPTHS, BATCH_SHAPES, (True, False)):
        indices = random_indices(batch, shape, k, gen, index_dtype, duplicates)
        updates = small_values(list(batch) + list(shape[k:]), dtype, gen)
        base = small_values(shape, dtype, gen)
        indices_d, updates_d, base_d = indices.to(device), updates.to(device), base.to(device)
        assert_scatter_matches(torch_masked.scatter_nd(indices_d, updates_d, shape), indices, updates, shape)
        assert_scatter_matches(
            torch_masked.tensor_scatter_nd_add(base_d, indices_d, updates_d), indices, updates, shape, base
        )
        into = base_d.clone()
        torch.ops.masked.tensor_scatter_nd_add_(into, indices_d, updates_d)
        assert_scatter_matches(into, indices, updates, shape, base)
        assert_same(torch_masked.gather_nd(base_d, indices_d), reference_gather(base, indices))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_larger_inputs_match_references(device, dtype):
    """Big enough that the CPU splits the work among threads (by slots, and by
    columns when there are few slots). Up to 50 updates land on one element:
    bfloat16 takes whole numbers, whose sums no order of adding rounds."""
    gen = torch.Generator().manual_seed(2)
    cases = [((50_000,), 1, 80_000), ((300, 700), 1, 900), ((1, 40_000), 1, 50), ((6, 7, 900), 2, 500), ((40, 900), 0, 30)]
    whole = dtype == torch.bfloat16
    for shape, k, rows in cases:
        indices = random_indices((rows,), shape, k, gen, duplicates=False)
        updates = small_values([rows] + list(shape[k:]), dtype, gen, whole)
        base = small_values(shape, dtype, gen, whole)
        indices_d, updates_d = indices.to(device), updates.to(device)
        assert_same(torch_masked.scatter_nd(indices_d, updates_d, shape), reference_scatter(indices, updates, shape))
        assert_same(
            torch_masked.tensor_scatter_nd_add(base.to(device), indices_d, updates_d),
            reference_scatter(indices, updates, shape, base),
        )
        assert_same(torch_masked.gather_nd(base.to(device), indices_d), reference_gather(base, indices))


@pytest.mark.cpu_kernel
@pytest.mark.parametrize("width", [1, 3])
def test_cpu_sums_in_index_order_like_numpy_add_at(width):
    """Each destination adds its updates in index order, for elements
    (width 1) and slices: float32 results are bitwise np.add.at's, and
    bfloat16 ones are float32 sums rounded once; into zeros, into a base
    tensor, and into that tensor in place, by one block and by two."""
    gen = torch.Generator().manual_seed(3)
    n = 200_000 // width
    shape = [1000] if width == 1 else [1000, width]
    idx = torch.randint(0, 1000, (n,), generator=gen)
    upd = torch.randn([n] + shape[1:], generator=gen)
    base = torch.randn(shape, generator=gen)
    expected = np.zeros(shape, np.float32)
    np.add.at(expected, idx.numpy(), upd.numpy())
    expected_with_base = base.numpy().copy()
    np.add.at(expected_with_base, idx.numpy(), upd.numpy())
    expected_bf16_with_base = base.bfloat16().float().numpy()
    np.add.at(expected_bf16_with_base, idx.numpy(), upd.bfloat16().float().numpy())
    # A row out of bounds, dropped with check_bounds=False.
    bad_idx = torch.cat([idx[:5], torch.tensor([1000]), idx[5:]])
    bad_upd = torch.cat([upd[:5], torch.full([1] + shape[1:], 7.0), upd[5:]])
    for threads in (1, 2, 4):  # elements: one block, one block, two blocks
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            ours = torch_masked.scatter_nd(idx.unsqueeze(1), upd, shape)
            ours_bf16 = torch_masked.scatter_nd(idx.unsqueeze(1), upd.bfloat16(), shape)
            with_base = torch_masked.tensor_scatter_nd_add(base, idx.unsqueeze(1), upd)
            bf16_with_base = torch_masked.tensor_scatter_nd_add(base.bfloat16(), idx.unsqueeze(1), upd.bfloat16())
            bf16_in_place = base.bfloat16()
            torch.ops.masked.tensor_scatter_nd_add_(bf16_in_place, idx.unsqueeze(1), upd.bfloat16())
            dropped = torch_masked.scatter_nd(bad_idx.unsqueeze(1), bad_upd, shape, check_bounds=False)
            with pytest.raises(IndexError, match=r"got \[1000\] at indices\[5\]"):
                torch_masked.scatter_nd(bad_idx.unsqueeze(1), bad_upd, shape)
        finally:
            torch.set_num_threads(previous)
        assert torch.equal(ours, torch.from_numpy(expected))
        assert torch.equal(dropped, ours)
        expected_bf16 = np.zeros(shape, np.float32)
        np.add.at(expected_bf16, idx.numpy(), upd.bfloat16().float().numpy())
        assert torch.equal(ours_bf16, torch.from_numpy(expected_bf16).bfloat16())
        assert torch.equal(with_base, torch.from_numpy(expected_with_base))
        assert torch.equal(bf16_with_base, torch.from_numpy(expected_bf16_with_base).bfloat16())
        assert torch.equal(bf16_in_place, bf16_with_base)


@pytest.mark.cpu_kernel
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_cpu_elements_summed_by_ranges_as_in_index_order(dtype):
    """Element updates into more than 2**21 elements, and half/bfloat16 ones
    few beside the output, are summed range by range (ranges of 2**15, the
    last one short, the rows sorted into them in parts, one per thread):
    each destination is its base (or zero) plus its updates in index order
    in float32, rounded once, bitwise as np.add.at in float32 gives it; a
    bad row is dropped, or reported by its own position. (float32 takes the
    ranges only in the last case.)"""
    gen = torch.Generator().manual_seed(11)
    cases = [([1_200_007], 140_000), ([1100, 1093], 140_000), ([2**21 + 5], 2**20)]
    for shape, rows in cases:
        k = len(shape)
        indices = torch.stack([torch.randint(0, size, (rows,), generator=gen) for size in shape], dim=1)
        updates = torch.randn(rows, generator=gen).to(dtype)
        updates[:50] = -0.0  # a destination whose only update is -0.0 comes out +0.0
        # Three updates of one destination, the first in the first part of
        # the rows, the others in later parts (at 2 and 4 threads): in index
        # order 2**-10 is lost in 2**15 and the sum is 0; in another order it
        # may be 2**-10.
        trio = [10, rows * 5 // 8, rows * 7 // 8]
        indices[trio[1:]] = indices[trio[0]].clone()
        updates[trio] = torch.tensor([2.0**-10, 2.0**15, -(2.0**15)]).to(dtype)
        base = torch.randn(shape, generator=gen).to(dtype)
        flat = np.ravel_multi_index(tuple(indices.t().numpy()), shape)
        expected = np.zeros(int(np.prod(shape)), np.float32)
        np.add.at(expected, flat, updates.float().numpy())
        expected_with_base = base.float().numpy().ravel().copy()
        np.add.at(expected_with_base, flat, updates.float().numpy())
        bad_row = rows * 3 // 4  # in the second part of the rows when there are two
        bad_indices = indices.clone()
        bad_indices[bad_row, k - 1] = shape[-1]
        kept = np.arange(rows) != bad_row
        expected_dropped = np.zeros_like(expected)
        np.add.at(expected_dropped, flat[kept], updates.float().numpy()[kept])
        for threads in (1, 2, 4):
            previous = torch.get_num_threads()
            torch.set_num_threads(threads)
            try:
                out = torch_masked.scatter_nd(indices, updates, shape)
                with_base = torch_masked.tensor_scatter_nd_add(base, indices, updates)
                dropped = torch_masked.scatter_nd(bad_indices, updates, shape, check_bounds=False)
                with pytest.raises(IndexError, match=rf"at indices\[{bad_row}\]"):
                    torch_masked.scatter_nd(bad_indices, updates, shape)
            finally:
                torch.set_num_threads(previous)
            assert torch.equal(out.view(torch.int16), torch.from_numpy(expected).to(dtype).view(shape).view(torch.int16))
            assert torch.equal(with_base, torch.from_numpy(expected_with_base).to(dtype).view(shape))
            assert torch.equal(dropped, torch.from_numpy(expected_dropped).to(dtype).view(shape))


@pytest.mark.parametrize("width", [1, 3])
def test_cpu_negative_zero_updates_sum_to_positive_zero(width):
    """As in a zeroed output that the updates are added to (index_put_'s
    accumulate): 0.0 + -0.0 is +0.0. tensor_scatter_nd_add keeps a -0.0 of
    the tensor that nothing is added to."""
    shape = [4] if width == 1 else [4, width]
    updates = torch.full([2] + shape[1:], -0.0)
    indices = torch.tensor([[1], [1]])
    expected_signs = torch.zeros(shape).index_put_((indices[:, 0],), updates, accumulate=True).signbit()
    for dtype in (torch.float32, torch.bfloat16):
        out = torch_masked.scatter_nd(indices, updates.to(dtype), shape)
        assert torch.equal(out.signbit(), expected_signs) and not out.signbit().any()
        base = torch.full(shape, -0.0, dtype=dtype)
        out = torch_masked.tensor_scatter_nd_add(base, indices, updates.to(dtype))
        assert out.signbit().all()  # -0.0 + -0.0 + -0.0 and untouched -0.0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cpu_half_slices_round_like_sums_into_zeros(dtype):
    """Half and bfloat16 slices: a slot that receives one row gets that row
    summed into zero and rounded, bit for bit as index_put_ gives it (-0.0
    becomes +0.0), NaN where it gives NaN (the payload bits of a NaN are not
    promised: torch's own conversions differ in them by CPU)."""
    nan_with_payload = 0x7F81 if dtype == torch.bfloat16 else 0x7C01
    bits = [0x8000, nan_with_payload, nan_with_payload | 0x8000, 0x0001, 0x3C00]
    special = torch.tensor(bits, dtype=torch.int32).to(torch.int16)  # wraps to the 16-bit patterns
    rows = torch.randn(6, 5, generator=torch.Generator().manual_seed(7)).to(dtype)
    rows[2] = special.view(dtype)  # a slot's only row
    rows[3, 0] = -0.0
    rows[4] = special.flip(0).view(dtype)  # summed with row 5 into one slot
    indices = torch.tensor([[0], [2], [3], [5], [6], [6]])  # slots 1 and 4 get nothing
    expected = torch.zeros(7, 5, dtype=dtype).index_put_((indices[:, 0],), rows, accumulate=True)
    out = torch_masked.scatter_nd(indices, rows, [7, 5])
    nan = expected.isnan()
    assert torch.equal(out.isnan(), nan) and nan[3].sum() == 2 and nan[6].sum() == 2
    assert torch.equal(out[~nan].view(torch.int16), expected[~nan].view(torch.int16))
    assert not out[3, 0].signbit() and not out[5, 0].signbit()  # each a -0.0 that was a slot's one row


# On CUDA, in deterministic mode, float32/half/bfloat16 outputs of up to
# 2**22 elements take the fixed-point path, larger ones and the other types
# the sorted one; half and bfloat16 take those two paths in any mode.
FIXED_POINT_MAX_ELEMENTS = 2**22


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("size", [8, FIXED_POINT_MAX_ELEMENTS + 16], ids=["fixed_point", "sorted"])
def test_half_sums_with_many_updates_round_once(device, dtype, size):
    """5000 updates, 90% of them on one destination, in any mode: the sums
    are the exact ones rounded once. Whole numbers, whose float32 sums are
    exact: added in dtype one at a time, a bfloat16 sum of ones stops at 256
    (256 + 1 rounds back to 256) and a float16 one at 2048. So gather_nd's
    gradient at a row gathered many times is the sum of its gradients."""
    gen = torch.Generator().manual_seed(12)
    rows = 5000
    indices = torch.randint(1, 8, (rows, 1), generator=gen)
    indices[torch.rand(rows, generator=gen) < 0.9] = 0
    updates = torch.randint(-1, 3, (rows,), generator=gen).to(dtype)
    ones = torch.ones(rows, dtype=dtype)
    base = torch.randint(-3, 4, (size,), generator=gen).to(dtype)
    indices_d, updates_d = indices.to(device), updates.to(device)

    def exact(values, start=None):
        wide = torch.zeros(size, dtype=torch.float64) if start is None else start.double()
        return wide.index_add(0, indices[:, 0], values.double()).to(dtype)

    assert exact(ones)[0] > 4000
    for deterministic in (False, True):
        with deterministic_algorithms() if deterministic else contextlib.nullcontext():
            scattered = torch_masked.scatter_nd(indices_d, updates_d, [size])
            counted = torch_masked.scatter_nd(indices_d, ones.to(device), [size])
            added = torch_masked.tensor_scatter_nd_add(base.to(device), indices_d, updates_d)
            params = torch.zeros(size, dtype=dtype, device=device, requires_grad=True)
            torch_masked.gather_nd(params, indices_d).backward(updates_d)
        assert torch.equal(scattered.cpu(), exact(updates))
        assert torch.equal(counted.cpu(), exact(ones))
        assert torch.equal(added.cpu(), exact(updates, base))
        assert torch.equal(params.grad.cpu(), exact(updates))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.complex64, torch.float64])
def test_deterministic_mode_is_bitwise_reproducible(device, dtype):
    gen = torch.Generator().manual_seed(4)
    cases = [((1000,), 1, 100_000), ((50, 64), 1, 5000), ((20, 30), 2, 30_000), ((7, 5), 0, 2000),
             ((FIXED_POINT_MAX_ELEMENTS + 16,), 1, 3000)]
    before = torch.are_deterministic_algorithms_enabled()
    with deterministic_algorithms():
        for shape, k, rows in cases:
            indices = random_indices((rows,), shape, k, gen, duplicates=False).to(device)
            if rows < shape[0]:  # many rows on few destinations, the rest spread out
                indices[: rows // 2] = indices[: rows // 2] % 7
            updates = small_values([rows] + list(shape[k:]), dtype, gen).to(device)
            first = torch_masked.scatter_nd(indices, updates, shape)
            second = torch_masked.scatter_nd(indices, updates, shape)
            assert torch.equal(first, second)
            assert_scatter_matches(first, indices, updates, shape, loose=True)
    assert torch.are_deterministic_algorithms_enabled() == before


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_deterministic_mode_special_values_as_in_index_order(device, dtype):
    """Infinities, NaN, signed zeros and a large value cancelling around a
    small one give what adding in index order gives (the CPU's sums)."""
    big = 1e4 if dtype == torch.float16 else 1e30
    inf, nan = float("inf"), float("nan")
    rows = [(0, inf), (0, 1.0), (1, inf), (1, -inf), (2, nan), (2, 1.0), (3, -inf), (3, -1.0),
            (4, -0.0), (4, -0.0), (5, big), (5, 1.0), (5, -big), (6, -0.0), (7, 2.5)]
    indices = torch.tensor([[slot] for slot, _ in rows])
    updates = torch.tensor([value for _, value in rows], dtype=dtype)
    base = torch.tensor([0.0, 0.0, 0.0, 0.0, -0.0, 0.0, 0.0, -0.0, -0.0], dtype=dtype)  # slot 8: untouched

    def sums_in_index_order(start):
        sums = start.to(torch.float32, copy=True)
        for (slot, _), value in zip(rows, updates.float()):
            sums[slot] = sums[slot] + value  # float32 arithmetic, rounded to dtype once
        return sums.to(dtype)

    expected = sums_in_index_order(base)
    assert expected.isnan().tolist() == [False, True, True] + [False] * 6
    # scatter_nd: the same sums into zeros (-0.0 updates alone give +0.0, as
    # adding them to 0.0 does; slot 8 stays 0), its output never zeroed first
    # on CUDA's fixed-point path.
    for start, want in [(base, expected), (None, sums_in_index_order(torch.zeros(9)))]:
        with deterministic_algorithms():
            if start is None:
                out = torch_masked.scatter_nd(indices.to(device), updates.to(device), [9]).cpu()
            else:
                out = torch_masked.tensor_scatter_nd_add(start.to(device), indices.to(device), updates.to(device)).cpu()
        torch.testing.assert_close(out, want, rtol=0, atol=0, equal_nan=True)
        finite = ~want.isnan()
        assert torch.equal(out[finite].signbit(), want[finite].signbit())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("size", [8, FIXED_POINT_MAX_ELEMENTS + 16], ids=["fixed_point", "sorted"])
def test_deterministic_mode_extremes_as_in_index_order(device, dtype, size):
    """Sums at the edges of the range, worked by hand in index order:
    0: base +inf, then -max twice: +inf (a sum of the updates alone would
       overflow to -inf and meet the base as NaN);
    1: base -inf, then +max twice: -inf;
    2: 2**20 updates of +max: +inf;
    3: 2**20 updates alternating +max and -max: +0.0;
    4: subnormals only, 3 and 5 times the smallest: 8 times it, exactly."""
    info = torch.finfo(dtype)
    tiny = float(torch.nextafter(torch.tensor(0.0, dtype=dtype), torch.tensor(1.0, dtype=dtype)))
    big, many = info.max, 2**20
    slots = [0, 0, 1, 1] + [2] * many + [3] * many + [4, 4]
    values = [-big, -big, big, big] + [big] * many + [big, -big] * (many // 2) + [3 * tiny, 5 * tiny]
    indices = torch.tensor(slots).unsqueeze(1)
    updates = torch.tensor(values, dtype=dtype)
    assert updates[-1] == 5 * tiny and updates[-1] > 0  # representable subnormals
    base = torch.zeros(size, dtype=dtype)
    base[0], base[1] = float("inf"), float("-inf")
    with deterministic_algorithms():
        out = torch_masked.tensor_scatter_nd_add(base.to(device), indices.to(device), updates.to(device))
    expected = [float("inf"), float("-inf"), float("inf"), 0.0, 8 * tiny]
    assert out[:5].cpu().tolist() == expected
    assert not out[3].signbit()
    assert not out[5:].any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex128])
@pytest.mark.parametrize("slice_size", [1, 3])
def test_deterministic_mode_hot_destination(device, dtype, slice_size):
    """80% of 100 000 updates on one destination, the rest spread out, into
    an output larger than the fixed-point path takes: on CUDA the sorted
    path, where that destination's run spans many chunks of sorted rows.
    Integer values, so that every order of adding gives the exact sum."""
    gen = torch.Generator().manual_seed(6)
    rows = 100_000
    shape = [FIXED_POINT_MAX_ELEMENTS // slice_size + 16, slice_size]
    indices = torch.randint(0, shape[0], (rows, 1), generator=gen)
    indices[torch.rand(rows, generator=gen) < 0.8] = 3
    updates = torch.randint(-50, 50, (rows, slice_size), generator=gen).to(dtype)
    with deterministic_algorithms():
        out = torch_masked.scatter_nd(indices.to(device), updates.to(device), shape).cpu()
    wide = torch.complex128 if dtype.is_complex else torch.float64
    exact = torch.zeros(shape, dtype=wide).index_add_(0, indices[:, 0], updates.to(wide))
    assert torch.equal(out, exact.to(dtype))


@pytest.mark.cuda
def test_cuda_fixed_point_sums_are_accurate():
    """100 000 positive float32 updates of magnitudes 2**-12 to 2**12 into four
    destinations: the fixed-point sums, alone and onto a base, are within
    float32's rounding of the exact sums, where adding in any order in float32
    strays further."""
    gen = torch.Generator().manual_seed(5)
    rows = 100_000
    updates = torch.rand(rows, generator=gen) * torch.exp2(torch.randint(-12, 13, (rows,), generator=gen).float())
    indices = torch.randint(0, 4, (rows, 1), generator=gen)
    exact = torch.zeros(4, dtype=torch.float64).index_add_(0, indices[:, 0], updates.double())
    base = torch.tensor([1e4, -1e4, 0.5, 3.0])
    with deterministic_algorithms():
        out = torch_masked.scatter_nd(indices.cuda(), updates.cuda(), [4]).cpu()
        onto_base = torch_masked.tensor_scatter_nd_add(base.cuda(), indices.cuda(), updates.cuda()).cpu()
    torch.testing.assert_close(out.double(), exact, rtol=2**-23, atol=0)
    torch.testing.assert_close(onto_base.double(), exact + base.double(), rtol=2**-23, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_reference_page_examples(device):
    indices = torch.tensor([[4], [3], [1], [7]], device=device)
    updates = torch.tensor([9, 10, 11, 12], device=device)
    assert torch_masked.scatter_nd(indices, updates, [8]).tolist() == [0, 11, 0, 10, 9, 0, 0, 12]

    slices = [[5, 5, 5, 5], [6, 6, 6, 6], [7, 7, 7, 7], [8, 8, 8, 8]]
    zeros = [[0] * 4] * 4
    out = torch_masked.scatter_nd(
        torch.tensor([[0], [2]], device=device), torch.tensor([slices, slices], device=device), torch.Size([4, 4, 4])
    )
    assert out.tolist() == [slices, zeros, slices, zeros]

    # "identical to tensor_scatter_add(tf.zeros(shape, values.dtype), indices, values)"
    base = torch.arange(1, 9, device=device)
    assert torch_masked.tensor_scatter_nd_add(base, indices, updates).tolist() == [1, 13, 3, 14, 14, 6, 7, 20]
    assert torch.equal(
        torch_masked.tensor_scatter_nd_add(torch.zeros(8, dtype=torch.int64, device=device), indices, updates),
        torch_masked.scatter_nd(indices, updates, (8,)),
    )
    # gather_nd, the inverse.
    params = torch.tensor([[0, 1], [2, 3]], device=device)
    assert torch_masked.gather_nd(params, torch.tensor([[0, 0], [1, 1]], device=device)).tolist() == [0, 3]
    assert torch_masked.gather_nd(params, torch.tensor([[1], [0]], device=device)).tolist() == [[2, 3], [0, 1]]
    assert torch_masked.gather_nd(out, torch.tensor([[2], [1]], device=device)).tolist() == [slices, zeros]


def test_front_doors_take_python_lists():
    assert torch_masked.scatter_nd([[4], [3], [1], [7]], [9, 10, 11, 12], [8]).tolist() == [0, 11, 0, 10, 9, 0, 0, 12]
    assert torch_masked.scatter_nd([1, 0], 2.5, (2, 2)).tolist() == [[0.0, 0.0], [2.5, 0.0]]
    assert torch_masked.scatter_nd(torch.tensor([[1]], dtype=torch.int32), [[1, 2]], torch.tensor([2, 2])).tolist() == [
        [0, 0],
        [1, 2],
    ]
    assert torch_masked.tensor_scatter_nd_add([1, 2, 3], [[0], [0]], [5, 6]).tolist() == [12, 2, 3]
    assert torch_masked.gather_nd([[0, 1], [2, 3]], [[1, 0]]).tolist() == [2]
    assert torch_masked.scatter_nd(torch.zeros(0, 1, dtype=torch.int64), [], [3]).tolist() == [0.0, 0.0, 0.0]
    # [[]]: one index row of K = 0 entries, all of params (added to all of the output).
    assert torch_masked.gather_nd(torch.arange(3.0), [[]]).tolist() == [[0.0, 1.0, 2.0]]
    assert torch_masked.scatter_nd([[]], [[1.0, 2.0]], [2]).tolist() == [1.0, 2.0]


def test_lists_take_the_tensors_dtype_unless_their_kind_changes():
    # Beside a tensor, a list or array takes its dtype as torch.tensor(values,
    # dtype=...) would, unless float values would become integers (1.7 cut to
    # 1) or complex ones real: then the op refuses the pair, as it refuses
    # such tensors.
    ints, floats = torch.zeros(4, dtype=torch.int64), torch.zeros(4, dtype=torch.float64)
    assert_same(torch_masked.tensor_scatter_nd_add(floats, [[1]], [2]), torch.tensor([0.0, 2, 0, 0], dtype=torch.float64))
    assert_same(torch_masked.tensor_scatter_nd_add(floats, [[1]], np.array([2.5], dtype=np.float32)),
                torch.tensor([0.0, 2.5, 0, 0], dtype=torch.float64))
    assert_same(torch_masked.tensor_scatter_nd_add(torch.zeros(2, dtype=torch.uint8), [[1]], [255]),
                torch.tensor([0, 255], dtype=torch.uint8))
    assert_same(torch_masked.tensor_scatter_nd_add([1, 2], [[1]], torch.tensor([0.5])), torch.tensor([1.0, 2.5]))
    assert_same(torch_masked.tensor_scatter_nd_add(torch.zeros(2, dtype=torch.int32), torch.zeros(0, 1, dtype=torch.int64), []),
                torch.zeros(2, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="value cannot be converted to type int8 without overflow"):
        torch_masked.tensor_scatter_nd_add(torch.zeros(2, dtype=torch.int8), [[1]], [300])
    refused = [
        (ints, [[1]], [1.7], "torch.int64, got torch.float32"),
        (ints, [[1]], np.array([1.7]), "torch.int64, got torch.float64"),
        (torch.zeros(2, dtype=torch.bool), [[1]], [2], "torch.bool, got torch.int64"),
        (torch.zeros(2), [[1]], [1j], "torch.float32, got torch.complex64"),
        ([0.5, 0.5], [[1]], torch.tensor([1]), "torch.float32, got torch.int64"),
    ]
    for tensor, indices, updates, dtypes in refused:
        with pytest.raises(TypeError, match=rf"tensor_scatter_nd_add: expected updates of the dtype of tensor, {dtypes}"):
            torch_masked.tensor_scatter_nd_add(tensor, indices, updates)
    # Decided from the dtypes alone, so it traces.
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: torch_masked.tensor_scatter_nd_add(t * 2, torch.tensor([[1]]), [[1, 2, 3]]),
                             fullgraph=True)
    assert_same(compiled(torch.ones(2, 3)), torch.tensor([[2.0, 2, 2], [3, 4, 5]]))


@pytest.mark.parametrize("device", DEVICES)
def test_rank1_indices_are_one_index_and_k0_adds_everywhere(device):
    out = torch_masked.scatter_nd(torch.tensor([1, 2], device=device), torch.tensor(5.0, device=device), [3, 4])
    expected = torch.zeros(3, 4)
    expected[1, 2] = 5
    assert torch.equal(out.cpu(), expected)
    whole = torch.tensor([[1.0, 2.0], [3.0, 4.0]], device=device)
    k0 = torch.zeros(3, 0, dtype=torch.int64, device=device)
    assert torch.equal(torch_masked.scatter_nd(k0, torch.stack([whole] * 3), [2, 2]).cpu(), 3 * whole.cpu())
    assert torch.equal(torch_masked.gather_nd(whole, k0).cpu(), torch.stack([whole.cpu()] * 3))


@pytest.mark.parametrize("device", DEVICES)
def test_bool_updates_or_together(device):
    indices = torch.tensor([[0], [0], [2], [2]], device=device)
    updates = torch.tensor([True, True, False, False], device=device)
    assert torch_masked.scatter_nd(indices, updates, [4]).tolist() == [True, False, False, False]
    base = torch.tensor([False, True, True, False], device=device)
    assert torch_masked.tensor_scatter_nd_add(base, indices, updates).tolist() == [True, True, True, False]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int8, torch.int16])
def test_cuda_word_atomics_stay_inside_the_output(dtype):
    """1- and 2-byte elements are added through the 4-byte word that holds
    them: the output's allocation is padded to whole words, so the word of
    its last element is inside it whatever the allocator."""
    indices = torch.tensor([[4], [4], [0]], device="cuda")
    updates = torch.ones(3, dtype=dtype, device="cuda")
    out = torch_masked.scatter_nd(indices, updates, [5])
    expected = torch.tensor([1, 0, 0, 0, 1 if dtype == torch.bool else 2]).to(dtype)
    assert torch.equal(out.cpu(), expected)
    assert out.is_contiguous() and not out._is_view()
    nbytes = out.untyped_storage().nbytes()
    assert nbytes % 4 == 0 and nbytes >= out.numel() * out.element_size()
    base = torch.zeros(5, dtype=dtype, device="cuda")
    assert torch.equal(torch_masked.tensor_scatter_nd_add(base, indices, updates).cpu(), expected)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_inputs(device):
    def long(values, *shape):
        return torch.tensor(values, dtype=torch.int64, device=device).reshape(*shape)

    # No rows at all, into an empty dimension and into a non-empty tensor.
    assert torch_masked.scatter_nd(long([], 0, 1), torch.zeros(0, 3, device=device), [0, 3]).shape == (0, 3)
    assert torch.equal(torch_masked.scatter_nd(long([], 0, 2), torch.zeros(0, device=device), [3, 4]).cpu(), torch.zeros(3, 4))
    assert torch_masked.gather_nd(torch.zeros(0, 3, device=device), long([], 0, 1)).shape == (0, 3)
    # Valid indices whose slices are empty: nothing moves, nothing fails.
    out = torch_masked.scatter_nd(long([1, 3], 2, 1), torch.zeros(2, 0, device=device), [4, 0])
    assert out.shape == (4, 0)
    assert torch_masked.gather_nd(torch.zeros(4, 0, device=device), long([1, 3], 2, 1)).shape == (2, 0)
    assert torch_masked.tensor_scatter_nd_add(torch.zeros(4, 0, device=device), long([1, 3], 2, 1), torch.zeros(2, 0, device=device)).shape == (4, 0)
    # In place: no rows leave the tensor as it was; K = 0 adds to all of it, a 0-d tensor too.
    ones, empty, scalar = torch.ones(3, device=device), torch.zeros(4, 0, device=device), torch.ones((), device=device)
    torch.ops.masked.tensor_scatter_nd_add_(ones, long([], 0, 1), torch.zeros(0, device=device))
    torch.ops.masked.tensor_scatter_nd_add_(empty, long([1, 3], 2, 1), torch.zeros(2, 0, device=device))
    torch.ops.masked.tensor_scatter_nd_add_(scalar, long([], 2, 0), torch.ones(2, device=device))
    assert (ones.tolist(), empty.shape, scalar.item()) == ([1, 1, 1], (4, 0), 3)
    # ...but a bad index is still found.
    with pytest.raises(IndexError, match=r"got \[4\] at indices\[1\] \(4 is out of range for dimension 0 of size 4\)"):
        torch_masked.scatter_nd(long([1, 4], 2, 1), torch.zeros(2, 0, device=device), [4, 0])
    with pytest.raises(IndexError, match=r"0 is out of range for dimension 0 of size 0"):
        torch_masked.gather_nd(torch.zeros(0, 3, device=device), long([0], 1, 1))
    # Empty slices of very many slots: no memory by the slot, the rows still checked.
    many = 2**40
    assert torch_masked.scatter_nd(long([5, 7], 2, 1), torch.zeros(2, 0, device=device), [many, 0]).shape == (many, 0)
    empty = torch.zeros(many, 0, device=device)
    assert torch_masked.tensor_scatter_nd_add(empty, long([5, 7], 2, 1), torch.zeros(2, 0, device=device)).shape == (many, 0)
    torch.ops.masked.tensor_scatter_nd_add_(empty, long([5, 7], 2, 1), torch.zeros(2, 0, device=device))
    with pytest.raises(IndexError, match=rf"got \[{many}\] at indices\[1\] \({many} is out of range for dimension 0"):
        torch_masked.scatter_nd(long([5, many], 2, 1), torch.zeros(2, 0, device=device), [many, 0])
    with pytest.raises(IndexError, match=r"tensor_scatter_nd_add: .* got \[-1\] at indices\[0\]"):
        torch.ops.masked.tensor_scatter_nd_add_(empty, long([-1], 1, 1), torch.zeros(1, 0, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_inputs(device):
    gen = torch.Generator().manual_seed(5)
    shape = (5, 4, 3)
    indices = non_contiguous(random_indices((6, 2), shape, 2, gen).to(device))
    updates = non_contiguous(torch.randn(6, 2, 3, generator=gen).to(device))
    base = non_contiguous(torch.randn(shape, generator=gen).to(device))
    expanded = torch.randn(1, 1, 3, generator=gen).to(device).expand(6, 2, 3)
    transposed_base = torch.randn(3, 4, 5, generator=gen).to(device).transpose(0, 2)
    assert not (indices.is_contiguous() or updates.is_contiguous() or base.is_contiguous())
    for upd, tensor in [(updates, base), (expanded, transposed_base)]:
        assert_scatter_matches(torch_masked.scatter_nd(indices, upd, shape), indices, upd, shape)
        out = torch_masked.tensor_scatter_nd_add(tensor, indices, upd)
        assert out.is_contiguous()
        assert_scatter_matches(out, indices, upd, shape, tensor)
        # In place into a non-contiguous tensor: the sums land in its own elements.
        into = torch.zeros(shape[::-1], device=device).permute(2, 1, 0).copy_(tensor)
        strides, storage = into.stride(), into.untyped_storage().data_ptr()
        torch.ops.masked.tensor_scatter_nd_add_(into, indices, upd)
        assert (into.stride(), into.untyped_storage().data_ptr()) == (strides, storage)
        assert_scatter_matches(into, indices, upd, shape, tensor)
        assert_same(torch_masked.gather_nd(tensor, indices), reference_gather(tensor, indices))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("depth", [0, 1, 2])
def test_gather_from_views(device, depth):
    """Params that are views (sliced, transposed, broadcast with stride 0,
    with a storage offset), whose slices are dense or not, at every index
    depth: both kernels read them in place (CUDA copies one whose slices are
    not dense first where it holds no more elements than the output: depth
    0 and 1 here). Rows out of bounds with check_bounds=False still read as
    zeros."""
    gen = torch.Generator().manual_seed(9)
    base = torch.randn(6, 7, 8, generator=gen).to(device)
    views = {
        "sliced": base[1::2, :, 2:5],
        "transposed": base.transpose(0, 2),
        "permuted": base.permute(1, 2, 0),
        "broadcast": torch.randn(1, 7, 1, generator=gen).to(device).expand(6, 7, 8),
        "offset": base[2:, 3:],
    }
    for params in views.values():
        indices = random_indices((9,), params.shape, depth, gen, duplicates=False).to(device)
        assert_same(torch_masked.gather_nd(params, indices), reference_gather(params, indices))
        if depth > 0:
            bad = indices.clone()
            bad[[1, 4], 0] = torch.tensor([params.shape[0], -1], device=device)
            expected = reference_gather(params, indices)
            expected[[1, 4]] = 0
            assert_same(torch_masked.gather_nd(params, bad, check_bounds=False), expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.int8, torch.bfloat16, torch.float32, torch.float64])
def test_gathers_rows_of_a_transposed_matrix(device, dtype):
    """Slices of one stride whose elements lie a cache line or more apart
    (the rows of a transposed matrix), 70 elements wide, from params of 2
    to 18 MiB (float32 and float64 past the 8 MiB from which the CPU
    prefetches), in rows enough to split among threads: the CPU gathers a
    cache line of output's worth of columns at a time (the last one
    partial). Rows out of bounds read as zeros without check_bounds, and
    the first of them is named with it."""
    gen = torch.Generator().manual_seed(70)
    slots = 2**15 + 3
    params = torch.randint(-100, 100, (70, slots), generator=gen).to(dtype).to(device).t()
    indices = torch.randint(0, slots, (1000, 1), generator=gen).to(device)
    assert_same(torch_masked.gather_nd(params, indices), reference_gather(params, indices))
    bad = indices.clone()
    bad[[3, 700], 0] = torch.tensor([-1, slots], device=device)
    expected = reference_gather(params, indices)
    expected[[3, 700]] = 0
    assert_same(torch_masked.gather_nd(params, bad, check_bounds=False), expected)
    with pytest.raises(IndexError, match=rf"got \[-1\] at indices\[3\] \(-1 is out of range for dimension 0 of size {slots}\)"):
        torch_masked.gather_nd(params, bad)
    # The same layout with rows of no element: nothing to gather, bounds still checked.
    no_columns = torch.empty(0, 80, dtype=dtype, device=device).t()
    assert torch_masked.gather_nd(no_columns, indices % 80).shape == (1000, 0)
    with pytest.raises(IndexError, match=r"got \[80\] at indices\[0\]"):
        torch_masked.gather_nd(no_columns, torch.tensor([[80]], device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_gathers_elements_from_params_prefetched_or_not(device):
    """Elements gathered from float32 params of 4 and 12 MiB, either side of
    the 8 MiB from which the CPU prefetches each row's source rows ahead:
    the values of params[idx]; rows out of bounds, the last row among them
    (whose rows ahead lie past the end), read as zeros without check_bounds
    and are named with it."""
    gen = torch.Generator().manual_seed(71)
    for n in (2**20, 3 * 2**20):
        params = torch.randn(n, generator=gen).to(device)
        indices = torch.randint(0, n, (100_000, 1), generator=gen).to(device)
        expected = reference_gather(params, indices)
        assert_same(torch_masked.gather_nd(params, indices), expected)
        bad = indices.clone()
        bad[[5, 99_999], 0] = torch.tensor([n, -1], device=device)
        expected[[5, 99_999]] = 0
        assert_same(torch_masked.gather_nd(params, bad, check_bounds=False), expected)
        with pytest.raises(IndexError, match=rf"got \[{n}\] at indices\[5\]"):
            torch_masked.gather_nd(params, bad)


@pytest.mark.parametrize("device", DEVICES)
def test_gathers_from_broadcast_params_without_copying_them(device):
    """A broadcast of 2**40 rows (a contiguous copy would be 12 TiB); a slice
    longer than the CPU's offset table, not dense (the CPU gathers it from a
    contiguous copy, CUDA in place: one row of two, fewer elements than a
    copy of params); and a slice of more dimensions than merge into the
    kernels' layout (both gather it from a contiguous copy)."""
    row = torch.tensor([1.0, 2.0, 3.0], device=device)
    huge = row.expand(2**40, 3)
    out = torch_masked.gather_nd(huge, torch.tensor([[0], [2**40 - 1], [12345]], device=device))
    assert torch.equal(out, row.expand(3, 3))
    long_columns = torch.randn(2**20 + 5, 2).t().to(device)  # slices of 2**20 + 5 elements, stride 2
    indices = torch.tensor([[1]], device=device)
    assert torch.equal(torch_masked.gather_nd(long_columns, indices), long_columns[indices[:, 0]])
    # Seven dimensions of size 2 stored in reverse order: none merges with its neighbour.
    unmerged = torch.randn([3] + [2] * 7).to(device).permute(0, *range(7, 0, -1))
    indices = torch.tensor([[2], [0], [2]], device=device)
    assert torch.equal(torch_masked.gather_nd(unmerged, indices), unmerged[indices[:, 0]])


@pytest.mark.parametrize("device", DEVICES)
def test_gathers_rows_out_of_bounds_of_params_with_no_element(device):
    """Params with no element whose slices are not dense, in dimensions that
    merge or not: every row is out of bounds (zeros without check_bounds,
    the IndexError with it), and params is not copied first (a copy of an
    empty tensor is itself: copying it again and again crashed)."""
    transposed = torch.empty(0, device=device).as_strided([0, 3], [1, 5])
    unmerged = torch.empty(0, device=device).as_strided([0] + [2] * 7, [1] + [2**k for k in range(7)])
    indices = torch.tensor([[0], [0]], device=device)
    error = r"got \[0\] at indices\[0\] \(0 is out of range for dimension 0 of size 0\)"
    for params in (transposed, unmerged):
        out = torch_masked.gather_nd(params, indices, check_bounds=False)
        assert torch.equal(out, torch.zeros(2, *params.shape[1:], device=device))
        with pytest.raises(IndexError, match=error):
            torch_masked.gather_nd(params, indices)


def algorithms(deterministic):
    return deterministic_algorithms() if deterministic else contextlib.nullcontext()


@pytest.mark.parametrize("device", DEVICES)
def test_random_shapes_depths_dtypes_and_layouts(device):
    """Shapes, index depths, batch shapes, duplicate patterns, dtypes, index
    dtypes and memory layouts drawn at random, in both algorithm modes (the
    kernels choose their paths by them), agree with the references."""
    g = torch.Generator().manual_seed(11)
    for _ in range(120):
        shape = random_shape(g, draw(g, range(5)), (0, 1, 2, 3, 5, 17, 64))
        k = draw(g, range(len(shape) + 1))
        index_dtype = draw(g, INDEX_DTYPES)
        if 0 in shape[:k]:  # no index is in range of an empty dimension
            indices = torch.zeros(0, k, dtype=index_dtype)
        else:
            slice_numel = math.prod(shape[k:])
            batch = random_shape(g, draw(g, range(3)), (1, 3, 40, 300), max_numel=max(1, 50_000 // max(1, slice_numel)))
            indices = random_indices(batch, shape, k, g, index_dtype, duplicates=draw(g, [True, False]))
        dtype = draw(g, ALL_DTYPES)
        updates = small_values(list(indices.shape[:-1]) + list(shape[k:]), dtype, g)
        base = small_values(shape, dtype, g)
        indices_d, updates_d, base_d = (random_layout(t.to(device), g) for t in (indices, updates, base))
        with algorithms(draw(g, [False, True])):
            scattered = torch_masked.scatter_nd(indices_d, updates_d, shape)
            assert_scatter_matches(scattered, indices, updates, shape, loose=True)
            added = torch_masked.tensor_scatter_nd_add(base_d, indices_d, updates_d)
            assert_scatter_matches(added, indices, updates, shape, base, loose=True)
            assert_same(torch_masked.gather_nd(base_d, indices_d), reference_gather(base, indices))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
def test_out_of_bounds_is_an_index_error(device, deterministic):
    with algorithms(deterministic):
        check_out_of_bounds_errors(device)


def check_out_of_bounds_errors(device):
    shape = [4, 3]
    updates = torch.ones(3, device=device)
    for bad, message in [
        ([[0, 0], [4, 1], [5, 0]], r"got \[4, 1\] at indices\[1\] \(4 is out of range for dimension 0 of size 4\)"),
        ([[0, 0], [1, 1], [2, -1]], r"got \[2, -1\] at indices\[2\] \(-1 is out of range for dimension 1 of size 3\)"),
    ]:
        message = r"expected every index within shape \[4, 3\], " + message
        for index_dtype in INDEX_DTYPES:
            indices = torch.tensor(bad, dtype=index_dtype, device=device)
            with pytest.raises(IndexError, match="scatter_nd: " + message):
                torch_masked.scatter_nd(indices, updates, shape)
            with pytest.raises(IndexError, match="tensor_scatter_nd_add: " + message):
                torch_masked.tensor_scatter_nd_add(torch.zeros(shape, device=device), indices, updates)
            with pytest.raises(IndexError, match="tensor_scatter_nd_add: " + message):
                torch.ops.masked.tensor_scatter_nd_add_(torch.zeros(shape, device=device), indices, updates)
            with pytest.raises(IndexError, match="gather_nd: " + message):
                torch_masked.gather_nd(torch.zeros(shape, device=device), indices)
            with pytest.raises(IndexError, match="gather_nd: " + message):
                torch.ops.masked.check_gather_nd_indices(indices, shape, torch.tensor(True, device=device))
    # The position is in indices.shape[:-1] coordinates; the first bad row is named.
    indices = torch.tensor([[[0], [1]], [[9], [-2]]], device=device)
    with pytest.raises(IndexError, match=r"got \[9\] at indices\[1, 0\]"):
        torch_masked.scatter_nd(indices, torch.ones(2, 2, device=device), [3])
    # A single (rank-1) index is the whole of indices.
    with pytest.raises(IndexError, match=r"got \[1, 5\] at indices \(5 is out of range for dimension 1 of size 3\)"):
        torch_masked.scatter_nd(torch.tensor([1, 5], device=device), torch.ones((), device=device), [4, 3])
    # The device (and the CUDA context) is fine afterwards.
    assert torch_masked.scatter_nd(torch.tensor([[1]], device=device), torch.ones(1, device=device), [3]).tolist() == [0, 1, 0]


@pytest.mark.parametrize("device", DEVICES)
def test_check_gather_nd_indices_raises_what_gather_nd_raises(device):
    # The raising half of the compiled gather_nd's bounds check: told by the
    # fused loop that a row is out of bounds, it names the first one as
    # gather_nd does; told none is, it returns without reading the rows.
    # 36000 rows, past one CUDA block, with a bad row in two places: the
    # first is named.
    check = torch.ops.masked.check_gather_nd_indices
    told, not_told = torch.tensor(True, device=device), torch.tensor(False, device=device)
    for index_dtype in INDEX_DTYPES:
        rows = torch.randint(0, 7, (3, 12_000, 1), dtype=index_dtype)
        rows[2, 9_000], rows[1, 5_000] = -1, 7
        rows = rows.to(device)
        message = r"gather_nd: expected every index within shape \[7\], got \[7\] at indices\[1, 5000\] "
        with pytest.raises(IndexError, match=message):
            check(rows, [7], told)
        with pytest.raises(IndexError, match=message):
            torch_masked.gather_nd(torch.zeros(7, device=device), rows)
        assert check(rows, [7], not_told) is None
        bad = non_contiguous(torch.tensor([[[0, 1], [4, 2]], [[2, -1], [0, 0]]], dtype=index_dtype).to(device))
        with pytest.raises(IndexError, match=r"got \[2, -1\] at indices\[1, 0\]"):
            check(bad, [5, 3], told)
    good = torch.tensor([[3, 2], [0, 0]], device=device)
    for indices, shape in [
        (good, [4, 3, 5]),
        (torch.tensor([3, 2], dtype=torch.int32, device=device), [4, 3]),  # a single index
        (torch.zeros(0, 2, dtype=torch.int64, device=device), [0, 3]),  # no rows
        (torch.zeros(5, 0, dtype=torch.int64, device=device), [2]),  # K = 0
    ]:
        assert check(indices, shape, not_told) is None
        # A flag that says out of bounds where no row is: said so, not passed over.
        with pytest.raises(ValueError, match=r"out_of_bounds is true, but every row of indices is within"):
            check(indices, shape, told)
    with pytest.raises(TypeError, match="expected out_of_bounds of dtype bool, got torch.int64"):
        check(good, [4, 3], torch.tensor(0, device=device))
    with pytest.raises(ValueError, match=r"expected a 0-d out_of_bounds, got shape \[1\]"):
        check(good, [4, 3], torch.tensor([False], device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_in_place_form_refuses_what_it_cannot_add_into(device):
    add_ = torch.ops.masked.tensor_scatter_nd_add_
    row = torch.tensor([[1]], device=device)
    buffer = torch.zeros(8, device=device)
    # Operands sharing the tensor's memory: the sums would change what they read.
    with pytest.raises(ValueError, match="expected updates apart from tensor in memory"):
        add_(buffer[:4], row, buffer[3:4])
    ints = torch.zeros(8, dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match="expected indices apart from tensor in memory"):
        add_(ints[:4], ints[2:3].view(1, 1), torch.ones(1, dtype=torch.int64, device=device))
    # Beside it in the same storage is fine.
    buffer[4] = 2
    add_(buffer[:4], row, buffer[4:5])
    assert buffer.tolist() == [0, 2, 0, 0, 2, 0, 0, 0]
    with pytest.raises(ValueError, match=r"elements are each stored once, got strides \[0\] for shape \[4\]"):
        add_(torch.zeros(1, device=device).expand(4), row, torch.ones(1, device=device))
    # No gradient: tensors that require one are refused; without grad mode, the
    # tensor's version moves, so autograd still sees the change.
    weight = torch.zeros(4, device=device, requires_grad=True)
    with pytest.raises(RuntimeError, match="the in-place form has no gradient"):
        add_(weight, row, torch.ones(1, device=device))
    with pytest.raises(RuntimeError, match="the in-place form has no gradient"):
        add_(torch.zeros(4, device=device), row, torch.ones(1, device=device, requires_grad=True))
    with torch.no_grad():
        version = weight._version
        add_(weight, row, torch.ones(1, device=device))
    assert weight._version == version + 1 and weight.tolist() == [0, 1, 0, 0]
    saved = torch.zeros(4, device=device)
    product = (saved * weight).sum()  # saves `saved` for its backward
    add_(saved, row, torch.ones(1, device=device))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        product.backward()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
def test_check_bounds_false_drops_bad_rows(device, deterministic):
    indices = torch.tensor([[1], [7], [-1], [2], [1]], device=device)
    updates = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], device=device)
    with algorithms(deterministic):
        assert torch_masked.scatter_nd(indices, updates, [3], check_bounds=False).tolist() == [0.0, 6.0, 4.0]
        assert torch.ops.masked.tensor_scatter_nd_add(
            torch.ones(3, device=device), indices, updates, check_bounds=False
        ).tolist() == [1.0, 7.0, 5.0]
    params = torch.tensor([10.0, 11.0, 12.0], device=device)
    assert torch_masked.gather_nd(params, indices, check_bounds=False).tolist() == [11.0, 0.0, 0.0, 12.0, 11.0]


@pytest.mark.parametrize(("device", "n"), LARGE_SIZES)
@pytest.mark.parametrize("dtype", [torch.int8, torch.bfloat16])
def test_offsets_past_int32(device, n, dtype):
    """Outputs of n elements, past 2**31 (and 2**32): int64 element indices on
    both sides of those bounds, and int32 indices of [n / 128, 128] slices
    whose element offsets pass them, each with duplicates; the gathers of the
    same places; an index one past the end refused. On CUDA in both modes
    (the deterministic one sorts for outputs this large; the CPU's sums are
    the same in both). Sums of small whole numbers: exact in bfloat16, and
    no int8 sum overflows."""
    width = 128
    positions = torch.tensor(boundary_positions(n), device=device)
    elements = torch.cat([positions, positions[-3:]]).view(-1, 1)
    element_values = repeated(torch.arange(1, 8, dtype=dtype, device=device), len(elements))
    slots = elements.div(width, rounding_mode="floor").to(torch.int32)
    slices = repeated(torch.arange(15, dtype=dtype, device=device), len(slots) * width).view(-1, width)
    for deterministic in [False, True] if device == "cuda" else [False]:
        with algorithms(deterministic):
            out = torch_masked.scatter_nd(elements, element_values, [n])
            expected = torch.zeros(n, dtype=dtype, device=device).index_put_(
                (elements[:, 0],), element_values, accumulate=True
            )
            assert torch.equal(out, expected)
            assert torch.equal(torch_masked.gather_nd(out, elements), expected[elements[:, 0]])
            del out, expected
            out = torch_masked.scatter_nd(slots, slices, [n // width, width])
            expected = torch.zeros(n // width, width, dtype=dtype, device=device).index_put_(
                (slots[:, 0].long(),), slices, accumulate=True
            )
            assert torch.equal(out, expected)
            assert torch.equal(torch_masked.gather_nd(out, slots), expected[slots[:, 0].long()])
            del out
            summed = torch_masked.tensor_scatter_nd_add(expected, slots, slices)
            assert torch.equal(summed, expected.index_put_((slots[:, 0].long(),), slices, accumulate=True))
            del summed, expected
    past_end = torch.tensor([[n // width]], dtype=torch.int32, device=device)
    with pytest.raises(IndexError, match=rf"\({n // width} is out of range for dimension 0 of size {n // width}\)"):
        torch_masked.scatter_nd(past_end, slices[:1], [n // width, width])


def test_shape_takes_the_sizes_torch_zeros_takes():
    # Anything with __index__: NumPy's integers, 0-d integer tensors (what
    # torch.jit.trace makes x.shape's sizes).
    idx, upd = torch.tensor([[1, 0], [1, 0]]), torch.tensor([2.0, 3.0])
    expected = torch.zeros(2, 3).index_put((idx[:, 0], idx[:, 1]), upd, accumulate=True)
    for shape in [[np.int64(2), np.int32(3)], [torch.tensor(2), torch.tensor(3, dtype=torch.int32)]]:
        assert torch.zeros(shape).shape == (2, 3)
        assert torch.equal(torch_masked.scatter_nd(idx, upd, shape), expected)


@pytest.mark.parametrize("device", DEVICES)
def test_shape_and_dtype_errors(device):
    idx = torch.tensor([[0], [1]], device=device)
    upd = torch.ones(2, device=device)
    with pytest.raises(TypeError, match=r"scatter_nd: expected indices of dtype torch.int32 or torch.int64, got torch.float32"):
        torch_masked.scatter_nd(idx.float(), upd, [3])
    with pytest.raises(TypeError, match=r"gather_nd: expected indices of dtype .* got torch.float32"):
        torch_masked.gather_nd(upd, [[0.0], [1.0]])
    with pytest.raises(RuntimeError, match=r"expected indices with at least one dimension, got a 0-d tensor"):
        torch_masked.scatter_nd(torch.tensor(1, device=device), upd, [3])
    with pytest.raises(RuntimeError, match=r"scatter_nd: expected indices.shape\[-1\] <= len\(shape\) = 1, got indices "
                                           r"of shape \[2, 2\] for shape \[3\]"):
        torch_masked.scatter_nd(torch.zeros(2, 2, dtype=torch.int64, device=device), upd, [3])
    with pytest.raises(RuntimeError, match=r"gather_nd: expected indices.shape\[-1\] <= len\(params.shape\) = 1"):
        torch_masked.gather_nd(upd, torch.zeros(2, 2, dtype=torch.int64, device=device))
    with pytest.raises(RuntimeError, match=r"scatter_nd: expected updates of shape indices.shape\[:-1\] \+ shape\[K:\] = "
                                           r"\[2, 4\], got updates of shape \[2\] \(indices of shape \[2, 1\]\)"):
        torch_masked.scatter_nd(idx, upd, [3, 4])
    with pytest.raises(RuntimeError, match=r"tensor_scatter_nd_add: expected updates of shape indices.shape\[:-1\] \+ "
                                           r"tensor.shape\[K:\] = \[2\], got updates of shape \[3\]"):
        torch_masked.tensor_scatter_nd_add(torch.zeros(3, device=device), idx, torch.ones(3, device=device))
    with pytest.raises(TypeError, match=r"expected updates of the dtype of tensor, torch.float64, got torch.float32"):
        torch_masked.tensor_scatter_nd_add(torch.zeros(3, dtype=torch.float64, device=device), idx, upd)
    with pytest.raises(RuntimeError, match=r"scatter_nd: expected non-negative sizes in shape, got \[3, -1\]"):
        torch.ops.masked.scatter_nd(idx, torch.ones(2, 0, device=device), [3, -1])
    for dtype in [torch.uint16, torch.float8_e4m3fn]:
        with pytest.raises(TypeError, match=r"expected updates of dtype bool, uint8, int8, int16, int32, int64, float16, "
                                            rf"bfloat16, float32, float64, complex64 or complex128, got {dtype}"):
            torch_masked.scatter_nd(idx, upd.to(dtype), [3])
    with pytest.raises(TypeError, match=r"scatter_nd: expected shape of integers, got \[3.0\]"):
        torch_masked.scatter_nd(idx, upd, [3.0])
    with pytest.raises(TypeError, match=r"scatter_nd: expected shape of integers, got \[True, 3\]"):
        torch_masked.scatter_nd(idx[:, :0], torch.ones(2, 1, 3, device=device), [True, 3])  # torch.zeros refuses it too
    # Array-likes that make no tensor: the front doors name the argument.
    with pytest.raises(RuntimeError, match=r"^scatter_nd: cannot make a tensor of indices = None: "):
        torch_masked.scatter_nd(None, upd, [3])
    with pytest.raises(RuntimeError, match=r"^scatter_nd: cannot make a tensor of updates = \[None\]: "):
        torch_masked.scatter_nd([[0]], [None], [3])
    with pytest.raises(ValueError, match=r"^gather_nd: cannot make a tensor of params = \[\[1\], \[2, 3\]\]: "):
        torch_masked.gather_nd([[1], [2, 3]], idx)
    with pytest.raises(RuntimeError, match=r"^tensor_scatter_nd_add: cannot make a tensor of updates = \[300\]: "
                                           r"value cannot be converted to type int8 without overflow"):
        torch_masked.tensor_scatter_nd_add(torch.zeros(3, dtype=torch.int8, device=device), idx[:1], [300])
    # Sizes whose product (those of 0 left out, which bounds every product
    # made of them) passes int64 are refused before any product is made; a
    # count of elements that fits but whose bytes do not is ATen's own
    # error, as for torch.empty (on CUDA through the padded output of
    # 2-byte elements).
    for rows, shape in [(1, [2**40, 2**40, 4]), (0, [0, 2**40, 2**40])]:
        with pytest.raises(RuntimeError, match=r"^scatter_nd: expected sizes in shape whose product, sizes of 0 left "
                                               rf"out, is less than 2\*\*63, got {re.escape(str(shape))}$"):
            torch_masked.scatter_nd(torch.zeros(rows, 3, dtype=torch.int64, device=device), upd[:rows], shape)
    with pytest.raises(RuntimeError, match=r"Storage size calculation overflowed with sizes=\[4611686018427387905\]"):
        torch_masked.scatter_nd(idx[:1], torch.ones(1, dtype=torch.int16, device=device), [2**62 + 1])
    # Taken for its truth, check_bounds=None or 0 would leave the rows unchecked.
    bad_rows = idx + 5
    for front_door, args in [(torch_masked.scatter_nd, (bad_rows, upd, [3])), (torch_masked.gather_nd, (upd, bad_rows)),
                             (torch_masked.tensor_scatter_nd_add, (torch.zeros(3, device=device), bad_rows, upd))]:
        for flag in [None, 0, 1]:
            with pytest.raises(TypeError, match=rf"^{front_door.__name__}: expected check_bounds to be a bool, got {flag}$"):
                front_door(*args, check_bounds=flag)
    for shape, shown in [(3, "3"), (torch.tensor(3), "3"), (None, "None")]:
        with pytest.raises(TypeError, match=rf"scatter_nd: expected shape to be a sequence of sizes \(a list, tuple, "
                                            rf"torch.Size or 1-D tensor\), got {shown}$"):
            torch_masked.scatter_nd(idx, upd, shape)


def test_misaligned_complex128_is_refused():
    # torch's own kernels fault on such a tensor (index_add_, clone() too).
    indices = torch.tensor([[0], [2]])
    values = misaligned(torch.ones(2, dtype=torch.complex128))
    message = r"with data aligned to its element size, 16 bytes, got an address 8 bytes past a multiple of 16"
    with pytest.raises(RuntimeError, match="scatter_nd: expected updates " + message):
        torch_masked.scatter_nd(indices, values, [3])
    with pytest.raises(RuntimeError, match="tensor_scatter_nd_add: expected tensor " + message):
        torch_masked.tensor_scatter_nd_add(misaligned(torch.ones(3, dtype=torch.complex128)), indices,
                                          torch.ones(2, dtype=torch.complex128))
    with pytest.raises(RuntimeError, match="gather_nd: expected params " + message):
        torch_masked.gather_nd(values, torch.tensor([[1]]))
    # Elements of 8 bytes or fewer load unaligned on the CPU.
    assert torch_masked.scatter_nd(indices, misaligned(torch.tensor([1.0, 2.0], dtype=torch.float64)), [3]).tolist() == [1, 0, 2]


@pytest.mark.parametrize("other", OTHER_DEVICES)
def test_devices_must_match(other):
    idx = torch.tensor([[0]])
    name = device_name(other)
    with pytest.raises(RuntimeError, match=rf"scatter_nd: expected all tensors on one device, got indices on cpu, "
                                           rf"updates on {name}"):
        torch.ops.masked.scatter_nd(idx, torch.ones(1, device=other), [2])
    with pytest.raises(RuntimeError, match=rf"gather_nd: expected all tensors on one device, got params on {name}, "
                                           rf"indices on cpu"):
        torch.ops.masked.gather_nd(torch.ones(2, device=other), idx)
    with pytest.raises(RuntimeError, match=rf"tensor_scatter_nd_add: expected all tensors on one device, "
                                           rf"got tensor on cpu, indices on {name}, updates on cpu"):
        torch.ops.masked.tensor_scatter_nd_add(torch.ones(2), idx.to(other), torch.ones(1))


def sample_inputs(device, requires_grad):
    """(op, args, kwargs) for opcheck, covering element and slice updates, K = 0, int32 indices and empty inputs."""
    gen = torch.Generator().manual_seed(6)
    float_dtype = torch.float64 if requires_grad else torch.float32

    def floats(*shape):
        return torch.randn(shape, generator=gen, dtype=float_dtype).to(device).requires_grad_(requires_grad)

    def ints(high, *shape, dtype=torch.int64):
        return torch.randint(0, high, shape, generator=gen).to(device=device, dtype=dtype)

    ops = torch.ops.masked
    return [
        (ops.scatter_nd.default, (ints(5, 7, 1), floats(7), [5]), {}),
        (ops.scatter_nd.default, (ints(3, 2, 4, 2, dtype=torch.int32), floats(2, 4, 5), [3, 3, 5]), {}),
        (ops.scatter_nd.default, (torch.zeros(3, 0, dtype=torch.int64, device=device), floats(3, 2, 2), [2, 2]), {}),
        (ops.scatter_nd.default, (ints(4, 0, 1), floats(0, 3), [4, 3]), {"check_bounds": False}),
        (ops.gather_nd.default, (floats(5, 3), ints(5, 6, 1)), {}),
        (ops.gather_nd.default, (floats(4, 3, 2), ints(3, 2, 2, 2, dtype=torch.int32)), {}),
        (ops.gather_nd.default, (floats(4), ints(4, 1)), {"check_bounds": False}),
        (ops.tensor_scatter_nd_add.default, (floats(4, 3), ints(4, 5, 1), floats(5, 3)), {}),
        (ops.tensor_scatter_nd_add.default, (floats(4, 3), ints(3, 6, 2), floats(6)), {}),
        (ops.check_gather_nd_indices.default, (ints(4, 5, 2), [4, 4, 3], torch.tensor(False, device=device)), {}),
        (ops.check_gather_nd_indices.default, (ints(3, 2, 1, dtype=torch.int32), [3], torch.tensor(False, device=device)), {}),
        # vmap's check of every sample's index rows (torch_masked/transforms.py).
        (ops.check_indices_in_bounds.default, ("gather_nd", ints(4, 3, 5, 2), [4, 4, 3], 1), {}),
        (ops.check_indices_in_bounds.default, ("scatter_nd", ints(3, 2, 1, dtype=torch.int32), [3], 0), {}),
    ] + ([] if requires_grad else [  # the in-place form refuses tensors that require grad
        (ops.tensor_scatter_nd_add_.default, (floats(4, 3), ints(4, 5, 1), floats(5, 3)), {}),
        (ops.tensor_scatter_nd_add_.default, (floats(4, 3), ints(3, 6, 2), floats(6)), {"check_bounds": False}),
    ])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck(device, requires_grad):
    for op, args, kwargs in sample_inputs(device, requires_grad):
        torch.library.opcheck(op, args, kwargs)


@pytest.mark.parametrize("device", DEVICES)
def test_forward_mode_ad(device):
    indices = torch.tensor([[1], [0], [1]], device=device)
    rows = (indices[:, 0],)
    values = torch.ones(3, device=device)
    assert_forward_ad_matches(
        lambda u: torch_masked.scatter_nd(indices, u, [3]),
        lambda u: torch.zeros(3, device=device).index_put(rows, u, accumulate=True),
        values,
    )
    assert_forward_ad_matches(
        lambda t: torch_masked.tensor_scatter_nd_add(t, indices, values),
        lambda t: t.index_put(rows, values, accumulate=True),
        values,
    )
    assert_forward_ad_matches(lambda p: torch_masked.gather_nd(p, indices), lambda p: p[rows], values)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_and_gradgradcheck(device):
    gen = torch.Generator().manual_seed(7)
    indices = torch.tensor([[0, 1], [2, 0], [0, 1], [1, 1]], device=device)  # a duplicate
    updates = torch.randn(4, 3, generator=gen, dtype=torch.float64).to(device).requires_grad_()
    tensor = torch.randn(3, 2, 3, generator=gen, dtype=torch.float64).to(device).requires_grad_()
    funcs = [
        (lambda u: torch_masked.scatter_nd(indices, u, [3, 2, 3]), (updates,)),
        (lambda p: torch_masked.gather_nd(p, indices), (tensor,)),
        (lambda t, u: torch_masked.tensor_scatter_nd_add(t, indices, u), (tensor, updates)),
    ]
    for fn, inputs in funcs:
        assert torch.autograd.gradcheck(fn, inputs)
        assert torch.autograd.gradgradcheck(fn, inputs)


def embedding_step(weight, ids, targets, bias_rows):
    """An embedding lookup (gather_nd; its gradient is the scatter_nd
    accumulation of row gradients) plus a scattered bias."""
    rows = torch_masked.gather_nd(weight, ids.unsqueeze(-1))
    shifted = torch_masked.tensor_scatter_nd_add(rows, bias_rows.unsqueeze(-1), torch.ones_like(rows[: bias_rows.shape[0]]))
    counts = torch_masked.scatter_nd(ids.unsqueeze(-1), torch.ones_like(ids, dtype=weight.dtype), [weight.shape[0]])
    return ((shifted - targets) ** 2).sum() + counts.sum() * 0.0


@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_training_step(dynamic):
    torch._dynamo.reset()
    compiled = torch.compile(embedding_step, fullgraph=True, dynamic=dynamic)
    gen = torch.Generator().manual_seed(8)
    for vocab, batch in [(10, 16), (13, 21)]:
        weight = torch.randn(vocab, 4, generator=gen, requires_grad=True)
        ids = torch.randint(0, vocab, (batch,), generator=gen)
        targets = torch.randn(batch, 4, generator=gen)
        bias_rows = torch.randint(0, batch, (5,), generator=gen)
        expected_loss = embedding_step(weight, ids, targets, bias_rows)
        (expected_grad,) = torch.autograd.grad(expected_loss, weight)
        loss = compiled(weight, ids, targets, bias_rows)
        loss.backward()
        torch.testing.assert_close(loss, expected_loss)
        torch.testing.assert_close(weight.grad, expected_grad)


def move_selected(x, mask, weight):
    """TensorFlow's way of moving the selected elements: indices from
    where(mask), values from boolean_mask, both of a data-dependent length
    that the fake kernels only know as two unrelated unbacked sizes."""
    indices = torch_masked.where(mask)
    values = torch_masked.boolean_mask(x, mask) * weight
    moved = torch_masked.scatter_nd(indices, values, mask.shape)
    return torch_masked.tensor_scatter_nd_add(x, indices, torch_masked.gather_nd(moved, indices))


@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_with_data_dependent_sizes(dynamic):
    torch._dynamo.reset()
    compiled = torch.compile(move_selected, fullgraph=True, dynamic=dynamic)
    gen = torch.Generator().manual_seed(9)
    weight = torch.tensor(3.0)
    for density in (0.3, 0.7):
        x = torch.randn(5, 6, generator=gen, requires_grad=True)
        mask = torch.rand(5, 6, generator=gen) < density
        result = compiled(x, mask, weight)
        (grad,) = torch.autograd.grad(result.sum(), x)
        torch.testing.assert_close(result, x + torch.where(mask, x * weight, 0.0))
        torch.testing.assert_close(grad, torch.where(mask, 1.0 + weight, 1.0))


def test_exported_with_data_dependent_sizes():
    class MoveSelected(torch.nn.Module):
        def forward(self, x, mask):
            return move_selected(x, mask, 3.0)

    gen = torch.Generator().manual_seed(10)
    x = torch.randn(4, 7, generator=gen)
    program = torch.export.export(MoveSelected(), (x, torch.rand(4, 7, generator=gen) < 0.5))
    for density in (0.0, 0.2, 0.9):
        mask = torch.rand(4, 7, generator=gen) < density
        torch.testing.assert_close(program.module()(x, mask), x + torch.where(mask, x * 3.0, 0.0))


def test_compiled_mismatched_data_dependent_sizes_raise():
    def scatter_other_mask(x, index_mask, value_mask):
        return torch_masked.scatter_nd(torch_masked.where(index_mask), torch_masked.boolean_mask(x, value_mask), x.shape)

    torch._dynamo.reset()
    compiled = torch.compile(scatter_other_mask, fullgraph=True)
    x = torch.arange(6.0)
    index_mask = torch.tensor([True, False, True, False, False, False])
    torch.testing.assert_close(compiled(x, index_mask, index_mask.flip(0)), torch.tensor([3.0, 0, 5, 0, 0, 0]))
    with pytest.raises(RuntimeError, match="expected updates of shape"):
        compiled(x, index_mask, ~index_mask)


def bad_calls():
    """Calls that fail before any data is read, so the fake kernels must fail alike."""
    ops = torch.ops.masked
    idx = torch.tensor([[0], [1]])
    upd = torch.ones(2)
    return [
        (ops.scatter_nd.default, (idx.float(), upd, [3])),
        (ops.scatter_nd.default, (torch.tensor(1), upd, [3])),
        (ops.scatter_nd.default, (torch.zeros(2, 2, dtype=torch.int64), upd, [3])),
        (ops.scatter_nd.default, (torch.zeros(1, 26, dtype=torch.int64), torch.ones(1), [1] * 26)),
        (ops.scatter_nd.default, (idx, upd, [3, 4])),
        (ops.scatter_nd.default, (idx, torch.ones(2, 0), [3, -1])),
        (ops.scatter_nd.default, (idx, upd.to(torch.uint32), [3])),
        (ops.tensor_scatter_nd_add.default, (torch.zeros(3, dtype=torch.float64), idx, upd)),
        (ops.tensor_scatter_nd_add.default, (torch.zeros(3), idx, torch.ones(3))),
        (ops.tensor_scatter_nd_add_.default, (torch.zeros(3, dtype=torch.float64), idx, upd)),
        (ops.tensor_scatter_nd_add_.default, (torch.zeros(3), idx, torch.ones(3))),
        (ops.gather_nd.default, (upd, torch.zeros(2, 2, dtype=torch.int64))),
        (ops.gather_nd.default, (upd, idx.double())),
        (ops.check_gather_nd_indices.default, (torch.zeros(2, 2, dtype=torch.int64), [3], torch.tensor(False))),
        (ops.check_gather_nd_indices.default, (idx.double(), [3], torch.tensor(False))),
        (ops.check_gather_nd_indices.default, (idx, [3], torch.tensor(0))),
        (ops.check_gather_nd_indices.default, (idx, [3], torch.tensor([False]))),
    ]


@pytest.mark.parametrize("call", range(len(bad_calls())))
def test_fake_kernels_fail_like_the_real_ones(call):
    from torch._subclasses.fake_tensor import FakeTensorMode

    op, args = bad_calls()[call]
    with pytest.raises(Exception) as real:
        op(*args)
    with FakeTensorMode() as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        with pytest.raises(Exception) as fake:
            op(*fake_args)
    assert type(fake.value) is type(real.value)
    assert str(real.value).splitlines()[0] in str(fake.value)
