"""The learned Gaussian differentiable span of the thesis, kept positive."""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..grid import span_half_widths, span_keep_fraction
from ..ops import SPAN_MODES

__all__ = ["DifferentiableSpan", "SPAN_MODES", "SPAN_UNITS"]

SPAN_UNITS = ("normalised", "cells")


def _inverse_softplus(y: float) -> float:
    return y + math.log(-math.expm1(-y))


class DifferentiableSpan(nn.Module):
    """Gaussian span ``G = exp(-0.5 sum_d (x_d / sigma_d)^2)`` over normalised
    offsets ``x_d = delta_d / (n_d - 1)``, one sigma per grid axis, shared by the
    heads or one row per head.

    ``sigma = min_sigma + softplus(raw)`` stays positive and finite for every
    raw value, so training cannot reach sigma = 0 (the thesis' NaN); the span
    then only narrows to a box of half width ~0.

    Args:
        ndim: grid rank G.
        heads: number of attention heads (rows of :meth:`sigma`).
        per_head: one sigma row per head (else one row shared by all heads).
        init: initial sigma (thesis: 0.3), > min_sigma.
        learnable: learn sigma (else it is a fixed buffer).
        mode: ``"add"`` (logits -= quad: a Gaussian prior on the weights) or
            ``"multiply"`` (logits *= G, the thesis' form).
        threshold: t in [0, 1): keep only keys in the box where G >= t (per axis);
            0 keeps every key.
        min_sigma: lower bound of sigma.
        units: ``"normalised"`` (sigma in units of the grid's extent, the thesis'
            and the operator's: the same sigma is wider in cells on a larger grid)
            or ``"cells"`` (sigma in grid cells, the same width on every grid).
    """

    def __init__(
        self,
        ndim: int,
        heads: int = 1,
        per_head: bool = False,
        init: float = 0.3,
        learnable: bool = True,
        mode: str = "add",
        threshold: float = 0.0,
        min_sigma: float = 1e-3,
        units: str = "normalised",
    ):
        super().__init__()
        if ndim < 1 or heads < 1:
            raise ValueError(f"DifferentiableSpan: ndim and heads must be >= 1, got {ndim}, {heads}")
        if not min_sigma > 0:
            raise ValueError(f"DifferentiableSpan: min_sigma must be > 0, got {min_sigma}")
        if not (math.isfinite(init) and init > min_sigma):
            raise ValueError(
                f"DifferentiableSpan: init (sigma) must be a finite number > min_sigma = {min_sigma}, got {init}"
            )
        if mode not in SPAN_MODES:
            raise ValueError(f"DifferentiableSpan: mode must be one of {SPAN_MODES}, got {mode!r}")
        if units not in SPAN_UNITS:
            raise ValueError(f"DifferentiableSpan: units must be one of {SPAN_UNITS}, got {units!r}")
        if not (0.0 <= threshold < 1.0):
            raise ValueError(f"DifferentiableSpan: threshold must be in [0, 1), got {threshold}")
        self.ndim, self.heads, self.per_head = ndim, heads, per_head
        self.mode, self.threshold, self.min_sigma, self.units = mode, float(threshold), float(min_sigma), units
        raw = torch.full((heads if per_head else 1, ndim), _inverse_softplus(init - min_sigma))
        if learnable:
            self.raw_sigma = nn.Parameter(raw)
        else:
            self.register_buffer("raw_sigma", raw)

    @property
    def learnable(self) -> bool:
        return isinstance(self.raw_sigma, nn.Parameter)

    def sigma(self, grid: Optional[Sequence[int]] = None) -> torch.Tensor:
        """(H, G) current sigma, differentiable (rows repeat when shared).

        Without ``grid``: in the module's own units. With ``grid``: in the
        operator's normalised units for that grid (what ``relpos_attention``
        takes); for ``units="cells"`` that divides by ``max(n_d - 1, 1)``.
        """
        s = (self.min_sigma + F.softplus(self.raw_sigma)).expand(self.heads, self.ndim)
        if grid is None or self.units == "normalised":
            return s
        grid = [int(n) for n in grid]
        if len(grid) != self.ndim:
            raise ValueError(f"DifferentiableSpan was built for {self.ndim}-D grids, got grid {grid}")
        extent = torch.tensor([max(n - 1, 1) for n in grid], dtype=s.dtype, device=s.device)
        return s / extent

    def half_widths(self, grid: Sequence[int]) -> list[list[int]]:
        """(H, G) half widths of the kept box per head and axis (the full grid
        without a threshold). Reads sigma on the host: for logging, not forward."""
        grid = [int(n) for n in grid]
        if self.threshold > 0:
            return span_half_widths(self.sigma(grid), self.threshold, grid)
        return [[n - 1 for n in grid] for _ in range(self.heads)]

    def box_sizes(self, grid: Sequence[int]) -> list[list[int]]:
        """(H, G) side lengths of the kept box, ``min(2 half + 1, ...)`` cells."""
        grid = [int(n) for n in grid]
        return [[min(2 * h + 1, 2 * n - 1) for h, n in zip(row, grid)] for row in self.half_widths(grid)]

    def stats(self, grid: Sequence[int]) -> dict:
        """Loggable summary: sigma (in the module's units) and box sizes per head
        and axis, and the mean fraction of keys a query keeps."""
        halves = self.half_widths(grid)
        keep = sum(span_keep_fraction(grid, row) for row in halves) / len(halves)
        return {
            "sigma": self.sigma().detach().cpu().tolist(),
            "box": self.box_sizes(grid),
            "keep_fraction": keep,
        }

    def extra_repr(self) -> str:
        return (
            f"ndim={self.ndim}, heads={self.heads}, per_head={self.per_head}, mode={self.mode!r}, "
            f"threshold={self.threshold}, learnable={self.learnable}, units={self.units!r}"
        )
