"""Relative positional encoders: the (H, U, D) tables of ``relpos_attention``.

A relative encoder maps every offset ``delta = pos(j) - pos(i)`` of a grid to a
``dim``-vector, split over the heads (the thesis does not share one table
across heads). Row u of the table is the offset ``relative_offsets(grid)[u]``,
the row order the operators use, so ``table[h, u]`` is ``r[delta]`` of head h.

Tables are computed in every forward from the grid in use, on the device and
in the dtype of the encoder's parameters: nothing is cached, so nothing goes
stale after ``.to()`` and checkpoints hold parameters only.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from ..grid import num_offsets, relative_offsets

__all__ = [
    "RelativeEncoder",
    "SirenRelativeEncoder",
    "SinusoidalRelativeEncoder",
    "LookupRelativeEncoder",
    "normalised_offsets",
    "sinusoid_features",
]


def normalised_offsets(offsets: torch.Tensor, grid: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """(U, G) offsets scaled to [-1, 1] per axis: ``delta_d / max(n_d - 1, 1)``
    (the normalisation the span uses as well)."""
    denom = torch.tensor([max(n - 1, 1) for n in grid], dtype=dtype, device=offsets.device)
    return offsets.to(dtype) / denom


def sinusoid_features(values: torch.Tensor, num_features: int, base: float = 10000.0) -> torch.Tensor:
    """Fixed [sin, cos] features of ``values`` (...,) -> (..., num_features), with
    frequencies ``base ** (-2 i / num_features)`` (Vaswani et al.)."""
    half = num_features // 2
    freqs = base ** (-torch.arange(half, dtype=values.dtype, device=values.device) * 2.0 / num_features)
    angles = values[..., None] * freqs
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)


class RelativeEncoder(nn.Module):
    """Base class. Subclasses implement :meth:`embed` ((U, G) offsets -> (U, dim)).

    Args:
        dim: model dimension (heads * head_dim) of the produced embeddings.
        heads: number of heads the embeddings are split over.
        ndim: rank G of the grids this encoder accepts.
    """

    def __init__(self, dim: int, heads: int, ndim: int):
        super().__init__()
        if heads < 1 or dim < 1 or dim % heads != 0:
            raise ValueError(f"{type(self).__name__}: dim ({dim}) must be a positive multiple of heads ({heads})")
        if ndim < 1:
            raise ValueError(f"{type(self).__name__}: ndim must be >= 1, got {ndim}")
        self.dim, self.heads, self.ndim = dim, heads, ndim

    def embed(self, offsets: torch.Tensor, grid: Sequence[int]) -> torch.Tensor:  # pragma: no cover
        """Embeddings of the (U, G) offsets of ``grid`` (normalised or raw, per subclass): (U, dim)."""
        raise NotImplementedError

    def _anchor(self) -> torch.Tensor:
        return next(self.parameters())

    def forward(self, grid: Sequence[int]) -> torch.Tensor:
        """Returns the (H, U, dim // H) table for ``grid``, U = prod(2 n_d - 1)."""
        grid = [int(n) for n in grid]
        if len(grid) != self.ndim:
            raise ValueError(
                f"{type(self).__name__} was built for {self.ndim}-D grids but got grid {grid} "
                f"({len(grid)} axes); build it with ndim={len(grid)}"
            )
        anchor = self._anchor()
        offsets = relative_offsets(grid, device=anchor.device)
        table = self.embed(offsets, grid)  # (U, dim)
        u = num_offsets(grid)
        return table.reshape(u, self.heads, self.dim // self.heads).transpose(0, 1).contiguous()


class SirenRelativeEncoder(RelativeEncoder):
    """SIREN over normalised offsets (the thesis' encoder).

    ``hidden_layers`` sine layers ``sin(w0 * Linear(x))`` of width ``hidden_dim``,
    then a linear layer to ``dim``. Initialisation (Sitzmann et al.): first layer
    U(-1/n_in, 1/n_in), later sine layers U(-sqrt(6/n_in)/w0, +sqrt(6/n_in)/w0),
    the last layer kaiming-uniform for a linear output; all biases 0.
    Thesis defaults: hidden_dim 64, hidden_layers 2, w0 10.
    """

    def __init__(self, dim: int, heads: int, ndim: int, hidden_dim: int = 64, hidden_layers: int = 2, w0: float = 10.0):
        super().__init__(dim, heads, ndim)
        if hidden_layers < 1 or hidden_dim < 1:
            raise ValueError(
                f"SirenRelativeEncoder: hidden_layers and hidden_dim must be >= 1, got {hidden_layers}, {hidden_dim}"
            )
        if not w0 > 0:
            raise ValueError(f"SirenRelativeEncoder: w0 must be > 0, got {w0}")
        self.w0 = float(w0)
        widths = [ndim] + [hidden_dim] * hidden_layers
        self.sine_layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))
        self.out = nn.Linear(hidden_dim, dim)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """SIREN's initialisation (Sitzmann et al.): the first sine layer uniform in +-1 / fan_in, the
        others in +-sqrt(6 / fan_in) / w0, biases 0; the output layer Kaiming-uniform."""
        for i, layer in enumerate(self.sine_layers):
            n_in = layer.in_features
            bound = 1.0 / n_in if i == 0 else math.sqrt(6.0 / n_in) / self.w0
            layer.weight.uniform_(-bound, bound)
            layer.bias.zero_()
        nn.init.kaiming_uniform_(self.out.weight, nonlinearity="linear")
        self.out.bias.zero_()

    def embed(self, offsets, grid):
        """The SIREN of the offsets normalised to [-1, 1] by ``grid``: (U, dim)."""
        h = normalised_offsets(offsets, grid, self.out.weight.dtype)
        for layer in self.sine_layers:
            h = torch.sin(self.w0 * layer(h))
        return self.out(h)


class SinusoidalRelativeEncoder(RelativeEncoder):
    """Fixed sinusoidal features of the raw offsets + a learned linear map (the
    thesis baseline). n-D: ``num_features`` features per axis, concatenated."""

    def __init__(self, dim: int, heads: int, ndim: int, num_features: int = 64):
        super().__init__(dim, heads, ndim)
        if num_features < 2 or num_features % 2:
            raise ValueError(f"SinusoidalRelativeEncoder: num_features must be even and >= 2, got {num_features}")
        self.num_features = num_features
        self.out = nn.Linear(num_features * ndim, dim)

    def embed(self, offsets, grid):
        """Fixed sin / cos features of each axis' raw offset, then a linear layer: (U, dim)."""
        feats = sinusoid_features(offsets.to(self.out.weight.dtype), self.num_features)  # (U, G, F)
        return self.out(feats.flatten(1))


class LookupRelativeEncoder(RelativeEncoder):
    """A learned embedding per offset, each axis clipped to ``[-max_distance,
    max_distance]`` (so offsets farther apart share the edge row). The table has
    ``(2 max_distance + 1) ** ndim`` rows, initialised N(0, 0.02^2)."""

    def __init__(self, dim: int, heads: int, ndim: int, max_distance: int = 8):
        super().__init__(dim, heads, ndim)
        if max_distance < 0:
            raise ValueError(f"LookupRelativeEncoder: max_distance must be >= 0, got {max_distance}")
        self.max_distance = int(max_distance)
        self.table = nn.Parameter(torch.randn((2 * max_distance + 1) ** ndim, dim) * 0.02)

    def embed(self, offsets, grid):
        """The learned rows of the offsets, each axis clipped at +-``max_distance``: (U, dim)."""
        c = self.max_distance
        clipped = offsets.clamp(-c, c) + c  # (U, G) in 0 .. 2c
        row = torch.zeros(offsets.shape[0], dtype=torch.long, device=offsets.device)
        for d in range(self.ndim):
            row = row * (2 * c + 1) + clipped[:, d]
        return self.table[row]
