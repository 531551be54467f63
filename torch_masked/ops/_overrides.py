"""How the front doors call the ops, and honour ``__torch_function__`` as
torch's own functions do.

A front door given a tensor-like that is not a tensor (FX's Proxy, under
``torch.fx.symbolic_trace``) hands the whole call to it, through
``torch.overrides.handle_torch_function``: FX then records
``torch_masked.where`` itself, where the front door would otherwise try to
make a tensor of the Proxy. Tensors never take this path: the op they reach
is called through its entry point (below), which honours
``__torch_function__`` (tensor subclasses) and TorchFunctionModes itself.
Nor does an active mode alone, so that a mode such as
``with torch.device(...)`` still sees the tensors a front door makes of
numbers and lists.
"""
import torch
from torch.overrides import has_torch_function

from .._after_import import when_imported


def has_stand_in(*values):
    """Whether one of ``values`` is a tensor-like that is not a tensor. The
    C test first, which is false at once for tensors and numbers (0.1 µs,
    where the Python test alone costs 1 µs)."""
    return has_torch_function(values) and any(
        not isinstance(v, torch.Tensor) and hasattr(type(v), "__torch_function__") for v in values
    )


def entry_point(op):
    """The C++ callable that the OpOverload `op` hands every call to (what
    ``OpOverload.__call__`` calls, in torch 2.11 to 2.14 alike): a front
    door that calls it directly saves that Python frame, 0.20-0.33 µs of
    the 1.6-4 µs a call on ten elements takes (benchmarks/METHODS.md). The
    callable honours ``__torch_function__`` and the dispatcher's modes as
    `op` does. Front doors look their entry points up once, at import (a
    lookup through ``torch.ops`` costs 0.3 µs a call). Dynamo traces an
    OpOverload but not its callable; once Dynamo is imported, it traces
    `op` wherever a front door calls the callable."""
    entry = op._op

    def traced(*args, **kwargs):
        return op(*args, **kwargs)

    when_imported("torch._dynamo",
                  lambda _: torch.compiler.substitute_in_graph(entry, skip_signature_check=True)(traced))
    return entry
