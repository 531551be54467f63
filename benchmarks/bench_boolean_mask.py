"""boolean_mask against native boolean indexing: 1-D ``x[mask]``, a row mask
on [N, 64] (axis 0, ``x[mask]``) and a column mask on [64, N] (axis 1,
``x[:, mask]``), float32, forward and forward+backward, with NumPy's
indexing as a reference column on the CPU, and JAX's (eager, the result's
size known only from the data; its backward by jax.vjp)."""
import numpy as np
import torch

import jax_peer
import torch_masked
from harness import Case
from jax_peer import jax


def layouts(numel):
    """(name, tensor shape, axis) for each layout of `numel` elements."""
    return [
        ("1-D", (numel,), 0),
        ("[N,64] rows", (numel // 64, 64), 0),
        ("[64,N] columns", (64, numel // 64), 1),
    ]


def forward_cases(name, series, numel, x, mask, axis, index, selected_bytes):
    x_np, mask_np = x.cpu().numpy(), mask.cpu().numpy()
    yield Case(
        "boolean_mask",
        name,
        lambda: torch_masked.boolean_mask(x, mask, axis),
        lambda: x[index],
        "x[mask]" if axis == 0 else "x[:, mask]",
        numpy=(lambda: x_np[(slice(None),) * axis + (mask_np,)]) if x.device.type == "cpu" else None,
        jax=jax_peer.side(x.device, lambda x, mask: x[(slice(None),) * axis + (mask,)], x, mask, jit=False),
        bytes_moved=mask.numel() + 2 * selected_bytes,
        size=numel,
        series=series,
    )


def training_cases(name, series, numel, x, mask, axis, index, selected_bytes):
    leaf = x.clone().requires_grad_()
    grad = torch.ones_like(leaf[index])

    def ours():
        leaf.grad = None
        torch_masked.boolean_mask(leaf, mask, axis).backward(grad)

    def native():
        leaf.grad = None
        leaf[index].backward(grad)

    numpy = None
    if x.device.type == "cpu":
        x_np, mask_np, grad_np = x.numpy(), mask.numpy(), grad.numpy()
        np_index = (slice(None),) * axis + (mask_np,)

        def numpy():
            x_np[np_index]
            grad_x = np.zeros_like(x_np)
            grad_x[np_index] = grad_np

    def jax_fn(x, mask, grad):
        out, pullback = jax.vjp(lambda x: x[(slice(None),) * axis + (mask,)], x)
        return out, pullback(grad)

    yield Case(
        "boolean_mask fwd+bwd",
        name,
        ours,
        native,
        "autograd of x[mask]" if axis == 0 else "autograd of x[:, mask]",
        numpy=numpy,
        jax=jax_peer.side(x.device, jax_fn, x, mask, grad, jit=False),
        bytes_moved=2 * mask.numel() + 3 * selected_bytes + x.numel() * x.element_size(),
        size=numel,
        series=series,
    )


def cases(device, quick):
    sizes = [10_000] if quick else [1_000_000, 10_000_000]
    if device == "cuda" and not quick:
        sizes.append(100_000_000)
    generator = torch.Generator().manual_seed(0)
    for numel in sizes:
        for layout, shape, axis in layouts(numel):
            x = torch.randn(shape, generator=generator).to(device)
            for density in (0.01, 0.5, 0.99):
                mask = (torch.rand(shape[axis], generator=generator) < density).to(device)
                index = (slice(None),) * axis + (mask,)
                selected_bytes = int(mask.sum()) * x.numel() // shape[axis] * x.element_size()
                name, series = f"{layout} {numel:.0e} d={density}", f"{layout} d={density}"
                yield from forward_cases(name, series, numel, x, mask, axis, index, selected_bytes)
                yield from training_cases(name, series, numel, x, mask, axis, index, selected_bytes)
