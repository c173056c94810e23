"""``posattn.ops.apply_maps``: the wrapper of ``torch.ops.posattn.apply_maps``, its fake
kernels and its autograd (the backward is ``torch.ops.posattn.apply_maps_backward``)."""

from __future__ import annotations

import torch

from ._autograd import refuse_double_backward
from ._checks import check_apply_maps_args, check_apply_maps_backward_args


def apply_maps(x: torch.Tensor, maps: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    r"""Applies per-token block maps: the algebraic positional encoding ``W^p x``.

    Shapes: B batch, H heads, N tokens, D head dim = A * m (A blocks of size m:
    one per grid axis, or A = 1 with m = D for a sequence or tree), P maps.

    Args:
        x: (B, H, N, D).
        maps: (P, H, A, m, m), e.g. a table of powers ``W^p`` (see
            :mod:`posattn.algebraic`).
        index: int64 (N, A) shared by the batch, or (B, N, A): which map each
            token uses for each block; values in [0, P).

    Returns:
        y (B, H, N, D) with ``y[b, h, n, a m:(a+1) m] = maps[index[(b,) n, a], h, a] @ x[b, h, n, a m:(a+1) m]``.

    Differentiable in ``x`` and ``maps`` (a map's gradient sums over every token
    that uses it). The gathered (B, N, H, m, m) maps are never formed. Index
    values out of range raise ValueError on the CPU; on CUDA they are checked on the device (a
    device-side assertion with the same words, no host synchronisation).
    """
    check_apply_maps_args(x, maps, index)
    return torch.ops.posattn.apply_maps(x, maps, index)


@torch.library.register_fake("posattn::apply_maps")
def _apply_maps_fake(x, maps, index):
    check_apply_maps_args(x, maps, index)
    return x.new_empty(x.shape)


@torch.library.register_fake("posattn::apply_maps_backward")
def _apply_maps_backward_fake(grad_y, x, maps, index, need_x, need_maps):
    check_apply_maps_backward_args(grad_y, x, maps, index)
    return (
        x.new_empty(x.shape) if need_x else x.new_empty(0),
        maps.new_empty(maps.shape) if need_maps else x.new_empty(0),
    )


def _apply_maps_setup_context(ctx, inputs, output):
    x, maps, index = inputs
    ctx.save_for_backward(x, maps, index)


def _apply_maps_backward(ctx, grad_y):
    x, maps, index = ctx.saved_tensors
    need_x, need_maps = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    gx, gmaps = torch.ops.posattn.apply_maps_backward(grad_y, x, maps, index, need_x, need_maps)
    return (gx if need_x else None, gmaps if need_maps else None, None)


torch.library.register_autograd("posattn::apply_maps", _apply_maps_backward, setup_context=_apply_maps_setup_context)
refuse_double_backward("apply_maps")
