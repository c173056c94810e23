"""relpos_attention on CUDA against the float64 reference (run on a GPU machine;
skipped cleanly without one)."""
import pytest
import torch

from conftest import make_relpos_inputs
from posattn import ops, reference

pytestmark = pytest.mark.cuda

GRIDS = [[9], [5, 6], [3, 1, 4], [1, 7], [4, 3, 2]]
MASKS = [
    dict(),
    dict(sigma=True),
    dict(sigma=True, threshold=0.3),
    dict(sigma=True, threshold=0.3, span_mode="multiply"),
    dict(sigma=True, causal=True),
    dict(pos=False, sigma=True, threshold=0.2),
    dict(bias=True),
    dict(pos=False, bias=True, window=1, window_border="shift"),
    dict(bias=True, sigma=True, threshold=0.3, window=2, causal=True),
]
TOL = {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 1e-2, torch.float16: 1e-2}


def run_both(grid, dtype, kw, seed=0):
    kw = dict(kw)
    threshold = kw.pop("threshold", 0.0)
    span_mode = kw.pop("span_mode", "add")
    causal = kw.pop("causal", False)
    pos = kw.pop("pos", True)
    window = kw.pop("window", None)
    window_border = kw.pop("window_border", "clip")
    x = make_relpos_inputs(grid, pos=pos, seed=seed, requires_grad=True, **kw)
    xc = {k: t.detach().to("cuda", dtype).requires_grad_() for k, t in x.items()}
    args = dict(grid=grid, threshold=threshold, span_mode=span_mode, causal=causal, return_lse=True, window=window,
                window_border=window_border)
    out_ref, lse_ref = reference.relpos_attention(**x, **args)
    out, lse = ops.relpos_attention(**xc, **args)
    return x, xc, (out_ref, lse_ref), (out, lse)


def close(got, want, tol):
    want = want.detach()
    err = (got.detach().double().cpu() - want).abs().max().item()
    assert err <= tol * max(1.0, want.abs().max().item()), err


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("kw", MASKS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_forward_and_backward_match_the_float64_reference(grid, kw, dtype):
    x, xc, (out_ref, lse_ref), (out, lse) = run_both(grid, dtype, kw)
    tol = TOL[dtype]
    close(out, out_ref, tol)
    close(lse, lse_ref, tol)
    g = torch.randn_like(out_ref)
    names = list(x)
    want = torch.autograd.grad((out_ref * g).sum() + lse_ref.sum(), [x[n] for n in names])
    got = torch.autograd.grad((out * g.to("cuda", dtype)).sum() + lse.sum(), [xc[n] for n in names])
    for n, a, b in zip(names, got, want):
        close(a, b, tol * 10)


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
    torch.testing.assert_close(f(x["q"], x["k"], x["v"], x["q_pos"], x["rel"]),
                               ops.relpos_attention(x["q"], x["k"], x["v"], x["q_pos"], x["rel"], [4, 5], x["sigma"], 0.2))


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
