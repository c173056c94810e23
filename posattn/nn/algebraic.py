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
from .._grid import grid_coords
from ..algebraic import orthogonal, power_table, rope_generator_init, tree_maps_heap
from .attention import check_tokens, merge_heads, split_heads

__all__ = ["AlgebraicEncoder", "AlgebraicSelfAttention", "TreeTransformer", "ALGEBRAIC_KINDS", "apply_maps_auto"]

ALGEBRAIC_KINDS = ("sequence", "grid", "tree")
INITS = ("rope", "random")


# Device types with an apply_maps kernel (fixed once the extension is loaded;
# "meta" has the fake kernel).
MAPS_DEVICE_TYPES = frozenset(
    device
    for device, key in (("cpu", "CPU"), ("cuda", "CUDA"), ("meta", "Meta"))
    if torch._C._dispatch_has_kernel_for_dispatch_key("posattn::apply_maps", key)
)


def _apply_maps_fused(x: torch.Tensor) -> bool:
    if x.device.type not in MAPS_DEVICE_TYPES:
        return False
    # the CUDA kernels also take float16 / bfloat16; the CPU kernels float32 / float64
    return x.device.type == "cuda" or x.dtype in (torch.float32, torch.float64)


def apply_maps_auto(x: torch.Tensor, maps: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``ops.apply_maps`` where it has a kernel for the device and dtype, else the reference."""
    return (ops.apply_maps if _apply_maps_fused(x) else reference.apply_maps)(x, maps, index)


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

    def __init__(self, head_dim: int, heads: int, kind: str = "sequence", ndim: int = 1, kappa: int = 2,
                 max_depth: int = 8, init: str = "rope", learnable: bool = True, base: float = 10000.0):
        super().__init__()
        if kind not in ALGEBRAIC_KINDS:
            raise ValueError(f"AlgebraicEncoder: kind must be one of {ALGEBRAIC_KINDS}, got {kind!r}")
        if init not in INITS:
            raise ValueError(f"AlgebraicEncoder: init must be one of {INITS}, got {init!r}")
        blocks = ndim if kind == "grid" else 1
        if ndim < 1 or head_dim % blocks:
            raise ValueError(f"AlgebraicEncoder: head_dim ({head_dim}) must split into {blocks} equal blocks (one per axis)")
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
        return self.grid_maps(grid)

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, heads={self.heads}, blocks={self.blocks}, m={self.m}"


class AlgebraicSelfAttention(nn.Module):
    """Multi-head self-attention with algebraic positions: ``q' = W^p q``,
    ``k' = W^p k`` (``apply_maps``), then scaled dot-product attention.

    ``forward(x, grid, has_cls=False, rel=None)``: x (B, T, dim); ``rel`` may carry
    precomputed ``(maps, index)`` (an encoder shared by the layers). A class token
    (index 0) is not rotated.
    """

    def __init__(self, dim: int, heads: int, encoder: Optional[AlgebraicEncoder] = None, causal: bool = False):
        super().__init__()
        if heads < 1 or dim % heads:
            raise ValueError(f"AlgebraicSelfAttention: dim ({dim}) must be a positive multiple of heads ({heads})")
        if encoder is not None and (encoder.heads != heads or encoder.blocks * encoder.m != dim // heads):
            raise ValueError("AlgebraicSelfAttention: the encoder's heads and head dim must match the attention's")
        self.dim, self.heads, self.causal, self.encoder = dim, heads, causal, encoder
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, grid: Sequence[int], has_cls: bool = False, rel=None) -> torch.Tensor:
        grid = check_tokens(self, x, grid, has_cls, self.dim)
        q, k, v = (split_heads(t, self.heads) for t in self.qkv(x).chunk(3, dim=-1))
        if rel is None:
            if self.encoder is None:
                raise ValueError("AlgebraicSelfAttention without an encoder needs rel=(maps, index)")
            rel = self.encoder(grid)
        maps, index = rel
        maps = maps.to(q.dtype)
        start = int(has_cls)
        q_rot = apply_maps_auto(q[:, :, start:], maps, index)
        k_rot = apply_maps_auto(k[:, :, start:], maps, index)
        if has_cls:
            q_rot, k_rot = torch.cat([q[:, :, :1], q_rot], 2), torch.cat([k[:, :, :1], k_rot], 2)
        out = F.scaled_dot_product_attention(q_rot, k_rot, v, is_causal=self.causal)
        return self.proj(merge_heads(out))


class TreeTransformer(nn.Module):
    """A small encoder over the nodes of trees, with algebraic positions.

    Input: tokens (B, N) int64 and heap positions (B, N) int64 (root 1, children
    ``kappa p + c``; padding nodes may use position 0 with ``mask``). Output:
    per-node logits (B, N, num_classes). ``encoding``: ``"tree"`` (the tree
    encoding: scores depend on the path between nodes), ``"sequence"`` (the
    nodes' order in the input, e.g. breadth-first, as a sequence) or ``"none"``.
    """

    def __init__(self, vocab: int, num_classes: int, dim: int = 32, depth: int = 2, heads: int = 2,
                 encoding: str = "tree", kappa: int = 2, max_depth: int = 6, init: str = "random"):
        super().__init__()
        if encoding not in ("tree", "sequence", "none"):
            raise ValueError(f"TreeTransformer: encoding must be tree, sequence or none, got {encoding!r}")
        self.encoding = encoding
        self.embed = nn.Embedding(vocab, dim)
        head_dim = dim // heads
        self.encoder = None
        if encoding != "none":
            kind = "tree" if encoding == "tree" else "sequence"
            self.encoder = AlgebraicEncoder(head_dim, heads, kind=kind, kappa=kappa, max_depth=max_depth, init=init)
        self.layers = nn.ModuleList(AlgebraicSelfAttention(dim, heads) for _ in range(depth))
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(depth))
        self.ffns = nn.ModuleList(nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
                                  for _ in range(depth))
        self.norms2 = nn.ModuleList(nn.LayerNorm(dim) for _ in range(depth))
        self.out = nn.Linear(dim, num_classes)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        B, N = tokens.shape
        h = self.embed(tokens)
        if self.encoder is None:
            eye = torch.eye(h.shape[-1] // self.layers[0].heads, device=h.device, dtype=h.dtype)
            rel = (eye.expand(1, self.layers[0].heads, 1, *eye.shape), torch.zeros(N, 1, dtype=torch.long,
                                                                                   device=h.device))
        elif self.encoding == "tree":
            rel = self.encoder.tree_maps(positions)
        else:
            rel = self.encoder.grid_maps([N])
        for attn, n1, ffn, n2 in zip(self.layers, self.norms, self.ffns, self.norms2):
            h = h + attn(n1(h), [N], rel=rel)
            h = h + ffn(n2(h))
        return self.out(h)
