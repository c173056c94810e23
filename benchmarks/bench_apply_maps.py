"""Benchmark of posattn.ops.apply_maps against the public code's approach
(gather the maps of every token into a (B, N, H, A, m, m) tensor, then einsum;
that is posattn.reference.apply_maps), plus tree-map building.

For a sequence (A = 1, m = D, a table of N powers) and a 2-D grid (A = 2,
m = D / 2, a table of max(grid) powers per axis): forward and forward+backward
time (median after warm-up, one process) and the peak resident memory a
forward+backward step adds (each method in a fresh subprocess). Then the maps
of a binary tree with --tree-nodes nodes: built level by level
(posattn.algebraic.tree_maps_heap) against a per-node Python loop.

Usage:
  python benchmarks/bench_apply_maps.py                   # N = 1024 and 4096, B = 8, H = 8, D = 64
  python benchmarks/bench_apply_maps.py --tokens 1024 --batch 4 --device cuda
"""

from __future__ import annotations

import argparse
import json
import math
import platform
from datetime import date

import torch
from bench_common import child_argv, child_peak_mib, record, write_records

import posattn
from posattn import ops, reference
from posattn.algebraic import orthogonal, power_table, tree_maps_heap
from posattn.grid import grid_coords
from posattn.utils.timing import median_seconds, peak_extra_mib

METHODS = {"gather_einsum": reference.apply_maps, "posattn": ops.apply_maps}


def problem(layout: str, tokens: int, batch: int, heads: int, dim: int, device: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    if layout == "sequence":
        A, m, P = 1, dim, tokens
        index = torch.arange(tokens)[:, None]
    else:
        side = int(round(math.sqrt(tokens)))
        A, m, P = 2, dim // 2, side
        index = grid_coords([side, side])
    w = orthogonal(torch.randn(heads, A, m, m, generator=g) * 0.1)
    maps = power_table(w, P).contiguous()
    x = torch.randn(batch, heads, index.shape[0], dim, generator=g)
    return x.to(device).requires_grad_(), maps.to(device).requires_grad_(), index.to(device)


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def step(fn, x, maps, index, backward: bool):
    y = fn(x, maps, index)
    if backward:
        torch.autograd.grad(y.sum(), (x, maps))
    return y


def time_method(name, args, layout, tokens):
    x, maps, index = problem(layout, tokens, args.batch, args.heads, args.dim, args.device)
    fn = METHODS[name]

    def run(backward):
        def f():
            step(fn, x, maps, index, backward)
            sync(args.device)

        return median_seconds(f, warmup=1, repeats=args.repeats)

    return run(False), run(True)


def child(args):
    torch.set_num_threads(args.threads)
    layout, tokens, name = args.child.split(":")
    x, maps, index = problem(layout, int(tokens), args.batch, args.heads, args.dim, "cpu")
    peak = peak_extra_mib(lambda: step(METHODS[name], x, maps, index, True))
    print(json.dumps({"peak_extra_mib": peak}))


def peak_memory(name, layout, tokens, args):
    return child_peak_mib(__file__, child_argv(f"{layout}:{tokens}:{name}", args, "batch", "heads", "dim", "threads"))[
        0
    ]


def tree_benchmark(nodes: int, heads: int, m: int, device: str, repeats: int):
    """Seconds to build the maps of the first `nodes` heap positions of a binary tree."""
    branch = orthogonal(torch.randn(2, heads, 1, m, m) * 0.1).to(device)
    depth = max(1, math.ceil(math.log2(nodes + 1)) - 1)

    def level_by_level():
        tree_maps_heap(branch, depth, num_rows=nodes + 1)
        sync(device)

    def per_node_loop():  # what a straightforward implementation does: one matmul per node, in order
        eye = torch.eye(m, device=device).expand(heads, 1, m, m)
        maps = [eye, eye]
        for p in range(2, nodes + 1):
            maps.append(maps[p // 2] @ branch[p % 2])
        torch.stack(maps)
        sync(device)

    return median_seconds(level_by_level, warmup=1, repeats=repeats), median_seconds(
        per_node_loop, warmup=1, repeats=max(1, repeats // 2)
    )


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, action="append", help="N (a square number for the grid); default 1024, 4096")
    p.add_argument("--tree-only", action="store_true", help="only the tree-map benchmark")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--device", default="cpu")
    p.add_argument("--tree-nodes", type=int, default=10000)
    p.add_argument("--tree-dims", type=int, nargs="+", default=[64, 16], help="map sizes m for the tree benchmark")
    p.add_argument("--json", help="also write ratio records for benchmarks/compare.py to this file")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    recs = []
    torch.set_num_threads(args.threads)
    print(
        f"posattn {posattn.__version__}, torch {torch.__version__}, device {args.device}, {args.threads} threads, "
        f"{platform.processor() or platform.machine()}, {date.today()}"
    )
    print(
        f"B={args.batch}, H={args.heads}, D={args.dim}, float32; gather_einsum = gathered (B, N, H, A, m, m) maps + einsum"
    )
    for tokens in [] if args.tree_only else (args.tokens or [1024, 4096]):
        for layout in ("sequence", "grid"):
            times = {name: time_method(name, args, layout, tokens) for name in METHODS}
            mem = {name: peak_memory(name, layout, tokens, args) for name in METHODS} if args.device == "cpu" else {}
            print(f"\n{layout}, N={tokens}:")
            for name in METHODS:
                f, fb = times[name]
                extra = f"   peak +{mem[name]:8.1f} MiB" if mem else ""
                print(f"  {name:14s} fwd {1e3 * f:9.2f} ms   fwd+bwd {1e3 * fb:9.2f} ms{extra}")
            (gf, gfb), (pf, pfb) = times["gather_einsum"], times["posattn"]
            recs.append(
                record(
                    "apply_maps",
                    f"{layout}, N={tokens}, B={args.batch}, H={args.heads}, D={args.dim}, fwd+bwd",
                    "posattn",
                    "gather + einsum",
                    1e3 * pfb,
                    1e3 * gfb,
                    mem.get("posattn"),
                    mem.get("gather_einsum"),
                )
            )
            line = f"  speed-up fwd {gf / pf:.2f}x, fwd+bwd {gfb / pfb:.2f}x (target >= 2x)"
            if mem:
                line += f"; peak memory posattn / gather_einsum {mem['posattn'] / mem['gather_einsum']:.3f} (target <= 0.25)"
            print(line)
    print()
    for m in args.tree_dims:
        lvl, loop = tree_benchmark(args.tree_nodes, args.heads, m, args.device, args.repeats)
        recs.append(
            record(
                "tree maps",
                f"{args.tree_nodes} nodes, H={args.heads}, m={m}",
                "level by level",
                "per-node loop",
                1e3 * lvl,
                1e3 * loop,
            )
        )
        print(
            f"tree maps, {args.tree_nodes} nodes (binary, H={args.heads}, m={m}; {args.tree_nodes * args.heads * m * m * 4 / 2**20:.0f} MiB "
            f"of maps): level by level {1e3 * lvl:.1f} ms, per-node loop {1e3 * loop:.1f} ms -> {loop / lvl:.1f}x faster "
            "(GPU target >= 10x)"
        )
    write_records(args.json, recs)


if __name__ == "__main__":
    main()
