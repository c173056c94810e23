"""posattn.na1d / na2d / na3d against the real natten (its Flex backend, forward
on the CPU): outputs and log-sum-exps over a scan of grids, kernel sizes (odd,
even, per axis, equal to the grid), strides, dilations (grids they do not
divide too), causal axes and additional keys; and the dense reference (natten
has no backward on the CPU) for the gradients. The posattn-only terms (bias,
relative term, span) on top of NATTEN's windows are checked against the
reference."""

from __future__ import annotations

import math
import os
import random
import warnings

import pytest
import torch

if os.environ.get("POSATTN_REQUIRE_NATTEN"):  # CI: setup.sh installed it, a skip would hide a failure
    import natten
else:
    natten = pytest.importorskip("natten", reason="natten is not installed (scripts/setup.sh installs natten==0.21.7)")

import posattn  # noqa: E402
from posattn import reference  # noqa: E402
from posattn.neighborhood import NATTEN_PERFORMANCE_ARGS  # noqa: E402

NA = {1: natten.na1d, 2: natten.na2d, 3: natten.na3d}
PA = {1: posattn.na1d, 2: posattn.na2d, 3: posattn.na3d}


def scan(count=90, seed=0):
    """(grid, kernel_size, stride, dilation, is_causal) within natten's rules: kernel >= 2,
    kernel * dilation <= axis, stride <= kernel; hand-picked corners first."""
    cases = [
        ([16], [4], [1], [1], [False]),  # even kernel
        ([15], [15], [1], [1], [False]),  # kernel = grid (natten: plain attention)
        ([17], [5], [5], [3], [False]),  # blocks, dilation not dividing the axis
        ([20], [6], [4], [2], [True]),  # causal, strided, dilated
        ([9, 11], [4, 6], [2, 3], [2, 1], [False, True]),  # everything per axis
        ([8, 8], [8, 8], [1, 1], [1, 1], [True, False]),  # kernel = grid, causal on one axis
        ([6, 7, 9], [3, 2, 4], [1, 2, 4], [2, 3, 2], [False, False, True]),
        ([4, 5, 6], [4, 5, 6], [2, 5, 3], [1, 1, 1], [False, False, False]),
    ]
    rng = random.Random(seed)
    while len(cases) < count:
        G = rng.choice([1, 1, 2, 2, 2, 3])
        grid = [rng.randint(4, 30 if G == 1 else (12 if G == 2 else 7)) for _ in range(G)]
        dil = [rng.choice([1, 1, 2, 3]) for _ in grid]
        if any(2 * d > n for n, d in zip(grid, dil)):
            continue
        kernel = [rng.randint(2, n // d) for n, d in zip(grid, dil)]
        stride = [rng.randint(1, k) for k in kernel]
        causal = [rng.random() < 0.3 for _ in grid]
        if G == 1 and causal[0] and kernel[0] == grid[0]:
            continue  # natten hands this to its causal FMHA, which has no CPU backend
        cases.append((grid, kernel, stride, dil, causal))
    return cases


SCAN = scan()


def case_id(c):
    return "g{}-k{}-s{}-d{}-c{}".format(*("x".join(str(int(v)) for v in part) for part in c))


def heads_last(grid, B=2, H=2, D=8, Dv=8, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)

    return rand(B, *grid, H, D), rand(B, *grid, H, D), rand(B, *grid, H, Dv)


def run_natten(G, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex attention's notes on running without torch.compile
        return NA[G](*args, **kw)


@pytest.mark.parametrize("case", SCAN, ids=case_id)
def test_forward_equals_natten(case):
    grid, kernel, stride, dil, causal = case
    G = len(grid)
    q, k, v = heads_last(grid)
    kw = dict(kernel_size=tuple(kernel), stride=tuple(stride), dilation=tuple(dil), is_causal=tuple(causal))
    want, want_lse = run_natten(G, q, k, v, **kw, return_lse=True)
    got, got_lse = PA[G](q, k, v, **kw, return_lse=True)
    assert got.shape == want.shape and got_lse.shape == want_lse.shape
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(got_lse, want_lse, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("case", [SCAN[3], SCAN[4], SCAN[6]], ids=case_id)
def test_additional_keys_equal_natten(case):
    grid, kernel, stride, dil, causal = case
    G = len(grid)
    q, k, v = heads_last(grid, Dv=8)
    g = torch.Generator().manual_seed(5)
    ka, va = torch.randn(2, 5, 2, 8, generator=g), torch.randn(2, 5, 2, 8, generator=g)
    kw = dict(kernel_size=kernel, stride=stride, dilation=dil, is_causal=causal, scale=0.3)
    want, want_lse = run_natten(G, q, k, v, **kw, additional_keys=ka, additional_values=va, return_lse=True)
    got, got_lse = PA[G](q, k, v, **kw, additional_keys=ka, additional_values=va, return_lse=True)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(got_lse, want_lse, rtol=2e-5, atol=2e-5)


def test_grouped_query_heads_equal_natten():
    grid = [10, 9]
    q = heads_last(grid, H=4)[0]
    k, v = heads_last(grid, H=2, seed=1)[1:]
    kw = dict(kernel_size=(3, 4), stride=(1, 2), dilation=(2, 1))
    torch.testing.assert_close(posattn.na2d(q, k, v, **kw), run_natten(2, q, k, v, **kw), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("case", [SCAN[2], SCAN[4], SCAN[6]], ids=case_id)
def test_gradients_equal_the_reference(case):
    """natten has no CPU backward: the gradients of na*d (float64) against the dense
    reference, whose forward the scan above ties to natten."""
    grid, kernel, stride, dil, causal = case
    G = len(grid)
    x = [t.requires_grad_() for t in heads_last(grid, D=5, Dv=3, dtype=torch.float64)]
    out, lse = PA[G](*x, kernel_size=kernel, stride=stride, dilation=dil, is_causal=causal, return_lse=True)
    N = math.prod(grid)
    flat = [t.reshape(2, N, 2, t.shape[-1]).transpose(1, 2) for t in x]
    ro, rl = reference.relpos_attention(
        *flat, grid=grid, kernel_size=kernel, window_stride=stride, window_dilation=dil, window_causal=causal,
        window_border="shift", return_lse=True,
    )  # fmt: skip
    ro = ro.transpose(1, 2).reshape(out.shape)
    rl = rl.transpose(1, 2).reshape(lse.shape)
    torch.testing.assert_close(out, ro, rtol=1e-10, atol=1e-10)
    g = torch.Generator().manual_seed(7)
    go, gl = (
        torch.randn(out.shape, generator=g, dtype=torch.float64),
        torch.randn(lse.shape, generator=g, dtype=torch.float64),
    )
    a = torch.autograd.grad((out * go).sum() + (lse * gl).sum(), x)
    b = torch.autograd.grad((ro * go).sum() + (rl * gl).sum(), x)
    for name, ga, gb in zip("qkv", a, b):
        torch.testing.assert_close(ga, gb, rtol=1e-9, atol=1e-9, msg=lambda m: f"d{name}: {m}")


def test_posattn_terms_on_top_of_natten_windows():
    """A learned bias per offset, the relative term and a span, with a dilated strided window."""
    grid = [9, 8]
    H, D = 2, 4
    q, k, v = (t.requires_grad_() for t in heads_last(grid, H=H, D=D, Dv=3, dtype=torch.float64))
    U = math.prod(2 * n - 1 for n in grid)
    g = torch.Generator().manual_seed(2)
    rel = torch.randn(H, U, D, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(H, U, generator=g, dtype=torch.float64, requires_grad=True)
    sigma = (0.2 + torch.rand(H, 2, generator=g, dtype=torch.float64)).requires_grad_()
    q_pos = torch.randn(q.shape, generator=g, dtype=torch.float64)
    kw = dict(kernel_size=(3, 4), stride=(2, 1), dilation=(2, 2), is_causal=(False, True))
    out = posattn.na2d(q, k, v, **kw, q_pos=q_pos, rel=rel, bias=bias, sigma=sigma)
    flat = [t.reshape(2, 72, H, t.shape[-1]).transpose(1, 2) for t in (q, k, v, q_pos)]
    want = reference.relpos_attention(
        *flat[:3], q_pos=flat[3], rel=rel, bias=bias, sigma=sigma, grid=grid, kernel_size=(3, 4), window_stride=(2, 1),
        window_dilation=(2, 2), window_causal=(False, True), window_border="shift",
    ).transpose(1, 2).reshape(out.shape)  # fmt: skip
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    leaves = [q, k, v, rel, bias, sigma]
    for a, b in zip(torch.autograd.grad(out.sum(), leaves), torch.autograd.grad(want.sum(), leaves)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_natten_tuning_arguments_are_accepted_and_unknown_ones_refused():
    q, k, v = heads_last([12])
    want = posattn.na1d(q, k, v, kernel_size=5)
    got = posattn.na1d(q, k, v, kernel_size=5, **{name: None for name in NATTEN_PERFORMANCE_ARGS})
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    with pytest.raises(TypeError, match="unexpected keyword argument.*kernel_sizes"):
        posattn.na1d(q, k, v, kernel_size=5, kernel_sizes=5)
    with pytest.raises(TypeError):  # natten's 11th positional argument (attention_kwargs) is not return_lse
        posattn.na1d(q, k, v, 5, 1, 1, False, None, None, None, {})


def test_layout_errors_name_the_argument():
    q, k, v = heads_last([6, 7])
    with pytest.raises(ValueError, match=r"na1d: query must have shape \(B, X, H, D\)"):
        posattn.na1d(q, k, v, kernel_size=3)
    with pytest.raises(ValueError, match="key must have shape"):
        posattn.na2d(q, k[:, :5], v, kernel_size=3)
    with pytest.raises(ValueError, match="key has 3 heads, which must divide the 2 query heads"):
        posattn.na2d(q, torch.cat([k, k[..., :1, :]], -2), torch.cat([v, v[..., :1, :]], -2), kernel_size=3)
    with pytest.raises(ValueError, match=r"window_stride must be in \[1, kernel size\]"):
        posattn.na2d(q, k, v, kernel_size=3, stride=4)


@pytest.mark.parametrize(
    "rank,shape,kw",
    [
        (1, [2, 19, 16], dict(kernel_size=5, dilation=3, is_causal=True)),
        (2, [2, 9, 10, 16], dict(kernel_size=(4, 3), stride=(2, 1), dilation=(1, 3))),
        (3, [1, 5, 6, 7, 16], dict(kernel_size=(2, 3, 3), is_causal=(True, False, False))),
    ],
)
def test_modules_load_natten_weights_and_give_its_outputs(rank, shape, kw):
    torch.manual_seed(0)
    theirs = getattr(natten, f"NeighborhoodAttention{rank}D")(16, 2, **kw).eval()
    ours = getattr(posattn.nn, f"NeighborhoodAttention{rank}D")(16, 2, **kw).eval()
    ours.load_state_dict(theirs.state_dict())  # same names and shapes
    x = torch.randn(shape)
    with warnings.catch_warnings(), torch.no_grad():  # natten's Flex backend: no CPU backward
        warnings.simplefilter("ignore")
        want = theirs(x)
    torch.testing.assert_close(ours(x), want, rtol=2e-5, atol=2e-5)
    ours(x).sum().backward()  # and it trains (natten has no CPU backward)
    assert all(p.grad is not None for p in ours.parameters())


def test_module_relative_position_bias_is_a_bias_per_window_offset():
    """rpb's entry t on an axis is the bias of an offset of d t cells (t within the kernel's
    reach k - 1); the bias is built here offset by offset, independently of offset_bias."""
    torch.manual_seed(1)
    m = posattn.nn.NeighborhoodAttention2D(8, 2, kernel_size=(3, 4), dilation=(2, 1), rel_pos_bias=True).double()
    grid = [8, 9]
    delta = posattn.grid.relative_offsets(grid).tolist()
    want_bias = torch.zeros(2, len(delta), dtype=torch.float64)
    inside = 0
    for u, (d0, d1) in enumerate(delta):
        if d0 % 2 == 0 and -2 <= d0 // 2 <= 2 and -3 <= d1 <= 3:
            want_bias[:, u] = m.rpb.detach()[:, d0 // 2 + 2, d1 + 3]
            inside += 1
    assert inside == 5 * 7
    torch.testing.assert_close(m.offset_bias(grid), want_bias, rtol=0, atol=0)
    x = torch.randn(2, *grid, 8, dtype=torch.float64)
    q, k, v = m.qkv(x).reshape(2, 72, 3, 2, 4).permute(2, 0, 3, 1, 4)
    want = reference.relpos_attention(
        q, k, v, grid=grid, bias=want_bias, kernel_size=(3, 4), window_dilation=(2, 1), window_border="shift",
    )  # fmt: skip
    want = m.proj(want.transpose(1, 2).reshape(2, *grid, 8))
    torch.testing.assert_close(m(x), want, rtol=1e-10, atol=1e-10)
    m(x).sum().backward()
    assert m.rpb.grad is not None and m.rpb.grad.abs().sum() > 0


def test_module_errors():
    with pytest.raises(ValueError, match="num_heads must divide embed_dim"):
        posattn.nn.NeighborhoodAttention2D(10, 3, kernel_size=3)
    with pytest.raises(ValueError, match="kernel_size must give 2 values"):
        posattn.nn.NeighborhoodAttention2D(8, 2, kernel_size=(3, 3, 3))
    m = posattn.nn.NeighborhoodAttention2D(8, 2, kernel_size=3)
    with pytest.raises(ValueError, match=r"x must have shape \(B, 2 grid axes, 8\)"):
        m(torch.randn(2, 5, 8))
