"""Neighbourhood attention modules with NATTEN's names and weights.

:class:`NeighborhoodAttention1D` / ``2D`` / ``3D`` take (B, *grid, C) like
``natten.NeighborhoodAttention{1,2,3}D`` and hold the same parameters under the
same names (``qkv``, ``proj``), so a NATTEN module's ``state_dict`` loads as it
is; they run on :func:`posattn.na1d` etc. (forward and backward on the CPU and
CUDA). ``rel_pos_bias=True`` adds what NATTEN dropped in 0.20: a learned bias
per head and offset within the window, ``rpb`` (H, 2 k_1 - 1, ..., 2 k_G - 1)
in the window's (dilated) cells.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
from torch import nn

from .. import neighborhood
from ..grid import relative_offsets

__all__ = ["NeighborhoodAttention", "NeighborhoodAttention1D", "NeighborhoodAttention2D", "NeighborhoodAttention3D"]

IntOrTuple = Union[int, Sequence[int]]


def _per_axis(name: str, value, rank: int) -> tuple:
    items = tuple(value) if isinstance(value, (tuple, list)) else (value,) * rank
    if len(items) != rank:
        raise ValueError(f"NeighborhoodAttention{rank}D: {name} must give {rank} values, got {value!r}")
    return items


class NeighborhoodAttention(nn.Module):
    """Multi-head neighbourhood self-attention on a grid of ``rank`` axes:
    (B, *grid, embed_dim) -> (B, *grid, embed_dim).

    Args:
        rank: grid axes (1, 2 or 3 in the named subclasses; any here).
        embed_dim: channels C, divisible by ``num_heads``.
        num_heads: heads H.
        kernel_size: NATTEN's window size per axis (an int applies to every axis).
        stride: NATTEN's stride per axis.
        dilation: NATTEN's dilation per axis.
        is_causal: NATTEN's causal axes (a bool applies to every axis).
        qkv_bias: bias of the q / k / v projection.
        qk_scale: logit scale, default head_dim ** -0.5.
        proj_drop: dropout after the output projection.
        rel_pos_bias: a learned bias per head and window offset (``rpb``).
        window_border: ``"shift"`` (NATTEN's rule) or ``"clip"``.
    """

    def __init__(
        self,
        rank: int,
        embed_dim: int,
        num_heads: int,
        kernel_size: IntOrTuple,
        stride: IntOrTuple = 1,
        dilation: IntOrTuple = 1,
        is_causal: Union[bool, Sequence[bool]] = False,
        qkv_bias: bool = True,
        qk_scale: Optional[float] = None,
        proj_drop: float = 0.0,
        rel_pos_bias: bool = False,
        window_border: str = "shift",
    ):
        super().__init__()
        if num_heads < 1 or embed_dim % num_heads != 0:
            raise ValueError(
                f"NeighborhoodAttention{rank}D: num_heads must divide embed_dim, got {embed_dim=}, {num_heads=}"
            )
        self.rank = rank
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.scale = qk_scale or self.head_dim**-0.5
        self.kernel_size = _per_axis("kernel_size", kernel_size, rank)
        self.stride = _per_axis("stride", stride, rank)
        self.dilation = _per_axis("dilation", dilation, rank)
        self.is_causal = _per_axis("is_causal", is_causal, rank)
        self.window_border = window_border
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim, bias=qkv_bias)
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.proj_drop = nn.Dropout(proj_drop)
        if rel_pos_bias:
            self.rpb = nn.Parameter(torch.empty(num_heads, *(2 * k - 1 for k in self.kernel_size)))
            nn.init.trunc_normal_(self.rpb, std=0.02)
        else:
            self.register_parameter("rpb", None)

    def offset_bias(self, grid: Sequence[int]) -> torch.Tensor:
        """(H, U) bias of ``grid``'s offset table from ``rpb``: an offset of d t
        cells (t within the window's reach) takes rpb's entry t; the others, which
        no query keeps, 0."""
        delta = relative_offsets(grid, device=self.rpb.device)  # (U, G)
        dil = torch.tensor(self.dilation, device=delta.device).clamp(min=1)
        reach = torch.tensor([k - 1 for k in self.kernel_size], device=delta.device)
        sub = torch.div(delta, dil, rounding_mode="floor")
        inside = ((delta % dil) == 0).all(-1) & (sub.abs() <= reach).all(-1)  # (U,)
        index = torch.zeros(delta.shape[0], dtype=torch.long, device=delta.device)
        for d in range(len(grid)):
            index = index * (2 * self.kernel_size[d] - 1) + (sub[:, d].clamp(-reach[d], reach[d]) + reach[d])
        table = self.rpb.reshape(self.num_heads, -1)
        return torch.where(inside, table[:, index], torch.zeros((), dtype=table.dtype, device=table.device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, *grid, embed_dim) -> (B, *grid, embed_dim): each token attends to its window."""
        if x.dim() != self.rank + 2 or x.shape[-1] != self.embed_dim:
            raise ValueError(
                f"NeighborhoodAttention{self.rank}D: x must have shape (B, {self.rank} grid axes, "
                f"{self.embed_dim}), got {tuple(x.shape)}"
            )
        B, *grid, C = x.shape
        q, k, v = self.qkv(x).reshape(B, *grid, 3, self.num_heads, self.head_dim).unbind(-3)
        out = neighborhood.neighborhood_attention(
            q,
            k,
            v,
            self.kernel_size,
            self.stride,
            self.dilation,
            self.is_causal,
            self.scale,
            bias=None if self.rpb is None else self.offset_bias(grid).to(q.dtype),  # q's dtype under autocast
            window_border=self.window_border,
        )
        return self.proj_drop(self.proj(out.reshape(B, *grid, C)))

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, dilation={self.dilation}, is_causal={self.is_causal}, "
            f"rel_pos_bias={self.rpb is not None}, window_border={self.window_border!r}"
        )


class NeighborhoodAttention1D(NeighborhoodAttention):
    """``natten.NeighborhoodAttention1D`` on posattn: (B, L, C) -> (B, L, C)."""

    def __init__(self, embed_dim: int, num_heads: int, kernel_size: IntOrTuple, *args, **kwargs):
        super().__init__(1, embed_dim, num_heads, kernel_size, *args, **kwargs)


class NeighborhoodAttention2D(NeighborhoodAttention):
    """``natten.NeighborhoodAttention2D`` on posattn: (B, X, Y, C) -> (B, X, Y, C)."""

    def __init__(self, embed_dim: int, num_heads: int, kernel_size: IntOrTuple, *args, **kwargs):
        super().__init__(2, embed_dim, num_heads, kernel_size, *args, **kwargs)


class NeighborhoodAttention3D(NeighborhoodAttention):
    """``natten.NeighborhoodAttention3D`` on posattn: (B, X, Y, Z, C) -> (B, X, Y, Z, C)."""

    def __init__(self, embed_dim: int, num_heads: int, kernel_size: IntOrTuple, *args, **kwargs):
        super().__init__(3, embed_dim, num_heads, kernel_size, *args, **kwargs)
