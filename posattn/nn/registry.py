"""Positional encodings by name, for configs and the CLI.

Every name has a kind: ``relative`` (an encoder producing the (H, U, D) table
of ``relpos_attention``), ``absolute`` (added to the token embeddings),
``algebraic`` (orthogonal powers rotating queries and keys) or ``none``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from torch import nn

from .absolute import LearnableSinusoidEncoding, LearnedAbsoluteEncoding, SinusoidalAbsoluteEncoding
from .algebraic import AlgebraicEncoder
from .relative import LookupRelativeEncoder, SinusoidalRelativeEncoder, SirenRelativeEncoder

if TYPE_CHECKING:  # annotations only: config.py imports this module
    from .config import PositionalEncodingConfig

__all__ = [
    "RELATIVE_ENCODERS",
    "ABSOLUTE_ENCODINGS",
    "POSITIONAL_ENCODINGS",
    "encoding_kind",
    "build_relative_encoder",
    "build_absolute_encoding",
    "build_algebraic_encoder",
    "ALGEBRAIC_ENCODINGS",
]

# name -> builder(dim, heads, ndim, pe_config)
RELATIVE_ENCODERS: dict[str, Callable[..., nn.Module]] = {
    "siren": lambda dim, heads, ndim, pe: SirenRelativeEncoder(
        dim, heads, ndim, pe.hidden_dim, pe.hidden_layers, pe.w0
    ),
    "sinusoidal": lambda dim, heads, ndim, pe: SinusoidalRelativeEncoder(dim, heads, ndim, pe.num_features),
    "lookup": lambda dim, heads, ndim, pe: LookupRelativeEncoder(dim, heads, ndim, pe.max_distance),
}

# name -> builder(dim, grid, pe_config)
ABSOLUTE_ENCODINGS: dict[str, Callable[..., nn.Module]] = {
    "abs_sinusoidal": lambda dim, grid, pe: SinusoidalAbsoluteEncoding(dim, len(grid)),
    "abs_learned": lambda dim, grid, pe: LearnedAbsoluteEncoding(dim, grid),
    "abs_learnable_sinusoid": lambda dim, grid, pe: LearnableSinusoidEncoding(dim, len(grid), base=1000.0 * max(grid)),
}

# name -> builder(head_dim, heads, ndim, pe_config): orthogonal-power encodings (queries and keys rotated)
ALGEBRAIC_ENCODINGS: dict[str, Callable[..., nn.Module]] = {
    "algebraic_seq": lambda hd, heads, ndim, pe: AlgebraicEncoder(hd, heads, "sequence", init=pe.init),
    "algebraic_grid": lambda hd, heads, ndim, pe: AlgebraicEncoder(hd, heads, "grid", ndim=ndim, init=pe.init),
    "rope": lambda hd, heads, ndim, pe: AlgebraicEncoder(hd, heads, "grid", ndim=ndim, init="rope", learnable=False),
}

POSITIONAL_ENCODINGS = ("none",) + tuple(RELATIVE_ENCODERS) + tuple(ABSOLUTE_ENCODINGS) + tuple(ALGEBRAIC_ENCODINGS)
"""Every positional encoding by name (``ModelConfig.pe.name``, the CLI's ``positional_encoding``)."""


def encoding_kind(name: str) -> str:
    """``"relative"``, ``"absolute"``, ``"algebraic"`` or ``"none"``; ValueError listing the valid names."""
    if name == "none":
        return "none"
    if name in RELATIVE_ENCODERS:
        return "relative"
    if name in ABSOLUTE_ENCODINGS:
        return "absolute"
    if name in ALGEBRAIC_ENCODINGS:
        return "algebraic"
    raise ValueError(f"unknown positional encoding {name!r}; valid: {', '.join(POSITIONAL_ENCODINGS)}")


def build_relative_encoder(pe: PositionalEncodingConfig, dim: int, heads: int, ndim: int) -> nn.Module:
    """The relative encoder ``pe.name`` names, for ``dim`` channels over ``heads`` heads on ``ndim``-D grids."""
    if encoding_kind(pe.name) != "relative":
        raise ValueError(f"{pe.name!r} is not a relative encoder; relative encoders: {', '.join(RELATIVE_ENCODERS)}")
    return RELATIVE_ENCODERS[pe.name](dim, heads, ndim, pe)


def build_algebraic_encoder(pe: PositionalEncodingConfig, head_dim: int, heads: int, ndim: int) -> nn.Module:
    if encoding_kind(pe.name) != "algebraic":
        raise ValueError(f"{pe.name!r} is not an algebraic encoding; algebraic: {', '.join(ALGEBRAIC_ENCODINGS)}")
    return ALGEBRAIC_ENCODINGS[pe.name](head_dim, heads, ndim, pe)


def build_absolute_encoding(pe: PositionalEncodingConfig, dim: int, grid: Sequence[int]) -> nn.Module:
    """The absolute encoding ``pe.name`` names, for ``dim`` channels on ``grid`` (its largest grid)."""
    if encoding_kind(pe.name) != "absolute":
        raise ValueError(
            f"{pe.name!r} is not an absolute encoding; absolute encodings: {', '.join(ABSOLUTE_ENCODINGS)}"
        )
    return ABSOLUTE_ENCODINGS[pe.name](dim, list(grid), pe)
