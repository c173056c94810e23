"""relpos_attention's argument list, written once: the schema's order (csrc/ops.cpp),
used by the wrapper, the fake kernels, the autograd and the tests that call the raw
operators."""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import torch


class RelposArgs(NamedTuple):
    """The arguments of ``torch.ops.posattn.relpos_attention`` in schema order. The
    backward operator takes ``grad_out, grad_lse`` first and ``out, lse`` after
    ``causal`` (:meth:`backward_args`); autograd's gradients come as a
    ``RelposArgs`` too (:meth:`gradients`)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    q_pos: Optional[torch.Tensor] = None
    rel: Optional[torch.Tensor] = None
    grid: Optional[Sequence[int]] = None
    sigma: Optional[torch.Tensor] = None
    threshold: float = 0.0
    span_mode: str = "add"
    scale: float = 1.0
    causal: bool = False
    bias: Optional[torch.Tensor] = None
    window: Optional[Sequence[int]] = None
    window_border: str = "clip"
    window_right: Optional[Sequence[int]] = None
    window_stride: Optional[Sequence[int]] = None
    window_causal: Optional[Sequence[int]] = None
    packed_offsets: Optional[torch.Tensor] = None
    packed_shapes: Optional[torch.Tensor] = None

    # the backward schema puts out and lse after the forward's `causal` (index 10)
    _SPLIT = 11

    def backward_args(self, grad_out, grad_lse, out, lse) -> tuple:
        """The arguments of ``torch.ops.posattn.relpos_attention_backward``."""
        return (grad_out, grad_lse, *self[: self._SPLIT], out, lse, *self[self._SPLIT :])

    @classmethod
    def from_backward_args(cls, args) -> tuple:
        """``(grad_out, grad_lse, RelposArgs, out, lse)`` from the backward operator's arguments."""
        grad_out, grad_lse, *rest = args
        fwd = rest[: cls._SPLIT] + rest[cls._SPLIT + 2 :]
        out, lse = rest[cls._SPLIT : cls._SPLIT + 2]
        return grad_out, grad_lse, cls(*fwd), out, lse

    @classmethod
    def gradients(cls, **grads) -> tuple:
        """Autograd's answer for the forward's inputs: the given gradients, None elsewhere."""
        return tuple(cls(*(None,) * len(cls._fields))._replace(**grads))
