"""Where the time of one relpos_attention forward + backward goes on CUDA: the kernels
torch.profiler sees, by total time (bf16, B=4, H=8, D=64, Gaussian span, by default; bench_relpos_cuda.py's inputs).

  python benchmarks/profile_relpos_cuda.py --grid 64x64
"""

from __future__ import annotations

import argparse

import torch
from bench_common import parse_grid
from bench_relpos_cuda import make_inputs
from torch.profiler import ProfilerActivity, profile

from posattn import ops


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--grid", default="64x64")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--window", type=int, default=None, help="half width of a window on every axis")
    a = p.parse_args()
    grid = parse_grid(a.grid)
    dev, dt = torch.device("cuda"), torch.bfloat16
    x = make_inputs(grid, a.batch, a.heads, a.dim, dt, dev)  # the benchmark's inputs
    N = x["q"].shape[2]
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
