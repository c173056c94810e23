"""Algebraic (orthogonal-power) positional encodings as modules.

:class:`AlgebraicEncoder` holds per-head orthogonal generators and gives the
maps of a grid, a sequence or a tree; :class:`AlgebraicSelfAttention` rotates
queries and keys with them (``q' = W^p q``, ``k' = W^p k`` through
``apply_maps``) and then runs ordinary scaled dot-product attention, so the
scores are ``q^T W^(p_k - p_q) k`` (Kogkalidis et al., NeurIPS 2024).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops, reference
from ..algebraic import orthogonal, power_table, rope_generator_init, tree_maps_heap
from ..grid import grid_coords
from .attention import MultiHeadSelfAttention, check_tokens

__all__ = ["AlgebraicEncoder", "AlgebraicSelfAttention", "ALGEBRAIC_KINDS", "apply_maps_auto"]

ALGEBRAIC_KINDS = ("sequence", "grid", "tree")
INITS = ("rope", "random")


def apply_maps_auto(x: torch.Tensor, maps: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``ops.apply_maps`` where it has a kernel for the device and dtype, else the reference."""
    return (ops.apply_maps if ops.has_kernel("apply_maps", x) else reference.apply_maps)(x, maps, index)


class AlgebraicEncoder(nn.Module):
    """Per-head orthogonal generators ``W = matrix_exp(S - S^T)`` and their maps.

    Args:
        head_dim: D, split into A blocks of m = D / A.
        heads: H (one generator per head, per axis or branch).
        kind: ``"sequence"`` (A = 1, positions 0 .. N-1 in token order), ``"grid"``
            (A = ndim, one block per axis: W_1^(p_1) (+) ... (+) W_G^(p_G)) or ``"tree"``
            (A = 1, one generator per branch, positions are heap indices).
        ndim: grid rank for ``"grid"``.
        kappa: branching factor for ``"tree"``.
        max_depth: deepest tree level (``"tree"``; bounds the map table without
            reading positions on the host).
        init: ``"rope"`` (W starts as the RoPE rotation of the block) or ``"random"``.
        learnable: learn S; ``learnable=False`` with ``init="rope"`` is plain RoPE.
    """

    def __init__(
        self,
        head_dim: int,
        heads: int,
        kind: str = "sequence",
        ndim: int = 1,
        kappa: int = 2,
        max_depth: int = 8,
        init: str = "rope",
        learnable: bool = True,
        base: float = 10000.0,
    ):
        super().__init__()
        if kind not in ALGEBRAIC_KINDS:
            raise ValueError(f"AlgebraicEncoder: kind must be one of {ALGEBRAIC_KINDS}, got {kind!r}")
        if init not in INITS:
            raise ValueError(f"AlgebraicEncoder: init must be one of {INITS}, got {init!r}")
        blocks = ndim if kind == "grid" else 1
        if ndim < 1 or head_dim % blocks:
            raise ValueError(
                f"AlgebraicEncoder: head_dim ({head_dim}) must split into {blocks} equal blocks (one per axis)"
            )
        m = head_dim // blocks
        if init == "rope" and m % 2:
            raise ValueError(f"AlgebraicEncoder: init='rope' needs an even block size, got m = {m}")
        if kind == "tree" and (kappa < 2 or max_depth < 0):
            raise ValueError(f"AlgebraicEncoder: kappa must be >= 2 and max_depth >= 0, got {kappa}, {max_depth}")
        self.kind, self.heads, self.blocks, self.m = kind, heads, blocks, m
        self.ndim, self.kappa, self.max_depth = ndim, kappa, max_depth
        lead = (kappa, heads, 1) if kind == "tree" else (heads, blocks)
        if init == "rope":
            s = rope_generator_init(m, base).expand(*lead, m, m).clone()
            if kind == "tree":  # distinct branches: rotate each branch's start differently
                s = s * torch.arange(1, kappa + 1, dtype=s.dtype).view(kappa, 1, 1, 1, 1)
        else:
            s = torch.randn(*lead, m, m) * (0.5 / m**0.5)
        if learnable:
            self.generator = nn.Parameter(s)
        else:
            self.register_buffer("generator", s)

    def orthogonal_maps(self) -> torch.Tensor:
        """The current W: (H, A, m, m), or (kappa, H, 1, m, m) for trees."""
        return orthogonal(self.generator)

    def grid_maps(self, grid: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(maps (P, H, A, m, m), index (N, A)) for the cells of ``grid`` (a sequence: [N])."""
        grid = [int(n) for n in grid]
        if self.kind == "tree":
            raise ValueError("AlgebraicEncoder(kind='tree') takes tree positions: use tree_maps(positions)")
        if self.kind == "sequence":
            P = math.prod(grid)
            coords = torch.arange(P, device=self.generator.device)[:, None]
        else:
            if len(grid) != self.ndim:
                raise ValueError(f"AlgebraicEncoder was built for {self.ndim}-D grids, got grid {grid}")
            P = max(grid)
            coords = grid_coords(grid, device=self.generator.device)
        return power_table(self.orthogonal_maps(), P), coords

    def tree_maps(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(maps (2 kappa^max_depth, H, 1, m, m), index (..., N, 1)) for heap positions
        (root 1, children kappa p + c); positions deeper than max_depth are out of range."""
        if self.kind != "tree":
            raise ValueError("tree_maps needs AlgebraicEncoder(kind='tree')")
        return tree_maps_heap(self.orthogonal_maps(), self.max_depth), positions.unsqueeze(-1)

    def forward(self, grid: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The (maps, index) of ``grid`` for :func:`posattn.ops.apply_maps` (see ``grid_maps``)."""
        return self.grid_maps(grid)

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, heads={self.heads}, blocks={self.blocks}, m={self.m}"


class AlgebraicSelfAttention(MultiHeadSelfAttention):
    """Multi-head self-attention with algebraic positions: ``q' = W^p q``,
    ``k' = W^p k`` (``apply_maps``), then scaled dot-product attention.

    ``forward(x, grid, has_cls=False, shared=None)``: x (B, T, dim); ``shared`` may
    carry precomputed ``(maps, index)`` (an encoder shared by the layers). A class
    token (index 0) is not rotated.
    """

    def __init__(self, dim: int, heads: int, encoder: Optional[AlgebraicEncoder] = None, causal: bool = False):
        super().__init__(dim, heads)
        if encoder is not None and (encoder.heads != heads or encoder.blocks * encoder.m != dim // heads):
            raise ValueError("AlgebraicSelfAttention: the encoder's heads and head dim must match the attention's")
        self.causal, self.encoder = causal, encoder

    def forward(self, x: torch.Tensor, grid: Sequence[int], has_cls: bool = False, shared=None) -> torch.Tensor:
        """x (B, T, dim), T = prod(grid) (+1 with a class token) -> (B, T, dim). ``shared``: the (maps, index) of an encoder shared by the layers."""
        grid = check_tokens(self, x, grid, has_cls, self.dim)
        q, k, v = self.heads_qkv(x)
        if shared is None:
            if self.encoder is None:
                raise ValueError("AlgebraicSelfAttention without an encoder needs shared=(maps, index)")
            shared = self.encoder(grid)
        maps, index = shared
        maps = maps.to(q.dtype)
        start = int(has_cls)
        q_rot = apply_maps_auto(q[:, :, start:], maps, index)
        k_rot = apply_maps_auto(k[:, :, start:], maps, index)
        if has_cls:
            q_rot, k_rot = torch.cat([q[:, :, :1], q_rot], 2), torch.cat([k[:, :, :1], k_rot], 2)
        return self.output(F.scaled_dot_product_attention(q_rot, k_rot, v, is_causal=self.causal))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.heads}, causal={self.causal}"
