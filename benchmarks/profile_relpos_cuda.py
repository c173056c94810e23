"""Where the time of one relpos_attention forward + backward goes on CUDA: the kernels
torch.profiler sees, by total time (bf16, B=4, H=8, D=64, Gaussian span, by default).

  python benchmarks/profile_relpos_cuda.py --grid 64x64
"""

from __future__ import annotations

import argparse

import torch
from bench_common import parse_grid
from torch.profiler import ProfilerActivity, profile

from posattn import ops
from posattn._grid import num_offsets


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--grid", default="64x64")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--window", type=int, default=None, help="half width of a window on every axis")
    a = p.parse_args()
    grid = parse_grid(a.grid)
    N, U, dev, dt = 1, num_offsets(grid), torch.device("cuda"), torch.bfloat16
    for n in grid:
        N *= n
    g = torch.Generator(device=dev).manual_seed(0)

    def rand(*shape, scale=1.0):
        return (scale * torch.randn(*shape, device=dev, generator=g)).to(dt).requires_grad_()

    x = dict(
        q=rand(a.batch, a.heads, N, a.dim),
        k=rand(a.batch, a.heads, N, a.dim),
        v=rand(a.batch, a.heads, N, a.dim),
        q_pos=rand(a.batch, a.heads, N, a.dim),
        rel=rand(a.heads, U, a.dim, scale=0.1),
        sigma=(0.3 + torch.rand(a.heads, len(grid), device=dev, generator=g)).requires_grad_(),
    )
    window = None if a.window is None else [a.window] * len(grid)
    g_out = torch.randn(a.batch, a.heads, N, a.dim, device=dev, dtype=dt)

    def step():
        out = ops.relpos_attention(**x, grid=grid, window=window)
        torch.autograd.grad(out, list(x.values()), g_out)

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    print(f"grid {a.grid} B={a.batch} H={a.heads} D={a.dim} window={window}: one forward + backward")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=70))


if __name__ == "__main__":
    main()
