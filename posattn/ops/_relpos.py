"""``posattn.ops.relpos_attention``: the wrapper of ``torch.ops.posattn.relpos_attention``
(with what only the wrapper does: NATTEN's window vocabulary, dilation, extra tokens),
its fake kernels for ``torch.compile`` and its autograd (the backward is
``torch.ops.posattn.relpos_attention_backward``, a gradient of it raises)."""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Union

import torch

from .._dilation import dilated_call
from .._extra_tokens import attend_extra, check_extra_tokens, merge_attention
from ..grid import check_dilation_with_span, normalise_grid, window_spec
from ..packed import PackedGrids, check_packed_call
from ._autograd import refuse_double_backward
from ._checks import check_q, check_relpos_args, check_relpos_backward_args, flag_arg, lse_dtype, real_arg
from ._schema import RelposArgs


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
    packed: Optional[PackedGrids] = None,
):
    r"""Positional self-attention with relative embeddings on an n-D grid.

    Shapes: B batch, H heads, N tokens, D head dim, Dv value dim, G grid axes.

    Args:
        q: (B, H, N, D) queries.
        k: (B, H, N, D) keys.
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
        additional_keys: optional (B, H, M, D), M >= 1 (NATTEN's
            ``additional_keys``): extra tokens every query attends to besides
            its window (e.g. global or cross-attention tokens), in the same
            softmax; their logits are ``scale * q_i . k_extra`` (no positional
            term, bias, span or mask). Merged through the log-sum-exp.
        additional_values: (B, H, M, Dv), the values of ``additional_keys``.
        packed: optional :class:`posattn.PackedGrids`: many samples of different
            grids packed along the token axis (NaViT's "Patch n' Pack"); q, k, v,
            q_pos are then (1, H, T, D), T >= ``packed.num_tokens``, and ``grid``
            must be None. Queries attend to the keys of their own sample only, and
            everything positional is the sample's own: the offsets, the span's
            normalisation (``x_d = delta_d / max(n_d(s) - 1, 1)``), the windows and
            their borders, the threshold box and causal order. ``rel`` and ``bias``
            are the tables of ``packed.max_grid`` (U = prod(2 m_d - 1) rows, offset
            ``delta`` at row ``delta + (max_grid - 1)``), shared by the samples.
            Tokens past ``packed.num_tokens`` are tail padding: output 0, lse -inf,
            zero gradients. The result equals a loop of single-grid calls over the
            samples (each with its rows of the tables), except that d rel, d bias
            and d sigma add the samples' sums in sample order (fixed: the backward
            stays deterministic). Not with ``window_dilation`` or extra tokens
            (ValueError). The CPU kernels; on CUDA the fast forward, the fast
            backward (d q, d k, d v, d q_pos) and the fast offset kernel (d rel,
            d bias, d sigma), where they would take a call of the max grid (with
            a span: the offset kernel at float16 / bfloat16 and D <= 64 only, the
            forward and backward elsewhere where the samples' tables on the max
            grid, S x U floats per head, are at most q's T x D, but the float32
            D = 128 3-D forward and the 16-bit D = 128 1-D backward), and the
            general kernels for the rest; bad offsets / shapes on CUDA are
            device-side assertions.

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
    args, dilation, _ = _prepare(
        q, k, v, q_pos, rel, grid, sigma, threshold, span_mode, scale, causal, bias, window, window_border,
        kernel_size, window_stride, window_causal, window_dilation, additional_keys, additional_values, packed,
    )  # fmt: skip
    return_lse = flag_arg("return_lse", return_lse)

    def call(q, k, v, q_pos, rel, bias, sigma, grid):
        return torch.ops.posattn.relpos_attention(
            *args._replace(q=q, k=k, v=v, q_pos=q_pos, rel=rel, bias=bias, sigma=sigma, grid=grid)
        )

    if dilation is not None:
        out, lse = dilated_call(call, q, k, v, q_pos, rel, bias, sigma, args.grid, dilation)
    else:
        out, lse = call(q, k, v, q_pos, rel, bias, sigma, args.grid)
    if additional_keys is not None:
        out, lse = merge_attention(out, lse, *attend_extra(q, additional_keys, additional_values, args.scale))
    return (out, lse) if return_lse else out


def _prepare(
    q, k, v, q_pos=None, rel=None, grid=None, sigma=None, threshold=0.0, span_mode="add", scale=None, causal=False,
    bias=None, window=None, window_border="clip", kernel_size=None, window_stride=None, window_causal=None,
    window_dilation=None, additional_keys=None, additional_values=None, packed=None,
):  # fmt: skip
    """relpos_attention's arguments checked and in the operator's terms: its
    RelposArgs (NATTEN's window vocabulary turned into the schema's window
    arguments), the dilation per axis (None without one), and whether extra tokens
    were given."""
    check_q(q)
    if packed is not None:
        check_packed_call(packed, grid, window_dilation, additional_keys, additional_values)
        grid = packed.max_grid
    grid_list = normalise_grid(grid, q.shape[2], packed=packed is not None)
    spec = window_spec(window, grid_list, kernel_size, window_stride, window_causal, window_dilation)
    left, right, stride, wcausal, dilation = spec if spec is not None else (None,) * 5
    if spec is not None:  # a window beyond the axis is the axis (the op's ints are int64)
        left, right = ([min(w, n - 1) for w, n in zip(ws, grid_list)] for ws in (left, right))
        stride = [min(s, n) for s, n in zip(stride, grid_list)]
    scale = q.shape[-1] ** -0.5 if scale is None else real_arg("scale", scale)
    args = RelposArgs(
        q, k, v, q_pos, rel, grid_list, sigma, real_arg("threshold", threshold), span_mode, scale,
        flag_arg("causal", causal), bias, left, window_border, right, stride, wcausal,
        None if packed is None else packed.offsets, None if packed is None else packed.shapes,
    )  # fmt: skip
    check_relpos_args(args)
    check_extra_tokens(q, v, additional_keys, additional_values)
    if dilation is not None and any(d > 1 for d in dilation):
        check_dilation_with_span(dilation, args.threshold)
    else:
        dilation = None
    return args, dilation, additional_keys is not None


def relpos_plan(*args, backward: bool = False, **kwargs) -> Dict[str, str]:
    """Which kernels :func:`relpos_attention` runs for these arguments (the same,
    positional or by keyword; ``return_lse`` is ignored) on their device, and why,
    without computing anything: the plan the operator follows
    (``torch.ops.posattn.relpos_plan``; csrc/core/relpos_plan.h). ``backward``: the
    plan of the gradients' call instead of the forward's.

    Returns a dict of strings: ``device`` ("cpu" or "cuda"); on the CPU ``isa`` (the
    instruction set, :func:`cpu_capability`), ``forward`` and ``backward`` ("tiled"
    or "window"); on CUDA ``forward`` or ``backward`` ("fast" or "general"), with
    ``backward`` also ``offsets`` (which kernel computes d rel, d bias and d sigma)
    and ``offsets_reason``, ``smem`` (bytes of shared memory per block),
    ``smem_optin`` (the device's opt-in limit per block) and ``layout_class`` (the
    class of fast layouts it takes: "227 KiB (sm_90)", "163 KiB (sm_80)" or "99 KiB
    (sm_86, sm_89)"), ``forward_layout`` / ``backward_layout`` / ``offsets_layout``
    where the fast kernels run (their stages, chunks and bytes), and ``error`` where
    the call cannot run; ``reason`` (why that kernel: the other
    kernel's refusal, or ``POSATTN_CPU_KERNEL`` / ``POSATTN_CUDA_KERNEL``). With
    ``window_dilation``, ``op_calls`` counts the operator's calls (one per sub-grid
    shape) and the plan is that of the first; with ``additional_keys``,
    ``extra_tokens`` says how they are attended; with ``packed``, ``packed_samples``
    and ``window_samples`` count the samples and those the windowed kernels run
    (each sample has its own plan; ``reason`` is the largest sample's). The environment variables are read
    as the operator reads them, on every call.

    Example::

        >>> ops.relpos_plan(q, k, v, grid=[64, 64], window=3)["forward"]
        'window'
    """
    kwargs.pop("return_lse", None)
    if len(args) > 11:  # relpos_attention's positional return_lse
        args = args[:11] + args[12:]
    a, dilation, extra = _prepare(*args, **kwargs)
    if not isinstance(backward, bool):
        raise TypeError(f"relpos_plan: backward must be True or False, got {backward!r}")
    plans = []

    def call(q, k, v, q_pos, rel, bias, sigma, grid):
        plans.append(
            torch.ops.posattn.relpos_plan(
                *a._replace(q=q, k=k, v=v, q_pos=q_pos, rel=rel, bias=bias, sigma=sigma, grid=grid), backward
            )
        )
        B, H, N, _ = q.shape
        return q.new_empty(B, H, N, v.shape[-1]), q.new_empty(B, H, N)

    if dilation is not None:
        dilated_call(call, a.q, a.k, a.v, a.q_pos, a.rel, a.bias, a.sigma, a.grid, dilation)
    else:
        call(a.q, a.k, a.v, a.q_pos, a.rel, a.bias, a.sigma, a.grid)
    plan = dict(line.split(": ", 1) for line in plans[0].splitlines() if line)
    if dilation is not None:
        plan["op_calls"] = str(len(plans))
    if extra:
        plan["extra_tokens"] = "dense products in PyTorch, merged through the log-sum-exp"
    return plan


# --- torch.compile support -------------------------------------------------


@torch.library.register_fake("posattn::relpos_attention")
def _relpos_attention_fake(*args):
    a = RelposArgs(*args)
    check_relpos_args(a)
    B, H, N, _ = a.q.shape
    return a.q.new_empty(B, H, N, a.v.shape[-1]), a.q.new_empty(B, H, N, dtype=lse_dtype(a.q.dtype))


@torch.library.register_fake("posattn::relpos_attention_backward")
def _relpos_attention_backward_fake(*args):
    grad_out, grad_lse, a, out, lse = RelposArgs.from_backward_args(args)
    check_relpos_backward_args(grad_out, grad_lse, a, out, lse)

    # The kernels return contiguous gradients whatever the inputs' strides.
    def like(t):
        return t.new_empty(t.shape) if t is not None else a.q.new_empty(0)

    return like(a.q), like(a.k), like(a.v), like(a.q_pos), like(a.rel), like(a.sigma), like(a.bias)


# --- autograd ---------------------------------------------------------------


def _relpos_setup_context(ctx, inputs, output):
    # torch.library fills in the arguments left at their schema defaults.
    a = RelposArgs(*inputs)
    out, lse = output
    ctx.save_for_backward(a.q, a.k, a.v, a.q_pos, a.rel, a.sigma, a.bias, a.packed_offsets, a.packed_shapes, out, lse)
    ctx.args = a._replace(
        q=None, k=None, v=None, q_pos=None, rel=None, sigma=None, bias=None, packed_offsets=None, packed_shapes=None
    )


def _relpos_backward(ctx, grad_out, grad_lse):
    q, k, v, q_pos, rel, sigma, bias, offsets, shapes, out, lse = ctx.saved_tensors
    a = ctx.args._replace(
        q=q, k=k, v=v, q_pos=q_pos, rel=rel, sigma=sigma, bias=bias, packed_offsets=offsets, packed_shapes=shapes
    )
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    dq, dk, dv, dq_pos, drel, dsigma, dbias = torch.ops.posattn.relpos_attention_backward(
        *a.backward_args(grad_out, grad_lse, out, lse)
    )
    given = {"q_pos": dq_pos, "rel": drel, "sigma": dsigma, "bias": dbias}
    return RelposArgs.gradients(q=dq, k=dk, v=dv, **{n: g for n, g in given.items() if getattr(a, n) is not None})


torch.library.register_autograd("posattn::relpos_attention", _relpos_backward, setup_context=_relpos_setup_context)
refuse_double_backward("relpos_attention")
