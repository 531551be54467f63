"""Checks shared by the fake kernels. Each mirrors a TORCH_CHECK in csrc/ with
the same message, so that eager, fake and compiled calls fail alike."""

import torch


def check(cond, op, message):
    """torch._check with the op's name in front, as the C++ checks print it."""
    torch._check(cond, lambda: f"{op}: {message}")


def check_same_device(op, **tensors):
    """All named tensors on one device; the message names them all."""
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        listed = ", ".join(f"{name} on {dev}" for name, dev in devices.items())
        raise RuntimeError(f"{op}: expected all tensors on one device, got {listed}")
