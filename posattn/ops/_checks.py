"""The Python twins of the operators' C++ argument checks (csrc/relpos/relpos_checks.cpp,
csrc/apply_maps/apply_maps_checks.cpp): the same checks in the same order and
words, on shapes, dtypes and devices only (no tensor values are read), so that the
wrappers and the fake kernels raise under ``torch.compile`` what the operators
raise. tests/ops/test_fuzz_ops.py checks that both sides agree."""

from __future__ import annotations

import numbers

import torch

from ..grid import WINDOW_BORDERS, axis_ints, normalise_grid, normalise_window, num_offsets, window_spec
from ._schema import RelposArgs

SPAN_MODES = ("add", "multiply")
"""The span modes of relpos_attention: ``add`` (``s -= quad``) and ``multiply`` (``s *= exp(-quad)``)."""
_HALF = (torch.float16, torch.bfloat16)


def real_arg(name: str, value) -> float:
    """A real-number argument as a float; bools, complex numbers, None and strings are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"relpos_attention: {name} must be a real number, got {value!r} ({type(value).__name__})")
    return float(value)


def flag_arg(name: str, value) -> bool:
    """A bool argument; ``causal="no"`` would otherwise read as True."""
    if not isinstance(value, bool):
        raise TypeError(f"relpos_attention: {name} must be True or False, got {value!r} ({type(value).__name__})")
    return value


def check_q(q) -> None:
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"relpos_attention: q must be a tensor, got {type(q).__name__}")
    if q.dim() != 4 or q.shape[2] < 1 or q.shape[3] < 1:
        raise ValueError(
            f"relpos_attention: q must have shape (B, H, N, D) with N >= 1 and D >= 1, got {tuple(q.shape)}"
        )


def check_relpos_args(a: RelposArgs) -> None:
    """Shape, dtype, device and argument checks (no tensor values are read, so this
    also runs on fake tensors under torch.compile). Mirrors check_relpos_inputs
    (relpos_checks.cpp); ``a.causal`` is not checked (the schema's bool)."""
    q, k, v, q_pos, rel, grid, sigma = a.q, a.k, a.v, a.q_pos, a.rel, a.grid, a.sigma
    threshold, span_mode, scale, bias = a.threshold, a.span_mode, a.scale, a.bias
    tensors = {"q": q, "k": k, "v": v, "q_pos": q_pos, "rel": rel, "sigma": sigma, "bias": bias}
    for name, t in tensors.items():
        if (t is not None or name in ("q", "k", "v")) and not isinstance(t, torch.Tensor):
            raise TypeError(f"relpos_attention: {name} must be a tensor, got {type(t).__name__}")
    check_q(q)
    B, H, N, D = q.shape
    if (a.packed_offsets is None) != (a.packed_shapes is None):
        check_packed(a)  # the "given together" error first, as the operator does
    normalise_grid(grid, N, packed=a.packed_offsets is not None)
    check_packed(a)
    for name, t in tensors.items():
        if t is not None:
            check_like_q(name, t, q, float32_with_half=name == "sigma")
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
    check_window(grid, a.window, a.window_right, a.window_stride, a.window_causal)
    if a.window_border not in WINDOW_BORDERS:
        raise ValueError(f'relpos_attention: window_border must be "clip" or "shift", got {a.window_border!r}')
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


def _shape_str(sizes) -> str:
    """Sizes as the C++ checks print them (shape_str.h): ``(2, 3)``, ``(3)``."""
    return "(" + ", ".join(str(int(n)) for n in sizes) + ")"


def check_packed(a: RelposArgs) -> None:
    """The schema's packed_offsets / packed_shapes (as check_relpos_inputs in relpos_checks.cpp):
    int32 on q's device, (S + 1,) and (S, G), q of one batch row; their values are checked by
    the operator."""
    offsets, shapes, q = a.packed_offsets, a.packed_shapes, a.q
    if (offsets is None) != (shapes is None):
        raise ValueError(
            "relpos_attention: packed_offsets and packed_shapes must be given together (got packed_offsets "
            f"{'None' if offsets is None else 'set'}, packed_shapes {'None' if shapes is None else 'set'})"
        )
    if offsets is None:
        return
    for name, t in (("packed_offsets", offsets), ("packed_shapes", shapes)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"relpos_attention: {name} must be a tensor, got {type(t).__name__}")
        if t.dtype != torch.int32:
            raise TypeError(f"relpos_attention: {name} must be int32, got {t.dtype}")
        if t.device != q.device:
            raise ValueError(
                f"relpos_attention: {name} is on {t.device} but q is on {q.device}; all tensors must be on one device"
            )
    G = len(a.grid)
    if shapes.dim() != 2 or shapes.shape[0] < 1 or shapes.shape[1] != G:
        raise ValueError(
            f"relpos_attention: packed_shapes must have shape (S, G) with S >= 1 samples and G = {G} axes (as "
            f"max_grid {_shape_str(a.grid)}), got {_shape_str(shapes.shape)}"
        )
    S = shapes.shape[0]
    if offsets.dim() != 1 or offsets.shape[0] != S + 1:
        raise ValueError(
            f"relpos_attention: packed_offsets must have shape (S + 1,) = ({S + 1},), got {_shape_str(offsets.shape)}"
        )
    if q.shape[0] != 1:
        raise ValueError(
            "relpos_attention: a packed call takes q of shape (1, H, T, D) (the samples are the batch), "
            f"got B = {q.shape[0]}"
        )


def check_window(grid, window, window_right, window_stride, window_causal) -> None:
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


def check_like_q(name: str, t: torch.Tensor, q: torch.Tensor, float32_with_half: bool = False) -> None:
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


def check_relpos_backward_args(grad_out, grad_lse, a: RelposArgs, out, lse) -> None:
    """The forward's checks plus those of the backward's own tensors (as
    check_relpos_backward_inputs in csrc/relpos/relpos_checks.cpp)."""
    check_relpos_args(a)
    q, v = a.q, a.v
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
            check_like_q(name, t, q)
        if tuple(t.shape) != shapes[name]:
            raise ValueError(f"relpos_attention_backward: {name} must have shape {shapes[name]}, got {tuple(t.shape)}")


def check_apply_maps_args(x, maps, index) -> None:
    """Shape, dtype and device checks, in the order and words of the C++ checks
    (csrc/apply_maps/apply_maps_checks.cpp); index values are checked by the operator."""
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


def check_apply_maps_backward_args(grad_y, x, maps, index) -> None:
    """The forward's checks plus grad_y's (apply_maps_backward's C++ checks)."""
    check_apply_maps_args(x, maps, index)
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
