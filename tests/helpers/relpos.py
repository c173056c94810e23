"""Inputs for the operators' tests, and the devices every op test runs on."""

import math

import pytest
import torch

from posattn import ops, reference

# Every device an op test runs on: the CUDA cases are marked (conftest.py skips them,
# with the reason, where no GPU is present), so each CPU behaviour has its CUDA twin.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def make_relpos_inputs(
    grid,
    *,
    B=2,
    H=3,
    D=5,
    Dv=4,
    pos=True,
    sigma=False,
    bias=False,
    dtype=torch.float64,
    device="cpu",
    seed=0,
    requires_grad=False,
):
    """Random inputs for relpos_attention on `grid` (never zeros)."""
    g = torch.Generator().manual_seed(seed)
    N = math.prod(grid)
    U = math.prod(2 * n - 1 for n in grid)

    def rand(*shape, scale=1.0):
        t = (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype=dtype, device=device)
        return t.requires_grad_(requires_grad)

    x = dict(q=rand(B, H, N, D), k=rand(B, H, N, D), v=rand(B, H, N, Dv))
    if pos:
        x["q_pos"] = rand(B, H, N, D)
        x["rel"] = rand(H, U, D, scale=0.7)
    if bias:
        x["bias"] = rand(H, U, scale=0.8)
    if sigma:
        s = (0.15 + 0.6 * torch.rand(H, len(grid), generator=g, dtype=torch.float64)).to(dtype=dtype, device=device)
        x["sigma"] = s.requires_grad_(requires_grad)
    return x


def rel_err(got, want):
    """Largest error on the finite entries of `want`, relative to their largest magnitude (at
    least 1), after checking that `got` is finite exactly where `want` is."""
    want = want.detach().double().cpu()
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got.detach().double().cpu()))
    err = (got.detach().double().cpu()[finite] - want[finite]).abs().max().item() if finite.any() else 0.0
    return err / max(1.0, want[finite].abs().max().item() if finite.any() else 1.0)


def loss_grads(out, lse, inputs, seed=1):
    """The gradients of a random linear loss of (out, lse) (a row without keys, lse = -inf, adds nothing)."""
    g = torch.Generator().manual_seed(seed)
    go = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.device, out.dtype)
    gl = torch.randn(lse.shape, generator=g, dtype=torch.float64).to(lse.device, lse.dtype)
    loss = (out * go).sum() + (torch.where(torch.isfinite(lse), lse, 0) * gl).sum()
    return torch.autograd.grad(loss, inputs)


def assert_matches_reference(x, kw, *, tol=1e-10, grad_tol=1e-9, device=None, dtype=None):
    """posattn.ops.relpos_attention against posattn.reference.relpos_attention on the
    same inputs: out, lse and the gradient of every input of ``x`` (float64 tensors
    that require grad) of a random loss. The op runs on copies of x on ``device`` in
    ``dtype`` (default: x's own), the reference on x; each result is compared in
    float64, within ``tol`` (``grad_tol``) relative and that times the reference's
    largest magnitude (at least 1) absolute."""
    names = list(x)
    xo = x
    if device is not None or dtype is not None:
        xo = {n: t.detach().to(device or t.device, dtype or t.dtype).requires_grad_() for n, t in x.items()}
    o1, l1 = ops.relpos_attention(**xo, **kw, return_lse=True)
    o2, l2 = reference.relpos_attention(**x, **kw, return_lse=True)

    def close(name, got, want, tol):
        want = want.detach()
        got = got.detach().to(want.device, want.dtype)
        scale = max(1.0, want[torch.isfinite(want)].abs().max().item() if want.numel() else 1.0)
        torch.testing.assert_close(got, want, rtol=tol, atol=tol * scale, msg=lambda m: f"{name}: {m}")

    close("out", o1, o2, tol)
    close("lse", l1, l2, tol)
    for name, a, b in zip(names, loss_grads(o1, l1, [xo[n] for n in names]), loss_grads(o2, l2, [x[n] for n in names])):
        close("d" + name, a, b, grad_tol)


def op_args(x, grid, **kw) -> ops.RelposArgs:
    """The raw operator's arguments (torch.ops.posattn.relpos_attention, schema order) for
    inputs ``x`` (make_relpos_inputs) on ``grid``: scale 0.4 and the schema's defaults unless
    ``kw`` names them (RelposArgs.backward_args gives the backward operator's)."""
    t = dict(q=x["q"], k=x["k"], v=x["v"], q_pos=x.get("q_pos"), rel=x.get("rel"), sigma=x.get("sigma"))
    return ops.RelposArgs(**t, grid=grid, bias=x.get("bias"), **{"scale": 0.4, **kw})
