"""posattn.nn: positional encoders, attention modules and models.

- Relative encoders (tables for ``relpos_attention``): :class:`SirenRelativeEncoder`,
  :class:`SinusoidalRelativeEncoder`, :class:`LookupRelativeEncoder`; learned scalar
  biases per offset (its ``bias``): :class:`RelativePositionBias` (Swin table, T5
  buckets, SwinV2 continuous).
- Absolute encodings: :class:`SinusoidalAbsoluteEncoding`, :class:`LearnedAbsoluteEncoding`,
  :class:`LearnableSinusoidEncoding`.
- :class:`DifferentiableSpan`; the attentions, all built on :class:`MultiHeadSelfAttention`:
  :class:`PositionalSelfAttention` (fused operator), :class:`SDPAttention` (content only,
  for baselines), :class:`AlgebraicSelfAttention` (with :class:`AlgebraicEncoder`).
- NATTEN's modules on posattn: :class:`NeighborhoodAttention1D` / ``2D`` / ``3D`` (same
  parameter names, plus an optional learned bias per window offset).
- Kernelizable attention: :class:`FavorAttention`, :class:`RelativeFavorAttention`,
  :class:`ClippedRelativeAttention` (and its local-window variant :class:`ClippedWindowAttention`).
- :class:`EncoderBlock`, :class:`TransformerClassifier` (+ :class:`ModelConfig`), and the
  Performer family (:class:`Performer`, :class:`NoPosPerformer`, :class:`RelativePerformer`,
  :class:`ClippedRelativePerformer`); :class:`TreeTransformer` over the nodes of trees.
"""

from .absolute import AbsoluteEncoding, LearnableSinusoidEncoding, LearnedAbsoluteEncoding, SinusoidalAbsoluteEncoding
from .algebraic import AlgebraicEncoder, AlgebraicSelfAttention
from .attention import MultiHeadSelfAttention, PositionalSelfAttention, SDPAttention
from .bias import RelativePositionBias
from .config import ModelConfig, PerformerConfig, PositionalEncodingConfig, SpanConfig
from .favor import ClippedRelativeAttention, ClippedWindowAttention, FavorAttention, RelativeFavorAttention
from .neighborhood import (
    NeighborhoodAttention,
    NeighborhoodAttention1D,
    NeighborhoodAttention2D,
    NeighborhoodAttention3D,
)
from .performer import ClippedRelativePerformer, NoPosPerformer, Performer, RelativePerformer, performer_config
from .registry import POSITIONAL_ENCODINGS, build_absolute_encoding, build_relative_encoder, encoding_kind
from .relative import LookupRelativeEncoder, RelativeEncoder, SinusoidalRelativeEncoder, SirenRelativeEncoder
from .span import DifferentiableSpan
from .transformer import EncoderBlock, TransformerClassifier, TreeTransformer

__all__ = [
    "NeighborhoodAttention",
    "NeighborhoodAttention1D",
    "NeighborhoodAttention2D",
    "NeighborhoodAttention3D",
    "AbsoluteEncoding",
    "LearnableSinusoidEncoding",
    "LearnedAbsoluteEncoding",
    "SinusoidalAbsoluteEncoding",
    "PositionalSelfAttention",
    "SDPAttention",
    "ModelConfig",
    "PerformerConfig",
    "PositionalEncodingConfig",
    "SpanConfig",
    "ClippedRelativeAttention",
    "ClippedWindowAttention",
    "FavorAttention",
    "RelativeFavorAttention",
    "ClippedRelativePerformer",
    "NoPosPerformer",
    "Performer",
    "RelativePerformer",
    "performer_config",
    "POSITIONAL_ENCODINGS",
    "build_absolute_encoding",
    "build_relative_encoder",
    "encoding_kind",
    "LookupRelativeEncoder",
    "RelativeEncoder",
    "SinusoidalRelativeEncoder",
    "SirenRelativeEncoder",
    "DifferentiableSpan",
    "EncoderBlock",
    "TransformerClassifier",
    "TreeTransformer",
    "AlgebraicEncoder",
    "AlgebraicSelfAttention",
    "MultiHeadSelfAttention",
    "RelativePositionBias",
]
