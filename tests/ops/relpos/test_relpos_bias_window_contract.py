"""The checks and registration of relpos_attention's bias and window arguments
(errors naming the argument, opcheck, torch.compile)."""

import math

import pytest
import torch
from helpers.relpos import make_relpos_inputs, op_args

from posattn import ops

# --- bad input -------------------------------------------------------------


def test_bad_bias():
    x = make_relpos_inputs([3, 4], pos=False)
    H, U = 3, 5 * 7
    with pytest.raises(ValueError, match=r"bias must have shape \(H, U\) = \(3, 35\)"):
        ops.relpos_attention(**x, grid=[3, 4], bias=torch.zeros(H, U + 1, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"bias must have shape"):
        ops.relpos_attention(**x, grid=[3, 4], bias=torch.zeros(U, dtype=torch.float64))
    with pytest.raises(TypeError, match="bias has dtype torch.float32 but q has dtype torch.float64"):
        ops.relpos_attention(**x, grid=[3, 4], bias=torch.zeros(H, U))
    with pytest.raises(TypeError, match="bias must be a floating-point tensor"):
        ops.relpos_attention(**x, grid=[3, 4], bias=torch.zeros(H, U, dtype=torch.long))
    with pytest.raises(ValueError, match="bias is on meta"):
        ops.relpos_attention(**x, grid=[3, 4], bias=torch.zeros(H, U, dtype=torch.float64, device="meta"))
    with pytest.raises(TypeError, match="bias must be a tensor"):
        ops.relpos_attention(**x, grid=[3, 4], bias=[[0.0] * U] * H)


@pytest.mark.parametrize(
    "window,err,match",
    [
        ([1, -1], ValueError, r"window half widths must be >= 0, got \[1, -1\] \(axis 1\)"),
        (-2, ValueError, "window half widths must be >= 0"),
        ([1, 1, 1], ValueError, r"window must give one half width per grid axis \(2 for grid \[3, 4\]\), got 3"),
        ([1], ValueError, "one half width per grid axis"),
        ([1.5, 2], TypeError, "window must be an int or a sequence of ints"),
        (True, TypeError, "window must be an int or a sequence of ints"),
        ("2", TypeError, "window must be an int or a sequence of ints"),
    ],
)
def test_bad_window(window, err, match):
    x = make_relpos_inputs([3, 4])
    with pytest.raises(err, match=match):
        ops.relpos_attention(**x, grid=[3, 4], window=window)


def test_bad_window_border():
    x = make_relpos_inputs([3, 4])
    with pytest.raises(ValueError, match='window_border must be "clip" or "shift", got \'natten\''):
        ops.relpos_attention(**x, grid=[3, 4], window=1, window_border="natten")


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(bias=torch.zeros(3, 36, dtype=torch.float64)), r"bias must have shape \(H, U\) = \(3, 35\)"),
        (dict(window=[1, -1]), "window half widths must be >= 0"),
        (dict(window=[1, 1, 1]), "one half width per grid axis"),
        (dict(window=[1, 1], window_border="centre"), 'window_border must be "clip" or "shift"'),
    ],
)
def test_kernel_checks_the_new_arguments_too(kw, match):
    """The C++ checks (callers of torch.ops.posattn.* skip the Python wrapper)."""
    x = make_relpos_inputs([3, 4])
    args = (x["q"], x["k"], x["v"], x["q_pos"], x["rel"], [3, 4], None, 0.0, "add", 0.5, False)
    with pytest.raises(ValueError, match=match):
        torch.ops.posattn.relpos_attention(*args, **kw)


# --- registration ----------------------------------------------------------


OPCHECK_CASES = [
    ([7], dict(pos=False, bias=True), dict(window=[2])),
    ([3, 4], dict(pos=True, bias=True, sigma=True), dict(threshold=0.2, window=[1, 1], window_border="shift")),
    ([2, 1, 3], dict(pos=True, bias=False), dict(window=[0, 0, 1])),
]


@pytest.mark.parametrize("grid,inputs,kw", OPCHECK_CASES)
def test_opcheck(grid, inputs, kw):
    x = make_relpos_inputs(grid, requires_grad=True, **inputs)
    torch.library.opcheck(torch.ops.posattn.relpos_attention.default, op_args(x, grid, **kw))
    x = {k: v.detach() for k, v in x.items()}
    out, lse = torch.ops.posattn.relpos_attention(*op_args(x, grid, **kw))
    go, gl = torch.randn_like(out), torch.randn_like(lse)
    backward_args = op_args(x, grid, **kw).backward_args(go, gl, out, lse)
    torch.library.opcheck(torch.ops.posattn.relpos_attention_backward.default, backward_args)


class BiasWindowModule(torch.nn.Module):
    def __init__(self, grid, heads=2):
        super().__init__()
        self.grid = grid
        self.bias = torch.nn.Parameter(torch.randn(heads, math.prod(2 * n - 1 for n in grid)))

    def forward(self, x):
        return ops.relpos_attention(x, x, x, grid=self.grid, bias=self.bias, window=1, window_border="shift")


def test_torch_compile_fullgraph():
    m = BiasWindowModule([4, 5])
    x = torch.randn(2, 2, 20, 4)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), m(x))
    g_eager = torch.autograd.grad(m(x).square().sum(), m.bias)[0]
    g_comp = torch.autograd.grad(compiled(x).square().sum(), m.bias)[0]
    torch.testing.assert_close(g_comp, g_eager)
