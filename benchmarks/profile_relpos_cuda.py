"""Where the time of one relpos_attention forward + backward goes on CUDA: the kernels
torch.profiler sees, by total time (bf16, B=4, H=8, D=64, Gaussian span, by default; bench_relpos_cuda.py's inputs).
With --once: one forward + backward and nothing else, for an outside profiler (scripts/gpu_check.sh's
profile64 step runs it under ncu, which replays each fast kernel it launches).

  python benchmarks/profile_relpos_cuda.py --grid 64x64 [--dtype float32 --tf32] [--window 10]
  python benchmarks/profile_relpos_cuda.py --grid 64x64 --once
"""

from __future__ import annotations

import argparse

import torch
from bench_common import parse_grid
from bench_relpos_cuda import DTYPES, make_inputs
from torch.profiler import ProfilerActivity, profile

from posattn import ops


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--grid", default="64x64")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--tf32", action="store_true", help="float32 through TF32 (the fast kernels take it)")
    p.add_argument("--window", type=int, default=None, help="half width of a window on every axis")
    p.add_argument("--device", default="cuda")
    p.add_argument("--once", action="store_true", help="one forward + backward, no torch.profiler")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    grid, dev = parse_grid(a.grid), torch.device(a.device)
    x = make_inputs(grid, a.batch, a.heads, a.dim, DTYPES[a.dtype], dev)  # the benchmark's inputs
    window = None if a.window is None else [a.window] * len(grid)
    g_out = torch.randn(x["q"].shape, device=dev).to(x["q"].dtype)

    def step():
        out = ops.relpos_attention(**x, grid=grid, window=window)
        return torch.autograd.grad(out, list(x.values()), g_out)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    if a.once:
        grads = step()
        sync()
        assert all(torch.isfinite(g).all() for g in grads)
        print(f"profile_relpos_cuda: one forward + backward on {a.grid} ({a.dtype}) ran")
        return
    for _ in range(2):
        step()
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        sync()
    print(f"grid {a.grid} B={a.batch} H={a.heads} D={a.dim} {a.dtype} window={window}: one forward + backward")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=70))


if __name__ == "__main__":
    main()
