"""Every op inside a compiled chain of pointwise work: the chain with our op
against the same chain with the native equivalent, both
``torch.compile(fullgraph=True)`` with Inductor, in the same process. Inductor
fuses ``where``, ``select`` and ``gather_nd`` itself (torch_masked/compile.py);
the other ops stay our kernels there, and these rows are the measurement
that decides it (``torch_masked.compile.opaque()`` gives the other side).
The differentiable chains are timed again as training steps, forward and
backward ("compiled fwd+bwd"), where the backward graph holds each op's
gradient (our ops, or Inductor's code for them) against ATen's."""
import re

import torch
from torch._inductor.utils import run_and_get_code

import torch_masked
from harness import Case

ROWS_OF = 256  # elements per row in the select chain
SLICE = 8  # elements per slice in the gather_nd slices chains
WHERE_NUMBER = "(where(x>0, x, 0.0)*y).sum()"
SELECT = f"(select(rows, x*2, y)+1).sum(), rows of {ROWS_OF}"
SCATTER = "scatter_nd(idx, x[:n/10]*2, [n])+1"
MASK = "(boolean_mask(x*2, m)+1).sum()"
# The chains of a quick run, and those it also times as training steps.
QUICK = {WHERE_NUMBER, SELECT, SCATTER, MASK}
QUICK_TRAINED = {MASK}
# The ops whose chains are also timed as training steps (_training_case):
# each once, with bounds checked.
TRAINED = {"where", "select", "gather_nd", "scatter_nd", "tensor_scatter_nd_add", "boolean_mask"}


def _compiled(fn):
    # dynamic=False: each size gets its own static-shape graph, on both sides,
    # rather than a dynamic one after the second size.
    return torch.compile(fn, fullgraph=True, dynamic=False)


def _generated(call):
    """What Inductor generated for call (forward and backward graphs): its
    kernels' sources, kernel names left out, and the library calls its
    wrapper makes."""
    _, modules = run_and_get_code(call)
    kernels = sorted(re.sub(r"\b(cpp|triton)_\w+", "kernel", source)
                     for module in modules for source in re.findall(r"'''(.*?)'''", module, re.S))
    calls = [call for module in modules for call in re.findall(r"\b(torch\.ops\.[\w.]+|extern_kernels\.\w+)\(", module)]
    return kernels, calls


def _case(op, name, n, ours, native, native_name, args):
    """The forward chain, each side called on args."""
    ours, native = _compiled(ours), _compiled(native)
    return _timed_case("compiled", op, f"{op}: {name} {n:.0e}", n, lambda: ours(*args), lambda: native(*args),
                       native_name)


def _summed(chain):
    """The chain's sum: the loss of a step through a chain of a tensor."""
    return lambda *args: chain(*args).sum()


def _training_case(op, name, n, ours, native, native_name, args):
    """A training step through the chain: its forward, and the gradients of
    its loss (the chain where it ends in a sum, as its name says, else its
    sum) with respect to its floating-point inputs, which AOTAutograd
    compiles as a backward graph of its own; the two sides' gradients must
    agree."""
    args = [arg.detach().requires_grad_() if torch.is_tensor(arg) and arg.is_floating_point() else arg
            for arg in args]
    differentiable = [arg for arg in args if torch.is_tensor(arg) and arg.requires_grad]
    summed = ".sum()" not in name
    if summed:
        ours, native = _summed(ours), _summed(native)
    ours, native = _compiled(ours), _compiled(native)

    def step(loss):
        return lambda: torch.autograd.grad(loss(*args), differentiable)

    def agree(ours_grads, native_grads):
        for mine, theirs in zip(ours_grads, native_grads):
            torch.testing.assert_close(mine, theirs)

    title = f"{op}: {name}{', summed' if summed else ''}, forward and backward {n:.0e}"
    return _timed_case("compiled fwd+bwd", op, title, n, step(ours), step(native), native_name, agree)


def _timed_case(group, op, title, n, ours, native, native_name, agree=None):
    """The case of a compiled chain, ours and native each a call of it
    without arguments; agree(ours(), native()) checks their results."""
    try:
        # Compiled here, before the timing; the native boolean mask and
        # nonzero make sizes known only at run time, which Dynamo captures
        # when asked.
        with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
            # Where both sides run the same code, their ratio is the harness's
            # spread (benchmarks/METHODS.md), and the row says so.
            same_code = _generated(ours) == _generated(native)
            # run_and_get_code starts Dynamo afresh: ours is compiled again,
            # from Inductor's cache.
            results = ours(), native()
            if agree is not None:
                agree(*results)
    except Exception as error:  # noqa: BLE001 - one chain failing leaves the others
        # Raised again by the row's first call, so that the report lists the
        # failure under this row and goes on with the next chain.
        def failed(error=error):
            raise error

        return Case(group, title, failed, failed, native_name, size=n, series=op)
    return Case(group, title + (" (same code)" if same_code else ""), ours, native, native_name, size=n, series=op)


def _where_same_shape(c, x, y):
    return (torch_masked.where(c, x * 2, y + 1) * 3).sum()


def _native_where_same_shape(c, x, y):
    return (torch.where(c, x * 2, y + 1) * 3).sum()


def _where_number(x, y):
    return (torch_masked.where(x > 0, x, 0.0) * y).sum()


def _native_where_number(x, y):
    return (torch.where(x > 0, x, 0.0) * y).sum()


def _select_rows(rows, x, y):
    return (torch_masked.select(rows, x * 2, y) + 1).sum()


def _native_select_rows(rows, x, y):
    return (torch.where(rows[:, None], x * 2, y) + 1).sum()


def _gather_nd(x, indices):
    return (torch_masked.gather_nd(x, indices) * 2 + 1).sum()


def _native_gather_nd(x, indices):
    return (x[indices[:, 0]] * 2 + 1).sum()


def _native_gather_nd_pairs(x, indices):
    return (x[indices[:, 0], indices[:, 1]] * 2 + 1).sum()


def _gather_nd_unchecked(x, indices):
    return (torch_masked.gather_nd(x, indices, check_bounds=False) * 2 + 1).sum()


def _scatter_nd(indices, x, n):
    return torch_masked.scatter_nd(indices, x * 2, [n]) + 1


def _native_scatter_nd(indices, x, n):
    return x.new_zeros(n).index_put_((indices[:, 0],), x * 2, accumulate=True) + 1


def _scatter_nd_unchecked(indices, x, n):
    return torch_masked.scatter_nd(indices, x * 2, [n], check_bounds=False) + 1


def _tensor_scatter_nd_add_unchecked(t, indices, updates):
    return torch_masked.tensor_scatter_nd_add(t * 2, indices, updates, check_bounds=False) + 1


def _tensor_scatter_nd_add(t, indices, updates):
    return torch_masked.tensor_scatter_nd_add(t * 2, indices, updates) + 1


def _native_tensor_scatter_nd_add(t, indices, updates):
    return (t * 2).index_put((indices[:, 0],), updates, accumulate=True) + 1


def _boolean_mask(x, mask):
    return (torch_masked.boolean_mask(x * 2, mask) + 1).sum()


def _native_boolean_mask(x, mask):
    return ((x * 2)[mask] + 1).sum()


def _boolean_mask_computed(x):
    return (torch_masked.boolean_mask(x, x > 0) * 2 + 1).sum()


def _native_boolean_mask_computed(x):
    return (x[x > 0] * 2 + 1).sum()


def _nonzero(x):
    return (torch_masked.nonzero(x > 0) + 1).sum()


def _native_nonzero(x):
    return (torch.nonzero(x > 0) + 1).sum()


def cases(device, quick):
    """Quick: 1e4 elements, and only a few chains (each costs two compiles):
    a fused one and opaque ones, one of them of a size known at run time;
    and one training step."""
    sizes = [10**4] if quick else [10**6, 10**7]
    for chain in _chains(device, sizes):
        if not quick or chain[1] in QUICK:
            yield _case(*chain)
    # After every forward chain, so that a run cut short (gpu_check.sh's
    # time limit) keeps the forward rows; each size's inputs made again.
    for chain in _chains(device, sizes):
        if chain[0] in TRAINED and (not quick or chain[1] in QUICK_TRAINED):
            yield _training_case(*chain)


def _chains(device, sizes):
    """The arguments of _case for every chain (compiled only once made a case)."""
    for n in sizes:
        gen = torch.Generator().manual_seed(n)
        c = (torch.rand(n, generator=gen) < 0.5).to(device)
        x = torch.randn(n, generator=gen).to(device)
        y = torch.randn(n, generator=gen).to(device)
        # Indices of a tenth of the elements, drawn with repeats.
        indices = torch.randint(n, (n // 10, 1), generator=gen).to(device)
        # The same elements as (row, column) pairs of x viewed as a matrix.
        width = 1000
        pairs = torch.cat([indices // width, indices % width], dim=1)
        rows = n // ROWS_OF
        x_rows, y_rows = x[: rows * ROWS_OF].view(rows, ROWS_OF), y[: rows * ROWS_OF].view(rows, ROWS_OF)
        yield ("where", "(where(c, x*2, y+1)*3).sum()", n, _where_same_shape, _native_where_same_shape,
               "torch.where", (c, x, y))
        yield ("where", WHERE_NUMBER, n, _where_number, _native_where_number, "torch.where", (x, y))
        yield ("select", SELECT, n, _select_rows, _native_select_rows, "torch.where(rows[:, None], ...)",
               (c[:rows], x_rows, y_rows))
        yield ("gather_nd", "(gather_nd(x, idx)*2+1).sum(), n/10 indices", n, _gather_nd, _native_gather_nd,
               "x[idx[:, 0]]", (x, indices))
        yield ("gather_nd pairs", f"(gather_nd(x, idx)*2+1).sum(), x of n/{width} x {width}, n/10 index pairs", n,
               _gather_nd, _native_gather_nd_pairs, "x[idx[:, 0], idx[:, 1]]", (x.view(-1, width), pairs))
        yield ("gather_nd pairs unchecked",
               f"(gather_nd(x, idx, check_bounds=False)*2+1).sum(), x of n/{width} x {width}, n/10 index pairs", n,
               _gather_nd_unchecked, _native_gather_nd_pairs, "x[idx[:, 0], idx[:, 1]]", (x.view(-1, width), pairs))
        # Slices of 8 (x as n/8 rows of 8, n/80 row indices): on AVX-512 a
        # vector loop's tail alone.
        slice_rows = torch.randint(n // SLICE, (n // (10 * SLICE), 1), generator=gen).to(device)
        for check in ("", " unchecked"):
            yield (f"gather_nd slices{check}",
                   f"(gather_nd(x, idx{', check_bounds=False' if check else ''})*2+1).sum(), "
                   f"x of n/{SLICE} x {SLICE}, n/{10 * SLICE} row indices", n,
                   _gather_nd_unchecked if check else _gather_nd, _native_gather_nd, "x[idx[:, 0]]",
                   (x.view(-1, SLICE), slice_rows))
        # The fused gather alone: without the bounds check's call after the
        # loop, which the gather rows above pay for its IndexError.
        yield ("gather_nd unchecked", "(gather_nd(x, idx, check_bounds=False)*2+1).sum(), n/10 indices", n,
               _gather_nd_unchecked, _native_gather_nd, "x[idx[:, 0]]", (x, indices))
        yield ("scatter_nd", SCATTER, n, _scatter_nd, _native_scatter_nd, "zeros.index_put_(accumulate=True)",
               (indices, x[: n // 10], n))
        yield ("tensor_scatter_nd_add", "tensor_scatter_nd_add(t*2, idx, u)+1, n/10 updates", n,
               _tensor_scatter_nd_add, _native_tensor_scatter_nd_add, "index_put(accumulate=True)",
               (x, indices, y[: n // 10]))
        # Without the check: where Inductor generates Triton, Inductor's own
        # scatter (torch_masked/compile.py); on the CPU, our kernel.
        yield ("scatter_nd unchecked", "scatter_nd(idx, x[:n/10]*2, [n], check_bounds=False)+1", n,
               _scatter_nd_unchecked, _native_scatter_nd, "zeros.index_put_(accumulate=True)",
               (indices, x[: n // 10], n))
        yield ("tensor_scatter_nd_add unchecked", "tensor_scatter_nd_add(t*2, idx, u, check_bounds=False)+1", n,
               _tensor_scatter_nd_add_unchecked, _native_tensor_scatter_nd_add, "index_put(accumulate=True)",
               (x, indices, y[: n // 10]))
        yield ("boolean_mask", MASK, n, _boolean_mask, _native_boolean_mask, "(x*2)[m]", (x, c))
        # A mask the graph computes, which Inductor writes out for the call.
        yield ("boolean_mask", "(boolean_mask(x, x>0)*2+1).sum()", n, _boolean_mask_computed,
               _native_boolean_mask_computed, "x[x>0]", (x,))
        yield ("nonzero", "(nonzero(x>0)+1).sum()", n, _nonzero, _native_nonzero, "torch.nonzero", (x,))
