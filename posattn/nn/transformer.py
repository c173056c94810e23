"""Transformer encoder block, the classifier for grid-shaped inputs, and a
small encoder over the nodes of trees."""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
from torch import nn

from ..packed import PackedGrids
from .algebraic import AlgebraicEncoder, AlgebraicSelfAttention
from .attention import PositionalSelfAttention, SDPAttention
from .bias import RelativePositionBias
from .config import ModelConfig
from .favor import ClippedRelativeAttention, ClippedWindowAttention, FavorAttention, RelativeFavorAttention
from .registry import build_absolute_encoding, build_algebraic_encoder, build_relative_encoder, encoding_kind
from .span import DifferentiableSpan

__all__ = ["EncoderBlock", "TransformerClassifier", "TreeTransformer", "build_attention"]


class EncoderBlock(nn.Module):
    """Self-attention + feed-forward with residuals and LayerNorm.

    ``norm="post"`` (the thesis, Vaswani): ``x = LN(x + attn(x)); x = LN(x + ffn(x))``;
    ``"pre"``: ``x = x + attn(LN(x)); x = x + ffn(LN(x))``; ``"none"``: no LayerNorm.
    ``residual=False`` drops the skip connections (for the depth study).
    ``forward(x, grid, has_cls=False, shared=None)``: x (B, T, dim); ``shared`` is
    passed on to the attention (see :class:`MultiHeadSelfAttention`).
    """

    def __init__(
        self,
        dim: int,
        attention: nn.Module,
        ffn_dim: int,
        dropout: float = 0.1,
        norm: str = "post",
        residual: bool = True,
        activation: str = "relu",
    ):
        super().__init__()
        self.attention, self.norm, self.residual = attention, norm, residual
        act = nn.ReLU() if activation == "relu" else nn.GELU()
        self.ffn = nn.Sequential(nn.Linear(dim, ffn_dim), act, nn.Dropout(dropout), nn.Linear(ffn_dim, dim))
        self.drop1, self.drop2 = nn.Dropout(dropout), nn.Dropout(dropout)
        use_norm = norm != "none"
        self.norm1 = nn.LayerNorm(dim) if use_norm else nn.Identity()
        self.norm2 = nn.LayerNorm(dim) if use_norm else nn.Identity()

    def _add(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y if self.residual else y

    def forward(self, x: torch.Tensor, grid: Sequence[int], has_cls: bool = False, shared=None) -> torch.Tensor:
        """x (B, T, dim) -> (B, T, dim): attention and feed-forward, each with its residual and norm."""
        if self.norm == "pre":
            x = self._add(x, self.drop1(self.attention(self.norm1(x), grid, has_cls, shared)))
            return self._add(x, self.drop2(self.ffn(self.norm2(x))))
        x = self.norm1(self._add(x, self.drop1(self.attention(x, grid, has_cls, shared))))
        return self.norm2(self._add(x, self.drop2(self.ffn(x))))


def build_attention(cfg: ModelConfig, relative_encoder: Optional[nn.Module], shared_table: bool) -> nn.Module:
    """One layer's attention module for ``cfg.attention``."""
    ndim, p = cfg.attention_grid_rank, cfg.performer
    if cfg.attention == "relpos":
        span = None
        if cfg.span.enabled:
            s = cfg.span
            span = DifferentiableSpan(
                ndim, cfg.heads, s.per_head, s.init, s.learnable, s.mode, s.threshold, s.min_sigma, s.units
            )
        bias = None
        if cfg.pe.bias != "none":
            pe = cfg.pe
            bias = RelativePositionBias(cfg.heads, ndim, pe.bias, pe.bias_max_distance, pe.bias_buckets, pe.bias_hidden)
        return PositionalSelfAttention(
            cfg.dim,
            cfg.heads,
            encoder=relative_encoder,
            span=span,
            relative=relative_encoder is not None or shared_table,
            causal=cfg.causal,
            backend=cfg.backend,
            position_bias=bias,
            window=None if cfg.window is None else (cfg.window - 1) // 2,
            window_border=cfg.window_border,
        )
    if cfg.attention == "sdpa":
        return SDPAttention(cfg.dim, cfg.heads, causal=cfg.causal)
    favor = dict(num_features=p.num_features, feature_redraw_interval=p.feature_redraw_interval, kernel=p.kernel)
    if cfg.attention == "favor":
        return FavorAttention(cfg.dim, cfg.heads, **favor)
    if cfg.attention == "relative_favor":
        # the paper's initial frequencies: timescales up to twice the longest axis
        longest = max(cfg.token_grid) if cfg.positions == "grid" else math.prod(cfg.token_grid)
        return RelativeFavorAttention(cfg.dim, cfg.heads, ndim, p.num_frequencies, base=2.0 * longest, **favor)
    clipped = ClippedRelativeAttention if p.clipped_form == "paper" else ClippedWindowAttention
    return clipped(cfg.dim, cfg.heads, ndim, p.clip, **favor)


def pool_packed(h: torch.Tensor, packed: PackedGrids, pooling: str) -> torch.Tensor:
    """(T, dim) tokens of packed samples -> (S, dim): each sample's mean, max or last token."""
    offsets = packed.samples()
    counts = torch.tensor([math.prod(shape) for _, shape in offsets], device=h.device)
    if pooling == "last":
        return h[counts.cumsum(0) - 1]
    ids = torch.repeat_interleave(torch.arange(len(offsets), device=h.device), counts)
    used = h[: packed.num_tokens]
    if pooling == "mean":
        return h.new_zeros(len(offsets), h.shape[1]).index_add(0, ids, used) / counts[:, None].to(h.dtype)
    if pooling == "max":
        index = ids[:, None].expand_as(used)
        return h.new_full((len(offsets), h.shape[1]), float("-inf")).scatter_reduce(
            0, index, used, "amax", include_self=False
        )
    raise ValueError(f"pool_packed: pooling must be 'mean', 'max' or 'last', got {pooling!r}")


class TransformerClassifier(nn.Module):
    """Transformer classifier for grid-shaped inputs (B, *grid, C).

    Pipeline (the thesis): [patches] -> Dropout -> Linear(C -> dim) -> [+ absolute encoding]
    -> [class token] -> ``depth`` encoder blocks -> pooling (last token, mean,
    max or class token) -> head (``mlp``: Linear -> LayerNorm -> ReLU -> Dropout ->
    Linear, the thesis'; ``linear``: one Linear).

    ``patch_size=p`` > 1 makes each token a p x ... x p patch (p^G C values) and
    the token grid the input grid divided by p (the thesis uses p = 1, a token
    per pixel). ``positions="grid"`` gives attention the n-D positions of the cells;
    ``"sequence"`` flattens the same data to a 1-D sequence (row-major).

    Build with a :class:`ModelConfig` or keyword arguments for one
    (``TransformerClassifier(grid=[8, 8], dim=32, pe={"name": "lookup"})``).
    """

    def __init__(self, config: Optional[ModelConfig] = None, **kwargs):
        super().__init__()
        if config is None:
            config = ModelConfig.from_dict(kwargs)
        elif kwargs:
            raise ValueError("TransformerClassifier: pass either a ModelConfig or keyword arguments, not both")
        else:
            config.validate()
        self.config = cfg = config
        token_channels = cfg.in_channels * cfg.patch_size ** len(cfg.grid)
        self.input = nn.Sequential(nn.Dropout(cfg.input_dropout), nn.Linear(token_channels, cfg.dim))

        kind = encoding_kind(cfg.pe.name)
        attn_grid = cfg.token_grid if cfg.positions == "grid" else [math.prod(cfg.token_grid)]
        self.absolute = build_absolute_encoding(cfg.pe, cfg.dim, attn_grid) if kind == "absolute" else None
        relative, algebraic = kind == "relative", kind == "algebraic"
        head_dim = cfg.dim // cfg.heads
        self.shared_encoder = None
        if relative and cfg.pe.shared:
            self.shared_encoder = build_relative_encoder(cfg.pe, cfg.dim, cfg.heads, len(attn_grid))
        elif algebraic and cfg.pe.algebraic_shared:
            self.shared_encoder = build_algebraic_encoder(cfg.pe, head_dim, cfg.heads, len(attn_grid))
        self.cls_token = nn.Parameter(torch.randn(1, 1, cfg.dim) * 0.02) if cfg.pooling == "cls" else None

        blocks = []
        for _ in range(cfg.depth):
            encoder = None
            if relative and not cfg.pe.shared:
                encoder = build_relative_encoder(cfg.pe, cfg.dim, cfg.heads, len(attn_grid))
            if algebraic:
                own = (
                    None
                    if cfg.pe.algebraic_shared
                    else build_algebraic_encoder(cfg.pe, head_dim, cfg.heads, len(attn_grid))
                )
                attention = AlgebraicSelfAttention(cfg.dim, cfg.heads, own, causal=cfg.causal)
            else:
                attention = build_attention(cfg, encoder, shared_table=self.shared_encoder is not None)
            blocks.append(
                EncoderBlock(cfg.dim, attention, cfg.ffn_dim, cfg.dropout, cfg.norm, cfg.residual, cfg.activation)
            )
        self.blocks = nn.ModuleList(blocks)
        self.final_norm = nn.LayerNorm(cfg.dim) if cfg.norm == "pre" else nn.Identity()
        if cfg.head == "mlp":
            self.head = nn.Sequential(
                nn.Linear(cfg.dim, cfg.dim),
                nn.LayerNorm(cfg.dim),
                nn.ReLU(),
                nn.Dropout(cfg.dropout),
                nn.Linear(cfg.dim, cfg.num_classes),
            )
        else:
            self.head = nn.Linear(cfg.dim, cfg.num_classes)

    def attention_grid(self, grid: Sequence[int]) -> list[int]:
        """The positions attention sees for a token grid: the grid, or [N]."""
        grid = [int(n) for n in grid]
        return grid if self.config.positions == "grid" else [math.prod(grid)]

    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        """(B, *grid, C) -> (B, *grid / p, p^G C): each token holds one patch."""
        p, G = self.config.patch_size, x.dim() - 2
        if p == 1:
            return x
        B, sizes, C = x.shape[0], list(x.shape[1:-1]), x.shape[-1]
        if any(n % p for n in sizes):
            raise ValueError(f"TransformerClassifier: patch_size {p} must divide every grid axis, got grid {sizes}")
        split = [B] + [s for n in sizes for s in (n // p, p)] + [C]
        x = x.reshape(split)
        order = [0] + [1 + 2 * d for d in range(G)] + [2 + 2 * d for d in range(G)] + [2 * G + 1]
        return x.permute(order).reshape(B, *[n // p for n in sizes], p**G * C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, *grid, C) -> logits (B, num_classes). The grid must have the
        configured rank; its sizes may differ (within a learned table's size)."""
        cfg = self.config
        if x.dim() != len(cfg.grid) + 2 or x.shape[-1] != cfg.in_channels:
            raise ValueError(
                f"TransformerClassifier: input must have shape (B, *grid, C) with {len(cfg.grid)} grid axes "
                f"and C = {cfg.in_channels}, got {tuple(x.shape)}"
            )
        x = self.patchify(x)
        B = x.shape[0]
        grid = self.attention_grid(x.shape[1:-1])
        h = self.input(x.reshape(B, -1, x.shape[-1]))
        if self.absolute is not None:
            h = self.absolute(h, grid)
        has_cls = self.cls_token is not None
        if has_cls:
            h = torch.cat([self.cls_token.expand(B, -1, -1).to(h.dtype), h], dim=1)
        shared = self.shared_encoder(grid) if self.shared_encoder is not None else None
        for block in self.blocks:
            h = block(h, grid, has_cls, shared)
        h = self.final_norm(h)
        if cfg.pooling == "cls":
            pooled = h[:, 0]
        elif cfg.pooling == "last":
            pooled = h[:, -1]
        elif cfg.pooling == "mean":
            pooled = h.mean(dim=1)
        else:
            pooled = h.amax(dim=1)
        return self.head(pooled)

    def forward_packed(self, tokens: torch.Tensor, packed: PackedGrids) -> torch.Tensor:
        """Images of different sizes packed into one sequence -> logits (S, num_classes).

        ``tokens`` (1, T, F) or (T, F): each sample's tokens (patches of p^G C values, as
        :func:`posattn.packed.patchify` or :mod:`posattn.training.varres` make them) row-major
        on its grid ``packed.shapes[s]``, one sample after another, tail padding after
        them; ``packed``: their :class:`posattn.PackedGrids` (G = the configured grid
        rank). Each sample attends within itself and is pooled on its own ("mean",
        "max" or "last" pooling). Needs relative attention (``attention="relpos"``,
        no absolute or algebraic encoding) and no class token."""
        cfg = self.config
        if cfg.attention != "relpos" or self.absolute is not None or encoding_kind(cfg.pe.name) == "algebraic":
            raise ValueError(
                "TransformerClassifier.forward_packed: packed grids need attention='relpos' with a relative or "
                f"no position encoding, got attention={cfg.attention!r}, pe={cfg.pe.name!r}"
            )
        if cfg.pooling == "cls":
            raise ValueError("TransformerClassifier.forward_packed: pooling 'cls' is not supported (use mean or max)")
        if not isinstance(packed, PackedGrids):
            raise TypeError(f"TransformerClassifier.forward_packed: packed must be a PackedGrids, got {type(packed)}")
        if packed.num_axes != len(cfg.grid):
            raise ValueError(
                f"TransformerClassifier.forward_packed: packed grids of {packed.num_axes} axes, the model's grid "
                f"has {len(cfg.grid)}"
            )
        if tokens.dim() == 2:
            tokens = tokens[None]
        features = cfg.in_channels * cfg.patch_size ** len(cfg.grid)
        if tokens.dim() != 3 or tokens.shape[0] != 1 or tokens.shape[-1] != features:
            raise ValueError(
                f"TransformerClassifier.forward_packed: tokens must have shape (1, T, {features}) (patches of "
                f"patch_size^G * in_channels values), got {tuple(tokens.shape)}"
            )
        grids = packed
        if cfg.positions == "sequence":  # each sample a 1-D sequence of its tokens
            flat = [[math.prod(shape)] for _, shape in packed.samples()]
            grids = PackedGrids.from_shapes(flat, max_grid=[math.prod(packed.max_grid)], device=packed.device)
        h = self.input(tokens)
        shared = self.shared_encoder(list(grids.max_grid)) if self.shared_encoder is not None else None
        for block in self.blocks:
            h = block(h, grids, False, shared)
        return self.head(pool_packed(self.final_norm(h)[0], packed, cfg.pooling))

    def spans(self) -> list[Optional[DifferentiableSpan]]:
        """Each layer's span module (None where a layer has none)."""
        return [getattr(b.attention, "span", None) for b in self.blocks]

    def span_penalty(self) -> Optional[torch.Tensor]:
        """``span.penalty`` times the mean sigma over the layers' spans (heads and
        axes), a scalar to add to the training loss; None without a penalty or
        without learnable spans."""
        weight = self.config.span.penalty
        sigmas = [s.sigma().mean() for s in self.spans() if s is not None and s.learnable]
        if not weight or not sigmas:
            return None
        return weight * torch.stack(sigmas).mean()

    def span_stats(self, grid: Optional[Sequence[int]] = None) -> dict:
        """Per-layer sigma, box sizes and kept-key fraction, flat keys for logging
        (``layer{i}/sigma``, ``layer{i}/box``, ``layer{i}/keep_fraction``), for
        the token ``grid`` (default: the configured input grid / patch_size)."""
        grid = self.attention_grid(grid if grid is not None else self.config.token_grid)
        stats = {}
        for i, span in enumerate(self.spans()):
            if span is not None:
                for key, value in span.stats(grid).items():
                    stats[f"layer{i}/{key}"] = value
        return stats

    def num_parameters(self, trainable_only: bool = True) -> int:
        """The number of parameters (only those that require grad with ``trainable_only``)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)


class TreeTransformer(nn.Module):
    """A small encoder over the nodes of trees, with algebraic positions: pre-LN
    :class:`EncoderBlock` layers (GELU feed-forward of width 2 dim, no dropout)
    around :class:`AlgebraicSelfAttention`.

    Input: tokens (B, N) int64 and heap positions (B, N) int64 (root 1, children
    ``kappa p + c``; padding nodes may use position 0). Output: per-node logits
    (B, N, num_classes). ``encoding``: ``"tree"`` (the tree encoding: scores depend
    on the path between nodes), ``"sequence"`` (the nodes' order in the input, e.g.
    breadth-first, as a sequence) or ``"none"``.
    """

    def __init__(
        self,
        vocab: int,
        num_classes: int,
        dim: int = 32,
        depth: int = 2,
        heads: int = 2,
        encoding: str = "tree",
        kappa: int = 2,
        max_depth: int = 6,
        init: str = "random",
    ):
        super().__init__()
        if encoding not in ("tree", "sequence", "none"):
            raise ValueError(f"TreeTransformer: encoding must be tree, sequence or none, got {encoding!r}")
        self.encoding, self.heads = encoding, heads
        self.embed = nn.Embedding(vocab, dim)
        self.encoder = None
        if encoding != "none":
            kind = "tree" if encoding == "tree" else "sequence"
            self.encoder = AlgebraicEncoder(dim // heads, heads, kind=kind, kappa=kappa, max_depth=max_depth, init=init)
        # every attention first, then the blocks: the order in which parameters are drawn
        attentions = [AlgebraicSelfAttention(dim, heads) for _ in range(depth)]
        self.blocks = nn.ModuleList(
            EncoderBlock(dim, a, 2 * dim, dropout=0.0, norm="pre", activation="gelu") for a in attentions
        )
        self.out = nn.Linear(dim, num_classes)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tokens (B, N) int64 and heap positions (B, N) -> per-node logits (B, N, classes)."""
        N = tokens.shape[1]
        h = self.embed(tokens)
        if self.encoder is None:  # identity maps: no positions
            eye = torch.eye(h.shape[-1] // self.heads, device=h.device, dtype=h.dtype)
            shared = (eye.expand(1, self.heads, 1, *eye.shape), torch.zeros(N, 1, dtype=torch.long, device=h.device))
        elif self.encoding == "tree":
            shared = self.encoder.tree_maps(positions)
        else:
            shared = self.encoder.grid_maps([N])
        for block in self.blocks:
            h = block(h, [N], shared=shared)
        return self.out(h)
