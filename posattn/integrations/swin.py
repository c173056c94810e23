"""timm's Swin and SwinV2 on posattn: :func:`patch_swin`.

A Swin block attends within non-overlapping windows of the (cyclically shifted,
padded) feature map, adds a bias per head and relative offset (a learned table in
Swin, ``16 sigmoid(cpb_mlp(coords))`` in SwinV2), and in shifted blocks masks the
pairs of a window that come from different regions of the map with an additive
-100. The patched block computes the same with :func:`posattn.ops.relpos_attention`
and no mask at all: the regions of the shifted partition are themselves
rectangular blocks, so each run of equal blocks is one op call on a grid of the
block's shape (the blocks in the batch), with the bias table cropped to the
block's offsets. No (nW, N, N) mask nor N x N bias is formed.
"""

from __future__ import annotations

import copy
import functools
import math
import warnings
from typing import List, Tuple

import torch
import torch.nn.functional as F

from .. import ops
from ._common import runs_on_posattn

__all__ = ["patch_swin", "swin_block_runs", "swin_offset_bias"]

# timm masks the pairs of a shifted window from different regions with -100: their
# weight against the row's largest is at most exp(span - 100), with span the spread
# of the row's logits, below float32 rounding (2^-24 ~ e^-16.6) while the span is < 83
_TIMM_MASK = 100.0
_MAX_SPAN = _TIMM_MASK - 17.0


def swin_block_runs(padded: int, window: int, shift: int) -> List[Tuple[int, int, int]]:
    """The blocks of one axis that a Swin block's attention keeps apart, as runs
    ``(start, size, count)`` of ``count`` equal blocks of ``size`` cells from
    ``start``, in the rolled and padded coordinates of timm's ``_attn``.

    Without a shift these are the windows. With one, the last window holds two of
    timm's mask regions, ``[padded - window, padded - shift)`` and
    ``[padded - shift, padded)``; every other window is one region."""
    if shift == 0:
        return [(0, window, padded // window)]
    runs = [(0, window, padded // window - 1)] if padded > window else []
    if 2 * shift == window:  # Swin's default shift of an even window: the last two blocks are one run
        return runs + [(padded - window, shift, 2)]
    return runs + [(padded - window, window - shift, 1), (padded - shift, shift, 1)]


def swin_offset_bias(table: torch.Tensor, window: Tuple[int, int], block: Tuple[int, int]) -> torch.Tensor:
    """(H, (2 b_h - 1)(2 b_w - 1)) bias of a block of ``block`` cells in posattn's
    offset order, from a Swin table ``table`` ((2 w_h - 1)(2 w_w - 1), H) in timm's
    order. timm's row for the pair (query i, key j) is that of ``pos(i) - pos(j)``
    and posattn's that of ``pos(j) - pos(i)``: in row-major order over the same
    box, negating the offset reverses the rows."""
    (wh, ww), (bh, bw) = window, block
    heads = table.shape[-1]
    t = table.flip(0).t().reshape(heads, 2 * wh - 1, 2 * ww - 1)
    return t[:, wh - bh : wh + bh - 1, ww - bw : ww + bw - 1].reshape(heads, -1)


def _bias_table(attn, v2: bool) -> torch.Tensor:
    """The block's bias per offset in timm's order: ((2 w_h - 1)(2 w_w - 1), H)."""
    if v2:
        return 16 * torch.sigmoid(attn.cpb_mlp(attn.relative_coords_table).view(-1, attn.num_heads))
    return attn.relative_position_bias_table


def _qkv(attn, x: torch.Tensor, v2: bool) -> torch.Tensor:
    """timm's qkv projection of every token: (..., 3 * H * D)."""
    if v2 and attn.q_bias is not None:
        return F.linear(x, attn.qkv.weight, torch.cat((attn.q_bias, attn.k_bias, attn.v_bias)))
    return attn.qkv(x)


def _usable(block, x: torch.Tensor, hp: int, wp: int) -> bool:
    """Whether posattn computes this call as timm does: no attention dropout, a dtype
    the op takes on x's device (under autocast, the projection's), and a static
    shift mask (if any) made for this padded size (else timm's own code runs)."""
    attn = block.attn
    if attn.training and attn.attn_drop.p > 0:
        return False
    if not runs_on_posattn(x):
        return False
    if any(block.shift_size) and not getattr(block, "dynamic_mask", False):
        # timm's static mask is laid out for input_resolution rounded up to the window:
        # on any other map (even one with as many windows) it masks other pairs
        (wh, ww), (rh, rw) = block.window_size, block.input_resolution
        if (hp, wp) != (math.ceil(rh / wh) * wh, math.ceil(rw / ww) * ww):
            return False
        area, windows = wh * ww, (hp // wh) * (wp // ww)
        if block.attn_mask is None or tuple(block.attn_mask.shape) != (windows, area, area):
            return False
    return True


@functools.lru_cache(maxsize=64)
def _block_order(hp: int, wp: int, window: Tuple[int, int], shift: Tuple[int, int], device: str):
    """The blocks of a shifted Swin block on an hp x wp map: ``[(b_h, b_w, count)]``
    per run of equal blocks, and the token order that puts each run's blocks one
    after another, each block's cells row-major (``order``), with its inverse."""
    runs, order = [], []
    cells = torch.arange(hp * wp).view(hp, wp)
    for r0, bh, nr in swin_block_runs(hp, window[0], shift[0]):
        for c0, bw, nc in swin_block_runs(wp, window[1], shift[1]):
            part = cells[r0 : r0 + nr * bh, c0 : c0 + nc * bw].reshape(nr, bh, nc, bw).permute(0, 2, 1, 3)
            runs.append((bh, bw, nr * nc))
            order.append(part.flatten())
    order = torch.cat(order)
    return runs, order.to(device), torch.argsort(order).to(device)


def _attend(attn, v2: bool, table: torch.Tensor, qkv: torch.Tensor, block: Tuple[int, int], window) -> torch.Tensor:
    """Attention within equal blocks of ``block`` cells, the blocks in the batch:
    qkv (3, B', H, b_h b_w, D) -> (B', H, b_h b_w, D)."""
    q, k, v = qkv.unbind(0)
    bias = swin_offset_bias(table, window, block).to(q.dtype)
    if v2:  # cosine attention: the per-head logit scale folded into the queries
        scale = torch.clamp(attn.logit_scale, max=math.log(1.0 / 0.01)).exp()
        # .to: under CUDA autocast, normalize runs in float32 (timm's matmul then casts back)
        q, k = (F.normalize(q, dim=-1) * scale).to(v.dtype), F.normalize(k, dim=-1).to(v.dtype)
        return ops.relpos_attention(q, k, v, grid=list(block), bias=bias, scale=1.0)
    return ops.relpos_attention(q, k, v, grid=list(block), bias=bias, scale=attn.scale)


def _patched_attn(self, x: torch.Tensor) -> torch.Tensor:
    """SwinTransformer(V2)Block._attn on posattn: x (B, H, W, C) -> (B, H, W, C)."""
    b, h, w, c = x.shape
    (wh, ww), (sh, sw) = self.window_size, self.shift_size
    hp, wp = math.ceil(h / wh) * wh, math.ceil(w / ww) * ww
    if not _usable(self, x, hp, wp):
        self._posattn_calls["fallback"] += 1
        return type(self)._attn(self, x)
    self._posattn_calls["posattn"] += 1
    attn, v2 = self.attn, self._posattn_v2
    heads = attn.num_heads
    if sh or sw:
        x = torch.roll(x, shifts=(-sh, -sw), dims=(1, 2))
    x = F.pad(x, (0, 0, 0, wp - w, 0, hp - h))
    qkv = _qkv(attn, x, v2)
    d = qkv.shape[-1] // (3 * heads)
    table = _bias_table(attn, v2)
    if not (sh or sw):  # the windows: one run, one copy from timm's layout to the op's and one back
        nr, nc = hp // wh, wp // ww
        qkv = qkv.view(b, nr, wh, nc, ww, 3, heads, d).permute(5, 0, 1, 3, 6, 2, 4, 7)
        o = _attend(attn, v2, table, qkv.reshape(3, b * nr * nc, heads, wh * ww, d), (wh, ww), (wh, ww))
        out = o.view(b, nr, nc, heads, wh, ww, d).permute(0, 1, 4, 2, 5, 3, 6).reshape(b, hp, wp, heads * d)
    else:  # one gather into block order, a split per run (its backward is one cat), one gather back
        runs, order, inverse = _block_order(hp, wp, (wh, ww), (sh, sw), str(qkv.device))
        parts = qkv.view(b, hp * wp, 3 * heads * d).index_select(1, order)
        outs = []
        for (bh, bw, n), part in zip(runs, parts.split([bh * bw * n for bh, bw, n in runs], dim=1)):
            part = part.view(b, n, bh * bw, 3, heads, d).permute(3, 0, 1, 4, 2, 5).reshape(3, b * n, heads, bh * bw, d)
            o = _attend(attn, v2, table, part, (bh, bw), (wh, ww))
            outs.append(o.view(b, n, heads, bh * bw, d).permute(0, 1, 3, 2, 4).reshape(b, n * bh * bw, heads * d))
        out = torch.cat(outs, dim=1).index_select(1, inverse).view(b, hp, wp, heads * d)
    if attn.training and attn.proj_drop.p > 0:
        # timm drops on the windows' layout: the same layout gives the same random draws
        win = out.view(b, hp // wh, wh, wp // ww, ww, -1).transpose(2, 3).reshape(-1, wh * ww, out.shape[-1])
        win = attn.proj_drop(attn.proj(win))
        out = win.view(b, hp // wh, wp // ww, wh, ww, c).transpose(2, 3).reshape(b, hp, wp, c)
    else:
        out = attn.proj_drop(attn.proj(out))
    out = out[:, :h, :w]
    if sh or sw:
        out = torch.roll(out, shifts=(sh, sw), dims=(1, 2))
    return out.contiguous()


def _swin_classes():
    try:
        from timm.models import swin_transformer as v1
        from timm.models import swin_transformer_v2 as v2
    except Exception as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"patch_swin needs timm (pip install timm; it imports torchvision, which must match torch): {e}"
        ) from e
    return (v1.SwinTransformerBlock, v1.WindowAttention), (v2.SwinTransformerV2Block, v2.WindowAttention)


def patch_swin(model, inplace: bool = True):
    """Lets a timm Swin or SwinV2 model's window attention run on
    :func:`posattn.ops.relpos_attention`, keeping its weights: the blocks stay where
    they are (same ``state_dict``), only their ``_attn`` changes.

    Every block's call runs on posattn: windows and shifted windows (the regions of
    a shifted window become separate blocks, no mask), padding to a multiple of the
    window, Swin's bias table and SwinV2's CPB MLP and cosine attention, dropout
    after the projection. Three kinds of call run timm's own code
    (``block._posattn_calls`` counts both): training with attention dropout
    (``attn_drop_rate > 0``); a static shift mask made for another input size; a
    dtype the op does not take on that device (float16 / bfloat16 on the CPU, also
    under autocast). Differentiable once (a gradient of the gradient raises).

    Pairs of a shifted window from different regions get weight 0 here; timm adds
    -100 to their logits, which agrees to float32 rounding while a row's logits
    span less than ~83. A SwinV2 head's logits span at most
    ``2 exp(logit_scale) + 16``: a shifted block whose logit scale allows more gets
    a warning at patch time. Swin's logits have no such bound (nothing is checked).

    Args:
        model: a ``timm`` model holding ``SwinTransformerBlock`` or
            ``SwinTransformerV2Block`` modules (``SwinTransformer``,
            ``SwinTransformerV2``, a stage or a block).
        inplace: patch ``model`` itself (default) or a deep copy.

    Returns the patched model. ValueError for anything else, naming what it got,
    or a block whose window attention or shift timm's code would not run as is
    (naming the block and the setting).
    """
    (block_v1, attn_v1), (block_v2, attn_v2) = _swin_classes()
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"patch_swin: expected a timm Swin / SwinV2 model, got {type(model).__name__}")
    blocks = [(n, m) for n, m in model.named_modules() if isinstance(m, (block_v1, block_v2))]
    if not blocks:
        raise ValueError(
            f"patch_swin: {type(model).__name__} holds no timm SwinTransformerBlock or SwinTransformerV2Block "
            "(timm's swin_transformer_v2_cr and other window models are not supported)"
        )
    for name, block in blocks:
        v2 = isinstance(block, block_v2)
        want = attn_v2 if v2 else attn_v1
        where = f"patch_swin: block '{name or type(block).__name__}'"
        if type(block.attn) is not want:
            raise ValueError(f"{where}: attn is a {type(block.attn).__name__}, expected timm's {want.__name__}")
        for axis, win, shift in zip("hw", block.window_size, block.shift_size):
            if not 0 <= shift < win:
                raise ValueError(f"{where}: shift_size {tuple(block.shift_size)} must be in [0, window) on axis {axis}")
        if tuple(block.attn.window_size) != tuple(block.window_size):
            raise ValueError(
                f"{where}: attn.window_size {tuple(block.attn.window_size)} differs from the block's "
                f"window_size {tuple(block.window_size)}"
            )
        if v2 and any(block.shift_size):
            top = float(torch.clamp(block.attn.logit_scale.detach(), max=math.log(100.0)).exp().max())
            if 2 * top + 16 > _MAX_SPAN:
                warnings.warn(
                    f"{where}: logit scale up to {top:.1f}; timm's -100 shift mask can leave weight above float32 "
                    "rounding on pairs of different regions, which posattn masks exactly",
                    stacklevel=2,
                )
    if not inplace:
        model = copy.deepcopy(model)
        blocks = [(n, m) for n, m in model.named_modules() if isinstance(m, (block_v1, block_v2))]
    for _, block in blocks:
        if getattr(block, "_posattn_calls", None) is not None:
            continue  # patched already
        object.__setattr__(block, "_posattn_v2", isinstance(block, block_v2))
        object.__setattr__(block, "_posattn_calls", {"posattn": 0, "fallback": 0})
        # a partial of a module-level function, not a bound method: a patched model pickles
        block._attn = functools.partial(_patched_attn, block)
    return model
