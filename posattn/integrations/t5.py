"""Hugging Face T5 on posattn: :func:`patch_t5`.

T5's self-attention adds a learned bias per head and bucket of the relative
position (``T5Attention.compute_bias``) to unscaled logits; posattn's operator
takes the same thing as ``bias`` (H, U), one row per offset, so the patched
module never forms T5's (1, H, N, N) bias nor its N x N scores.
"""

from __future__ import annotations

import copy
import functools
from typing import Optional

import torch

from .. import ops
from ..grid import relative_offsets
from ..nn.bias import check_t5_buckets, t5_buckets
from ._common import runs_on_posattn

__all__ = ["patch_t5", "t5_offset_bias"]


def t5_offset_bias(source, n: int) -> torch.Tensor:
    """(H, 2n - 1) bias per offset of a sequence of ``n`` tokens from T5's bucket
    table (``source.relative_attention_bias``: (num_buckets, H)), rows in posattn's
    offset order (``delta = key - query``, as T5's ``relative_position``)."""
    weight = source.relative_attention_bias.weight
    delta = relative_offsets([n], device=weight.device)[:, 0]
    buckets = t5_buckets(
        delta,
        source.relative_attention_num_buckets,
        source.relative_attention_max_distance,
        bidirectional=not source.is_decoder,
    )
    return weight[buckets].transpose(0, 1)


def _no_masking(mask: Optional[torch.Tensor], n: int, causal: bool) -> bool:
    """Whether T5's attention mask masks nothing beyond the causal triangle
    (decoder) or nothing at all (encoder): then the operator's own masking is the
    same. A padding mask (or any other) is not: the call falls back."""
    if mask is None:
        return True
    if mask.dim() != 4 or mask.shape[-1] != n or mask.shape[-2] not in (1, n):
        return False
    if mask.dtype == torch.bool:
        allowed = mask
    else:
        allowed = mask == 0
    if causal:
        if mask.shape[-2] != n:
            return False
        want = torch.ones(n, n, dtype=torch.bool, device=mask.device).tril()
        return bool((allowed == want).all())
    return bool(allowed.all())


def _patched_forward(self, hidden_states, mask=None, key_value_states=None, position_bias=None, cache=None, **kwargs):
    """T5Attention.forward on posattn where the call allows it, else T5's own."""
    original = functools.partial(type(self).forward, self)
    if cache is None and "past_key_values" in kwargs:
        # transformers before 5.2x names the cache past_key_values (passed by keyword);
        # it goes back to T5's forward in the same (fifth) place as cache
        cache = kwargs.pop("past_key_values")
    source = self._posattn_bias_source
    n = hidden_states.shape[1]
    past = cache.get_seq_length(self.layer_idx) if cache is not None else 0
    usable = (
        key_value_states is None
        and not (isinstance(past, torch.Tensor) or past)
        and not (self.training and self.dropout > 0)
        and not kwargs.get("output_attentions", False)
        and runs_on_posattn(hidden_states)
        and _no_masking(mask, n, causal=self.is_decoder)
    )
    if not usable:
        self._posattn_calls["fallback"] += 1
        if position_bias is None and not self.has_relative_attention_bias:
            # the layer that shares the first layer's bias: it came as None (the patched
            # first layer hands none on), so take it from the first layer as T5 would
            key_length = n + (int(past) if cache is not None else 0)
            position_bias = source.compute_bias(n, key_length, device=hidden_states.device, past_seen_tokens=past)
        return original(hidden_states, mask, key_value_states, position_bias, cache, **kwargs)
    self._posattn_calls["posattn"] += 1
    shape = (*hidden_states.shape[:-1], -1, self.key_value_proj_dim)
    q = self.q(hidden_states).view(shape).transpose(1, 2)
    k = self.k(hidden_states).view(shape).transpose(1, 2)
    v = self.v(hidden_states).view(shape).transpose(1, 2)
    if cache is not None:  # the prefill of a generation: the cache gets this call's keys and values
        curr = getattr(cache, "self_attention_cache", cache)
        k, v = curr.update(k, v, self.layer_idx, kwargs=kwargs)
    bias = t5_offset_bias(source, n).to(q.dtype)
    out = ops.relpos_attention(q, k, v, grid=[n], bias=bias, scale=self.scaling, causal=self.is_decoder)
    out = self.o(out.transpose(1, 2).reshape(*hidden_states.shape[:-1], -1))
    # no dense (1, H, N, N) position bias is handed on: the next patched layers make
    # their own from the first layer's table (and T5's own code where they fall back)
    return out, None, None


def patch_t5(model, inplace: bool = True):
    """Lets a ``transformers`` T5 model's self-attention (encoder, and decoder with
    its causal mask) run on :func:`posattn.ops.relpos_attention`, keeping its
    weights: the modules stay where they are (same ``state_dict``), only their
    ``forward`` changes. Cross-attention stays T5's.

    A patched self-attention calls posattn when the call is one it computes the
    same: no padding mask (T5's mask masks nothing, or only the causal triangle in
    the decoder), no cached keys before the call (a generation's prefill is fine,
    its later one-token steps are not), no attention dropout (eval mode, or
    ``dropout_rate=0``), no ``output_attentions``, and a dtype the operator has a
    kernel for on the device (:func:`posattn.ops.has_kernel`; under autocast, the
    autocast dtype: a bfloat16 model on the CPU runs T5's code). Any other call runs T5's own code
    (``module._posattn_calls`` counts both).

    Args:
        model: a ``T5Model``, ``T5ForConditionalGeneration``, ``T5EncoderModel`` or a
            ``T5Stack``.
        inplace: patch ``model`` itself (default) or a deep copy.

    Returns the patched model. ValueError for anything else (naming what it got),
    or a T5 whose buckets posattn refuses (where T5's arithmetic is undefined).
    """
    try:
        from transformers.models.t5.modeling_t5 import T5Attention, T5Stack
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("patch_t5 needs transformers (pip install transformers)") from e
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"patch_t5: expected a transformers T5 model, got {type(model).__name__}")
    if not any(isinstance(m, T5Stack) for m in model.modules()):
        raise ValueError(f"patch_t5: {type(model).__name__} holds no T5Stack (not a transformers T5 model)")
    if not inplace:
        model = copy.deepcopy(model)
    for stack in [m for m in model.modules() if isinstance(m, T5Stack)]:
        selfs = [block.layer[0].SelfAttention for block in stack.block]
        if not selfs or not all(isinstance(a, T5Attention) for a in selfs):
            raise ValueError(f"patch_t5: {type(stack).__name__}'s blocks do not start with a T5Attention")
        source = selfs[0]
        if not source.has_relative_attention_bias:
            raise ValueError("patch_t5: the first self-attention of a T5Stack holds no relative_attention_bias")
        check_t5_buckets(
            source.relative_attention_num_buckets,
            source.relative_attention_max_distance,
            bidirectional=not source.is_decoder,
            where="patch_t5 (relative_attention_num_buckets / relative_attention_max_distance)",
        )
        for attn in selfs:
            if getattr(attn, "_posattn_calls", None) is not None:
                continue  # patched already
            # plain attributes, not submodules: the state_dict stays T5's
            object.__setattr__(attn, "_posattn_bias_source", source)
            object.__setattr__(attn, "_posattn_calls", {"posattn": 0, "fallback": 0})
            # a partial of a module-level function, not a bound method: a patched model pickles
            attn.forward = functools.partial(_patched_forward, attn)
    return model
