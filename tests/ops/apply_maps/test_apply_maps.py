"""apply_maps operator: reference agreement, gradients, registration, bad input."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from posattn import ops, reference


def make(B=2, H=3, N=7, A=2, m=4, P=5, batched=False, dtype=torch.float64, device="cpu", seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, H, N, A * m, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)
    maps = torch.randn(P, H, A, m, m, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)
    shape = (B, N, A) if batched else (N, A)
    index = torch.randint(0, P, shape, generator=g).to(device)
    return x.requires_grad_(grad), maps.requires_grad_(grad), index


CASES = [dict(), dict(batched=True), dict(A=1, m=8), dict(A=3, m=2, P=1), dict(N=1, B=1, H=1), dict(m=1, A=4)]


@pytest.mark.parametrize("kw", CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matches_reference_forward_and_backward(kw, dtype):
    x, maps, index = make(dtype=dtype, grad=True, **kw)
    y, y_ref = ops.apply_maps(x, maps, index), reference.apply_maps(x, maps, index)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y, y_ref, **tol)
    g = torch.randn_like(y)
    for a, b in zip(torch.autograd.grad(y, (x, maps), g), torch.autograd.grad(y_ref, (x, maps), g)):
        torch.testing.assert_close(a, b, **tol)
    assert y.abs().max() > 0


def test_block_formula_by_hand():
    x, maps, index = make(batched=True)
    y = ops.apply_maps(x, maps, index)
    b, h, n, a, m = 1, 2, 5, 1, 4
    expected = maps[index[b, n, a], h, a] @ x[b, h, n, a * m : (a + 1) * m]
    torch.testing.assert_close(y[b, h, n, a * m : (a + 1) * m], expected)


@pytest.mark.parametrize("kw", [dict(), dict(batched=True), dict(A=1, m=3, P=2)])
def test_gradcheck(kw):
    x, maps, index = make(B=2, H=2, N=4, grad=True, **kw)
    assert torch.autograd.gradcheck(lambda a, b: ops.apply_maps(a, b, index), (x, maps))


def test_only_needed_gradients_are_computed():
    x, maps, index = make()
    x.requires_grad_(True)
    y = ops.apply_maps(x, maps, index)
    (gx,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(gx, torch.autograd.grad(reference.apply_maps(x, maps, index).sum(), x)[0])


@pytest.mark.parametrize("kw", [dict(), dict(batched=True)])
def test_opcheck(kw):
    x, maps, index = make(dtype=torch.float32, grad=True, **kw)
    torch.library.opcheck(torch.ops.posattn.apply_maps.default, (x, maps, index))
    gy = torch.randn(x.shape)
    torch.library.opcheck(
        torch.ops.posattn.apply_maps_backward.default, (gy, x.detach(), maps.detach(), index, True, True)
    )
    torch.library.opcheck(
        torch.ops.posattn.apply_maps_backward.default, (gy, x.detach(), maps.detach(), index, False, True)
    )


def test_torch_compile_fullgraph():
    x, maps, index = make(dtype=torch.float32, grad=True)
    f = torch.compile(lambda a, b: ops.apply_maps(a, b, index).square().sum(), backend="aot_eager", fullgraph=True)
    out = f(x, maps)
    torch.testing.assert_close(out, ops.apply_maps(x, maps, index).square().sum())
    out.backward()
    assert maps.grad.abs().max() > 0


def test_non_contiguous_and_empty_inputs():
    x, maps, index = make()
    xt = x.transpose(0, 1).contiguous().transpose(0, 1)
    torch.testing.assert_close(ops.apply_maps(xt, maps, index), reference.apply_maps(x, maps, index))
    empty = torch.empty(0, 3, 7, 8, dtype=torch.float64)
    assert ops.apply_maps(empty, maps, index).shape == (0, 3, 7, 8)


@pytest.mark.parametrize(
    "mutate, exc, match",
    [
        (lambda x, M, i: (x[0], M, i), ValueError, "x must have shape \\(B, H, N, D\\)"),
        (lambda x, M, i: (x, M[0], i), ValueError, "maps must have shape \\(P, H, A, m, m\\)"),
        (lambda x, M, i: (x, M[..., :3], i), ValueError, "maps must hold square m x m blocks"),
        (lambda x, M, i: (x, M[:, :2], i), ValueError, "maps has 2 heads but x has 3"),
        (lambda x, M, i: (x, M[:0], i), ValueError, "maps must have P, A, m >= 1"),
        (lambda x, M, i: (x[..., :6], M, i), ValueError, "A \\* m = 2 \\* 4 = 8 must equal the head dim D = 6"),
        (lambda x, M, i: (x, M, i[:, :1]), ValueError, "index must be \\(N, A\\)"),
        (lambda x, M, i: (x, M, i[None, None]), ValueError, "index must be \\(N, A\\)"),
        (lambda x, M, i: (x, M, i.int()), TypeError, "index must be int64"),
        (lambda x, M, i: (x.long(), M.long(), i), TypeError, "x must be a floating-point tensor"),
        (lambda x, M, i: (x, M.float(), i), TypeError, "maps has dtype .*(float32|Float) but x has dtype"),
        (lambda x, M, i: (x, M, i + 5), ValueError, "index values must be in \\[0, P\\) = \\[0, 5\\)"),
        (lambda x, M, i: (x, M, i - 1 - i), ValueError, "index values must be in"),
    ],
)
def test_bad_input(mutate, exc, match):
    """The same table through the wrapper, the C++ operator and the fake kernel:
    the Python checks and the C++ checks agree (the fake sees shapes, not values)."""
    x, maps, index = make()
    args = mutate(x, maps, index)
    with pytest.raises(exc, match=match):
        ops.apply_maps(*args)
    with pytest.raises(exc, match=match):
        torch.ops.posattn.apply_maps(*args)
    if "index values" not in match:
        with FakeTensorMode() as mode:
            fake = [mode.from_tensor(a) for a in args]
            with pytest.raises(exc, match=match):
                torch.ops.posattn.apply_maps(*fake)


def test_raw_op_rejects_half_on_cpu():
    x, maps, index = make()
    with pytest.raises(TypeError, match="float32 or float64"):
        torch.ops.posattn.apply_maps(x.half(), maps.half(), index)


@pytest.mark.cuda
@pytest.mark.parametrize("kw", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_cuda_matches_reference(kw, dtype):
    x, maps, index = make(**kw)
    xc, mc, ic = x.cuda().to(dtype).requires_grad_(), maps.cuda().to(dtype).requires_grad_(), index.cuda()
    y = ops.apply_maps(xc, mc, ic)
    y_ref = reference.apply_maps(x.requires_grad_(), maps.requires_grad_(), index)
    tol = {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 3e-2)
    torch.testing.assert_close(y.double().cpu(), y_ref, rtol=tol, atol=tol * 10)
    g = torch.randn_like(y_ref)
    got = torch.autograd.grad(y, (xc, mc), g.cuda().to(dtype))
    want = torch.autograd.grad(y_ref, (x, maps), g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double().cpu(), b, rtol=tol, atol=tol * 10 * max(1, kw.get("N", 7)))
