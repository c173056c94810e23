"""Positional self-attention on the fused ``relpos_attention`` operator."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops, reference
from .._grid import normalise_grid
from .relative import RelativeEncoder
from .span import DifferentiableSpan

__all__ = ["PositionalSelfAttention", "SDPAttention", "BACKENDS", "split_heads", "merge_heads", "class_token_attention"]

BACKENDS = ("auto", "fused", "reference")


# Device types with a relpos_attention kernel (fixed once the extension is loaded);
# "meta" has the fake kernel, for shape inference.
FUSED_DEVICE_TYPES = frozenset(
    device
    for device, key in (("cpu", "CPU"), ("cuda", "CUDA"), ("meta", "Meta"))
    if torch._C._dispatch_has_kernel_for_dispatch_key("posattn::relpos_attention", key)
)


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


class PositionalSelfAttention(nn.Module):
    """Multi-head self-attention with Transformer-XL relative terms and a span,
    computed by ``relpos_attention``::

        logit_ij = scale * ((q_i + u) . k_j + (q_i + v) . r[pos_j - pos_i])
        (then the span: add ``-quad`` or multiply by ``G``; threshold box)

    Args:
        dim: model dimension; heads must divide it.
        heads: number of heads H.
        encoder: relative encoder giving r (H, U, dim/H) for the grid; None for no
            relative term (unless ``relative=True`` and a table is passed to forward).
        span: optional :class:`DifferentiableSpan` (its ``heads`` must equal ``heads``).
        relative: whether the positional term is used (default: ``encoder is not None``);
            with ``relative=True`` and no encoder, forward needs ``rel=``.
        causal: attend only to tokens j <= i.
        backend: ``"fused"`` (the operator), ``"reference"`` (dense, for checks) or
            ``"auto"`` (the operator where it has a kernel for the device and
            dtype, else the reference).

    ``forward(x, grid, has_cls=False, rel=None)``: x (B, T, dim), T = prod(grid)
    (+1 with a class token at index 0, which attends content-only to all tokens).
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
    ):
        super().__init__()
        if heads < 1 or dim < 1 or dim % heads:
            raise ValueError(f"PositionalSelfAttention: dim ({dim}) must be a positive multiple of heads ({heads})")
        if backend not in BACKENDS:
            raise ValueError(f"PositionalSelfAttention: backend must be one of {BACKENDS}, got {backend!r}")
        if encoder is not None and (encoder.dim != dim or encoder.heads != heads):
            raise ValueError(
                f"PositionalSelfAttention: the encoder gives dim {encoder.dim} over {encoder.heads} heads, "
                f"the attention has dim {dim} over {heads} heads"
            )
        if span is not None and span.heads != heads:
            raise ValueError(f"PositionalSelfAttention: span has {span.heads} heads, attention has {heads}")
        self.dim, self.heads, self.head_dim = dim, heads, dim // heads
        self.relative = encoder is not None if relative is None else bool(relative)
        if encoder is not None and not self.relative:
            raise ValueError("PositionalSelfAttention: an encoder was given with relative=False")
        self.causal, self.backend = causal, backend
        self.encoder, self.span = encoder, span
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.u_bias = nn.Parameter(torch.randn(heads, self.head_dim) * 0.02)
        self.v_bias = nn.Parameter(torch.randn(heads, self.head_dim) * 0.02) if self.relative else None

    def _inputs(self, x, grid, has_cls, rel):
        """Projects x and gathers the operator's arguments for the grid tokens."""
        grid = check_tokens(self, x, grid, has_cls, self.dim)
        q, k, v = (split_heads(t, self.heads) for t in self.qkv(x).chunk(3, dim=-1))
        q_content = q + self.u_bias[:, None, :]
        start = int(has_cls)
        args = dict(q=q_content[:, :, start:], k=k[:, :, start:], v=v[:, :, start:], grid=grid, causal=self.causal)
        if self.relative:
            if rel is None:
                if self.encoder is None:
                    raise ValueError("PositionalSelfAttention(relative=True) without an encoder needs rel= in forward")
                rel = self.encoder(grid)
            args["q_pos"] = q[:, :, start:] + self.v_bias[:, None, :]
            args["rel"] = rel.to(q.dtype)
        if self.span is not None:
            args.update(sigma=self.span.sigma(grid).to(q.dtype), threshold=self.span.threshold, span_mode=self.span.mode)
        return args, (q_content, k, v)

    def _use_fused(self, x: torch.Tensor) -> bool:
        if self.backend != "auto":
            return self.backend == "fused"
        if x.device.type not in FUSED_DEVICE_TYPES:
            return False
        # the CUDA kernels also take float16 / bfloat16; the CPU kernels float32 / float64
        return x.device.type == "cuda" or x.dtype in (torch.float32, torch.float64)

    def forward(
        self, x: torch.Tensor, grid: Sequence[int], has_cls: bool = False, rel: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        args, (q, k, v) = self._inputs(x, grid, has_cls, rel)
        attend = ops.relpos_attention if self._use_fused(x) else reference.relpos_attention
        out = attend(**args)  # (B, H, N, D)
        if has_cls:
            out = torch.cat([class_token_attention(q[:, :, :1], k, v), out], dim=2)
        return self.proj(merge_heads(out))

    def logits(
        self, x: torch.Tensor, grid: Sequence[int], has_cls: bool = False, rel: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """Dense (B, H, N, N) logits among the grid tokens (after the span, -inf
        where masked), for inspection and plots. Builds N x N tensors."""
        args, _ = self._inputs(x, grid, has_cls, rel)
        args.pop("v")
        return reference.relpos_scores(**args)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.heads}, relative={self.relative}, causal={self.causal}, backend={self.backend!r}"


class SDPAttention(nn.Module):
    """Plain multi-head self-attention on ``scaled_dot_product_attention``:
    content only (positions, if any, come from an absolute encoding added to
    the tokens). The baseline of the scaling study and of the seed-004 depth
    experiments.

    ``forward(x, grid, has_cls=False, rel=None)``: x (B, T, dim); a class token
    is just another token here. ``rel`` must be None.
    """

    def __init__(self, dim: int, heads: int, causal: bool = False):
        super().__init__()
        if heads < 1 or dim < 1 or dim % heads:
            raise ValueError(f"SDPAttention: dim ({dim}) must be a positive multiple of heads ({heads})")
        self.dim, self.heads, self.causal = dim, heads, causal
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, grid: Sequence[int], has_cls: bool = False, rel=None) -> torch.Tensor:
        check_tokens(self, x, grid, has_cls, self.dim)
        if rel is not None:
            raise ValueError("SDPAttention has no relative term: rel must be None")
        q, k, v = (split_heads(t, self.heads) for t in self.qkv(x).chunk(3, dim=-1))
        return self.proj(merge_heads(F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.heads}, causal={self.causal}"
