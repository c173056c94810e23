"""posattn.ops.relpos_attention against posattn.reference on random inputs."""

import itertools
import math

import pytest
import torch
from helpers.relpos import assert_matches_reference, make_relpos_inputs

from posattn import ops, reference

# Every case of the reference comparisons runs on every kernel: the CPU's tiled and
# windowed ones (with a threshold or window POSATTN_CPU_KERNEL picks either; the
# automatic rule keeps the windowed one for small boxes) and, where a GPU is present,
# CUDA's general path (float32 / float64; CUDA's fast kernels: test_relpos_fast_cuda.py).
KERNELS = [
    pytest.param(("cpu", "tiled"), id="cpu-tiled"),
    pytest.param(("cpu", "window"), id="cpu-window"),
    pytest.param(("cuda", "general"), id="cuda-general", marks=pytest.mark.cuda),
]


@pytest.fixture(params=KERNELS)
def device(request, monkeypatch):
    device, kernel = request.param
    monkeypatch.setenv("POSATTN_CPU_KERNEL" if device == "cpu" else "POSATTN_CUDA_KERNEL", kernel)
    return device


@pytest.fixture(params=["tiled", "window"])
def cpu_kernel(request, monkeypatch):
    """The CPU-only cases (thread splits) on both CPU kernels."""
    monkeypatch.setenv("POSATTN_CPU_KERNEL", request.param)
    return request.param


# 1-D, 2-D, 3-D grids with odd sizes and size-1 axes.
GRIDS = [[1], [7], [13], [1, 5], [3, 5], [5, 1], [4, 1, 3], [2, 3, 4], [3, 3, 1, 2]]
# (q_pos/rel, span mode or None, threshold, causal)
CONFIGS = [
    (pos, mode, thr, causal)
    for pos, mode, thr, causal in itertools.product([False, True], [None, "add", "multiply"], [0.0, 0.3], [False, True])
    if not (thr > 0 and mode is None)
]


def op_kw(grid, mode, thr, causal):
    return dict(grid=grid, threshold=thr, causal=causal, span_mode=mode or "add")


@pytest.mark.parametrize("grid", GRIDS, ids=lambda g: "x".join(map(str, g)))
@pytest.mark.parametrize("pos,mode,thr,causal", CONFIGS)
def test_forward_and_gradients_float64(grid, pos, mode, thr, causal, device):
    x = make_relpos_inputs(grid, pos=pos, sigma=mode is not None, requires_grad=True)
    assert_matches_reference(x, op_kw(grid, mode, thr, causal), device=device)


@pytest.mark.parametrize("grid", [[9], [4, 7], [3, 2, 5]], ids=lambda g: "x".join(map(str, g)))
@pytest.mark.parametrize("pos,mode,thr,causal", [c for c in CONFIGS if c[0]])
def test_float32_against_float64_reference(grid, pos, mode, thr, causal, device):
    x = make_relpos_inputs(grid, pos=pos, sigma=mode is not None, requires_grad=True)
    kw = op_kw(grid, mode, thr, causal)
    assert_matches_reference(x, kw, device=device, dtype=torch.float32, tol=2e-5, grad_tol=1e-4)


# The masks of the GPU's half-precision cases: each combination the CUDA kernels handle apart.
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
    dict(sigma=True, threshold=0.4, window=1, window_border="shift", causal=True),  # exact query region per key
]


@pytest.mark.cuda
@pytest.mark.parametrize("grid", [[9], [5, 6], [3, 1, 4], [1, 7], [4, 3, 2]], ids=lambda g: "x".join(map(str, g)))
@pytest.mark.parametrize("kw", MASKS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_on_cuda(grid, kw, dtype):
    """float16 / bfloat16 (CUDA only: the CPU kernels take float32 and float64) against the float64 reference."""
    kw = dict(kw)
    x = make_relpos_inputs(
        grid, pos=kw.pop("pos", True), sigma=kw.pop("sigma", False), bias=kw.pop("bias", False), requires_grad=True
    )
    x = {n: t.detach().to(dtype).double().requires_grad_() for n, t in x.items()}  # representable inputs
    assert_matches_reference(x, dict(grid=grid, **kw), device="cuda", dtype=dtype, tol=1e-2, grad_tol=1e-1)


@pytest.mark.parametrize(
    "grid,mode,thr",
    [
        ([1300], None, 0.0),
        ([1300], "add", 0.02),
        ([40, 45], None, 0.0),
        ([40, 45], "multiply", 0.1),
        ([3, 20, 25], "add", 0.0),
    ],
    ids=lambda v: "x".join(map(str, v)) if isinstance(v, list) else str(v),
)
def test_many_key_chunks(grid, mode, thr, device):
    """Grids larger than one key chunk: the online softmax runs over several chunks."""
    x = make_relpos_inputs(grid, B=1, H=2, D=8, Dv=6, sigma=mode is not None, requires_grad=True)
    for causal in (False, True):
        assert_matches_reference(x, op_kw(grid, mode, thr, causal), device=device, tol=1e-9, grad_tol=1e-8)


@pytest.mark.parametrize(
    "grid,pos,mode,thr,causal",
    [
        ([6], True, None, 0.0, False),
        ([6], True, "add", 0.0, True),
        ([2, 3], True, "multiply", 0.0, False),
        ([3, 3], True, "add", 0.2, False),
        ([2, 1, 3], False, "multiply", 0.3, True),
        ([1, 4], True, "add", 0.0, False),
    ],
)
def test_gradcheck(grid, pos, mode, thr, causal, device):
    x = make_relpos_inputs(
        grid, B=1, H=2, D=3, Dv=2, pos=pos, sigma=mode is not None, requires_grad=True, seed=3, device=device
    )
    names = list(x)

    def f(*tensors):
        kw = dict(zip(names, tensors))
        out, lse = ops.relpos_attention(
            **kw, grid=grid, threshold=thr, causal=causal, span_mode=mode or "add", return_lse=True
        )
        return out, lse

    assert torch.autograd.gradcheck(f, tuple(x.values()), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_defaults_one_axis_and_scale(cpu_kernel):
    x = make_relpos_inputs([11], pos=False)
    out = ops.relpos_attention(x["q"], x["k"], x["v"])  # grid [N], scale D^-0.5
    ref = torch.softmax(x["q"] @ x["k"].transpose(-1, -2) / math.sqrt(5), -1) @ x["v"]
    torch.testing.assert_close(out, ref)
    out2 = ops.relpos_attention(x["q"], x["k"], x["v"], scale=0.3)
    ref2 = torch.softmax(0.3 * x["q"] @ x["k"].transpose(-1, -2), -1) @ x["v"]
    torch.testing.assert_close(out2, ref2)


def test_positional_term_indexes_rel_by_offset(cpu_kernel):
    """s_ij - scale * q_i.k_j equals scale * q_pos_i . rel[row(pos_j - pos_i)] for chosen pairs.

    With v the identity matrix the output row is softmax(s_i), so logits can be read back.
    """
    grid = [3, 4]
    N, H, D = 12, 1, 4
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, H, N, D, generator=g, dtype=torch.float64)
    k = torch.randn(1, H, N, D, generator=g, dtype=torch.float64)
    qp = torch.randn(1, H, N, D, generator=g, dtype=torch.float64)
    rel = torch.randn(H, 5 * 7, D, generator=g, dtype=torch.float64)
    v = torch.eye(N, dtype=torch.float64).expand(1, H, N, N).contiguous()
    out, lse = ops.relpos_attention(q, k, v, qp, rel, grid=grid, scale=1.0, return_lse=True)
    logits = out.log() + lse[..., None]  # s_ij
    for i, j in [(0, 0), (0, 11), (11, 0), (5, 6), (7, 2)]:
        (ri, ci), (rj, cj) = divmod(i, 4), divmod(j, 4)
        row = (rj - ri + 2) * 7 + (cj - ci + 3)
        expected = q[0, 0, i] @ k[0, 0, j] + qp[0, 0, i] @ rel[0, row]
        torch.testing.assert_close(logits[0, 0, i, j], expected)


def test_threshold_box_ignores_keys_outside(cpu_kernel):
    """Values of keys outside every query's box cannot change the output (the kernel skips them)."""
    grid = [9, 9]
    x = make_relpos_inputs(grid, B=1, H=2, sigma=True)
    x["sigma"] = torch.tensor([[0.05, 0.05], [0.1, 0.05]], dtype=torch.float64)  # half widths 1..2
    kw = dict(grid=grid, threshold=0.1)
    base = ops.relpos_attention(**x, **kw)
    # Query (0, 0) sees keys within 2 cells; perturb v of the far corner.
    v2 = x["v"].clone()
    v2[:, :, 80] += 100.0
    out = ops.relpos_attention(**{**x, "v": v2}, **kw)
    torch.testing.assert_close(out[:, :, 0], base[:, :, 0])
    assert not torch.allclose(out[:, :, 80], base[:, :, 80])


def test_non_contiguous_inputs(cpu_kernel):
    grid = [3, 4]
    x = make_relpos_inputs(grid, sigma=True)
    nc = {k: (v.transpose(-1, -2).contiguous().transpose(-1, -2) if v.dim() == 4 else v) for k, v in x.items()}
    nc["q"] = torch.randn(2, 12, 3, 5, dtype=torch.float64).transpose(1, 2)  # non-contiguous view
    assert not nc["q"].is_contiguous()
    x["q"] = nc["q"].contiguous()
    out_nc = ops.relpos_attention(**nc, grid=grid, threshold=0.2)
    out = ops.relpos_attention(**x, grid=grid, threshold=0.2)
    torch.testing.assert_close(out_nc, out)


def test_batch_zero_and_heads_zero(cpu_kernel):
    for B, H in [(0, 2), (2, 0)]:
        x = make_relpos_inputs([3, 2], B=B, H=H, sigma=True, requires_grad=True)
        out, lse = ops.relpos_attention(**x, grid=[3, 2], threshold=0.2, return_lse=True)
        assert out.shape == (B, H, 6, 4) and lse.shape == (B, H, 6)
        (out.sum() + lse.sum()).backward()
        assert x["q"].grad.shape == x["q"].shape and x["rel"].grad.shape == x["rel"].shape


def test_large_logits_are_stable(cpu_kernel):
    x = make_relpos_inputs([5, 5], B=1, H=2, sigma=True)
    kw = dict(grid=[5, 5], scale=40.0, return_lse=True)
    (o1, l1), (o2, l2) = ops.relpos_attention(**x, **kw), reference.relpos_attention(**x, **kw)
    assert torch.isfinite(o1).all() and torch.isfinite(l1).all()
    torch.testing.assert_close(o1, o2)
    torch.testing.assert_close(l1, l2)


def test_sigma_gradient_moves_the_span(cpu_kernel):
    """d sigma is non-zero where the span matters, and zero for a size-1 axis."""
    x = make_relpos_inputs([4, 1, 6], sigma=True, requires_grad=True)
    out = ops.relpos_attention(**x, grid=[4, 1, 6])
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
    g = x["sigma"].grad
    assert (g[:, 1] == 0).all()
    assert (g[:, [0, 2]].abs() > 0).all()


def test_returns_only_out_by_default(cpu_kernel):
    x = make_relpos_inputs([6], pos=False)
    out = ops.relpos_attention(x["q"], x["k"], x["v"])
    assert isinstance(out, torch.Tensor) and out.shape == (2, 3, 6, 4)


def test_only_lse_used_in_loss(cpu_kernel):
    x = make_relpos_inputs([2, 3], requires_grad=True)
    _, lse = ops.relpos_attention(**x, grid=[2, 3], return_lse=True)
    _, lse_ref = reference.relpos_attention(**x, grid=[2, 3], return_lse=True)
    g1 = torch.autograd.grad(lse.sum(), list(x.values()), allow_unused=True, materialize_grads=True)
    g2 = torch.autograd.grad(lse_ref.sum(), list(x.values()), allow_unused=True, materialize_grads=True)
    assert (g1[2] == 0).all()  # v does not enter lse
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("threads", [1, 3, 8])
@pytest.mark.parametrize("thr", [0.0, 0.3])
def test_backward_split_over_query_tiles(threads, thr, cpu_kernel):
    """Few (batch, head) pairs and many threads: the backward (and the windowed forward)
    split a pair's tiles or runs over tasks."""
    grid = [9, 11]
    x = make_relpos_inputs(grid, B=1, H=1, D=6, Dv=3, sigma=True, requires_grad=True)
    assert_grads_match_with_threads(x, grid, "multiply", thr, threads)


def assert_grads_match_with_threads(x, grid, mode, thr, threads):
    """The op, run on `threads` threads, against the reference."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert_matches_reference(x, op_kw(grid, mode, thr, False))
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize(
    "B,H,threads",
    [(1, 2, 1), (4, 4, 2), (2, 1, 2), (3, 2, 2)],  # one backward task per head / per-task d rel partials
)
@pytest.mark.parametrize("thr", [0.0, 0.3])
def test_backward_drel_per_head_or_partials(B, H, threads, thr, cpu_kernel):
    """d rel is accumulated straight into the output with one backward task per head,
    through per-task partials otherwise; both match the reference."""
    grid = [5, 7]
    x = make_relpos_inputs(grid, B=B, H=H, D=5, sigma=True, requires_grad=True)
    assert_grads_match_with_threads(x, grid, "add", thr, threads)
