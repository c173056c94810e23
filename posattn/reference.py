"""Dense pure-PyTorch implementations of every posattn operator contract.

They are literal and readable rather than fast (they build (B, H, N, N)
score tensors), differentiable through ordinary autograd, and are what the
tests compare the compiled kernels against. Users may call them to check
results on small inputs.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from .grid import (
    WINDOW_BORDERS,
    check_dilation_with_span,
    grid_coords,
    normalise_grid,
    offset_rows,
    span_half_widths,
    window_key_range,
    window_spec,
)


def relpos_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    q_pos: Optional[torch.Tensor] = None,
    rel: Optional[torch.Tensor] = None,
    grid: Optional[Sequence[int]] = None,
    sigma: Optional[torch.Tensor] = None,
    threshold: float = 0.0,
    span_mode: str = "add",
    scale: Optional[float] = None,
    causal: bool = False,
    bias: Optional[torch.Tensor] = None,
    window: Optional[Sequence[int]] = None,
    window_border: str = "clip",
    kernel_size=None,
    window_stride=None,
    window_causal=None,
    window_dilation=None,
) -> torch.Tensor:
    """The (B, H, N, N) logits ``s_ij`` of :func:`relpos_attention`, after the span,
    with -inf at masked pairs (same arguments as the operator, without ``v``)."""
    B, H, N, D = q.shape
    grid = normalise_grid(grid, N)
    if scale is None:
        scale = D**-0.5
    coords = grid_coords(grid, device=q.device)  # (N, G)
    delta = coords[None, :, :] - coords[:, None, :]  # (N_query, N_key, G): pos(j) - pos(i)

    scores = scale * (q @ k.transpose(-1, -2))  # (B, H, N, N)
    if q_pos is not None:
        pos_logits = q_pos @ rel.transpose(-1, -2)  # (B, H, N, U): q_pos_i . rel[u]
        rows = offset_rows(delta, grid)  # (N, N)
        scores = scores + scale * pos_logits.gather(-1, rows.expand(B, H, N, N))
    if bias is not None:
        scores = scores + bias[:, offset_rows(delta, grid)]  # (H, N, N): bias[h, row(delta_ij)]

    keep = torch.ones(H, N, N, dtype=torch.bool, device=q.device)
    if sigma is not None:
        denom = torch.tensor([max(n - 1, 1) for n in grid], dtype=q.dtype, device=q.device)
        x = delta.to(q.dtype) / denom  # normalised offsets, (N, N, G)
        # sigma may be float32 with half q (as the operator allows); the logits keep q's dtype
        quad = (0.5 * ((x[None] / sigma[:, None, None, :]) ** 2).sum(-1)).to(scores.dtype)  # (H, N, N)
        if span_mode == "add":
            scores = scores - quad
        elif span_mode == "multiply":
            scores = scores * torch.exp(-quad)
        else:
            raise ValueError(f'span_mode must be "add" or "multiply", got {span_mode!r}')
        if threshold > 0:
            half = torch.tensor(span_half_widths(sigma, threshold, grid), dtype=torch.long, device=q.device).reshape(
                H, len(grid)
            )  # (H, G), also for H = 0
            keep = keep & (delta.abs()[None] <= half[:, None, None, :]).all(-1)
    spec = window_spec(window, grid, kernel_size, window_stride, window_causal, window_dilation)
    if window_border not in WINDOW_BORDERS:
        raise ValueError(f'relpos_attention: window_border must be "clip" or "shift", got {window_border!r}')
    if spec is not None:
        check_dilation_with_span(spec.dilation, threshold)
        for d, n in enumerate(grid):
            # a dilated axis: the window lives on the sub-grid of the query's residue modulo dil
            dil = min(spec.dilation[d], n)
            res, sub = coords[:, d] % dil, coords[:, d] // dil  # (N,)
            lo, hi = window_key_range(  # (N,) per query, in sub-grid cells
                sub, (n - res + dil - 1) // dil, spec.left[d], spec.right[d], window_border, spec.stride[d],
                bool(spec.causal[d]),
            )  # fmt: skip
            keep = keep & (res[None, :] == res[:, None]) & (sub[None, :] >= lo[:, None]) & (sub[None, :] <= hi[:, None])
    if causal:
        keep = keep & torch.ones(N, N, dtype=torch.bool, device=q.device).tril()
    return scores.masked_fill(~keep, float("-inf"))


def relpos_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: Optional[torch.Tensor] = None,
    rel: Optional[torch.Tensor] = None,
    grid: Optional[Sequence[int]] = None,
    sigma: Optional[torch.Tensor] = None,
    threshold: float = 0.0,
    span_mode: str = "add",
    scale: Optional[float] = None,
    causal: bool = False,
    return_lse: bool = False,
    bias: Optional[torch.Tensor] = None,
    window: Optional[Sequence[int]] = None,
    window_border: str = "clip",
    kernel_size=None,
    window_stride=None,
    window_causal=None,
    window_dilation=None,
    packed=None,
):
    """Reference for :func:`posattn.ops.relpos_attention` (same arguments and results).

    ``packed``: a :class:`posattn.PackedGrids`; q, k, v, q_pos are then (1, H, T, D) with the
    samples' tokens one after another (``grid`` None), ``rel`` / ``bias`` the tables of
    ``packed.max_grid``; each sample is a call on its own grid, with its rows of the tables, and
    tokens past ``packed.num_tokens`` get output 0 and lse -inf."""
    if packed is not None:
        return _relpos_attention_packed(
            q, k, v, q_pos, rel, grid, sigma, threshold, span_mode, scale, causal, return_lse, bias, window,
            window_border, kernel_size, window_stride, window_causal, window_dilation, packed,
        )  # fmt: skip
    scores = relpos_scores(
        q, k, q_pos, rel, grid, sigma, threshold, span_mode, scale, causal, bias, window, window_border,
        kernel_size, window_stride, window_causal, window_dilation,
    )  # fmt: skip
    # The softmax statistics in the accumulation type (float32, or float64), as the operator keeps them.
    scores = scores.to(torch.float64 if q.dtype == torch.float64 else torch.float32)
    # (B, H, N); -inf where every key is masked, without a gradient through those rows (logsumexp's
    # own would be 0 / 0 = NaN: their output is 0 whatever the inputs, so their gradient is 0)
    empty = torch.isneginf(scores).all(-1, keepdim=True)
    lse = torch.logsumexp(scores.masked_fill(empty, 0.0), dim=-1).masked_fill(empty[..., 0], float("-inf"))
    # Rows with every key masked get zeros; NaN or inf anywhere else stays visible.
    masked = torch.isneginf(lse)[..., None]
    probs = torch.exp(scores - lse[..., None].masked_fill(masked, 0.0)).masked_fill(masked, 0.0)
    out = probs.to(v.dtype) @ v
    return (out, lse) if return_lse else out


def _relpos_attention_packed(
    q, k, v, q_pos, rel, grid, sigma, threshold, span_mode, scale, causal, return_lse, bias, window,
    window_border, kernel_size, window_stride, window_causal, window_dilation, packed,
):  # fmt: skip
    """relpos_attention over a PackedGrids: a loop of single-grid calls (the definition the packed
    kernels are tested against)."""
    from .packed import check_packed_call, sample_offset_rows

    check_packed_call(packed, grid, window_dilation, None, None)
    if q.dim() != 4 or q.shape[0] != 1:
        raise ValueError(f"relpos_attention: with packed=, q must be (1, H, T, D), got {tuple(q.shape)}")
    T = q.shape[2]
    if packed.num_tokens > T:
        raise ValueError(f"relpos_attention: packed holds {packed.num_tokens} tokens but q has only T = {T}")
    if scale is None:
        scale = q.shape[-1] ** -0.5
    outs, lses = [], []
    for start, shape in packed.samples():
        n = math.prod(shape)
        part = slice(start, start + n)
        rows = sample_offset_rows(shape, packed.max_grid, device=q.device)
        out, lse = relpos_attention(
            q[:, :, part], k[:, :, part], v[:, :, part], None if q_pos is None else q_pos[:, :, part],
            None if rel is None else rel[:, rows], list(shape), sigma, threshold, span_mode, scale, causal, True,
            None if bias is None else bias[:, rows], window, window_border, kernel_size, window_stride,
            window_causal,
        )  # fmt: skip
        outs.append(out)
        lses.append(lse)
    tail = T - packed.num_tokens
    if tail > 0:
        outs.append(v.new_zeros(1, v.shape[1], tail, v.shape[-1]))
        lses.append(torch.full((1, q.shape[1], tail), float("-inf"), dtype=lses[0].dtype, device=q.device))
    out, lse = torch.cat(outs, dim=2), torch.cat(lses, dim=2)
    return (out, lse) if return_lse else out


def apply_maps(x: torch.Tensor, maps: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Reference for :func:`posattn.ops.apply_maps`: gathers the (B, N, H, A, m, m)
    maps of every token (the approach of the public code) and multiplies."""
    B, H, N, D = x.shape
    P, _, A, m, _ = maps.shape
    idx = index if index.dim() == 3 else index.expand(B, N, A)
    heads = torch.arange(H, device=x.device)[None, None, :, None]
    axes = torch.arange(A, device=x.device)[None, None, None, :]
    gathered = maps[idx[:, :, None, :], heads, axes]  # (B, N, H, A, m, m)
    blocks = x.permute(0, 2, 1, 3).reshape(B, N, H, A, m)
    y = torch.einsum("bnhaij,bnhaj->bnhai", gathered, blocks)
    return y.reshape(B, N, H, D).permute(0, 2, 1, 3)
