"""The ops inside CUDA graphs: which calls a capture may hold, and which
Inductor's mode="reduce-overhead" keeps out of its graphs.

A call that reads a value back to the host (nonzero's and boolean_mask's
result size, check_bounds's verdict on the indices) cannot be captured: it
refuses with a RuntimeError naming the op and a way out, before CUDA would
fail the capture with "operation not permitted when stream is capturing".
Every other call is captured and replays with new inputs. Both are tested on
a GPU inside torch.cuda.graph, and on the CPU where tests/cuda_emulation
runs the CUDA kernels, whose capture it emulates; csrc/cpu's kernels never
read back, so the plain CPU run skips them."""
import contextlib
import re

import pytest
import torch
from torch._inductor.utils import is_cudagraph_unsafe_fx_node, is_cudagraph_unsafe_op
from torch.fx.experimental.proxy_tensor import make_fx

import torch_masked
from tests.common import DEVICES

masked = torch.ops.masked


def set_emulated_capture():
    """torch.ops.cuda_emulation.set_capturing where the emulated CUDA kernels
    are loaded, else None."""
    try:
        return torch.ops.cuda_emulation.set_capturing
    except (AttributeError, RuntimeError):
        return None


@contextlib.contextmanager
def capturing(device):
    """The calls in the block captured into a CUDA graph (yielded; None when emulated)."""
    if device == "cuda":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            yield graph
        return
    set_capturing = set_emulated_capture()
    if set_capturing is None:
        pytest.skip("csrc/cpu's kernels never read back to the host; tests/cuda_emulation runs the CUDA kernels'")
    set_capturing(True)
    try:
        yield None
    finally:
        set_capturing(False)


def index_inputs(device):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(6, 5, generator=gen).to(device)
    return {
        "x": x,
        "mask": (torch.arange(6) % 2 == 0).to(device),
        "indices": torch.tensor([[4, 1], [0, 3], [4, 1]], device=device),
        "updates": torch.randn(3, generator=gen).to(device),
        "flag": torch.tensor(False, device=device),
        # Rows 0 ([6, 1]) and 2 ([4, 10]) out of bounds of [6, 5].
        "bad_indices": torch.tensor([[6, 1], [0, 3], [4, 10]], device=device),
    }


NO_INDEX_READ = "with check_bounds=True, whether an index row is out of bounds"
READS_BACK = [
    ("nonzero", lambda t: masked.nonzero(t["x"]), "nonzero: the number of nonzero elements", "nonzero_static"),
    ("nonzero_tuple", lambda t: torch_masked.nonzero(t["x"], as_tuple=True),
     "nonzero_tuple: the number of nonzero elements", "nonzero_static"),
    ("where_indices", lambda t: torch_masked.where(t["mask"]), "nonzero: the number of nonzero elements",
     "nonzero_static"),
    ("boolean_mask", lambda t: torch_masked.boolean_mask(t["x"], t["mask"]),
     "boolean_mask: the number of rows mask selects", "select or where"),
    ("scatter_nd", lambda t: torch_masked.scatter_nd(t["indices"], t["updates"], [6, 5]),
     f"scatter_nd: {NO_INDEX_READ}", "check_bounds=False"),
    ("tensor_scatter_nd_add", lambda t: torch_masked.tensor_scatter_nd_add(t["x"], t["indices"], t["updates"]),
     f"tensor_scatter_nd_add: {NO_INDEX_READ}", "check_bounds=False"),
    ("tensor_scatter_nd_add_", lambda t: masked.tensor_scatter_nd_add_(t["x"].clone(), t["indices"], t["updates"]),
     f"tensor_scatter_nd_add: {NO_INDEX_READ}", "check_bounds=False"),
    ("gather_nd", lambda t: torch_masked.gather_nd(t["x"], t["indices"]), f"gather_nd: {NO_INDEX_READ}",
     "check_bounds=False"),
    ("check_gather_nd_indices", lambda t: masked.check_gather_nd_indices(t["indices"], [6, 5], t["flag"]),
     f"gather_nd: {NO_INDEX_READ}", "check_bounds=False"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("call, what, instead", [case[1:] for case in READS_BACK], ids=[c[0] for c in READS_BACK])
def test_a_read_back_to_the_host_is_refused_while_capturing(device, call, what, instead):
    inputs = index_inputs(device)
    expected = call(inputs)  # outside the capture; on a GPU, its warm-up as well
    with capturing(device):
        with pytest.raises(RuntimeError, match=rf"{re.escape(what)} must be read back to the host, which cannot be "
                                               rf"done while a CUDA graph is being captured; .*{instead}"):
            call(inputs)
    # The refusal left nothing broken: the same call gives what it gave before.
    torch.testing.assert_close(call(inputs), expected, rtol=0, atol=0)


def sync_free_calls(t):
    """Calls that never read back: check_bounds=False (rows out of bounds
    dropped or read as zeros; bfloat16 sums on CUDA's fixed-point path),
    nonzero_static, where, select and boolean_mask's backward."""
    bad = t["bad_indices"]
    return [
        torch_masked.scatter_nd(bad, t["updates"], [6, 5], check_bounds=False),
        torch_masked.scatter_nd(bad, t["updates"].bfloat16(), [6, 5], check_bounds=False),
        torch_masked.gather_nd(t["x"], bad, check_bounds=False),
        torch_masked.tensor_scatter_nd_add(t["x"], bad, t["updates"], check_bounds=False),
        torch_masked.nonzero_static(t["x"] > 0, size=20),
        torch_masked.where(t["mask"][:, None], t["x"], -1.0),
        torch_masked.select(t["mask"], t["x"], t["x"] * 2),
        masked.boolean_mask_backward(t["x"][:3], t["mask"], [6, 5], 0),
    ]


def native_sync_free_calls(t):
    # Only row 1, [0, 3], is in bounds: the others are dropped, or read as zeros.
    zero, device = torch.zeros((), device=t["x"].device), t["x"].device
    scattered = torch.zeros(6, 5, device=device).index_put_((zero.long(), zero.long() + 3), t["updates"][1])
    gathered = torch.stack([zero, t["x"][0, 3], zero])
    padded = torch.cat([(t["x"] > 0).nonzero(), torch.full((20, 2), -1, device=device)])[:20]
    backward = torch.zeros(6, 5, device=device)
    backward[t["mask"]] = t["x"][:3]
    return [
        scattered,
        scattered.bfloat16(),
        gathered,
        t["x"] + scattered,
        padded,
        torch.where(t["mask"][:, None], t["x"], -1.0),
        torch.where(t["mask"][:, None], t["x"], t["x"] * 2),
        backward,
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_sync_free_calls_are_captured_and_replay_with_new_inputs(device):
    inputs = index_inputs(device)
    for actual, expected in zip(sync_free_calls(inputs), native_sync_free_calls(inputs), strict=True):
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    with capturing(device) as graph:
        captured = sync_free_calls(inputs)
    if graph is not None:
        gen = torch.Generator().manual_seed(4)
        inputs["x"].copy_(torch.randn(6, 5, generator=gen))
        inputs["updates"].copy_(torch.randn(3, generator=gen))
        # Three rows again: the captured backward's gradient has three.
        inputs["mask"].copy_(torch.tensor([False, True, True, False, False, True]))
        graph.replay()
        torch.cuda.synchronize()
    for actual, expected in zip(captured, native_sync_free_calls(inputs), strict=True):
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)


READS_BACK_OPS = {
    masked.nonzero.default, masked.nonzero_tuple.default, masked.boolean_mask.default, masked.scatter_nd.default,
    masked.tensor_scatter_nd_add.default, masked.tensor_scatter_nd_add_.default, masked.gather_nd.default,
    masked.check_gather_nd_indices.default, masked.check_indices_in_bounds.default,
}


def every_op(t):
    results = [
        masked.nonzero(t["x"]), *masked.nonzero_tuple(t["x"]), masked.boolean_mask(t["x"], t["mask"]),
        masked.scatter_nd(t["indices"], t["updates"], [6, 5], check_bounds=False),
        masked.tensor_scatter_nd_add(t["x"], t["indices"], t["updates"]),
        masked.gather_nd(t["x"], t["indices"]),
        masked.nonzero_static(t["x"], size=3),
        masked.where.self(t["mask"][:, None], t["x"], t["x"]),
        masked.where.ScalarOther(t["mask"][:, None], t["x"], 1.0),
        masked.where.ScalarSelf(t["mask"][:, None], 1.0, t["x"]),
        masked.select(t["mask"], t["x"], t["x"]),
        masked.boolean_mask_backward(t["x"][:3], t["mask"], [6, 5], 0),
    ]
    masked.tensor_scatter_nd_add_(t["x"].clone(), t["indices"], t["updates"])
    masked.check_gather_nd_indices(t["indices"], [6, 5], t["flag"])
    masked.check_indices_in_bounds("gather_nd", t["indices"], [6, 5], 0)
    return results


def test_inductor_sees_the_ops_that_read_back_as_cudagraph_unsafe():
    """Inductor's own test of a graph's nodes, which mode="reduce-overhead"
    uses to run them between its CUDA graphs, flags exactly the ops that
    read back on CUDA (their tag: csrc/masked.cpp, and for the bounds check
    written in Python, torch_masked/ops/scatter_nd.py)."""
    graph = make_fx(every_op)(index_inputs("cpu")).graph
    ours = {node.target for node in graph.nodes
            if isinstance(node.target, torch._ops.OpOverload) and node.target.namespace == "masked"}
    assert len(ours) == 15
    assert {node.target for node in graph.nodes if is_cudagraph_unsafe_fx_node(node)} == READS_BACK_OPS


@pytest.mark.cpu_kernel
@pytest.mark.parametrize("check_bounds", [True, False])
def test_a_fused_gather_nd_keeps_only_its_check_out_of_cuda_graphs(monkeypatch, check_bounds):
    """Of a gather_nd that Inductor fuses, the operations it flags as unsafe
    to capture: the bounds check's call with check_bounds, none without."""
    from torch._inductor.graph import GraphLowering

    operations = []
    register = GraphLowering.register_operation

    def recording(self, operation):
        operations.append(operation)
        return register(self, operation)

    monkeypatch.setattr(GraphLowering, "register_operation", recording)
    torch.compiler.reset()
    t = index_inputs("cpu")
    chain = torch.compile(lambda x, i: (torch_masked.gather_nd(x * 2, i, check_bounds=check_bounds) + 1).sum(),
                          fullgraph=True)
    # A graph served from a cache is not lowered again.
    with torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
        result = chain(t["x"], t["indices"])
    torch.testing.assert_close(result, (t["x"][tuple(t["indices"].unbind(-1))] * 2 + 1).sum())
    unsafe = [getattr(o, "op_overload", None) for o in operations if is_cudagraph_unsafe_op(o)]
    assert unsafe == ([masked.check_gather_nd_indices.default] if check_bounds else [])


def loss_of(x, indices, updates):
    gathered = torch_masked.gather_nd(x * 2, indices)
    scattered = torch_masked.scatter_nd(indices, updates, list(x.shape[:1]))
    return gathered.sum(dim=-1).relu().sum() + (scattered * 2).square().sum()


def step_inputs(gen):
    x = torch.randn(50, 8, generator=gen).cuda().requires_grad_()
    indices = torch.randint(0, 50, (30, 1), generator=gen).cuda()
    updates = torch.randn(30, generator=gen).cuda().requires_grad_()
    return x, indices, updates


def loss_and_grads(loss_fn, x, indices, updates):
    x, updates = x.detach().requires_grad_(), updates.detach().requires_grad_()
    loss = loss_fn(x, indices, updates)
    loss.backward()
    return loss.detach(), x.grad, updates.grad


@pytest.mark.cuda
def test_reduce_overhead_training_step_runs_the_reads_between_its_graphs():
    """Forward and backward (gather_nd's is a scatter_nd, scatter_nd's a
    gather_nd) compiled with CUDA graphs equal eager; an index out of bounds
    is still gather_nd's or scatter_nd's IndexError, and the step runs on."""
    torch.compiler.reset()
    step = torch.compile(loss_of, mode="reduce-overhead", fullgraph=True)
    gen = torch.Generator().manual_seed(5)
    for _ in range(4):  # warm-up, recording, then replays of the CUDA graphs
        inputs = step_inputs(gen)
        for actual, expected in zip(loss_and_grads(step, *inputs), loss_and_grads(loss_of, *inputs), strict=True):
            torch.testing.assert_close(actual, expected)
    x, indices, updates = inputs
    indices[7, 0] = 50
    # gather_nd's check or scatter_nd's, whichever Inductor orders first.
    with pytest.raises(IndexError, match=r"(gather_nd|scatter_nd): expected every index within .*, got \[50\] at "
                                         r"indices\[7\]"):
        step(x, indices, updates)
    indices[7, 0] = 3
    for actual, expected in zip(loss_and_grads(step, *inputs), loss_and_grads(loss_of, *inputs), strict=True):
        torch.testing.assert_close(actual, expected)
