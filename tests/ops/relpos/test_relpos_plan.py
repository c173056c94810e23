"""posattn.ops.relpos_plan: which kernels run a call (csrc/core/relpos_plan.h), as the
operator decides it: the CPU plan against the kernel that actually runs, the
environment overrides, the arguments checked as the operator checks them, and the
CUDA plan (cases marked cuda: skipped without a GPU)."""

import pytest
import torch
from helpers.relpos import make_relpos_inputs

from posattn import ops

GRID = [24, 24]


@pytest.fixture(autouse=True)
def no_overrides(monkeypatch):
    monkeypatch.delenv("POSATTN_CPU_KERNEL", raising=False)
    monkeypatch.delenv("POSATTN_CUDA_KERNEL", raising=False)


def inputs(dtype=torch.float32, device="cpu", D=8, grid=GRID):
    x = make_relpos_inputs(grid, B=1, H=2, D=D, Dv=D, dtype=dtype, device=device)
    return x["q"], x["k"], x["v"], x["q_pos"], x["rel"]


@pytest.mark.parametrize(
    "kw,kernel,reason",
    [
        ({}, "tiled", "the windowed kernels decline it: no span threshold or window"),
        (dict(window=2), "window", "a small box of keys per query"),
        (dict(window=9), "tiled", "a box of more than 1/2 of the keys (D <= 16)"),
        (dict(kernel_size=5, window_stride=[1, 2]), "tiled", "a window stride on the grid's last axis"),
    ],
)
def test_the_cpu_plan_and_its_reason(kw, kernel, reason):
    q, k, v, qp, rel = inputs()
    plan = ops.relpos_plan(q, k, v, qp, rel, grid=GRID, **kw)
    assert plan["device"] == "cpu" and plan["isa"] == ops.cpu_capability()
    assert plan["forward"] == plan["backward"] == kernel
    assert reason in plan["reason"], plan
    assert ops.relpos_plan(q, k, v, qp, rel, grid=GRID, backward=True, **kw) == plan


@pytest.mark.parametrize("kw", [{}, dict(window=2), dict(window=9)], ids=["dense", "small-window", "wide-window"])
def test_the_kernel_the_plan_names_is_the_one_that_runs(kw, monkeypatch):
    # the two CPU kernels round differently: the automatic call is bitwise the forced run of the planned kernel
    q, k, v, qp, rel = inputs()
    args = dict(grid=GRID, return_lse=True, **kw)
    planned = ops.relpos_plan(q, k, v, qp, rel, **args)["forward"]
    out, lse = ops.relpos_attention(q, k, v, qp, rel, **args)
    monkeypatch.setenv("POSATTN_CPU_KERNEL", planned)
    want_out, want_lse = ops.relpos_attention(q, k, v, qp, rel, **args)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


def test_the_environment_overrides_go_through_the_plan(monkeypatch):
    q, k, v, qp, rel = inputs()
    monkeypatch.setenv("POSATTN_CPU_KERNEL", "tiled")
    assert ops.relpos_plan(q, k, v, qp, rel, grid=GRID, window=2)["reason"] == "POSATTN_CPU_KERNEL=tiled"
    monkeypatch.setenv("POSATTN_CPU_KERNEL", "window")
    plan = ops.relpos_plan(q, k, v, qp, rel, grid=GRID, window=9)
    assert plan["forward"] == "window" and plan["reason"] == "POSATTN_CPU_KERNEL=window"
    # a request the windowed kernels cannot take: the tiled ones, saying why
    plan = ops.relpos_plan(q, k, v, qp, rel, grid=GRID)
    assert plan["forward"] == "tiled" and "no span threshold or window" in plan["reason"]
    monkeypatch.setenv("POSATTN_CPU_KERNEL", "fastest")
    with pytest.raises(ValueError, match="POSATTN_CPU_KERNEL must be 'auto', 'tiled' or 'window', got 'fastest'"):
        ops.relpos_plan(q, k, v, qp, rel, grid=GRID)


def test_arguments_as_relpos_attention_takes_them():
    q, k, v, qp, rel = inputs()
    want = ops.relpos_plan(q, k, v, qp, rel, grid=GRID, window=2)
    # positionally, return_lse included (ignored), as relpos_attention's signature has them
    assert ops.relpos_plan(q, k, v, qp, rel, GRID, None, 0.0, "add", None, False, True, None, 2) == want
    # dilation 5 on an axis of 24: sub-grids of 5 cells (residues 0-3) and 4 (residue 4): two op calls
    plan = ops.relpos_plan(q, k, v, qp, rel, grid=GRID, kernel_size=3, window_dilation=[5, 1])
    assert plan["op_calls"] == "2" and plan["forward"] in ("tiled", "window")
    extra = torch.randn(1, 2, 3, 8)
    assert "extra_tokens" in ops.relpos_plan(q, k, v, grid=GRID, additional_keys=extra, additional_values=extra)


def test_bad_arguments_raise_what_the_operator_raises():
    q, k, v, qp, rel = inputs()
    with pytest.raises(ValueError, match=r"rel must have shape \(H, U, D\)"):
        ops.relpos_plan(q, k, v, qp, rel[:, :-1], grid=GRID)
    with pytest.raises(ValueError, match=r"rel must have shape \(H, U, D\)"):  # the raw op's C++ checks
        torch.ops.posattn.relpos_plan(q, k, v, qp, rel[:, :-1], GRID, None, 0.0, "add", 1.0, False)
    with pytest.raises(TypeError, match="backward must be True or False"):
        ops.relpos_plan(q, k, v, grid=GRID, backward="yes")
    with pytest.raises(ValueError, match="sigma must be positive and finite"):
        ops.relpos_plan(q, k, v, grid=GRID, sigma=torch.zeros(2, 2), threshold=0.1)


@pytest.mark.cuda
@pytest.mark.parametrize(
    "dtype,D,path",
    [(torch.float64, 8, "general"), (torch.bfloat16, 64, "fast"), (torch.float16, 48, "general")],
)
def test_the_cuda_plan(dtype, D, path):
    q, k, v, qp, rel = inputs(dtype, "cuda", D)
    fwd = ops.relpos_plan(q, k, v, qp, rel, grid=GRID)
    forward = path
    assert fwd["device"] == "cuda" and fwd["forward"] == forward and "error" not in fwd, fwd
    bwd = ops.relpos_plan(q, k, v, qp, rel, grid=GRID, backward=True)
    # d rel, d bias, d sigma: the fast offset kernel beside the fast backward (D = 64, 2-D: it fits)
    assert bwd["backward"] == forward and bwd["offsets"] == forward, bwd
    if path == "general":
        assert bwd["offsets"] == "general" and bwd["reason"].startswith("the fast kernels cannot take it")
        assert fwd["reason"].startswith("the fast kernels cannot take it"), fwd


@pytest.mark.cuda
def test_the_cuda_plan_follows_the_environment(monkeypatch):
    q, k, v, qp, rel = inputs(torch.float64, "cuda")
    monkeypatch.setenv("POSATTN_CUDA_KERNEL", "fast")
    assert (
        "POSATTN_CUDA_KERNEL=fast, but the fast kernels cannot take this call"
        in ops.relpos_plan(q, k, v, qp, rel, grid=GRID)["error"]
    )
    monkeypatch.setenv("POSATTN_CUDA_KERNEL", "tiled")  # (removed on 2026-11-29: a clear error)
    with pytest.raises(ValueError, match="the tiled CUDA kernels were removed"):
        ops.relpos_plan(q, k, v, qp, rel, grid=GRID)
    monkeypatch.setenv("POSATTN_CUDA_KERNEL", "general")
    assert ops.relpos_plan(q, k, v, qp, rel, grid=GRID)["reason"] == "POSATTN_CUDA_KERNEL=general"
