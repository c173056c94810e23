"""posattn inside existing models: functions that take a loaded model and let
its attention run on posattn's fused operator, keeping its weights.

- :func:`patch_t5`: Hugging Face ``transformers`` T5 (encoder and decoder self-attention).
- :func:`patch_swin`: timm's Swin and SwinV2 (window attention, shifted windows).

The libraries themselves are imported only when a patch is applied."""

from .swin import patch_swin
from .t5 import patch_t5

__all__ = ["patch_swin", "patch_t5"]
