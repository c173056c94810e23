"""apply_maps on CUDA beyond tests/ops/apply_maps/test_apply_maps.py: shapes past one block
of tokens and maps against the reference, bitwise-repeatable map gradients under
deterministic algorithms, CUDA graph capture, the index range as a device-side assertion,
empty and non-contiguous inputs. Run on a GPU machine; skipped cleanly without one."""

import subprocess
import sys

import pytest
import torch

from posattn import ops, reference

pytestmark = pytest.mark.cuda


def make(B, H, N, A, m, P, batched, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, H, N, A * m, generator=g, dtype=torch.float64)
    maps = torch.randn(P, H, A, m, m, generator=g, dtype=torch.float64) / m**0.5
    index = torch.randint(0, P, (B, N, A) if batched else (N, A), generator=g)
    return x, maps, index


# every strided loop more than once: B*D > 128, A*m^2 > 128, maps staged (m = 64) and not (m = 128, 64 KiB)
BIG = [
    dict(B=3, H=2, N=37, A=2, m=64, P=9, batched=False),
    dict(B=2, H=2, N=21, A=1, m=128, P=5, batched=True),
    dict(B=5, H=3, N=50, A=64, m=2, P=50, batched=False),
    dict(B=4, H=1, N=33, A=16, m=8, P=3, batched=True),
]


@pytest.mark.parametrize("kw", BIG)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_large_shapes_match_reference(kw, dtype):
    x, maps, index = make(**kw)
    xc, mc = x.to("cuda", dtype).requires_grad_(), maps.to("cuda", dtype).requires_grad_()
    y = ops.apply_maps(xc, mc, index.cuda())
    xr, mr = x.clone().requires_grad_(), maps.clone().requires_grad_()
    y_ref = reference.apply_maps(xr, mr, index)
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    torch.testing.assert_close(y.double().cpu(), y_ref, rtol=tol, atol=tol)
    g = torch.randn_like(y_ref)
    got = torch.autograd.grad(y, (xc, mc), g.to("cuda", dtype))
    want = torch.autograd.grad(y_ref, (xr, mr), g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double().cpu(), b, rtol=tol, atol=tol * 10)


def test_deterministic_algorithms_give_bitwise_equal_map_gradients():
    x, maps, index = make(B=4, H=2, N=64, A=4, m=4, P=3, batched=False)  # 3 maps shared by 64 tokens
    xc, mc, ic = x.cuda().float(), maps.cuda().float().requires_grad_(), index.cuda()
    default = torch.autograd.grad(ops.apply_maps(xc, mc, ic).sum(), mc)[0]
    torch.use_deterministic_algorithms(True)
    try:
        runs = [torch.autograd.grad(ops.apply_maps(xc, mc, ic).sum(), mc)[0] for _ in range(3)]
    finally:
        torch.use_deterministic_algorithms(False)
    assert all(torch.equal(runs[0], r) for r in runs[1:])
    torch.testing.assert_close(runs[0], default)


def test_cuda_graph_capture():
    # defect 9: the index range check synchronised with the host
    x, maps, index = make(B=2, H=2, N=16, A=2, m=4, P=6, batched=True)
    xc, mc, ic = x.cuda().float().requires_grad_(), maps.cuda().float().requires_grad_(), index.cuda()
    g = torch.randn(xc.shape, device="cuda")

    def step():
        return torch.autograd.grad(ops.apply_maps(xc, mc, ic), (xc, mc), g)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    with torch.no_grad():
        xc.mul_(1.5)
    graph.replay()
    for a, b in zip(captured, step()):
        torch.testing.assert_close(a, b)


def test_out_of_range_index_is_a_device_side_assertion():
    code = """
import torch, posattn
from posattn import ops
x = torch.randn(1, 1, 3, 4, device="cuda")
maps = torch.randn(2, 1, 2, 2, 2, device="cuda")
index = torch.tensor([[0, 1], [2, 0], [1, 1]], device="cuda")
ops.apply_maps(x, maps, index)
torch.cuda.synchronize()
print("NO ERROR")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0, r.stdout
    assert "index values must be in [0, P)" in r.stderr


def test_empty_and_non_contiguous():
    x, maps, index = make(B=2, H=2, N=5, A=2, m=3, P=4, batched=False)
    xt = x.cuda().float().transpose(0, 1).contiguous().transpose(0, 1)
    torch.testing.assert_close(
        ops.apply_maps(xt, maps.cuda().float(), index.cuda()).cpu(),
        reference.apply_maps(x.float(), maps.float(), index),
    )
    e = torch.zeros(0, 2, 5, 6, device="cuda", requires_grad=True)
    m = maps.cuda().float().requires_grad_()
    y = ops.apply_maps(e, m, index.cuda())
    gx, gm = torch.autograd.grad(y.sum(), (e, m))
    assert y.shape == e.shape and (gm == 0).all()
