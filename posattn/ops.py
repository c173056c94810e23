"""Documented Python wrappers of the ``torch.ops.posattn`` operators.

Each operator has a fake (meta) kernel for ``torch.compile`` and autograd
registered through ``torch.library.register_autograd``; backward passes are
operators of their own (``torch.ops.posattn.<op>_backward``).
"""

from __future__ import annotations

import numbers
from typing import Optional, Sequence, Union

import torch

from ._dilation import dilated_call
from ._extra_tokens import attend_extra, check_extra_tokens, merge_attention
from ._grid import (
    WINDOW_BORDERS,
    axis_ints,
    check_dilation_with_span,
    normalise_grid,
    normalise_window,
    num_offsets,
    window_spec,
)

__all__ = ["relpos_attention", "apply_maps", "has_kernel", "cpu_capability", "SPAN_MODES"]

SPAN_MODES = ("add", "multiply")

# Which device types have a kernel of each operator (fixed once the extension is
# loaded; "meta" has the fake kernel, for shape inference), and the dtypes each
# backend's kernels take (the CPU kernels check theirs: relpos_attention_cpu.cpp,
# apply_maps_cpu.cpp).
_OPS = ("relpos_attention", "apply_maps")
_KERNEL_DEVICES = {
    op: frozenset(
        device
        for device, key in (("cpu", "CPU"), ("cuda", "CUDA"), ("meta", "Meta"))
        if torch._C._dispatch_has_kernel_for_dispatch_key(f"posattn::{op}", key)
    )
    for op in _OPS
}
_HALF = (torch.float16, torch.bfloat16)
_KERNEL_DTYPES = {
    "cpu": (torch.float32, torch.float64),
    "cuda": (torch.float32, torch.float64) + _HALF,
    "meta": (torch.float32, torch.float64) + _HALF,
}


def has_kernel(op: str, x: torch.Tensor) -> bool:
    """Whether ``torch.ops.posattn.<op>`` has a kernel for ``x``'s device and dtype
    (``op``: ``"relpos_attention"`` or ``"apply_maps"``). Modules fall back to
    :mod:`posattn.reference` where it has not."""
    if op not in _KERNEL_DEVICES:
        raise ValueError(f"has_kernel: op must be one of {', '.join(_OPS)}, got {op!r}")
    device = x.device.type
    return device in _KERNEL_DEVICES[op] and x.dtype in _KERNEL_DTYPES.get(device, ())


def relpos_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: Optional[torch.Tensor] = None,
    rel: Optional[torch.Tensor] = None,
    grid: Optional[Sequence[int]] = None,
    sigma: Optional[torch.Tensor] = None,
    threshold: float = 0.0,
    span_mode: str = "add",
    scale: Optional[float] = None,
    causal: bool = False,
    return_lse: bool = False,
    bias: Optional[torch.Tensor] = None,
    window: Optional[Union[int, Sequence[int]]] = None,
    window_border: str = "clip",
    kernel_size: Optional[Union[int, Sequence[int]]] = None,
    window_stride: Optional[Union[int, Sequence[int]]] = None,
    window_causal: Optional[Union[bool, Sequence[bool]]] = None,
    window_dilation: Optional[Union[int, Sequence[int]]] = None,
    additional_keys: Optional[torch.Tensor] = None,
    additional_values: Optional[torch.Tensor] = None,
):
    r"""Positional self-attention with relative embeddings on an n-D grid.

    Shapes: B batch, H heads, N tokens, D head dim, Dv value dim, G grid axes.

    Args:
        q, k: (B, H, N, D) queries and keys.
        v: (B, H, N, Dv) values.
        q_pos: optional (B, H, N, D) positional query (Transformer-XL style callers
            pass ``q + v_bias``); requires ``rel``.
        rel: (H, U, D) relative embeddings, U = prod(2 n_d - 1). The offset of key j
            seen from query i is ``delta = pos(j) - pos(i)``; its row is the
            row-major index of ``delta + (n - 1)`` over (2 n_1 - 1, ..., 2 n_G - 1).
        grid: G ints with prod == N (default ``[N]``); tokens are the grid cells in
            row-major order.
        sigma: optional (H, G) positive span widths in normalised units
            (``x_d = delta_d / max(n_d - 1, 1)``, ``quad = 0.5 sum_d (x_d / sigma_d)^2``).
            Of q's dtype, or float32 when q is float16 / bfloat16 (recommended:
            its gradient, a sum over every pair of terms in 1 / sigma^3,
            overflows float16); the gradient has sigma's dtype. Checked on the
            CPU with a ValueError, on CUDA by a device-side assertion with the
            same message (no host synchronisation).
        threshold: t in [0, 1). If t > 0 (requires ``sigma``) key j is kept only if
            ``|delta_d| <= min(ceil(sigma_d sqrt(-2 ln t) (n_d - 1)), n_d - 1)`` on
            every axis; the kernel then visits only the keys in that box.
        span_mode: ``"add"`` (``s -= quad``, a Gaussian prior on the weights) or
            ``"multiply"`` (``s *= exp(-quad)``, the thesis' form).
        scale: logit scale, default ``D ** -0.5``.
        causal: keep only keys j <= i (token order).
        return_lse: also return the (B, H, N) log-sum-exp of the logits, in
            float32 (float64 for float64 inputs) whatever q's dtype.
        bias: optional (H, U) learned bias per head and offset (Swin / T5 style),
            rows in the order of ``rel``; added to the logits after the scale,
            before the span. Independent of ``q_pos`` / ``rel``: either, both or
            neither may be given.
        window: optional fixed window, G half widths ``w_d >= 0`` (an int applies
            to every axis): key j is kept only if it lies in query i's window of
            ``2 w_d + 1`` cells on every axis. Combines with ``causal`` and the
            threshold box (a key must pass every mask); the kernels visit only
            the keys inside it.
        window_border: ``"clip"`` (default): the window is centred on the query
            and clipped at the grid's borders (``|delta_d| <= w_d``);
            ``"shift"``: NATTEN's rule, the window is shifted to stay inside the
            grid, so every query keeps ``min(2 w_d + 1, n_d)`` keys per axis
            (NAT / DiNAT without dilation). Ignored without a window.
        kernel_size: instead of ``window``, NATTEN's kernel: ``k_d >= 1`` cells per
            axis (an int applies to every axis), odd or even: ``k // 2`` before the
            window's centre and ``k - 1 - k // 2`` after (``window=w`` is
            ``kernel_size=2w+1``). Larger than the axis: the whole axis. The border
            rule stays ``window_border``'s (default ``"clip"``); NATTEN's is
            ``"shift"`` (the default of :func:`posattn.na2d` etc.).
        window_stride: with a window, ``1 <= s_d <= k_d`` per axis (NATTEN's
            stride): queries come in groups of ``s_d`` cells (``[g s, g s + s - 1]``)
            that share the window of the group's middle cell ``g s + s // 2``
            (capped at ``n_d - 1``). Default 1: each query's own window.
        window_causal: with a window, a bool per axis (NATTEN's ``is_causal``): on
            a causal axis a query keeps the keys ``j_d <= i_d`` less than ``k_d``
            cells before its group's last cell (``g s + s - 1``, capped); the
            border rule does not apply there. Independent of ``causal`` (token
            order over the whole grid).
        window_dilation: with a window, ``d_d >= 1`` per axis (NATTEN's
            dilation, DiNAT): a query at cell i keeps only keys of its residue
            ``i mod d``, and its window (size, stride, causal, border) lives on the
            sub-grid of those cells (cell ``r + d t`` is sub-grid cell t, of
            ``ceil((n - r) / d)`` cells). The offsets, embeddings, bias and span
            stay the grid's own (a key ``d`` cells away has offset d). Computed
            by regrouping the tokens of each residue class (as NATTEN does), so
            the kernels still visit only the kept keys. A span threshold cannot
            be combined with it (ValueError): the box is in the grid's cells.
        additional_keys, additional_values: optional (B, H, M, D) and
            (B, H, M, Dv), M >= 1 (NATTEN's ``additional_keys`` /
            ``additional_values``): extra tokens every query attends to besides
            its window (e.g. global or cross-attention tokens), in the same
            softmax; their logits are ``scale * q_i . k_extra`` (no positional
            term, bias, span or mask). Merged through the log-sum-exp.

    Math, per batch b and head h::

        s_ij = scale * (q_i . k_j + q_pos_i . rel[h, row(delta_ij)]) + bias[h, row(delta_ij)]
        s_ij -= quad_ij  |  s_ij *= exp(-quad_ij)          (with sigma)
        s_ij = -inf where masked (threshold box, window, causal)
        out_i = sum_j softmax_j(s_ij) v_j,   lse_i = log sum_j exp(s_ij)

    A query always keeps itself under the box, window and causal masks. If a query had
    every key masked anyway, its output row is zeros and its lse is -inf. A kept
    logit of -inf has weight 0; a NaN or +inf reaching a kept logit, or a
    non-finite value, makes the row NaN, as in the reference. Differentiable
    once: a gradient of the gradient raises.

    Returns:
        ``out`` (B, H, N, Dv), or ``(out, lse)`` if ``return_lse``.
        Differentiable in q, k, v, q_pos, rel, sigma and bias (the box is not).
        The backward is deterministic on every device (no atomics: every
        gradient element is summed in a fixed order).
    """
    _check_q(q)
    grid_list = normalise_grid(grid, q.shape[2])
    spec = window_spec(window, grid_list, kernel_size, window_stride, window_causal, window_dilation)
    left, right, stride, wcausal, dilation = spec if spec is not None else (None,) * 5
    if spec is not None:  # a window beyond the axis is the axis (the op's ints are int64)
        left, right = ([min(w, n - 1) for w, n in zip(ws, grid_list)] for ws in (left, right))
        stride = [min(s, n) for s, n in zip(stride, grid_list)]
    threshold = _real("threshold", threshold)
    scale = q.shape[-1] ** -0.5 if scale is None else _real("scale", scale)
    causal, return_lse = _flag("causal", causal), _flag("return_lse", return_lse)
    _check_relpos_args(
        q, k, v, q_pos, rel, grid_list, sigma, threshold, span_mode, scale, bias, left, window_border,
        right, stride, wcausal,
    )  # fmt: skip
    check_extra_tokens(q, v, additional_keys, additional_values)

    def call(q, k, v, q_pos, rel, bias, sigma, grid):
        return torch.ops.posattn.relpos_attention(
            q, k, v, q_pos, rel, grid, sigma, threshold, span_mode, scale, causal, bias, left, window_border,
            right, stride, wcausal,
        )  # fmt: skip

    if dilation is not None and any(d > 1 for d in dilation):
        check_dilation_with_span(dilation, threshold)
        out, lse = dilated_call(call, q, k, v, q_pos, rel, bias, sigma, grid_list, dilation)
    else:
        out, lse = call(q, k, v, q_pos, rel, bias, sigma, grid_list)
    if additional_keys is not None:
        out, lse = merge_attention(out, lse, *attend_extra(q, additional_keys, additional_values, scale))
    return (out, lse) if return_lse else out


def _real(name: str, value) -> float:
    """A real-number argument as a float; bools, complex numbers, None and strings are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"relpos_attention: {name} must be a real number, got {value!r} ({type(value).__name__})")
    return float(value)


def _flag(name: str, value) -> bool:
    """A bool argument; ``causal="no"`` would otherwise read as True."""
    if not isinstance(value, bool):
        raise TypeError(f"relpos_attention: {name} must be True or False, got {value!r} ({type(value).__name__})")
    return value


def _check_q(q) -> None:
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"relpos_attention: q must be a tensor, got {type(q).__name__}")
    if q.dim() != 4 or q.shape[2] < 1 or q.shape[3] < 1:
        raise ValueError(
            f"relpos_attention: q must have shape (B, H, N, D) with N >= 1 and D >= 1, got {tuple(q.shape)}"
        )


def _check_relpos_args(
    q, k, v, q_pos, rel, grid, sigma, threshold, span_mode, scale, bias=None, window=None, window_border="clip",
    window_right=None, window_stride=None, window_causal=None,
) -> None:  # fmt: skip
    """Shape, dtype, device and argument checks (no tensor values are read, so this
    also runs on fake tensors under torch.compile). Mirrors the C++ checks."""
    tensors = {"q": q, "k": k, "v": v, "q_pos": q_pos, "rel": rel, "sigma": sigma, "bias": bias}
    for name, t in tensors.items():
        if (t is not None or name in ("q", "k", "v")) and not isinstance(t, torch.Tensor):
            raise TypeError(f"relpos_attention: {name} must be a tensor, got {type(t).__name__}")
    _check_q(q)
    B, H, N, D = q.shape
    normalise_grid(grid, N)
    for name, t in tensors.items():
        if t is not None:
            _check_like_q(name, t, q, float32_with_half=name == "sigma")
    if k.shape != q.shape:
        raise ValueError(f"relpos_attention: k must have the shape of q {tuple(q.shape)}, got {tuple(k.shape)}")
    if v.dim() != 4 or tuple(v.shape[:3]) != (B, H, N) or v.shape[3] < 1:
        raise ValueError(
            f"relpos_attention: v must have shape (B, H, N, Dv) = ({B}, {H}, {N}, Dv >= 1), got {tuple(v.shape)}"
        )
    if (q_pos is None) != (rel is None):
        raise ValueError("relpos_attention: q_pos and rel must be given together")
    if q_pos is not None:
        U = num_offsets(grid)
        if q_pos.shape != q.shape:
            raise ValueError(
                f"relpos_attention: q_pos must have the shape of q {tuple(q.shape)}, got {tuple(q_pos.shape)}"
            )
        if tuple(rel.shape) != (H, U, D):
            raise ValueError(
                f"relpos_attention: rel must have shape (H, U, D) = ({H}, {U}, {D}) with "
                f"U = prod(2 n_d - 1) for grid {list(grid)}, got {tuple(rel.shape)}"
            )
    if bias is not None and tuple(bias.shape) != (H, num_offsets(grid)):
        raise ValueError(
            f"relpos_attention: bias must have shape (H, U) = ({H}, {num_offsets(grid)}) with "
            f"U = prod(2 n_d - 1) for grid {list(grid)}, got {tuple(bias.shape)}"
        )
    _check_window(grid, window, window_right, window_stride, window_causal)
    if window_border not in WINDOW_BORDERS:
        raise ValueError(f'relpos_attention: window_border must be "clip" or "shift", got {window_border!r}')
    if span_mode not in SPAN_MODES:
        raise ValueError(f'relpos_attention: span_mode must be "add" or "multiply", got {span_mode!r}')
    if sigma is not None and tuple(sigma.shape) != (H, len(grid)):
        raise ValueError(
            f"relpos_attention: sigma must have shape (H, G) = ({H}, {len(grid)}), got {tuple(sigma.shape)}"
        )
    if not (0.0 <= threshold < 1.0):
        raise ValueError(f"relpos_attention: threshold must be in [0, 1), got {threshold}")
    if threshold > 0 and sigma is None:
        raise ValueError("relpos_attention: threshold > 0 requires sigma (the span widths)")
    if scale != scale or scale in (float("inf"), float("-inf")):
        raise ValueError(f"relpos_attention: scale must be finite, got {scale}")
    dtype_max = torch.finfo(q.dtype).max
    if abs(scale) > dtype_max:
        raise ValueError(
            f"relpos_attention: scale = {scale} overflows the tensors' dtype {q.dtype} "
            f"(largest finite value {dtype_max})"
        )


def _check_window(grid, window, window_right, window_stride, window_causal) -> None:
    """The schema's window arguments (as check_relpos_inputs in relpos_checks.cpp):
    ``window`` cells before the centre, ``window_right`` after, stride, causal 0 / 1."""
    extra = (("window_right", window_right), ("window_stride", window_stride), ("window_causal", window_causal))
    for name, value in extra:
        if value is not None and window is None:
            raise ValueError(f"relpos_attention: {name} needs a window (window = None)")
    if window is None:
        return
    left = normalise_window(window, grid, cap=False)
    right = left if window_right is None else axis_ints("window_right", window_right, grid, -(2**63))
    for d, (a, b) in enumerate(zip(left, right)):
        if b < 0 or b not in (a, a - 1):
            raise ValueError(
                f"relpos_attention: window_right must be >= 0 and equal window or window - 1 on every axis (a kernel of "
                f"window + window_right + 1 cells, split as NATTEN does), got window {left}, window_right "
                f"{right} (axis {d})"
            )
    if window_stride is not None:
        window_spec(None, grid, [a + b + 1 for a, b in zip(left, right)], window_stride)
    if window_causal is not None:
        causal = list(window_causal)
        if len(causal) != len(grid):
            raise ValueError(
                f"relpos_attention: window_causal must give one value per grid axis ({len(grid)} for grid "
                f"{list(grid)}), got {len(causal)}: {causal}"
            )
        if not all(c in (0, 1) and not isinstance(c, bool) for c in causal):
            raise ValueError(f"relpos_attention: window_causal must be 0 or 1 per grid axis, got {causal}")


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of relpos_attention's log-sum-exp for inputs of ``dtype``: the
    accumulation type (float32, or float64 for float64 inputs)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_like_q(name: str, t: torch.Tensor, q: torch.Tensor, float32_with_half: bool = False) -> None:
    """A floating-point tensor of q's dtype and device (check_float_tensor in relpos_checks.cpp);
    ``float32_with_half``: float32 is accepted too when q is float16 / bfloat16."""
    if not t.dtype.is_floating_point:
        raise TypeError(f"relpos_attention: {name} must be a floating-point tensor, got {t.dtype}")
    if t.dtype != q.dtype and not (float32_with_half and q.dtype in _HALF and t.dtype == torch.float32):
        rule = (
            "it must have q's dtype (or float32 when q is float16 or bfloat16)"
            if float32_with_half
            else "all tensor arguments must share one dtype"
        )
        raise TypeError(f"relpos_attention: {name} has dtype {t.dtype} but q has dtype {q.dtype}; {rule}")
    if t.device != q.device:
        raise ValueError(
            f"relpos_attention: {name} is on {t.device} but q is on {q.device}; all tensors must be on one device"
        )


def _check_relpos_backward_args(
    grad_out,
    grad_lse,
    q,
    k,
    v,
    q_pos,
    rel,
    grid,
    sigma,
    threshold,
    span_mode,
    scale,
    out,
    lse,
    bias=None,
    window=None,
    window_border="clip",
    window_right=None,
    window_stride=None,
    window_causal=None,
) -> None:
    """The forward's checks plus those of the backward's own tensors (as
    check_relpos_backward_inputs in csrc/relpos/relpos_checks.cpp)."""
    _check_relpos_args(
        q, k, v, q_pos, rel, grid, sigma, threshold, span_mode, scale, bias, window, window_border,
        window_right, window_stride, window_causal,
    )  # fmt: skip
    B, H, N, _ = q.shape
    shapes = {
        "grad_out": (B, H, N, v.shape[-1]),
        "out": (B, H, N, v.shape[-1]),
        "lse": (B, H, N),
        "grad_lse": (B, H, N),
    }
    for name, t in (("grad_out", grad_out), ("out", out), ("lse", lse), ("grad_lse", grad_lse)):
        if t is None and name == "grad_lse":
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"relpos_attention_backward: {name} must be a tensor, got {type(t).__name__}")
        if name in ("lse", "grad_lse"):
            if t.dtype != lse_dtype(q.dtype):
                raise TypeError(
                    f"relpos_attention_backward: {name} has dtype {t.dtype} but must have "
                    f"{lse_dtype(q.dtype)} (the dtype of the forward's lse for q of dtype {q.dtype})"
                )
            if t.device != q.device:
                raise ValueError(
                    f"relpos_attention: {name} is on {t.device} but q is on {q.device}; "
                    "all tensors must be on one device"
                )
        else:
            _check_like_q(name, t, q)
        if tuple(t.shape) != shapes[name]:
            raise ValueError(f"relpos_attention_backward: {name} must have shape {shapes[name]}, got {tuple(t.shape)}")


# --- torch.compile support -------------------------------------------------


@torch.library.register_fake("posattn::relpos_attention")
def _relpos_attention_fake(
    q, k, v, q_pos, rel, grid, sigma, threshold, span_mode, scale, causal, bias=None, window=None, window_border="clip",
    window_right=None, window_stride=None, window_causal=None,
):  # fmt: skip
    _check_relpos_args(
        q, k, v, q_pos, rel, grid, sigma, threshold, span_mode, scale, bias, window, window_border,
        window_right, window_stride, window_causal,
    )  # fmt: skip
    B, H, N, _ = q.shape
    return q.new_empty(B, H, N, v.shape[-1]), q.new_empty(B, H, N, dtype=lse_dtype(q.dtype))


@torch.library.register_fake("posattn::relpos_attention_backward")
def _relpos_attention_backward_fake(
    grad_out,
    grad_lse,
    q,
    k,
    v,
    q_pos,
    rel,
    grid,
    sigma,
    threshold,
    span_mode,
    scale,
    causal,
    out,
    lse,
    bias=None,
    window=None,
    window_border="clip",
    window_right=None,
    window_stride=None,
    window_causal=None,
):
    _check_relpos_backward_args(
        grad_out,
        grad_lse,
        q,
        k,
        v,
        q_pos,
        rel,
        grid,
        sigma,
        threshold,
        span_mode,
        scale,
        out,
        lse,
        bias,
        window,
        window_border,
        window_right,
        window_stride,
        window_causal,
    )

    # The kernels return contiguous gradients whatever the inputs' strides.
    def like(t):
        return t.new_empty(t.shape) if t is not None else q.new_empty(0)

    return like(q), like(k), like(v), like(q_pos), like(rel), like(sigma), like(bias)


# --- autograd ---------------------------------------------------------------


def _relpos_setup_context(ctx, inputs, output):
    # torch.library fills in the arguments left at their schema defaults.
    q, k, v, q_pos, rel, grid, sigma, threshold, span_mode, scale, causal, bias, *window_args = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, q_pos, rel, sigma, bias, out, lse)
    ctx.args = (grid, threshold, span_mode, scale, causal, tuple(window_args))


def _relpos_backward(ctx, grad_out, grad_lse):
    q, k, v, q_pos, rel, sigma, bias, out, lse = ctx.saved_tensors
    grid, threshold, span_mode, scale, causal, window_args = ctx.args
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    dq, dk, dv, dq_pos, drel, dsigma, dbias = torch.ops.posattn.relpos_attention_backward(
        grad_out,
        grad_lse,
        q,
        k,
        v,
        q_pos,
        rel,
        grid,
        sigma,
        threshold,
        span_mode,
        scale,
        causal,
        out,
        lse,
        bias,
        *window_args,  # window, window_border, window_right, window_stride, window_causal
    )
    return (
        dq,
        dk,
        dv,
        dq_pos if q_pos is not None else None,
        drel if rel is not None else None,
        None,  # grid
        dsigma if sigma is not None else None,
        None,  # threshold
        None,  # span_mode
        None,  # scale
        None,  # causal
        dbias if bias is not None else None,
        None,  # window
        None,  # window_border
        None,  # window_right
        None,  # window_stride
        None,  # window_causal
    )


torch.library.register_autograd("posattn::relpos_attention", _relpos_backward, setup_context=_relpos_setup_context)


def _no_double_backward(op: str):
    """Autograd of a backward operator: refuses a gradient of the gradient, which
    torch would otherwise return as silent zeros (with only a warning)."""

    def backward(ctx, *grads):
        raise RuntimeError(
            f"posattn: double backward (a gradient of the gradient) through {op} is not supported; "
            f"differentiate {op} once (no create_graph=True through it), or use posattn.reference.{op}, "
            "which is differentiable to any order"
        )

    return backward


def _nothing_to_save(ctx, inputs, output):
    pass


for _op in _OPS:
    torch.library.register_autograd(
        f"posattn::{_op}_backward", _no_double_backward(_op), setup_context=_nothing_to_save
    )


# --- apply_maps (orthogonal-power / algebraic encodings) --------------------


def apply_maps(x: torch.Tensor, maps: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    r"""Applies per-token block maps: the algebraic positional encoding ``W^p x``.

    Shapes: B batch, H heads, N tokens, D head dim = A * m (A blocks of size m:
    one per grid axis, or A = 1 with m = D for a sequence or tree), P maps.

    Args:
        x: (B, H, N, D).
        maps: (P, H, A, m, m), e.g. a table of powers ``W^p`` (see
            :mod:`posattn.algebraic`).
        index: int64 (N, A) shared by the batch, or (B, N, A): which map each
            token uses for each block; values in [0, P).

    Returns:
        y (B, H, N, D) with ``y[b, h, n, a m:(a+1) m] = maps[index[(b,) n, a], h, a] @ x[b, h, n, a m:(a+1) m]``.

    Differentiable in ``x`` and ``maps`` (a map's gradient sums over every token
    that uses it). The gathered (B, N, H, m, m) maps are never formed. Index
    values out of range raise ValueError on the CPU; on CUDA they are checked on the device (a
    device-side assertion with the same words, no host synchronisation).
    """
    _check_apply_maps_args(x, maps, index)
    return torch.ops.posattn.apply_maps(x, maps, index)


def _check_apply_maps_args(x, maps, index) -> None:
    """Shape, dtype and device checks, in the order and words of the C++ checks
    (csrc/algebraic/apply_maps_checks.cpp); index values are checked by the operator."""
    for name, t in (("x", x), ("maps", maps), ("index", index)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"apply_maps: {name} must be a tensor, got {type(t).__name__}")
    if x.dim() != 4:
        raise ValueError(f"apply_maps: x must have shape (B, H, N, D), got {tuple(x.shape)}")
    if maps.dim() != 5:
        raise ValueError(f"apply_maps: maps must have shape (P, H, A, m, m), got {tuple(maps.shape)}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"apply_maps: x must be a floating-point tensor, got {x.dtype}")
    if maps.dtype != x.dtype:
        raise TypeError(f"apply_maps: maps has dtype {maps.dtype} but x has dtype {x.dtype}; they must match")
    if index.dtype != torch.int64:
        raise TypeError(f"apply_maps: index must be int64, got {index.dtype}")
    if maps.device != x.device or index.device != x.device:
        raise ValueError(
            f"apply_maps: x ({x.device}), maps ({maps.device}) and index ({index.device}) must be on one device"
        )
    B, H, N, D = x.shape
    P, Hm, A, m, m2 = maps.shape
    if Hm != H:
        raise ValueError(f"apply_maps: maps has {Hm} heads but x has {H} (maps must be (P, H, A, m, m))")
    if m2 != m:
        raise ValueError(f"apply_maps: maps must hold square m x m blocks, got {tuple(maps.shape)}")
    if P < 1 or A < 1 or m < 1:
        raise ValueError(f"apply_maps: maps must have P, A, m >= 1, got {tuple(maps.shape)}")
    if A * m != D:
        raise ValueError(f"apply_maps: A * m = {A} * {m} = {A * m} must equal the head dim D = {D} of x")
    if tuple(index.shape) not in ((N, A), (B, N, A)):
        raise ValueError(f"apply_maps: index must be (N, A) = ({N}, {A}) or (B, N, A), got {tuple(index.shape)}")


@torch.library.register_fake("posattn::apply_maps")
def _apply_maps_fake(x, maps, index):
    _check_apply_maps_args(x, maps, index)
    return x.new_empty(x.shape)


@torch.library.register_fake("posattn::apply_maps_backward")
def _apply_maps_backward_fake(grad_y, x, maps, index, need_x, need_maps):
    _check_apply_maps_args(x, maps, index)
    if not isinstance(grad_y, torch.Tensor):
        raise TypeError(f"apply_maps_backward: grad_y must be a tensor, got {type(grad_y).__name__}")
    if grad_y.shape != x.shape:
        raise ValueError(
            f"apply_maps_backward: grad_y must have the shape of x {tuple(x.shape)}, got {tuple(grad_y.shape)}"
        )
    if grad_y.dtype != x.dtype:
        raise TypeError(f"apply_maps_backward: grad_y has dtype {grad_y.dtype} but x has {x.dtype}")
    if grad_y.device != x.device:
        raise ValueError(f"apply_maps_backward: grad_y must be on {x.device}")
    return (
        x.new_empty(x.shape) if need_x else x.new_empty(0),
        maps.new_empty(maps.shape) if need_maps else x.new_empty(0),
    )


def _apply_maps_setup_context(ctx, inputs, output):
    x, maps, index = inputs
    ctx.save_for_backward(x, maps, index)


def _apply_maps_backward(ctx, grad_y):
    x, maps, index = ctx.saved_tensors
    need_x, need_maps = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    gx, gmaps = torch.ops.posattn.apply_maps_backward(grad_y, x, maps, index, need_x, need_maps)
    return (gx if need_x else None, gmaps if need_maps else None, None)


torch.library.register_autograd("posattn::apply_maps", _apply_maps_backward, setup_context=_apply_maps_setup_context)


def cpu_capability() -> str:
    """The instruction set the CPU kernels run with on this machine: ``"avx512"``
    (x86-64-v4), ``"avx2"`` (x86-64-v3) or ``"base"`` (the build's baseline,
    x86-64-v2 by default). The extension holds the kernels for all three and
    picks the widest this CPU runs; the environment variable
    ``POSATTN_CPU_CAPABILITY`` picks a lower one (read on every call; a set the
    CPU lacks is a ValueError)."""
    return torch.ops.posattn.cpu_capability()
