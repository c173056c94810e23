"""Learned relative position biases: the (H, U) ``bias`` of ``relpos_attention``.

A scalar per head and offset ``delta = pos(j) - pos(i)``, added to the logits
(Swin, CoAtNet, MaxViT, T5, NAT). Row u of the produced bias is the offset
``relative_offsets(grid)[u]``, the row order of the operators. Three forms:

- ``table`` (Shaw et al., Swin): a learned entry per offset, each axis clipped
  to ``[-max_distance, max_distance]`` (offsets farther apart share the edge
  entry); ``(2 max_distance + 1) ** G`` entries per head.
- ``t5`` (Raffel et al.): per axis, T5's bidirectional log buckets (exact up to
  half of the buckets of one sign, then logarithmic up to ``max_distance``);
  ``num_buckets ** G`` entries per head.
- ``cpb`` (SwinV2's continuous position bias): an MLP over log-spaced offsets,
  ``16 sigmoid(MLP(sign(x) log2(1 + 8 |x|) / 3))`` with ``x = delta / max_distance``
  per axis, so that a model trained at one grid size extrapolates to another.

The bias is computed in every forward from the grid in use (nothing cached).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import torch
from torch import nn

from .._grid import relative_offsets

__all__ = ["RelativePositionBias", "BIAS_KINDS", "t5_buckets"]

BIAS_KINDS = ("table", "t5", "cpb")


def t5_buckets(delta: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """T5's bidirectional relative-position bucket of each offset (any int64
    shape) -> bucket in ``[0, num_buckets)``: half of the buckets per sign, of which
    the first half are exact distances and the rest log-spaced up to
    ``max_distance`` (farther offsets share the last bucket)."""
    half = num_buckets // 2
    bucket = (delta > 0).long() * half
    dist = delta.abs()
    exact = max(half // 2, 1)
    log_ratio = math.log(max(max_distance, exact + 1) / exact)
    far = exact + (torch.log(dist.clamp(min=1).double() / exact) / log_ratio * (half - exact)).long()
    far = far.clamp(max=half - 1)
    return bucket + torch.where(dist < exact, dist, far)


class RelativePositionBias(nn.Module):
    """A learned bias per head and relative offset on G-dimensional grids.

    Args:
        heads: number of heads H.
        ndim: rank G of the grids it accepts.
        kind: ``"table"``, ``"t5"`` or ``"cpb"`` (see the module docstring).
        max_distance: per-axis clipping distance (``table``), the distance the
            last T5 bucket starts from (``t5``), or the offset that maps to
            ``x = 1`` (``cpb``); an int for every axis or one per axis. Default:
            8 (``table``), 128 (``t5``), and for ``cpb`` each axis' ``n - 1`` of
            the grid in use.
        num_buckets: T5 buckets per axis (``t5``; even, >= 2).
        hidden: width of the ``cpb`` MLP (SwinV2: 512).

    ``forward(grid)`` -> (H, U) with U = prod(2 n_d - 1), in the parameters' dtype
    and device.
    """

    def __init__(
        self,
        heads: int,
        ndim: int,
        kind: str = "table",
        max_distance: Optional[Union[int, Sequence[int]]] = None,
        num_buckets: int = 32,
        hidden: int = 512,
    ):
        super().__init__()
        if kind not in BIAS_KINDS:
            raise ValueError(f"RelativePositionBias: kind must be one of {BIAS_KINDS}, got {kind!r}")
        if heads < 1 or ndim < 1:
            raise ValueError(f"RelativePositionBias: heads and ndim must be >= 1, got {heads} and {ndim}")
        self.heads, self.ndim, self.kind = heads, ndim, kind
        default = {"table": 8, "t5": 128, "cpb": None}[kind]
        self.max_distance = self._per_axis(default if max_distance is None else max_distance)
        if kind == "table":
            self.sizes = [2 * c + 1 for c in self.max_distance]
            self.table = nn.Parameter(torch.randn(heads, math.prod(self.sizes)) * 0.02)
        elif kind == "t5":
            if num_buckets < 2 or num_buckets % 2:
                raise ValueError(f"RelativePositionBias: num_buckets must be even and >= 2, got {num_buckets}")
            self.num_buckets = int(num_buckets)
            self.table = nn.Parameter(torch.randn(heads, num_buckets**ndim) * 0.02)
        else:
            if hidden < 1:
                raise ValueError(f"RelativePositionBias: hidden must be >= 1, got {hidden}")
            self.mlp = nn.Sequential(
                nn.Linear(ndim, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, heads, bias=False)
            )

    def _per_axis(self, value) -> Optional[list[int]]:
        if value is None:
            return None
        values = [value] * self.ndim if isinstance(value, int) and not isinstance(value, bool) else list(value)
        if len(values) != self.ndim or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise ValueError(f"RelativePositionBias: max_distance must be an int or {self.ndim} ints, got {value!r}")
        if any(v < (1 if self.kind != "table" else 0) for v in values):
            raise ValueError(
                f"RelativePositionBias: max_distance must be >= {1 if self.kind != 'table' else 0}, got {value!r}"
            )
        return values

    def _param(self) -> torch.Tensor:
        return self.table if self.kind != "cpb" else self.mlp[0].weight

    def forward(self, grid: Sequence[int]) -> torch.Tensor:
        grid = [int(n) for n in grid]
        if len(grid) != self.ndim:
            raise ValueError(f"RelativePositionBias: built for {self.ndim}-D grids, got grid {grid}")
        ref = self._param()
        delta = relative_offsets(grid, device=ref.device)  # (U, G)
        if self.kind == "table":
            row = torch.zeros(delta.shape[0], dtype=torch.long, device=ref.device)
            for d, c in enumerate(self.max_distance):
                row = row * self.sizes[d] + delta[:, d].clamp(-c, c) + c
            return self.table[:, row]
        if self.kind == "t5":
            row = torch.zeros(delta.shape[0], dtype=torch.long, device=ref.device)
            for d in range(self.ndim):
                row = row * self.num_buckets + t5_buckets(delta[:, d], self.num_buckets, self.max_distance[d])
            return self.table[:, row]
        scale = self.max_distance or [max(n - 1, 1) for n in grid]
        x = delta.to(ref.dtype) / torch.tensor(scale, dtype=ref.dtype, device=ref.device) * 8.0
        x = torch.sign(x) * torch.log2(x.abs() + 1.0) / math.log2(8.0)
        return 16.0 * torch.sigmoid(self.mlp(x)).transpose(0, 1)  # (H, U)

    def extra_repr(self) -> str:
        extra = f", num_buckets={self.num_buckets}" if self.kind == "t5" else ""
        return f"heads={self.heads}, ndim={self.ndim}, kind={self.kind!r}, max_distance={self.max_distance}{extra}"
