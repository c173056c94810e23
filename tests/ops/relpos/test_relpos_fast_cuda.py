"""The fast kernels of relpos_attention on CUDA (csrc/cuda/relpos_fast_forward.cuh,
relpos_fast_backward.cuh and relpos_fast_offsets.cuh, FlashAttention-2-class: float16 /
bfloat16, D == Dv in {32, 64, 128}, grids of 1-3 axes; q_pos, windows and span thresholds optional;
the forward in float32 through TF32 too, at D = 128 with a term per offset its offset tile in chunks):
the plan gives them every such call under POSATTN_CUDA_KERNEL=auto (the backward where its
shared memory fits, at D = 128 on 3-D grids with its offset tile in chunks (in float32 at D = 64 on
3-D grids, not at D = 128 with a term per offset); the offset kernel after it, or after the general
backward where it does not fit, at every D on 1-3 axes: its rows in chunks where whole ones do
not fit; in float32 not D = 128 on 2-3 axes); the output and lse match the float64
reference and the general path, the gradients the reference, bitwise the same on a
second run; POSATTN_CUDA_KERNEL=fast insists on them (an error where they cannot take a call),
=general avoids them, =tiled (the WMMA tiled kernels, removed on 2026-11-29) is an error. Run on
a GPU machine; skipped cleanly without one."""

import pytest
import torch
from helpers.relpos import make_relpos_inputs, rel_err

from posattn import ops, reference

pytestmark = pytest.mark.cuda

CASES = [
    ([9], dict()),
    ([130], dict(bias=True, causal=True)),  # 3 tiles, the last of 2 queries
    ([9, 12], dict(sigma=True, bias=True)),  # 2 x 2 tiles, tails on both axes
    ([13, 17], dict(sigma=True, span_mode="multiply", causal=True)),
    ([5, 6, 7], dict(sigma=True, bias=True)),
    ([1, 7, 1, 9], dict(bias=True)),  # size-1 axes: the 2-D kernel
    ([6, 5, 9], dict(sigma=True, causal=True)),
    # span boxes and windows: key blocks skipped, masks on the blocks some row keeps only partly
    ([150], dict(sigma=True, threshold=0.6)),
    ([20, 24], dict(sigma=True, bias=True, window=3)),
    (
        [13, 17],
        dict(bias=True, kernel_size=[4, 7], window_stride=[2, 3], window_causal=[True, False], window_border="shift"),
    ),
    ([5, 6, 9], dict(sigma=True, span_mode="multiply", threshold=0.3, window=2, causal=True)),
    # no q_pos: a bias and span through the tables alone; neither (the control's kernels)
    ([70], dict(pos=False, sigma=True, span_mode="multiply", threshold=0.3, bias=True, causal=True)),
    ([9, 12, 5], dict(pos=False, window=2, causal=True)),
]
CALL_ARGS = (
    "span_mode",
    "causal",
    "threshold",
    "window",
    "kernel_size",
    "window_stride",
    "window_causal",
    "window_border",
)


def split(kw):
    """make_relpos_inputs' arguments, the call's."""
    return {k: a for k, a in kw.items() if k not in CALL_ARGS}, {k: a for k, a in kw.items() if k in CALL_ARGS}


@pytest.fixture(autouse=True)
def auto(monkeypatch):
    monkeypatch.delenv("POSATTN_CUDA_KERNEL", raising=False)


@pytest.mark.parametrize("grid,kw", CASES)
@pytest.mark.parametrize("D", [32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fast_forward_matches_reference_and_general(monkeypatch, grid, kw, D, dtype):
    inputs, args = split(kw)
    x = make_relpos_inputs(grid, B=2, H=3, D=D, Dv=D, requires_grad=True, **inputs)
    out_ref, lse_ref = reference.relpos_attention(**x, grid=grid, return_lse=True, **args)
    xc = {k: t.detach().to("cuda", dtype if k != "sigma" else torch.float32).requires_grad_() for k, t in x.items()}
    plan = ops.relpos_plan(**xc, grid=grid, **args)
    assert plan["forward"] == "fast" and plan["reason"] == "the fast kernels take it", plan
    out, lse = ops.relpos_attention(**xc, grid=grid, return_lse=True, **args)
    assert lse.dtype == torch.float32 and out.dtype == dtype
    assert rel_err(out, out_ref) < 2e-2 and rel_err(lse, lse_ref) < 2e-2
    monkeypatch.setenv("POSATTN_CUDA_KERNEL", "general")
    out_g, lse_g = ops.relpos_attention(**xc, grid=grid, return_lse=True, **args)
    assert rel_err(out, out_g) < 2e-2 and rel_err(lse, lse_g) < 2e-2
    monkeypatch.delenv("POSATTN_CUDA_KERNEL")
    g = torch.randn(out_ref.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    want = torch.autograd.grad((out_ref * g).sum() + lse_ref.sum(), list(x.values()))
    got = torch.autograd.grad((out * g.to("cuda", dtype)).sum() + lse.sum(), list(xc.values()))
    for name, a, b in zip(x, got, want):
        assert rel_err(a, b) < 0.05, name
    bplan = ops.relpos_plan(**xc, grid=grid, backward=True, **args)
    terms = "q_pos" in x or "bias" in x or "sigma" in x
    assert bplan["backward"] == "fast", bplan  # (16-bit D = 128 on 3-D grids: its offset tile in chunks)
    if terms:  # (the fast offset kernel after the fast or the general backward)
        assert bplan["offsets"] == "fast", bplan
    else:
        assert "offsets" not in bplan, bplan  # (nothing per offset to differentiate)
    out, lse = ops.relpos_attention(**xc, grid=grid, return_lse=True, **args)
    again = torch.autograd.grad((out * g.to("cuda", dtype)).sum() + lse.sum(), list(xc.values()))
    for name, a, b in zip(x, again, got):
        assert torch.equal(a, b), name  # deterministic: bitwise the same


@pytest.mark.parametrize("grid,kw", [CASES[i] for i in (1, 2, 4, 9, 11, 12)])
@pytest.mark.parametrize("D", [32, 64, 128])
def test_fast_forward_in_float32_through_tf32(monkeypatch, grid, kw, D):
    """float32 with TF32 allowed: the fast forward (at D = 128 with a term per offset its offset tile in
    chunks) and the fast backward where it fits (not D = 128 with a term per offset on 2-3 axes, on 1
    in two halves of the gradients' columns; at D = 64 on 3-D grids with one, its offset tile in chunks), d rel, d bias, d sigma from the fast offset kernel
    (at D = 128 on 2-3 axes with q_pos in chunks), deterministic; TF32 not allowed: the general path."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    inputs, args = split(kw)
    x = make_relpos_inputs(grid, B=2, H=3, D=D, Dv=D, requires_grad=True, **inputs)
    out_ref, lse_ref = reference.relpos_attention(**x, grid=grid, return_lse=True, **args)
    xc = {k: t.detach().to("cuda", torch.float32).requires_grad_() for k, t in x.items()}
    terms = "q_pos" in x or "bias" in x or "sigma" in x
    plan = ops.relpos_plan(**xc, grid=grid, **args)
    assert plan["forward"] == "fast", plan
    bplan = ops.relpos_plan(**xc, grid=grid, backward=True, **args)
    fits = not (terms and D == 128 and len([n for n in grid if n > 1]) > 1)
    assert (bplan["backward"] == "fast") == fits, bplan
    if terms:  # (the fast offset kernel in float32, at every D on 1-3 axes)
        assert bplan["offsets"] == "fast", bplan
    out, lse = ops.relpos_attention(**xc, grid=grid, return_lse=True, **args)
    assert rel_err(out, out_ref) < 5e-3 and rel_err(lse, lse_ref) < 5e-3  # (TF32: 10 mantissa bits)
    g = torch.randn(out_ref.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    want = torch.autograd.grad((out_ref * g).sum() + lse_ref.sum(), list(x.values()))
    got = torch.autograd.grad((out * g.to("cuda", torch.float32)).sum() + lse.sum(), list(xc.values()))
    for name, a, b in zip(x, got, want):
        assert rel_err(a, b) < 0.05, name  # (TF32: 10 mantissa bits, summed over the keys)
    out, lse = ops.relpos_attention(**xc, grid=grid, return_lse=True, **args)
    again = torch.autograd.grad((out * g.to("cuda", torch.float32)).sum() + lse.sum(), list(xc.values()))
    for name, a, b in zip(x, again, got):
        assert torch.equal(a, b), name  # deterministic: bitwise the same
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    assert ops.relpos_plan(**xc, grid=grid, **args)["forward"] == "general"


def test_calls_the_fast_forward_does_not_take_go_to_the_general_one():
    x = make_relpos_inputs([8, 8], B=1, H=2, D=64, Dv=64, sigma=True, dtype=torch.bfloat16, device="cuda")
    x["sigma"] = x["sigma"].float()
    assert ops.relpos_plan(**x, grid=[8, 8], threshold=0.2, window=2)["forward"] == "fast"
    nopos = {k: t for k, t in x.items() if k not in ("q_pos", "rel")}
    assert ops.relpos_plan(**nopos, grid=[8, 8], threshold=0.2)["forward"] == "fast"  # (the tables alone)
    x4 = make_relpos_inputs([2, 2, 2, 8], B=1, H=2, D=64, Dv=64, dtype=torch.bfloat16, device="cuda")
    plan4 = ops.relpos_plan(**x4, grid=[2, 2, 2, 8])
    assert plan4["forward"] == "general" and "at most 3 axes" in plan4["reason"], plan4


def test_non_finite_logits(monkeypatch):
    """A NaN query row is NaN (out and lse); a +inf bias gives lse +inf and a NaN row; a
    -inf bias on every offset but one keeps that one; the rest stay finite."""
    x = make_relpos_inputs([6, 6], B=1, H=2, D=32, Dv=32, bias=True, dtype=torch.float16, device="cuda")
    U = x["bias"].shape[1]
    x["q"][0, 1, 7, 3] = float("nan")
    x["bias"][0, U // 2] = float("inf")  # offset 0 in head 0: every query's own key
    out, lse = ops.relpos_attention(**x, grid=[6, 6], return_lse=True)
    assert ops.relpos_plan(**x, grid=[6, 6])["forward"] == "fast"
    assert out[0, 1, 7].isnan().all() and lse[0, 1, 7].isnan()
    assert torch.isfinite(out[0, 1, :7]).all() and torch.isfinite(out[0, 1, 8:]).all()
    assert (lse[0, 0] == float("inf")).all() and out[0, 0].isnan().all()
    x["bias"][0] = float("-inf")
    x["bias"][0, U // 2] = 0.0
    out = ops.relpos_attention(**x, grid=[6, 6])
    torch.testing.assert_close(out[0, 0], x["v"][0, 0], rtol=0, atol=0)


@pytest.mark.parametrize(
    "grid,kw",
    [
        ([40, 40], dict(sigma=True, bias=True)),  # 81 tile offsets per head, 8 overlapping each
        ([12, 12, 16], dict(sigma=True, span_mode="multiply", bias=True)),  # 3-D: up to 26 neighbours
        ([700], dict(bias=True, causal=True)),  # 1-D: 21 tile offsets per head
    ],
)
def test_fast_offset_kernel_orders_its_adds(monkeypatch, grid, kw):
    """The fast offset kernel's blocks add overlapping boxes into d rel / d bias in a fixed item
    order, each waiting for the items taken before it (no atomic adds). With many blocks at once
    (every SM busy, neighbours finishing in any order) a lost or reordered add would show: d rel,
    d bias, d sigma match the general path's and are bitwise the same over five runs."""
    inputs, args = split(kw)
    x = make_relpos_inputs(grid, B=3, H=4, D=32, Dv=32, requires_grad=True, **inputs)
    xc = {k: t.detach().to("cuda", torch.bfloat16 if k != "sigma" else torch.float32) for k, t in x.items()}
    assert ops.relpos_plan(**xc, grid=grid, backward=True, **args)["offsets"] == "fast"
    g = torch.randn(*xc["q"].shape[:3], 32, generator=torch.Generator().manual_seed(3)).to("cuda", torch.bfloat16)

    def grads():
        xs = {k: t.clone().requires_grad_() for k, t in xc.items()}
        out, lse = ops.relpos_attention(**xs, grid=grid, return_lse=True, **args)
        names = [k for k in ("rel", "bias", "sigma") if k in xs]
        return dict(zip(names, torch.autograd.grad((out * g).sum() + lse.sum(), [xs[k] for k in names])))

    first = grads()
    for _ in range(4):
        for name, t in grads().items():
            assert torch.equal(t, first[name]), name
    monkeypatch.setenv("POSATTN_CUDA_KERNEL", "general")
    for name, t in grads().items():
        assert rel_err(first[name], t) < 2e-2, name


def test_kernel_choice_is_checked(monkeypatch):
    """POSATTN_CUDA_KERNEL: fast insists on the fast kernels (a ValueError saying why where they
    cannot take the call), tiled is gone (a ValueError saying so), a misspelt value is an error."""
    x = make_relpos_inputs([4, 4], D=64, Dv=64, dtype=torch.float32, device="cuda")
    monkeypatch.setenv("POSATTN_CUDA_KERNEL", "fastest")
    with pytest.raises(ValueError, match="POSATTN_CUDA_KERNEL must be .auto., .general. or .fast., got .fastest."):
        ops.relpos_attention(**x, grid=[4, 4])
    monkeypatch.setenv("POSATTN_CUDA_KERNEL", "tiled")
    with pytest.raises(ValueError, match="the tiled CUDA kernels were removed on 2026-11-29"):
        ops.relpos_attention(**x, grid=[4, 4])
    monkeypatch.setenv("POSATTN_CUDA_KERNEL", "fast")
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    with pytest.raises(ValueError, match="fast kernels cannot take this call: float32 goes through TF32"):
        ops.relpos_attention(**x, grid=[4, 4])
    with pytest.raises(ValueError, match="it takes float16, bfloat16 and"):
        ops.relpos_attention(**{k: t.double() for k, t in x.items()}, grid=[4, 4])
    xh = {k: t.half() for k, t in make_relpos_inputs([4, 4], D=48, Dv=48, device="cuda").items()}
    with pytest.raises(ValueError, match=r"D == Dv in \{32, 64, 128\}"):
        ops.relpos_attention(**xh, grid=[4, 4])
    x4 = {k: t.half() for k, t in make_relpos_inputs([2, 3, 2, 3], D=32, Dv=32, device="cuda").items()}
    with pytest.raises(ValueError, match="grids of at most 3 axes"):
        ops.relpos_attention(**x4, grid=[2, 3, 2, 3])


def test_more_than_three_axes_take_the_general_kernels(monkeypatch):
    """A 4-D grid under auto: the general forward and backward (the fast kernels take 1-3 axes),
    against the float64 reference."""
    grid = [2, 3, 4, 5]
    x = make_relpos_inputs(grid, B=1, H=2, D=32, Dv=32, sigma=True, requires_grad=True)
    out_ref = reference.relpos_attention(**x, grid=grid, threshold=0.5)
    xc = {
        k: t.detach().to("cuda", torch.bfloat16 if k != "sigma" else torch.float32).requires_grad_()
        for k, t in x.items()
    }
    plan = ops.relpos_plan(**xc, grid=grid, threshold=0.5, backward=True)
    assert plan["backward"] == "general" and "at most 3 axes" in plan["reason"], plan
    assert plan["offsets"] == "general", plan
    out = ops.relpos_attention(**xc, grid=grid, threshold=0.5)
    assert rel_err(out, out_ref) < 2e-2
    g = torch.randn(out_ref.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    want = torch.autograd.grad((out_ref * g).sum(), list(x.values()))
    got = torch.autograd.grad((out * g.to("cuda", torch.bfloat16)).sum(), list(xc.values()))
    for name, a, b in zip(x, got, want):
        assert rel_err(a, b) < 0.05, name


@pytest.mark.parametrize(
    "optin,grid,D,cls,fast",
    [
        # an RTX 30 / 40's, A10's, L4's 99 KiB: 16-bit D = 64 on 1-D grids runs every kernel fast in the
        # small layouts (one stage, chunks), on 2-D grids too (the backward's dS', P in the positional
        # buffers, q_pos in registers; the offset kernel's d rel accumulators in registers); 3-D too
        # (the backward's operands in chunks; the offset kernel's 48 accumulator registers, q_pos in chunks)
        (101376, [150], 64, "99 KiB (sm_86, sm_89, sm_120)", ("fast", "fast", "fast")),
        (101376, [12, 13], 64, "99 KiB (sm_86, sm_89, sm_120)", ("fast", "fast", "fast")),
        (101376, [5, 6, 5], 64, "99 KiB (sm_86, sm_89, sm_120)", ("fast", "fast", "fast")),
        # an A100's 163 KiB: 16-bit D = 64 on 2-D grids, all fast
        (166912, [12, 13], 64, "163 KiB (sm_80)", ("fast", "fast", "fast")),
    ],
)
def test_smaller_devices_layouts(monkeypatch, optin, grid, D, cls, fast):
    """POSATTN_CUDA_SMEM_OPTIN plans as on a device with less shared memory per block: the layouts
    of its class (benchmarks/plan_table.py's table), against the float64 reference, the backward
    bitwise repeatable; a value above the device's or not a number is a ValueError."""
    monkeypatch.setenv("POSATTN_CUDA_SMEM_OPTIN", str(optin))
    x = make_relpos_inputs(grid, B=2, H=3, D=D, Dv=D, sigma=True, bias=True, requires_grad=True)
    args = dict(threshold=0.3, causal=True)
    out_ref, lse_ref = reference.relpos_attention(**x, grid=grid, return_lse=True, **args)
    xc = {
        k: t.detach().to("cuda", torch.bfloat16 if k != "sigma" else torch.float32).requires_grad_()
        for k, t in x.items()
    }
    plan = ops.relpos_plan(**xc, grid=grid, **args)
    bplan = ops.relpos_plan(**xc, grid=grid, backward=True, **args)
    assert plan["layout_class"] == cls and plan["smem_optin"] == str(optin), plan
    assert (plan["forward"], bplan["backward"], bplan["offsets"]) == fast, bplan
    assert int(plan["smem"]) <= optin and int(bplan["smem"]) <= optin, bplan
    out, lse = ops.relpos_attention(**xc, grid=grid, return_lse=True, **args)
    assert rel_err(out, out_ref) < 2e-2 and rel_err(lse, lse_ref) < 2e-2
    g = torch.randn(out_ref.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    want = torch.autograd.grad((out_ref * g).sum() + lse_ref.sum(), list(x.values()))

    def grads():
        o, s = ops.relpos_attention(**xc, grid=grid, return_lse=True, **args)
        return torch.autograd.grad((o * g.to("cuda", torch.bfloat16)).sum() + s.sum(), list(xc.values()))

    got = grads()
    for name, a, b in zip(x, got, want):
        assert rel_err(a, b) < 0.05, name
    for name, a, b in zip(x, grads(), got):
        assert torch.equal(a, b), name
    for bad in ("10000000", "lots", "-5"):
        monkeypatch.setenv("POSATTN_CUDA_SMEM_OPTIN", bad)
        with pytest.raises(ValueError, match="POSATTN_CUDA_SMEM_OPTIN must be a number of bytes"):
            ops.relpos_plan(**xc, grid=grid, **args)
