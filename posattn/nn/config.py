"""Model configuration as plain dataclasses, buildable from nested dicts.

``ModelConfig.from_dict({"dim": 32, "pe": {"name": "lookup"}})`` fills the rest
with defaults (the thesis' model) and rejects unknown keys, naming close matches.
Values are never coerced: :meth:`ModelConfig.validate` checks every field against
its annotation (a bool must be a bool, an int an int, a float a finite number)
and its range, and names the field by its dotted path (``span.enabled``).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from ..grid import WINDOW_BORDERS
from ..ops import SPAN_MODES
from .attention import BACKENDS
from .bias import BIAS_KINDS, check_t5_buckets
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
CLIPPED_FORMS = ("paper", "window")
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


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


# annotation -> (test, description) of the values a field of that type takes
_KINDS = {
    bool: (lambda v: isinstance(v, bool), "a bool (true/false)"),
    int: (_is_int, "an int"),
    float: (lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v), "a finite number"),
    str: (lambda v: isinstance(v, str), "a string"),
}

# ranges, checked once the types are right (None, where a field is Optional, is always valid)
_AT_LEAST = {  # int fields -> smallest valid value
    "in_channels": 1,
    "num_classes": 1,
    "patch_size": 1,
    "dim": 1,
    "depth": 1,
    "heads": 1,
    "ffn_dim": 1,
    "pe.hidden_dim": 1,
    "pe.hidden_layers": 1,
    "pe.num_features": 2,
    "pe.max_distance": 0,
    "performer.num_features": 1,
    "performer.feature_redraw_interval": 0,
    "performer.num_frequencies": 1,
    "performer.clip": 1,
    "pe.bias_buckets": 2,
    "pe.bias_hidden": 1,
    "pe.bias_max_distance": 0,
    "window": 1,
}
_UNIT = ("dropout", "input_dropout", "span.threshold")  # floats in [0, 1)
_POSITIVE = ("pe.w0", "span.init", "span.min_sigma")  # floats > 0
_NON_NEGATIVE = ("span.penalty",)  # floats >= 0


def _bad(name: str, what: str, value: Any) -> ValueError:
    return ValueError(f"{name} must be {what}, got {value!r} ({type(value).__name__})")


def _check_fields(obj: Any, prefix: str = "") -> None:
    """Checks every field of dataclass ``obj`` against its annotation and range;
    ValueError naming the field by its dotted path."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        name, value, hint = prefix + f.name, getattr(obj, f.name), hints[f.name]
        if type(None) in typing.get_args(hint):  # Optional[X]
            if value is None:
                continue
            hint = typing.get_args(hint)[0]
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, hint):
                raise _bad(name, f"a {hint.__name__} (or a mapping, in ModelConfig.from_dict)", value)
            _check_fields(value, name + ".")
        elif typing.get_origin(hint) is list:
            test, _ = _KINDS[typing.get_args(hint)[0]]
            if not isinstance(value, (list, tuple)) or not value or not all(test(v) and v >= 1 for v in value):
                raise _bad(name, "a non-empty list of ints >= 1", value)
        else:
            test, what = _KINDS[hint]
            if not test(value):
                raise _bad(name, what, value)
            if name in _AT_LEAST and value < _AT_LEAST[name]:
                raise _bad(name, f"an int >= {_AT_LEAST[name]}", value)
            if name in _UNIT and not 0.0 <= value < 1.0:
                raise _bad(name, "in [0, 1)", value)
            if name in _POSITIVE and value <= 0:
                raise _bad(name, "a finite number > 0", value)
            if name in _NON_NEGATIVE and value < 0:
                raise _bad(name, "a finite number >= 0", value)


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
    bias: a learned relative position bias per layer and head (``relpos``
        attention; with any ``name``, or alone with ``name: none``): ``none``,
        ``table`` (Swin), ``t5`` (log buckets) or ``cpb`` (SwinV2's MLP); see
        :class:`RelativePositionBias`.
    bias_max_distance: its per-axis clipping distance (``table``), last-bucket
        distance (``t5``) or unit offset (``cpb``); None: the defaults (8, 128,
        the grid's ``n - 1``).
    bias_buckets, bias_hidden: T5 buckets per axis; width of the ``cpb`` MLP.
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
    bias: str = "none"
    bias_max_distance: Optional[int] = None
    bias_buckets: int = 32
    bias_hidden: int = 512


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
    # Weight of the mean sigma added to the training loss (the adaptive span of
    # Sukhbaatar et al., 2019): spans narrow unless the data pay for their width.
    penalty: float = 0.0


@dataclass
class PerformerConfig:
    """Options of the FAVOR+ attentions (``favor``, ``relative_favor``, ``clipped_relative``)."""

    num_features: Optional[int] = None
    feature_redraw_interval: int = 1000
    kernel: str = "favor"
    num_frequencies: int = 4  # strategy 1: frequencies per axis (the paper's pos_scales)
    clip: int = 4
    clipped_form: str = "paper"  # strategy 2: "paper" (Horn et al.'s code) | "window" (a local-window variant)


@dataclass
class ModelConfig:
    """A :class:`TransformerClassifier`. Defaults: the thesis model (6 post-LN
    layers, dim 64, 8 heads, feed-forward 128, SIREN, last-token pooling).

    ``window``: None, or an odd window size (``relpos`` attention): each token
    attends to the ``window`` x ... x ``window`` neighbourhood around it (the
    operator's ``window`` half widths ``(window - 1) / 2``), clipped at the grid's
    borders or, with ``window_border: shift``, shifted inside (NATTEN's rule).
    """

    in_channels: int = 1
    num_classes: int = 10
    grid: list[int] = field(default_factory=lambda: [28, 28])
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
    window: Optional[int] = None
    window_border: str = "clip"
    pe: PositionalEncodingConfig = field(default_factory=PositionalEncodingConfig)
    span: SpanConfig = field(default_factory=SpanConfig)
    performer: PerformerConfig = field(default_factory=PerformerConfig)

    @classmethod
    def from_dict(cls, values: Optional[dict] = None, **kwargs) -> "ModelConfig":
        """Builds a config from (nested) dicts; unknown keys raise ValueError."""
        if values is not None and not isinstance(values, Mapping):
            raise ValueError(f"model config must be a mapping, got {values!r} ({type(values).__name__})")
        merged = dict(values or {})
        merged.update(kwargs)
        cfg = _from_dict(cls, merged, "")
        cfg.validate()
        return cfg

    def to_dict(self) -> dict:
        """The config as nested plain dicts (what :meth:`from_dict` reads back and checkpoints save)."""
        return dataclasses.asdict(self)

    @property
    def token_grid(self) -> list:
        """The grid of tokens: the input grid divided by ``patch_size`` per axis."""
        return [int(n) // self.patch_size for n in self.grid]

    @property
    def attention_grid_rank(self) -> int:
        return len(self.grid) if self.positions == "grid" else 1

    def validate(self) -> None:
        """Raises ValueError naming the offending field (dotted path) and the valid values."""
        _check_fields(self)
        if any(n % self.patch_size for n in self.grid):
            raise ValueError(f"patch_size ({self.patch_size}) must divide every grid axis {self.grid}")
        if self.dim % self.heads:
            raise ValueError(f"dim ({self.dim}) must be divisible by heads ({self.heads})")
        if self.pe.num_features % 2:
            raise ValueError(f"pe.num_features must be even (sin and cos features), got {self.pe.num_features}")
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
        _choice("performer.clipped_form", self.performer.clipped_form, CLIPPED_FORMS)
        kind = encoding_kind(self.pe.name)
        if kind == "relative" and self.attention != "relpos":
            raise ValueError(
                f"pe.name={self.pe.name!r} is a relative encoder, which needs attention='relpos' "
                f"(attention={self.attention!r} takes 'none' or an absolute encoding)"
            )
        _choice("pe.init", self.pe.init, ("rope", "random"))
        if kind == "algebraic":
            if self.attention != "relpos":
                raise ValueError(
                    f"pe.name={self.pe.name!r} (algebraic) needs attention='relpos', got {self.attention!r}"
                )
            if self.span.enabled:
                raise ValueError(f"span.enabled is not available with the algebraic encoding {self.pe.name!r}")
            blocks = self.attention_grid_rank if self.pe.name != "algebraic_seq" else 1
            head_dim = self.dim // self.heads
            if head_dim % blocks or (head_dim // blocks) % 2 and (self.pe.init == "rope" or self.pe.name == "rope"):
                raise ValueError(
                    f"pe.name={self.pe.name!r}: the head dim ({head_dim}) must split into {blocks} "
                    "even blocks (one per axis)"
                )
        if self.span.enabled:
            if self.attention != "relpos":
                raise ValueError(f"span.enabled needs attention='relpos', got attention={self.attention!r}")
            if not self.span.init > self.span.min_sigma:
                raise ValueError(
                    f"span.init (initial sigma) must be > span.min_sigma = {self.span.min_sigma}, got {self.span.init}"
                )
        if self.causal:
            if self.attention not in CAUSAL_ATTENTIONS:
                raise ValueError(
                    f"causal=True needs attention in {CAUSAL_ATTENTIONS}, got attention={self.attention!r} "
                    "(the FAVOR+ attentions here are bidirectional)"
                )
            if self.pooling == "cls":
                raise ValueError(
                    "causal=True does not go with pooling='cls' (the class token comes first, so it "
                    "would see only itself); use pooling 'last', as the thesis does"
                )
        _choice("pe.bias", self.pe.bias, ("none",) + BIAS_KINDS)
        _choice("window_border", self.window_border, WINDOW_BORDERS)
        if self.pe.bias != "none" and self.attention != "relpos":
            raise ValueError(f"pe.bias={self.pe.bias!r} needs attention='relpos', got attention={self.attention!r}")
        if self.pe.bias == "t5" and self.pe.bias_buckets % 2:
            raise ValueError(f"pe.bias_buckets must be even (half per sign), got {self.pe.bias_buckets}")
        if self.pe.bias in ("t5", "cpb") and self.pe.bias_max_distance == 0:
            raise ValueError(f"pe.bias_max_distance must be >= 1 with pe.bias={self.pe.bias!r}, got 0")
        if self.pe.bias == "t5":  # where T5's bucket arithmetic is defined
            md = 128 if self.pe.bias_max_distance is None else self.pe.bias_max_distance
            check_t5_buckets(self.pe.bias_buckets, md, where="pe.bias_buckets / pe.bias_max_distance (t5)")
        if self.window is not None:
            if self.attention != "relpos":
                raise ValueError(f"window needs attention='relpos', got attention={self.attention!r}")
            if self.window % 2 == 0:
                raise ValueError(f"window must be an odd window size (the query at its centre), got {self.window}")
        if self.attention == "clipped_relative" and self.heads < 2:
            raise ValueError("attention='clipped_relative' needs heads >= 2 (half of them are relative)")


def _from_dict(cls, values: dict, prefix: str):
    if not isinstance(values, Mapping):
        raise _bad(prefix.rstrip("."), "a mapping", values)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            key = str(key)
            close = difflib.get_close_matches(key, list(fields), n=3)
            hint = f"; did you mean {', '.join(prefix + c for c in close)}?" if close else ""
            raise ValueError(f"unknown model config key {prefix + key!r}{hint} (valid: {', '.join(fields)})")
        nested = fields[key].default_factory if fields[key].default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(nested) and isinstance(nested, type):
            value = value if dataclasses.is_dataclass(value) else _from_dict(nested, value, f"{prefix}{key}.")
        elif key == "grid" and isinstance(value, tuple):
            value = list(value)  # no other conversion: validate() checks the values
        kwargs[key] = value
    return cls(**kwargs)
