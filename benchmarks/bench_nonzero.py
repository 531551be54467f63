"""nonzero and nonzero_static against torch.nonzero / torch.nonzero_static
(and NumPy's np.argwhere on the CPU; JAX's jnp.argwhere, eager, its result's
size known only from the data, and jitted with size= for nonzero_static)."""
import numpy as np
import torch

import jax_peer
import torch_masked
from harness import Case
from jax_peer import jnp


def sizes(device, quick):
    if quick:
        return [10_000]
    return [10_000, 1_000_000, 10_000_000] + ([100_000_000] if device == "cuda" else [])


def make_input(n, dtype, density, device, shape=None):
    generator = torch.Generator().manual_seed(n)
    x = (torch.rand(n, generator=generator) < density).to(dtype)
    return x.reshape(shape or (n,)).to(device)


def nonzero_case(name, series, x, device):
    x_np = x.cpu().numpy()
    # The input read once, an int64 per coordinate written.
    moved = x.nbytes + int(torch.count_nonzero(x)) * x.dim() * 8
    return Case(
        "nonzero",
        name,
        lambda: torch_masked.nonzero(x),
        lambda: torch.nonzero(x),
        "torch.nonzero",
        numpy=(lambda: np.argwhere(x_np)) if device == "cpu" else None,
        jax=jax_peer.side(device, lambda x: jnp.argwhere(x), x, jit=False),
        bytes_moved=moved,
        size=x.numel(),
        series=series,
    )


def cases(device, quick):
    for n in sizes(device, quick):
        for dtype in [torch.bool, torch.float32]:
            for density in [0.01, 0.5, 0.99]:
                x = make_input(n, dtype, density, device)
                series = f"{str(dtype)[6:]} density={density}"
                yield nonzero_case(f"{str(dtype)[6:]} n={n:.0e} density={density}", series, x, device)
    n = sizes(device, quick)[-1]
    for density in [0.01, 0.5, 0.99]:
        x = make_input(n, torch.bool, density, device, shape=(n // 1000, 1000))
        yield nonzero_case(f"bool [{n // 1000},1000] density={density}", f"bool [N/1000,1000] density={density}", x,
                           device)
        size = int(n * density) // 2
        yield Case(
            "nonzero_static",
            f"bool [{n // 1000},1000] density={density} size={size:.0e}",
            lambda x=x, size=size: torch_masked.nonzero_static(x, size=size),
            lambda x=x, size=size: torch.nonzero_static(x, size=size),
            "torch.nonzero_static",
            jax=jax_peer.side(device, lambda x, size=size: jnp.argwhere(x, size=size, fill_value=-1), x),
            bytes_moved=x.nbytes + size * x.dim() * 8,
            size=n,
            series=f"bool [N/1000,1000] density={density} size=N*density/2",
        )
