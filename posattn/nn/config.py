"""Model configuration as plain dataclasses, buildable from nested dicts.

``ModelConfig.from_dict({"dim": 32, "pe": {"name": "lookup"}})`` fills the rest
with defaults (the thesis' model) and rejects unknown keys, naming close matches.
"""
from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any, Optional

from ..ops import SPAN_MODES
from .attention import BACKENDS
from .registry import POSITIONAL_ENCODINGS, encoding_kind
from .span import SPAN_UNITS

__all__ = [
    "PositionalEncodingConfig",
    "SpanConfig",
    "PerformerConfig",
    "ModelConfig",
    "ATTENTIONS",
    "CAUSAL_ATTENTIONS",
    "NORMS",
    "POOLINGS",
    "HEADS",
    "POSITIONS",
    "ACTIVATIONS",
]

ATTENTIONS = ("relpos", "favor", "relative_favor", "clipped_relative", "sdpa")
CAUSAL_ATTENTIONS = ("relpos", "sdpa")  # the attentions with a causal mask (j <= i in token order)
NORMS = ("post", "pre", "none")
POOLINGS = ("last", "mean", "max", "cls")
HEADS = ("mlp", "linear")
POSITIONS = ("grid", "sequence")
ACTIVATIONS = ("relu", "gelu")


def _choice(name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}{hint}")


@dataclass
class PositionalEncodingConfig:
    """Which positional encoding (``posattn.nn.POSITIONAL_ENCODINGS``) and its options.

    name: ``none``; relative ``siren``, ``sinusoidal``, ``lookup``; absolute
        ``abs_sinusoidal``, ``abs_learned``, ``abs_learnable_sinusoid``; algebraic
        ``algebraic_seq``, ``algebraic_grid``, ``rope``.
    hidden_dim, hidden_layers, w0: SIREN width, number of sine layers, frequency.
    num_features: sinusoidal features per axis (relative ``sinusoidal``).
    max_distance: clipping distance per axis (``lookup``).
    shared: one relative encoder for all layers (table computed once per
        forward) instead of one per layer (the thesis).
    init: algebraic generators start as RoPE (``rope``) or ``random``.
    algebraic_shared: one set of algebraic generators for all layers (the
        paper's default) instead of one per layer.
    """

    name: str = "siren"
    hidden_dim: int = 64
    hidden_layers: int = 2
    w0: float = 10.0
    num_features: int = 64
    max_distance: int = 8
    shared: bool = False
    init: str = "rope"
    algebraic_shared: bool = True


@dataclass
class SpanConfig:
    """Differentiable span (``relpos`` attention only); see :class:`DifferentiableSpan`."""

    enabled: bool = False
    init: float = 0.3
    learnable: bool = True
    per_head: bool = False
    mode: str = "add"
    threshold: float = 0.0
    min_sigma: float = 1e-3
    units: str = "normalised"


@dataclass
class PerformerConfig:
    """Options of the FAVOR+ attentions (``favor``, ``relative_favor``, ``clipped_relative``)."""

    num_features: Optional[int] = None
    feature_redraw_interval: int = 1000
    kernel: str = "favor"
    num_frequencies: int = 8
    clip: int = 4


@dataclass
class ModelConfig:
    """A :class:`TransformerClassifier`. Defaults: the thesis model (6 post-LN
    layers, dim 64, 8 heads, feed-forward 128, SIREN, last-token pooling)."""

    in_channels: int = 1
    num_classes: int = 10
    grid: list = field(default_factory=lambda: [28, 28])
    patch_size: int = 1
    dim: int = 64
    depth: int = 6
    heads: int = 8
    ffn_dim: int = 128
    dropout: float = 0.1
    input_dropout: float = 0.1
    norm: str = "post"
    residual: bool = True
    activation: str = "relu"
    pooling: str = "last"
    head: str = "mlp"
    positions: str = "grid"
    attention: str = "relpos"
    backend: str = "auto"
    causal: bool = False
    pe: PositionalEncodingConfig = field(default_factory=PositionalEncodingConfig)
    span: SpanConfig = field(default_factory=SpanConfig)
    performer: PerformerConfig = field(default_factory=PerformerConfig)

    @classmethod
    def from_dict(cls, values: Optional[dict] = None, **kwargs) -> "ModelConfig":
        """Builds a config from (nested) dicts; unknown keys raise ValueError."""
        merged = dict(values or {})
        merged.update(kwargs)
        cfg = _from_dict(cls, merged, "")
        cfg.validate()
        return cfg

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def token_grid(self) -> list:
        """The grid of tokens: the input grid divided by ``patch_size`` per axis."""
        return [int(n) // self.patch_size for n in self.grid]

    @property
    def attention_grid_rank(self) -> int:
        return len(self.grid) if self.positions == "grid" else 1

    def validate(self) -> None:
        """Raises ValueError naming the offending field and the valid choices."""
        for name in ("in_channels", "num_classes", "dim", "depth", "heads", "ffn_dim"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.grid or any(int(n) < 1 for n in self.grid):
            raise ValueError(f"grid must be a non-empty list of sizes >= 1, got {self.grid}")
        if int(self.patch_size) < 1 or any(int(n) % self.patch_size for n in self.grid):
            raise ValueError(f"patch_size ({self.patch_size}) must be >= 1 and divide every grid axis {self.grid}")
        if self.dim % self.heads:
            raise ValueError(f"dim ({self.dim}) must be divisible by heads ({self.heads})")
        for name in ("dropout", "input_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        _choice("norm", self.norm, NORMS)
        _choice("activation", self.activation, ACTIVATIONS)
        _choice("pooling", self.pooling, POOLINGS)
        _choice("head", self.head, HEADS)
        _choice("positions", self.positions, POSITIONS)
        _choice("attention", self.attention, ATTENTIONS)
        _choice("backend", self.backend, BACKENDS)
        _choice("pe.name", self.pe.name, POSITIONAL_ENCODINGS)
        _choice("span.mode", self.span.mode, SPAN_MODES)
        _choice("span.units", self.span.units, SPAN_UNITS)
        _choice("performer.kernel", self.performer.kernel, ("favor", "softmax"))
        kind = encoding_kind(self.pe.name)
        if kind == "relative" and self.attention != "relpos":
            raise ValueError(
                f"pe.name={self.pe.name!r} is a relative encoder, which needs attention='relpos' "
                f"(attention={self.attention!r} takes 'none' or an absolute encoding)"
            )
        _choice("pe.init", self.pe.init, ("rope", "random"))
        if kind == "algebraic":
            if self.attention != "relpos":
                raise ValueError(f"pe.name={self.pe.name!r} (algebraic) needs attention='relpos', got {self.attention!r}")
            if self.span.enabled:
                raise ValueError(f"span.enabled is not available with the algebraic encoding {self.pe.name!r}")
            blocks = self.attention_grid_rank if self.pe.name != "algebraic_seq" else 1
            head_dim = self.dim // self.heads
            if head_dim % blocks or (head_dim // blocks) % 2 and (self.pe.init == "rope" or self.pe.name == "rope"):
                raise ValueError(f"pe.name={self.pe.name!r}: the head dim ({head_dim}) must split into {blocks} "
                                 "even blocks (one per axis)")
        if self.span.enabled:
            if self.attention != "relpos":
                raise ValueError(f"span.enabled needs attention='relpos', got attention={self.attention!r}")
            if not self.span.init > self.span.min_sigma:
                raise ValueError(f"span.init (initial sigma) must be > span.min_sigma = {self.span.min_sigma}, got {self.span.init}")
            if not 0.0 <= self.span.threshold < 1.0:
                raise ValueError(f"span.threshold must be in [0, 1), got {self.span.threshold}")
        if self.causal:
            if self.attention not in CAUSAL_ATTENTIONS:
                raise ValueError(f"causal=True needs attention in {CAUSAL_ATTENTIONS}, got attention={self.attention!r} "
                                 "(the FAVOR+ attentions here are bidirectional)")
            if self.pooling == "cls":
                raise ValueError("causal=True does not go with pooling='cls' (the class token comes first, so it "
                                 "would see only itself); use pooling 'last', as the thesis does")
        if self.attention == "clipped_relative" and self.heads < 2:
            raise ValueError("attention='clipped_relative' needs heads >= 2 (half of them are relative)")


def _from_dict(cls, values: dict, prefix: str):
    if not isinstance(values, dict):
        raise ValueError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {values!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=3)
            hint = f"; did you mean {', '.join(prefix + c for c in close)}?" if close else ""
            raise ValueError(f"unknown model config key {prefix + key!r}{hint} (valid: {', '.join(fields)})")
        nested = fields[key].default_factory if fields[key].default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(nested) and isinstance(nested, type):
            value = value if dataclasses.is_dataclass(value) else _from_dict(nested, value, f"{prefix}{key}.")
        elif key == "grid":
            value = [int(n) for n in value]
        kwargs[key] = value
    return cls(**kwargs)
