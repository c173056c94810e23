"""Where the operators have kernels: :func:`has_kernel` (which the modules and the
model patches ask before calling an operator) and :func:`cpu_capability`."""

from __future__ import annotations

from typing import Optional

import torch

OPS = ("relpos_attention", "apply_maps")

# Which device types have a kernel of each operator (fixed once the extension is
# loaded; "meta" has the fake kernel, for shape inference), and the dtypes each
# backend's kernels take (the CPU kernels check theirs: relpos_cpu.cpp,
# apply_maps_cpu.cpp).
_KERNEL_DEVICES = {
    op: frozenset(
        device
        for device, key in (("cpu", "CPU"), ("cuda", "CUDA"), ("meta", "Meta"))
        if torch._C._dispatch_has_kernel_for_dispatch_key(f"posattn::{op}", key)
    )
    for op in OPS
}
_HALF = (torch.float16, torch.bfloat16)
_KERNEL_DTYPES = {
    "cpu": (torch.float32, torch.float64),
    "cuda": (torch.float32, torch.float64) + _HALF,
    "meta": (torch.float32, torch.float64) + _HALF,
}


def has_kernel(op: str, x: torch.Tensor, dtype: Optional[torch.dtype] = None) -> bool:
    """Whether ``torch.ops.posattn.<op>`` has a kernel for ``x``'s device and dtype
    (``op``: ``"relpos_attention"`` or ``"apply_maps"``; ``dtype``: the dtype the
    operator will get instead of ``x``'s, e.g. a projection's under autocast).
    Modules and the model patches (:mod:`posattn.integrations`) fall back to
    :mod:`posattn.reference` or the model's own code where it has not."""
    if op not in _KERNEL_DEVICES:
        raise ValueError(f"has_kernel: op must be one of {', '.join(OPS)}, got {op!r}")
    device = x.device.type
    return device in _KERNEL_DEVICES[op] and (dtype or x.dtype) in _KERNEL_DTYPES.get(device, ())


def cpu_capability() -> str:
    """The instruction set the CPU kernels run with on this machine: ``"avx512"``
    (x86-64-v4), ``"avx2"`` (x86-64-v3) or ``"base"`` (the build's baseline,
    x86-64-v2 by default). The extension holds the kernels for all three and
    picks the widest this CPU runs; the environment variable
    ``POSATTN_CPU_CAPABILITY`` picks a lower one (read on every call; a set the
    CPU lacks is a ValueError)."""
    return torch.ops.posattn.cpu_capability()
