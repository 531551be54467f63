"""The Triton code that Inductor generates for our fused ops on a GPU, without
a GPU: the tests of tests/test_compile_fusion.py that take `device`, run
again with Inductor generating Triton code for CPU tensors and Triton's
interpreter running it, then every kernel that run generated compiled for
sm_90 (the H100's and H200's), as a GPU would take it. How fast that code
runs, only a GPU can say."""
import importlib.util
import os
import pathlib
import subprocess
import sys
import warnings
import xml.etree.ElementTree as ElementTree

import pytest

pytestmark = pytest.mark.cpu_kernel

FUSION_TESTS = pathlib.Path(__file__).with_name("test_compile_fusion.py")


def compile_for_hopper(cache_dir):
    """Compiles every Triton kernel that Inductor wrote to `cache_dir`, with
    each of its configurations, for sm_90 as Triton does on an H100 or H200:
    to PTX, then to a cubin by ptxas, which needs no GPU. Returns the
    kernels' names."""
    import triton
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = []
    for path in sorted(cache_dir.rglob("*.py")):
        source = path.read_text()
        # A kernel's own module; a wrapper holds its kernels' sources too,
        # and compiles them when loaded.
        if "@triton.jit" not in source or "async_compile" in source:
            continue
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Could not find an active CPU backend")
            spec.loader.exec_module(module)
        for name, kernel in vars(module).items():
            if isinstance(kernel, CachingAutotuner):
                meta = kernel.triton_meta
                for config in kernel.configs:
                    constants = {**meta["constants"], **config.kwargs}
                    triton.compile(
                        ASTSource(kernel.fn, meta["signature"], constants, meta["configs"][0]),
                        target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": config.num_warps, "num_stages": config.num_stages},
                    )
                names.append(name)
    return names


# Before Triton 3.8 (torch 2.11 brings 3.6, and 2.11 is what the GPU machines
# run), the interpreter takes no bool argument, nor (under NumPy 2.4) a loop
# bound known only at run time; a test whose kernels need either fails with
# one of these errors, and is left to a GPU. The others run: the Triton code
# of that torch's Inductor, short of the GPU.
INTERPRETER_LIMITS_BEFORE_3_8 = (
    "exceeds dtype primitive_bitwidth (1 bits) for triton type int1",
    "TypeError('only 0-dimensional arrays can be converted to Python scalars')",
)
# Tests that pass on every Triton, 3.6's interpreter included: Inductor's own
# atomic scatter into the buffer with a spare slice, and the fused gathers.
PASS_ON_EVERY_TRITON = (
    "test_rows_into_dimensions_of_size_one",
    "test_unchecked_scatters_are_inductors_own_where_it_generates_triton",
    "test_tensor_scatter_nd_add_adds_into_a_buffer_the_graph_made",
    "test_gather_nd_fuses_and_matches_eager",
)


def failures_outside_limits(report):
    """From the run's JUnit report: the tests it passed, and each failure
    (or error) as `name: message` unless the interpreter's limits before
    Triton 3.8 explain it."""
    import triton

    limits = INTERPRETER_LIMITS_BEFORE_3_8 if tuple(map(int, triton.__version__.split(".")[:2])) < (3, 8) else ()
    passed, failures = [], []
    for case in ElementTree.parse(report).iter("testcase"):
        problems = case.findall("failure") + case.findall("error")
        if case.find("skipped") is None and not problems:
            passed.append(case.get("name"))
        failures += [f"{case.get('name')}: {problem.get('message')}" for problem in problems
                     if not any(limit in (problem.get("message") or "") for limit in limits)]
    return passed, failures


def test_triton_code_runs_interpreted_and_compiles_for_hopper(tmp_path, monkeypatch):
    # In a process of their own: Triton chooses its interpreter for each
    # kernel and helper as it is defined, so from its import on. Kernels
    # compile in that process, where test_compile_fusion's stand-in for a
    # driver is, with no pool of compile workers to start and wait for.
    pytest.importorskip("triton")
    environment = dict(
        os.environ, TRITON_INTERPRET="1", TORCHINDUCTOR_COMPILE_THREADS="1", TORCHINDUCTOR_CACHE_DIR=str(tmp_path)
    )
    report = tmp_path / "interpreted.xml"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", str(FUSION_TESTS), "-q", "-p", "no:cacheprovider", "-k", "triton-interpreted",
         f"--junitxml={report}"],
        env=environment, capture_output=True, text=True,
    )
    assert report.exists(), run.stdout[-6000:] + run.stderr[-2000:]
    passed, failures = failures_outside_limits(report)
    assert not failures, "\n".join(failures) + run.stdout[-6000:]
    assert {name.split("[")[0] for name in passed} >= set(PASS_ON_EVERY_TRITON), passed
    # Then the kernels it generated (its Inductor cache is tmp_path), as a GPU
    # would take them; the cubins too go to tmp_path.
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cubins"))
    names = compile_for_hopper(tmp_path)
    assert any("gather_nd" in name for name in names) and any("scatter_nd" in name for name in names), names
    assert any("where" in name for name in names), names
