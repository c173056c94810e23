"""The tiled tensor-core kernels of relpos_attention on CUDA (float16 / bfloat16,
float32 through TF32, D == Dv in {32, 64, 128}): the forward, and a backward's d rel, d bias,
d sigma (the tiled offset kernel; d q, d k, d v from the general kernels, the tiled backward's
being gone), against the float64 reference and the general CUDA path. Run on a GPU machine;
skipped cleanly without one. POSATTN_CUDA_KERNEL picks the path."""

import pytest
import torch
from helpers.relpos import make_relpos_inputs, rel_err

from posattn import ops, reference

pytestmark = pytest.mark.cuda

CASES = [
    ([9], dict()),
    ([5, 6], dict(sigma=True)),
    ([16, 16], dict(sigma=True, threshold=0.2)),
    ([300], dict(sigma=True, causal=True, threshold=0.3)),  # 5 tiles, the last one partial
    ([7, 5, 9], dict(sigma=True, span_mode="multiply")),
    ([1, 7], dict(bias=True)),
    ([12, 12], dict(pos=False, bias=True, window=2, window_border="shift")),
    ([13, 11], dict(bias=True, sigma=True, threshold=0.3, window=3, causal=True)),
    ([64], dict(pos=False)),
    ([2, 3, 4, 5], dict(sigma=True, threshold=0.5)),
    ([40, 40], dict(sigma=True, window=4)),  # chunks far outside the window are never visited
    # border queries' shifted windows: the key-major backward visits exactly the queries that keep a key
    ([3, 21, 10], dict(sigma=True, threshold=0.4, window=2, window_border="shift", causal=True)),
]


def split(kw):
    kw = dict(kw)
    args = dict(
        threshold=kw.pop("threshold", 0.0),
        span_mode=kw.pop("span_mode", "add"),
        causal=kw.pop("causal", False),
        window=kw.pop("window", None),
        window_border=kw.pop("window_border", "clip"),
    )
    return kw, args


@pytest.mark.parametrize("grid,kw", CASES)
@pytest.mark.parametrize("D", [32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_tiled_forward_matches_reference_and_general_path(monkeypatch, grid, kw, D, dtype):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)  # float32: TF32 tensor cores
    inputs, args = split(kw)
    x = make_relpos_inputs(grid, B=2, H=3, D=D, Dv=D, requires_grad=True, **inputs)
    out_ref, lse_ref = reference.relpos_attention(**x, grid=grid, return_lse=True, **args)
    xc = {k: t.detach().to("cuda", dtype if k != "sigma" else torch.float32).requires_grad_() for k, t in x.items()}
    monkeypatch.setenv("POSATTN_CUDA_KERNEL", "general")
    out_g, lse_g = ops.relpos_attention(**xc, grid=grid, return_lse=True, **args)
    monkeypatch.setenv("POSATTN_CUDA_KERNEL", "tiled")
    if (
        dtype == torch.float32
        and D == 128
        and torch.cuda.get_device_properties(0).shared_memory_per_block_optin < 200_000
    ):
        # float32 with D = 128 needs ~190 KiB of shared memory per block: refused there (auto: the general path)
        with pytest.raises(ValueError, match="bytes of shared memory per block"):
            ops.relpos_attention(**xc, grid=grid, return_lse=True, **args)
        return
    out_t, lse_t = ops.relpos_attention(**xc, grid=grid, return_lse=True, **args)
    assert lse_t.dtype == torch.float32 and out_t.dtype == dtype
    tol = 5e-3 if dtype == torch.float32 else 2e-2  # TF32 rounds operands to 10 mantissa bits
    assert rel_err(out_t, out_ref) < tol and rel_err(lse_t, lse_ref) < tol
    assert rel_err(out_t, out_g) < tol and rel_err(lse_t, lse_g) < tol
    # the backward: the general d q, d k, d v, d q_pos, and d rel, d bias, d sigma from the tiled
    # offset kernel where its shared memory fits (else the general one), against the float64
    # reference and against the general path's backward
    bplan = ops.relpos_plan(**xc, grid=grid, backward=True, **args)
    assert bplan["backward"] == "general" and "there is no tiled one" in bplan["reason"], bplan
    g = torch.randn(out_ref.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    want = torch.autograd.grad((out_ref * g).sum() + lse_ref.sum(), list(x.values()))
    loss = (out_t * g.to("cuda", dtype)).sum() + lse_t.sum()
    got = torch.autograd.grad(loss, list(xc.values()))
    monkeypatch.setenv("POSATTN_CUDA_KERNEL", "general")
    general = torch.autograd.grad((out_g * g.to("cuda", dtype)).sum() + lse_g.sum(), list(xc.values()))
    for name, a, b, c in zip(x, got, want, general):
        assert rel_err(a, b) < 0.05, name
        assert rel_err(a, c) < 0.05, name


def test_auto_picks_the_fast_kernels_where_they_apply(monkeypatch):
    x = make_relpos_inputs([8, 8], B=2, H=2, D=64, Dv=64, sigma=True, dtype=torch.bfloat16, device="cuda")
    x["sigma"] = x["sigma"].float()
    monkeypatch.setenv("POSATTN_CUDA_KERNEL", "tiled")
    bplan = ops.relpos_plan(**x, grid=[8, 8], threshold=0.2, backward=True)
    assert bplan["backward"] == "general" and bplan["offsets"] == "tiled", bplan
    tiled = ops.relpos_attention(**x, grid=[8, 8], threshold=0.2)
    monkeypatch.delenv("POSATTN_CUDA_KERNEL")
    assert ops.relpos_plan(**x, grid=[8, 8], threshold=0.2)["forward"] == "fast"
    assert ops.relpos_plan(**x, grid=[8, 8], threshold=0.2, backward=True)["backward"] == "fast"
    assert rel_err(ops.relpos_attention(**x, grid=[8, 8], threshold=0.2), tiled) < 2e-2


def test_kernel_choice_is_checked(monkeypatch):
    x = make_relpos_inputs([4, 4], D=64, Dv=64, dtype=torch.float32, device="cuda")
    monkeypatch.setenv("POSATTN_CUDA_KERNEL", "fast")
    with pytest.raises(ValueError, match="POSATTN_CUDA_KERNEL must be .auto., .general. or .tiled., got .fast."):
        ops.relpos_attention(**x, grid=[4, 4])
    monkeypatch.setenv("POSATTN_CUDA_KERNEL", "tiled")
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    with pytest.raises(ValueError, match="tiled kernel cannot take this call: float32 goes through TF32"):
        ops.relpos_attention(**x, grid=[4, 4])
    with pytest.raises(ValueError, match="it takes float16, bfloat16 and"):
        ops.relpos_attention(**{k: t.double() for k, t in x.items()}, grid=[4, 4])
    xh = {k: t.half() for k, t in make_relpos_inputs([4, 4], D=48, Dv=48, device="cuda").items()}
    with pytest.raises(ValueError, match=r"D == Dv in \{32, 64, 128\}"):
        ops.relpos_attention(**xh, grid=[4, 4])


def test_nan_and_fully_masked_rows(monkeypatch):
    monkeypatch.setenv("POSATTN_CUDA_KERNEL", "tiled")
    x = make_relpos_inputs([6, 6], B=1, H=2, D=32, Dv=32, dtype=torch.float16, device="cuda")
    x["q"][0, 1, 7, 3] = float("nan")
    out, lse = ops.relpos_attention(**x, grid=[6, 6], return_lse=True)
    assert out[0, 1, 7].isnan().all() and lse[0, 1, 7].isnan()
    assert torch.isfinite(out[0, 0]).all() and torch.isfinite(out[0, 1, :7]).all()


def test_tiled_offset_kernel_is_bitwise_deterministic(monkeypatch):
    monkeypatch.setenv("POSATTN_CUDA_KERNEL", "tiled")
    x = make_relpos_inputs(
        [16, 16], B=2, H=2, D=64, Dv=64, sigma=True, bias=True, dtype=torch.bfloat16, device="cuda", requires_grad=True
    )
    out = ops.relpos_attention(**x, grid=[16, 16], threshold=0.1, window=5)
    g = torch.randn_like(out)
    first = torch.autograd.grad(out, list(x.values()), g, retain_graph=True)
    again = torch.autograd.grad(out, list(x.values()), g)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
