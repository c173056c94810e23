"""Absolute positional encodings, added to the token embeddings.

Each module's :meth:`encode` returns the (N, dim) encoding of the cells of a
grid in row-major order; ``forward(x, grid)`` returns ``x + encode(grid)`` for
x of shape (B, N, dim). Encodings are computed per forward on the device and
in the dtype of ``x``.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..grid import grid_coords
from .relative import sinusoid_features

__all__ = [
    "AbsoluteEncoding",
    "SinusoidalAbsoluteEncoding",
    "LearnedAbsoluteEncoding",
    "LearnableSinusoidEncoding",
]


def _check_rank(module: nn.Module, grid: Sequence[int], ndim: int) -> list[int]:
    grid = [int(n) for n in grid]
    if len(grid) != ndim:
        raise ValueError(f"{type(module).__name__} was built for {ndim}-D grids but got grid {grid} ({len(grid)} axes)")
    return grid


class AbsoluteEncoding(nn.Module):
    """Base class: subclasses implement ``encode(grid, device, dtype) -> (N, dim)``."""

    def __init__(self, dim: int, ndim: int):
        super().__init__()
        if dim < 1 or ndim < 1:
            raise ValueError(f"{type(self).__name__}: dim and ndim must be >= 1, got {dim}, {ndim}")
        self.dim, self.ndim = dim, ndim

    def encode(self, grid: Sequence[int], device=None, dtype=torch.float32) -> torch.Tensor:  # pragma: no cover
        """The (N, dim) encoding of the cells of ``grid`` in row-major order, on ``device`` in ``dtype``."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor, grid: Sequence[int]) -> torch.Tensor:
        """x: (B, N, dim) with N = prod(grid) -> x + encoding."""
        if x.shape[-1] != self.dim:
            raise ValueError(f"{type(self).__name__}: x must have last dim {self.dim}, got shape {tuple(x.shape)}")
        return x + self.encode(grid, device=x.device, dtype=x.dtype)


def _check_even_split(module: nn.Module, dim: int, ndim: int) -> None:
    if dim % (2 * ndim):
        raise ValueError(
            f"{type(module).__name__}: dim ({dim}) must be divisible by 2 * ndim ({2 * ndim}): "
            "every axis gets the same number of sin/cos features"
        )


class SinusoidalAbsoluteEncoding(AbsoluteEncoding):
    """Fixed sin/cos encoding (Vaswani et al.); n-D: ``dim / ndim`` features per
    axis of the integer coordinate, concatenated. No parameters."""

    def __init__(self, dim: int, ndim: int, base: float = 10000.0):
        super().__init__(dim, ndim)
        _check_even_split(self, dim, ndim)
        self.base = float(base)

    def encode(self, grid, device=None, dtype=torch.float32):
        """Fixed sin / cos features of each cell's coordinates: (N, dim)."""
        grid = _check_rank(self, grid, self.ndim)
        coords = grid_coords(grid, device=device).to(dtype)  # (N, G)
        return sinusoid_features(coords, self.dim // self.ndim, self.base).flatten(1)


class LearnedAbsoluteEncoding(AbsoluteEncoding):
    """A learned embedding per grid cell (an ``nn.Embedding`` per position), for grids up to ``max_grid``
    on every axis; a smaller grid uses the cells at its coordinates.
    Initialised N(0, 0.02^2)."""

    def __init__(self, dim: int, max_grid: Sequence[int]):
        max_grid = [int(n) for n in max_grid]
        super().__init__(dim, len(max_grid))
        if min(max_grid) < 1:
            raise ValueError(f"LearnedAbsoluteEncoding: max_grid axes must be >= 1, got {max_grid}")
        self.max_grid = max_grid
        self.table = nn.Parameter(torch.randn(*max_grid, dim) * 0.02)

    def encode(self, grid, device=None, dtype=torch.float32):
        """The learned table's rows of the cells of ``grid`` (at most ``max_grid``): (N, dim)."""
        grid = _check_rank(self, grid, self.ndim)
        if any(n > m for n, m in zip(grid, self.max_grid)):
            raise ValueError(f"LearnedAbsoluteEncoding: grid {grid} exceeds the table's grid {self.max_grid}")
        table = self.table[tuple(slice(0, n) for n in grid)].reshape(-1, self.dim)
        return table.to(device=device, dtype=dtype)


class LearnableSinusoidEncoding(AbsoluteEncoding):
    """sin/cos of the integer coordinate times learned inverse frequencies (the
    Performer paper's encoding). ``dim / (2 ndim)`` frequencies, shared by the
    axes, initialised to ``base ** (-2 i / (dim / ndim))`` (the Performer paper uses
    base = 1000 x the longest axis for its absolute encoding); per axis the
    features are [sin(p f), cos(p f)]."""

    def __init__(self, dim: int, ndim: int, base: float = 10000.0):
        super().__init__(dim, ndim)
        _check_even_split(self, dim, ndim)
        per_axis = dim // ndim
        self.inv_freq = nn.Parameter(base ** (-torch.arange(0, per_axis, 2, dtype=torch.float32) / per_axis))

    def angles(self, grid: Sequence[int], device=None, dtype=torch.float32) -> torch.Tensor:
        """(N, G, F) angles ``p_d * f`` of every cell, axis and frequency."""
        grid = _check_rank(self, grid, self.ndim)
        coords = grid_coords(grid, device=device).to(dtype)
        return coords[..., None] * self.inv_freq.to(device=device, dtype=dtype)

    def encode(self, grid, device=None, dtype=torch.float32):
        """Sin / cos of each cell's coordinates at the learned frequencies: (N, dim)."""
        a = self.angles(grid, device, dtype)
        return torch.cat([torch.sin(a), torch.cos(a)], dim=-1).flatten(1)
