"""The four models of Horn et al. (2021) as configured TransformerClassifiers.

Defaults follow that paper's code: dim 128, depth 4, heads 4, feed-forward
4 x dim with GELU, pre-LN, no dropout, a token per pixel, a class token read by
one Linear layer, FAVOR+ with features redrawn every 1000 steps. Any ModelConfig
field can be overridden. ``cmd/main.py -Dmodel.variant=<name>`` builds the same
model (see ``posattn.training.train.apply_model_variant``).
"""

from __future__ import annotations

import copy
from typing import Sequence

from .config import ModelConfig
from .transformer import TransformerClassifier

__all__ = ["Performer", "NoPosPerformer", "RelativePerformer", "ClippedRelativePerformer", "PERFORMER_VARIANTS"]

# the defaults of the paper's train.py (lucidrains' Performer, no dropout), a token per pixel; its published
# runs used dim 256, depth 6, heads 8, dropout 0.1 and lr 5e-5 (results CSVs of its repository)
PERFORMER_DEFAULTS = dict(
    dim=128,
    depth=4,
    heads=4,
    ffn_dim=512,
    dropout=0.0,
    input_dropout=0.0,
    norm="pre",
    activation="gelu",
    pooling="cls",
    head="linear",
    patch_size=1,
)

PERFORMER_VARIANTS = {
    "Performer": dict(attention="favor", pe={"name": "abs_learnable_sinusoid"}),
    "NoPosPerformer": dict(attention="favor", pe={"name": "none"}),
    "RelativePerformer": dict(attention="relative_favor", pe={"name": "none"}),
    "ClippedRelativePerformer": dict(attention="clipped_relative", pe={"name": "none"}),
}


def performer_config(variant: str, **overrides) -> ModelConfig:
    """The ModelConfig of a Horn et al. model, with ``overrides`` (nested dicts merge)."""
    if variant not in PERFORMER_VARIANTS:
        raise ValueError(f"unknown Performer variant {variant!r}; valid: {', '.join(PERFORMER_VARIANTS)}")
    values = {**PERFORMER_DEFAULTS, **copy.deepcopy(PERFORMER_VARIANTS[variant])}
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(values.get(key), dict):
            values[key] = {**values[key], **value}
        else:
            values[key] = value
    return ModelConfig.from_dict(values)


class _PerformerModel(TransformerClassifier):
    VARIANT = ""

    def __init__(self, in_channels: int = 1, num_classes: int = 10, grid: Sequence[int] = (32, 32), **overrides):
        super().__init__(
            performer_config(
                self.VARIANT, in_channels=in_channels, num_classes=num_classes, grid=list(grid), **overrides
            )
        )


class Performer(_PerformerModel):
    """FAVOR+ with the absolute learnable-sinusoid encoding."""

    VARIANT = "Performer"


class NoPosPerformer(_PerformerModel):
    """FAVOR+ without positional information."""

    VARIANT = "NoPosPerformer"


class RelativePerformer(_PerformerModel):
    """Strategy 1: positional features with constrained 2x2 blocks (translation equivariant)."""

    VARIANT = "RelativePerformer"


class ClippedRelativePerformer(_PerformerModel):
    """Strategy 2: half the heads use a Manhattan-distance table clipped at ``performer.clip``."""

    VARIANT = "ClippedRelativePerformer"
