"""where (same shape and broadcast) and select (row form) against
torch.where doing the same thing, with NumPy's np.where and JAX's jnp.where
(jitted) for reference."""
import numpy as np
import torch

import jax_peer
import torch_masked
from harness import Case
from jax_peer import jnp


# y_shape SCALAR: y is the Python number 0.0.
SCALAR = None


def _inputs(cond_shape, x_shape, y_shape, device):
    gen = torch.Generator().manual_seed(0)
    condition = (torch.rand(cond_shape, generator=gen) < 0.5).to(device)
    x = torch.randn(x_shape, generator=gen).to(device)
    y = 0.0 if y_shape is SCALAR else torch.randn(y_shape, generator=gen).to(device)
    return condition, x, y


def _numpy(condition, x, y, device):
    if device != "cpu":
        return None
    cn, xn = condition.numpy(), x.numpy()
    yn = y.numpy() if isinstance(y, torch.Tensor) else y
    return lambda: np.where(cn, xn, yn)


def _where_case(name, series, cond_shape, x_shape, y_shape, device):
    condition, x, y = _inputs(cond_shape, x_shape, y_shape, device)
    y_numel = y.numel() if isinstance(y, torch.Tensor) else 0
    out_numel = torch.broadcast_shapes(cond_shape, x_shape, () if y_shape is SCALAR else y_shape).numel()
    # Every input read once, the output written once (float32).
    moved = condition.numel() + 4 * (x.numel() + y_numel + out_numel)
    return Case(
        "where",
        name,
        lambda: torch_masked.where(condition, x, y),
        lambda: torch.where(condition, x, y),
        "torch.where",
        numpy=_numpy(condition, x, y, device),
        jax=jax_peer.side(device, lambda c, x, y: jnp.where(c, x, y), condition, x, y),
        bytes_moved=moved,
        size=out_numel,
        series=series,
    )


def _select_rows_case(rows, cols, device):
    condition, x, y = _inputs((rows,), (rows, cols), (rows, cols), device)
    column = condition[:, None]
    # Each output row is read from one of x and y, then written.
    moved = rows + 2 * 4 * rows * cols
    return Case(
        "select",
        f"rows [{rows}] x,y [{rows},{cols}] f32",
        lambda: torch_masked.select(condition, x, y),
        lambda: torch.where(column, x, y),
        "torch.where(c[:, None], x, y)",
        numpy=_numpy(column, x, y, device),
        jax=jax_peer.side(device, lambda c, x, y: jnp.where(c[:, None], x, y), condition, x, y),
        bytes_moved=moved,
        size=rows * cols,
        series=f"rows [N/{cols}] x,y [N/{cols},{cols}] f32",
    )


def _copy_reference_case(n, device):
    """Our same-shape where against a plain device-to-device copy of x: the
    copy's time gives the card's copy bandwidth (8 bytes per element) to hold
    where's GB/s column against."""
    condition, x, y = _inputs((n,), (n,), (n,), device)
    return Case(
        "where",
        f"same shape {n:.0e} f32 vs copy",
        lambda: torch_masked.where(condition, x, y),
        lambda: x.clone(),
        "x.clone() (copy, 8 B/elem)",
        bytes_moved=n * (1 + 4 + 4 + 4),
        size=n,
        series="same shape f32 vs copy",
    )


def cases(device, quick):
    sizes = [1000] if quick else [10**6, 10**7] + ([10**8] if device == "cuda" else [])
    for n in sizes:
        yield _where_case(f"same shape {n:.0e} f32", "same shape f32", (n,), (n,), (n,), device)
    for n in sizes:
        yield _where_case(f"c [{n}] x [{n}] y 0.0 f32", "c [N] x [N] y 0.0 f32", (n,), (n,), SCALAR, device)
    cols = 100 if quick else 1000
    for n in sizes:
        rows = n // cols
        yield _where_case(f"c [{rows},1] x [{rows},{cols}] y [{cols}] f32", f"c [N/{cols},1] x [N/{cols},{cols}] y [{cols}] f32",
                          (rows, 1), (rows, cols), (cols,), device)
    for n in sizes:
        rows = n // cols
        yield _where_case(f"c [1,{cols}] x,y [{rows},{cols}] f32", f"c [1,{cols}] x,y [N/{cols},{cols}] f32",
                          (1, cols), (rows, cols), (rows, cols), device)
    for n in sizes:
        yield _select_rows_case(n // cols, cols, device)
    if device == "cuda":
        yield _copy_reference_case(1000 if quick else 10**8, device)
