"""The windowed CPU kernel (threshold boxes small against the grid) against the reference.

Its loops: runs of up to 64 queries along the last axis (lines longer than that hold
several runs), up to 4 rows of a key line per block, features in blocks of 4 plus a
remainder, vectors of 8 or 16 lanes with a partial last vector. The grids and head dims
below make each loop run more than once and leave remainders.
"""

import math

import pytest
import torch
from helpers.relpos import assert_matches_reference, loss_grads, make_relpos_inputs

from posattn import ops, reference
from posattn.grid import span_half_widths

GRIDS = [[300], [3, 150], [2, 5, 70], [1, 9, 1, 41], [23, 1]]


def narrow_inputs(grid, sigma, *, pos=True, dtype=torch.float64, seed=0, D=9, Dv=6, H=3):
    x = make_relpos_inputs(grid, B=2, H=H, D=D, Dv=Dv, pos=pos, sigma=True, dtype=dtype, seed=seed, requires_grad=True)
    g = torch.Generator().manual_seed(seed + 1)
    s = sigma * (0.7 + 0.6 * torch.rand(x["sigma"].shape, generator=g, dtype=torch.float64))
    x["sigma"] = s.to(dtype).requires_grad_()
    return x


@pytest.fixture(autouse=True)
def window_kernel(monkeypatch):
    monkeypatch.setenv("POSATTN_CPU_KERNEL", "window")


@pytest.mark.parametrize("grid", GRIDS, ids=lambda g: "x".join(map(str, g)))
@pytest.mark.parametrize("pos", [False, True])
@pytest.mark.parametrize("mode", ["add", "multiply"])
@pytest.mark.parametrize("causal", [False, True])
def test_window_against_reference_float64(grid, pos, mode, causal):
    thr = 0.1
    x = narrow_inputs(grid, 0.04, pos=pos)
    half = span_half_widths(x["sigma"], thr, grid)
    assert all(math.prod(2 * h + 1 for h in hh) * 4 <= math.prod(grid) for hh in half)  # small boxes
    assert_matches_reference(x, dict(grid=grid, threshold=thr, causal=causal, span_mode=mode))


@pytest.mark.parametrize("grid", [[3, 150], [2, 5, 70]], ids=lambda g: "x".join(map(str, g)))
@pytest.mark.parametrize("D", [8, 32])
def test_window_float32(grid, D):
    x64 = narrow_inputs(grid, 0.05, D=D, Dv=D)
    assert_matches_reference(x64, dict(grid=grid, threshold=0.1), dtype=torch.float32, tol=2e-5, grad_tol=2e-4)


@pytest.mark.parametrize(
    "grid,causal,mode", [([13], False, "add"), ([3, 11], True, "multiply"), ([2, 3, 9], False, "add")]
)
def test_window_gradcheck(grid, causal, mode):
    x = narrow_inputs(grid, 0.08, D=3, Dv=2, H=2)
    names = list(x)

    def f(*tensors):
        return ops.relpos_attention(
            **dict(zip(names, tensors)), grid=grid, threshold=0.3, causal=causal, span_mode=mode, return_lse=True
        )

    assert torch.autograd.gradcheck(f, tuple(x.values()), eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("threads", [1, 4])
def test_window_split_over_runs(threads):
    """One (batch, head) pair, lines of several runs: forward and backward split the runs over tasks."""
    grid = [2, 150]
    x = narrow_inputs(grid, 0.03, H=1)
    x = {k: (v[:1].detach().requires_grad_() if v.dim() == 4 else v) for k, v in x.items()}
    kw = dict(grid=grid, threshold=0.1, causal=True, return_lse=True)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        o1, l1 = ops.relpos_attention(**x, **kw)
        g1 = loss_grads(o1, l1, list(x.values()))
    finally:
        torch.set_num_threads(previous)
    o2, l2 = reference.relpos_attention(**x, **kw)
    torch.testing.assert_close(o1, o2, rtol=1e-10, atol=1e-10)
    for a, b in zip(g1, loss_grads(o2, l2, list(x.values()))):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_automatic_choice_agrees_with_both_kernels(monkeypatch):
    x = narrow_inputs([40, 40], 0.03, D=8, Dv=8)
    kw = dict(grid=[40, 40], threshold=0.1, return_lse=True)
    outs = {}
    for kernel in ["auto", "tiled", "window"]:
        monkeypatch.setenv("POSATTN_CPU_KERNEL", kernel)
        out, lse = ops.relpos_attention(**x, **kw)
        outs[kernel] = (out, lse, *loss_grads(out, lse, list(x.values())))
    for kernel in ["tiled", "window"]:
        for a, b in zip(outs["auto"], outs[kernel]):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("thr", [0.0, 0.1])
def test_bad_kernel_name_is_a_clear_error(monkeypatch, thr):
    monkeypatch.setenv("POSATTN_CPU_KERNEL", "fastest")
    x = narrow_inputs([30], 0.05)
    with pytest.raises(ValueError, match="POSATTN_CPU_KERNEL must be 'auto', 'tiled' or 'window', got 'fastest'"):
        ops.relpos_attention(**x, grid=[30], threshold=thr)
