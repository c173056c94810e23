"""Neighbourhood attention with NATTEN's argument names and layout.

``posattn.na1d / na2d / na3d(query, key, value, kernel_size, stride, dilation,
is_causal, scale, additional_keys, additional_values, return_lse=...)`` take
tensors in NATTEN's heads-last layout ``(B, *grid, H, D)`` and compute what
``natten.na1d / na2d / na3d`` compute (its window rule: windows shifted to stay
inside the grid), on :func:`posattn.ops.relpos_attention`: forward and backward
on the CPU and CUDA, every key outside the windows skipped. On top, posattn's
own terms: a relative-position term (``q_pos`` / ``rel``), a learned bias per
offset (``bias``), a Gaussian span (``sigma``, ``span_mode``) and
``window_border="clip"``.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import torch

from . import ops

__all__ = ["na1d", "na2d", "na3d", "neighborhood_attention", "NATTEN_PERFORMANCE_ARGS"]

IntOrTuple = Union[int, Sequence[int]]
BoolOrTuple = Union[bool, Sequence[bool]]

# NATTEN's arguments that choose and tune its own kernels: accepted (so that a call
# written for natten runs unchanged) and ignored.
NATTEN_PERFORMANCE_ARGS = frozenset(
    {
        "attention_kwargs",
        "backend",
        "q_tile_shape",
        "kv_tile_shape",
        "backward_q_tile_shape",
        "backward_kv_tile_shape",
        "backward_kv_splits",
        "backward_use_pt_reduction",
        "run_persistent_kernel",
        "kernel_schedule",
        "torch_compile",
    }
)
"""NATTEN's arguments that choose and tune its own kernels: accepted and ignored."""


def _heads_first(x: torch.Tensor, grid: Sequence[int]) -> torch.Tensor:
    """(B, *grid, H, D) -> (B, H, N, D)."""
    return x.reshape(x.shape[0], math.prod(grid), x.shape[-2], x.shape[-1]).transpose(1, 2)


def _repeat_kv_heads(x: torch.Tensor, heads: int, name: str) -> torch.Tensor:
    """(B, H_kv, N, D) -> (B, heads, N, D): query head h reads kv head h // (heads / H_kv) (GQA / MQA)."""
    h_kv = x.shape[1]
    if h_kv == heads:
        return x
    if h_kv < 1 or heads % h_kv != 0:
        raise ValueError(f"neighborhood_attention: {name} has {h_kv} heads, which must divide the {heads} query heads")
    return x.repeat_interleave(heads // h_kv, dim=1)


def neighborhood_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kernel_size: IntOrTuple,
    stride: IntOrTuple = 1,
    dilation: IntOrTuple = 1,
    is_causal: Optional[BoolOrTuple] = False,
    scale: Optional[float] = None,
    additional_keys: Optional[torch.Tensor] = None,
    additional_values: Optional[torch.Tensor] = None,
    *,
    return_lse: bool = False,
    q_pos: Optional[torch.Tensor] = None,
    rel: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    sigma: Optional[torch.Tensor] = None,
    span_mode: str = "add",
    window_border: str = "shift",
    **natten_args,
):
    """Neighbourhood attention on a grid of any rank (``na1d`` / ``na2d`` /
    ``na3d`` fix it), in NATTEN's heads-last layout.

    Args:
        query: (B, *grid, H, D).
        key: (B, *grid, H_kv, D), H_kv dividing H (GQA / MQA: query head h reads
            kv head h // (H / H_kv)).
        value: (B, *grid, H_kv, Dv).
        kernel_size: a window of ``kernel_size`` cells (odd or even) per grid axis
            (one value applies to every axis), as NATTEN's; see
            :func:`posattn.ops.relpos_attention` (``kernel_size``).
        stride: query groups of ``stride`` cells sharing one window, per axis
            (``window_stride`` of :func:`posattn.ops.relpos_attention`).
        dilation: every ``dilation``-th cell, per axis (``window_dilation``).
        is_causal: causal axes, a bool per axis (``window_causal``).
        scale: logit scale, default D ** -0.5.
        additional_keys: optional (B, M, H_kv, D): tokens every query attends to
            besides its window.
        additional_values: (B, M, H_kv, Dv), the values of ``additional_keys``.
        return_lse: also return the (B, *grid, H) log-sum-exp (float32, float64
            for float64 inputs).
        q_pos: optional (B, *grid, H, D) positional query, with ``rel`` (H, U, D).
        rel: (H, U, D) relative embeddings, with ``q_pos``
            (:func:`posattn.ops.relpos_attention`).
        bias: optional (H, U) learned bias per head and offset.
        sigma: optional (H, G) span widths.
        span_mode: ``"add"`` or ``"multiply"``, as in :func:`posattn.ops.relpos_attention`.
        window_border: ``"shift"`` (NATTEN's rule, default) or ``"clip"``.
        **natten_args: NATTEN's kernel-tuning arguments (``backend``,
            ``q_tile_shape``, ``torch_compile``, ...; NATTEN_PERFORMANCE_ARGS),
            accepted and ignored; any other name is a TypeError.

    Returns:
        out (B, *grid, H, Dv), or (out, lse) with ``return_lse``.
    """
    unknown = sorted(set(natten_args) - NATTEN_PERFORMANCE_ARGS)
    if unknown:
        raise TypeError(f"neighborhood_attention: unexpected keyword argument(s) {', '.join(unknown)}")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"neighborhood_attention: {name} must be a tensor, got {type(t).__name__}")
    if query.dim() < 4:
        raise ValueError(
            f"neighborhood_attention: query must have shape (B, *grid, H, D) with at least one grid axis, "
            f"got {tuple(query.shape)}"
        )
    grid = list(query.shape[1:-2])
    H = query.shape[-2]
    for name, t in (("key", key), ("value", value)):
        if t.dim() != query.dim() or tuple(t.shape[:-2]) != tuple(query.shape[:-2]):
            raise ValueError(
                f"neighborhood_attention: {name} must have shape (B, *grid, H_kv, D) = "
                f"{tuple(query.shape[:-2])} + (H_kv, D), got {tuple(t.shape)}"
            )
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(f"neighborhood_attention: key and value must have as many heads, got {key.shape[-2]} and "
                         f"{value.shape[-2]}")  # fmt: skip
    q = _heads_first(query, grid)
    k = _repeat_kv_heads(_heads_first(key, grid), H, "key")
    v = _repeat_kv_heads(_heads_first(value, grid), H, "value")
    qp = None if q_pos is None else _heads_first(q_pos, grid)
    extra_k = extra_v = None
    if additional_keys is not None or additional_values is not None:
        if additional_keys is None or additional_values is None:
            raise ValueError("neighborhood_attention: additional_keys and additional_values must be given together")
        for name, t in (("additional_keys", additional_keys), ("additional_values", additional_values)):
            if t.dim() != 4 or t.shape[0] != query.shape[0]:
                raise ValueError(
                    f"neighborhood_attention: {name} must have shape (B, M, H_kv, D) with B = {query.shape[0]}, "
                    f"got {tuple(t.shape)}"
                )
        extra_k = _repeat_kv_heads(additional_keys.transpose(1, 2), H, "additional_keys")
        extra_v = _repeat_kv_heads(additional_values.transpose(1, 2), H, "additional_values")
    out, lse = ops.relpos_attention(
        q,
        k,
        v,
        q_pos=qp,
        rel=rel,
        grid=grid,
        sigma=sigma,
        span_mode=span_mode,
        scale=scale,
        return_lse=True,
        bias=bias,
        kernel_size=kernel_size,
        window_stride=stride,
        window_causal=False if is_causal is None else is_causal,
        window_dilation=dilation,
        window_border=window_border,
        additional_keys=extra_k,
        additional_values=extra_v,
    )
    out = out.transpose(1, 2).reshape(*query.shape[:-1], out.shape[-1])
    if not return_lse:
        return out
    return out, lse.transpose(1, 2).reshape(query.shape[:-1])


def _fixed_rank(rank, query, key, value, kernel_size, stride, dilation, is_causal, scale, additional_keys,
                additional_values, return_lse, kwargs):  # fmt: skip
    # natten's later positional arguments (attention_kwargs, backend, ...) tune its own kernels: here
    # they are keyword-only, so a positional one is a TypeError rather than taken for another
    if isinstance(query, torch.Tensor) and query.dim() != rank + 3:
        raise ValueError(
            f"na{rank}d: query must have shape (B, {', '.join('XYZ'[:rank])}, H, D) ({rank + 3} dims), "
            f"got {tuple(query.shape)}"
        )
    return neighborhood_attention(
        query, key, value, kernel_size, stride, dilation, is_causal, scale, additional_keys, additional_values,
        return_lse=return_lse, **kwargs,
    )  # fmt: skip


def na1d(query, key, value, kernel_size, stride=1, dilation=1, is_causal=False, scale=None,
         additional_keys=None, additional_values=None, *, return_lse=False, **kwargs):  # fmt: skip
    """1-D neighbourhood attention, a drop-in for ``natten.na1d``: query (B, X, H, D); the
    arguments are :func:`neighborhood_attention`'s."""
    return _fixed_rank(1, query, key, value, kernel_size, stride, dilation, is_causal, scale, additional_keys,
                       additional_values, return_lse, kwargs)  # fmt: skip


def na2d(query, key, value, kernel_size, stride=1, dilation=1, is_causal=False, scale=None,
         additional_keys=None, additional_values=None, *, return_lse=False, **kwargs):  # fmt: skip
    """2-D neighbourhood attention, a drop-in for ``natten.na2d``: query (B, X, Y, H, D); the
    arguments are :func:`neighborhood_attention`'s."""
    return _fixed_rank(2, query, key, value, kernel_size, stride, dilation, is_causal, scale, additional_keys,
                       additional_values, return_lse, kwargs)  # fmt: skip


def na3d(query, key, value, kernel_size, stride=1, dilation=1, is_causal=False, scale=None,
         additional_keys=None, additional_values=None, *, return_lse=False, **kwargs):  # fmt: skip
    """3-D neighbourhood attention, a drop-in for ``natten.na3d``: query (B, X, Y, Z, H, D); the
    arguments are :func:`neighborhood_attention`'s."""
    return _fixed_rank(3, query, key, value, kernel_size, stride, dilation, is_causal, scale, additional_keys,
                       additional_values, return_lse, kwargs)  # fmt: skip
