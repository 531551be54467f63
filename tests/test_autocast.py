"""The ops under torch.autocast (csrc/autocast.cpp): each one fed a matmul's
low-precision output gives the dtype and the values its ATen equivalent gives
in the same region, and tensor_scatter_nd_add casts two floating dtypes to the
wider one, as CUDA autocast casts index_put's, also under the function
transforms and torch.compile."""
import contextlib

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_masked
from common import DEVICES, FLOAT_DTYPES

AUTOCAST_DTYPES = [torch.bfloat16, torch.float16]
INDICES = [[1], [3], [1]]  # a duplicate: its updates add up


def _inputs(device, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 4, generator=generator).to(device).requires_grad_()
    weight = torch.randn(4, 4, generator=generator).to(device).requires_grad_()
    condition = (torch.rand(6, 4, generator=generator) > 0.5).to(device)
    rows = torch.tensor([True, False, True, True, False, True], device=device)
    indices = torch.tensor(INDICES, device=device)
    return x, weight, condition, rows, indices


def _ours_and_native(x, weight, condition, rows, indices):
    """Each op and its ATen equivalent on `h`, a matmul's output: in an
    autocast region, of the autocast dtype, beside `x` in float32."""
    h = x @ weight
    zeros = torch.zeros(6, 4, dtype=h.dtype, device=h.device)
    return {
        "where": (torch_masked.where(condition, h, x), torch.where(condition, h, x)),
        "where with a number": (torch_masked.where(condition, h, 0.5), torch.where(condition, h, 0.5)),
        "select": (torch_masked.select(rows, h, x), torch.where(rows[:, None], h, x)),
        "boolean_mask": (torch_masked.boolean_mask(h, rows), h[rows]),
        "gather_nd": (torch_masked.gather_nd(h, indices), h[indices[:, 0]]),
        "scatter_nd": (
            torch_masked.scatter_nd(indices, h[:3], [6, 4]),
            zeros.index_put((indices[:, 0],), h[:3], accumulate=True),
        ),
        "nonzero": (torch_masked.nonzero(h > 0), torch.nonzero(h > 0)),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("low", AUTOCAST_DTYPES, ids=str)
def test_every_op_gives_the_dtype_and_values_aten_gives(device, low):
    inputs = _inputs(device)
    x, weight = inputs[:2]
    with torch.autocast(device, dtype=low):
        pairs = _ours_and_native(*inputs)
    assert pairs["where"][1].dtype == torch.float32 and pairs["boolean_mask"][1].dtype == low
    for name, (ours, native) in pairs.items():
        assert ours.dtype == native.dtype, name
        torch.testing.assert_close(ours, native, rtol=0, atol=0, msg=name)
        if ours.is_floating_point():
            upstream = torch.randn(ours.shape, device=device).to(ours.dtype)
            ours_grads = torch.autograd.grad(ours, (x, weight), upstream, retain_graph=True)
            native_grads = torch.autograd.grad(native, (x, weight), upstream, retain_graph=True)
            for ours_grad, native_grad in zip(ours_grads, native_grads):
                torch.testing.assert_close(ours_grad, native_grad, msg=name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tensor_dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("updates_dtype", FLOAT_DTYPES, ids=str)
def test_tensor_scatter_nd_add_casts_to_the_wider_dtype(device, tensor_dtype, updates_dtype):
    wider = torch.promote_types(tensor_dtype, updates_dtype)
    generator = torch.Generator().manual_seed(1)
    tensor = torch.randn(6, 4, generator=generator).to(device, tensor_dtype).requires_grad_()
    updates = torch.randn(3, 4, generator=generator).to(device, updates_dtype).requires_grad_()
    # No duplicates: each sum rounded once, on every device and path.
    indices = torch.tensor([[1], [3], [4]], device=device)
    with torch.autocast(device, dtype=torch.bfloat16):
        result = torch_masked.tensor_scatter_nd_add(tensor, indices, updates)
    expected = tensor.to(wider).index_put((indices[:, 0],), updates.to(wider), accumulate=True)
    assert result.dtype == wider
    torch.testing.assert_close(result, expected, rtol=0, atol=0)

    upstream = torch.randn(6, 4, generator=generator).to(device, wider)
    tensor_grad, updates_grad = torch.autograd.grad(result, (tensor, updates), upstream)
    assert (tensor_grad.dtype, updates_grad.dtype) == (tensor_dtype, updates_dtype)
    torch.testing.assert_close(tensor_grad, upstream.to(tensor_dtype), rtol=0, atol=0)
    torch.testing.assert_close(updates_grad, upstream[indices[:, 0]].to(updates_dtype), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_dtypes_autocast_does_not_cast_must_still_match(device):
    indices = torch.tensor(INDICES, device=device)
    floats = torch.ones(3, 4, dtype=torch.bfloat16, device=device)
    with pytest.raises(TypeError, match=r"expected updates of the dtype of tensor, torch.float32, got torch.bfloat16"):
        torch_masked.tensor_scatter_nd_add(torch.zeros(6, 4, device=device), indices, floats)  # no autocast
    with torch.autocast(device, dtype=torch.bfloat16):
        for tensor_dtype in (torch.int32, torch.complex64):
            tensor = torch.zeros(6, 4, dtype=tensor_dtype, device=device)
            with pytest.raises(TypeError, match=rf"the dtype of tensor, {tensor_dtype}, got torch.bfloat16"):
                torch_masked.tensor_scatter_nd_add(tensor, indices, floats)


@contextlib.contextmanager
def cuda_autocast(dtype):
    """CUDA autocast switched on directly: torch.autocast("cuda") switches
    itself off where no GPU is, and fake CUDA tensors need none."""
    enabled, before = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        torch.autocast_decrement_nesting()
        torch.set_autocast_enabled("cuda", enabled)
        torch.set_autocast_dtype("cuda", before)


@pytest.mark.skipif(not torch.backends.cuda.is_built(), reason="fake CUDA tensors need a CUDA build of torch")
@pytest.mark.parametrize("low", AUTOCAST_DTYPES, ids=str)
def test_cuda_autocast_casts_as_it_casts_index_put(low):
    """The AutocastCUDA registration, reached on any machine with fake CUDA
    tensors; ATen's index_put, promoted by CUDA autocast, is the reference."""
    with FakeTensorMode():
        tensor = torch.zeros(6, 4, device="cuda")
        updates = torch.ones(3, 4, dtype=low, device="cuda")
        indices = torch.tensor(INDICES, device="cuda")
        with pytest.raises(TypeError, match="expected updates of the dtype of tensor"):
            torch_masked.tensor_scatter_nd_add(tensor, indices, updates)
        with cuda_autocast(low):
            ours = torch_masked.tensor_scatter_nd_add(tensor, indices, updates)
            native = tensor.index_put((indices[:, 0],), updates, accumulate=True)
            low_only = torch_masked.tensor_scatter_nd_add(updates.new_zeros(6, 4), indices, updates)
    assert ours.dtype == native.dtype == torch.float32
    assert ours.device.type == "cuda"
    assert low_only.dtype == low


def test_function_transforms_cast_as_eager():
    tensor = torch.randn(6, 4)
    indices = torch.tensor(INDICES)
    updates = torch.randn(5, 3, 4).to(torch.bfloat16)  # a batch of five
    tangent = torch.randn(3, 4).to(torch.bfloat16)

    def add(u):
        return torch_masked.tensor_scatter_nd_add(tensor, indices, u)

    def reference(u):
        return tensor.index_put((indices[:, 0],), u.float(), accumulate=True)

    with torch.autocast("cpu", dtype=torch.bfloat16):
        batched = torch.func.vmap(add)(updates)
        grad = torch.func.grad(lambda u: (add(u) * tensor).sum())(updates[0])
        output, output_tangent = torch.func.jvp(add, (updates[0],), (tangent,))
        with torch.autograd.forward_ad.dual_level():
            dual = add(torch.autograd.forward_ad.make_dual(updates[0], tangent))
            dual_output, dual_tangent = torch.autograd.forward_ad.unpack_dual(dual)
    torch.testing.assert_close(batched, torch.stack([reference(u) for u in updates]))
    assert grad.dtype == torch.bfloat16
    torch.testing.assert_close(grad, tensor[indices[:, 0]].to(torch.bfloat16), rtol=0, atol=0)
    for out, out_tangent in ((output, output_tangent), (dual_output, dual_tangent)):
        torch.testing.assert_close(out, reference(updates[0]))
        assert out_tangent.dtype == torch.float32
        torch.testing.assert_close(out_tangent, torch.zeros(6, 4).index_put((indices[:, 0],), tangent.float(), True))


def test_compiled_autocast_region_equals_eager():
    x, weight, condition, rows, indices = _inputs("cpu")
    tensor = torch.randn(6, 4)

    def step(x, weight):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outputs = {name: ours for name, (ours, _) in _ours_and_native(x, weight, condition, rows, indices).items()}
            outputs["tensor_scatter_nd_add"] = torch_masked.tensor_scatter_nd_add(tensor, indices, (x @ weight)[:3])
        loss = sum(out.float().sum() for out in outputs.values())
        return outputs, loss

    eager, eager_loss = step(x, weight)
    compiled, compiled_loss = torch.compile(step, fullgraph=True, dynamic=False)(x, weight)
    for name, out in eager.items():
        assert compiled[name].dtype == out.dtype, name
        # Inductor keeps a fused chain's bfloat16 intermediates in float32.
        torch.testing.assert_close(compiled[name], out, rtol=1.6e-2, atol=1e-2, msg=name)
    grads = [torch.autograd.grad(loss, (x, weight)) for loss in (eager_loss, compiled_loss)]
    for eager_grad, compiled_grad in zip(*grads):
        torch.testing.assert_close(compiled_grad, eager_grad, rtol=1.6e-2, atol=1e-2)
