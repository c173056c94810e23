"""relpos_attention on CUDA beyond the reference comparisons every device runs
(test_relpos_attention.py): opcheck and compile, CUDA graphs, large shapes, half
precision details, device-side checks, determinism (run on a GPU machine; skipped
cleanly without one)."""

import pytest
import torch
from helpers.relpos import make_relpos_inputs

from posattn import ops, reference

pytestmark = pytest.mark.cuda

# The reference comparisons of every CPU case run on CUDA too (test_relpos_attention.py,
# its device fixture), with the GPU's half-precision cases; these are CUDA's own.


TOL = {torch.float64: 1e-10, torch.float32: 1e-4}


def close(got, want, tol):
    want = want.detach()
    err = (got.detach().double().cpu() - want).abs().max().item()
    assert err <= tol * max(1.0, want.abs().max().item()), err


def test_gradcheck_float64():
    x = make_relpos_inputs([3, 4], sigma=True, requires_grad=True, device="cuda")
    assert torch.autograd.gradcheck(
        lambda q, k, v, q_pos, rel, sigma: ops.relpos_attention(q, k, v, q_pos, rel, [3, 4], sigma, 0.4),
        tuple(x.values()),
    )


def test_opcheck_and_compile():
    x = make_relpos_inputs([4, 5], sigma=True, dtype=torch.float32, device="cuda", requires_grad=True)
    args = (x["q"], x["k"], x["v"], x["q_pos"], x["rel"], [4, 5], x["sigma"], 0.2, "add", 0.5, False)
    torch.library.opcheck(torch.ops.posattn.relpos_attention.default, args)
    f = torch.compile(lambda *a: ops.relpos_attention(*a, grid=[4, 5], sigma=x["sigma"], threshold=0.2), fullgraph=True)
    torch.testing.assert_close(
        f(x["q"], x["k"], x["v"], x["q_pos"], x["rel"]),
        ops.relpos_attention(x["q"], x["k"], x["v"], x["q_pos"], x["rel"], [4, 5], x["sigma"], 0.2),
    )


def test_cuda_graph_capture():
    x = make_relpos_inputs([6, 6], sigma=True, dtype=torch.float32, device="cuda")
    static = {k: t.clone() for k, t in x.items()}
    ops.relpos_attention(**static, grid=[6, 6], threshold=0.3)  # warm-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.relpos_attention(**static, grid=[6, 6], threshold=0.3)
    graph.replay()
    torch.testing.assert_close(out, ops.relpos_attention(**x, grid=[6, 6], threshold=0.3))


# --- shapes past one block of keys and queries, head dims past 48 KiB of shared memory, half
# precision and float32 sigma, device-side checks, determinism, CUDA graphs ---

BIG = [
    # N > 128 and not a multiple of the block; D, Dv = 64 / 128 / 160 / 256, Dv != D
    ([16, 16], dict(sigma=True, threshold=0.2), 64, 64),
    ([300], dict(sigma=True, causal=True, threshold=0.3), 64, 128),
    ([7, 5, 9], dict(sigma=True, span_mode="multiply"), 128, 64),
    ([13, 11], dict(pos=False, sigma=True), 160, 256),
    ([17, 9], dict(pos=False), 32, 48),
    ([12, 12], dict(bias=True, window=2, window_border="shift", causal=True), 64, 64),
]


@pytest.mark.parametrize("grid,kw,D,Dv", BIG)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_large_shapes_match_reference_and_cpu(grid, kw, D, Dv, dtype):
    kw = dict(kw)
    args = dict(
        grid=grid,
        threshold=kw.pop("threshold", 0.0),
        span_mode=kw.pop("span_mode", "add"),
        causal=kw.pop("causal", False),
        window=kw.pop("window", None),
        window_border=kw.pop("window_border", "clip"),
        return_lse=True,
    )
    x = make_relpos_inputs(grid, B=2, H=2, D=D, Dv=Dv, requires_grad=True, **kw)
    xd = {k: t.detach().to(dtype).requires_grad_() for k, t in x.items()}
    xc = {k: t.detach().to("cuda", dtype).requires_grad_() for k, t in x.items()}
    out_ref, lse_ref = reference.relpos_attention(**x, **args)
    out_cpu, lse_cpu = ops.relpos_attention(**xd, **args)
    out, lse = ops.relpos_attention(**xc, **args)
    tol = TOL[dtype]
    close(out, out_ref, tol)
    close(lse, lse_ref, tol)
    close(out, out_cpu.double(), tol)
    g = torch.randn_like(out_ref)
    names = list(x)
    want = torch.autograd.grad((out_ref * g).sum() + lse_ref.sum(), [x[n] for n in names])
    cpu = torch.autograd.grad((out_cpu * g.to(dtype)).sum() + lse_cpu.sum(), [xd[n] for n in names])
    got = torch.autograd.grad((out * g.to("cuda", dtype)).sum() + lse.sum(), [xc[n] for n in names])
    for n, a, b, c in zip(names, got, want, cpu):
        close(a, b, tol * 10)
        close(a, c.double(), tol * 10)


def test_a_kept_logit_of_minus_inf_has_weight_zero():
    # defect 1: quad overflows float32 (sigma 1e-30) so every other key's logit is -inf;
    # the first key a thread saw at -inf turned rows >= 128 into NaN
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 200, 8, generator=g) for _ in range(3))
    sigma = torch.full((1, 1), 1e-30)
    want = ops.relpos_attention(q, k, v, grid=[200], sigma=sigma)
    torch.testing.assert_close(want, v)  # each query keeps only itself
    got = ops.relpos_attention(q.cuda(), k.cuda(), v.cuda(), grid=[200], sigma=sigma.cuda())
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.cpu(), v)


def test_half_inputs_keep_lse_in_float32():
    # defect 2: lse rounded to bf16 made the backward's probabilities sum to != 1 (dv off by ~8%);
    # the reference runs in float64 on the same bf16-rounded inputs, so only the kernel's error counts
    grid = [8, 8]
    x = make_relpos_inputs(grid, B=2, H=2, D=16, Dv=16, sigma=True)
    x["q"] = x["q"] * 16
    x = {k: (t.to(torch.bfloat16) if k != "sigma" else t.float()).double().requires_grad_() for k, t in x.items()}
    xc = {
        k: t.detach().to("cuda", torch.bfloat16 if k != "sigma" else torch.float32).requires_grad_()
        for k, t in x.items()
    }
    out_ref, lse_ref = reference.relpos_attention(**x, grid=grid, return_lse=True)
    out, lse = ops.relpos_attention(**xc, grid=grid, return_lse=True)
    assert lse.dtype == torch.float32 and out.dtype == torch.bfloat16
    gr = torch.randn(out_ref.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    gr = gr.to(torch.bfloat16).double()
    want = dict(zip(x, torch.autograd.grad((out_ref * gr).sum(), list(x.values()))))
    got = dict(zip(xc, torch.autograd.grad((out * gr.to("cuda", torch.bfloat16)).sum(), list(xc.values()))))
    for name in ("v", "k"):
        err = (got[name].double().cpu() - want[name]).abs().max() / want[name].abs().max()
        assert err < 0.02, (name, err.item())


def test_float16_d_sigma_does_not_overflow_with_float32_sigma():
    # defect 10: d sigma ~ sum over pairs of 1 / sigma^3, times a loss scale, exceeds float16's 65504
    grid, loss_scale = [28, 28], 2.0**12  # as GradScaler scales the loss
    x = make_relpos_inputs(grid, B=64, H=1, D=8, Dv=8, pos=False, requires_grad=True)
    x["sigma"] = torch.full((1, 2), 0.02, dtype=torch.float64, requires_grad=True)
    out_ref = reference.relpos_attention(**x, grid=grid, threshold=0.1)
    (want,) = torch.autograd.grad(out_ref.sum() * loss_scale, x["sigma"])
    xc = {
        k: t.detach().to("cuda", torch.float16 if k != "sigma" else torch.float32).requires_grad_()
        for k, t in x.items()
    }
    out = ops.relpos_attention(**xc, grid=grid, threshold=0.1)
    (got,) = torch.autograd.grad(out.float().sum() * loss_scale, xc["sigma"])
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    assert want.abs().max() > 65504  # the case overflows float16
    assert ((got.double().cpu() - want).abs().max() / want.abs().max()) < 0.02


def test_positional_attention_passes_float32_sigma_with_half_inputs():
    from posattn.nn import DifferentiableSpan, PositionalSelfAttention

    attn = PositionalSelfAttention(32, 2, span=DifferentiableSpan(2, 2, threshold=0.1)).cuda().half()
    x = torch.randn(2, 64, 32, device="cuda", dtype=torch.float16)
    attn(x, [8, 8]).float().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in attn.parameters() if p.grad is not None)


def _run_child(code: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("value", ["0.0", "-0.5", "float('nan')", "float('inf')"])
def test_bad_sigma_is_a_device_side_assertion_with_the_cpu_message(value):
    # defect 3: sigma values were never checked on CUDA (silent zeros or NaN)
    code = f"""
import torch, posattn
from posattn import ops
q = torch.randn(1, 2, 12, 4, device="cuda")
sigma = torch.full((2, 2), 0.3, device="cuda")
sigma[1, 0] = {value}
out = ops.relpos_attention(q, q, q, grid=[3, 4], sigma=sigma, threshold=0.2)
torch.cuda.synchronize()
print("NO ERROR", out.isnan().any().item())
"""
    r = _run_child(code)
    assert r.returncode != 0, r.stdout
    assert "sigma must be positive and finite" in r.stderr
    with pytest.raises(ValueError, match="sigma must be positive and finite"):
        ops.relpos_attention(
            torch.randn(1, 2, 12, 4),
            torch.randn(1, 2, 12, 4),
            torch.randn(1, 2, 12, 4),
            grid=[3, 4],
            sigma=torch.tensor([[0.3, 0.3], [float(eval(value)), 0.3]]),
        )


def test_backward_is_bitwise_deterministic():
    # defect 6: float atomics made every gradient vary in its last bits
    grid = [16, 16]
    x = make_relpos_inputs(
        grid, B=4, H=4, D=32, Dv=32, sigma=True, bias=True, dtype=torch.float32, device="cuda", requires_grad=True
    )
    out = ops.relpos_attention(**x, grid=grid, threshold=0.05)
    g = torch.randn_like(out)
    first = torch.autograd.grad(out, list(x.values()), g, retain_graph=True)
    for _ in range(3):
        again = torch.autograd.grad(out, list(x.values()), g, retain_graph=True)
        for a, b in zip(first, again):
            assert torch.equal(a, b)


def test_backward_under_deterministic_algorithms():
    x = make_relpos_inputs([9, 7], sigma=True, bias=True, dtype=torch.float32, device="cuda", requires_grad=True)
    torch.use_deterministic_algorithms(True)
    try:
        out = ops.relpos_attention(**x, grid=[9, 7], threshold=0.2)
        grads = torch.autograd.grad(out.sum(), list(x.values()))
    finally:
        torch.use_deterministic_algorithms(False)
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize(
    "kw",
    [
        dict(sigma=True, bias=True),
        dict(pos=False, sigma=True, causal=True),
        dict(bias=True, window=1, window_border="shift"),
    ],
)
def test_gradcheck_is_reentrant_without_tolerance(kw):
    kw = dict(kw)
    causal, window = kw.pop("causal", False), kw.pop("window", None)
    border = kw.pop("window_border", "clip")
    x = make_relpos_inputs([5, 3], B=1, H=2, D=3, Dv=2, device="cuda", requires_grad=True, **kw)
    names = list(x)

    def f(*ts):
        return ops.relpos_attention(
            **dict(zip(names, ts)),
            grid=[5, 3],
            threshold=0.3 if "sigma" in names else 0.0,
            causal=causal,
            window=window,
            window_border=border,
            return_lse=True,
        )

    assert torch.autograd.gradcheck(f, tuple(x.values()), nondet_tol=0.0)


def test_head_dims_beyond_48k_of_shared_memory():
    # defect 7: fp64 D = Dv = 1280 needs ~53 KB per block in the backward
    x = make_relpos_inputs([4], B=1, H=1, D=1280, Dv=1280, sigma=True, requires_grad=True)
    xc = {k: t.detach().cuda().requires_grad_() for k, t in x.items()}
    out_ref = reference.relpos_attention(**x, grid=[4])
    out = ops.relpos_attention(**xc, grid=[4])
    close(out, out_ref, 1e-10)
    want = torch.autograd.grad(out_ref.sum(), list(x.values()))
    got = torch.autograd.grad(out.sum(), list(xc.values()))
    for a, b in zip(got, want):
        close(a, b, 1e-9)


def test_non_contiguous_inputs_and_empty_batches():
    x = make_relpos_inputs([6, 5], B=2, H=3, D=8, Dv=8, sigma=True, device="cuda")
    qt = x["q"].transpose(2, 3).contiguous().transpose(2, 3)  # same values, other strides
    sig = x["sigma"][:, :1].expand(3, 2)  # expanded: stride 0
    want = ops.relpos_attention(**{**x, "sigma": sig.contiguous()}, grid=[6, 5], threshold=0.2)
    got = ops.relpos_attention(**{**x, "q": qt, "sigma": sig}, grid=[6, 5], threshold=0.2)
    assert not qt.is_contiguous()
    torch.testing.assert_close(got, want)
    for B, H in ((0, 3), (2, 0)):
        e = make_relpos_inputs([6, 5], B=B, H=H, D=8, Dv=8, sigma=True, device="cuda", requires_grad=True)
        out, lse = ops.relpos_attention(**e, grid=[6, 5], threshold=0.2, return_lse=True)
        assert out.shape == (B, H, 30, 8) and lse.shape == (B, H, 30)
        grads = torch.autograd.grad(out.sum() + lse.sum(), list(e.values()), allow_unused=True)
        assert all(g is None or (g == 0).all() for g in grads)


def test_cuda_graph_capture_of_forward_and_backward():
    grid = [10, 10]
    x = make_relpos_inputs(grid, sigma=True, bias=True, dtype=torch.float32, device="cuda", requires_grad=True)
    g = torch.randn(2, 3, 100, 4, device="cuda")

    def step():
        out = ops.relpos_attention(**x, grid=grid, threshold=0.3)
        return torch.autograd.grad(out, list(x.values()), g)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    with torch.no_grad():
        for t in x.values():
            t.mul_(1.1)
        g.mul_(0.9)
    graph.replay()
    for a, b in zip(captured, step()):
        torch.testing.assert_close(a, b)
