"""torch.func with the ops: vmap through PyTorch's per-sample fallback gives
the values of a loop over the batch; grad is refused with PyTorch's clear
error (the autograd formulas are C++ torch::autograd::Function)."""
import pytest
import torch

import torch_masked

# vmap's fallback warns that it loops; that is the documented behaviour.
pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop")

BATCH = 3


def batched_inputs():
    gen = torch.Generator().manual_seed(0)
    condition = torch.rand(BATCH, 5, 4, generator=gen) > 0.5
    x = torch.randn(BATCH, 5, 4, generator=gen)
    y = torch.randn(BATCH, 5, 4, generator=gen)
    indices = torch.randint(0, 5, (BATCH, 6, 1), generator=gen)
    # Whole numbers: their sums are exact in any order, as a GPU adds them.
    updates = torch.randint(-8, 9, (BATCH, 6, 4), generator=gen).float()
    base = torch.randint(-8, 9, (BATCH, 5, 4), generator=gen).float()
    return {
        "where": (lambda c, x, y: torch_masked.where(c, x, y), (condition, x, y)),
        "select": (lambda c, x, y: torch_masked.select(c[:, 0], x, y), (condition, x, y)),
        "gather_nd": (torch_masked.gather_nd, (x, indices)),
        "scatter_nd": (lambda i, u: torch_masked.scatter_nd(i, u, [5, 4]), (indices, updates)),
        "tensor_scatter_nd_add": (torch_masked.tensor_scatter_nd_add, (base, indices, updates)),
        "nonzero_static": (lambda c: torch_masked.nonzero_static(c, size=7), (condition,)),
    }


@pytest.mark.parametrize("name", list(batched_inputs()))
def test_vmap_matches_a_loop(name):
    fn, args = batched_inputs()[name]
    expected = torch.stack([fn(*(a[i] for a in args)) for i in range(BATCH)])
    torch.testing.assert_close(torch.vmap(fn)(*args), expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch_masked.where(x > 0, x, 0.0).sum(),
        lambda x: torch_masked.boolean_mask(x, x[:, 0] > 0).sum(),
        lambda x: torch_masked.gather_nd(x, torch.tensor([[1], [2]])).sum(),
    ],
    ids=["where", "boolean_mask", "gather_nd"],
)
def test_func_grad_is_refused_clearly(fn):
    x = torch.randn(5, 4)
    with pytest.raises(RuntimeError, match="cannot use C\\+\\+ torch::autograd::Function with functorch transforms"):
        torch.func.grad(fn)(x)
