"""One relpos_attention forward + backward on CUDA with the benchmark's inputs (bf16, B = 4,
H = 8, D = 64, Gaussian span by default), for a profiler to look at: scripts/gpu_check.sh's
profile64 step runs it under ncu, which replays each fast kernel it launches.

  python scripts/gpu_profile_step.py --grid 64x64 [--dtype float32 --tf32] [--window 10]
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from bench_common import parse_grid  # noqa: E402
from bench_relpos_cuda import DTYPES, make_inputs  # noqa: E402

from posattn import ops  # noqa: E402


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
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    grid, dev = parse_grid(a.grid), torch.device(a.device)
    x = make_inputs(grid, a.batch, a.heads, a.dim, DTYPES[a.dtype], dev)
    window = None if a.window is None else [a.window] * len(grid)
    out = ops.relpos_attention(**x, grid=grid, window=window)
    grads = torch.autograd.grad(out, list(x.values()), torch.randn_like(out))
    if dev.type == "cuda":
        torch.cuda.synchronize()
    assert all(torch.isfinite(g).all() for g in grads)
    print(f"gpu_profile_step: one forward + backward on {a.grid} ({a.dtype}) ran")


if __name__ == "__main__":
    main()
