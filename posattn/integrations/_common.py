"""What the model patches share."""

from __future__ import annotations

import torch

from .. import ops


def runs_on_posattn(x: torch.Tensor) -> bool:
    """Whether relpos_attention has a kernel for the queries a linear projection of
    ``x`` gives: x's device, and its dtype or, under autocast, the autocast dtype.
    A patched model runs its own code where it has not (a bfloat16 model on the
    CPU, say), as the unpatched one would."""
    dtype = x.dtype
    if torch.is_autocast_enabled(x.device.type):
        dtype = torch.get_autocast_dtype(x.device.type)
    return ops.has_kernel("relpos_attention", x, dtype=dtype)
