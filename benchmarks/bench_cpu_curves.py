"""Two curves of relpos_attention on the CPU, for BENCHMARKS.md's "Where it stands" plots
(benchmarks/plots.py draws them from the CSV files this writes):

  window   forward + backward time against the kept fraction of a window on one grid (default
           64x64): posattn with windows of growing half width, posattn dense and SDPA without
           positions as references (window.csv)
  grid     forward time against the grid's side n (n x n grids): posattn dense, SDPA without
           positions, posattn with a 7x7 neighbourhood window (posattn.na2d), natten.na2d (its CPU
           backend) and SDPA with the window as a dense boolean mask (grid.csv); natten where it
           is installed

float32, B = 1, H = 4, D = 32 by default, median of --repeats after a warm-up, one process.

    python benchmarks/bench_cpu_curves.py --out benchmarks/measured/cpu_curves_<date>
    python benchmarks/plots.py                       # the PNGs of docs/img/ from the newest data
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import warnings
from datetime import date

import torch
import torch.nn.functional as F
from bench_relpos_cuda import make_inputs

import posattn
from posattn import ops
from posattn.grid import span_keep_fraction
from posattn.utils.timing import median_seconds


def inputs(grid, args, requires_grad):
    """q, k, v, q_pos, rel of bench_relpos_cuda's benchmark (float32, on the CPU; no span)."""
    x = make_inputs(grid, args.batch, args.heads, args.dim, torch.float32, "cpu")
    del x["sigma"]
    # (natten's CPU path refuses inputs that require grad, even under no_grad)
    return x if requires_grad else {name: t.detach() for name, t in x.items()}


def timed(fn, args):
    return median_seconds(fn, warmup=1, repeats=args.repeats) * 1e3


def window_curve(args):
    grid = [int(n) for n in args.window_grid.split("x")]
    x = inputs(grid, args, True)
    params = list(x.values())
    rows = []

    def fwd_bwd(run, wrt=params):
        def step():
            torch.autograd.grad(run().sum(), wrt)

        return step

    sdpa = fwd_bwd(lambda: F.scaled_dot_product_attention(x["q"], x["k"], x["v"]), params[:3])
    dense = fwd_bwd(lambda: ops.relpos_attention(**x, grid=grid))
    rows.append(dict(method="sdpa", half_width="", kept=1.0, ms=timed(sdpa, args), kernel=""))
    rows.append(dict(method="posattn dense", half_width="", kept=1.0, ms=timed(dense, args), kernel="tiled"))
    for r in rows:
        print(f"  {r['method']}: {r['ms']:9.2f} ms", flush=True)
    for r in args.half_widths:
        if r >= max(grid):
            continue
        run = fwd_bwd(lambda r=r: ops.relpos_attention(**x, grid=grid, window=r))
        kernel = ops.relpos_plan(x["q"], x["k"], x["v"], grid=grid, window=r)["forward"]  # the CPU plan's kernel
        rows.append(
            dict(
                method="posattn window",
                half_width=r,
                kept=span_keep_fraction(grid, [r] * len(grid)),
                ms=timed(run, args),
                kernel=kernel,
            )
        )
        print(f"  window {r:3d}: keeps {rows[-1]['kept']:6.1%}  {rows[-1]['ms']:9.2f} ms  ({kernel})", flush=True)
    return rows


def grid_curve(args):
    try:
        import natten
    except ImportError:
        natten = None
    rows = []
    for n in args.sides:
        grid = [n, n]
        x = inputs(grid, args, False)
        q, k, v = x["q"], x["k"], x["v"]
        heads_last = [t.transpose(1, 2).reshape(args.batch, n, n, args.heads, args.dim) for t in (q, k, v)]
        ks = min(args.kernel, n)
        methods = {
            "sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
            "posattn dense": lambda: ops.relpos_attention(**x, grid=grid),
            "posattn.na2d": lambda: posattn.na2d(*heads_last, kernel_size=ks),
        }
        if natten is not None:

            def natten_na2d():
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    return natten.na2d(*heads_last, kernel_size=ks)

            methods["natten.na2d"] = natten_na2d
        # the same windows (NATTEN's shifted border) as a dense (N, N) mask
        i = torch.arange(n)
        start = (i - ks // 2).clamp(min=0, max=n - ks)
        axis = (i[None, :] >= start[:, None]) & (i[None, :] < start[:, None] + ks)  # (query, key) per axis
        mask = (axis[:, None, :, None] & axis[None, :, None, :]).reshape(n * n, n * n)
        methods["sdpa + window mask"] = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        with torch.no_grad():
            for name, fn in methods.items():
                ms = timed(fn, args)
                rows.append(dict(method=name, side=n, tokens=n * n, ms=ms))
                print(f"  {n:3d}x{n:<3d} {name:20s} {ms:9.2f} ms", flush=True)
    return rows


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=f"benchmarks/measured/cpu_curves_{date.today().isoformat()}")
    p.add_argument("--curves", default="window,grid")
    p.add_argument("--window-grid", default="64x64")
    p.add_argument(
        "--half-widths", type=lambda s: [int(v) for v in s.split(",")], default=[1, 2, 3, 5, 8, 12, 16, 24, 32]
    )
    p.add_argument("--sides", type=lambda s: [int(v) for v in s.split(",")], default=[16, 24, 32, 48, 64])
    p.add_argument("--kernel", type=int, default=7)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "machine.txt"), "w") as f:
        f.write(
            f"{cpu_model()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
            f"posattn {posattn.__version__}, ops.cpu_capability() {ops.cpu_capability()}, {date.today().isoformat()}; "
            f"float32 B={args.batch} H={args.heads} D={args.dim}, median of {args.repeats}\n"
        )
    curves = args.curves.split(",")
    if "window" in curves:
        print(f"window curve on {args.window_grid}, forward + backward:", flush=True)
        write(os.path.join(args.out, "window.csv"), window_curve(args))
    if "grid" in curves:
        print(f"grid curve, forward, {args.kernel}x{args.kernel} windows:", flush=True)
        write(os.path.join(args.out, "grid.csv"), grid_curve(args))


if __name__ == "__main__":
    main()
