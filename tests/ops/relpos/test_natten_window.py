"""relpos_attention with NATTEN's window vocabulary (kernel_size odd or even,
window_stride, window_causal per axis, window_dilation) and additional keys,
against the dense reference: float64 outputs and every gradient on both CPU
kernels, float32, gradcheck, opcheck, and the errors of bad arguments. The
reference itself is checked against the real natten in test_neighborhood_natten.py."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.relpos import assert_matches_reference, loss_grads, make_relpos_inputs

from posattn import ops, reference
from posattn._dilation import dilation_classes
from posattn.ops._checks import check_relpos_args

# (grid, kernel_size, stride, causal, dilation, border): 1-D / 2-D / 3-D, odd sizes, size-1
# axes, even kernels, kernels as large as the axis, strides up to the kernel, grids the
# dilation does not divide; the long axes run the kernels' loops more than once
CASES = [
    ([150], [16], [8], [True], [1], "clip"),
    ([150], [7], [3], [False], [2], "shift"),
    ([131], [6], [1], [False], [3], "clip"),
    ([9, 70], [4, 9], [2, 3], [False, False], [1, 1], "shift"),
    ([9, 70], [3, 6], [1, 2], [True, False], [2, 3], "shift"),
    ([11, 1, 13], [5, 1, 4], [5, 1, 2], [False, False, True], [2, 1, 1], "clip"),
    ([5, 6, 7], [2, 3, 4], [2, 1, 3], [False, True, False], [2, 1, 1], "shift"),
    ([5, 6, 7], [5, 6, 7], [1, 2, 1], [False, False, False], [1, 1, 1], "shift"),  # kernel = grid
    ([1, 40], [1, 8], [1, 8], [False, False], [1, 5], "shift"),  # blocks (stride = kernel), dilated
    ([4, 4, 4, 9], [2, 3, 2, 4], [1, 2, 2, 4], [False, False, False, True], [1, 1, 2, 2], "clip"),  # 4-D
    # the windowed CPU kernel takes these (stride 1 on the last axis): a causal last axis, a strided
    # outer axis, an even kernel with the shift border
    ([9, 70], [4, 6], [3, 1], [False, True], [1, 1], "shift"),
    ([5, 80], [6, 5], [2, 1], [True, False], [1, 1], "clip"),
]
IDS = ["-".join("x".join(map(str, v)) if isinstance(v, list) else str(v) for v in c[:2] + c[2:5]) for c in CASES]


def window_kw(case):
    grid, kernel, stride, causal, dilation, border = case
    return dict(
        grid=grid,
        kernel_size=kernel,
        window_stride=stride,
        window_causal=causal,
        window_dilation=dilation,
        window_border=border,
    )


@pytest.mark.parametrize("kernel", ["tiled", "window"])
@pytest.mark.parametrize("terms", ["pos+bias", "sigma"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_against_reference_float64(case, terms, kernel, monkeypatch):
    monkeypatch.setenv("POSATTN_CPU_KERNEL", kernel)  # the window kernel declines strided lines itself
    grid = case[0]
    x = make_relpos_inputs(
        grid, H=2, D=9, Dv=6, pos=terms == "pos+bias", bias=terms == "pos+bias", sigma=terms == "sigma",
        requires_grad=True,
    )  # fmt: skip
    assert_matches_reference(x, window_kw(case))


@pytest.mark.parametrize("case", [CASES[1], CASES[4], CASES[6]], ids=[IDS[1], IDS[4], IDS[6]])
def test_float32(case):
    grid = case[0]
    x64 = make_relpos_inputs(grid, H=2, D=16, Dv=16, pos=True, bias=True, requires_grad=True)
    assert_matches_reference(x64, window_kw(case), dtype=torch.float32, tol=2e-5, grad_tol=2e-4)


def extra_tokens(B, H, M, D, Dv, dtype=torch.float64, seed=3):
    g = torch.Generator().manual_seed(seed)
    ka = torch.randn(B, H, M, D, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    va = torch.randn(B, H, M, Dv, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    return ka, va


def dense_with_extra(x, kw, ka, va, scale):
    """The softmax over window keys and extra tokens together, densely: the reference's
    logits with the extra tokens' logits appended."""
    s = reference.relpos_scores(
        x["q"], x["k"], x.get("q_pos"), x.get("rel"), kw["grid"], x.get("sigma"), 0.0, "add", scale, False,
        x.get("bias"), None, kw["window_border"], kw["kernel_size"], kw["window_stride"], kw["window_causal"],
        kw["window_dilation"],
    )  # fmt: skip
    s = torch.cat([s, scale * x["q"] @ ka.transpose(-1, -2)], -1)
    lse = torch.logsumexp(s, -1)
    return torch.softmax(s, -1) @ torch.cat([x["v"], va], 2), lse


@pytest.mark.parametrize("case", [CASES[0], CASES[4], CASES[6]], ids=[IDS[0], IDS[4], IDS[6]])
def test_additional_keys_join_the_softmax(case):
    grid = case[0]
    x = make_relpos_inputs(grid, H=2, D=5, Dv=3, pos=True, bias=True, requires_grad=True)
    ka, va = extra_tokens(2, 2, 3, 5, 3)
    kw = window_kw(case)
    scale = 0.7
    o1, l1 = ops.relpos_attention(**x, **kw, scale=scale, return_lse=True, additional_keys=ka, additional_values=va)
    o2, l2 = dense_with_extra(x, kw, ka, va, scale)
    torch.testing.assert_close(o1, o2, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(l1, l2, rtol=1e-10, atol=1e-10)
    inputs = list(x.values()) + [ka, va]
    for a, b in zip(loss_grads(o1, l1, inputs), loss_grads(o2, l2, inputs)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    "grid,kw",
    [
        ([7], dict(kernel_size=4, window_stride=2, window_dilation=2)),
        ([3, 5], dict(kernel_size=[2, 3], window_causal=[True, False], window_dilation=[1, 2])),
        ([2, 3, 4], dict(kernel_size=2, window_stride=[1, 2, 2], window_border="shift")),
    ],
)
def test_gradcheck(grid, kw):
    x = make_relpos_inputs(grid, H=2, D=3, Dv=2, pos=True, bias=True, sigma=True, requires_grad=True)
    ka, va = extra_tokens(2, 2, 2, 3, 2)
    names = list(x)

    def f(*args):
        t = dict(zip(names, args[: len(names)]))
        return ops.relpos_attention(
            **t, grid=grid, **kw, return_lse=True, additional_keys=args[-2], additional_values=args[-1]
        )

    assert torch.autograd.gradcheck(f, tuple(x.values()) + (ka, va))


@pytest.mark.parametrize("stride,causal", [([2, 1], [0, 0]), ([1, 3], [1, 0]), ([3, 2], [1, 1])])
def test_opcheck(stride, causal):
    x = make_relpos_inputs([7, 9], H=2, D=4, Dv=3, pos=True, bias=True, sigma=True, requires_grad=True)
    args = (x["q"], x["k"], x["v"], x["q_pos"], x["rel"], [7, 9], x["sigma"], 0.0, "add", 0.5, False, x["bias"])
    kwargs = dict(window=[1, 2], window_border="shift", window_right=[1, 1], window_stride=stride, window_causal=causal)
    torch.library.opcheck(torch.ops.posattn.relpos_attention.default, args, kwargs)


def test_kernel_size_is_window_for_odd_sizes():
    x = make_relpos_inputs([6, 9], H=2, pos=True, bias=True)
    a = ops.relpos_attention(**x, grid=[6, 9], window=[1, 3], window_border="shift")
    b = ops.relpos_attention(**x, grid=[6, 9], kernel_size=[3, 7], window_border="shift")
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_empty_batch_with_dilation():
    x = make_relpos_inputs([7, 5], B=0, H=2, pos=True, bias=True)
    kw = dict(grid=[7, 5], kernel_size=3, window_dilation=[2, 3])
    out, lse = ops.relpos_attention(**x, **kw, return_lse=True)
    assert out.shape == (0, 2, 35, 4) and lse.shape == (0, 2, 35)


def test_merge_in_half_precision():
    """The log-sum-exp merge of two halves of a row's keys in float16 / bfloat16 equals the
    softmax over all of them (float32 statistics, as the op keeps them)."""
    from posattn._extra_tokens import merge_attention

    g = torch.Generator().manual_seed(0)
    s, v = torch.randn(3, 10, generator=g, dtype=torch.float64), torch.randn(10, 4, generator=g, dtype=torch.float64)
    want = torch.softmax(s, -1) @ v
    halves = []
    for part in (slice(0, 6), slice(6, 10)):
        lse = torch.logsumexp(s[:, part], -1)
        halves += [(torch.softmax(s[:, part], -1) @ v[part]), lse]
    for dtype in (torch.float16, torch.bfloat16):
        out, lse = merge_attention(halves[0].to(dtype), halves[1].float(), halves[2].to(dtype), halves[3].float())
        assert out.dtype == dtype and lse.dtype == torch.float32
        torch.testing.assert_close(out.double(), want, rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(lse.double(), torch.logsumexp(s, -1), rtol=1e-6, atol=1e-6)
    # a side whose keys were all masked (lse -inf, out 0) weighs nothing
    out, lse = merge_attention(torch.zeros(3, 4), torch.full((3,), float("-inf")), halves[0].float(), halves[1].float())
    torch.testing.assert_close(out.double(), halves[0], rtol=1e-6, atol=1e-6)


def test_dilation_classes_cover_every_token_once():
    for grid, dil in [([7], [3]), ([9, 10], [2, 4]), ([5, 1, 6], [5, 1, 4]), ([4], [9])]:
        classes = dilation_classes(grid, dil)
        tokens = torch.cat([c.tokens for c in classes])
        assert sorted(tokens.tolist()) == list(range(math.prod(grid)))
        assert all(c.tokens.numel() == c.count * math.prod(c.grid) for c in classes)
        assert len(classes) <= 2 ** len(grid)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(window=1, kernel_size=3), "give window .half widths. or kernel_size, not both"),
        (dict(kernel_size=[3, 0]), r"kernel_size must be >= 1 on every axis, got \[3, 0\]"),
        (dict(kernel_size=[3, 3, 3]), "kernel_size must give one value per grid axis"),
        (dict(kernel_size=4, window_stride=5), r"window_stride must be in \[1, kernel size\]"),
        (dict(kernel_size=4, window_stride=0), "window_stride must be >= 1"),
        (dict(kernel_size=4, window_dilation=0), "window_dilation must be >= 1"),
        (dict(window_stride=2), "window_stride needs a window"),
        (dict(window_dilation=2), "window_dilation needs a window"),
        (dict(window_causal=True), "window_causal needs a window"),
        (
            dict(kernel_size=3, window_dilation=2, threshold=0.2),
            "a span threshold .* cannot be combined with a dilated",
        ),
    ],
)
def test_bad_window_arguments_are_clear_errors(kw, match):
    x = make_relpos_inputs([6, 9], H=2, pos=False, sigma=True)
    with pytest.raises(ValueError, match=match):
        ops.relpos_attention(**x, grid=[6, 9], **kw)
    if "threshold" in kw or "window" in kw:
        return
    with pytest.raises(ValueError, match=match):  # the reference says the same
        reference.relpos_attention(**x, grid=[6, 9], **kw)


@pytest.mark.parametrize(
    "kw,err,match",
    [
        (
            dict(kernel_size=3, window_causal=[True, 1]),
            TypeError,
            "window_causal must be a bool or a sequence of bools",
        ),
        (dict(kernel_size=2.5), TypeError, "kernel_size must be an int or a sequence of ints"),
        (dict(kernel_size=True), TypeError, "kernel_size must be an int or a sequence of ints"),
    ],
)
def test_bad_window_types_are_clear_errors(kw, err, match):
    x = make_relpos_inputs([6, 9], H=2, pos=False)
    with pytest.raises(err, match=match):
        ops.relpos_attention(**x, grid=[6, 9], **kw)


def test_bad_additional_tokens_are_clear_errors():
    x = make_relpos_inputs([6, 9], H=2, D=5, Dv=4, pos=False)
    ka, va = extra_tokens(2, 2, 3, 5, 4)
    with pytest.raises(ValueError, match="additional_keys and additional_values must be given together"):
        ops.relpos_attention(**x, grid=[6, 9], additional_keys=ka)
    with pytest.raises(ValueError, match=r"additional_keys must have shape \(B, H, M, D\) = \(2, 2, M >= 1, 5\)"):
        ops.relpos_attention(**x, grid=[6, 9], additional_keys=ka[..., :4], additional_values=va)
    with pytest.raises(ValueError, match=r"additional_values must have shape \(B, H, M, Dv\) = \(2, 2, 3, 4\)"):
        ops.relpos_attention(**x, grid=[6, 9], additional_keys=ka, additional_values=va[:, :, :2])
    with pytest.raises(ValueError, match="additional_keys must have q's dtype and device"):
        ops.relpos_attention(**x, grid=[6, 9], additional_keys=ka.float(), additional_values=va)
    with pytest.raises(ValueError, match="M >= 1"):
        ops.relpos_attention(**x, grid=[6, 9], additional_keys=ka[:, :, :0], additional_values=va[:, :, :0])


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(window_stride=[4, 1]), r"window_stride must be in \[1, kernel size\]"),
        (dict(window_causal=[2, 0]), "window_causal must be 0 or 1"),
        (dict(window_right=[-1, 0]), "window_right must be >= 0 and equal window or window - 1 on every axis"),
        (dict(window_right=[1, -1]), r"window_right must be >= 0 and equal window or window - 1 .* \(axis 1\)"),
        (dict(window_right=[3, 0]), r"window_right must be >= 0 and equal .* got window .1, 0., window_right .3, 0."),
        (dict(window_right=[1]), "window_right must give one value per grid axis"),
        (dict(window_causal=[1]), "window_causal must give one value per grid axis"),
    ],
)
def test_the_registered_op_checks_its_window_arguments(kw, match):
    """The C++ checks (torch.ops.posattn.relpos_attention called directly) and the fake kernel's."""
    x = make_relpos_inputs([6, 9], H=2, pos=False)
    args = (x["q"], x["k"], x["v"], None, None, [6, 9], None, 0.0, "add", 0.5, False, None)
    with pytest.raises(ValueError, match=match):
        torch.ops.posattn.relpos_attention(*args, window=[1, 0], **kw)
    with pytest.raises(ValueError, match=match):
        check_relpos_args(ops.RelposArgs(*args, window=[1, 0], **kw))
    with pytest.raises(ValueError, match="needs a window"):
        torch.ops.posattn.relpos_attention(*args, **kw)


def test_torch_compile():
    """The NATTEN-style call (strided causal window, dilation, extra tokens) under
    torch.compile (aot_eager: the fake kernel traces the op): same outputs and gradients."""
    x = make_relpos_inputs([6, 9], H=2, D=4, Dv=3, pos=True, bias=True, requires_grad=True)
    ka, va = extra_tokens(2, 2, 2, 4, 3)
    kw = dict(grid=[6, 9], kernel_size=[3, 4], window_stride=[1, 2], window_causal=[True, False],
              window_dilation=[2, 1], window_border="shift", additional_keys=ka, additional_values=va)  # fmt: skip

    def f(**t):
        return ops.relpos_attention(**t, **kw)

    compiled = torch.compile(f, backend="aot_eager")
    want, got = f(**x), compiled(**x)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    leaves = list(x.values()) + [ka, va]
    for a, b in zip(torch.autograd.grad(got.sum(), leaves), torch.autograd.grad(want.sum(), leaves)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def _rel_err(got, want):
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    return ((got - want).abs().max() / max(1.0, want.abs().max().item())).item()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("path,dtype", [("general", torch.float64), ("general", torch.float32),
                                        ("fast", torch.bfloat16), ("fast", torch.float16)])  # fmt: skip
@pytest.mark.parametrize("case", [CASES[0], CASES[4], CASES[6], CASES[8]], ids=[IDS[0], IDS[4], IDS[6], IDS[8]])
def test_cuda_against_reference(case, path, dtype, monkeypatch):
    """NATTEN's windows on both CUDA paths (POSATTN_CUDA_KERNEL), forward and every gradient."""
    monkeypatch.setenv("POSATTN_CUDA_KERNEL", path)
    D = 32 if path == "fast" else 9
    x = make_relpos_inputs(case[0], H=2, D=D, Dv=D, pos=True, bias=True, requires_grad=True)
    kw = window_kw(case)
    out_ref, lse_ref = reference.relpos_attention(**x, **kw, return_lse=True)
    xc = {k: t.detach().to("cuda", dtype).requires_grad_() for k, t in x.items()}
    out, lse = ops.relpos_attention(**xc, **kw, return_lse=True)
    tol = {torch.float64: 1e-10, torch.float32: 1e-5}.get(dtype, 2e-2)
    assert _rel_err(out, out_ref) < tol and _rel_err(lse, lse_ref) < tol
    g = torch.randn(out_ref.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    want = torch.autograd.grad((out_ref * g).sum() + lse_ref.sum(), list(x.values()))
    got = torch.autograd.grad((out * g.to("cuda", dtype)).sum() + lse.sum(), list(xc.values()))
    for name, a, b in zip(x, got, want):
        assert _rel_err(a, b) < (1e-9 if dtype == torch.float64 else 1e-4 if dtype == torch.float32 else 0.05), name
