"""What the operators' autograd registrations share."""

from __future__ import annotations

import torch


def _refuse(op: str):
    """Autograd of a backward operator: refuses a gradient of the gradient, which
    torch would otherwise return as silent zeros (with only a warning)."""

    def backward(ctx, *grads):
        raise RuntimeError(
            f"posattn: double backward (a gradient of the gradient) through {op} is not supported; "
            f"differentiate {op} once (no create_graph=True through it), or use posattn.reference.{op}, "
            "which is differentiable to any order"
        )

    return backward


def _nothing_to_save(ctx, inputs, output):
    pass


def refuse_double_backward(op: str) -> None:
    """Registers the autograd of ``torch.ops.posattn.<op>_backward``: a gradient of the
    gradient raises."""
    torch.library.register_autograd(f"posattn::{op}_backward", _refuse(op), setup_context=_nothing_to_save)
