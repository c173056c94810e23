"""Extra tokens every query attends to (NATTEN's ``additional_keys`` /
``additional_values``), merged with a windowed attention through the
log-sum-exp: two softmaxes over disjoint key sets combine into the softmax over
their union exactly."""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["check_extra_tokens", "attend_extra", "merge_attention"]


def _acc(dtype: torch.dtype) -> torch.dtype:
    """The accumulation type of the operators: float64 for float64, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_extra_tokens(
    q: torch.Tensor, v: torch.Tensor, keys: Optional[torch.Tensor], values: Optional[torch.Tensor]
) -> None:
    """additional_keys (B, H, M, D) and additional_values (B, H, M, Dv), M >= 1,
    both or neither, on q's device and of q's dtype."""
    if (keys is None) != (values is None):
        raise ValueError("relpos_attention: additional_keys and additional_values must be given together")
    if keys is None:
        return
    for name, t in (("additional_keys", keys), ("additional_values", values)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"relpos_attention: {name} must be a tensor, got {type(t).__name__}")
        if t.dtype != q.dtype or t.device != q.device:
            raise ValueError(
                f"relpos_attention: {name} must have q's dtype and device ({q.dtype}, {q.device}), "
                f"got {t.dtype}, {t.device}"
            )
    B, H, _, D = q.shape
    if keys.dim() != 4 or tuple(keys.shape[:2]) != (B, H) or keys.shape[3] != D or keys.shape[2] < 1:
        raise ValueError(
            f"relpos_attention: additional_keys must have shape (B, H, M, D) = ({B}, {H}, M >= 1, {D}), "
            f"got {tuple(keys.shape)}"
        )
    M, Dv = keys.shape[2], v.shape[3]
    if tuple(values.shape) != (B, H, M, Dv):
        raise ValueError(
            f"relpos_attention: additional_values must have shape (B, H, M, Dv) = ({B}, {H}, {M}, {Dv}), "
            f"got {tuple(values.shape)}"
        )


def attend_extra(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, H, N, Dv), lse (B, H, N)) of q over the M extra tokens alone, in
    the accumulation type. Memory O(N M)."""
    acc = _acc(q.dtype)
    logits = scale * (q.to(acc) @ keys.to(acc).transpose(-1, -2))  # (B, H, N, M)
    lse = torch.logsumexp(logits, -1)
    return torch.softmax(logits, -1) @ values.to(acc), lse


def merge_attention(
    out1: torch.Tensor, lse1: torch.Tensor, out2: torch.Tensor, lse2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention over the union of two disjoint key sets from each one's
    (out, lse): weights exp(lse_i - lse) with lse = logaddexp(lse1, lse2). Returns
    out in out1's dtype and lse in the accumulation type. A side whose keys were
    all masked (lse -inf) weighs 0."""
    acc = lse1.dtype
    lse = torch.logaddexp(lse1, lse2.to(acc))
    w1 = torch.exp(lse1 - lse).nan_to_num(nan=0.0)  # -inf - -inf where both sides are empty
    w2 = torch.exp(lse2.to(acc) - lse).nan_to_num(nan=0.0)
    out = out1.to(acc) * w1.unsqueeze(-1) + out2.to(acc) * w2.unsqueeze(-1)
    return out.to(out1.dtype), lse
