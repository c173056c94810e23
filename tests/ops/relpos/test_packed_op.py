"""Packed relpos_attention on the CPU kernels (issue 62): ``ops.relpos_attention(..., packed=)``
against the reference's loop of single-grid calls (float64: outputs, lse and every gradient),
both CPU kernels, 1-3 axes with size-1 axes, windows, span boxes, causal order, tail padding;
a single sample that fills its max_grid bit for bit as today's call; a mix of one large and many
small samples whose backward splits the large one in parts; a repeatable backward; gradcheck,
opcheck, torch.compile without recompiles; the operator's errors on bad packings."""

from __future__ import annotations

import math

import pytest
import torch

from posattn import PackedGrids, ops, reference
from posattn.ops import RelposArgs

F64 = torch.float64


@pytest.fixture(params=["tiled", "window"])
def cpu_kernel(request, monkeypatch):
    # "window" where the windowed kernels take the sample (a box, no stride on the last axis)
    monkeypatch.setenv("POSATTN_CPU_KERNEL", request.param)
    return request.param


def packed_inputs(pk: PackedGrids, H=2, D=5, Dv=3, tail=0, dtype=F64, seed=0, sigma=True):
    g = torch.Generator().manual_seed(seed)
    T = pk.num_tokens + tail
    U = math.prod(2 * m - 1 for m in pk.max_grid)

    def r(*s, scale=1.0):
        return (scale * torch.randn(*s, generator=g, dtype=dtype)).requires_grad_()

    x = dict(q=r(1, H, T, D), k=r(1, H, T, D), v=r(1, H, T, Dv), q_pos=r(1, H, T, D), rel=r(H, U, D, scale=0.5))
    x["bias"] = r(H, U, scale=0.5)
    if sigma:
        x["sigma"] = (torch.rand(H, pk.num_axes, generator=g, dtype=dtype) + 0.3).requires_grad_()
    return x


def run(mod, x, pk, **kw):
    return mod.relpos_attention(
        x["q"], x["k"], x["v"], x["q_pos"], x["rel"], sigma=x.get("sigma"), bias=x["bias"], packed=pk,
        return_lse=True, **kw,
    )  # fmt: skip


def grads(out, lse, x, seed=3):
    g = torch.Generator().manual_seed(seed)
    go = torch.randn(out.shape, generator=g, dtype=F64).to(out.device, out.dtype)  # the same values in every dtype
    gl = torch.randn(lse.shape, generator=g, dtype=F64).to(lse.device, lse.dtype)
    loss = (out * go).sum() + torch.where(lse.isfinite(), lse * gl, 0).sum()
    return torch.autograd.grad(loss, list(x.values()))


def assert_matches_loop(pk, kw, tail=0, tol=1e-12, **inputs):
    x = packed_inputs(pk, tail=tail, **inputs)
    out, lse = run(ops, x, pk, **kw)
    ref_out, ref_lse = run(reference, x, pk, **kw)
    assert torch.equal(lse.isinf(), ref_lse.isinf())
    torch.testing.assert_close(out, ref_out, atol=tol, rtol=0)
    torch.testing.assert_close(torch.where(lse.isinf(), 0, lse), torch.where(ref_lse.isinf(), 0, ref_lse))
    for name, a, b in zip(x, grads(out, lse, x), grads(ref_out, ref_lse, x)):
        torch.testing.assert_close(a, b, atol=10 * tol * max(1.0, b.abs().max().item()), rtol=0, msg=name)
    return out, lse


SHAPES = {
    "1d": [[5], [1], [9], [3]],
    "2d": [[3, 4], [5, 2], [1, 6], [4, 4], [2, 1]],
    "3d": [[2, 3, 2], [1, 4, 3], [3, 1, 1], [2, 2, 4]],
}
OPTIONS = [
    dict(),
    dict(window=1),
    dict(threshold=0.2),
    dict(threshold=0.3, span_mode="multiply", causal=True),
    dict(causal=True),
    dict(kernel_size=3, window_border="shift", window_stride=2),
    dict(kernel_size=2, window_causal=True),
]


@pytest.mark.parametrize("axes", sorted(SHAPES))
@pytest.mark.parametrize("kw", OPTIONS, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()) or "dense")
def test_matches_loop_of_single_calls(axes, kw, cpu_kernel):
    pk = PackedGrids.from_shapes(SHAPES[axes])
    assert_matches_loop(pk, kw, tail=3)


def test_max_grid_larger_than_every_sample(cpu_kernel):
    # rows of a larger table, a sample with an axis of extent 1 where max_grid has more
    pk = PackedGrids.from_shapes([[2, 3], [1, 5], [4, 1]], max_grid=[6, 7])
    assert_matches_loop(pk, dict(threshold=0.1), tail=1)
    assert_matches_loop(pk, dict(window=[2, 1]))


def test_tail_padding_is_zero():
    pk = PackedGrids.from_shapes([[2, 2], [3, 1]])
    x = packed_inputs(pk, tail=4)
    out, lse = run(ops, x, pk, window=1)
    assert torch.equal(out[:, :, 7:], torch.zeros_like(out[:, :, 7:]))
    assert bool((lse[:, :, 7:] == float("-inf")).all()) and bool(lse[:, :, :7].isfinite().all())
    for name, g in zip(x, grads(out, lse, x)):
        if name in ("q", "k", "v", "q_pos"):
            assert torch.equal(g[:, :, 7:], torch.zeros_like(g[:, :, 7:])), name


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "grid,kw", [([16, 16], dict()), ([13, 11], dict(window=2)), ([40], dict(threshold=0.1)), ([4, 3, 5], {})]
)
def test_single_sample_is_todays_call_bit_for_bit(grid, kw, threads, cpu_kernel):
    """S = 1 with max_grid == shape and no tail: the same bits as a call on the grid, outputs and
    every gradient (with H = 1, 16x16 splits the backward in parts)."""
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        pk = PackedGrids.from_shapes([grid])
        x = packed_inputs(pk, H=1, D=8, Dv=8, dtype=torch.float32)
        out, lse = run(ops, x, pk, **kw)
        one = ops.relpos_attention(
            x["q"], x["k"], x["v"], x["q_pos"], x["rel"], grid, x["sigma"], bias=x["bias"], return_lse=True, **kw
        )
        assert torch.equal(out, one[0]) and torch.equal(lse, one[1])
        for name, a, b in zip(x, grads(out, lse, x), grads(*one, x)):
            assert torch.equal(a, b), name
    finally:
        torch.set_num_threads(prev)


@pytest.mark.parametrize("kw", [dict(), dict(window=2), dict(threshold=0.15)], ids=["dense", "window", "span"])
def test_one_large_and_many_small_samples(kw, cpu_kernel):
    """The large sample's backward runs in parts (d k / d v per part, d rel partials per part),
    the small ones in one task each. In float32 against the float64 loop: an error within 3x
    that of the same loop in PyTorch's float32 math."""
    shapes = [[3, 3]] * 12 + [[20, 18]] + [[2, 5]] * 5
    pk = PackedGrids.from_shapes(shapes)
    x64 = packed_inputs(pk, H=1, D=8, Dv=8, tail=2)
    x32 = {n: t.detach().float().requires_grad_() for n, t in x64.items()}
    got = run(ops, x32, pk, **kw)
    want = run(reference, x64, pk, **kw)
    torch32 = run(reference, x32, pk, **kw)

    def err(a, b):
        return (a.double() - b).abs().max().item()

    def check(name, a, b, c):
        assert err(a, b) <= 3 * err(c, b) + 1e-7 * b.abs().max().item(), (name, err(a, b), err(c, b))

    check("out", got[0], want[0], torch32[0])
    for name, a, b, c in zip(x64, grads(*got, x32), grads(*want, x64), grads(*torch32, x32)):
        check(name, a, b, c)


def test_backward_is_repeatable():
    pk = PackedGrids.from_shapes([[3, 3]] * 7 + [[12, 10], [1, 4]])
    x = packed_inputs(pk, H=1, D=6, dtype=torch.float32)
    first = grads(*run(ops, x, pk, threshold=0.1), x)
    for _ in range(3):
        again = grads(*run(ops, x, pk, threshold=0.1), x)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_gradcheck():
    pk = PackedGrids.from_shapes([[2, 3], [1, 2], [3, 1]], max_grid=[3, 4])
    x = packed_inputs(pk, H=1, D=3, Dv=2, tail=1)
    names = list(x)

    def f(*ts):
        d = dict(zip(names, ts))
        out, lse = run(ops, d, pk, threshold=0.1)
        return out, lse[..., : pk.num_tokens]  # the tail's lse is -inf

    assert torch.autograd.gradcheck(f, tuple(x.values()), eps=1e-6, atol=1e-7)


def packed_op_args(pk, x, **kw):
    return RelposArgs(
        x["q"].detach(), x["k"].detach(), x["v"].detach(), x["q_pos"].detach(), x["rel"].detach(),
        list(pk.max_grid), x["sigma"].detach(), kw.get("threshold", 0.0), "add", 0.5, kw.get("causal", False),
        x["bias"].detach(), kw.get("window"), "clip", kw.get("window"), None, None, pk.offsets, pk.shapes,
    )  # fmt: skip


@pytest.mark.parametrize("kw", [dict(threshold=0.2), dict(window=[1, 1], causal=True)])
def test_opcheck(kw):
    pk = PackedGrids.from_shapes([[2, 3], [3, 3], [1, 2]])
    x = packed_inputs(pk, tail=2)
    args = packed_op_args(pk, x, **kw)
    with_grad = args._replace(q=args.q.clone().requires_grad_(), rel=args.rel.clone().requires_grad_())
    torch.library.opcheck(
        torch.ops.posattn.relpos_attention.default, tuple(with_grad._replace(sigma=args.sigma.clone().requires_grad_()))
    )
    out, lse = torch.ops.posattn.relpos_attention(*args)
    go, gl = torch.randn_like(out), torch.randn_like(lse)
    torch.library.opcheck(torch.ops.posattn.relpos_attention_backward.default, args.backward_args(go, gl, out, lse))


def test_torch_compile_does_not_recompile_across_packings():
    """A two-layer packed model under torch.compile: batches of different shapes with the same
    T, S and max_grid run the compiled graph without recompiling."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    H, D, max_grid = 2, 4, (6, 6)
    U = math.prod(2 * m - 1 for m in max_grid)
    rel = [torch.randn(H, U, D, dtype=F64) * 0.3 for _ in range(2)]
    bias = [torch.randn(H, U, dtype=F64) * 0.3 for _ in range(2)]

    def model(x, pk):
        for layer in range(2):
            q = k = v = x
            x = x + ops.relpos_attention(q, k, v, q, rel[layer], bias=bias[layer], packed=pk, window=1)
        return x

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    g = torch.Generator().manual_seed(1)
    T = 64
    for step in range(20):
        a = int(torch.randint(1, 7, (1,), generator=g))
        b = int(torch.randint(1, 7, (1,), generator=g))
        shapes = [[a, b], [6 - (a > 3), 2], [1, 3]]
        pk = PackedGrids.from_shapes(shapes, max_grid=max_grid)
        x = torch.randn(1, H, T, D, dtype=F64, generator=g)
        torch.testing.assert_close(compiled(x, pk), model(x, pk))
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


# --- errors -------------------------------------------------------------------------------


def raw_call(pk_offsets, pk_shapes, max_grid=(3, 3), T=12, B=1):
    x = packed_inputs(PackedGrids.from_shapes([[3, 3]]), tail=T - 9, sigma=True)
    args = packed_op_args(PackedGrids.from_shapes([[3, 3]]), x)
    q = args.q.expand(B, *args.q.shape[1:]).contiguous()
    args = args._replace(
        q=q, k=q, v=args.v.expand(B, *args.v.shape[1:]).contiguous(), q_pos=q, grid=list(max_grid),
        packed_offsets=pk_offsets, packed_shapes=pk_shapes,
    )  # fmt: skip
    return torch.ops.posattn.relpos_attention(*args)


I32 = dict(dtype=torch.int32)


@pytest.mark.parametrize(
    "offsets,shapes,match",
    [
        ([1, 10], [[3, 3]], r"packed_offsets must start at 0, got packed_offsets\[0\] = 1"),
        ([0, 4, 4, 9], [[2, 2], [1, 1], [1, 5]], r"packed_offsets must increase, got packed_offsets\[1\] = 4"),
        ([0, 4, 9], [[2, 2], [2, 3]], r"packed_shapes\[1\] has 6 tokens but packed_offsets give it"),
        ([0, 3], [[0, 3]], r"packed_shapes\[0\] = \(0, 3\) must have extents in \[1, max_grid\]"),
        ([0, 8], [[2, 4]], r"packed_shapes\[0\] = \(2, 4\) must have extents in \[1, max_grid\].*axis 1"),
        ([0, 9, 15], [[3, 3], [2, 3]], r"hold packed_offsets\[-1\] = 15 tokens but q has only T = 12"),
    ],
)
def test_bad_packing_values(offsets, shapes, match):
    with pytest.raises(ValueError, match=match):
        raw_call(torch.tensor(offsets, **I32), torch.tensor(shapes, **I32))


def test_bad_packing_tensors():
    off, shp = torch.tensor([0, 9], **I32), torch.tensor([[3, 3]], **I32)
    with pytest.raises(TypeError, match="packed_offsets must be int32, got Long"):
        raw_call(off.long(), shp)
    with pytest.raises(TypeError, match="packed_shapes must be int32"):
        raw_call(off, shp.float())
    with pytest.raises(ValueError, match=r"packed_shapes must have shape \(S, G\) with S >= 1 samples and G = 2"):
        raw_call(off, torch.tensor([[3, 3, 1]], **I32))
    with pytest.raises(ValueError, match=r"packed_offsets must have shape \(S \+ 1,\) = \(2,\)"):
        raw_call(torch.tensor([0, 9, 9], **I32), shp)
    with pytest.raises(ValueError, match="a packed call takes q of shape \\(1, H, T, D\\).*got B = 2"):
        raw_call(off, shp, B=2)
    with pytest.raises(ValueError, match="packed_offsets and packed_shapes must be given together"):
        raw_call(off, None)
    with pytest.raises(ValueError, match="packed_offsets is on meta but q is on cpu"):
        raw_call(off.to("meta"), shp)


def test_wrapper_errors():
    pk = PackedGrids.from_shapes([[2, 2], [1, 3]])
    x = packed_inputs(pk)
    q, k, v = x["q"], x["k"], x["v"]
    with pytest.raises(ValueError, match="with packed=, grid must be None"):
        ops.relpos_attention(q, k, v, grid=[7], packed=pk)
    with pytest.raises(ValueError, match="window_dilation is not supported with packed="):
        ops.relpos_attention(q, k, v, packed=pk, kernel_size=3, window_dilation=2)
    with pytest.raises(ValueError, match="additional_keys / additional_values are not supported with packed="):
        ops.relpos_attention(q, k, v, packed=pk, additional_keys=k, additional_values=v)
    with pytest.raises(TypeError, match="packed must be a posattn.PackedGrids, got list"):
        ops.relpos_attention(q, k, v, packed=[[2, 2], [1, 3]])
    with pytest.raises(ValueError, match=r"rel must have shape \(H, U, D\) = \(2, 15, 5\)"):
        ops.relpos_attention(q, k, v, q, x["rel"][:, :9], packed=pk)
    plan = ops.relpos_plan(q, k, v, x["q_pos"], x["rel"], sigma=x["sigma"], threshold=0.5, packed=pk)
    assert plan["packed_samples"] == "2" and plan["device"] == "cpu" and plan["forward"] in ("tiled", "window")


@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "kw", [dict(threshold=0.3), dict(window=1, causal=True), dict(window=1)], ids=["span", "window-causal", "nospan"]
)
@pytest.mark.parametrize("axes", ["1d", "2d", "3d"])
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_the_cpu_loop(axes, kw, dtype):
    """CUDA: the float64 loop of single calls on the same (rounded) inputs, within the error of the
    dtype's rounding (float64: to rounding), tail tokens 0 / -inf, every gradient. The fast forward,
    backward and offset kernel take the bfloat16 calls (float32 without TF32 and float64: the
    general kernels)."""
    pk = PackedGrids.from_shapes(SHAPES[axes])
    span = kw != dict(window=1)
    x = packed_inputs(pk, tail=2, D=32, Dv=32, sigma=span)
    sigma_dtype = torch.float32 if dtype == torch.bfloat16 else dtype
    x = {n: t.detach().to(sigma_dtype if n == "sigma" else dtype).to(F64).requires_grad_() for n, t in x.items()}
    ref_out, ref_lse = run(reference, x, pk, **kw)
    want = grads(ref_out, ref_lse, x)
    xc = {n: t.detach().to("cuda", sigma_dtype if n == "sigma" else dtype).requires_grad_() for n, t in x.items()}
    pkc = pk.to("cuda")
    out, lse = run(ops, xc, pkc, **kw)
    plan = ops.relpos_plan(
        *[xc[n] for n in ("q", "k", "v", "q_pos", "rel")], sigma=xc.get("sigma"), bias=xc["bias"], packed=pkc, **kw
    )
    assert plan["forward"] == ("fast" if dtype == torch.bfloat16 else "general"), plan
    bwd_plan = ops.relpos_plan(
        *[xc[n] for n in ("q", "k", "v", "q_pos", "rel")],
        sigma=xc.get("sigma"),
        bias=xc["bias"],
        packed=pkc,
        backward=True,
        **kw,
    )
    assert bwd_plan["backward"] == plan["forward"], bwd_plan
    assert bwd_plan["offsets"] == plan["forward"], bwd_plan
    tol = {F64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 2e-2}[dtype]
    assert torch.equal(lse.isinf().cpu(), ref_lse.isinf())
    torch.testing.assert_close(out.double().cpu(), ref_out, atol=tol, rtol=0)
    for name, a, b in zip(x, grads(out, lse, xc), want):
        torch.testing.assert_close(a.double().cpu(), b, atol=tol * max(1.0, b.abs().max().item()), rtol=0, msg=name)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_bad_packing_is_a_device_side_assertion_with_the_cpu_message():
    import subprocess
    import sys

    code = """
import torch
q = torch.randn(1, 2, 10, 4, device="cuda")
off = torch.tensor([0, 6, 11], dtype=torch.int32, device="cuda")
shp = torch.tensor([[2, 3], [2, 2]], dtype=torch.int32, device="cuda")
import posattn
out = torch.ops.posattn.relpos_attention(q, q, q, None, None, [3, 4], None, 0.0, "add", 0.5, False,
                                         packed_offsets=off, packed_shapes=shp)
torch.cuda.synchronize()
print("NO ERROR")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0, r.stdout
    assert "packed_shapes gives a sample another number of tokens than packed_offsets do" in r.stderr


def test_no_heads_still_checks_the_packing():
    """H = 0: nothing to compute, but bad packings are still refused; the plan has its usual keys."""
    pk = PackedGrids.from_shapes([[2, 2], [1, 3]])
    q = torch.zeros(1, 0, 9, 4)
    out = ops.relpos_attention(q, q, q, packed=pk)
    assert out.shape == (1, 0, 9, 4)
    bad = torch.tensor([1, 5, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="packed_offsets must start at 0"):
        torch.ops.posattn.relpos_attention(q, q, q, None, None, [2, 3], None, 0.0, "add", 0.5, False,
                                           packed_offsets=bad, packed_shapes=pk.shapes)  # fmt: skip
    plan = ops.relpos_plan(q, q, q, packed=pk)
    assert plan["forward"] == "tiled" and plan["packed_samples"] == "2" and "isa" in plan
