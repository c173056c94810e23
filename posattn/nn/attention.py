"""Positional self-attention on the fused ``relpos_attention`` operator."""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops, reference
from ..grid import WINDOW_BORDERS, normalise_grid
from ..packed import PackedGrids
from .bias import RelativePositionBias
from .relative import RelativeEncoder
from .span import DifferentiableSpan

__all__ = [
    "MultiHeadSelfAttention",
    "PositionalSelfAttention",
    "SDPAttention",
    "BACKENDS",
    "split_heads",
    "merge_heads",
    "class_token_attention",
]

BACKENDS = ("auto", "fused", "reference")


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, N, H * D) -> (B, H, N, D)."""
    B, N, C = x.shape
    return x.view(B, N, heads, C // heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, N, D) -> (B, N, H * D)."""
    B, H, N, D = x.shape
    return x.transpose(1, 2).reshape(B, N, H * D)


def class_token_attention(q_cls: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Content-only attention of the class token's query (B, H, 1, D) over every
    token's key and value (B, H, T, D) -> (B, H, 1, D). The class token has no
    position: it reads the grid, and grid tokens do not read it."""
    return F.scaled_dot_product_attention(q_cls, k, v)


def check_tokens(module: nn.Module, x: torch.Tensor, grid: Sequence[int], has_cls: bool, dim: int) -> list[int]:
    """Checks x (B, T, dim) against the grid (T = prod(grid) + has_cls); returns the grid as a list."""
    if x.dim() != 3 or x.shape[-1] != dim:
        raise ValueError(f"{type(module).__name__}: x must have shape (B, T, {dim}), got {tuple(x.shape)}")
    return normalise_grid(grid, x.shape[1] - int(has_cls))


def check_packed_tokens(module: nn.Module, x: torch.Tensor, packed: PackedGrids, has_cls: bool, dim: int) -> None:
    """Checks x (1, T, dim) against a packing (T >= its tokens; no class token: pool per sample)."""
    name = type(module).__name__
    if x.dim() != 3 or x.shape[0] != 1 or x.shape[-1] != dim:
        raise ValueError(f"{name}: with packed grids x must have shape (1, T, {dim}), got {tuple(x.shape)}")
    if x.shape[1] < packed.num_tokens:
        raise ValueError(f"{name}: the packed grids hold {packed.num_tokens} tokens but x has only T = {x.shape[1]}")
    if has_cls:
        raise ValueError(f"{name}: a class token is not supported with packed grids (pool each sample instead)")


class MultiHeadSelfAttention(nn.Module):
    """What every self-attention module of posattn.nn shares: ``dim`` split over
    ``heads`` (D = dim / H per head), the qkv and output projections, and the call
    ``forward(x, grid, has_cls=False, shared=None)`` with x (B, T, dim),
    T = prod(grid) (+1 with a class token at index 0). ``shared`` is what an
    encoder shared by all layers computed once per forward (a relative table, or
    algebraic maps); None for attentions that take none. Subclasses define forward.
    """

    min_heads = 1

    def __init__(self, dim: int, heads: int, qkv_bias: bool = True):
        super().__init__()
        if heads < self.min_heads or dim < 1 or dim % heads:
            at_least = f" with heads >= {self.min_heads}" if self.min_heads > 1 else ""
            raise ValueError(
                f"{type(self).__name__}: dim ({dim}) must be a positive multiple of heads ({heads}){at_least}"
            )
        self.dim, self.heads, self.head_dim = dim, heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def heads_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, dim) -> q, k, v, each (B, H, T, D)."""
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return split_heads(q, self.heads), split_heads(k, self.heads), split_heads(v, self.heads)

    def output(self, out: torch.Tensor) -> torch.Tensor:
        """(B, H, T, D) attention output -> (B, T, dim) after the output projection."""
        return self.proj(merge_heads(out))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.heads}"


class PositionalSelfAttention(MultiHeadSelfAttention):
    """Multi-head self-attention with Transformer-XL relative terms, a learned
    position bias, a span and a window, computed by ``relpos_attention``::

        logit_ij = scale * ((q_i + u) . k_j + (q_i + v) . r[pos_j - pos_i]) + b[pos_j - pos_i]
        (then the span: add ``-quad`` or multiply by ``G``; threshold box; window)

    Args:
        dim: model dimension; heads must divide it.
        heads: number of heads H.
        encoder: relative encoder giving r (H, U, dim/H) for the grid; None for no
            relative term (unless ``relative=True`` and a table is passed to forward).
        span: optional :class:`DifferentiableSpan` (its ``heads`` must equal ``heads``).
        relative: whether the positional term is used (default: ``encoder is not None``);
            with ``relative=True`` and no encoder, forward needs ``shared=`` (the table).
        causal: attend only to tokens j <= i.
        position_bias: optional :class:`RelativePositionBias` (its ``heads`` must
            equal ``heads``): the scalar ``b`` per head and offset (Swin / T5).
        window: optional fixed window: half widths per grid axis (an int for
            every axis), as the operator's ``window``.
        window_border: ``"clip"`` or ``"shift"`` (NATTEN's border rule).
        backend: ``"fused"`` (the operator), ``"reference"`` (dense, for checks) or
            ``"auto"`` (the operator where it has a kernel for the device and
            dtype, else the reference).

    ``forward(x, grid, has_cls=False, shared=None)``: x (B, T, dim), T = prod(grid)
    (+1 with a class token at index 0, which attends content-only to all tokens);
    ``shared``: the (H, U, D) table of an encoder shared by the layers. ``grid`` may
    be a :class:`posattn.PackedGrids` instead: x is then (1, T, dim), the samples'
    tokens one after another (tail padding after them), each attending within
    itself (``relpos_attention(..., packed=)``); the encoder, bias and ``shared``
    table are those of ``grid.max_grid``. No class token then, and a span in
    ``units="normalised"`` only (the operator normalises by each sample's grid).
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        encoder: Optional[RelativeEncoder] = None,
        span: Optional[DifferentiableSpan] = None,
        relative: Optional[bool] = None,
        causal: bool = False,
        backend: str = "auto",
        qkv_bias: bool = True,
        position_bias: Optional[RelativePositionBias] = None,
        window: Optional[Union[int, Sequence[int]]] = None,
        window_border: str = "clip",
    ):
        super().__init__(dim, heads, qkv_bias)
        if backend not in BACKENDS:
            raise ValueError(f"PositionalSelfAttention: backend must be one of {BACKENDS}, got {backend!r}")
        if encoder is not None and (encoder.dim != dim or encoder.heads != heads):
            raise ValueError(
                f"PositionalSelfAttention: the encoder gives dim {encoder.dim} over {encoder.heads} heads, "
                f"the attention has dim {dim} over {heads} heads"
            )
        if span is not None and span.heads != heads:
            raise ValueError(f"PositionalSelfAttention: span has {span.heads} heads, attention has {heads}")
        if position_bias is not None and position_bias.heads != heads:
            raise ValueError(
                f"PositionalSelfAttention: position_bias has {position_bias.heads} heads, attention has {heads}"
            )
        if window_border not in WINDOW_BORDERS:
            raise ValueError(
                f"PositionalSelfAttention: window_border must be one of {WINDOW_BORDERS}, got {window_border!r}"
            )
        self.position_bias = position_bias
        self.window = list(window) if isinstance(window, (list, tuple)) else window
        self.window_border = window_border
        self.relative = encoder is not None if relative is None else bool(relative)
        if encoder is not None and not self.relative:
            raise ValueError("PositionalSelfAttention: an encoder was given with relative=False")
        self.causal, self.backend = causal, backend
        self.encoder, self.span = encoder, span
        self.u_bias = nn.Parameter(torch.randn(heads, self.head_dim) * 0.02)
        self.v_bias = nn.Parameter(torch.randn(heads, self.head_dim) * 0.02) if self.relative else None

    def _inputs(self, x, grid, has_cls, rel):
        """Projects x and gathers the operator's arguments for the grid tokens."""
        packed = grid if isinstance(grid, PackedGrids) else None
        if packed is not None:
            check_packed_tokens(self, x, packed, has_cls, self.dim)
            if self.span is not None and self.span.units != "normalised":
                raise ValueError(
                    "PositionalSelfAttention: a span in units='cells' is not supported with packed grids "
                    "(the operator normalises each sample's offsets by its own grid)"
                )
            grid = list(packed.max_grid)  # the tables' grid
        else:
            grid = check_tokens(self, x, grid, has_cls, self.dim)
        q, k, v = self.heads_qkv(x)
        q_content = q + self.u_bias[:, None, :]
        start = int(has_cls)
        args = dict(q=q_content[:, :, start:], k=k[:, :, start:], v=v[:, :, start:], grid=grid, causal=self.causal)
        if packed is not None:
            args.update(grid=None, packed=packed)
        if self.relative:
            if rel is None:
                if self.encoder is None:
                    raise ValueError(
                        "PositionalSelfAttention(relative=True) without an encoder needs shared= "
                        "(the (H, U, D) table) in forward"
                    )
                rel = self.encoder(grid)
            args["q_pos"] = q[:, :, start:] + self.v_bias[:, None, :]
            args["rel"] = rel.to(q.dtype)
        if self.span is not None:
            # float32 with half inputs: d sigma sums terms in 1 / sigma^3 over every pair and overflows float16
            sigma_dtype = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
            args.update(
                sigma=self.span.sigma(grid).to(sigma_dtype), threshold=self.span.threshold, span_mode=self.span.mode
            )
        if self.position_bias is not None:
            args["bias"] = self.position_bias(grid).to(q.dtype)
        if self.window is not None:
            args.update(window=self.window, window_border=self.window_border)
        return args, (q_content, k, v)

    def _use_fused(self, x: torch.Tensor) -> bool:
        if self.backend != "auto":
            return self.backend == "fused"
        return ops.has_kernel("relpos_attention", x)

    def forward(
        self,
        x: torch.Tensor,
        grid: Union[Sequence[int], PackedGrids],
        has_cls: bool = False,
        shared: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """x (B, T, dim), T = prod(grid) (+1 with a class token) -> (B, T, dim). ``grid`` may be a :class:`posattn.PackedGrids` (x then (1, T, dim)); ``shared``: an (H, U, D) table an encoder shared by the layers computed."""
        args, (q, k, v) = self._inputs(x, grid, has_cls, shared)
        fused = self._use_fused(x)
        attend = ops.relpos_attention if fused else reference.relpos_attention
        out = attend(**args)  # (B, H, N, D)
        if has_cls:
            out = torch.cat([class_token_attention(q[:, :, :1], k, v), out], dim=2)
        return self.output(out)

    def logits(
        self, x: torch.Tensor, grid: Sequence[int], has_cls: bool = False, shared: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """Dense (B, H, N, N) logits among the grid tokens (after the span, -inf
        where masked), for inspection and plots. Builds N x N tensors. One grid
        (not packed grids)."""
        if isinstance(grid, PackedGrids):
            raise ValueError("PositionalSelfAttention.logits: one grid only, not packed grids")
        args, _ = self._inputs(x, grid, has_cls, shared)
        args.pop("v")
        return reference.relpos_scores(**args)

    def extra_repr(self) -> str:
        window = f", window={self.window}, window_border={self.window_border!r}" if self.window is not None else ""
        return (
            f"dim={self.dim}, heads={self.heads}, relative={self.relative}, causal={self.causal}, "
            f"backend={self.backend!r}{window}"
        )


class SDPAttention(MultiHeadSelfAttention):
    """Plain multi-head self-attention on ``scaled_dot_product_attention``:
    content only (positions, if any, come from an absolute encoding added to
    the tokens). The baseline of the scaling study.

    ``forward(x, grid, has_cls=False, shared=None)``: x (B, T, dim); a class token
    is just another token here. ``shared`` must be None.
    """

    def __init__(self, dim: int, heads: int, causal: bool = False):
        super().__init__(dim, heads)
        self.causal = causal

    def forward(self, x: torch.Tensor, grid: Sequence[int], has_cls: bool = False, shared=None) -> torch.Tensor:
        """x (B, T, dim), T = prod(grid) (+1 with a class token) -> (B, T, dim). Content only (positions come from an absolute encoding, or none)."""
        if isinstance(grid, PackedGrids):  # content-only attention across the whole sequence would mix samples
            raise ValueError("SDPAttention: packed grids are not supported (use PositionalSelfAttention)")
        check_tokens(self, x, grid, has_cls, self.dim)
        if shared is not None:
            raise ValueError("SDPAttention has no positional term: shared must be None")
        q, k, v = self.heads_qkv(x)
        return self.output(F.scaled_dot_product_attention(q, k, v, is_causal=self.causal))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.heads}, causal={self.causal}"
