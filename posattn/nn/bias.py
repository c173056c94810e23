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

from ..grid import relative_offsets

__all__ = ["RelativePositionBias", "BIAS_KINDS", "t5_buckets", "check_t5_buckets"]

BIAS_KINDS = ("table", "t5", "cpb")


def check_t5_buckets(
    num_buckets: int, max_distance: int, bidirectional: bool = True, where: str = "t5_buckets"
) -> None:
    """ValueError unless T5's bucket arithmetic is defined for the setting: at
    least one exact bucket (``num_buckets // 2`` per sign when bidirectional,
    ``// 2`` of that exact) and ``max_distance`` beyond the exact ones. Outside
    this, T5's own function takes the log of 0 / 0 or divides by log(1) = 0 and
    returns buckets outside ``[0, num_buckets)``."""
    if not isinstance(num_buckets, int) or isinstance(num_buckets, bool):
        raise ValueError(f"{where}: num_buckets must be an int, got {num_buckets!r}")
    if not isinstance(max_distance, int) or isinstance(max_distance, bool):
        raise ValueError(f"{where}: max_distance must be an int, got {max_distance!r}")
    per_sign = num_buckets // 2 if bidirectional else num_buckets
    exact = per_sign // 2
    if exact < 1:
        raise ValueError(
            f"{where}: num_buckets must be >= {4 if bidirectional else 2} "
            f"({'bidirectional' if bidirectional else 'unidirectional'} T5 buckets), got {num_buckets}"
        )
    if max_distance <= exact:
        raise ValueError(
            f"{where}: max_distance must be > {exact} (the exact buckets of num_buckets={num_buckets}"
            f"{', bidirectional' if bidirectional else ''}), got {max_distance}"
        )


def t5_buckets(delta: torch.Tensor, num_buckets: int, max_distance: int, bidirectional: bool = True) -> torch.Tensor:
    """T5's relative-position bucket of each offset ``delta`` (key - query, any
    integer shape) -> int64 bucket in ``[0, num_buckets)``, bit for bit what
    ``transformers``' ``T5Attention._relative_position_bucket`` gives (the same
    float32 arithmetic: a float64 log lands on the other side of an integer at
    some settings, e.g. ``num_buckets=18, max_distance=128`` at offsets +-16, 64).

    Bidirectional: half of the buckets per sign; unidirectional (T5's decoder):
    only offsets <= 0 count, positive ones share bucket 0. Of a sign's buckets the
    first half are exact distances, the rest log-spaced up to ``max_distance``
    (farther offsets share the last). ValueError where T5's arithmetic is not
    defined (:func:`check_t5_buckets`)."""
    check_t5_buckets(num_buckets, max_distance, bidirectional)
    delta = delta.long()
    buckets = torch.zeros_like(delta)
    n = num_buckets
    if bidirectional:
        n //= 2
        buckets = buckets + (delta > 0).to(torch.long) * n
        dist = torch.abs(delta)
    else:
        dist = -torch.min(delta, torch.zeros_like(delta))
    exact = n // 2
    # T5's expression, in T5's dtypes and order: float32 log, float64 python scalars
    large = exact + (torch.log(dist.float() / exact) / math.log(max_distance / exact) * (n - exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, n - 1))
    return buckets + torch.where(dist < exact, dist, large)


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
        num_buckets: T5 buckets per axis (``t5``; even, >= 4, and each axis'
            ``max_distance`` > ``num_buckets // 4``: where T5's buckets are defined).
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
            for m in self.max_distance:
                check_t5_buckets(self.num_buckets, m, where="RelativePositionBias")
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
        """The (H, U) bias of every offset of ``grid`` (U = prod(2 n_d - 1)), the ``bias`` of :func:`posattn.ops.relpos_attention`."""
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
