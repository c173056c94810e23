"""relpos_attention's learned bias (Swin / T5 style) and fixed windows (clipped, or
shifted by NATTEN's border rule) against the reference, on both CPU kernels."""

import itertools
import math

import pytest
import torch
from helpers.relpos import assert_matches_reference, make_relpos_inputs

from posattn import ops, reference


@pytest.fixture(params=["tiled", "window"], autouse=True)
def cpu_kernel(request, monkeypatch):
    """With a box (threshold or window) POSATTN_CPU_KERNEL picks either CPU kernel."""
    monkeypatch.setenv("POSATTN_CPU_KERNEL", request.param)
    return request.param


GRIDS = [[1], [7], [1, 5], [3, 5], [5, 1], [4, 1, 3], [2, 3, 4]]
# (q_pos/rel, span mode or None, threshold, window half width or None, border, causal); every case has a bias
# or a window, most have both.
CASES = [
    c
    for c in itertools.product(
        [False, True], [None, "add", "multiply"], [0.0, 0.3], [None, 1, 2], ["clip", "shift"], [False, True]
    )
    if not (c[2] > 0 and c[1] is None) and not (c[3] is None and c[4] == "shift")
]


@pytest.mark.parametrize("grid", GRIDS, ids=lambda g: "x".join(map(str, g)))
@pytest.mark.parametrize("pos,mode,thr,win,border,causal", CASES)
def test_bias_and_window_float64(grid, pos, mode, thr, win, border, causal):
    x = make_relpos_inputs(grid, pos=pos, sigma=mode is not None, bias=True, requires_grad=True)
    kw = dict(grid=grid, threshold=thr, span_mode=mode or "add", causal=causal, window=win, window_border=border)
    assert_matches_reference(x, kw)


@pytest.mark.parametrize("grid", [[7], [3, 5], [2, 3, 4]], ids=lambda g: "x".join(map(str, g)))
@pytest.mark.parametrize("win,border", [(None, "clip"), (1, "clip"), (1, "shift")])
def test_window_without_bias_float64(grid, win, border):
    x = make_relpos_inputs(grid, pos=True, requires_grad=True)
    assert_matches_reference(x, dict(grid=grid, window=win, window_border=border))


@pytest.mark.parametrize("grid", [[9], [4, 7], [3, 2, 5]], ids=lambda g: "x".join(map(str, g)))
@pytest.mark.parametrize(
    "pos,mode,win,border",
    [(False, None, None, "clip"), (True, "add", 1, "clip"), (False, "multiply", 2, "shift"), (True, None, 1, "shift")],
)
def test_float32_against_float64_reference(grid, pos, mode, win, border):
    x64 = make_relpos_inputs(grid, pos=pos, sigma=mode is not None, bias=True, requires_grad=True)
    kw = dict(grid=grid, span_mode=mode or "add", window=win, window_border=border)
    assert_matches_reference(x64, kw, dtype=torch.float32, tol=2e-5, grad_tol=1e-4)


@pytest.mark.parametrize(
    "grid,win,border,thr",
    [
        ([2, 3], [1, 1], "shift", 0.0),
        ([5], [1], "clip", 0.3),
        ([3, 1, 4], [1, 0, 1], "shift", 0.3),
        ([4], None, "clip", 0.0),
    ],
)
def test_gradcheck_with_bias(grid, win, border, thr):
    x = make_relpos_inputs(grid, B=1, H=2, D=3, Dv=2, sigma=thr > 0, bias=True, requires_grad=True)
    names = list(x)

    def f(*tensors):
        return ops.relpos_attention(
            **dict(zip(names, tensors)), grid=grid, threshold=thr, window=win, window_border=border, return_lse=True
        )

    assert torch.autograd.gradcheck(f, tuple(x.values()), eps=1e-6, atol=1e-7, rtol=1e-5)


# Large enough for every loop of both kernels to run more than once: several key chunks
# and query tiles (tiled), several runs per line, blocks of rows, feature blocks with
# remainders and partial vectors (windowed).
@pytest.mark.parametrize(
    "grid,win,border,thr",
    [
        ([300], [5], "clip", 0.0),
        ([300], [5], "shift", 0.1),
        ([3, 150], [1, 4], "shift", 0.0),
        ([2, 5, 70], [1, 2, 3], "clip", 0.1),
        ([40, 45], [3, 3], "shift", 0.0),
        ([40, 45], None, "clip", 0.0),
        ([23, 1], [2, 0], "shift", 0.0),
    ],
)
def test_large_grids(grid, win, border, thr):
    x = make_relpos_inputs(grid, B=2, H=2, D=9, Dv=6, sigma=thr > 0, bias=True, requires_grad=True)
    if thr > 0:
        x["sigma"] = (x["sigma"].detach() * 0.1).requires_grad_()
    kw = dict(grid=grid, threshold=thr, window=win, window_border=border)
    assert_matches_reference(x, kw)


def natten_start(i: int, n: int, radius: int) -> int:
    """NATTEN's get_window_start (no dilation), written as its source writes it."""
    return max(i - radius, 0) + (i + radius >= n) * (n - i - radius - 1)


def natten_keep(grid, radius):
    """(N, N) keep mask of neighbourhood attention with kernel 2 radius + 1 per axis,
    from NATTEN's definition (a kernel at least as large as an axis covers it)."""
    coords = list(itertools.product(*[range(n) for n in grid]))
    keep = torch.zeros(len(coords), len(coords), dtype=torch.bool)
    for a, ci in enumerate(coords):
        for b, cj in enumerate(coords):
            ok = True
            for d, n in enumerate(grid):
                k = 2 * radius[d] + 1
                start = 0 if k >= n else natten_start(ci[d], n, radius[d])
                size = min(k, n)
                ok &= start <= cj[d] < start + size
            keep[a, b] = ok
    return keep


@pytest.mark.parametrize("grid,radius", [([9], [2]), ([7, 6], [1, 2]), ([3, 5, 4], [1, 1, 3]), ([4, 5], [3, 0])])
def test_shift_border_is_nattens_rule(grid, radius):
    """With q = k = 0 every kept key has the same weight, so identity values give the
    attention weights themselves: 1 / |window| on the window, 0 elsewhere."""
    N = math.prod(grid)
    q = torch.zeros(1, 1, N, 2, dtype=torch.float64)
    v = torch.eye(N, dtype=torch.float64)[None, None]
    want = natten_keep(grid, radius)
    sizes = want.sum(-1, keepdim=True).double()
    assert (sizes == math.prod(min(2 * r + 1, n) for n, r in zip(grid, radius))).all()  # the same for every query
    out = ops.relpos_attention(q, q, v, grid=grid, window=radius, window_border="shift")[0, 0]
    torch.testing.assert_close(out, want / sizes, rtol=0, atol=1e-15)
    ref_keep = torch.isfinite(reference.relpos_scores(q, q, grid=grid, window=radius, window_border="shift"))[0, 0]
    assert torch.equal(ref_keep, want)


def test_clip_border_keeps_the_centred_box():
    grid = [6, 5]
    N = math.prod(grid)
    q = torch.zeros(1, 1, N, 2, dtype=torch.float64)
    v = torch.eye(N, dtype=torch.float64)[None, None]
    out = ops.relpos_attention(q, q, v, grid=grid, window=[1, 2])[0, 0]
    coords = torch.tensor(list(itertools.product(range(6), range(5))))
    delta = (coords[None] - coords[:, None]).abs()
    want = (delta[..., 0] <= 1) & (delta[..., 1] <= 2)
    torch.testing.assert_close(out, want / want.sum(-1, keepdim=True).double(), rtol=0, atol=1e-15)


def test_bias_only_is_swin_style():
    """bias alone: softmax(scale q.k + B[h, offset]) (the Swin / T5 form), against an
    eager composition with a gathered (H, N, N) bias."""
    grid = [4, 5]
    x = make_relpos_inputs(grid, pos=False, bias=True)
    from posattn.grid import grid_coords, offset_rows

    c = grid_coords(grid)
    rows = offset_rows(c[None] - c[:, None], grid)
    want = torch.nn.functional.scaled_dot_product_attention(x["q"], x["k"], x["v"], attn_mask=x["bias"][:, rows])
    torch.testing.assert_close(ops.relpos_attention(**x, grid=grid), want, rtol=1e-10, atol=1e-10)


def test_window_intersects_span_box_and_causal():
    grid = [9, 8]
    x = make_relpos_inputs(grid, pos=False, sigma=True)
    x["sigma"] = torch.full_like(x["sigma"], 0.1)  # box half width 2 on both axes
    kw = dict(grid=grid, threshold=0.3, window=[3, 1], window_border="shift", causal=True)
    s = reference.relpos_scores(x["q"], x["k"], sigma=x["sigma"], **kw)
    keep = torch.isfinite(s[0, 0])
    coords = torch.tensor(list(itertools.product(range(9), range(8))))
    delta = coords[None] - coords[:, None]
    assert not keep[(delta[..., 0].abs() > 2) | (delta[..., 1].abs() > 2)].any()  # inside the span box
    assert not keep.triu(1).any()  # causal
    out = ops.relpos_attention(**x, **kw)
    torch.testing.assert_close(out, reference.relpos_attention(**x, **kw), rtol=1e-10, atol=1e-10)


def test_window_half_width_larger_than_the_grid_keeps_every_key():
    grid = [3, 4]
    x = make_relpos_inputs(grid, bias=True)
    full = ops.relpos_attention(**x, grid=grid)
    for border in ("clip", "shift"):
        torch.testing.assert_close(
            ops.relpos_attention(**x, grid=grid, window=10**12, window_border=border), full, rtol=1e-12, atol=1e-12
        )


def test_window_beyond_int64_is_the_whole_axis():
    x = make_relpos_inputs([3, 4], bias=True)
    out = ops.relpos_attention(**x, grid=[3, 4], window=[2**63, 2**70])
    torch.testing.assert_close(out, ops.relpos_attention(**x, grid=[3, 4]), rtol=1e-12, atol=1e-12)


def test_reference_checks_window_too():
    x = make_relpos_inputs([3, 4])
    with pytest.raises(ValueError, match="one half width per grid axis"):
        reference.relpos_attention(**x, grid=[3, 4], window=[0])
    with pytest.raises(ValueError, match="window half widths must be >= 0"):
        reference.relpos_attention(**x, grid=[3, 4], window=[-1, 0])
    with pytest.raises(ValueError, match="window_border must be"):
        reference.relpos_attention(**x, grid=[3, 4], window=1, window_border="bogus")


def test_window_zero_keeps_only_the_query():
    x = make_relpos_inputs([5, 3], bias=True)
    out = ops.relpos_attention(**x, grid=[5, 3], window=0)
    torch.testing.assert_close(out, x["v"], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("threads", [1, 2])
def test_bias_gradient_is_deterministic(threads):
    """d bias is reduced over tasks without atomics: bitwise equal from run to run."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = make_relpos_inputs([12, 11], B=1, H=1, D=8, bias=True, dtype=torch.float32, requires_grad=True)
        grads = []
        for _ in range(3):
            out = ops.relpos_attention(**x, grid=[12, 11], window=3)
            grads.append(torch.autograd.grad(out.square().sum(), x["bias"])[0])
        assert all(torch.equal(grads[0], g) for g in grads[1:])
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("B,H,threads", [(1, 1, 2), (2, 2, 2), (4, 3, 2), (1, 2, 1)])
def test_bias_gradient_per_head_or_partials(B, H, threads):
    """The backward's task split (one task per head, or per-task partials summed)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = make_relpos_inputs([6, 7], B=B, H=H, pos=False, bias=True, requires_grad=True)
        assert_matches_reference(x, dict(grid=[6, 7], window=2))
    finally:
        torch.set_num_threads(before)
