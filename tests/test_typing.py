"""The public functions' annotations, as a user's type checker reads them
(the package ships py.typed): mypy --strict accepts typical calls with the
result types asserted, and reports the calls the front doors refuse."""
import pathlib
import textwrap

import pytest

# mypy comes with the `test` extra (CI installs it); a machine that only
# runs the kernels' tests (a GPU machine) may lack it.
mypy_api = pytest.importorskip("mypy.api")

pytestmark = pytest.mark.static

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Every public function, called as the README and the TensorFlow examples call
# them (lists, numbers and NumPy arrays among the operands).
ACCEPTED = """
    from typing import assert_type

    import numpy as np
    import torch

    import torch_masked
    import torch_masked.compile
    import torch_masked.onnx

    x = torch.randn(4, 3)
    indices = torch.tensor([[0], [2]])
    assert_type(torch_masked.nonzero(x), torch.Tensor)
    assert_type(torch_masked.nonzero(x, out=torch.empty(0, dtype=torch.long)), torch.Tensor)
    assert_type(torch_masked.nonzero(x, as_tuple=True), tuple[torch.Tensor, ...])
    flag: bool = bool(x.sum() > 0)
    assert_type(torch_masked.nonzero(x, as_tuple=flag), torch.Tensor | tuple[torch.Tensor, ...])
    assert_type(torch_masked.nonzero_static(x, size=4, fill_value=-1), torch.Tensor)
    assert_type(torch_masked.where(x > 0), torch.Tensor)
    assert_type(torch_masked.where(x > 0, x, 0.0), torch.Tensor)
    assert_type(torch_masked.where([True, False], [1, 2], np.array([3, 4])), torch.Tensor)
    assert_type(torch_masked.select(torch.tensor([True, False, True, True]), x, -x), torch.Tensor)
    assert_type(torch_masked.boolean_mask(x, x[:, 0] > 0), torch.Tensor)
    assert_type(torch_masked.boolean_mask(x, [True, False, True], axis=-1), torch.Tensor)
    assert_type(torch_masked.scatter_nd(indices, x[:2], x.shape), torch.Tensor)
    assert_type(torch_masked.scatter_nd([[4], [3], [1], [7]], [9, 10, 11, 12], [8]), torch.Tensor)
    assert_type(torch_masked.scatter_nd(indices, x[:2], [np.int64(4), 3], check_bounds=False), torch.Tensor)
    assert_type(torch_masked.gather_nd(x, indices, check_bounds=False), torch.Tensor)
    assert_type(torch_masked.tensor_scatter_nd_add(x, indices, x[:2]), torch.Tensor)
    torch_masked.compile.set_opaque(False)
    assert_type(torch_masked.compile.is_opaque(), bool)
    with torch_masked.compile.opaque():
        pass
    for overload, translation in torch_masked.onnx.translation_table().items():
        assert_type(overload, torch._ops.OpOverload)

    def to_onnx(model: torch.nn.Module) -> torch.onnx.ONNXProgram:
        return torch_masked.onnx.export(model, (x,), "model.onnx", opset_version=18)
"""

# Calls the front doors refuse at run time, each on its own line: mypy
# reports each line.
REFUSED = {
    "torch_masked.where(x > 0, x)": "No overload variant",
    "torch_masked.select(x > 0, x)": "Missing positional argument",
    "torch_masked.gather_nd(x, indices, False)": "Too many positional arguments",
    'torch_masked.scatter_nd(indices, x[:2], "4")': "incompatible type",
    "torch_masked.scatter_nd(indices, x[:2], [4.0, 3.0])": "incompatible type",
    "torch_masked.boolean_mask(x, x > 0, axis=1.5)": "incompatible type",
    "torch_masked.nonzero_static(x, size=2.0)": "incompatible type",
    "torch_masked.compile.set_opaque()": "Missing positional argument",
}


def _mypy(tmp_path, name, code):
    source = tmp_path / f"{name}.py"
    source.write_text(textwrap.dedent(code))
    # The checkout's torch_masked, read as an installed package is: its own
    # modules' errors are not the user's.
    config = tmp_path / "mypy.ini"
    config.write_text(f"[mypy]\nmypy_path = {ROOT}\n\n[mypy-torch_masked.*]\nfollow_imports = silent\n")
    stdout, stderr, status = mypy_api.run(
        ["--strict", "--config-file", str(config), "--cache-dir", str(tmp_path.parent / "mypy_cache"),
         "--no-error-summary", "--hide-error-context", "--show-error-codes", str(source)]
    )
    return stdout + stderr, status


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """mypy's report on the accepted calls, then on the refused ones (one run
    each, the second with the first's cache: torch takes most of a minute)."""
    tmp_path = tmp_path_factory.mktemp("typing")
    accepted = _mypy(tmp_path, "accepted", ACCEPTED)
    header = "import torch\nimport torch_masked\nimport torch_masked.compile\n"
    header += "x = torch.randn(4, 3)\nindices = torch.tensor([[0], [2]])\n"
    refused = _mypy(tmp_path, "refused", header + "\n".join(REFUSED) + "\n")
    return accepted, refused, header.count("\n")


def test_typical_calls_have_the_annotated_types(checked):
    (report, status), _, _ = checked
    assert status == 0, report


def test_refused_calls_are_reported_by_line(checked):
    _, (report, status), first_line = checked
    assert status == 1, report
    lines = report.splitlines()
    for number, (call, wanted) in enumerate(REFUSED.items(), start=first_line + 1):
        errors = [line for line in lines if f"refused.py:{number}:" in line]
        assert errors and any(wanted in line for line in errors), (call, report)
