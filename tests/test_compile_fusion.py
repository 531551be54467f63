"""where and select inside graphs compiled by Inductor (torch_masked/compile.py):
values against eager torch.where and our eager kernels for every overload
and dtype pair, fused (no call of our op in the generated code) or declined;
compiled backward, and compiled autograd over every op; freezing's folding
of them; torch.export keeping masked:: ops; the opaque switch.

Compiles cost seconds here, so each test compiles one graph holding many
cases. What is tested is Inductor's code on the CPU, not our kernels, so the
tests are marked cpu_kernel: the CUDA kernels' emulated run leaves them out.
The tests that take `device` run on CUDA where there is a GPU, and
everywhere as the Triton code Inductor generates for a GPU, run by Triton's
interpreter and compiled for sm_90 (tests/test_triton_interpreted.py): on
the CPU, that tests the GPU's generated code short of running it on a GPU."""
import contextlib
import itertools
import os
import pathlib
import re
import shutil
import subprocess
import sys
import warnings

import pytest
import torch
import torch.utils._triton as torch_triton
from torch._dynamo.utils import counters
from torch._inductor import config as inductor_config, cpu_vec_isa
from torch._inductor.utils import run_and_get_code
from torch.fx.experimental import _config as fx_config

import torch_masked
from tests.common import (
    COMPLEX_DTYPES,
    DEVICES,
    FLOAT_DTYPES,
    INTEGER_DTYPES,
    deterministic_algorithms,
    make_tensor,
    non_contiguous,
)

# The dtypes Inductor generates where for, and those it does not (declined,
# so our kernel runs inside the compiled graph).
FUSED = [torch.bool] + INTEGER_DTYPES + FLOAT_DTYPES
DECLINED = COMPLEX_DTYPES
NUMBERS = [True, 7, -2.5, 1.5j]

pytestmark = pytest.mark.cpu_kernel

OUR_CALL = re.compile(r"torch\.ops\.masked\.(where|select)\b")


# Set when Triton was imported: its interpreter runs the kernels that Inductor
# generates as Triton code (tests/test_triton_interpreted.py).
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@contextlib.contextmanager
def triton_code_for_cpu_tensors():
    """Inductor generates Triton code, the code it generates for a GPU, for
    CPU tensors, which Triton's interpreter runs: the GPU's path short of the
    GPU. Triton asks its active driver only for the target to compile for;
    where there is none (no GPU), it is told a Hopper GPU's, as on the GPU
    machines."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget

    class HopperTarget:
        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

    try:
        triton.runtime.driver.active
    except RuntimeError:  # no driver
        triton.runtime.driver.set_active(HopperTarget())
    try:
        with warnings.catch_warnings(), inductor_config.patch(cpu_backend="triton"):
            warnings.filterwarnings("ignore", "Could not find an active CPU backend")
            yield
    finally:
        if isinstance(triton.runtime.driver.active, HopperTarget):
            triton.runtime.driver.set_active(None)
        # The target is cached for the process.
        torch_triton.triton_backend.cache_clear()
        torch_triton.triton_hash_with_backend.cache_clear()


# Inductor's code on each device: C++ on the CPU and Triton on CUDA; in the
# process that interprets Triton, Triton for CPU tensors ("triton-interpreted").
@pytest.fixture(params=["triton-interpreted"] if INTERPRETED else DEVICES)
def device(request):
    if request.param != "triton-interpreted":
        yield request.param
        return
    with triton_code_for_cpu_tensors():
        yield "cpu"


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def exact(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def matches(actual, expected):
    """Exactly equal, but where Triton's interpreter made a bfloat16 result:
    it rounds wider floats to bfloat16 toward zero, where ATen and a GPU
    round to nearest."""
    if INTERPRETED and actual.dtype == torch.bfloat16:
        torch.testing.assert_close(actual, expected)
    else:
        exact(actual, expected)


def every_pair(condition, tensors, numbers):
    """where.self for every ordered pair of tensors (condition [r, c], the
    first of a pair [r, c], the second [c], so both broadcast) and of each
    tensor with the first two as 0-d tensors (which promote as numbers do),
    and where.ScalarOther / ScalarSelf for every tensor and number."""
    results = [torch_masked.where(condition, x, y[0]) for x in tensors for y in tensors]
    results += [torch_masked.where(condition, x, y[0, 0]) for x in tensors for y in tensors[:2]]
    for x in tensors:
        for number in numbers:
            results.append(torch_masked.where(condition, x, number))
            results.append(torch_masked.where(condition, number, x))
    return results


def references(condition, tensors, numbers):
    results = [torch.where(condition, x, y[0]) for x in tensors for y in tensors]
    results += [torch.where(condition, x, y[0, 0]) for x in tensors for y in tensors[:2]]
    for x in tensors:
        for number in numbers:
            results += [torch.where(condition, x, number), torch.where(condition, number, x)]
    return results


def pair_inputs(rows, cols, dtypes, seed, device):
    condition = make_tensor((rows, cols), torch.bool, device, generator=gen(seed))
    tensors = [make_tensor((rows, cols), dtype, device, generator=gen(seed + k)) for k, dtype in enumerate(dtypes)]
    return condition, tensors


# Static shapes: every pair; dynamic shapes (whose handling does not depend on
# the dtype): a few, for a graph that compiles in less time. The first two
# dtypes, float64 and int16, also come as 0-d tensors. The complex number
# beside float16 (bfloat16) makes complex32 (bcomplex32), which torch warns
# is experimental; torch 2.11's Inductor warns, once, of the complex results
# it leaves to our kernel.
@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.filterwarnings("ignore:BComplex32 support is experimental")
@pytest.mark.filterwarnings("ignore:Torchinductor does not support code generation for complex operators")
@pytest.mark.parametrize(
    "dynamic, dtypes",
    [
        (False, [torch.float64, torch.int16] + [t for t in FUSED + DECLINED if t not in (torch.float64, torch.int16)]),
        (True, [torch.float64, torch.int16, torch.bool, torch.float16, torch.complex64]),
    ],
    ids=["static", "dynamic"],
)
def test_every_overload_and_dtype_pair_matches_eager(dynamic, dtypes, device):
    counters.clear()
    torch._dynamo.reset()
    compiled = torch.compile(every_pair, fullgraph=True, dynamic=dynamic)
    # Static: one shape; dynamic: a second shape reuses the graph.
    for rows, cols in [(3, 5)] + ([(6, 2)] if dynamic else []):
        condition, tensors = pair_inputs(rows, cols, dtypes, seed=rows, device=device)
        results = compiled(condition, tensors, NUMBERS)
        eager = every_pair(condition, tensors, NUMBERS)
        for result, ours, reference in zip(results, eager, references(condition, tensors, NUMBERS), strict=True):
            matches(result, reference)
            matches(result, ours)
            assert result.is_contiguous()
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("opaque", [False, True], ids=["fused", "opaque"])
def test_where_broadcasts_a_size_traced_at_one_under_backed_size_oblivious(opaque):
    # With backed_size_oblivious, a size traced at 1 is not specialised;
    # torch.where's fake kernel specialises it where it broadcasts against
    # another size, and so does ours, rather than refusing the shapes.
    def chain(c, x, y):
        return torch_masked.where(c, x, y) * 2

    torch._dynamo.reset()
    with fx_config.patch(backed_size_oblivious=True), torch_masked.compile.opaque(opaque):
        compiled = torch.compile(chain, fullgraph=True, dynamic=True)
        for rows, cols in [(1, 4), (1, 7), (3, 3)]:
            c = torch.rand(rows, generator=gen(rows)) < 0.5
            x, y = torch.randn(cols, generator=gen(cols)), torch.arange(cols, dtype=torch.int32)
            exact(compiled(c, x, y), torch.where(c, x, y) * 2)


def test_fused_where_and_select_leave_no_call_of_ours(device):
    def chain(c, rows, x, y):
        same = torch_masked.where(c, x * 2, y + 1)  # where.self
        number = torch_masked.where(x > 0, x, 0.0) + torch_masked.where(x < 1, 3, y)  # ScalarOther, ScalarSelf
        picked = torch_masked.select(rows, same, number) + torch_masked.select(c, x, y)  # rows, same shape
        scalar = torch_masked.select(c[0, 0], x, y.double())  # a 0-d condition, promoted
        return picked * 3, scalar

    c = make_tensor((6, 5), torch.bool, device, generator=gen(1))
    rows = make_tensor((6,), torch.bool, device, generator=gen(2))
    x, y = torch.randn(6, 5, generator=gen(3)).to(device), torch.randn(6, 5, generator=gen(4)).to(device)
    result, code = run_and_get_code(torch.compile(chain, fullgraph=True), c, rows, x, y)
    assert not OUR_CALL.search("\n".join(code))
    same = torch.where(c, x * 2, y + 1)
    number = torch.where(x > 0, x, 0.0) + torch.where(x < 1, 3.0, y)
    expected = (torch.where(rows[:, None], same, number) + torch.where(c, x, y)) * 3
    exact(result[0], expected)
    exact(result[1], torch.where(c[0, 0], x.double(), y.double()))


def test_select_rows_scalar_and_same_shape_every_rank(device):
    def selections(conditions, x, y):
        return [torch_masked.select(c, x, y) for c in conditions]

    for shape in [(4,), (4, 3), (4, 3, 2)]:
        x = make_tensor(shape, torch.int32, device, generator=gen(5))
        y = make_tensor(shape, torch.float16, device, generator=gen(6))
        conditions = [
            make_tensor((), torch.bool, device, generator=gen(7)),
            make_tensor(shape, torch.bool, device, generator=gen(8)),
            make_tensor((4,), torch.bool, device, generator=gen(9)),
        ]
        results, code = run_and_get_code(torch.compile(selections, fullgraph=True), conditions, x, y)
        assert not OUR_CALL.search("\n".join(code))
        for c, result, ours in zip(conditions, results, selections(conditions, x, y), strict=True):
            expected = torch.where(c.reshape([-1] + [1] * (len(shape) - 1)) if c.dim() == 1 else c, x, y)
            exact(result, expected)
            exact(result, ours)


def test_non_contiguous_operands_give_a_contiguous_result(device):
    c = make_tensor((5, 4), torch.bool, device, generator=gen(10))
    x = make_tensor((4, 5), torch.float32, device, generator=gen(11)).t()
    y = non_contiguous(make_tensor((5, 4), torch.float64, device, generator=gen(12)))
    fn = torch.compile(lambda c, x, y: (torch_masked.where(c, x, y), torch_masked.select(c.t(), x.t(), y.t())), fullgraph=True)
    where, select = fn(c, x, y)
    exact(where, torch.where(c, x, y))
    exact(select, torch.where(c.t(), x.t(), y.t()))
    assert where.is_contiguous() and select.is_contiguous()


def training_loss(rows, c, w, b, x):
    hidden = torch_masked.where(c, x * w, b.double())  # b [features] broadcast; float32 w meets float64
    # square, not tanh: Triton's interpreter lacks libdevice, float64's tanh and exp.
    hidden = torch_masked.select(rows, hidden, hidden.square())
    hidden = torch_masked.where(hidden > -1, hidden, -1.0)  # where.ScalarOther
    return (torch_masked.where(hidden > 0, hidden, 0.1 * hidden) * torch_masked.where(rows[:, None], 1.0, 0.5)).sum()


@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_backward_matches_eager_and_is_fused(device, dynamic):
    # The backward formulas call where.ScalarOther / ScalarSelf against 0,
    # sum_to_size and casts: they fuse too.
    counters.clear()
    torch._dynamo.reset()
    compiled = torch.compile(training_loss, fullgraph=True, dynamic=dynamic)
    for batch in (6, 9) if dynamic else (6,):
        rows = make_tensor((batch,), torch.bool, device, generator=gen(batch))
        c = make_tensor((batch, 1), torch.bool, device, generator=gen(batch + 1))
        x = torch.randn(batch, 5, generator=gen(batch + 2)).to(device)
        grads = []
        for fn in (training_loss, compiled):
            w = torch.randn(5, generator=gen(7)).to(device).requires_grad_()
            b = torch.randn(5, generator=gen(8)).to(device).requires_grad_()

            def step():
                loss = fn(rows, c, w, b, x)
                return (loss.detach(), *torch.autograd.grad(loss, (w, b)))

            if fn is compiled and batch == 6:  # run_and_get_code starts from a Dynamo reset
                values, code = run_and_get_code(step)
                assert len(code) == 2 and not OUR_CALL.search("\n".join(code))  # forward and backward
            else:
                values = step()
            grads.append(values)
        for eager, compiled_value in zip(*grads, strict=True):
            torch.testing.assert_close(compiled_value, eager)
        assert grads[1][1].dtype == torch.float32 and grads[1][2].dtype == torch.float32
    assert counters["stats"]["unique_graphs"] == 1


def every_op_loss(c, indices, x, y):
    return (torch_masked.where(c, x, y).sum() + torch_masked.select(c, x, y).square().sum()
            + torch_masked.where(c, x, 0.5).sum() + torch_masked.where(c, 0.5, y).square().sum()
            + torch_masked.gather_nd(x, indices).sum() + torch_masked.boolean_mask(y, c).square().sum()
            + torch_masked.scatter_nd(indices, x[:4], [10]).square().sum()
            + torch_masked.tensor_scatter_nd_add(x, indices, y[:4]).square().sum())


@pytest.mark.parametrize("forward", ["compiled", "eager"])
def test_compiled_autograd_takes_every_op_backward(forward):
    """torch._dynamo.config.compiled_autograd: the backward of a compiled
    step is traced and compiled too, through the backward graphs of compiled
    forwards and, for a forward left eager (boolean_mask's size known only at
    run time breaks the graph; or every op, below), our C++ autograd nodes."""
    c = make_tensor((10,), torch.bool, "cpu", generator=gen(40))
    indices = torch.randint(0, 10, (4, 1), generator=gen(41))
    x, y = torch.randn(10, generator=gen(42)), torch.randn(10, generator=gen(43))
    loss_of = every_op_loss if forward == "compiled" else torch.compiler.disable(every_op_loss)

    def step(x, y):
        loss = loss_of(c, indices, x, y)
        loss.backward()
        return loss.detach()

    def loss_and_grads(run):
        leaves = x.clone().requires_grad_(), y.clone().requires_grad_()
        return run(*leaves), *(leaf.grad for leaf in leaves)

    expected = loss_and_grads(step)
    counters.clear()
    torch._dynamo.reset()
    with torch._dynamo.config.patch(compiled_autograd=True):
        actual = loss_and_grads(torch.compile(step))
    assert counters["compiled_autograd"]["captures"] == 1
    for compiled_value, eager in zip(actual, expected, strict=True):
        torch.testing.assert_close(compiled_value, eager)


def test_compiled_autograd_traces_our_cpp_autograd_nodes():
    """The backward of an eager forward, compiled with fullgraph=True: each
    C++ autograd node is traced into the graph (a node run eagerly would be
    a graph break, an error here)."""
    c = make_tensor((10,), torch.bool, "cpu", generator=gen(44))
    indices = torch.randint(0, 10, (4, 1), generator=gen(45))
    x, y = torch.randn(10, generator=gen(46)), torch.randn(10, generator=gen(47))
    grads = []
    for compile_backward in (False, True):
        leaves = x.clone().requires_grad_(), y.clone().requires_grad_()
        loss = every_op_loss(c, indices, *leaves)
        torch._dynamo.reset()
        counters.clear()
        with (torch._dynamo.compiled_autograd._enable(torch.compile(fullgraph=True)) if compile_backward
              else contextlib.nullcontext()):
            loss.backward()
        grads.append([leaf.grad for leaf in leaves])
    assert counters["compiled_autograd"]["captures"] == 1
    for eager, compiled_value in zip(*grads, strict=True):
        torch.testing.assert_close(compiled_value, eager)


def test_declined_cases_run_our_kernel_and_raise_as_eager():
    # A number that does not fit the dtype: our kernel raises, as eager does;
    # a complex result is not fused.
    fn = torch.compile(lambda c, x: torch_masked.where(c, x, 1000), fullgraph=True)
    c = torch.tensor([True, False])
    with pytest.raises(RuntimeError) as eager:
        torch_masked.where(c, torch.ones(2, dtype=torch.int8), 1000)
    with pytest.raises(RuntimeError) as compiled:
        fn(c, torch.ones(2, dtype=torch.int8))
    # Raised by our kernel when the graph runs, not by a decomposition's
    # torch.where while it compiles (a BackendCompilerFailed).
    assert type(compiled.value) is type(eager.value) and str(eager.value) in str(compiled.value)
    with pytest.raises(RuntimeError) as eager:
        torch_masked.where(c, torch.ones(2), 1e40)
    with pytest.raises(RuntimeError) as compiled:
        torch.compile(lambda c, x: torch_masked.where(c, x, 1e40), fullgraph=True)(c, torch.ones(2))
    assert type(compiled.value) is type(eager.value) and str(eager.value) in str(compiled.value)
    x = torch.randn(2, dtype=torch.complex64)
    result, code = run_and_get_code(torch.compile(lambda c, x: torch_masked.where(c, x, 2.0) * 2, fullgraph=True), c, x)
    assert "torch.ops.masked.where.ScalarOther" in "\n".join(code)
    exact(result, torch.where(c, x, 2.0) * 2)


@pytest.mark.parametrize("chain, dynamic", [
    (lambda c, x, n: (torch_masked.where(c, 70000, x) + 1).sum(), False),
    (lambda c, x, n: torch_masked.where(c, x, n.shape[0] * 1000) * 2, True),
], ids=["number x", "y known at run time"])
def test_numbers_that_do_not_fit_raise_as_eager_where_the_result_has_no_elements(chain, dynamic):
    # Inductor reads nothing of a result without elements, and would drop
    # our kernel's call, and with it the error for the number.
    compiled = torch.compile(chain, fullgraph=True, dynamic=dynamic)
    c, x = torch.ones(0, dtype=torch.bool), torch.ones(0, dtype=torch.int8)
    for n in (torch.ones(3), torch.ones(5)):
        with pytest.raises(RuntimeError) as eager:
            chain(c, x, n)
        with pytest.raises(RuntimeError) as fused:
            compiled(c, x, n)
        assert type(fused.value) is type(eager.value) and str(fused.value) == str(eager.value)
    # A number that fits raises nothing.
    fits = torch.compile(lambda c, x: (torch_masked.where(c, x, 100) + 1, torch_masked.where(c, -3, x.cfloat())),
                         fullgraph=True)
    for result, dtype in zip(fits(c, x), (torch.int8, torch.complex64), strict=True):
        exact(result, torch.ones(0, dtype=dtype))


def test_numbers_known_only_at_run_time_stay_symbolic():
    # Fused where the dtype holds every value of the number's kind (a bool,
    # an int in float32), else our kernel, which checks the value.
    def chain(c, x):
        return (torch_masked.where(c, x, x.shape[0]) * torch_masked.where(c, x.shape[0] * 0.5, x.half())
                + torch_masked.where(c, x.float(), x.shape[0]) + torch_masked.where(c, x > 0, x.shape[0] > 4))

    compiled = torch.compile(chain, fullgraph=True, dynamic=True)
    counters.clear()
    for n in (3, 6, 9):
        c, x = make_tensor((n,), torch.bool, "cpu", generator=gen(48)), torch.randint(-9, 9, (n,), dtype=torch.int32)
        exact(compiled(c, x), chain(c, x))
    assert counters["stats"]["unique_graphs"] == 1


def test_opaque_switch_keeps_our_kernels():
    def chain(c, x, y):
        picked = torch_masked.where(c, x * 2, y) + torch_masked.select(c, x, -y) + torch_masked.where(c, 1.0, y)
        return picked + torch_masked.gather_nd(x, torch.tensor([[6], [0], [3], [1], [1], [2], [5]]))

    c, x, y = make_tensor((7,), torch.bool, "cpu", generator=gen(13)), torch.randn(7, generator=gen(14)), torch.randn(7)
    tag = torch.compiler.config.cache_key_tag
    with torch_masked.compile.opaque():
        assert torch_masked.compile.is_opaque() and torch.compiler.config.cache_key_tag != tag
        result, code = run_and_get_code(torch.compile(chain, fullgraph=True), c, x, y)
    assert not torch_masked.compile.is_opaque() and torch.compiler.config.cache_key_tag == tag
    code = "\n".join(code)
    for op in ("where.self", "select.default", "where.ScalarSelf", "gather_nd.default"):
        assert f"torch.ops.masked.{op}(" in code
    picked = torch.where(c, x * 2, y) + torch.where(c, x, -y) + torch.where(c, 1.0, y)
    exact(result, picked + x[[6, 0, 3, 1, 1, 2, 5]])
    # Off again: the next compile fuses.
    fused, code = run_and_get_code(torch.compile(chain, fullgraph=True), c, x, y)
    assert not OUR_CALL.search("\n".join(code)) and GATHER_CALL not in "\n".join(code)
    exact(fused, result)


def test_opaque_switch_keeps_our_kernels_bits():
    # What the README lists as Inductor's in a fused selection: a condition
    # byte other than 0/1, and bfloat16 NaN bits. Opaque, both are eager's.
    condition = torch.tensor([1, 0, 2, 0], dtype=torch.uint8).view(torch.bool)
    flags = torch.tensor([True, True, True, False])
    nans = torch.full((32,), float("nan"), dtype=torch.bfloat16)
    table = torch.full((8, 4), float("nan"), dtype=torch.bfloat16)

    def chain(c, flags, nans, table):
        return (torch_masked.where(c, 1, flags.long()), torch_masked.where(torch.ones(32, dtype=torch.bool), nans, 0.0),
                torch_masked.select(torch.ones(32, dtype=torch.bool), nans, torch.zeros_like(nans)),
                torch_masked.gather_nd(table, torch.tensor([[1], [2]]), check_bounds=False))

    torch._dynamo.reset()
    with torch_masked.compile.opaque():
        compiled = torch.compile(chain, fullgraph=True)(condition, flags, nans, table)
    eager = chain(condition, flags, nans, table)
    assert eager[0].tolist() == [1, 1, 1, 0] and eager[1].view(torch.int16)[0] == 0x7FC0
    for actual, expected in zip(compiled, eager):
        assert actual.dtype == expected.dtype and torch.equal(actual.view(torch.uint8), expected.view(torch.uint8))


def test_operand_cast_down_rounds_as_eager_with_emulated_casts():
    # What the README says of an operand cast down before the selection: as
    # compiled torch.where computes it (at most one bfloat16 rounding from
    # eager), and, under emulate_precision_casts, as compiled torch.where
    # does then: eager's bits from torch 2.14 (2.11's flag leaves this
    # rounding to Inductor).
    gen = torch.Generator().manual_seed(0)
    x, h = torch.randn(1000, generator=gen), torch.randn(1000, generator=gen).bfloat16()
    c = torch.rand(1000, generator=gen) > 0.5

    def ours(c, x, h):
        return torch_masked.where(c, x.bfloat16(), h) * 3

    def native(c, x, h):
        return torch.where(c, x.bfloat16(), h) * 3

    eager = ours(c, x, h)
    torch._dynamo.reset()
    fused = torch.compile(ours, fullgraph=True)(c, x, h)
    exact(fused, torch.compile(native, fullgraph=True)(c, x, h))
    torch.testing.assert_close(fused, eager, rtol=2**-7, atol=0)  # one bfloat16 step
    with torch._inductor.config.patch(emulate_precision_casts=True):
        torch._dynamo.reset()
        emulated = torch.compile(ours, fullgraph=True)(c, x, h)
        exact(emulated, torch.compile(native, fullgraph=True)(c, x, h))
    if torch.__version__ >= (2, 14):
        exact(emulated, eager)


def test_export_keeps_masked_ops():
    class Chain(torch.nn.Module):
        def forward(self, c, rows, x):
            return torch_masked.select(rows, torch_masked.where(c, x, 0.0), torch_masked.where(c, x * 2, x)).sum()

    c, rows, x = torch.rand(4, 3) < 0.5, torch.rand(4) < 0.5, torch.randn(4, 3)
    torch.compile(lambda c, x: torch_masked.where(c, x, x), fullgraph=True)(c, x)  # Inductor loaded, its table filled
    program = torch.export.export(Chain(), (c, rows, x))
    expected = {"masked.where.ScalarOther", "masked.where.self", "masked.select.default"}
    for graph in (program.graph, program.run_decompositions().graph):
        assert expected <= {str(node.target) for node in graph.nodes if node.op == "call_function"}
    exact(program.module()(c, rows, x), Chain()(c, rows, x))
    for op, args in [(torch.ops.masked.where.self, (c, x, x.double())), (torch.ops.masked.select.default, (rows, x, x))]:
        torch.library.opcheck(op, args)


def test_onnx_export_translates_masked_ops():
    # The exporter goes through torch.export: our translation of
    # masked::where.self is called only if the op reaches it undecomposed.
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    from onnxscript import opset18 as onnx_op

    translated = []

    def where_self(condition, x, y):
        translated.append("masked::where.self")
        return onnx_op.Where(condition, x, y)

    class Chain(torch.nn.Module):
        def forward(self, c, x, y):
            return torch_masked.where(c, x * 2, y) + 1

    c, x, y = torch.rand(3, 4, generator=gen(15)) < 0.5, torch.randn(3, 4, generator=gen(16)), torch.randn(3, 4)
    torch.compile(lambda c, x: torch_masked.where(c, x, x), fullgraph=True)(c, x)  # Inductor loaded, its table filled
    program = torch.onnx.export(
        Chain().eval(), (c, x, y), dynamo=True, custom_translation_table={torch.ops.masked.where.self: where_self}
    )
    assert translated == ["masked::where.self"]
    session = ort.InferenceSession(program.model_proto.SerializeToString())
    (result,) = session.run(None, {i.name: v.numpy() for i, v in zip(session.get_inputs(), (c, x, y))})
    exact(torch.from_numpy(result), torch.where(c, x * 2, y) + 1)


def test_index_ops_stay_our_kernels():
    def chain(x, indices, mask):
        gathered = x[indices[:, 0]] * 2
        scattered = torch_masked.scatter_nd(indices, gathered, [8]) + torch_masked.tensor_scatter_nd_add(x, indices, gathered)
        return scattered, torch_masked.boolean_mask(x + 1, mask), torch_masked.nonzero(mask)

    x, indices, mask = torch.randn(8, generator=gen(17)), torch.tensor([[3], [0], [3]]), torch.rand(8, generator=gen(18)) < 0.5
    (scattered, masked, positions), code = run_and_get_code(torch.compile(chain, fullgraph=True), x, indices, mask)
    code = "\n".join(code)
    for op in ("scatter_nd", "tensor_scatter_nd_add", "boolean_mask", "nonzero"):
        assert f"torch.ops.masked.{op}.default(" in code
    updates = x[indices[:, 0]] * 2
    exact(scattered, torch.zeros(8).index_put_((indices[:, 0],), updates, accumulate=True) + x.index_put((indices[:, 0],), updates, accumulate=True))
    exact(masked, (x + 1)[mask])
    exact(positions, torch.nonzero(mask))


BOOL_BUFFER = re.compile(r"empty_strided_cpu\(.*torch\.bool\)")


def reading_computed_bools(x, y, mask):
    """Our ops that read a bool tensor, each given bools Inductor computes
    (from float32, float64, int64 and bfloat16, a transposed view, a 0-d
    reduction, an empty tensor) and a bool input of the graph."""
    table = x.view(-1, 4)
    return (torch_masked.nonzero(x > 0), torch_masked.nonzero(x.double() < -0.5, as_tuple=True),
            torch_masked.nonzero_static(y.long() > 0, size=5), torch_masked.where(x.isnan() | (x.bfloat16() > y.bfloat16())),
            torch_masked.nonzero(table.t() > 0), torch_masked.nonzero(x.sum() > 0), torch_masked.nonzero(x[:0] > 0),
            torch_masked.boolean_mask(x, x > 0), torch_masked.boolean_mask(table, table[:, 0] > y[: table.shape[0]], axis=0),
            torch_masked.boolean_mask(table, table[0] < 0, axis=1), torch_masked.boolean_mask(x, mask),
            torch_masked.nonzero(mask))


def expected_of_computed_bools(x, y, mask):
    table = x.view(-1, 4)
    return (torch.nonzero(x > 0), torch.nonzero(x.double() < -0.5, as_tuple=True),
            torch.nonzero_static(y.long() > 0, size=5), torch.nonzero(x.isnan() | (x.bfloat16() > y.bfloat16())),
            torch.nonzero(table.t() > 0), torch.nonzero(x.sum() > 0), torch.nonzero(x[:0] > 0),
            x[x > 0], table[table[:, 0] > y[: table.shape[0]]], table[:, table[0] < 0], x[mask], torch.nonzero(mask))


@pytest.mark.skipif(inductor_config.cpu_backend != "cpp", reason="where Inductor generates C++")
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_bools_inductor_computes_reach_our_kernels_as_bytes(dynamic):
    # Written as bytes by way of int32 (compile.py, _bool_stored_as_bytes):
    # no bool buffer in the graph but the input's, and the values eager's.
    x, y = torch.randn(64, generator=gen(41)), torch.randn(64, generator=gen(42))
    mask = torch.rand(64, generator=gen(43)) < 0.5
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        results, code = run_and_get_code(torch.compile(reading_computed_bools, fullgraph=True, dynamic=dynamic), x, y, mask)
        exact(results, expected_of_computed_bools(x, y, mask))
        code = "\n".join(code)
        assert not BOOL_BUFFER.search(code) and len(re.findall(r"empty_strided_cpu\(.*torch\.uint8\)", code)) == 10
        assert code.count("aten.view.dtype(") == 3
        assert re.search(r"torch\.ops\.masked\.boolean_mask\.default\(arg\d+_1, arg\d+_1", code)
        # Opaque: Inductor's own bool buffers, the same values.
        torch._dynamo.reset()
        with torch_masked.compile.opaque():
            opaque, code = run_and_get_code(torch.compile(reading_computed_bools, fullgraph=True, dynamic=dynamic), x, y, mask)
        assert len(BOOL_BUFFER.findall("\n".join(code))) == 10
    exact(opaque, results)


def returning_computed_masks(x, y):
    """Bools the graph computes and returns as well as handing them to our
    ops: one read by two of our ops, a transposed one, and one that a
    pointwise op reads too."""
    table = x.view(-1, 4)
    positive, columns, negative = x > 0, table.t() > 0, y < 0
    return (positive, torch_masked.nonzero(positive), torch_masked.boolean_mask(y, positive),
            columns, torch_masked.nonzero(columns), negative, torch_masked.boolean_mask(x, negative), negative * x)


@pytest.mark.skipif(inductor_config.cpu_backend != "cpp", reason="where Inductor generates C++")
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_a_returned_bool_that_only_our_ops_read_is_written_as_bytes(dynamic):
    # Inductor writes a bool the graph returns to a buffer of its own before
    # our op's lowering sees it; where only our ops read it, their bytes
    # become the output too (viewed as bool, with eager's strides), and that
    # buffer is dropped. A bool that Inductor's own code reads as well keeps
    # its buffer, which our op then reads.
    x, y = torch.randn(64, generator=gen(44)), torch.randn(64, generator=gen(45))
    table = x.view(-1, 4)
    expected = (x > 0, torch.nonzero(x > 0), y[x > 0], table.t() > 0, torch.nonzero(table.t() > 0),
                y < 0, x[y < 0], (y < 0) * x)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        results, code = run_and_get_code(torch.compile(returning_computed_masks, fullgraph=True, dynamic=dynamic), x, y)
    exact(results, expected)
    assert results[3].stride() == expected[3].stride()
    code = "\n".join(code)
    assert len(BOOL_BUFFER.findall(code)) == 1 and len(re.findall(r"empty_strided_cpu\(.*torch\.uint8\)", code)) == 2


@pytest.mark.skipif(inductor_config.cpu_backend != "cpp", reason="where Inductor generates C++")
def test_a_mask_saved_for_the_backward_is_written_as_bytes():
    # A compiled training step saves the mask it computes for boolean_mask's
    # backward: the forward writes it as bytes, and both graphs' gradients
    # are eager's, the backward op's own mask computed likewise.
    x = torch.randn(64, generator=gen(46), requires_grad=True)
    grad = torch.randn(64, generator=gen(47))

    def loss_of(x):
        return (torch_masked.boolean_mask(x, x > 0) * 2 + 1).sum()

    def step(loss_of):
        loss = loss_of(x)
        return loss, torch.autograd.grad(loss, x)[0]

    def scattered_back(grad):
        return torch.ops.masked.boolean_mask_backward(torch_masked.boolean_mask(grad, grad > 0), grad > 0, [64], 0)

    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        (loss, gradient), code = run_and_get_code(step, torch.compile(loss_of, fullgraph=True))
        scattered, backward_code = run_and_get_code(torch.compile(scattered_back, fullgraph=True), grad)
    exact((loss, gradient), step(loss_of))
    exact(scattered, torch.where(grad > 0, grad, 0.0))
    for graphs in (code, backward_code):
        assert not BOOL_BUFFER.search("\n".join(graphs)) and "torch.uint8" in "\n".join(graphs)


class FrozenTable(torch.nn.Module):
    """Every op over parameters and buffers alone, which freezing folds, and
    over the inputs, which it leaves to the graph."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(50, 8, generator=gen(40)))
        self.register_buffer("rows", torch.randint(0, 50, (20, 1), generator=gen(41)))
        self.register_buffer("mask", torch.rand(50, generator=gen(42)) < 0.5)
        self.register_buffer("condition", torch.rand(50, 8, generator=gen(43)) < 0.5)

    def forward(self, scale, indices):
        table, rows = self.table, self.rows
        folded = (torch_masked.gather_nd(table, rows).sum(0) + torch_masked.where(self.condition, table, 0.0).sum(0)
                  + torch_masked.scatter_nd(rows, table[:20], [50, 8]).sum(0)
                  + torch_masked.select(self.mask, table, -table).sum(0))
        return folded, torch_masked.gather_nd(table * scale, indices), torch_masked.boolean_mask(table * scale, self.mask)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_freezing_folds_our_ops_over_parameters(dynamic):
    # Inductor's freezing (CPU inference) folds what depends on parameters
    # and buffers alone when it compiles, running our kernels then: no call
    # of the scatter, which stays ours in a graph, is left. A bad index from
    # the inputs still raises the eager IndexError. (Folding a size known
    # only from data, a boolean_mask or nonzero of buffers alone, fails in
    # torch's freezing, native x[mask] alike.)
    model = FrozenTable().eval()
    table, rows, mask, condition = model.table.detach(), model.rows[:, 0], model.mask, model.condition
    scale, indices = torch.randn(8, generator=gen(44)), torch.randint(0, 50, (5, 1), generator=gen(45))
    torch._dynamo.reset()
    with torch.no_grad(), inductor_config.patch(freezing=True), \
            torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        compiled = torch.compile(model, fullgraph=True, dynamic=dynamic)
        (folded, gathered, masked), code = run_and_get_code(compiled, scale, indices)
        with pytest.raises(IndexError, match=r"got \[50\] at indices\[1\]"):
            compiled(scale, torch.tensor([[3], [50]]))
    assert SCATTER_CALL not in "\n".join(code)
    expected = (table[rows].sum(0) + torch.where(condition, table, 0.0).sum(0)
                + torch.zeros(50, 8).index_put_((rows,), table[:20], accumulate=True).sum(0)
                + torch.where(mask[:, None], table, -table).sum(0))
    torch.testing.assert_close(folded, expected)
    exact(gathered, (table * scale)[indices[:, 0]])
    exact(masked, (table * scale)[mask])


FUNCTIONAL_ADD = "torch.ops.masked.tensor_scatter_nd_add.default("
IN_PLACE_ADD = "torch.ops.masked.tensor_scatter_nd_add_.default("


def add_into_doubled(tensor, indices, updates):
    return torch_masked.tensor_scatter_nd_add(tensor * 2, indices, updates) + 1


def test_tensor_scatter_nd_add_adds_into_a_buffer_the_graph_made(device):
    # Elements and slices, K = 1 and 2, every kind of dtype (on CUDA, uint8
    # through the padded output of narrow elements); eager runs the same
    # kernel into a new output, so on the CPU the sums are the same bits (on
    # CUDA, floating sums of repeated rows depend on the atomics' order).
    for dtype, shape, depth in [(torch.float32, (40,), 1), (torch.bfloat16, (6, 5, 3), 2), (torch.int64, (9, 4), 1),
                                (torch.uint8, (7,), 1), (torch.float64, (5, 2), 2)]:
        tensor = make_tensor(shape, dtype, device, generator=gen(19))
        indices = torch.stack([torch.randint(size, (30,), generator=gen(20)) for size in shape[:depth]], dim=1).to(device)
        updates = make_tensor((30, *shape[depth:]), dtype, device, generator=gen(21))
        before = tensor.clone()
        result, code = run_and_get_code(torch.compile(add_into_doubled, fullgraph=True), tensor, indices, updates)
        code = "\n".join(code)
        assert IN_PLACE_ADD in code and FUNCTIONAL_ADD not in code, dtype
        if device == "cuda" and dtype.is_floating_point:
            torch.testing.assert_close(result, add_into_doubled(tensor, indices, updates))
        else:
            matches(result, add_into_doubled(tensor, indices, updates))
        exact(tensor, before)
    # An index out of bounds is the eager IndexError.
    bad = indices.clone()
    bad[4, 1] = -1
    with pytest.raises(IndexError) as eager:
        add_into_doubled(tensor, bad, updates)
    with pytest.raises(IndexError) as compiled:
        torch.compile(add_into_doubled, fullgraph=True)(tensor, bad, updates)
    assert str(compiled.value) == str(eager.value) and "at indices[4]" in str(eager.value)


@pytest.mark.parametrize("dynamic", [False, True], ids=["large", "dynamic"])
def test_tensor_scatter_nd_add_copies_into_a_new_output_past_the_cpu_limit(dynamic):
    # Past IN_PLACE_CPU_BYTES, or of a size known only at run time, the CPU
    # keeps the copy (compile.py says why).
    rows = torch_masked.compile.IN_PLACE_CPU_BYTES // 4 + 1 if not dynamic else 50
    tensor, indices = torch.randn(rows, generator=gen(25)), torch.randint(rows, (20, 1), generator=gen(26))
    updates = torch.randn(20, generator=gen(27))
    result, code = run_and_get_code(
        torch.compile(add_into_doubled, fullgraph=True, dynamic=dynamic), tensor, indices, updates
    )
    assert FUNCTIONAL_ADD in "\n".join(code) and IN_PLACE_ADD not in "\n".join(code)
    exact(result, add_into_doubled(tensor, indices, updates))


@pytest.mark.parametrize("dynamic", [False, True], ids=["large", "dynamic"])
def test_tensor_scatter_nd_add_past_the_cpu_limit_adds_in_place_where_a_reduction_reads_it_all(dynamic):
    # A result only summed whole gets no buffer of its size after the add,
    # so the copy would only be work (compile.py says why).
    def summed(tensor, indices, updates):
        return add_into_doubled(tensor, indices, updates).sum()

    def summed_by_rows(tensor, indices, updates):
        return add_into_doubled(tensor, indices, updates).sum(1)

    rows = torch_masked.compile.IN_PLACE_CPU_BYTES // 8 + 1 if not dynamic else 50
    tensor, indices = torch.randn(rows, 2, generator=gen(28)), torch.randint(rows, (20, 1), generator=gen(29))
    updates = torch.randn(20, 2, generator=gen(30))
    before = tensor.clone()
    for chain, in_place in ((summed, True), (summed_by_rows, False)):
        result, code = run_and_get_code(torch.compile(chain, fullgraph=True, dynamic=dynamic), tensor, indices, updates)
        code = "\n".join(code)
        assert (IN_PLACE_ADD in code, FUNCTIONAL_ADD in code) == (in_place, not in_place), chain.__name__
        torch.testing.assert_close(result, chain(tensor, indices, updates))
        exact(tensor, before)


def test_tensor_scatter_nd_add_copies_a_tensor_read_elsewhere():
    def read_after(tensor, indices, updates):
        doubled = tensor * 2
        return torch_masked.tensor_scatter_nd_add(doubled, indices, updates) + doubled

    def graph_input(tensor, indices, updates):
        return torch_masked.tensor_scatter_nd_add(tensor, indices, updates) * 3

    # Updates in the tensor's own memory would be read after being added into.
    def updates_are_the_tensor(tensor, indices, updates):
        doubled = tensor[:3] * 2
        return torch_masked.tensor_scatter_nd_add(doubled, indices, doubled) + 1

    def updates_view_the_tensor(tensor, indices, updates):
        doubled = tensor * 2
        return torch_masked.tensor_scatter_nd_add(doubled, indices, doubled[4:7]) + 1

    # Laid out otherwise: eager's result is contiguous, and so is this one.
    def every_other(tensor, indices, updates):
        return torch_masked.tensor_scatter_nd_add((tensor * 2)[::2], indices, updates)

    tensor, indices, updates = torch.randn(10, generator=gen(22)), torch.tensor([[2], [0], [2]]), torch.randn(3)
    before = tensor.clone()
    for chain in (read_after, graph_input, updates_are_the_tensor, updates_view_the_tensor, every_other):
        for dynamic in (False, True):
            result, code = run_and_get_code(torch.compile(chain, fullgraph=True, dynamic=dynamic), tensor, indices, updates)
            code = "\n".join(code)
            assert FUNCTIONAL_ADD in code and IN_PLACE_ADD not in code
            exact(result, chain(tensor, indices, updates))
            assert result.stride() == chain(tensor, indices, updates).stride()
            exact(tensor, before)
    # The opaque switch keeps the calls of eager too.
    with torch_masked.compile.opaque():
        result, code = run_and_get_code(torch.compile(add_into_doubled, fullgraph=True), tensor, indices, updates)
    assert FUNCTIONAL_ADD in "\n".join(code) and IN_PLACE_ADD not in "\n".join(code)
    exact(result, add_into_doubled(tensor, indices, updates))


def test_tensor_scatter_nd_add_in_place_in_a_compiled_training_step():
    def loss(weight, indices, updates):
        return (torch_masked.tensor_scatter_nd_add(weight * 2, indices, updates) ** 2).sum()

    weight = torch.randn(12, 3, generator=gen(23), requires_grad=True)
    updates = torch.randn(5, 3, generator=gen(24), requires_grad=True)
    indices = torch.tensor([[2], [7], [2], [0], [11]])
    expected = torch.autograd.grad(loss(weight, indices, updates), (weight, updates))
    compiled, code = run_and_get_code(torch.compile(loss, fullgraph=True), weight, indices, updates)
    assert IN_PLACE_ADD in "\n".join(code)
    for actual, wanted in zip(torch.autograd.grad(compiled, (weight, updates)), expected):
        torch.testing.assert_close(actual, wanted)


GATHER_CALL = "torch.ops.masked.gather_nd.default("
CHECK_CALL = "torch.ops.masked.check_gather_nd_indices.default("
# The check's call as Inductor's Python wrapper makes it: only when the fused
# loop's flag says a row is out of bounds.
GUARDED_CHECK_CALL = re.compile(rf"^ *if (buf\d+)\.item\(\): {re.escape(CHECK_CALL)}.*, \1\)$", re.MULTILINE)
# Inductor's own bounds assert on an indirect load, which the fused gather_nd skips.
INDUCTOR_ASSERT = "index out of bounds"
KERNEL = re.compile(r"async_compile\.(cpp_pybinding|triton)\(")  # one per generated C++ or Triton kernel


def native_gather(params, indices):
    """params[indices[..., 0], ..., indices[..., K-1]]: ATen's advanced indexing."""
    return params[tuple(indices.long().unbind(-1))]


def pairs(params, indices, bad_indices):
    """(params, indices, check_bounds): every params with the first indices;
    the first and last params (a transposed view) with every indices, and
    without the bounds check with indices holding rows out of bounds."""
    chosen = [(p, indices[0], True) for p in params]
    chosen += [(p, i, True) for i in indices[1:] for p in (params[0], params[-1])]
    return chosen + [(p, i, False) for i in bad_indices for p in (params[0], params[-1])]


def gathers(params, indices, bad_indices):
    return [torch_masked.gather_nd(p, i, check_bounds=check) * 2 for p, i, check in pairs(params, indices, bad_indices)]


def expected_gathers(params, indices, bad_indices):
    """ATen's indexing; rows out of bounds read as zeros."""
    expected = []
    for p, i, _ in pairs(params, indices, bad_indices):
        depth = i.shape[-1]
        in_bounds = ((i >= 0) & (i < torch.tensor(p.shape[:depth], device=i.device))).all(-1)
        gathered = torch.zeros(i.shape[:-1] + p.shape[depth:], dtype=p.dtype, device=p.device)
        gathered[in_bounds] = native_gather(p, i[in_bounds])
        expected.append(gathered * 2)
    return expected


def gather_inputs(dtypes, rows, seed, device="cpu"):
    """params [6, 5, 3] of each dtype (the last one a transposed view);
    indices of depth 1, 2 and 3 with batch ranks 0 to 2, int32 and int64, a
    strided view among them, no rows; then indices with entries negative or
    too large among good ones, for slices and for elements."""
    params = [make_tensor((6, 5, 3), dtype, device, generator=gen(seed + k)) for k, dtype in enumerate(dtypes)]
    params[-1] = make_tensor((3, 5, 6), dtypes[-1], device, generator=gen(seed)).permute(2, 1, 0)
    sizes = torch.tensor([6, 5, 3])

    def draw(shape, depth, dtype, low=0, high=None):
        top = sizes[:depth] if high is None else torch.full((depth,), high)
        fraction = torch.rand(*shape, depth, generator=gen(seed + depth))
        return (low + fraction * (top - low)).floor().to(dtype).to(device)

    indices = [
        draw((rows,), 1, torch.int64),  # slices [5, 3]
        draw((rows, 2), 2, torch.int32),  # slices [3]
        draw((rows,), 3, torch.int64),  # elements
        non_contiguous(draw((rows, 2), 2, torch.int64)),
        draw((), 2, torch.int64),  # a single index: one slice
        draw((0,), 2, torch.int32),  # no rows
    ]
    bad_indices = [draw((rows,), 2, torch.int64, low=-6, high=9), draw((rows, 1), 1, torch.int32, low=-7, high=12),
                   draw((rows,), 3, torch.int32, low=-6, high=9)]
    return params, indices, bad_indices


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_gather_nd_fuses_and_matches_eager(dynamic, device):
    # Every dtype Inductor fuses (static); a second batch size reuses the
    # dynamic graph.
    counters.clear()
    torch._dynamo.reset()
    compiled = torch.compile(gathers, fullgraph=True, dynamic=dynamic)
    for rows in (4, 7) if dynamic else (4,):
        inputs = gather_inputs(FUSED if not dynamic else FUSED[::3], rows, seed=rows, device=device)
        if rows == 4:
            results, code = run_and_get_code(compiled, *inputs)
            code = "\n".join(code)
            assert GATHER_CALL not in code and CHECK_CALL in code and INDUCTOR_ASSERT not in code
            assert len(GUARDED_CHECK_CALL.findall(code)) == code.count(CHECK_CALL)
        else:
            results = compiled(*inputs)
        for result, ours, reference in zip(results, gathers(*inputs), expected_gathers(*inputs), strict=True):
            exact(result, reference)
            exact(result, ours)
    assert counters["stats"]["unique_graphs"] == 1


def test_gather_nd_compiled_raises_the_eager_index_error(device):
    # The fused loop reads only rows clamped into bounds, and notes whether
    # any row is out of bounds; the check then raises eager's IndexError,
    # naming each row's first bad entry, negative or too large (far past
    # params too), at every depth.
    compiled = torch.compile(lambda p, i: (torch_masked.gather_nd(p * 2, i) + 1).sum(-1), fullgraph=True)
    params = torch.randn(4, 5, 6, generator=gen(19)).to(device)
    good = torch.tensor([[3, 4, 5], [0, 1, 2], [2, 2, 2]], device=device)
    for row, column, value in [(0, 0, 4), (1, 1, -1), (2, 2, 6), (2, 0, -5), (1, 0, 2**40), (0, 1, -(2**40))]:
        for depth in range(column + 1, 4):
            bad = good.clone()
            bad[row, column] = value
            with pytest.raises(IndexError) as eager:
                torch_masked.gather_nd(params, bad[:, :depth])
            with pytest.raises(IndexError) as fused:
                compiled(params, bad[:, :depth])
            assert str(fused.value) == str(eager.value)
    torch.testing.assert_close(compiled(params, good), ((params * 2)[tuple(good.unbind(-1))] + 1).sum(-1))


@pytest.mark.skipif(inductor_config.cpu_backend != "cpp", reason="Inductor's C++ picks the vector width")
@pytest.mark.parametrize("simdlen", [0, 256], ids=["scalar", "256-bit"])
def test_gather_nd_fuses_at_every_vector_width(simdlen):
    # Inductor's C++ for a CPU without vectors, and for AVX2's 8 float lanes
    # where the tests' machine may have AVX-512's 16: other vector loops and
    # tails around the fused gather's clamped, zeroed and checked rows.
    with inductor_config.patch({"cpp.simdlen": simdlen}):
        isa = cpu_vec_isa.pick_vec_isa()
        if simdlen and (not isa or isa.bit_width() != simdlen):
            pytest.skip(f"this CPU has no {simdlen}-bit vectors")
        torch._dynamo.reset()
        compiled = torch.compile(gathers, fullgraph=True)
        params, indices, bad_indices = gather_inputs(FUSED[::3], rows=37, seed=37)
        results = compiled(params, indices, bad_indices)
        for result, reference in zip(results, expected_gathers(params, indices, bad_indices), strict=True):
            exact(result, reference)
        checked = indices[2].clone()  # elements, read with the check
        checked[30, 1] = 5
        with pytest.raises(IndexError, match=r"got \[\d+, 5, \d+\] at indices\[30\]"):
            compiled(params, indices[:2] + [checked] + indices[3:], bad_indices)


def test_gather_nd_check_adds_no_pass_to_a_reduction_over_its_rows(device):
    # (gather_nd(x, idx) * 2 + 1).sum(): whether a row is out of bounds is
    # found in the loop that sums the rows, so the graph is that one kernel
    # and the check's call, made only if that loop found one, as native
    # x[idx] is one kernel.
    x, indices = torch.randn(50, generator=gen(25)).to(device), torch.randint(0, 50, (40, 1), generator=gen(26)).to(device)
    result, code = run_and_get_code(
        torch.compile(lambda x, i: (torch_masked.gather_nd(x, i) * 2 + 1).sum(), fullgraph=True), x, indices
    )
    code = "\n".join(code)
    assert len(KERNEL.findall(code)) == 1 and len(GUARDED_CHECK_CALL.findall(code)) == 1 and INDUCTOR_ASSERT not in code
    torch.testing.assert_close(result, (x[indices[:, 0]] * 2 + 1).sum())


# A load of int64 index entries as a vector, in Inductor's C++.
INDEX_VECTOR_LOAD = re.compile(r"VectorizedN?<int64_t(, *\d+)?>::loadu\(")


@pytest.mark.skipif(inductor_config.cpu_backend != "cpp", reason="Inductor's C++ decides vectorisation")
@pytest.mark.parametrize("shape, depth", [((50, 8), 1), ((6, 5, 8), 2)], ids=["K1", "K2"])
@pytest.mark.parametrize("reader", [
    lambda g: g * 2 + 1, lambda g: (g * 2 + 1).sum(-1), lambda g: (g * torch.full((2, *[1] * g.dim()), 2.0)).sum(),
], ids=["pointwise", "row-sums", "sum-of-it-broadcast"])
def test_gather_nd_of_slices_checks_its_rows_in_a_scalar_pass(shape, depth, reader):
    # Read other than by a reduction over all its elements, the check of
    # slices is a pass of its own over the index rows; its rows tested as
    # unsigned integers, it never loads them as int64 vectors (on AVX2 a
    # copy through a stack buffer that stalls), while the gather's loop
    # still loads the slices as vectors. (Where the CPU has vectors.)
    params = torch.randn(*shape, generator=gen(29))
    indices = torch.randint(0, min(shape[:depth]), (300, depth), generator=gen(30))
    compiled = torch.compile(lambda p, i: reader(torch_masked.gather_nd(p, i)), fullgraph=True)
    result, code = run_and_get_code(compiled, params, indices)
    code = "\n".join(code)
    torch.testing.assert_close(result, reader(native_gather(params, indices)))
    assert len(KERNEL.findall(code)) == 2 and len(GUARDED_CHECK_CALL.findall(code)) == 1
    assert "uint64_t" in code and not INDEX_VECTOR_LOAD.search(code)
    assert bool(VECTOR_LOAD.search(code)) == bool(cpu_vec_isa.pick_vec_isa())
    bad = indices.clone()
    bad[123, depth - 1] = -1
    with pytest.raises(IndexError, match=rf"got \[[-\d, ]*-1\] at indices\[123\]"):
        compiled(params, bad)


@pytest.mark.skipif(inductor_config.cpu_backend != "cpp", reason="where Inductor generates C++")
@pytest.mark.parametrize("shape, index_rows, reduced, kernels, bad_row", [
    ((50, 8), (300, 1), lambda g: (g * 2 + 1).sum(), 1, "123"),
    ((50, 8), (300, 1), lambda g: g.exp().sum([0, -1]), 1, "123"),
    # mean's division, after the check's call, is a kernel of its own.
    ((50, 8), (300, 1), lambda g: (g - 1).abs().mean(), 2, "123"),
    ((6, 5, 8), (4, 75, 2), lambda g: (g * 2).amax(), 1, "1, 48"),
], ids=["sum", "sum-over-every-dim", "mean", "amax-of-a-batch-of-index-rows"])
def test_gather_nd_of_slices_checks_in_a_reduction_of_all_its_elements(shape, index_rows, reduced, kernels, bad_row):
    # Read by a reduction over all its elements, the check of slices rides
    # in that reduction's loop, as native x[idx]'s assert does: no pass of
    # its own, and the check's call only if that loop found a row out of
    # bounds.
    params = torch.randn(*shape, generator=gen(31))
    depth = index_rows[-1]
    indices = torch.randint(0, min(shape[:depth]), index_rows, generator=gen(32))
    compiled = torch.compile(lambda p, i: reduced(torch_masked.gather_nd(p, i)), fullgraph=True)
    result, code = run_and_get_code(compiled, params, indices)
    code = "\n".join(code)
    torch.testing.assert_close(result, reduced(native_gather(params, indices)))
    assert len(KERNEL.findall(code)) == kernels and len(GUARDED_CHECK_CALL.findall(code)) == 1
    bad = indices.clone()
    bad.view(-1, depth)[123, 0] = shape[0]
    with pytest.raises(IndexError, match=rf"got \[{shape[0]}[\d, ]*\] at indices\[{bad_row}\]"):
        compiled(params, bad)


def test_gather_nd_of_empty_slices_checks_its_rows_when_summed():
    # Slices of no elements: a check over the gathered elements would see
    # no row, so it stays over the rows, and a row out of bounds raises.
    params, indices = torch.randn(50, 0), torch.randint(0, 50, (30, 1), generator=gen(33))
    compiled = torch.compile(lambda p, i: (torch_masked.gather_nd(p, i) * 2).sum(), fullgraph=True)
    exact(compiled(params, indices), (native_gather(params, indices) * 2).sum())
    indices[7, 0] = 50
    with pytest.raises(IndexError, match=r"got \[50\] at indices\[7\]"):
        compiled(params, indices)


# A load of params' values as a vector, in Inductor's C++ (contiguous, or
# gathered lane by lane into a buffer first).
VECTOR_LOAD = re.compile(r"Vectorized<float>::loadu\(")


@pytest.mark.skipif(inductor_config.cpu_backend != "cpp", reason="Inductor's C++ decides vectorisation")
@pytest.mark.parametrize("shape, depth, native_vectorised", [
    ((7,), 1, True), ((7, 7), 2, False), ((7, 7, 7), 3, False), ((50, 8), 1, True), ((6, 5, 8), 2, True),
], ids=["elements-K1", "elements-K2", "elements-K3", "slices-of-8-K1", "slices-of-8-K2"])
def test_gather_nd_vectorises_as_native_does(shape, depth, native_vectorised):
    # Elements by index rows of K >= 2 entries, read row after row, are
    # loads that are not contiguous: Inductor keeps native x[i, j]'s loop
    # scalar, and would vectorise ours, counting our bounds test as work,
    # into a loop slower than native's; ours stays scalar too. Slices of 8
    # (less than a vector of AVX-512) are a vector loop's tail, which
    # Inductor vectorises unless selects weigh too much: ours has one, the
    # value's, as native's has none. (Where the CPU has vectors.)
    params = torch.randn(*shape, generator=gen(27))
    indices = torch.randint(0, min(shape[:depth]), (300, depth), generator=gen(28))
    chains = [lambda p, i: (native_gather(p, i) * 2 + 1).sum(),
              lambda p, i: (torch_masked.gather_nd(p, i) * 2 + 1).sum(),
              lambda p, i: (torch_masked.gather_nd(p, i, check_bounds=False) * 2 + 1).sum()]
    vectorised = []
    for chain in chains:
        result, code = run_and_get_code(torch.compile(chain, fullgraph=True), params, indices)
        torch.testing.assert_close(result, chain(params, indices))
        vectorised.append(bool(VECTOR_LOAD.search("\n".join(code))))
    assert vectorised == [native_vectorised and bool(cpu_vec_isa.pick_vec_isa())] * 3


class _IntegerOps:
    """Inductor's ops on Python integers, int64 wrapping as in the generated
    code: the row tests of torch_masked/compile.py evaluated on values."""

    @staticmethod
    def _int64(v):
        return (v + 2**63) % 2**64 - 2**63

    def to_dtype(self, v, dtype, *args, **kwargs):
        return v % 2**64 if dtype == torch.uint64 else self._int64(v)

    def index_expr(self, expr, dtype):
        return int(expr)

    def constant(self, value, dtype):
        return value

    def sub(self, a, b):
        return self._int64(a - b)

    def bitwise_or(self, a, b):
        return a | b

    def bitwise_and(self, a, b):
        return a & b

    def bitwise_not(self, a):
        return ~a

    def bitwise_right_shift(self, a, b):
        return a >> b  # arithmetic, as on int64 in C++ and Triton

    def and_(self, a, b):
        return a and b

    def ge(self, a, b):
        return a >= b

    def lt(self, a, b):
        return a < b

    def where(self, condition, a, b):
        return a if condition else b

    def indirect_indexing(self, index, size, check=True, wrap_neg=True):
        assert not check and not wrap_neg  # our rule for a bad index, not Inductor's
        return index


def test_index_row_tests_on_every_kind_of_entry():
    # Each entry against each size, sizes of 1 included (a row of zeros
    # into them is in bounds), at int64's ends: the row tests agree with
    # 0 <= v < size, the check's 1 marks a row out of bounds, and a row
    # reads at its own positions, or at the first row's if out of bounds.
    from torch._inductor.virtualized import V

    from torch_masked import compile as fused

    def value(v):
        return getattr(v, "value", v)

    def rows(sizes):
        """Every row of telling entries for one or two sizes; a few for three."""
        if len(sizes) == 3:
            return [(0, 0, 0), (5, 4, 2), (6, 0, 0), (0, -1, 0), (0, 0, 3), (-(2**63), 0, 0), (2**63 - 1, 4, 2)]
        ends = {-(2**63), -(2**40), -1, 0, 1, 2, 2**40, 2**63 - 1}
        return itertools.product(sorted(ends | {s + d for s in sizes for d in (-1, 0, 1)}), repeat=len(sizes))

    with V.set_ops_handler(_IntegerOps()):
        for sizes in [(1,), (1, 1), (1, 3), (6, 5, 3), (2**40,)]:
            for row in rows(sizes):
                row_entries = list(zip(row, sizes))
                in_bounds = all(0 <= v < size for v, size in row_entries)
                first_row_or_row = list(row) if in_bounds else [0] * len(row)
                for row_test in (fused._SIGNED_ROW_TEST, fused._UNSIGNED_ROW_TEST):
                    assert value(row_test.in_bounds(row_entries)) == in_bounds, (row, row_test)
                    assert value(row_test.one_if_out_of_bounds(row_entries)) == (not in_bounds), (row, row_test)
                    positions = row_test.positions(row_entries, in_bounds)
                    assert [value(p) for p in positions] == first_row_or_row, (row, row_test)


def test_rows_into_dimensions_of_size_one(device):
    # A row of zeros into dimensions of size 1 (its sign is 0, in bounds)
    # reads, or adds to, that element; a row out of bounds adds nothing, not
    # even the -0.0 that a GPU's atomic add into a -0.0 makes +0.0 (Inductor's
    # scatter where it generates Triton).
    def chain(p, q, index, index_pairs, t, bad):
        return (torch_masked.gather_nd(p * 1, index), torch_masked.gather_nd(q * 1, index_pairs),
                torch_masked.gather_nd(p * 1, index, check_bounds=False),
                torch_masked.scatter_nd(index, p.expand(2, 3) * 2, [1, 3], check_bounds=False) + 0,
                torch_masked.tensor_scatter_nd_add(t * 1, bad, t[1:] * 3, check_bounds=False))

    p, q = torch.arange(1.0, 4.0).reshape(1, 3).to(device), torch.arange(1.0, 5.0).reshape(1, 1, 4).to(device)
    index = torch.zeros(2, 1, dtype=torch.int64, device=device)
    index_pairs = torch.zeros(3, 2, dtype=torch.int32, device=device)
    t, bad = torch.tensor([-0.0, 1.0], device=device), torch.tensor([[5]], device=device)
    results = torch.compile(chain, fullgraph=True)(p, q, index, index_pairs, t, bad)
    expected = [p[[0, 0]], q[0, [0, 0, 0]], p[[0, 0]], p * 4, t]
    for result, eager, reference in zip(results, chain(p, q, index, index_pairs, t, bad), expected, strict=True):
        exact(result, reference)
        exact(result, eager)
    assert torch.signbit(results[-1][0])


@pytest.mark.parametrize("dtype, scale", [(torch.int8, 100), (torch.uint8, 100), (torch.int16, 2**14),
                                          (torch.int32, 2**30), (torch.float32, 1e39)], ids=str)
def test_numbers_known_only_at_run_time_out_of_range_raise_as_eager(dtype, scale):
    # A number from a size, which the dtype cannot hold for every size, is
    # left to our kernel, which raises eager's error where it overflows.
    def chain(c, x):
        return torch_masked.where(c, x, x.shape[0] * scale) * 1

    compiled = torch.compile(chain, fullgraph=True, dynamic=True)
    for n in (3, 5):
        c, x = torch.ones(n, dtype=torch.bool), torch.ones(n, dtype=dtype)
        with pytest.raises(RuntimeError) as eager:
            chain(c, x)
        with pytest.raises(RuntimeError) as fused:
            compiled(c, x)
        assert type(fused.value) is type(eager.value) and str(eager.value) in str(fused.value)


def test_gather_nd_declined_cases_run_our_kernel():
    # Complex params, K = 0 (every row is all of params), params with no
    # rows, params whose row count is known only at run time (it may be 0).
    def chain(complex_params, params, empty, rows, depth_zero, no_rows, mask):
        return (torch_masked.gather_nd(complex_params, rows) * 2, torch_masked.gather_nd(params, depth_zero) + 1,
                torch_masked.gather_nd(empty, no_rows), torch_masked.gather_nd(torch_masked.boolean_mask(params, mask), rows[1:]))

    complex_params = make_tensor((5, 2), torch.complex64, "cpu", generator=gen(20))
    params, empty = torch.randn(3, 2, generator=gen(21)), torch.zeros(0, 4)
    rows, depth_zero, no_rows = torch.tensor([[4], [1]]), torch.zeros(3, 0, dtype=torch.int64), torch.zeros(0, 1, dtype=torch.int64)
    mask = torch.tensor([True, False, True])
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        results, code = run_and_get_code(
            torch.compile(chain, fullgraph=True), complex_params, params, empty, rows, depth_zero, no_rows, mask
        )
    assert "\n".join(code).count(GATHER_CALL) == 4
    exact(results[0], complex_params[rows[:, 0]] * 2)
    exact(results[1], params.expand(3, 3, 2) + 1)
    assert results[2].shape == (0, 4)
    exact(results[3], params[mask][[1]])


def test_gather_nd_of_rows_of_a_large_transposed_matrix_runs_our_kernel():
    # On the CPU, a params of 16 MiB or more whose slices our kernel gathers
    # in passes (a row of a transposed matrix, wider than a cache line) takes
    # our kernel, faster there than Inductor's loop; half that size fuses, as
    # do slices of one cache line and a size known only at run time. A row
    # out of bounds still raises the eager IndexError.
    def chain(params, indices):
        return torch_masked.gather_nd(params, indices) * 2 + 1

    large = torch.randn(64, 2**16, generator=gen(30)).t()
    one_line = torch.randn(16, 2**18, generator=gen(31)).t()
    indices = torch.randint(0, 2**15, (100, 1), generator=gen(32))
    for params, dynamic, ours in ((large, False, True), (large[: 2**15], False, False), (one_line, False, False),
                                  (large, True, False)):
        torch._dynamo.reset()
        result, code = run_and_get_code(torch.compile(chain, fullgraph=True, dynamic=dynamic), params, indices)
        assert ("\n".join(code).count(GATHER_CALL) == 1) is ours
        exact(result, params[indices[:, 0]] * 2 + 1)
    bad = torch.tensor([[3], [2**16]])
    with pytest.raises(IndexError, match=r"got \[65536\] at indices\[1\]"):
        torch.compile(chain, fullgraph=True)(large, bad)


def test_indexed_sizes_whose_range_starts_at_zero_run_our_kernel(device):
    # A size that may be 0 in a graph traced at another size (under
    # backed_size_oblivious here; torch.export.Dim(min=0) alike) has no first
    # element for a row out of bounds to read, nor for Inductor's copy into
    # the scatter's buffer to divide by: the gathers (of elements and of
    # slices) and the unchecked scatters take our kernel.
    def chain(params, indices, updates):
        return (torch_masked.gather_nd(params, indices, check_bounds=False) * 2,
                torch_masked.gather_nd(params, indices[:, :1], check_bounds=False) * 2,
                *unchecked_scatters(params, indices, updates))

    torch._dynamo.reset()
    with fx_config.patch(backed_size_oblivious=True):
        compiled = torch.compile(chain, fullgraph=True, dynamic=True)
        for rows in (4, 1, 0):
            params, indices, updates = scatter_inputs(torch.float32, (rows, 3), 2, device, seed=40 + rows)
            if rows == 4:
                results, code = run_and_get_code(compiled, params, indices, updates)
                code = "\n".join(code)
                assert code.count(GATHER_CALL) == 2
                assert_our_scatters(code)
            else:
                results = compiled(params, indices, updates)
            gathered = [expected_gathers([params], [rows_of], [])[0] for rows_of in (indices, indices[:, :1])]
            expected = (*gathered, *scatter_reference(params, indices, updates))
            for result, eager, reference in zip(results, chain(params, indices, updates), expected, strict=True):
                exact(result, reference)
                exact(result, eager)


def test_gather_nd_from_params_of_a_size_known_only_from_data_and_checked_from_one_fuses(device):
    # boolean_mask's row count may be 0 (our kernel: the declined cases
    # above) unless torch._check says it is at least 1.
    def chain(params, mask, indices, check_bounds):
        picked = torch_masked.boolean_mask(params, mask)
        torch._check(picked.shape[0] >= 1)
        return torch_masked.gather_nd(picked, indices, check_bounds=check_bounds) * 2

    params = make_tensor((6, 3), torch.float32, device, generator=gen(50))
    indices = torch.tensor([[0], [2], [-1], [1], [3]], device=device)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        compiled = torch.compile(chain, fullgraph=True)
        for kept in ([0, 2, 3], [4]):
            mask = torch.zeros(6, dtype=torch.bool, device=device)
            mask[kept] = True
            result, code = run_and_get_code(compiled, params, mask, indices, False)
            assert GATHER_CALL not in "\n".join(code)
            exact(result, expected_gathers([params[mask]], [indices], [])[0])
            exact(result, chain(params, mask, indices, False))
            with pytest.raises(IndexError, match=rf"gather_nd: expected every index within shape \[{len(kept)}, 3\]"):
                compiled(params, mask, indices, True)


def test_gather_nd_of_data_dependent_rows_and_compiled_backward(device):
    # tf.gather_nd(x, tf.where(m)): rows whose number is known only at run
    # time; the backward is scatter_nd of the gradient without check_bounds
    # (Inductor's own scatter where it generates Triton).
    def loss(gather, x, m, w):
        return (gather(x * w, m) ** 2).sum()

    def ours(x, m):
        return torch_masked.gather_nd(x, torch_masked.where(m))

    x, m = torch.randn(5, 4, generator=gen(22)).to(device), (torch.rand(5, 4, generator=gen(23)) < 0.5).to(device)
    compiled = torch.compile(loss, fullgraph=True)
    values = []
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        for fn, gather in [(compiled, ours), (loss, ours), (loss, lambda x, m: x[m])]:
            w = torch.randn(4, generator=gen(24)).to(device).requires_grad_()
            value = fn(gather, x, m, w)
            values.append((value.detach(), *torch.autograd.grad(value, w)))
    torch.testing.assert_close(values[0], values[1], rtol=0, atol=0)
    torch.testing.assert_close(values[0], values[2])


SCATTER_CALL = "torch.ops.masked.scatter_nd.default("
# Triton's code on CUDA, and for CPU tensors where Triton is interpreted;
# Inductor's C++ on the CPU.
GENERATES_TRITON = {"cuda": True, "cpu": INTERPRETED}


def unchecked_scatters(tensor, indices, updates):
    # scatter_nd, tensor_scatter_nd_add into an input (a copy first) and into
    # a tensor the graph made (in place), each fed by pointwise work.
    return (torch_masked.scatter_nd(indices, updates * 2, list(tensor.shape), check_bounds=False) + 1,
            torch_masked.tensor_scatter_nd_add(tensor, indices, updates - 1, check_bounds=False),
            torch_masked.tensor_scatter_nd_add(tensor * 2, indices, updates, check_bounds=False) + 1)


def assert_our_scatters(code):
    """unchecked_scatters' three calls of our kernels, the add into t * 2 in
    place or (opaque, or of a size known only at run time on the CPU) not."""
    assert SCATTER_CALL in code and code.count(FUNCTIONAL_ADD) + code.count(IN_PLACE_ADD) == 2


def scatter_reference(tensor, indices, updates):
    """unchecked_scatters by ATen's index_put_, rows out of bounds left out."""
    sizes = torch.tensor(tensor.shape[: indices.shape[-1]], device=indices.device)
    kept = ((indices >= 0) & (indices < sizes)).all(-1)
    rows, kept_updates = tuple(indices[kept].unbind(-1)), updates[kept]

    def add(base, values):
        return base.clone().index_put_(rows, values, accumulate=True)

    return (add(torch.zeros_like(tensor), kept_updates * 2) + 1, add(tensor, kept_updates - 1),
            add(tensor * 2, kept_updates) + 1)


def scatter_inputs(dtype, shape, depth, device, seed):
    """Integer values (so that every order of the adds gives the same sums),
    repeated index rows, and rows out of bounds, negative ones too."""
    g = gen(seed)
    tensor = torch.randint(-8, 8, shape, generator=g).to(dtype).to(device)
    indices = torch.stack([torch.randint(-2, size + 2, (30,), generator=g) for size in shape[:depth]], -1).to(device)
    updates = torch.randint(-8, 8, (30, *shape[depth:]), generator=g).to(dtype).to(device)
    return tensor, indices, updates


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_unchecked_scatters_are_inductors_own_where_it_generates_triton(dynamic, device):
    # Without check_bounds, where Inductor generates Triton (CUDA), both
    # scatters are Inductor's atomic scatter, fused with what computes the
    # updates, rows out of bounds dropped as our kernel drops them; int64
    # (which Inductor does not add atomically), float16 and bfloat16 (whose
    # sums our kernel rounds once, Triton's atomics at every add) and
    # Inductor's C++ keep our kernel.
    for dtype, shape, depth in [(torch.float32, (40,), 1), (torch.bfloat16, (6, 5, 3), 2), (torch.int32, (9, 4), 1),
                                (torch.float64, (5, 2), 2), (torch.float16, (7, 3), 1), (torch.int64, (8,), 1)]:
        inputs = scatter_inputs(dtype, shape, depth, device, seed=len(shape) + depth)
        results, code = run_and_get_code(torch.compile(unchecked_scatters, fullgraph=True, dynamic=dynamic), *inputs)
        code = "\n".join(code)
        if GENERATES_TRITON[device] and dtype in (torch.float32, torch.int32, torch.float64):
            ours = (SCATTER_CALL, FUNCTIONAL_ADD, IN_PLACE_ADD)
            assert not any(call in code for call in ours) and "tl.atomic_add(" in code, dtype
        else:
            assert_our_scatters(code)
        for result, eager, reference in zip(results, unchecked_scatters(*inputs), scatter_reference(*inputs),
                                            strict=True):
            exact(result, reference)
            exact(result, eager)


def test_checked_deterministic_or_opaque_scatters_stay_our_kernel(device):
    # check_bounds (our IndexError), deterministic mode (our deterministic
    # sums) and the opaque switch keep our kernel wherever Inductor's code
    # runs.
    inputs = scatter_inputs(torch.float32, (12,), 1, device, seed=30)

    def checked(tensor, indices, updates):
        return torch_masked.scatter_nd(indices, updates * 2, [12]) + 1

    in_bounds = inputs[1].clamp(0, 11)
    _, code = run_and_get_code(torch.compile(checked, fullgraph=True), inputs[0], in_bounds, inputs[2])
    assert SCATTER_CALL in "\n".join(code)
    with pytest.raises(IndexError, match=r"scatter_nd: expected every index within shape \[12\]"):
        torch.compile(checked, fullgraph=True)(*inputs)
    for setting in (torch_masked.compile.opaque(), deterministic_algorithms()):
        torch._dynamo.reset()
        with setting:
            results, code = run_and_get_code(torch.compile(unchecked_scatters, fullgraph=True), *inputs)
            assert_our_scatters("\n".join(code))
            for result, eager in zip(results, unchecked_scatters(*inputs), strict=True):
                exact(result, eager)


@pytest.mark.parametrize("opaque", [False, True], ids=["fused", "opaque"])
def test_checked_calls_with_empty_results_raise_as_eager(device, opaque):
    # Inductor reads nothing of a result with no elements and drops the call
    # that makes it (compiled index_put loses its error so); ours still
    # raise eager's IndexError, and return the empty result where every row
    # is in bounds. Opaque, gather_nd too is our kernel's call.
    base, updates = torch.zeros(4, 2, 0, device=device), torch.ones(2, 0, device=device)
    chains = {
        "scatter_nd": lambda indices: torch_masked.scatter_nd(indices, updates * 2, [4, 2, 0]) + 1,
        "tensor_scatter_nd_add": lambda indices: torch_masked.tensor_scatter_nd_add(base, indices, updates) * 2,
        "gather_nd": lambda indices: torch_masked.gather_nd(base[:, 0], indices[:, :1]) + 1,
    }
    good, bad = (torch.tensor([[0, 0], [row, 1]], device=device) for row in (3, 4))
    torch._dynamo.reset()
    with torch_masked.compile.opaque(opaque):
        for op, chain in chains.items():
            compiled = torch.compile(chain, fullgraph=True)
            exact(compiled(good), chain(good))
            # One bad row, 4 in dimension 0 of size 4.
            row, shape = ("4", "4, 0") if op == "gather_nd" else ("4, 1", "4, 2, 0")
            message = (rf"{op}: expected every index within shape \[{shape}\], got \[{row}\] at indices\[1\] "
                       r"\(4 is out of range for dimension 0 of size 4\)")
            for call in (chain, compiled):
                with pytest.raises(IndexError, match=message):
                    call(bad)


def generated_kernels(code):
    """The kernels in Inductor's generated modules, their names left out."""
    return sorted(re.sub(r"\b(cpp|triton)_\w+", "kernel", source)
                  for module in code for source in re.findall(r"'''(.*?)'''", module, re.S))


def test_nonzero_count_is_bounded_as_torch_nonzeros(device):
    # Our fake kernels bound the count of a data-dependent size by the
    # elements it counts, as torch.nonzero's does, so that Inductor indexes
    # what reads the result in 32 bits where they suffice: the kernel after
    # our call is the one after torch.nonzero's. (A mask the graph computes
    # is written for ours as bytes, by a kernel unlike native's: see
    # test_bools_inductor_computes_reach_our_kernels_as_bytes.)
    mask = (torch.randn(1000, generator=gen(31)) > 0).to(device)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        ours, ours_code = run_and_get_code(
            torch.compile(lambda mask: (torch_masked.nonzero(mask) + 1).sum(), fullgraph=True), mask)
        native, native_code = run_and_get_code(
            torch.compile(lambda mask: (torch.nonzero(mask) + 1).sum(), fullgraph=True), mask)
    assert "torch.ops.masked.nonzero.default(" in "\n".join(ours_code)
    assert generated_kernels(ours_code) == generated_kernels(native_code)
    exact(ours, native)


def test_inductor_caches_key_on_the_package_its_extension_and_the_switch():
    # The caches key a graph before decomposition: the package's
    # fingerprint, and the opaque switch, must be in cache_key_tag.
    tag = torch.compiler.config.cache_key_tag
    fingerprint = "|torch_masked." + torch_masked.compile._FINGERPRINT
    assert tag.endswith(fingerprint)
    with torch_masked.compile.opaque():
        assert torch.compiler.config.cache_key_tag == tag + ".opaque"
    try:
        torch.compiler.config.cache_key_tag = "user" + tag
        with torch_masked.compile.opaque():
            assert torch.compiler.config.cache_key_tag == "user" + tag + ".opaque"
        assert torch.compiler.config.cache_key_tag == "user" + tag
    finally:
        torch.compiler.config.cache_key_tag = tag


def test_fingerprint_changes_with_any_module_or_the_extension(tmp_path):
    # A graph traced through an older fake kernel, decomposition or C++
    # backward must not be served from the caches: a change to any of the
    # package's modules, or a rebuilt extension, gives a new fingerprint.
    package = pathlib.Path(torch_masked.__file__).parent
    extension = pathlib.Path(torch_masked._C.__file__)
    assert torch_masked.compile._fingerprint(package, extension) == torch_masked.compile._FINGERPRINT
    copy = tmp_path / "torch_masked"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    copied_extension = tmp_path / extension.name
    shutil.copy2(extension, copied_extension)
    fingerprints = {torch_masked.compile._fingerprint(copy, copied_extension)}
    for module in ("ops/_checks.py", "compile.py"):
        with open(copy / module, "a") as f:
            f.write("\n")
        fingerprints.add(torch_masked.compile._fingerprint(copy, copied_extension))
    stat = copied_extension.stat()
    os.utime(copied_extension, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    fingerprints.add(torch_masked.compile._fingerprint(copy, copied_extension))
    assert len(fingerprints) == 4


def test_import_does_not_load_inductor_and_registers_when_it_loads():
    registered = (
        "from torch._inductor.decomposition import select_decomp_table\n"
        "assert set(torch_masked.compile.DECOMPOSITIONS) <= set(select_decomp_table())\n"
    )
    imported_first = "import sys, torch, torch_masked\nassert 'torch._inductor' not in sys.modules\nimport torch._inductor.lowering\n"
    # Inductor loaded (and its table's copy cached) before torch_masked.
    inductor_first = (
        "import torch, torch._inductor.lowering\n"
        "from torch._inductor.decomposition import select_decomp_table\n"
        "select_decomp_table()\n"
        "import torch_masked\n"
    )
    # No pool of compile workers to start (and wait for at exit): nothing is compiled.
    environment = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS="1")
    for script in (imported_first, inductor_first):
        subprocess.run([sys.executable, "-c", script + registered], check=True, env=environment)
