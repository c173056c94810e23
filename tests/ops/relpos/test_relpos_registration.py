"""Operator registration: opcheck, fake kernels, torch.compile."""

import pytest
import torch
from helpers.relpos import make_relpos_inputs, op_args

import posattn
from posattn import ops, reference

CASES = [
    ([7], dict(pos=True, sigma=False), {}),
    ([3, 4], dict(pos=True, sigma=True), dict(threshold=0.2)),
    ([2, 1, 3], dict(pos=False, sigma=True), dict(span_mode="multiply", causal=True)),
]


@pytest.mark.parametrize("grid,inputs,kw", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_opcheck_forward(grid, inputs, kw, dtype):
    x = make_relpos_inputs(grid, dtype=dtype, requires_grad=True, **inputs)
    torch.library.opcheck(torch.ops.posattn.relpos_attention.default, op_args(x, grid, **kw))


@pytest.mark.parametrize("grid,inputs,kw", CASES)
def test_opcheck_backward(grid, inputs, kw):
    x = make_relpos_inputs(grid, **inputs)
    out, lse = torch.ops.posattn.relpos_attention(*op_args(x, grid, **kw))
    g = torch.Generator().manual_seed(2)
    go = torch.randn(out.shape, generator=g, dtype=out.dtype)
    gl = torch.randn(lse.shape, generator=g, dtype=out.dtype)
    args = op_args(x, grid, **kw)
    torch.library.opcheck(torch.ops.posattn.relpos_attention_backward.default, args.backward_args(go, gl, out, lse))
    no_lse = args.backward_args(go, None, out, lse)
    torch.library.opcheck(torch.ops.posattn.relpos_attention_backward.default, no_lse)


def test_fake_tensor_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = make_relpos_inputs([3, 5], Dv=7, sigma=True)
        out, lse = torch.ops.posattn.relpos_attention(*op_args(x, [3, 5], threshold=0.1))
        assert out.shape == (2, 3, 15, 7) and lse.shape == (2, 3, 15)
        with pytest.raises(ValueError, match="prod\\(grid\\)"):
            torch.ops.posattn.relpos_attention(*op_args(x, [4, 5]))


class TinyRelposModule(torch.nn.Module):
    def __init__(self, grid, heads=2, dim=4):
        super().__init__()
        U = 1
        for n in grid:
            U *= 2 * n - 1
        self.grid = list(grid)
        self.proj = torch.nn.Linear(heads * dim, 3 * heads * dim, dtype=torch.float64)
        self.rel = torch.nn.Parameter(0.3 * torch.randn(heads, U, dim, dtype=torch.float64))
        self.u = torch.nn.Parameter(0.1 * torch.randn(heads, 1, dim, dtype=torch.float64))
        self.log_sigma = torch.nn.Parameter(torch.full((heads, len(grid)), -1.0, dtype=torch.float64))
        self.heads, self.dim = heads, dim

    def forward(self, x):  # x: (B, N, heads * dim)
        B, N, _ = x.shape
        q, k, v = self.proj(x).view(B, N, 3, self.heads, self.dim).permute(2, 0, 3, 1, 4)
        out = ops.relpos_attention(
            q, k, v, q + self.u, self.rel, grid=self.grid, sigma=self.log_sigma.exp(), threshold=0.05
        )
        return out.transpose(1, 2).reshape(B, N, -1)


def test_torch_compile_fullgraph_matches_eager():
    torch.manual_seed(0)
    m = TinyRelposModule([3, 5])
    x = torch.randn(2, 15, 8, dtype=torch.float64)
    eager = m(x)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    out = compiled(x)
    torch.testing.assert_close(out, eager)
    g_eager = torch.autograd.grad(eager.square().sum(), list(m.parameters()))
    g_comp = torch.autograd.grad(compiled(x).square().sum(), list(m.parameters()))
    for a, b in zip(g_comp, g_eager):
        torch.testing.assert_close(a, b)


def test_torch_compile_inductor():
    torch.manual_seed(0)
    m = TinyRelposModule([4, 3])
    x = torch.randn(1, 12, 8, dtype=torch.float64)
    compiled = torch.compile(m, fullgraph=True)
    torch.testing.assert_close(compiled(x), m(x))


def test_reference_is_exported():
    assert posattn.reference.relpos_attention is reference.relpos_attention
    assert posattn.relpos_attention is ops.relpos_attention


def test_opcheck_backward_on_strided_inputs():
    """Heads split from (B, N, H, D) projections are strided views: the fake
    kernels must report the strides the CPU kernels return (contiguous)."""
    grid = [3, 4]
    x = make_relpos_inputs(grid, sigma=True)
    strided = {k: (t.transpose(1, 2).contiguous().transpose(1, 2) if t.dim() == 4 else t) for k, t in x.items()}
    sigma = x["sigma"][:1].expand(3, 2)  # a shared sigma row, expanded to the heads
    strided["sigma"] = sigma
    assert not strided["q"].is_contiguous()
    out, lse = torch.ops.posattn.relpos_attention(*op_args(strided, grid, threshold=0.3))
    args = op_args(strided, grid, threshold=0.3).backward_args(torch.randn_like(out), None, out, lse)
    torch.library.opcheck(torch.ops.posattn.relpos_attention_backward.default, args)
