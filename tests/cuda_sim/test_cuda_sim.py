"""Every CUDA kernel of posattn, run on the simulated GPU (GPGPU-Sim, ../shared/gpusim)
through the torch-free harness (harness.cu) and checked against the float64
reference (posattn.reference): forward output and lse, and every gradient.

Run with ``bash scripts/cuda_sim.sh`` (builds the simulator if needed, then runs
``pytest -m cuda_sim``); skipped, with the reason, where the simulator is not built.
Inputs are rounded to the kernel's dtype first, so the tolerances measure the
kernels' own arithmetic.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, List, Optional

import pytest
import simlib
import torch

from posattn import PackedGrids, reference

pytestmark = [
    pytest.mark.cuda_sim,
    pytest.mark.skipif(simlib.unavailable() is not None, reason=str(simlib.unavailable())),
]

F64, F32, F16, BF16 = torch.float64, torch.float32, torch.float16, torch.bfloat16
# the fast layouts' class of each device the cases plan for (csrc/cuda/relpos_fast_common.cuh)
SMEM_CLASS_NAMES = {
    simlib.SMEM_H100: "227 KiB (sm_90)",
    simlib.SMEM_A100: "163 KiB (sm_80)",
    simlib.SMEM_SM86: "99 KiB (sm_86, sm_89, sm_120)",
}
# error relative to the largest reference value of a tensor
FWD_TOL = {F64: 1e-12, F32: 1e-5, F16: 2e-3, BF16: 1e-2}
GRAD_TOL = {F64: 1e-10, F32: 5e-5, F16: 4e-3, BF16: 2e-2}
TF32_TOL = 4e-3  # float32 inputs through TF32 tensor cores (10 mantissa bits)
TF32_GRAD_TOL = 1e-2


class Case:
    """One relpos_attention call: element type, kernel path, sizes and options."""

    def __init__(
        self,
        name: str,
        dtype: torch.dtype,
        grid: List[int],
        *,
        path: str = "general",
        B: int = 2,
        H: int = 2,
        D: int = 8,
        Dv: Optional[int] = None,
        pos: bool = True,
        sigma: bool = False,
        bias: bool = False,
        threshold: float = 0.0,
        span_mode: str = "add",
        causal: bool = False,
        window=None,
        window_border: str = "clip",
        natten: Optional[tuple] = None,
        backward: bool = True,
        glse: bool = True,
        repeats: int = 1,
        special: Optional[str] = None,
        seed: int = 0,
        scale: Optional[float] = None,
        timing: bool = False,
        smem_optin: int = simlib.PLAN_SMEM_OPTIN,
        expect: Optional[tuple] = None,
    ):
        self.name, self.dtype, self.grid, self.path = name, dtype, list(grid), path
        self.B, self.H, self.D, self.Dv = B, H, D, D if Dv is None else Dv
        self.pos, self.sigma, self.bias = pos, sigma, bias
        self.threshold, self.span_mode, self.causal = threshold, span_mode, causal
        self.window, self.window_border = window, window_border
        # NATTEN's window vocabulary: (kernel_size, stride, causal), each one value per axis
        self.natten = natten
        self.backward, self.glse, self.repeats, self.special, self.seed = backward, glse, repeats, special, seed
        # what the plan (cuda/relpos_plan.cuh, for the device of simlib.plan_settings) must choose:
        # path "auto" (POSATTN_CUDA_KERNEL=auto): the fast kernels where they take the call, else the
        # general ones (_forward_path, _backward_path, _offsets_kernel)
        self.scale = D**-0.5 if scale is None else scale  # the logits' scale (0 allowed)
        # run in the simulator's timing mode, where a launch's blocks run at once (functional mode
        # runs them one after another): ~10x slower
        self.timing = timing
        # the device the plan is made for (its opt-in shared memory per block) and, on a device
        # other than an H100's, the kernels it must choose: (forward, backward, offsets), each
        # "fast" or "general" (offsets "none" without a term per offset), as test_plan_table.py's
        # table has them; on an H100 the rules below (_forward_path ...) say it
        self.smem_optin, self.expect = smem_optin, expect
        if (smem_optin != simlib.PLAN_SMEM_OPTIN) != (expect is not None):
            raise ValueError(f"{name}: a case on another device names the kernels it expects, and only it")

    def __repr__(self):
        return self.name


def _inputs(c: Case) -> Dict[str, torch.Tensor]:
    """Random float64 inputs, already rounded to the case's dtype."""
    g = torch.Generator().manual_seed(c.seed)
    N, U = math.prod(c.grid), math.prod(2 * n - 1 for n in c.grid)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=F64) * scale).to(c.dtype).to(F64)

    x = dict(q=rand(c.B, c.H, N, c.D), k=rand(c.B, c.H, N, c.D), v=rand(c.B, c.H, N, c.Dv))
    if c.pos:
        x["q_pos"] = rand(c.B, c.H, N, c.D)
        x["rel"] = rand(c.H, U, c.D, scale=0.7)
    if c.bias:
        x["bias"] = rand(c.H, U, scale=0.8)
    if c.sigma:
        x["sigma"] = 0.15 + 0.6 * torch.rand(c.H, len(c.grid), generator=g, dtype=F64)
    if c.special == "nanrow":  # one NaN query row, windowed: how far does it reach in the backward?
        x["q"][0, 0, 1, 0] = float("nan")
    centre = U // 2  # the row of offset 0
    if c.special == "nonfinite":
        # query 1 of batch 0, head 0 gets a NaN logit on every key; every query of head 1 (both
        # batch elements) an +inf logit, through the bias of its own offset; -inf bias masks the
        # offset +1 along the last axis in head 0 and every third offset in head 1
        x["q"][0, 0, 1, 0] = float("nan")
        x["bias"][1, centre] = float("inf")
        x["bias"][0, centre + 1] = float("-inf")
        x["bias"][1, :] = torch.where(torch.arange(U) % 3 == 0, float("-inf"), x["bias"][1, :])
    if c.special == "masked_row":
        # causal, and offset 0 masked by a -inf bias in head 0: the first query keeps no key at all
        # (out 0, lse -inf); the others lose themselves
        x["bias"][0, centre] = float("-inf")
    return x


def _natten_args(c: Case) -> dict:
    """The reference's arguments for a NATTEN-style window (none without one)."""
    if c.natten is None:
        return {}
    kernel, stride, causal = c.natten
    return dict(kernel_size=list(kernel), window_stride=list(stride), window_causal=list(causal))


def _natten_settings(c: Case) -> dict:
    """The harness' window lines of a NATTEN-style window: cells before / after the centre, stride, causal."""
    if c.natten is None:
        return {}
    kernel, stride, causal = c.natten
    return dict(
        window_left=[k // 2 for k in kernel],
        window_right=[k - 1 - k // 2 for k in kernel],
        window_stride=list(stride),
        window_causal=[int(x) for x in causal],
    )


def _reference(c: Case, x: Dict[str, torch.Tensor], scale: float, gout, glse, out_kernel=None):
    """Forward and gradients of sum(out * gout) + sum(lse * glse), in float64.

    The backward of the operator uses the row term D_i = gout_i . out_i - glse_i with
    the *rounded* out it returned (float16 / bfloat16 for half inputs). Its exact
    result is then the gradient of the same loss with glse_i + (D_i - D~_i): the
    reference takes that (given out_kernel), so that the tolerances measure the
    kernels' arithmetic, not the rounding of out that the method builds on."""
    xr = {k: t.clone().requires_grad_() for k, t in x.items()}
    out, lse = reference.relpos_attention(
        **xr,
        grid=c.grid,
        threshold=c.threshold,
        span_mode=c.span_mode,
        scale=scale,
        causal=c.causal,
        return_lse=True,
        window=c.window,
        window_border=c.window_border,
        **_natten_args(c),
    )
    if not c.backward:
        return out.detach(), lse.detach(), {}
    if out_kernel is not None:
        shift = (gout * out.detach()).sum(-1) - (gout * out_kernel.double()).sum(-1)
        glse = glse + torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    loss = (out * gout).nansum() + (lse * glse).masked_fill(~torch.isfinite(lse), 0).sum()
    names = list(xr)
    grads = torch.autograd.grad(loss, [xr[n] for n in names], allow_unused=True)
    return out.detach(), lse.detach(), {n: g for n, g in zip(names, grads)}


def _sanitized(x: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The inputs with NaN and +inf replaced by 0 (-inf stays: a bias of -inf masks its offset).
    A gradient entry that the non-finite inputs do not reach is the same for both."""
    return {k: torch.where(torch.isnan(t) | (t == float("inf")), torch.zeros_like(t), t) for k, t in x.items()}


def _rel_err(name: str, got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest error relative to the reference's largest finite value, after checking
    that NaN and inf sit exactly where the reference has them."""
    got, want = got.double(), want.double()
    gnan, wnan = torch.isnan(got), torch.isnan(want)
    assert torch.equal(gnan, wnan), f"{name}: NaN at {int(gnan.sum())} places, the reference at {int(wnan.sum())}"
    fin = torch.isfinite(want)
    assert torch.equal(fin, torch.isfinite(got)), f"{name}: inf where the reference is finite, or the reverse"
    assert torch.equal(got[torch.isinf(want)], want[torch.isinf(want)]), f"{name}: infinities of the wrong sign"
    if not fin.any():
        return 0.0
    return ((got[fin] - want[fin]).abs().max() / max(1.0, want[fin].abs().max().item())).item()


def _check_nonfinite_gradient(name: str, got: torch.Tensor, want: torch.Tensor, clean: torch.Tensor) -> float:
    """A gradient of a call with NaN / inf inputs: NaN only where the dense reference has NaN
    (it has more: it sums NaN * 0 over masked pairs), and every finite entry equal to the
    gradient of the sanitized call (an entry the bad inputs reach must not be finite)."""
    got = got.double()
    gnan = torch.isnan(got)
    assert not (gnan & ~torch.isnan(want)).any(), (
        f"{name}: NaN at {int((gnan & ~torch.isnan(want)).sum())} places where the reference is finite"
    )
    assert not torch.isinf(got).any(), f"{name}: infinite entries"
    fin = ~gnan
    assert not torch.isnan(clean[fin]).any(), f"{name}: finite where the sanitized call's gradient is NaN"
    if not fin.any():
        return 0.0
    return ((got[fin] - clean[fin]).abs().max() / max(1.0, clean[fin].abs().max().item())).item()


def run_relpos(c: Case, tmp_path: Path):
    """Runs the case on the simulator; returns (case, run, reference results, scale)."""
    N = math.prod(c.grid)
    x = _inputs(c)
    scale = c.scale
    g = torch.Generator().manual_seed(c.seed + 1)
    gout = torch.randn(c.B, c.H, N, c.Dv, generator=g, dtype=F64).to(c.dtype).to(F64)
    acc = F64 if c.dtype == F64 else F32
    glse = (torch.randn(c.B, c.H, N, generator=g, dtype=F64) * (0.5 if c.glse else 0.0)).to(acc).to(F64)
    settings = dict(
        op="relpos",
        **simlib.plan_settings(c.path, c.smem_optin),
        B=c.B,
        H=c.H,
        D=c.D,
        Dv=c.Dv,
        grid=c.grid,
        has_pos=c.pos,
        has_sigma=c.sigma,
        has_bias=c.bias,
        multiply=c.span_mode == "multiply",
        threshold=repr(float(c.threshold)),
        scale=repr(scale),
        causal=c.causal,
        window=None if c.window is None else ([c.window] * len(c.grid) if isinstance(c.window, int) else c.window),
        window_shift=c.window_border == "shift",
        **_natten_settings(c),
        backward=c.backward,
        repeats=c.repeats,
        has_glse=True,
    )
    arrays = {k: (t if k == "sigma" else t.to(c.dtype)) for k, t in x.items()}
    arrays["gout"] = gout.to(c.dtype)
    arrays["glse"] = glse.to(acc)
    run = simlib.run_case(
        simlib.harness(c.dtype, _fast_d(c)),
        tmp_path / "case",
        settings,
        arrays,
        timing=c.timing,
        timeout=3600 if c.timing else 900,
    )
    assert run.returncode == 0 and simlib.ASSERT_PREFIX not in run.output, run.tail()
    out_kernel = run.read("out", c.dtype, (c.B, c.H, N, c.Dv))
    ref = _reference(c, x, scale, gout, glse, out_kernel)
    if c.special in ("nonfinite", "nanrow"):
        ref = ref + (_reference(c, _sanitized(x), scale, gout, glse, out_kernel)[2],)
    return x, run, ref


def _forward_path(c: Case) -> str:
    """The forward the plan must choose for a case: on path "auto" (POSATTN_CUDA_KERNEL=auto)
    the fast forward where it takes the call (csrc/cuda/relpos_plan.cuh, fast_refusal:
    float16 / bfloat16 and float32 through TF32, D == Dv in {32, 64, 128}, at most 3 axes of more
    than one cell; q_pos, windows and thresholds optional), else the general one."""
    axes = [n for n in c.grid if n > 1]
    fast = c.dtype in (F16, BF16, F32) and c.D == c.Dv and c.D in (32, 64, 128) and len(axes) <= 3
    return "fast" if c.path == "auto" and fast else "general"


def _backward_path(c: Case) -> str:
    """The backward the plan must choose: the fast one wherever the fast forward runs (relpos_plan.cuh,
    fast_backward_refusal: on sm_90 every class has a layout, float32 D = 128 with a term per offset
    in two halves of the gradients' columns, with the operands in chunks too on 2-3 axes), else the
    general one."""
    return _forward_path(c)


def _offsets_kernel(c: Case) -> str:
    """The kernel the plan must give d rel, d bias, d sigma: the fast offset kernel where the
    fast kernels take the call (after their backward, or after the general one where theirs does
    not fit) on 1-3 axes: its shared memory fits sm_90 for every type and D (relpos_fast_offsets.cuh,
    offsets_shape: 16-bit D = 128 on 2-3 axes with its rows in chunks; float32 chunked on 3 axes and
    at D = 64 on 2; float32 D = 128 on 2-3 with q_pos in chunks too, on 3 with X in two parts), else
    the general one."""
    if not (c.pos or c.bias or c.sigma):
        return "none"
    axes = len([n for n in c.grid if n > 1])
    call = c.path == "auto" and c.dtype in (F16, BF16, F32) and c.D == c.Dv and c.D in (32, 64, 128)
    return "fast" if call and axes <= 3 else "general"


def check_relpos(c: Case, tmp_path: Path):
    x, run, (out_ref, lse_ref, grads, *clean) = run_relpos(c, tmp_path)
    N = math.prod(c.grid)
    acc = F64 if c.dtype == F64 else F32
    tf32 = c.path == "auto" and c.dtype == F32
    fwd_tol = TF32_TOL if tf32 else FWD_TOL[c.dtype]
    grad_tol = TF32_GRAD_TOL if tf32 else GRAD_TOL[c.dtype]
    out = run.read("out", c.dtype, (c.B, c.H, N, c.Dv))
    lse = run.read("lse", acc, (c.B, c.H, N))
    errors = {"out": _rel_err("out", out, out_ref), "lse": _rel_err("lse", lse, lse_ref)}
    assert errors["out"] < fwd_tol and errors["lse"] < fwd_tol, errors  # (False for a NaN error)
    plan = run.result()  # the kernels the harness ran: the extension's plan for this call
    want = c.expect or (_forward_path(c), _backward_path(c), _offsets_kernel(c))
    assert plan["layout_class"] == SMEM_CLASS_NAMES[c.smem_optin], plan
    assert plan["forward"] == want[0], plan
    if not c.backward:
        return errors
    assert plan["backward"] == want[1], plan
    assert plan["offsets"] == want[2], plan
    U = math.prod(2 * n - 1 for n in c.grid)
    shapes = dict(
        q=(c.B, c.H, N, c.D),
        k=(c.B, c.H, N, c.D),
        v=(c.B, c.H, N, c.Dv),
        q_pos=(c.B, c.H, N, c.D),
        rel=(c.H, U, c.D),
        bias=(c.H, U),
        sigma=(c.H, len(c.grid)),
    )
    for name, want in grads.items():
        dtype = F64 if name == "sigma" else c.dtype
        got = run.read("d" + ("sigma" if name == "sigma" else name), dtype, shapes[name])
        if clean:  # non-finite inputs: see _check_nonfinite_gradient
            errors["d" + name] = _check_nonfinite_gradient("d" + name, got, want, clean[0][name])
        else:
            errors["d" + name] = _rel_err("d" + name, got, want)
    bad = {k: e for k, e in errors.items() if k.startswith("d") and not e < grad_tol}  # NaN errors fail too
    assert not bad, f"gradients off (tolerance {grad_tol}): {errors}"
    if c.repeats > 1:
        assert run.result()["bitwise_equal"] == "1", "the backward is not bitwise reproducible"
    return errors


# Cases CI leaves out (marked cuda_sim_extended; `bash scripts/cuda_sim.sh --all` runs them):
# each checks what CI's cases check too, at another size, type or head dim, and together they
# cost ~7 minutes of CI's 2 cores. Run them after changing a kernel they reach.
EXTENDED = {
    "general-bf16-3d-natten",  # NATTEN windows: general-f32-natten-even-stride, -f64-natten-causal-axis-clip
    "tiled-f16-d32-causal-threshold",  # causal span boxes: tiled-f16-d64-causal-tail, -bf16-d32-3d-shift-causal
    "tiled-tf32-d64-size1-axes",  # TF32 D = 64: tiled-tf32-d64-window-causal; size-1 axes: fast-f16-d32-size1-axes-*
    "tiled-f16-d64-3d-multiply",  # 3-D D = 64: fast-bf16-d64-3d-multiply-causal, fast-f16-d64-3d-offsets-halves
    # B = 2: tiled-bf16-d32-offsets-2d-tiles, -f16-d32-offsets-3d-causal; H = 2: tiled-bf16-d32-1d-long;
    # d lse = 0: a case of the others' random d lse
    "tiled-f16-d32-batches-heads",
    "tiled-f16-d128-2d",  # D = 128 2-D, the offset kernel's rows in chunks: tiled-bf16-d128-everything
    # the fast offset kernel's ordered adds with its blocks running at once (timing mode, ~10 min):
    # the order's logic is test_offset_order.py's; on a GPU, test_relpos_fast_cuda.py's
    "fast-bf16-d32-offsets-concurrent",
    # float32 D = 128 on 1-D: the backward in halves and the offset kernel in chunks, as
    # fast-tf32-d128-1d-chunked-window (which adds windows, causal, a threshold, two heads)
    "fast-tf32-d128-1d-offsets-chunks",
    # (2026-12-04: CI ran past 90 minutes; these are the costliest cases whose code CI's others reach)
    # float32 D = 128 on 2 axes, the fast backward in halves with its operands in chunks of 64
    # columns: fast-tf32-d128-2d-chunked-multiply
    "tiled-tf32-d128-general-backward",
    # float32 D = 64 on 3 axes, the backward's offset tile in chunks: fast-tf32-d64-3d-offsets-chunks
    # (causal), -backward-chunks-nopos; windows and span boxes: fast-tf32-d128-3d-chunked, -d32-*
    "fast-tf32-d64-3d-backward-chunks-window",
    # 16-bit D = 128 on 3 axes, the chunked backward: fast-f16-d128-3d-backward-chunks; windows and
    # causal at D = 128: tiled-bf16-d128-everything
    "fast-bf16-d128-3d-backward-chunks-window",
    # (later that day: a binary's build and first start, ~2 minutes of 2 cores, outweigh its few
    # cases) float16 at D = 64, a binary for these two: causal with a tail tile and a span box at D = 64:
    # fast-bf16-d64-3d-multiply-causal, tiled-bf16-d64-natten-causal-axis; the offset kernel in two
    # halves of d rel's columns (3-D D = 64): its bfloat16 twin fast-bf16-d64-3d-offsets-halves
    "tiled-f16-d64-causal-tail",
    "fast-f16-d64-3d-offsets-halves",
}


def _fast_d(c, packed=False):
    """The head dim of the fast kernels in the harness that runs case `c` (None: the general kernels only)."""
    if packed:
        return c.D if c.path != "general" and c.dtype != F64 and c.D in (32, 64, 128) else None
    return c.D if c.path != "general" else None


def _params(cases, extended=None, packed=False):
    """pytest params of `cases`, those named in `extended` (default EXTENDED) marked cuda_sim_extended,
    each in the xdist group of its harness program (tests/cuda_sim/conftest.py)."""
    extended = EXTENDED if extended is None else extended
    return [
        pytest.param(
            c,
            id=repr(c),
            marks=[pytest.mark.xdist_group(simlib.harness_name(c.dtype, _fast_d(c, packed), packed))]
            + ([pytest.mark.cuda_sim_extended] if c.name in extended else []),
        )
        for c in cases
    ]


GENERAL = [
    # every dtype on 1-D / 2-D / 3-D grids with every feature
    Case("general-f64-1d", F64, [7], sigma=True, bias=True, D=5, Dv=4),
    Case("general-f64-2d-span-threshold", F64, [5, 6], sigma=True, threshold=0.3, D=6, Dv=3),
    Case("general-f64-3d-multiply", F64, [3, 4, 5], sigma=True, span_mode="multiply", threshold=0.2, D=4, B=1),
    Case("general-f64-size1-axes", F64, [1, 6, 1, 5], sigma=True, bias=True, causal=True, D=4, Dv=5),
    Case(
        "general-f64-window-shift-causal",
        F64,
        [9, 7],
        window=[2, 1],
        window_border="shift",
        causal=True,
        bias=True,
        sigma=True,
        threshold=0.5,
        D=4,
        B=1,
    ),
    Case("general-f64-nopos-bias", F64, [4, 5], pos=False, bias=True, sigma=True, span_mode="multiply", D=4),
    Case("general-f32-2d", F32, [6, 5], sigma=True, bias=True, threshold=0.25, D=16, Dv=8),
    Case("general-f32-window-clip", F32, [8, 9], window=2, sigma=True, D=8, B=1),
    Case("general-f32-3d-causal", F32, [3, 3, 4], causal=True, sigma=True, span_mode="multiply", D=8),
    Case("general-f16-2d", F16, [5, 7], sigma=True, bias=True, threshold=0.3, D=16, Dv=8, B=1),
    Case(
        "general-f16-multiply-window",
        F16,
        [7, 6],
        sigma=True,
        span_mode="multiply",
        window=2,
        window_border="shift",
        D=8,
    ),
    Case("general-bf16-1d-causal", BF16, [23], causal=True, bias=True, sigma=True, D=8),
    Case("general-bf16-3d", BF16, [2, 3, 5], sigma=True, threshold=0.4, D=8, Dv=16),
    Case("general-bf16-4d-window", BF16, [2, 3, 2, 4], window=1, bias=True, sigma=True, span_mode="multiply", D=8, B=1),
    Case("general-f16-3d-size1-causal", F16, [4, 1, 5], causal=True, sigma=True, threshold=0.6, D=8, glse=False),
    # loops run more than once: > 128 keys per query (key chunks), D > 128 (column loops),
    # > 2048 offsets (offset blocks take several), several heads and batches
    Case("general-f32-long-1d", F32, [150], sigma=True, bias=True, D=4, Dv=3, H=1),
    Case("general-f64-wide-head", F64, [5, 4], D=130, Dv=129, B=1, H=2, sigma=True),
    Case("general-f32-many-offsets", F32, [6, 7, 9], window=1, bias=True, sigma=True, B=1, H=1, D=4),
    # non-finite logits: NaN rows, +inf logits, rows with every key masked (-inf bias)
    Case("general-f32-nonfinite", F32, [9], bias=True, special="nonfinite", D=4),
    Case("general-f64-masked-row", F64, [4, 5], bias=True, causal=True, special="masked_row", D=4),
    Case("general-f32-nan-row-window", F32, [80], window=2, special="nanrow", B=1, H=1),
    # NATTEN's vocabulary: even kernels, strided query groups, causal axes, both border rules
    Case(
        "general-f32-natten-even-stride",
        F32,
        [9, 10],
        natten=((4, 5), (2, 3), (False, False)),
        window_border="shift",
        sigma=True,
        bias=True,
        B=1,
    ),
    Case("general-f64-natten-causal-axis-clip", F64, [7, 8], natten=((3, 4), (1, 2), (True, False)), bias=True),
    Case(
        "general-bf16-3d-natten",
        BF16,
        [4, 5, 6],
        natten=((2, 3, 4), (2, 1, 3), (False, True, False)),
        window_border="shift",
        sigma=True,
        B=1,
    ),
    Case("general-f64-nonfinite-2d", F64, [3, 4], bias=True, sigma=True, special="nonfinite", D=4),
    # determinism: the backward twice, bit for bit
    Case("general-f32-deterministic", F32, [6, 7], sigma=True, bias=True, repeats=2, D=8, B=1),
    Case("general-bf16-deterministic", BF16, [5, 5], sigma=True, bias=True, threshold=0.3, repeats=2, D=8),
]


@pytest.mark.parametrize("case", _params(GENERAL))
def test_general_path(case, tmp_path):
    check_relpos(case, tmp_path)


# POSATTN_CUDA_KERNEL=auto: the fast kernels, and the general ones where they do not take a call
# or do not fit (the "tiled-" cases are named after the WMMA tiled kernels that took them until
# 2026-11-29, when the fast kernels replaced those)
AUTO = [
    # every input type and head dim; 1-D / 2-D / 3-D / 4-D grids, size-1 axes, every feature
    Case("tiled-bf16-d32-1d-long", BF16, [150], path="auto", D=32, B=1, H=2, sigma=True, bias=True),
    Case(
        "tiled-f16-d32-causal-threshold", F16, [9, 11], path="auto", D=32, sigma=True, threshold=0.3, causal=True, B=1
    ),
    Case("tiled-tf32-d32-multiply", F32, [5, 6], path="auto", D=32, sigma=True, span_mode="multiply", B=1),
    Case(
        "tiled-bf16-d64-shift-window",
        BF16,
        [12, 12],
        path="auto",
        D=64,
        pos=False,
        bias=True,
        window=2,
        window_border="shift",
        B=1,
        H=1,
    ),
    Case(
        "tiled-f16-d64-3d-multiply",
        F16,
        [3, 4, 5],
        path="auto",
        D=64,
        sigma=True,
        threshold=0.2,
        span_mode="multiply",
        B=1,
    ),
    Case("tiled-tf32-d64-size1-axes", F32, [1, 7, 1, 9], path="auto", D=64, bias=True, causal=True, B=1),
    Case(
        "tiled-bf16-d128-everything",
        BF16,
        [7, 9],
        path="auto",
        D=128,
        sigma=True,
        bias=True,
        threshold=0.3,
        window=3,
        causal=True,
        B=1,
        H=1,
    ),
    # (the fast offset kernel with its rows in two chunks of 64 columns, d rel in two halves)
    Case("tiled-f16-d128-2d", F16, [10, 7], path="auto", D=128, sigma=True, B=1, H=1),
    Case("tiled-f16-d32-batches-heads", F16, [8, 8], path="auto", D=32, sigma=True, bias=True, glse=False, B=2, H=2),
    # float32 with D = 128 and a term per offset on 2 axes: the fast forward (its offset tile in
    # chunks), the fast backward with its operands in chunks of 64 columns, in halves (until
    # 2026-12-02 the general one, as the name says), the fast offset kernel (q_pos in chunks too)
    Case(
        "tiled-tf32-d128-general-backward",
        F32,
        [6, 5],
        path="auto",
        D=128,
        sigma=True,
        bias=True,
        B=1,
        H=1,
    ),
    # more than 3 axes: the general kernels under auto
    Case("tiled-bf16-d64-4d", BF16, [2, 2, 3, 3], path="auto", D=64, sigma=True, threshold=0.5, B=1, H=1),
    Case(
        "tiled-f16-d64-causal-tail",
        F16,
        [70],
        path="auto",
        D=64,
        causal=True,
        bias=True,
        sigma=True,
        threshold=0.3,
        B=1,
        H=1,
    ),
    Case(
        "tiled-tf32-d64-window-causal",
        F32,
        [10, 9],
        path="auto",
        D=64,
        bias=True,
        sigma=True,
        threshold=0.3,
        window=3,
        causal=True,
        B=1,
        H=1,
    ),
    Case("tiled-f32-d32-one-tile-nopos", F32, [64], path="auto", D=32, pos=False),
    # windows skip the key chunks outside them; shifted windows at the borders, with causal
    Case("tiled-f16-d32-window-skips", F16, [17, 17], path="auto", D=32, sigma=True, window=1, B=1, H=1),
    Case(
        "tiled-bf16-d32-3d-shift-causal",
        BF16,
        [3, 13, 10],
        path="auto",
        D=32,
        sigma=True,
        threshold=0.4,
        window=2,
        window_border="shift",
        causal=True,
        B=1,
        H=1,
    ),
    # NATTEN's vocabulary on the tiled path: strided groups skip key chunks, even kernels, causal axes
    Case(
        "tiled-f16-d32-natten-stride",
        F16,
        [20, 24],
        path="auto",
        D=32,
        natten=((6, 5), (3, 2), (False, False)),
        window_border="shift",
        sigma=True,
        B=1,
        H=1,
    ),
    Case(
        "tiled-bf16-d64-natten-causal-axis",
        BF16,
        [13, 11],
        path="auto",
        D=64,
        natten=((4, 7), (2, 3), (True, False)),
        window_border="shift",
        bias=True,
        B=1,
        H=1,
    ),
    Case(
        "tiled-f16-d32-1d-natten-causal-stride",
        F16,
        [150],
        path="auto",
        D=32,
        natten=((16,), (8,), (True,)),
        bias=True,
        B=1,
        H=1,
    ),
    # non-finite logits and determinism
    Case("tiled-bf16-d32-nonfinite", BF16, [9], path="auto", D=32, bias=True, special="nonfinite"),
    Case("tiled-f16-d32-nonfinite-2d", F16, [3, 4], path="auto", D=32, bias=True, sigma=True, special="nonfinite"),
    Case("tiled-bf16-d32-masked-row", BF16, [70], path="auto", D=32, bias=True, causal=True, special="masked_row", B=1),
    Case("tiled-f16-d32-nan-row-window", F16, [80], path="auto", D=32, window=2, special="nanrow", B=1, H=1),
    Case("tiled-bf16-d64-deterministic", BF16, [6, 7], path="auto", D=64, sigma=True, bias=True, repeats=2, B=1),
    # the offset kernel (d rel, d bias, d sigma) over several tiles per axis, batch elements and
    # tile offsets: 2 x 2 tiles, 2 x 2 x 1 tiles of 4 x 4 x 4 (a box of 343 offsets), 3 tiles in 1-D
    # with a span box that skips the far tile offsets
    Case(
        "tiled-bf16-d32-offsets-2d-tiles",
        BF16,
        [12, 10],
        path="auto",
        D=32,
        sigma=True,
        bias=True,
        span_mode="multiply",
        repeats=2,
        B=2,
        H=1,
    ),
    Case(
        "tiled-f16-d32-offsets-3d-causal",
        F16,
        [5, 6, 4],
        path="auto",
        D=32,
        sigma=True,
        bias=True,
        causal=True,
        B=2,
        H=1,
    ),
    Case(
        "tiled-bf16-d64-offsets-1d-span",
        BF16,
        [140],
        path="auto",
        D=64,
        sigma=True,
        threshold=0.2,
        bias=True,
        B=2,
        H=1,
    ),
    # the fast forward (POSATTN_CUDA_KERNEL=auto takes it for these; the fast or general backward follows) on
    # what the cases above leave out: 3-D grids with span multiply and causal, D = 128 on 3-D grids
    # (its offset tile in one pipeline stage), several key blocks per tile on every axis
    Case(
        "fast-bf16-d64-3d-multiply-causal",
        BF16,
        [5, 6, 7],
        path="auto",
        D=64,
        sigma=True,
        span_mode="multiply",
        bias=True,
        causal=True,
        B=1,
        backward=False,
    ),
    Case("fast-f16-d128-3d-add", F16, [5, 5, 5], path="auto", D=128, sigma=True, bias=True, B=1, H=1, backward=False),
    # its backward: the fast one with its offset tile in two chunks of 64 columns (the query-major
    # kernel's d q_pos takes them again, last first), then the fast offset kernel with its rows in
    # four chunks of 32 columns, d rel in four quarters; several tiles and key blocks, a window,
    # causal (not repeated: cheaper cases check the backward's determinism); and the tables alone
    Case("fast-f16-d128-3d-backward-chunks", F16, [2, 3, 5], path="auto", D=128, sigma=True, bias=True, B=1, H=1),
    Case(
        "fast-bf16-d128-3d-backward-chunks-window",
        BF16,
        [5, 6, 5],
        path="auto",
        D=128,
        sigma=True,
        threshold=0.4,
        bias=True,
        window=2,
        causal=True,
        B=1,
        H=1,
    ),
    Case(
        "fast-f16-d128-3d-backward-chunks-nopos",
        F16,
        [4, 5, 6],
        path="auto",
        D=128,
        pos=False,
        bias=True,
        sigma=True,
        B=1,
        H=1,
    ),
    Case("fast-bf16-d32-2d-blocks", BF16, [17, 19], path="auto", D=32, sigma=True, span_mode="multiply", B=1, H=1),
    # the same kernel with its 50 blocks (25 tile offsets, 2 heads) running at once: without the
    # waits for the earlier overlapping blocks the adds race (2026-11-29: d bias 0.059 off, d rel
    # 0.016), which functional mode, running one block after another, never shows
    Case(
        "fast-bf16-d32-offsets-concurrent",
        BF16,
        [17, 19],
        path="auto",
        D=32,
        sigma=True,
        bias=True,
        B=1,
        H=2,
        timing=True,
    ),
    # the fast offset kernel in two column halves of d rel (its accumulator for all of D does not
    # fit: D = 64 on 3-D grids, D = 128 on 1-D), and with scale 0 (d bias and d sigma from dA alone)
    Case("fast-f16-d64-3d-offsets-halves", F16, [5, 6, 7], path="auto", D=64, sigma=True, bias=True, B=1, H=1),
    Case("fast-bf16-d64-3d-offsets-halves", BF16, [5, 6, 7], path="auto", D=64, sigma=True, bias=True, B=1, H=1),
    Case(
        "fast-bf16-d128-1d-offsets-halves",
        BF16,
        [70],
        path="auto",
        D=128,
        sigma=True,
        span_mode="multiply",
        bias=True,
        causal=True,
        B=1,
        H=1,
    ),
    Case("fast-f16-d32-scale-zero", F16, [9, 10], path="auto", D=32, sigma=True, bias=True, scale=0.0, B=1, H=1),
    # no q_pos: the bias and span through the offset tables alone (with span multiply, a span box,
    # causal; the offset kernel's d bias and d sigma in one block per tile offset, not two column
    # halves; tiled-bf16-d64-shift-window: a bias and shifted windows in 2-D), and neither (the
    # control's kernels, windows and causal masking on a 3-D grid)
    Case(
        "fast-f16-d128-1d-nopos-multiply",
        F16,
        [70],
        path="auto",
        D=128,
        pos=False,
        sigma=True,
        span_mode="multiply",
        threshold=0.3,
        bias=True,
        causal=True,
        B=1,
        H=2,
    ),
    Case("fast-bf16-d32-3d-nopos-window", BF16, [4, 5, 6], path="auto", D=32, pos=False, window=1, causal=True, B=1),
    # (3-D: 176 columns per warp, the fill's second pass; span add alone: d sigma from the sums of dA)
    Case("fast-f16-d32-3d-nopos-span-add", F16, [4, 4, 5], path="auto", D=32, pos=False, sigma=True, B=1, H=1),
    # no term at D = 128 on a 3-D grid: the control's backward fits (the positional one does not)
    Case("fast-bf16-d128-3d-plain", BF16, [4, 5, 5], path="auto", D=128, pos=False, causal=True, B=1, H=1),
    # span boxes through sigma's own axes (size-1 axes between them), a different box per head
    Case(
        "fast-f16-d32-size1-axes-threshold",
        F16,
        [1, 13, 1, 9],
        path="auto",
        D=32,
        sigma=True,
        bias=True,
        threshold=0.5,
        B=1,
        H=2,
        backward=False,
    ),
    # float32 through TF32 on the fast forward and backward (d rel, d bias, d sigma from the fast
    # offset kernel; the tiled-tf32-* and tiled-f32-* cases above take them too): 1-D tiles and key
    # blocks with a tail, causal, a span box, the backward bitwise repeated; D = 64 on 1 axis with
    # span multiply; 3-D with a window and its offset tile in one stage (forward only: the chunked
    # backward at D = 64 in 3-D has cases of its own below); the control at D = 128; the tables
    # alone with non-finite biases
    Case(
        "fast-tf32-d32-1d-causal-span",
        F32,
        [150],
        path="auto",
        D=32,
        sigma=True,
        bias=True,
        threshold=0.3,
        causal=True,
        B=1,
        H=1,
        repeats=2,
    ),
    Case(
        "fast-tf32-d64-1d-multiply",
        F32,
        [100],
        path="auto",
        D=64,
        sigma=True,
        bias=True,
        span_mode="multiply",
        threshold=0.2,
        B=1,
        H=1,
    ),
    Case("fast-tf32-d64-3d-window", F32, [5, 6, 7], path="auto", D=64, bias=True, window=2, B=1, H=1, backward=False),
    # the fast offset kernel's rows in chunks (csrc/cuda/relpos_fast_offsets.cuh, offsets_shape):
    # float32 D = 32 on 3-D (two chunks of 16 columns, d rel in halves) and D = 64 on 3-D (four
    # chunks, quarters) after the fast backward (at D = 64 its offset tile in four chunks too);
    # D = 128 on 1-D (four chunks of 32, halves) after the general d q, d k, d v (the fast
    # backward does not fit)
    Case(
        "fast-tf32-d32-3d-offsets-chunks",
        F32,
        [5, 6, 7],
        path="auto",
        D=32,
        sigma=True,
        span_mode="multiply",
        bias=True,
        B=1,
        H=1,
    ),
    Case("fast-tf32-d64-3d-offsets-chunks", F32, [3, 5, 6], path="auto", D=64, sigma=True, causal=True, B=1, H=1),
    # the fast backward at float32 D = 64 on 3-D grids: its offset tile's rel rows in four chunks
    # of 16 columns (BwdLayout::kDC), d q_pos taking them again last first; several tiles and key
    # blocks per tile, a window, a span box (not repeated: fast-tf32-d32-1d-causal-span is, at a
    # tenth of the cost); and the tables alone
    Case(
        "fast-tf32-d64-3d-backward-chunks-window",
        F32,
        [5, 6, 5],
        path="auto",
        D=64,
        sigma=True,
        span_mode="multiply",
        threshold=0.4,
        bias=True,
        window=2,
        B=1,
        H=1,
    ),
    Case("fast-tf32-d64-3d-backward-chunks-nopos", F32, [4, 5, 6], path="auto", D=64, pos=False, bias=True, B=1, H=1),
    Case("fast-tf32-d128-1d-offsets-chunks", F32, [70], path="auto", D=128, sigma=True, bias=True, B=1, H=1),
    # float32 D = 128 with a term per offset: the fast forward with q_pos in shared memory and the
    # offset tile in chunks of columns (FwdLayout::shape: on 1 axis K and V in two stages, 4
    # chunks; on 2 one stage, 2 chunks; on 3 one stage, 4 chunks); several query tiles, key
    # blocks per tile, warps that skip a block (windows, span boxes) and tail tiles; the fast
    # backward in two halves of the gradients' columns, its offset tile in chunks (on 1 axis), its
    # operands in chunks too (on 2: 64 columns, on 3: 32)
    Case(
        "fast-tf32-d128-1d-chunked-window",
        F32,
        [150],
        path="auto",
        D=128,
        sigma=True,
        threshold=0.3,
        bias=True,
        window=40,
        causal=True,
        B=1,
        H=2,
    ),
    Case(
        "fast-tf32-d128-2d-chunked-multiply",
        F32,
        [10, 7],
        path="auto",
        D=128,
        sigma=True,
        threshold=0.5,
        span_mode="multiply",
        B=1,
        H=1,
    ),
    # (and its backward with the operands in chunks of 32 columns, in halves; d rel from the offset
    # kernel with q_pos in chunks, X in two parts)
    Case("fast-tf32-d128-3d-chunked", F32, [4, 6, 4], path="auto", D=128, bias=True, window=2, B=1, H=1),
    Case(
        "fast-tf32-d128-2d-chunked-nopos",
        F32,
        [9, 10],
        path="auto",
        D=128,
        pos=False,
        bias=True,
        sigma=True,
        B=1,
        H=1,
        backward=False,
    ),
    # the chunks without q_pos: d bias and d sigma from the tables and the chunked logits alone
    Case(
        "fast-bf16-d128-2d-nopos-chunks",
        BF16,
        [9, 10],
        path="auto",
        D=128,
        pos=False,
        bias=True,
        sigma=True,
        threshold=0.4,
        B=1,
        H=2,
    ),
    Case("fast-tf32-d128-2d-plain", F32, [9, 12], path="auto", D=128, pos=False, causal=True, B=1, H=1),
    Case(
        "fast-tf32-d32-nopos-nonfinite",
        F32,
        [9, 7],
        path="auto",
        D=32,
        pos=False,
        bias=True,
        sigma=True,
        span_mode="multiply",
        special="nonfinite",
    ),
]


# The fast kernels in the layouts of smaller devices (csrc/cuda/relpos_fast_common.cuh: the
# plan picks each kernel's layout by the device's class of shared memory): an A100's 163 KiB and
# the 99 KiB of sm_86 / sm_89 (RTX 30 / 40, A10, L4, L40), each a layout that class 0 (sm_90) does
# not have: fewer stages, the offset tile in chunks, q_pos in shared memory, the control's backward
# in one stage. `expect`: the kernels the plan gives (forward, backward, offsets), as
# test_plan_table.py's table has them (every kernel fast on every device).
SM86, SM80 = simlib.SMEM_SM86, simlib.SMEM_A100
FFF = ("fast", "fast", "fast")


def _on(optin: int, expect: tuple, name: str, dtype: torch.dtype, grid: List[int], **kw) -> Case:
    """A fast-path case planned for a device with `optin` bytes of shared memory per block (B = H = 1
    unless kw says otherwise), expecting the kernels `expect`."""
    return Case(name, dtype, grid, **{"path": "auto", "B": 1, "H": 1, **kw}, smem_optin=optin, expect=expect)


SMALL_DEVICES = [
    # every kernel (forward, d q, d k d v, offsets) in the 99 KiB layouts: the forward in whole rows (one
    # stage of the offset tile), the backward's kernels in one stage and chunks of 32 / 16, the offset
    # kernel's 32 columns of d rel in chunks of 16
    _on(
        SM86,
        FFF,
        "fast-bf16-d64-1d-sm86",
        BF16,
        [150],
        D=64,
        sigma=True,
        bias=True,
        threshold=0.3,
        causal=True,
        repeats=2,
    ),
    _on(SM86, FFF, "fast-bf16-d32-1d-sm86", BF16, [100], D=32, sigma=True, bias=True, window=20, H=2),
    # forwards: the offset tile in chunks, q_pos in registers (two stages of K and V; one, Q and q_pos
    # through the positional buffers) or in shared memory
    # (and their backward: the key-major kernel's P and dS' in the positional buffers, the
    # query-major's dS' box there too, q_pos in registers; the offset kernel with d rel's
    # accumulators in registers, 16 columns a block; on 3-D grids 6 chunks of the tile offset box a
    # warp, q_pos in chunks, the end's sums over the spent positional buffers)
    _on(SM86, FFF, "fast-f16-d32-2d-sm86", F16, [17, 19], D=32, sigma=True, span_mode="multiply", window=3),
    _on(SM86, FFF, "fast-bf16-d32-3d-sm86", BF16, [5, 6, 7], D=32, bias=True),
    _on(SM86, FFF, "fast-bf16-d64-2d-sm86", BF16, [12, 13], D=64, sigma=True, window=2),
    _on(SM86, FFF, "fast-f16-d64-2d-nopos-sm86", F16, [9, 11], D=64, pos=False, sigma=True, bias=True),
    _on(
        SM86,
        FFF,
        "fast-bf16-d64-2d-causal-sm86",
        BF16,
        [17, 12],
        D=64,
        sigma=True,
        bias=True,
        threshold=0.3,
        causal=True,
        H=2,
    ),
    # (the backward with the operands in chunks of 16 columns too, P and dS' in the positional buffers)
    _on(SM86, FFF, "fast-bf16-d64-3d-sm86", BF16, [4, 6, 5], D=64, sigma=True, threshold=0.4, causal=True),
    # (without q_pos: the tables alone through the chunks, one stage of K and V, and two; the offset
    # kernel's d bias and d sigma alone in its 99 KiB 3-D layout)
    _on(
        SM86,
        FFF,
        "fast-bf16-d64-3d-nopos-sm86",
        BF16,
        [5, 6, 5],
        D=64,
        pos=False,
        sigma=True,
        bias=True,
        span_mode="multiply",
    ),
    _on(SM86, FFF, "fast-f16-d32-3d-nopos-sm86", F16, [5, 6, 7], D=32, pos=False, bias=True, window=2),
    # (the backward with the operands in chunks of 32 columns, in halves of the gradients' columns;
    # the offset kernel with d rel's accumulators in registers)
    _on(SM86, FFF, "fast-f16-d128-1d-sm86", F16, [90], D=128, sigma=True, bias=True),
    # (the backward with the operands in chunks of 16, in halves; the offset kernel in 16 columns of
    # d rel a block, q_pos in chunks)
    _on(SM86, FFF, "fast-f16-d128-2d-sm86", F16, [9, 7], D=128, bias=True),
    # (the key-major kernel's P and dS' in turn through the positional buffers; the offset kernel with
    # d rel's accumulators in registers, in chunks)
    _on(SM86, FFF, "fast-tf32-d32-1d-sm86", F32, [100], D=32, sigma=True, span_mode="multiply", bias=True),
    # (q_pos in registers in both kernels, the key-major kernel's lse and rowd rows with it; the offset
    # kernel with q_pos in chunks, X in two parts, d rel's accumulators in registers)
    _on(SM86, FFF, "fast-tf32-d32-2d-sm86", F32, [9, 11], D=32, sigma=True, span_mode="multiply", window=3),
    # (the backward with the operands in chunks of 16 columns, then the offset kernel with q_pos in
    # chunks: X whole, in two parts)
    _on(SM86, FFF, "fast-tf32-d64-1d-sm86", F32, [70], D=64, bias=True),
    _on(SM86, FFF, "fast-tf32-d64-2d-sm86", F32, [9, 7], D=64, sigma=True, bias=True),
    # the control's backward in one stage
    _on(SM86, ("fast", "fast", "none"), "fast-bf16-d128-3d-plain-sm86", BF16, [4, 5, 5], D=128, pos=False, causal=True),
    # (float32: P and dS' in turn through one buffer)
    _on(SM86, ("fast", "fast", "none"), "fast-tf32-d64-2d-plain-sm86", F32, [9, 11], D=64, pos=False, window=3),
    _on(SM86, ("fast", "fast", "none"), "fast-tf32-d64-1d-plain-sm86", F32, [130], D=64, pos=False, causal=True),
    # forwards with K and V in turn through one buffer (of D columns; float32 D = 128 on 3 axes: of
    # D / 2, each in two parts), Q's fragments from the tensor (float32: q_pos's per chunk too)
    _on(SM86, FFF, "fast-bf16-d128-3d-serial-sm86", BF16, [4, 4, 6], D=128, sigma=True, bias=True, causal=True),
    _on(SM86, FFF, "fast-tf32-d128-1d-sm86", F32, [90], D=128, bias=True, causal=True),
    _on(SM86, FFF, "fast-tf32-d128-2d-sm86", F32, [9, 7], D=128, sigma=True, window=3),
    _on(SM86, FFF, "fast-tf32-d128-3d-sm86", F32, [4, 4, 5], D=128, bias=True),
    _on(SM86, FFF, "fast-tf32-d64-3d-sm86", F32, [4, 5, 4], D=64, sigma=True, threshold=0.4),
    # (the offset tile in chunks of 8 columns, one stage of K and V; the backward with the operands in
    # chunks of 8 columns, as the two above; the offset kernel's inputs in chunks of 8 columns too,
    # with 48 registers of d rel's accumulators, X in two parts: float32's 99 KiB 3-D layout)
    _on(SM86, FFF, "fast-tf32-d32-3d-sm86", F32, [5, 4, 6], D=32, sigma=True, window=1),
    # (plain attention in one stage, Q's fragments from the tensor; its backward with the operands in
    # chunks, in halves of the gradients' columns)
    _on(SM86, ("fast", "fast", "none"), "fast-tf32-d128-2d-plain-sm86", F32, [9, 11], D=128, pos=False, causal=True),
    # the A100's: whole rows with fewer stages, or chunks wider than sm_86's
    _on(SM80, FFF, "fast-bf16-d64-2d-sm80", BF16, [12, 13], D=64, sigma=True, bias=True, threshold=0.3, repeats=2),
    _on(SM80, FFF, "fast-f16-d128-2d-sm80", F16, [9, 10], D=128, sigma=True),
    _on(SM80, FFF, "fast-bf16-d64-3d-sm80", BF16, [5, 6, 5], D=64, bias=True, window=1),
    _on(SM80, FFF, "fast-bf16-d32-3d-sm80", BF16, [4, 5, 6], D=32, sigma=True, causal=True),
    _on(SM80, FFF, "fast-bf16-d128-1d-sm80", BF16, [130], D=128, sigma=True, causal=True),
    # (the backward with the operands in chunks of 32 columns, in halves; the offset kernel in 16
    # columns of d rel a block)
    _on(SM80, FFF, "fast-bf16-d128-3d-sm80", BF16, [4, 4, 6], D=128, sigma=True, bias=True),
    _on(SM80, FFF, "fast-tf32-d64-1d-sm80", F32, [100], D=64, sigma=True, bias=True),
    _on(SM80, FFF, "fast-tf32-d32-2d-sm80", F32, [9, 11], D=32, bias=True),
    _on(SM80, FFF, "fast-tf32-d64-3d-sm80", F32, [4, 5, 6], D=64, bias=True),
    # (the backward with P and dS' in the positional buffers)
    _on(SM80, FFF, "fast-tf32-d64-2d-alias-sm80", F32, [9, 11], D=64, sigma=True, bias=True),
    # (one stage of K and V, Q's fragments from the tensor; the offset kernel with d rel's accumulators
    # in registers)
    _on(SM80, FFF, "fast-tf32-d128-1d-sm80", F32, [70], D=128, bias=True, causal=True),
    _on(SM80, FFF, "fast-tf32-d128-3d-sm80", F32, [4, 4, 5], D=128, sigma=True, bias=True),
    # (the offset kernel with q_pos in chunks, X in two parts)
    _on(SM80, FFF, "fast-tf32-d32-3d-alias-sm80", F32, [4, 5, 6], D=32, bias=True, window=1),
    _on(SM80, FFF, "fast-tf32-d128-2d-sm80", F32, [9, 10], D=128, sigma=True),
    # (the control's backward, P and dS' in turn through one buffer)
    _on(SM80, ("fast", "fast", "none"), "fast-tf32-d128-1d-plain-sm80", F32, [100], D=128, pos=False, causal=True),
    _on(SM80, ("fast", "fast", "none"), "fast-tf32-d128-3d-plain-sm80", F32, [4, 5, 6], D=128, pos=False, window=2),
]
AUTO += SMALL_DEVICES
# CI runs the small devices' cases above in part (2026-12-04: its simulated suite took 56 minutes
# of 2 cores): each class's 16-bit and TF32 kernels at D = 32, 64 and 128 on 1-3 axes, with and
# without a term, the layouts' shared ideas (the offset tile and the operands in chunks, one stage,
# K and V in turn, P and dS' in the positional buffers, d rel's accumulators in registers); the
# others (cuda_sim_extended) are each another shape of those layouts. `--all` runs them all: do that
# after changing a layout.
EXTENDED |= {c.name for c in SMALL_DEVICES} - {
    "fast-bf16-d128-3d-serial-sm86",
    "fast-bf16-d128-3d-sm80",
    "fast-bf16-d64-1d-sm86",
    "fast-bf16-d64-2d-sm80",
    "fast-bf16-d64-3d-sm86",
    "fast-f16-d128-2d-sm86",
    "fast-f16-d32-2d-sm86",
    "fast-tf32-d128-1d-sm80",
    "fast-tf32-d128-2d-plain-sm86",
    "fast-tf32-d128-3d-sm86",
    "fast-tf32-d32-3d-sm86",
    "fast-tf32-d64-2d-alias-sm80",
    "fast-tf32-d64-2d-sm86",
}


assert EXTENDED <= {c.name for c in GENERAL + AUTO}, "EXTENDED names a case that is not there"


@pytest.mark.parametrize("case", _params(AUTO))
def test_auto_path(case, tmp_path):
    # check_relpos also checks that the plan chose the kernels the case names
    check_relpos(case, tmp_path)


# ---- packed calls ------------------------------------------------------------------
# Samples of different grids in one call (posattn.PackedGrids): each a call of its own grid, with
# its rows of the max-grid tables; against the float64 reference of the loop of single calls.


class PackedCase:
    """One packed relpos_attention call: its samples' grids, the max grid, tail tokens, options."""

    def __init__(
        self,
        name: str,
        dtype: torch.dtype,
        shapes: List[tuple],
        *,
        max_grid: Optional[List[int]] = None,
        tail: int = 0,
        path: str = "general",
        H: int = 2,
        D: int = 8,
        Dv: Optional[int] = None,
        pos: bool = True,
        sigma: bool = False,
        bias: bool = False,
        threshold: float = 0.0,
        span_mode: str = "add",
        causal: bool = False,
        window=None,
        window_border: str = "clip",
        natten: Optional[tuple] = None,
        repeats: int = 1,
        seed: int = 0,
        smem_optin: int = simlib.PLAN_SMEM_OPTIN,
    ):
        self.name, self.dtype, self.path, self.smem_optin = name, dtype, path, smem_optin
        self.shapes = [tuple(s) for s in shapes]
        self.grid = (
            list(max_grid) if max_grid is not None else [max(s[d] for s in self.shapes) for d in range(len(shapes[0]))]
        )
        self.tail, self.H, self.D, self.Dv = tail, H, D, D if Dv is None else Dv
        self.pos, self.sigma, self.bias = pos, sigma, bias
        self.threshold, self.span_mode, self.causal = threshold, span_mode, causal
        self.window, self.window_border, self.natten = window, window_border, natten
        self.repeats, self.seed = repeats, seed
        self.B, self.backward, self.glse, self.special = 1, True, True, None

    def __repr__(self):
        return self.name

    def packed(self):
        return PackedGrids.from_shapes(self.shapes, max_grid=self.grid)

    @property
    def T(self) -> int:
        return sum(math.prod(s) for s in self.shapes) + self.tail


def _packed_settings(c: PackedCase, offsets=None, shapes=None) -> dict:
    """The harness' lines of a packed case (`offsets` / `shapes`: other values than the case's)."""
    pk = c.packed()
    offsets = pk.offsets.tolist() if offsets is None else offsets
    shapes = [n for s in c.shapes for n in s] if shapes is None else shapes
    return dict(
        op="relpos",
        **simlib.plan_settings(c.path, c.smem_optin),
        B=1,
        H=c.H,
        D=c.D,
        Dv=c.Dv,
        grid=c.grid,
        T=c.T,
        packed_offsets=offsets,
        packed_shapes=shapes,
        has_pos=c.pos,
        has_sigma=c.sigma,
        has_bias=c.bias,
        multiply=c.span_mode == "multiply",
        threshold=repr(float(c.threshold)),
        scale=repr(c.D**-0.5),
        causal=c.causal,
        window=None if c.window is None else ([c.window] * len(c.grid) if isinstance(c.window, int) else c.window),
        window_shift=c.window_border == "shift",
        **_natten_settings(c),
        backward=True,
        repeats=c.repeats,
        has_glse=True,
    )


def _packed_inputs(c: PackedCase) -> Dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(c.seed)
    U = math.prod(2 * n - 1 for n in c.grid)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=F64) * scale).to(c.dtype).to(F64)

    x = dict(q=rand(1, c.H, c.T, c.D), k=rand(1, c.H, c.T, c.D), v=rand(1, c.H, c.T, c.Dv))
    if c.pos:
        x["q_pos"] = rand(1, c.H, c.T, c.D)
        x["rel"] = rand(c.H, U, c.D, scale=0.7)
    if c.bias:
        x["bias"] = rand(c.H, U, scale=0.8)
    if c.sigma:
        x["sigma"] = 0.15 + 0.6 * torch.rand(c.H, len(c.grid), generator=g, dtype=F64)
    return x


def _packed_path(c: PackedCase, offsets: bool = False, backward: bool = False) -> str:
    """The forward (or backward: d q, d k, d v, d q_pos) the plan must give a packed call
    (relpos_plan.cuh, fast_refusal, fast_backward_refusal): the fast one where it takes the call
    alone; with a span through TF32 or at D = 128 (the wide sample tables, relpos_fast_tables.cuh)
    only where S U <= T D, and not the float32 D = 128 3-D forward nor the 16-bit D = 128 1-D
    backward (packed_wide_fits). offsets: d rel, d bias and d sigma, from the fast offset kernel
    wherever the fast forward takes the call, but with a span only at 16-bit D <= 64 (its instances
    elsewhere would spill)."""
    fast = c.dtype in (F16, BF16, F32) and c.D == c.Dv and c.D in (32, 64, 128)
    own = c.dtype in (F16, BF16) and c.D <= 64  # (cuda_fast::packed_span_fits)
    ndim = min(max(len(c.grid), 1), 3)
    spill = c.D == 128 and (
        (c.dtype == F32 and not backward and ndim == 3) or (c.dtype != F32 and backward and ndim == 1)
    )
    wide = not spill and len(c.shapes) * math.prod(2 * m - 1 for m in c.grid) <= c.T * c.D
    fast = fast and (not c.sigma or own or wide)
    fast = fast and (not offsets or not c.sigma or own)
    return "fast" if c.path == "auto" and fast else "general"


def _check_packed_schedule(c: PackedCase, schedule: torch.Tensor):
    """The fast forward's schedule (relpos_packed.cuh, packed_schedule_kernel): every sample ranked
    once, the prefix sums of their tiles in that order, the samples of the most tiles first."""
    S = len(c.shapes)
    prefix, order = schedule[: S + 1].tolist(), schedule[S + 1 :].tolist()
    assert sorted(order) == list(range(S)), order
    tiles = [b - a for a, b in zip(prefix, prefix[1:])]
    assert prefix[0] == 0 and all(t > 0 for t in tiles), prefix
    assert all(a >= b for a, b in zip(tiles, tiles[1:])), f"not the most tiles first: {tiles} (samples {order})"


def check_packed(c: PackedCase, tmp_path: Path):
    x = _packed_inputs(c)
    g = torch.Generator().manual_seed(c.seed + 1)
    gout = torch.randn(1, c.H, c.T, c.Dv, generator=g, dtype=F64).to(c.dtype).to(F64)
    acc = F64 if c.dtype == F64 else F32
    glse = (torch.randn(1, c.H, c.T, generator=g, dtype=F64) * 0.5).to(acc).to(F64)
    arrays = {k: (t if k == "sigma" else t.to(c.dtype)) for k, t in x.items()}
    arrays["gout"] = gout.to(c.dtype)
    arrays["glse"] = glse.to(acc)
    harness = simlib.harness(c.dtype, _fast_d(c, packed=True), packed=True)
    run = simlib.run_case(harness, tmp_path / "case", _packed_settings(c), arrays, timeout=900)
    assert run.returncode == 0 and simlib.ASSERT_PREFIX not in run.output, run.tail()
    out = run.read("out", c.dtype, (1, c.H, c.T, c.Dv))
    lse = run.read("lse", acc, (1, c.H, c.T))
    # the reference of the loop of single calls, its loss shifted as _reference's by the rounding of out
    xr = {k: t.clone().requires_grad_() for k, t in x.items()}
    out_ref, lse_ref = reference.relpos_attention(
        **xr,
        threshold=c.threshold,
        span_mode=c.span_mode,
        scale=c.D**-0.5,
        causal=c.causal,
        return_lse=True,
        window=c.window,
        window_border=c.window_border,
        packed=c.packed(),
        **_natten_args(c),
    )
    shift = (gout * out_ref.detach()).sum(-1) - (gout * out.double()).sum(-1)
    glse_shifted = glse + torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    loss = (out_ref * gout).sum() + (lse_ref * glse_shifted).masked_fill(~torch.isfinite(lse_ref), 0).sum()
    names = list(xr)
    grads = dict(zip(names, torch.autograd.grad(loss, [xr[n] for n in names])))
    errors = {"out": _rel_err("out", out, out_ref.detach()), "lse": _rel_err("lse", lse, lse_ref.detach())}
    plan = run.result()
    assert (plan["forward"], plan["backward"]) == (_packed_path(c), _packed_path(c, backward=True)), plan
    fwd_tol = TF32_TOL if plan["forward"] == "fast" and c.dtype == F32 else FWD_TOL[c.dtype]
    assert errors["out"] < fwd_tol and errors["lse"] < fwd_tol, errors
    if plan["forward"] == "fast":
        _check_packed_schedule(c, run.read("schedule", torch.int32, (2 * len(c.shapes) + 1,)))
    assert plan["offsets"] == (_packed_path(c, offsets=True) if (c.pos or c.bias or c.sigma) else "none"), plan
    for name, want in grads.items():
        got = run.read("d" + name, F64 if name == "sigma" else c.dtype, tuple(x[name].shape))
        errors["d" + name] = _rel_err("d" + name, got, want)
    # (float32's fast backward, and the general one after the fast forward's lse and out: through TF32)
    grad_tol = TF32_GRAD_TOL if plan["forward"] == "fast" and c.dtype == F32 else GRAD_TOL[c.dtype]
    bad = {k: e for k, e in errors.items() if k.startswith("d") and not e < grad_tol}
    assert not bad, f"gradients off (tolerance {grad_tol}): {errors}"
    if c.repeats > 1:
        assert plan["bitwise_equal"] == "1", "the backward is not bitwise reproducible"
    return errors


PACKED = [
    # a max grid larger than every sample, a sample of one row, tail tokens, spans and thresholds
    PackedCase(
        "packed-f64-2d-span-tail",
        F64,
        [(3, 4), (1, 5), (4, 4), (2, 1)],
        max_grid=[5, 6],
        tail=3,
        sigma=True,
        bias=True,
        threshold=0.3,
        D=4,
        Dv=3,
        repeats=2,
    ),
    # windows and causal order in each sample's own grid; a one-token sample
    PackedCase(
        "packed-f32-1d-window-causal", F32, [(7,), (3,), (12,), (1,)], window=2, causal=True, bias=True, sigma=True
    ),
    # 3-D, span multiply, NATTEN's border rule; an axis of the max grid of extent 1 (squeezed out)
    PackedCase(
        "packed-bf16-3d-multiply-shift",
        BF16,
        [(2, 1, 3), (1, 1, 4), (3, 1, 2)],
        sigma=True,
        span_mode="multiply",
        window=[1, 0, 1],
        window_border="shift",
        tail=2,
    ),
    # NATTEN's strided and causal windows per sample, no q_pos (bias only)
    PackedCase(
        "packed-f16-2d-natten-nopos",
        F16,
        [(4, 5), (5, 3), (2, 2)],
        natten=((3, 2), (2, 1), (False, True)),
        pos=False,
        bias=True,
        sigma=True,
        threshold=0.5,
    ),
    # the fast forward and backward with a span (each sample's own tables: its normalisation
    # x = delta / (n(s) - 1), its span box), a max grid past every sample; d rel, d bias, d sigma
    # from the fast offset kernel (each sample's d sigma by its own normalisation)
    PackedCase("packed-bf16-d32-auto", BF16, [(3, 3), (2, 4)], path="auto", D=32, H=1, sigma=True, bias=True, tail=1),
    # ... through TF32 with the wide sample tables (each sample's on the max grid's offsets: the
    # instances have no registers for the own ones' row strides); d rel, d bias, d sigma general
    PackedCase("packed-f32-d32-span-auto", F32, [(3, 3), (2, 4)], path="auto", D=32, H=1, sigma=True, bias=True),
    # (two heads, a max grid past every sample, a threshold box, tail tokens)
    PackedCase(
        "packed-fast-tf32-2d-d32-span-wide",
        F32,
        [(9, 10), (5, 7), (3, 12)],
        max_grid=[10, 12],
        path="auto",
        D=32,
        sigma=True,
        bias=True,
        threshold=0.4,
        tail=2,
    ),
    # ... but not where the wide tables would outgrow q (samples x U = 3 x 79^2 > T x D = 10 x 32): general
    PackedCase(
        "packed-f32-d32-span-tables-past-q",
        F32,
        [(2, 2), (1, 3), (3, 1)],
        max_grid=[40, 40],
        path="auto",
        D=32,
        H=1,
        sigma=True,
    ),
    PackedCase(
        "packed-fast-bf16-2d-span-threshold",
        BF16,
        [(9, 12), (3, 5), (10, 4), (1, 6)],
        max_grid=[11, 12],
        path="auto",
        D=32,
        H=1,
        sigma=True,
        bias=True,
        threshold=0.3,
        tail=3,
    ),
    PackedCase(
        "packed-fast-f16-3d-span-multiply",
        F16,
        [(5, 3, 6), (2, 4, 4), (1, 1, 3)],
        path="auto",
        D=32,
        H=1,
        sigma=True,
        bias=True,  # (d bias: each pair's sums times its sample's span factor)
        span_mode="multiply",
        window=[1, 2, 2],
    ),
    # the fast forward: samples of several query tiles and key blocks (8 x 8 on 2-D grids), one of a
    # cell, a max grid past every sample, windows, tail tokens
    PackedCase(
        "packed-fast-bf16-2d-window",
        BF16,
        [(9, 12), (5, 7), (1, 1), (8, 8), (3, 17)],
        max_grid=[10, 18],
        path="auto",
        D=32,
        bias=True,
        window=3,
        tail=5,
    ),
    # 1-D: samples of 1, 2 and 3 tiles of 64 tokens, causal order in each
    PackedCase(
        "packed-fast-f16-1d-causal", F16, [(70,), (5,), (130,), (1,)], path="auto", D=32, bias=True, causal=True
    ),
    # 3-D through TF32, bias only (no q_pos), NATTEN's border rule; the control (no term) on 2-D, NATTEN's
    # strides (one past a sample's extent: capped by it) and causal axes
    PackedCase(
        "packed-fast-f32-3d-bias-shift",
        F32,
        [(5, 3, 6), (2, 4, 4), (1, 1, 3), (4, 5, 5)],
        path="auto",
        D=32,
        pos=False,
        bias=True,
        window=[1, 2, 1],
        window_border="shift",
        tail=2,
    ),
    # the backward's other layouts: a 99 KiB device's (q_pos in registers, dS' in the positional
    # buffers) at D = 64
    PackedCase(
        "packed-fast-bf16-2d-d64-sm86",
        BF16,
        [(8, 9), (3, 5), (1, 2)],
        path="auto",
        D=64,
        H=1,
        bias=True,
        window=2,
        tail=2,
        smem_optin=simlib.SMEM_SM86,
    ),
    # D = 128: the key-major backward with the sample's grid in shared memory (packed_grid_in_smem),
    # 16-bit with a term and float32 without; float32's positional one with it in registers, in two
    # halves of the gradients' columns
    PackedCase("packed-fast-f16-1d-d128", F16, [(70,), (9,)], path="auto", D=128, H=1, bias=True, window=20, tail=3),
    PackedCase(
        "packed-fast-f16-3d-d128-plain-causal",
        F16,
        [(5, 6, 3), (2, 3, 9), (4, 4, 4)],
        path="auto",
        D=128,
        H=1,
        pos=False,
        causal=True,
        window=[2, 3, 4],
        tail=2,
    ),
    PackedCase(
        "packed-fast-tf32-2d-d128-bias-window",
        F32,
        [(9, 10), (5, 7), (3, 12)],
        path="auto",
        D=128,
        H=1,
        bias=True,
        window=[3, 2],
    ),
    PackedCase("packed-fast-tf32-1d-d128-plain", F32, [(70,), (9,)], path="auto", D=128, H=1, pos=False, tail=1),
    # D = 128 with a span: the wide sample tables (16-bit: the backward's grid in shared memory;
    # float32: in registers); d rel, d bias, d sigma from the general kernels
    PackedCase(
        "packed-fast-f16-2d-d128-span-multiply",
        F16,
        [(7, 9), (4, 5)],
        path="auto",
        D=128,
        sigma=True,
        span_mode="multiply",
        bias=True,
        window=[3, 4],
        tail=1,
    ),
    PackedCase(
        "packed-fast-tf32-2d-d128-span", F32, [(6, 7), (3, 9)], path="auto", D=128, H=1, sigma=True, threshold=0.3
    ),
    # float32 with q_pos at D = 32 (CI's float32 packed case with a term per offset)
    PackedCase(
        "packed-fast-tf32-2d-d32-bias-window",
        F32,
        [(9, 10), (5, 7), (3, 12)],
        path="auto",
        D=32,
        H=1,
        bias=True,
        window=[3, 2],
        tail=1,
    ),
    PackedCase(
        "packed-fast-bf16-2d-plain-natten",
        BF16,
        [(9, 10), (4, 6), (12, 3)],
        path="auto",
        D=32,
        pos=False,
        natten=((3, 5), (2, 4), (True, False)),
        H=1,
    ),
]


# Packed cases CI leaves out (cuda_sim_extended, as EXTENDED): float32 at D = 128, a binary of
# their own (harness_float_fast128_packed, ~5 minutes of CI's 2 cores to build and start); the
# packed D = 128 backward's code with the grid in shared memory: packed-fast-f16-*-d128*; float32's
# packed kernels with a term per offset, the grid in registers: packed-fast-tf32-2d-d32-bias-window
EXTENDED_PACKED = {
    "packed-fast-tf32-2d-d128-bias-window",
    "packed-fast-tf32-1d-d128-plain",
    "packed-fast-tf32-2d-d128-span",
}
assert EXTENDED_PACKED <= {c.name for c in PACKED}, "EXTENDED_PACKED names a case that is not there"


@pytest.mark.parametrize("case", _params(PACKED, EXTENDED_PACKED, packed=True))
def test_packed(case, tmp_path):
    check_packed(case, tmp_path)


@pytest.mark.parametrize(
    "options",
    [dict(bias=True, window=[2, 5], causal=True), dict(sigma=True, threshold=0.4, bias=True, span_mode="multiply")],
    ids=["window-causal", "span"],
)
def test_packed_single_sample_is_the_single_grid_call_bitwise(options, tmp_path):
    """One sample that fills max_grid, on the fast kernels: the very bits of the call on its grid,
    forward, d q, d k, d v, d q_pos (the packed instances' sample geometry, schedule, row offsets
    and, with a span, the sample's own tables against the call's), d rel, d bias and with a span
    d sigma (the fast offset kernel's pairs of the sample, with a span its tables and its grid's
    normalisation)."""
    c = PackedCase("packed-one", BF16, [(9, 12)], path="auto", D=32, **options)
    x = _packed_inputs(c)
    g = torch.Generator().manual_seed(c.seed + 1)
    arrays = {k: (t if k == "sigma" else t.to(c.dtype)) for k, t in x.items()}
    arrays["gout"] = torch.randn(1, c.H, c.T, c.Dv, generator=g, dtype=F64).to(c.dtype)
    arrays["glse"] = (torch.randn(1, c.H, c.T, generator=g, dtype=F64) * 0.5).to(F32)
    packed = dict(_packed_settings(c), repeats=1)
    single = {k: v for k, v in packed.items() if k not in ("T", "packed_offsets", "packed_shapes")}
    runs = [
        simlib.run_case(simlib.harness(c.dtype, c.D, packed=name == "packed"), tmp_path / name, settings, arrays)
        for name, settings in (("packed", packed), ("single", single))
    ]
    for run in runs:
        assert run.returncode == 0 and simlib.ASSERT_PREFIX not in run.output, run.tail()
        plan = run.result()
        assert (plan["forward"], plan["backward"], plan["offsets"]) == ("fast", "fast", "fast"), plan
    names = ("out", "lse", "dq", "dk", "dv") + (("dq_pos", "drel") if c.pos else ())
    names += (("dbias",) if c.bias else ()) + (("dsigma",) if c.sigma else ())
    for name in names:
        assert (runs[0].dir / f"{name}.out.bin").read_bytes() == (runs[1].dir / f"{name}.out.bin").read_bytes(), name


@pytest.mark.parametrize(
    "offsets,shapes,message",
    [
        ([1, 7, 11], None, "packed_offsets must start at 0"),
        ([0, 6, 6], None, "packed_offsets must increase"),
        ([0, 6, 10], [2, 3, 0, 4], "packed_shapes must have extents in [1, max_grid] on every axis"),
        ([0, 6, 10], [2, 3, 1, 5], "packed_shapes must have extents in [1, max_grid] on every axis"),
        ([0, 6, 11], None, "packed_shapes gives a sample another number of tokens than packed_offsets do"),
        ([0, 6, 13], [2, 3, 3, 3], "the packed samples hold more tokens (packed_offsets[-1]) than q has (T)"),
    ],
    ids=["start", "increase", "zero-extent", "past-max-grid", "tokens", "past-T"],
)
def test_packed_values_checked_on_the_device(offsets, shapes, message, tmp_path):
    """Bad packed_offsets / packed_shapes stop the kernels with the CPU check's message (and the
    kernels stay within their tensors meanwhile: the simulator's harness lets them go on)."""
    c = PackedCase("bad-packed", F32, [(2, 3), (2, 2)], max_grid=[3, 4], tail=2, sigma=True, bias=True, D=4)
    x = _packed_inputs(c)
    arrays = {k: (t if k == "sigma" else t.to(c.dtype)) for k, t in x.items()}
    arrays["gout"] = torch.randn(1, c.H, c.T, c.Dv, dtype=F32)
    arrays["glse"] = torch.zeros(1, c.H, c.T, dtype=F32)
    run = simlib.run_case(simlib.harness(c.dtype), tmp_path / "case", _packed_settings(c, offsets, shapes), arrays)
    assert simlib.ASSERT_PREFIX + "relpos_attention: " + message in run.output, run.tail()


@pytest.mark.parametrize(
    "offsets,shapes,message",
    [
        ([0, 6, 11], None, "packed_shapes gives a sample another number of tokens than packed_offsets do"),
        ([0, 6, 10], [2, 3, 1, 5], "packed_shapes must have extents in [1, max_grid] on every axis"),
    ],
    ids=["tokens", "past-max-grid"],
)
def test_packed_values_checked_before_the_fast_forward(offsets, shapes, message, tmp_path):
    """The fast forward's launcher checks them too (its schedule gives a bad sample no tiles)."""
    c = PackedCase("bad-packed-fast", BF16, [(2, 3), (2, 2)], max_grid=[3, 4], tail=2, path="auto", D=32, bias=True)
    x = _packed_inputs(c)
    arrays = {k: t.to(c.dtype) for k, t in x.items()}
    settings = dict(_packed_settings(c, offsets, shapes), backward=False)
    run = simlib.run_case(simlib.harness(c.dtype, c.D, packed=True), tmp_path / "case", settings, arrays)
    assert run.result()["forward"] == "fast", run.tail()
    assert simlib.ASSERT_PREFIX + "relpos_attention: " + message in run.output, run.tail()


def test_harness_of_one_kind_refuses_the_other(tmp_path):
    """A harness binary holds the fast instances of one kind of call (simlib.harness(packed=)): the
    other kind is refused by name (the launchers return cudaErrorNotSupported), not run wrong."""
    c = PackedCase("packed-kind", BF16, [(2, 3), (2, 2)], path="auto", D=32, bias=True)
    x = _packed_inputs(c)
    arrays = {k: t.to(c.dtype) for k, t in x.items()}
    packed = dict(_packed_settings(c), backward=False)
    single = {k: v for k, v in packed.items() if k not in ("T", "packed_offsets", "packed_shapes")}
    for settings, binary, kind in (
        (packed, simlib.harness(BF16, 32), "single-grid"),
        (single, simlib.harness(BF16, 32, packed=True), "packed"),
    ):
        run = simlib.run_case(binary, tmp_path / kind, settings, arrays)
        assert run.returncode != 0 and f"holds the fast kernels of {kind} calls only" in run.output, run.tail()


# ---- apply_maps ------------------------------------------------------------------


class MapsCase:
    """One apply_maps call: sequences (A = 1, a map per position), grids (a map per
    axis and coordinate) or trees (A = 1, a map per node, the index per batch element)."""

    def __init__(
        self,
        name: str,
        dtype: torch.dtype,
        kind: str,
        *,
        B: int = 2,
        H: int = 2,
        N: int = 12,
        m: int = 4,
        grid=None,
        P: Optional[int] = None,
        seed: int = 0,
    ):
        self.name, self.dtype, self.kind, self.B, self.H, self.m, self.seed = name, dtype, kind, B, H, m, seed
        self.grid = grid
        self.N = math.prod(grid) if grid else N
        self.A = len(grid) if grid else 1
        self.P = P if P is not None else (max(grid) if grid else self.N)

    def __repr__(self):
        return self.name

    def index(self, g: torch.Generator) -> torch.Tensor:
        if self.kind == "sequence":
            return torch.arange(self.N).view(self.N, 1)
        if self.kind == "grid":
            coords = torch.stack(torch.meshgrid(*[torch.arange(n) for n in self.grid], indexing="ij"), -1)
            return coords.reshape(self.N, self.A)
        # trees: each batch element its own node numbering (batched index), nodes shared by several tokens
        return torch.randint(0, self.P, (self.B, self.N, 1), generator=g)


def check_apply_maps(c: MapsCase, tmp_path: Path):
    g = torch.Generator().manual_seed(c.seed)
    D = c.A * c.m

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=F64).to(c.dtype).to(F64)

    x, maps, gy = rand(c.B, c.H, c.N, D), rand(c.P, c.H, c.A, c.m, c.m), rand(c.B, c.H, c.N, D)
    index = c.index(g)
    settings = dict(op="apply_maps", B=c.B, H=c.H, N=c.N, P=c.P, A=c.A, m=c.m, batched_index=index.dim() == 3)
    arrays = dict(x=x.to(c.dtype), maps=maps.to(c.dtype), index=index.to(torch.int64), gy=gy.to(c.dtype))
    run = simlib.run_case(simlib.harness(c.dtype), tmp_path / "case", settings, arrays)
    assert run.returncode == 0 and simlib.ASSERT_PREFIX not in run.output, run.tail()
    xr, mr = x.clone().requires_grad_(), maps.clone().requires_grad_()
    y_ref = reference.apply_maps(xr, mr, index)
    gx_ref, gm_ref = torch.autograd.grad((y_ref * gy).sum(), [xr, mr])
    acc = F64 if c.dtype == F64 else F32
    errors = {
        "y": _rel_err("y", run.read("y", c.dtype, x.shape), y_ref),
        "gx": _rel_err("gx", run.read("gx", c.dtype, x.shape), gx_ref),
        "gmaps": _rel_err("gmaps", run.read("gmaps", acc, maps.shape), gm_ref),
    }
    # y and gx round once to the dtype; gmaps stays in the accumulation type
    tol = {"y": FWD_TOL[c.dtype], "gx": FWD_TOL[c.dtype], "gmaps": GRAD_TOL[acc]}
    assert all(errors[k] < tol[k] for k in errors), errors


MAPS = [
    MapsCase("maps-f64-sequence", F64, "sequence", N=13, m=6),
    MapsCase("maps-f32-grid", F32, "grid", grid=[3, 5], m=4),
    MapsCase("maps-f16-grid-3d", F16, "grid", grid=[2, 3, 4], m=2),
    MapsCase("maps-bf16-tree", BF16, "tree", N=11, P=5, m=8),
    MapsCase("maps-f32-tree", F32, "tree", N=9, P=4, m=16, H=1),
    # maps staged in shared memory (shared index, B > 1) and not (too large: A m (m + 1) values over 48 KiB)
    MapsCase("maps-f32-sequence-unstaged", F32, "sequence", N=3, m=112, B=2, H=1),
    MapsCase("maps-f64-grid-one-batch", F64, "grid", grid=[4, 3], m=3, B=1),
    # several threads' loops: B * D > 128 values per block, m^2 A > 128 map entries
    MapsCase("maps-bf16-sequence-wide", BF16, "sequence", N=5, m=40, B=4, H=1),
]


@pytest.mark.parametrize("case", MAPS, ids=repr)
def test_apply_maps(case, tmp_path):
    check_apply_maps(case, tmp_path)


# ---- device-side checks ------------------------------------------------------------


@pytest.mark.parametrize("path", ["general", "fast"])  # (fast: the fast forward's offset tables)
@pytest.mark.parametrize("bad", [0.0, -0.5, float("nan"), float("inf")])
def test_sigma_checked_on_the_device(path, bad, tmp_path):
    """A sigma that is not positive and finite stops the kernel with the CPU kernel's message."""
    c = Case(
        f"bad-sigma-{path}",
        BF16 if path != "general" else F32,
        [5, 4],
        path=path,
        D=32 if path != "general" else 4,
        sigma=True,
        backward=False,
        B=1,
        H=2,
    )
    x = _inputs(c)
    x["sigma"][1, 0] = bad
    settings = dict(
        op="relpos",
        **simlib.plan_settings(c.path),
        B=c.B,
        H=c.H,
        D=c.D,
        Dv=c.Dv,
        grid=c.grid,
        has_pos=True,
        has_sigma=True,
        scale=repr(c.D**-0.5),
    )
    arrays = {k: (t if k == "sigma" else t.to(c.dtype)) for k, t in x.items()}
    run = simlib.run_case(
        simlib.harness(c.dtype, c.D if path != "general" else None), tmp_path / "case", settings, arrays
    )
    assert simlib.ASSERT_PREFIX + "relpos_attention: sigma must be positive and finite everywhere" in run.output, (
        run.tail()
    )


def test_apply_maps_index_checked_on_the_device(tmp_path):
    x = torch.randn(1, 1, 4, 2, dtype=F32)
    maps = torch.randn(3, 1, 1, 2, 2, dtype=F32)
    index = torch.tensor([[0], [1], [3], [2]])  # 3 is out of [0, P)
    settings = dict(op="apply_maps", B=1, H=1, N=4, P=3, A=1, m=2, batched_index=False)
    run = simlib.run_case(
        simlib.harness(F32), tmp_path / "case", settings, dict(x=x, maps=maps, index=index, gy=x.clone())
    )
    assert simlib.ASSERT_PREFIX + "apply_maps: index values must be in [0, P)" in run.output, run.tail()
