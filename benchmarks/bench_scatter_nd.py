"""scatter_nd / gather_nd against native PyTorch.

Element scatter: U updates into N elements (U = N and U = N/10, random
destinations, so duplicates are common) against
``zeros.index_put_((idx,), upd, accumulate=True)`` and ``zeros.index_add_``.
Slice scatter: N/64 rows of 64 into ``[N/64, 64]``. Gather: the same shapes
against advanced indexing. NumPy's ``np.add.at`` / fancy indexing in the NumPy
column (float32 only: NumPy has no bfloat16); JAX's jitted
``zeros.at[tuple(idx.T)].add(upd)`` / ``params[tuple(idx.T)]`` in the JAX
column. On CUDA, every scatter also on the deterministic path
(``torch.use_deterministic_algorithms(True)``), which JAX has no per-call
switch for.
"""
import numpy as np
import torch

import jax_peer
import torch_masked
from harness import Case
from jax_peer import jnp

DTYPES = [torch.float32, torch.bfloat16]


def _deterministic(fn):
    def run():
        before = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            return fn()
        finally:
            torch.use_deterministic_algorithms(before)

    return run


def _scatter_cases(device, n, rows, width, dtype, gen):
    """Scatter `rows` updates of `width` elements into [n // width, width] (or [n] when width == 1)."""
    slots = n // width
    shape = [slots] if width == 1 else [slots, width]
    idx = torch.randint(0, slots, (rows,), generator=gen).to(device)
    upd = torch.randn([rows] + shape[1:], generator=gen).to(dtype).to(device)
    indices = idx.unsqueeze(1)
    kind = "element" if width == 1 else f"slice x{width}"
    name = f"scatter {kind} U={rows:.0e} N={n:.0e} {str(dtype)[6:]}"
    series = f"scatter {kind} U={'N' if rows == n else f'N/{n // rows}'} {str(dtype)[6:]}"
    esize = upd.element_size()
    moved = rows * (8 + width * esize) + n * esize

    def ours():
        return torch_masked.scatter_nd(indices, upd, shape)

    numpy_fn = None
    if dtype == torch.float32 and device == "cpu":
        idx_np, upd_np = idx.numpy(), upd.numpy()

        def numpy_fn():
            out = np.zeros(shape, np.float32)
            np.add.at(out, idx_np, upd_np)
            return out

    jax_side = jax_peer.side(device, lambda idx, u: jnp.zeros(shape, u.dtype).at[tuple(idx.T)].add(u), indices, upd)
    yield Case("scatter_nd", name, ours, lambda: torch.zeros(shape, dtype=dtype, device=device).index_put_(
        (idx,), upd, accumulate=True), "index_put_(accumulate=True)", numpy=numpy_fn, jax=jax_side, bytes_moved=moved,
        size=n, series=series + " vs index_put_")
    yield Case("scatter_nd", name, ours, lambda: torch.zeros(shape, dtype=dtype, device=device).index_add_(
        0, idx, upd), "index_add_", numpy=numpy_fn, jax=jax_side, bytes_moved=moved, size=n,
        series=series + " vs index_add_")
    if device == "cuda":
        yield Case("scatter_nd", name + " deterministic", _deterministic(ours),
                   _deterministic(lambda: torch.zeros(shape, dtype=dtype, device=device).index_put_(
                       (idx,), upd, accumulate=True)), "index_put_(accumulate=True), deterministic",
                   bytes_moved=moved, size=n, series=series + " deterministic")


def _gather_case(device, n, width, dtype, gen, transposed=False):
    """Gathers n / width random slots of `width` elements; `transposed`: from
    params stored as its transpose (each slice's elements n / width apart),
    which torch and NumPy read in place. No JAX side there: JAX arrays are
    row-major, so it would gather from a contiguous copy, another task."""
    slots = n // width
    if transposed:
        params = torch.randn([width, slots], generator=gen).to(dtype).to(device).t()
    else:
        params = torch.randn([slots] if width == 1 else [slots, width], generator=gen).to(dtype).to(device)
    idx = torch.randint(0, slots, (slots,), generator=gen).to(device)
    indices = idx.unsqueeze(1)
    kind = ("element" if width == 1 else f"slice x{width}") + (" transposed" if transposed else "")
    numpy_fn = None
    if dtype == torch.float32 and device == "cpu":
        params_np, idx_np = params.numpy(), idx.numpy()

        def numpy_fn():
            return params_np[idx_np]

    return Case("gather_nd", f"gather {kind} N={n:.0e} {str(dtype)[6:]}",
                lambda: torch_masked.gather_nd(params, indices), lambda: params[idx], "params[idx]",
                numpy=numpy_fn,
                jax=None if transposed else jax_peer.side(device, lambda p, idx: p[tuple(idx.T)], params, indices),
                bytes_moved=slots * 8 + 2 * n * params.element_size(),
                size=n, series=f"gather {kind} {str(dtype)[6:]}")


def cases(device, quick):
    gen = torch.Generator().manual_seed(0)
    sizes = [10_000] if quick else [1_000_000, 10_000_000]
    for n in sizes:
        for dtype in DTYPES:
            for rows in (n, n // 10):
                yield from _scatter_cases(device, n, rows, 1, dtype, gen)
            yield from _scatter_cases(device, n, n // 64, 64, dtype, gen)
            for width in (1, 64):
                yield _gather_case(device, n, width, dtype, gen)
            if dtype == torch.float32:
                yield _gather_case(device, n, 64, dtype, gen, transposed=True)
