"""CPU benchmark of a learned relative position bias (Swin / T5 style) in posattn.ops.relpos_attention.

Bias only (no q_pos / rel), float32, forward+backward with the (H, U) bias table
requiring grad. Median of repeated runs after warm-up, in one process, the methods
interleaved (one call of each per round, so that a slow spell of a shared machine
hits them alike); peak
extra resident memory of one forward+backward step, each method in a fresh
subprocess (see bench_relpos_cpu.py).

  eager     what Swin's code does: the table gathered into an (H, N, N) bias,
            broadcast over the batch, as the attention mask of
            scaled_dot_product_attention (O(N^2) memory, gradient through it)
  flex      torch.nn.attention.flex_attention (compiled) with a score_mod that
            adds the table entry of the pair's offset; forward only (no CPU backward)
  posattn   relpos_attention(q, k, v, bias=table), dense
  window    relpos_attention(..., bias=table, window=r): a (2r+1)^G window

Usage:
  python benchmarks/bench_bias_cpu.py                     # the issue's cases: 32x32, 64x64 dense and 7x7 window
  python benchmarks/bench_bias_cpu.py --grid 32x32 --repeats 5 --no-memory
  python benchmarks/bench_bias_cpu.py --markdown results.md --json records.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics

import torch
import torch.nn.functional as F
from bench_common import (
    add_run_arguments,
    child_argv,
    child_peak_mib,
    parse_grid,
    ratio,
    record,
    results_markdown,
    write_markdown,
    write_records,
)

from posattn import ops
from posattn.grid import grid_coords, num_offsets, offset_rows
from posattn.utils.timing import median_seconds, peak_extra_mib

METHODS = ("eager", "flex", "posattn", "window")


def make_inputs(grid, batch, heads, dim, seed=0):
    g = torch.Generator().manual_seed(seed)
    N = math.prod(grid)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).requires_grad_()

    return dict(
        q=rand(batch, heads, N, dim),
        k=rand(batch, heads, N, dim),
        v=rand(batch, heads, N, dim),
        bias=rand(heads, num_offsets(grid), scale=0.1),
    )


def flex_score_mod(grid, bias):
    """A score_mod adding bias[h, row(offset)] from the token indices (any number of axes)."""

    def score_mod(score, b, h, q_idx, kv_idx):
        row = 0
        qi, ki = q_idx, kv_idx
        stride = 1
        for n in reversed(grid):
            row = row + (ki % n - qi % n + n - 1) * stride
            stride *= 2 * n - 1
            qi, ki = qi // n, ki // n
        return score + bias[h, row]

    return score_mod


def make_method(name, grid, x, window):
    """(closure computing the output, tensors to differentiate, or None for forward only)."""
    q, k, v, bias = x["q"], x["k"], x["v"], x["bias"]
    if name == "eager":
        coords = grid_coords(grid)
        rows = offset_rows(coords[None] - coords[:, None], grid)
        return (lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias[:, rows].unsqueeze(0))), (q, k, v, bias)
    if name == "flex":
        from torch.nn.attention.flex_attention import flex_attention

        compiled = torch.compile(flex_attention, dynamic=False)
        mod = flex_score_mod(grid, bias.detach())
        return (lambda: compiled(q.detach(), k.detach(), v.detach(), score_mod=mod)), None
    if name == "posattn":
        return (lambda: ops.relpos_attention(q, k, v, grid=grid, bias=bias)), (q, k, v, bias)
    return (lambda: ops.relpos_attention(q, k, v, grid=grid, bias=bias, window=window)), (q, k, v, bias)


def fwd_bwd(run, params):
    out = run()
    return torch.autograd.grad(out.sum(), params)


def step(run, params):
    """One training step where the method has a backward, else one forward."""
    if params is None:
        with torch.no_grad():
            return run()
    return fwd_bwd(run, params)


def child_peak_memory(args):
    torch.set_num_threads(args.threads)
    grid = parse_grid(args.grid[0])
    x = make_inputs(grid, args.batch, args.heads, args.dim)
    run, params = make_method(args.child, grid, x, args.window)
    if params is None:
        step(run, params)  # compile outside the measured step
    print(json.dumps({"peak_extra_mib": peak_extra_mib(lambda: step(run, params))}))


def peak_memory(method, grid_str, args):
    return child_peak_mib(
        __file__, child_argv(method, args, "batch", "heads", "dim", "window", "threads", grid=grid_str)
    )


def eager_bytes(grid, batch, heads):
    N = math.prod(grid)
    return 4 * heads * N * N * (2 + 4 * batch)  # bias and its gradient; logits, weights and their gradients


def bench_case(grid_str, methods, args):
    """Times the methods in interleaved rounds (one call of each per round), so that a
    slow spell of a shared machine hits every method alike; medians over the rounds."""
    grid = parse_grid(grid_str)
    x = make_inputs(grid, args.batch, args.heads, args.dim)
    rows, runs = {}, {}
    for name in methods:
        if name == "eager" and eager_bytes(grid, args.batch, args.heads) > args.eager_limit_gib * 2**30:
            print(
                f"  {name:8s} skipped: would need about {eager_bytes(grid, args.batch, args.heads) / 2**30:.1f} GiB "
                "(--eager-limit-gib)",
                flush=True,
            )
            continue
        try:
            run, params = make_method(name, grid, x, args.window)
            for _ in range(max(args.warmup, 1)):  # compiles flex_attention
                step(run, None)
                if params:
                    step(run, params)
        except Exception as e:  # flex_attention may not run on this machine's CPU torch
            print(f"  {name:8s} did not run: {type(e).__name__}: {str(e).splitlines()[0][:160]}", flush=True)
            rows[name] = dict(
                fwd_ms=float("nan"),
                fwd_bwd_ms=float("nan"),
                peak_mib=float("nan"),
                note=f"did not run: {type(e).__name__}",
            )
            continue
        runs[name] = (run, params)
    times = {name: ([], []) for name in runs}
    for _ in range(args.repeats):
        for name, (run, params) in runs.items():
            times[name][0].append(median_seconds(lambda: step(run, None), 0, 1))
            if params:
                times[name][1].append(median_seconds(lambda: step(run, params), 0, 1))
    for name, (run, params) in runs.items():
        t_fwd = statistics.median(times[name][0])
        t_fb = statistics.median(times[name][1]) if params else float("nan")
        mem, err = (float("nan"), "off") if args.no_memory else peak_memory(name, grid_str, args)
        rows[name] = dict(
            fwd_ms=t_fwd * 1e3, fwd_bwd_ms=t_fb * 1e3, peak_mib=mem, note="forward only" if params is None else ""
        )
        extra = f"  (memory: {err})" if err and not args.no_memory else ""
        print(
            f"  {name:8s} fwd {t_fwd * 1e3:9.1f} ms   fwd+bwd {t_fb * 1e3:9.1f} ms   peak +{mem:8.1f} MiB{extra}",
            flush=True,
        )
    return dict(grid=grid_str, batch=args.batch, rows={m: rows[m] for m in methods if m in rows})


def summary_lines(res, args):
    r = res["rows"]
    grid = parse_grid(res["grid"])
    win = "x".join([str(2 * args.window + 1)] * len(grid))
    lines = [
        f"grid {res['grid']} (N={math.prod(grid)}), B={res['batch']}, H={args.heads}, D={args.dim}, float32, "
        f"bias only, {args.threads} threads"
    ]
    if "eager" in r and "posattn" in r:
        lines.append(
            f"  eager / posattn dense, fwd+bwd time: {ratio(r['eager']['fwd_bwd_ms'], r['posattn']['fwd_bwd_ms']):.2f}x"
            f" (target >= 3x at 32x32); peak memory posattn / eager: "
            f"{ratio(r['posattn']['peak_mib'], r['eager']['peak_mib']):.3f} (target <= 0.1)"
        )
    if "eager" in r and "window" in r:
        lines.append(
            f"  eager dense / posattn {win} window, fwd+bwd time: "
            f"{ratio(r['eager']['fwd_bwd_ms'], r['window']['fwd_bwd_ms']):.1f}x (target >= 10x at 64x64)"
        )
    if "flex" in r and "posattn" in r and not math.isnan(r["flex"]["fwd_ms"]):
        lines.append(f"  flex / posattn dense, forward time: {ratio(r['flex']['fwd_ms'], r['posattn']['fwd_ms']):.2f}x")
    return lines


def records(results, args) -> list[dict]:
    out = []
    for res in results:
        r = res["rows"]
        case = f"grid {res['grid']}, B={res['batch']}, H={args.heads}, D={args.dim}, bias only, fwd+bwd"
        win = f"{2 * args.window + 1}-wide window"
        if "eager" in r and "posattn" in r:
            out.append(
                record(
                    "relpos_attention bias",
                    case,
                    "posattn",
                    "eager gathered bias + SDPA",
                    r["posattn"]["fwd_bwd_ms"],
                    r["eager"]["fwd_bwd_ms"],
                    r["posattn"]["peak_mib"],
                    r["eager"]["peak_mib"],
                )
            )
        if "eager" in r and "window" in r:
            out.append(
                record(
                    "relpos_attention bias",
                    case,
                    f"posattn {win}",
                    "eager gathered bias + SDPA (dense)",
                    r["window"]["fwd_bwd_ms"],
                    r["eager"]["fwd_bwd_ms"],
                    r["window"]["peak_mib"],
                    r["eager"]["peak_mib"],
                )
            )
        if "flex" in r and "posattn" in r and not math.isnan(r["flex"]["fwd_ms"]):
            out.append(
                record(
                    "relpos_attention bias",
                    case.replace("fwd+bwd", "forward"),
                    "posattn",
                    "flex_attention (compiled)",
                    r["posattn"]["fwd_ms"],
                    r["flex"]["fwd_ms"],
                )
            )
    return out


def markdown(results, args):
    return results_markdown(results, args.threads, lambda res: summary_lines(res, args), note=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--grid",
        action="append",
        help="grid such as 32x32 (repeatable; default: 32x32 with every method, 64x64 with eager, posattn and window)",
    )
    p.add_argument("--methods", default=None, help=f"comma-separated subset of {','.join(METHODS)}")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--window", type=int, default=3, help="window half width (3: a 7x7 window on a 2-D grid)")
    add_run_arguments(p, repeats=7, eager_limit_gib=14.0)
    p.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.window < 0:
        raise SystemExit(f"--window must be >= 0, got {args.window}")
    if args.child:
        return child_peak_memory(args)
    torch.set_num_threads(args.threads)
    chosen = None
    if args.methods:
        chosen = [m.strip() for m in args.methods.split(",") if m.strip()]
        unknown = [m for m in chosen if m not in METHODS]
        if unknown:
            raise SystemExit(f"--methods: unknown {unknown}; choose from {', '.join(METHODS)}")
    cases = (
        [(g, chosen or list(METHODS)) for g in args.grid]
        if args.grid
        else [("32x32", chosen or list(METHODS)), ("64x64", chosen or ["eager", "posattn", "window"])]
    )
    results = []
    for grid_str, methods in cases:
        print(
            f"grid {grid_str}, B={args.batch}, H={args.heads}, D={args.dim}, window half width {args.window}",
            flush=True,
        )
        res = bench_case(grid_str, methods, args)
        results.append(res)
        for line in summary_lines(res, args):
            print(line, flush=True)
    write_records(args.json, records(results, args))
    write_markdown(args.markdown, markdown(results, args))


if __name__ == "__main__":
    main()
