"""Per-call overhead: each op on ten elements, where the time is the
dispatcher, autograd and the Python front door rather than the kernel,
against the native PyTorch equivalent. Rows "no grad": the forward alone, no
input requiring grad. Rows "fwd+bwd": an input requiring grad, the forward
and torch.autograd.grad of it. Plain eager calls (no torch.func transform
active), the path that must not pay for the transforms' support."""
import torch

import torch_masked
from harness import Case

N = 10


def _inputs(device):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, generator=gen).to(device)
    y = torch.randn(N, generator=gen).to(device)
    condition = (torch.rand(N, generator=gen) < 0.5).to(device)
    indices = torch.randint(0, N, (N, 1), generator=gen).to(device)
    return condition, x, y, indices


def _pairs(device):
    """(op, ours, native, native's name, differentiable inputs): each fn
    takes the inputs."""
    condition, x, y, indices = _inputs(device)
    rows = indices[:, 0]
    zeros = torch.zeros(N, device=device)
    return [
        ("where", lambda x, y: torch_masked.where(condition, x, y), lambda x, y: torch.where(condition, x, y),
         "torch.where", (x, y)),
        ("where", lambda x: torch_masked.where(condition, x, 0.0), lambda x: torch.where(condition, x, 0.0),
         "torch.where", (x,)),
        ("select", lambda x, y: torch_masked.select(condition, x, y), lambda x, y: torch.where(condition, x, y),
         "torch.where", (x, y)),
        ("boolean_mask", lambda x: torch_masked.boolean_mask(x, condition), lambda x: x[condition], "x[mask]", (x,)),
        (
            "scatter_nd",
            lambda u: torch_masked.scatter_nd(indices, u, [N]),
            lambda u: zeros.index_put((rows,), u, accumulate=True),
            "index_put(accumulate=True)",
            (x,),
        ),
        ("gather_nd", lambda p: torch_masked.gather_nd(p, indices), lambda p: p[rows], "p[rows]", (x,)),
        (
            "tensor_scatter_nd_add",
            lambda t, u: torch_masked.tensor_scatter_nd_add(t, indices, u),
            lambda t, u: t.index_put((rows,), u, accumulate=True),
            "index_put(accumulate=True)",
            (x, y),
        ),
    ]


def _forward_backward(fn, inputs):
    inputs = [t.detach().requires_grad_() for t in inputs]

    def call():
        out = fn(*inputs)
        return torch.autograd.grad(out, inputs, torch.ones_like(out))

    return call


def _case(op, name, ours, native, native_name, series):
    # One group of their own in the report: these rows time dispatch, not kernels.
    return Case("call overhead", f"{op}{name}, {N} elem, {series}", ours, native, native_name,
                series=f"overhead, {series}")


def cases(device, quick):
    condition, x, _, _ = _inputs(device)
    yield _case("nonzero", "", lambda: torch_masked.nonzero(x), lambda: torch.nonzero(x), "torch.nonzero", "no grad")
    yield _case("nonzero_static", "", lambda: torch_masked.nonzero_static(x, size=4),
                lambda: torch.nonzero_static(x, size=4), "torch.nonzero_static", "no grad")
    # The op packet, which picks the overload by trying each in turn: every
    # form of where, against ATen's packet offered the same operands.
    for form, args in [("", (condition, x, x)), ("number y, ", (condition, x, 0.0)),
                       ("number x, ", (condition, 0.0, x)), ("index mode, ", (condition,))]:
        yield _case("where", f" ({form}op packet)", lambda args=args: torch.ops.masked.where(*args),
                    lambda args=args: torch.ops.aten.where(*args), "torch.ops.aten.where", "no grad")
    for op, ours, native, native_name, inputs in _pairs(device):
        name = " (number y)" if op == "where" and len(inputs) == 1 else ""
        yield _case(op, name, lambda ours=ours, inputs=inputs: ours(*inputs),
                    lambda native=native, inputs=inputs: native(*inputs), native_name, "no grad")
        yield _case(op, name, _forward_backward(ours, inputs), _forward_backward(native, inputs), native_name,
                    "fwd+bwd")
