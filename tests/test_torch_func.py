"""The ops under torch.func's transforms and torch.autograd.forward_ad
(torch_masked/transforms.py, csrc/autograd/records_graph.h): values against
the same computation written with native PyTorch ops under the same
transform, per-sample gradients against a loop of torch.autograd.grad, vmap
against a loop over the batch with PyTorch's per-sample fallback switched
off (so a batching rule must exist), the refusals, and the ops' errors."""
import itertools
import re

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch.func import grad, hessian, jacfwd, jacrev, jvp, vjp, vmap

import torch_masked

ops = torch.ops.masked
F64 = torch.float64
BATCH = 3


@pytest.fixture(autouse=True)
def no_vmap_fallback():
    """vmap without PyTorch's per-sample loop: an op without a batching rule fails."""
    before = torch._C._functorch._is_vmap_fallback_enabled()
    torch._C._functorch._set_vmap_fallback_enabled(False)
    try:
        yield
    finally:
        torch._C._functorch._set_vmap_fallback_enabled(before)


def rand(*shape, seed=0):
    return torch.randn(shape, dtype=F64, generator=torch.Generator().manual_seed(seed))


def whole(*shape, seed=0):
    return torch.randint(-8, 9, shape, generator=torch.Generator().manual_seed(seed)).to(F64)


def flags(*shape, seed=1):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) > 0.5


def rows_of(indices):
    return tuple(indices.unbind(-1))


# Differentiable cases: name -> (ours through the front door, ours through
# torch.ops.masked, native, differentiable float64 inputs). Non-differentiable
# operands are fixed in the closures.
C_COL, C_FULL, C_ROWS, C_SCALAR = flags(5, 1), flags(5, 4), flags(5), torch.tensor(True)
MASK_1D, MASK_2D = torch.tensor([True, False, True, True, False]), flags(4, 3, seed=2)
INDICES = torch.tensor([[1], [4], [1], [0]])  # a duplicate: rows add up
INDICES_2D = torch.tensor([[[1, 2], [0, 0]], [[1, 2], [4, 3]]])  # [2, 2, 2], a duplicate

CASES = {
    "where": (
        lambda x, y: torch_masked.where(C_COL, x, y),
        lambda x, y: ops.where.self(C_COL, x, y),
        lambda x, y: torch.where(C_COL, x, y),
        (rand(5, 4), rand(4, seed=1)),
    ),
    "where_number_y": (
        lambda x: torch_masked.where(C_FULL, x, 2.5),
        lambda x: ops.where.ScalarOther(C_FULL, x, 2.5),
        lambda x: torch.where(C_FULL, x, 2.5),
        (rand(4),),
    ),
    "where_number_x": (
        lambda y: torch_masked.where(C_COL, -1, y),
        lambda y: ops.where.ScalarSelf(C_COL, -1, y),
        lambda y: torch.where(C_COL, -1, y),
        (rand(5, 4),),
    ),
    "select_rows": (
        lambda x, y: torch_masked.select(C_ROWS, x, y),
        lambda x, y: ops.select(C_ROWS, x, y),
        lambda x, y: torch.where(C_ROWS[:, None], x, y),
        (rand(5, 4), rand(5, 4, seed=1)),
    ),
    "select_elements": (
        lambda x, y: torch_masked.select(C_FULL, x, y),
        lambda x, y: ops.select(C_FULL, x, y),
        lambda x, y: torch.where(C_FULL, x, y),
        (rand(5, 4), rand(5, 4, seed=1)),
    ),
    "select_scalar": (
        lambda x, y: torch_masked.select(C_SCALAR, x, y),
        lambda x, y: ops.select(C_SCALAR, x, y),
        lambda x, y: torch.where(C_SCALAR, x, y),
        (rand(5, 4), rand(5, 4, seed=1)),
    ),
    "boolean_mask": (
        lambda t: torch_masked.boolean_mask(t, MASK_1D),
        lambda t: ops.boolean_mask(t, MASK_1D),
        lambda t: t[MASK_1D],
        (rand(5, 3),),
    ),
    "boolean_mask_2d_mask_axis_1": (
        lambda t: torch_masked.boolean_mask(t, MASK_2D, axis=1),
        lambda t: ops.boolean_mask(t, MASK_2D, -3),
        lambda t: t[:, MASK_2D],
        (rand(2, 4, 3, 2),),
    ),
    "boolean_mask_backward": (
        lambda g: ops.boolean_mask_backward(g, MASK_2D, [2, 4, 3], 1),
        lambda g: ops.boolean_mask_backward(g, MASK_2D, [2, 4, 3], -2),
        lambda g: torch.zeros(4, 3, 2, dtype=F64).index_put((MASK_2D,), g.T).permute(2, 0, 1),
        (rand(2, int(MASK_2D.sum())),),
    ),
    "scatter_nd": (
        lambda u: torch_masked.scatter_nd(INDICES, u, [5, 2]),
        lambda u: ops.scatter_nd(INDICES, u, [5, 2]),
        lambda u: torch.zeros(5, 2, dtype=F64).index_put(rows_of(INDICES), u, accumulate=True),
        (rand(4, 2),),
    ),
    "scatter_nd_2d_indices": (
        lambda u: torch_masked.scatter_nd(INDICES_2D, u, [5, 4]),
        lambda u: ops.scatter_nd(INDICES_2D, u, [5, 4], check_bounds=False),
        lambda u: torch.zeros(5, 4, dtype=F64).index_put(rows_of(INDICES_2D), u, accumulate=True),
        (rand(2, 2),),
    ),
    "gather_nd": (
        lambda p: torch_masked.gather_nd(p, INDICES),
        lambda p: ops.gather_nd(p, INDICES, check_bounds=False),
        lambda p: p[rows_of(INDICES)],
        (rand(5, 2),),
    ),
    "tensor_scatter_nd_add": (
        lambda t, u: torch_masked.tensor_scatter_nd_add(t, INDICES_2D, u),
        lambda t, u: ops.tensor_scatter_nd_add(t, INDICES_2D, u),
        lambda t, u: t.index_put(rows_of(INDICES_2D), u, accumulate=True),
        (rand(5, 4, 3), rand(2, 2, 3, seed=1)),
    ),
}


def loss(fn):
    """A scalar function of the case's inputs, not linear (for hessian)."""
    return lambda *args: fn(*args).sin().sum()


def argnums(inputs):
    return tuple(range(len(inputs)))


def tangents_for(inputs):
    return tuple(rand(*t.shape, seed=10 + k) for k, t in enumerate(inputs))


def jvp_values(fn, inputs):
    return jvp(fn, inputs, tangents_for(inputs))


def vjp_values(fn, inputs):
    out, pullback = vjp(fn, *inputs)
    return out, pullback(rand(*out.shape, seed=20))


def forward_ad_values(fn, inputs):
    with fwAD.dual_level():
        duals = [fwAD.make_dual(p, t) for p, t in zip(inputs, tangents_for(inputs))]
        out = fwAD.unpack_dual(fn(*duals))
        return out.primal, out.tangent


TRANSFORMS = {
    "grad": lambda fn, inputs: grad(loss(fn), argnums=argnums(inputs))(*inputs),
    "vjp": vjp_values,
    "jacrev": lambda fn, inputs: jacrev(fn, argnums=argnums(inputs))(*inputs),
    "jacfwd": lambda fn, inputs: jacfwd(fn, argnums=argnums(inputs))(*inputs),
    "jvp": jvp_values,
    "hessian": lambda fn, inputs: hessian(loss(fn), argnums=argnums(inputs))(*inputs),
    "jacrev_of_jacfwd": lambda fn, inputs: jacrev(jacfwd(lambda a: loss(fn)(a, *inputs[1:])))(inputs[0]),
    "forward_ad": forward_ad_values,
}


@pytest.mark.parametrize("transform", list(TRANSFORMS))
@pytest.mark.parametrize("via", ["front_door", "torch_ops"])
@pytest.mark.parametrize("case", list(CASES))
def test_transform_matches_native(case, via, transform):
    front_door, torch_op, native, inputs = CASES[case]
    ours = front_door if via == "front_door" else torch_op
    expected = TRANSFORMS[transform](native, inputs)
    actual = TRANSFORMS[transform](ours, inputs)
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", list(CASES))
def test_per_sample_gradients_match_a_loop(case):
    front_door, _, _, inputs = CASES[case]
    batched = tuple(torch.stack([rand(*t.shape, seed=30 + b) for b in range(BATCH)]) for t in inputs)
    actual = vmap(grad(loss(front_door), argnums=argnums(inputs)))(*batched)
    for b in range(BATCH):
        sample = [t[b].clone().requires_grad_() for t in batched]
        expected = torch.autograd.grad(loss(front_door)(*sample), sample)
        torch.testing.assert_close(tuple(a[b] for a in actual), expected, rtol=1e-12, atol=1e-12)


def test_gradient_of_the_unselected_branch_is_an_exact_zero():
    """A NaN in the incoming gradient never reaches the branch not chosen."""
    x, y = rand(5, 4), rand(5, 4, seed=1)
    grad_x, grad_y = grad(lambda x, y: (torch_masked.where(C_FULL, x, y) * torch.nan).sum(), argnums=(0, 1))(x, y)
    assert torch.equal(grad_x == 0, ~C_FULL) and torch.equal(grad_y == 0, C_FULL)


def test_where_of_a_complex_and_a_real_operand():
    """The real branch gets the real part of the gradient, as it would
    through a cast to complex (torch.where's own backward refuses this mix)."""
    x, y = rand(5, 4), torch.complex(rand(4, seed=1), rand(4, seed=2))

    def through_cast(x):
        return torch.where(C_COL, x.to(y.dtype), y)

    actual = grad(lambda x: (torch_masked.where(C_COL, x, y) * y).abs().sum())(x)
    expected = grad(lambda x: (through_cast(x) * y).abs().sum())(x)
    assert actual.dtype == F64
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)
    tangent = rand(5, 4, seed=3)
    torch.testing.assert_close(
        jvp(lambda x: torch_masked.where(C_COL, x, y), (x,), (tangent,)),
        jvp(through_cast, (x,), (tangent,)),
    )
    torch.testing.assert_close(forward_ad_values(lambda x: torch_masked.where(C_COL, x, y), (x,)),
                               forward_ad_values(through_cast, (x,)))


def test_forward_ad_where_broadcasts_a_tangent_on_one_branch():
    """Core forward mode: the tangent is expanded to the broadcast result, zero
    where the other branch (without a tangent) was chosen; backward still
    flows from the dual's primal."""
    x = rand(4).requires_grad_()
    y = rand(5, 1, seed=1)
    tangent = rand(4, seed=2)
    with fwAD.dual_level():
        out = torch_masked.where(C_FULL, fwAD.make_dual(x, tangent), y)
        primal, out_tangent = fwAD.unpack_dual(out)
        torch.testing.assert_close(out_tangent, torch.where(C_FULL, tangent, 0.0), rtol=0, atol=0)
        assert out_tangent.shape == (5, 4)
        primal.sum().backward()
    torch.testing.assert_close(x.grad, C_FULL.sum(0).to(F64), rtol=0, atol=0)


@pytest.mark.parametrize("case", list(CASES))
def test_forward_ad_over_backward(case):
    """Core forward mode over torch.autograd.grad(create_graph=True): a
    Hessian-vector product, the backward formulas run on dual tensors."""
    front_door, _, native, inputs = CASES[case]

    def hessian_vector_product(fn):
        leaves = [t.clone().requires_grad_() for t in inputs]
        with fwAD.dual_level():
            duals = [fwAD.make_dual(p, t) for p, t in zip(leaves, tangents_for(inputs))]
            grads = torch.autograd.grad(loss(fn)(*duals), leaves, create_graph=True)
            return [fwAD.unpack_dual(g).tangent for g in grads]

    torch.testing.assert_close(
        hessian_vector_product(front_door), hessian_vector_product(native), rtol=1e-12, atol=1e-12
    )


def test_forward_ad_without_grad_mode_and_dtype_promotion():
    x = torch.randn(3, dtype=torch.float32)
    with torch.no_grad(), fwAD.dual_level():
        out = torch_masked.where(torch.tensor([True, False, True]), fwAD.make_dual(x, torch.ones(3)), rand(3))
        assert fwAD.unpack_dual(out).tangent.dtype == F64
        torch.testing.assert_close(fwAD.unpack_dual(out).tangent, torch.tensor([1.0, 0.0, 1.0], dtype=F64))


# vmap: every mix of batched and unbatched operands against a loop.


def vmap_against_loop(fn, args, in_dims):
    """vmap(fn, in_dims)(*args) against torch.stack of fn on each sample."""
    def sample(arg, dim, b):
        return arg if dim is None else arg.select(dim, b)

    expected = torch.stack([fn(*(sample(a, d, b) for a, d in zip(args, in_dims))) for b in range(BATCH)])
    actual = vmap(fn, in_dims=in_dims)(*args)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


def batched(t, dim):
    """BATCH samples like t (as random as its dtype allows) stacked at dim."""
    gen = torch.Generator().manual_seed(t.numel() + 7 * dim)
    if t.dtype == torch.bool:
        samples = [torch.rand(t.shape, generator=gen) > 0.5 for _ in range(BATCH)]
    elif t.dtype in (torch.int32, torch.int64):  # index rows: each column within its own range in t
        bound = t.reshape(-1, t.shape[-1]).amax(0) + 1 if t.numel() else torch.zeros(t.shape[-1])
        samples = [(torch.rand(t.shape, generator=gen) * bound).to(t.dtype) for _ in range(BATCH)]
    else:
        samples = [torch.randint(-8, 9, t.shape, generator=gen).to(t.dtype) for _ in range(BATCH)]
    return torch.stack(samples, dim)


def mixes(*operands):
    """(args, in_dims) for each choice of batched operands (at least one),
    batched at dimension 0 or, for the second choice, at the last dimension."""
    tensors = [k for k, v in enumerate(operands) if isinstance(v, torch.Tensor)]
    for count in range(1, len(tensors) + 1):
        for chosen in itertools.combinations(tensors, count):
            for last in (False, True):
                in_dims = [None] * len(operands)
                args = list(operands)
                for k in chosen:
                    in_dims[k] = operands[k].dim() if last else 0
                    args[k] = batched(operands[k], in_dims[k])
                yield args, tuple(in_dims)


WHERE_CONDITION = flags(5, 1)
UINT8_0D = torch.tensor(2, dtype=torch.uint8)
VMAP_CASES = {
    "where": (torch_masked.where, (WHERE_CONDITION, rand(5, 4), rand(4))),
    "where_int_and_float": (torch_masked.where, (WHERE_CONDITION, torch.arange(4), rand(5, 1).float())),
    "where.self": (ops.where.self, (flags(4), rand(3, 1), rand(1).squeeze())),
    "where_number_y": (lambda c, x: torch_masked.where(c, x, 2.5), (WHERE_CONDITION, rand(4))),
    "where_number_x": (lambda c, y: ops.where.ScalarSelf(c, 1j, y), (flags(4), rand(5, 1))),
    # Per sample both are 0-d and promote as equals (int16); a batched one has
    # a dimension, which would win the promotion (uint8) if left to decide it.
    "where_0d_of_two_dtypes": (torch_masked.where, (flags(4), torch.tensor(300, dtype=torch.int16), UINT8_0D)),
    "where_0d_of_two_floats": (torch_masked.where, (torch.tensor(True), torch.tensor(0.1, dtype=F64), torch.tensor(2.5))),
    "select_rows": (torch_masked.select, (flags(5), rand(5, 4), rand(5, 4))),
    "select_elements": (torch_masked.select, (flags(5, 4), rand(5, 4), rand(5, 4))),
    "select_scalar": (torch_masked.select, (torch.tensor(False), rand(5, 4), rand(5, 4))),
    "select_1d": (ops.select, (flags(5), rand(5), rand(5))),
    "select_0d_of_two_dtypes": (torch_masked.select, (torch.tensor(False), torch.tensor(300, dtype=torch.int16), UINT8_0D)),
    "boolean_mask": (lambda t: torch_masked.boolean_mask(t, MASK_1D), (rand(5, 3),)),
    "boolean_mask_2d_mask": (lambda t: torch_masked.boolean_mask(t, MASK_2D, axis=-2), (rand(2, 4, 3),)),
    "boolean_mask_backward": (
        lambda g: ops.boolean_mask_backward(g, MASK_2D, [2, 4, 3, 2], 1),
        (rand(2, int(MASK_2D.sum()), 2),),
    ),
    "gather_nd": (torch_masked.gather_nd, (rand(5, 4, 2), INDICES_2D)),
    "gather_nd_element": (torch_masked.gather_nd, (rand(5, 4), INDICES_2D.int())),
    "gather_nd_no_depth": (torch_masked.gather_nd, (rand(5, 4), torch.zeros(2, 0, dtype=torch.long))),
    # Whole numbers: their sums are exact in any order, as the CUDA kernels add them.
    "scatter_nd": (lambda i, u: torch_masked.scatter_nd(i, u, [5, 4, 2]), (INDICES_2D, whole(2, 2, 2))),
    "scatter_nd_rows": (lambda i, u: ops.scatter_nd(i, u, [5, 3]), (INDICES, whole(4, 3))),
    "tensor_scatter_nd_add": (torch_masked.tensor_scatter_nd_add, (whole(5, 4, 2), INDICES_2D, whole(2, 2, 2))),
    "tensor_scatter_nd_add_elements": (torch_masked.tensor_scatter_nd_add, (whole(5, 4), INDICES_2D, whole(2, 2))),
}


@pytest.mark.parametrize("case", list(VMAP_CASES))
def test_vmap_of_every_mix_matches_a_loop(case):
    fn, operands = VMAP_CASES[case]
    for args, in_dims in mixes(*operands):
        vmap_against_loop(fn, args, in_dims)


def nonzero_static_input():
    x = rand(BATCH, 4, 3)
    x[x.abs() < 0.7] = 0
    x[0, 0, 0], x[1, 1, 1], x[2] = -0.0, torch.nan, 0  # -0.0 is zero, NaN counts; one sample empty
    return x


@pytest.mark.parametrize("dtype", [F64, torch.float16, torch.int32, torch.bool, torch.complex64, torch.uint16])
@pytest.mark.parametrize("size", [0, 2, 5, 20])
def test_vmap_nonzero_static_matches_a_loop(dtype, size):
    x = nonzero_static_input()
    x = x.to(dtype) if not dtype.is_complex else torch.complex(x, x.flip(0)).to(dtype)
    for fill_value in (-1, 7):
        def fn(t):
            return torch_masked.nonzero_static(t, size=size, fill_value=fill_value)

        for dim in (0, 2):
            vmap_against_loop(fn, (x.movedim(0, dim),), (dim,))
    expected = torch.stack([torch.nonzero_static(s, size=size) for s in x.to(torch.bool)])
    torch.testing.assert_close(vmap(lambda t: ops.nonzero_static(t, size=size))(x), expected)


def test_vmap_nonzero_static_of_a_0d_sample():
    vmap_against_loop(lambda t: torch_masked.nonzero_static(t, size=2), (torch.tensor([0.0, 1.0, 2.0]),), (0,))


@pytest.mark.parametrize("sample_shape", [(0,), (3, 0), (0, 3)])
def test_vmap_nonzero_static_of_empty_samples(sample_shape):
    vmap_against_loop(lambda t: torch_masked.nonzero_static(t, size=2), (torch.zeros(BATCH, *sample_shape),), (0,))


@pytest.mark.parametrize("sample_shape", [(), (4,), (3, 0)])
def test_vmap_nonzero_static_of_no_samples(sample_shape):
    out = vmap(lambda t: torch_masked.nonzero_static(t, size=2))(torch.zeros(0, *sample_shape))
    assert out.shape == (0, 2, len(sample_shape)) and out.dtype == torch.int64


def test_nested_vmap():
    x, c = rand(2, BATCH, 5, 4), flags(2, 5, 1)
    actual = vmap(vmap(torch_masked.where, in_dims=(None, 0, None)), in_dims=(0, 0, None))(c, x, 0.5)
    torch.testing.assert_close(actual, torch.where(c[:, None], x, 0.5), rtol=0, atol=0)
    params, indices = rand(2, BATCH, 5, 4), torch.randint(0, 5, (2, 6, 1))
    actual = vmap(vmap(torch_masked.gather_nd, in_dims=(0, None)))(params, indices)
    torch.testing.assert_close(actual, torch.stack([params[i][:, indices[i, :, 0]] for i in range(2)]), rtol=0, atol=0)


def test_grad_and_jvp_pass_through_the_integer_ops():
    x = rand(5, 4)
    c = x > 0
    expected = torch.nonzero(c).sum() * 2 * x
    torch.testing.assert_close(grad(lambda x: torch_masked.nonzero(c).sum() * (x**2).sum())(x), expected)
    torch.testing.assert_close(grad(lambda x: torch_masked.where(x > 0).sum() * (x**2).sum())(x), expected)
    rows = grad(lambda x: torch_masked.nonzero(x, as_tuple=True)[0].sum() * x.sum())(x)
    torch.testing.assert_close(rows, torch.nonzero(x, as_tuple=True)[0].sum().to(F64).expand(5, 4))
    out, tangent = jvp(lambda x: torch_masked.nonzero_static(x, size=3).to(F64) * x.sum(), (x,), (torch.ones(5, 4),))
    torch.testing.assert_close(tangent, torch.nonzero_static(x, size=3).to(F64) * 20)
    # One output per dimension of x, each without a tangent (integers).
    out, tangent = jvp(lambda x: torch_masked.nonzero(x, as_tuple=True), (x,), (torch.ones(5, 4),))
    expected_out, expected_tangent = jvp(lambda x: torch.nonzero(x, as_tuple=True), (x,), (torch.ones(5, 4),))
    for actual, expected in zip([*out, *tangent], [*expected_out, *expected_tangent], strict=True):
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)


# Refusals: a per-sample result of data-dependent size.

X_BATCH, MASKS = rand(BATCH, 3), flags(BATCH, 3)
REFUSED = {
    "nonzero": (torch_masked.nonzero, (X_BATCH,), 0),
    "nonzero_tuple": (lambda x: torch_masked.nonzero(x, as_tuple=True), (X_BATCH,), 0),
    "where": (torch_masked.where, (MASKS,), 0),
    "boolean_mask": (torch_masked.boolean_mask, (X_BATCH[0], MASKS), (None, 0)),
    "boolean_mask_with_batched_data": (torch_masked.boolean_mask, (X_BATCH, MASKS.T), (0, 1)),
    "boolean_mask_backward": (
        lambda g, m: ops.boolean_mask_backward(g, m, [3], 0),
        (X_BATCH[:, :1], MASKS),
        (0, 0),
    ),
    "boolean_mask_backward_with_the_mask_batched_outside": (
        lambda m: vmap(lambda g: ops.boolean_mask_backward(g, m, [3], 0))(X_BATCH[:4, :2]),
        (torch.tensor([[True, False, True], [False, True, True]]),),
        0,
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_vmap_refuses_data_dependent_sizes(case):
    fn, args, in_dims = REFUSED[case]
    op = case.split("_with")[0]
    with pytest.raises(RuntimeError, match=rf"^{op}: vmap over a batched (mask|input) is not supported"):
        vmap(fn, in_dims=in_dims)(*args)


# The ops' own errors under every transform: the exception an eager call raises.

Y3, Y53, Y1, Y44 = rand(3), rand(5, 3), rand(1), rand(4, 4).float()
ERRORS = {
    "where_condition_dtype": (lambda x: torch_masked.where(x.long(), x, 0.0), (5, 4)),
    "where_broadcast": (lambda x: torch_masked.where(C_COL, x, Y3), (5, 4)),
    "select_shapes": (lambda x: torch_masked.select(C_ROWS, x, Y53), (5, 4)),
    "select_condition": (lambda x: torch_masked.select(MASK_2D[0], x, x), (5, 4)),
    "boolean_mask_shape": (lambda t: torch_masked.boolean_mask(t, MASK_2D[:, 0]), (5, 4)),
    "boolean_mask_axis": (lambda t: torch_masked.boolean_mask(t, MASK_2D[:, 0], axis=2), (5, 4)),
    "boolean_mask_dtype": (lambda t: torch_masked.boolean_mask(t, MASK_1D.int()), (5, 4)),
    "boolean_mask_backward_grad_shape": (lambda g: ops.boolean_mask_backward(g, MASK_1D, [5, 4], 0), (2, 4)),
    "gather_nd_bad_index": (lambda p: torch_masked.gather_nd(p, torch.tensor([[1, 0], [5, 1]])), (5, 4)),
    "gather_nd_index_dtype": (lambda p: torch_masked.gather_nd(p, torch.tensor([[1.0]])), (5, 4)),
    "scatter_nd_bad_index": (lambda u: torch_masked.scatter_nd(torch.tensor([[0], [-1]]), u, [5, 4]), (2, 4)),
    "scatter_nd_updates_shape": (lambda u: torch_masked.scatter_nd(INDICES, u, [5, 4]), (2, 4)),
    "tensor_scatter_nd_add_bad_index": (
        lambda t: torch_masked.tensor_scatter_nd_add(t, torch.tensor([[2, 4]]), Y1),
        (5, 4),
    ),
    "tensor_scatter_nd_add_dtype": (
        lambda t: torch_masked.tensor_scatter_nd_add(t, INDICES, Y44),
        (5, 4),
    ),
    "nonzero_static_size": (lambda x: torch_masked.nonzero_static(x, size=-1).to(F64) * x.sum(), (5, 4)),
}

ERROR_TRANSFORMS = {
    "grad": lambda fn, x: grad(lambda x: fn(x).sum())(x),
    "jacfwd": lambda fn, x: jacfwd(fn)(x),
    "jvp": lambda fn, x: jvp(fn, (x,), (x,)),
    "vmap": lambda fn, x: vmap(fn)(torch.stack([x] * BATCH)),
    "vmap_last_dim": lambda fn, x: vmap(fn, in_dims=-1)(torch.stack([x] * BATCH, -1)),
    "vmap_of_grad": lambda fn, x: vmap(grad(lambda x: fn(x).sum()))(torch.stack([x] * BATCH)),
    "forward_ad": lambda fn, x: forward_ad_values(fn, (x,)),
}


# A grad of the wrong length is checked by the CPU kernel only (on CUDA it is
# never read out of bounds).
CPU_KERNEL_ERRORS = {"boolean_mask_backward_grad_shape"}


@pytest.mark.parametrize("transform", list(ERROR_TRANSFORMS))
@pytest.mark.parametrize(
    "case", [pytest.param(case, marks=pytest.mark.cpu_kernel) if case in CPU_KERNEL_ERRORS else case for case in ERRORS]
)
def test_errors_under_transforms_are_the_eager_ones(case, transform):
    fn, shape = ERRORS[case]
    x = rand(*shape)
    with pytest.raises(Exception) as eager:
        fn(x)
    with pytest.raises(type(eager.value), match="^" + re.escape(str(eager.value).splitlines()[0])):
        ERROR_TRANSFORMS[transform](fn, x)


def test_vmap_index_error_names_the_samples_index_row():
    """With batched indices, the message names the sample's shape and row."""
    params, indices = rand(5, 4), torch.tensor([[[0, 1]], [[1, 4]], [[0, 0]]])
    with pytest.raises(IndexError) as eager:
        torch_masked.gather_nd(params, indices[1])
    with pytest.raises(IndexError, match="^" + re.escape(str(eager.value).splitlines()[0]) + "$"):
        vmap(torch_masked.gather_nd, in_dims=(None, 0))(params, indices)
    # Nested: the indices batched by the outer vmap only, or by both.
    calls = {
        "gather_nd": lambda i: torch_masked.gather_nd(params, i),
        "scatter_nd": lambda i: torch_masked.scatter_nd(i, torch.ones(1, dtype=F64), [5, 4]),
        "tensor_scatter_nd_add": lambda i: torch_masked.tensor_scatter_nd_add(params, i, torch.ones(1, dtype=F64)),
    }
    for op, fn in calls.items():
        with pytest.raises(IndexError) as eager:
            fn(indices[1])
        message = "^" + re.escape(str(eager.value).splitlines()[0]) + "$"
        assert str(eager.value).startswith(f"{op}: ")
        with pytest.raises(IndexError, match=message):
            vmap(vmap(fn))(indices[:, None])
        with pytest.raises(IndexError, match=message):
            vmap(lambda i: vmap(lambda p: fn(i))(Y3))(indices)
        with pytest.raises(IndexError, match=message):
            vmap(lambda i: grad(lambda p: vmap(lambda q: fn(i).sum() * q)(p).sum())(Y3))(indices)
    # check_bounds=False: the bad row reads as zeros, as in eager.
    out = vmap(lambda i: torch_masked.gather_nd(params, i, check_bounds=False))(indices)
    torch.testing.assert_close(out, torch.stack([params[0, 1], torch.zeros((), dtype=F64), params[0, 0]])[:, None])


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compiled_vmap_checks_indices_as_eager(dynamic):
    """torch.compile(vmap(...), fullgraph=True) of the checked index ops (per-
    sample gradients among them): the values of eager vmap, and its IndexError."""
    params, indices, updates = rand(3, 6, 5), torch.tensor([[[5], [0]], [[2], [2]], [[1], [4]]]), rand(3, 2, 5)
    calls = {
        "gather_nd": (vmap(torch_masked.gather_nd), (params, indices)),
        "gather_nd_shared_indices": (vmap(torch_masked.gather_nd, in_dims=(0, None)), (params, indices[0])),
        "per_sample_grad": (vmap(grad(lambda p, i: (torch_masked.gather_nd(p, i) ** 2).sum())), (params, indices)),
        "scatter_nd": (vmap(lambda i, u: torch_masked.scatter_nd(i, u, [6, 5])), (indices, updates)),
        "tensor_scatter_nd_add": (vmap(torch_masked.tensor_scatter_nd_add), (params, indices, updates)),
    }
    for name, (fn, args) in calls.items():
        torch._dynamo.reset()
        compiled = torch.compile(fn, fullgraph=True, dynamic=dynamic)
        # Not to the bit: on CUDA, duplicate indices add in any order.
        torch.testing.assert_close(compiled(*args), fn(*args), msg=name)
        bad = [a.clone() for a in args]
        index = next(a for a in bad if a.dtype == torch.int64)
        index.view(-1)[-1] = 6
        with pytest.raises(IndexError) as eager:
            fn(*bad)
        with pytest.raises(IndexError, match="^" + re.escape(str(eager.value)) + "$"):
            compiled(*bad)


def test_compiled_vmap_of_boolean_mask_runs_as_native_does():
    """A vmap whose result's size depends on the data: with fullgraph=True
    ours compiles, or fails, as x[:, mask] does (torch 2.14 fails to trace
    both: the README's known limit); without, values as eager's."""
    x, mask = rand(3, 2, 4), torch.tensor([True, False, True, True])
    ours, native = vmap(lambda t: torch_masked.boolean_mask(t, mask, axis=1)), vmap(lambda t: t[:, mask])

    def outcome(fn):
        torch._dynamo.reset()
        try:
            return torch.compile(fn, fullgraph=True)(x)
        except Exception as error:  # noqa: BLE001 -- PyTorch's own failure, compared below
            return f"{type(error).__name__}: {str(error).splitlines()[0]}"

    ours_outcome, native_outcome = outcome(ours), outcome(native)
    if isinstance(native_outcome, str):
        assert ours_outcome == native_outcome
    else:
        torch.testing.assert_close(ours_outcome, native_outcome, rtol=0, atol=0)
    for fn in (ours, native):
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(fn)(x), x[:, :, mask], rtol=0, atol=0)


def test_vmap_int32_indices_into_a_dimension_past_int32():
    """int32 indices are checked against sizes of 2**31 and more as in eager
    (zero-width slices: no memory behind the shapes)."""
    n = 2**31 + 1
    indices = torch.tensor([[5], [2**31 - 1]], dtype=torch.int32).expand(3, 2, 1)
    params = torch.zeros(n, 0, dtype=F64)
    assert vmap(lambda i: torch_masked.gather_nd(params, i))(indices).shape == (3, 2, 0)
    assert vmap(lambda i: torch_masked.scatter_nd(i, torch.zeros(2, 0, dtype=F64), [n, 0]))(indices).shape == (3, n, 0)
    assert vmap(lambda i: torch_masked.tensor_scatter_nd_add(params, i, torch.zeros(2, 0, dtype=F64)))(indices).shape == (3, n, 0)
    with pytest.raises(IndexError, match=r"got \[5\] at indices\[0\] \(5 is out of range for dimension 0 of size 5\)"):
        vmap(lambda i: torch_masked.gather_nd(torch.zeros(5, 0), i))(indices)
