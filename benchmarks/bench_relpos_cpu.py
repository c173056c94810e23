"""CPU benchmark of posattn.ops.relpos_attention against its baselines (eager composition, SDPA, dense op).

For each grid it times forward and forward+backward (median of repeated runs
after warm-up, in one process) and measures the peak extra resident memory of
one forward+backward step (each method in a fresh subprocess: VmHWM is reset
after the inputs exist, so the figure is what the step itself adds):

  eager     the composition a user would write today: q_pos @ rel^T, gathered
            into a (B, H, N, N) bias, then scaled_dot_product_attention with it
  sdpa      scaled_dot_product_attention without positional term (the floor)
  posattn   the fused operator with q_pos and rel (dense)
  span      the operator with q_pos, rel and a Gaussian span (dense)
  span_thr  the same with threshold 0.1 and sigma chosen so that the span box
            holds about --keep of the keys

Usage:
  python benchmarks/bench_relpos_cpu.py                      # 32x32 (B=8) and 64x64 (B=1)
  python benchmarks/bench_relpos_cpu.py --grid 32x32 --batch 8 --repeats 15
  python benchmarks/bench_relpos_cpu.py --markdown results.md  # also write the table
"""

from __future__ import annotations

import argparse
import json
import math

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
from posattn.grid import grid_coords, num_offsets, offset_rows, span_sigma_for_keep
from posattn.utils.timing import median_seconds, peak_extra_mib

METHODS = ("eager", "sdpa", "posattn", "span", "span_thr")
THRESHOLD = 0.1


# --- problem set-up ---------------------------------------------------------


def sigma_for_fraction(grid: list[int], target: float) -> tuple[float, list[int], float]:
    """A sigma (same on every axis) whose threshold box keeps about `target` of the keys."""
    return span_sigma_for_keep(grid, target, THRESHOLD)


def make_inputs(grid, batch, heads, dim, seed=0):
    g = torch.Generator().manual_seed(seed)
    N = math.prod(grid)
    U = num_offsets(grid)

    def rand(*shape):
        return torch.randn(*shape, generator=g).requires_grad_()

    return dict(
        q=rand(batch, heads, N, dim),
        k=rand(batch, heads, N, dim),
        v=rand(batch, heads, N, dim),
        q_pos=rand(batch, heads, N, dim),
        rel=rand(heads, U, dim) * 0.1,
    )


def make_method(name, grid, x, keep):
    """A closure computing the method's output from the inputs in x."""
    q, k, v, q_pos, rel = x["q"], x["k"], x["v"], x["q_pos"], x["rel"]
    B, H, N, D = q.shape
    scale = D**-0.5
    if name == "eager":
        coords = grid_coords(grid)
        rows = offset_rows(coords[None] - coords[:, None], grid).expand(B, H, N, N)

        def run():
            bias = (q_pos @ rel.transpose(-1, -2)).gather(-1, rows)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=scale * bias)

        return run, (q, k, v, q_pos, rel)
    if name == "sdpa":
        return (lambda: F.scaled_dot_product_attention(q, k, v)), (q, k, v)
    if name == "posattn":
        return (lambda: ops.relpos_attention(q, k, v, q_pos, rel, grid=grid)), (q, k, v, q_pos, rel)
    sigma_value, _, _ = sigma_for_fraction(grid, keep)
    sigma = torch.full((H, len(grid)), sigma_value, requires_grad=True)
    threshold = THRESHOLD if name == "span_thr" else 0.0
    return (
        lambda: ops.relpos_attention(q, k, v, q_pos, rel, grid=grid, sigma=sigma, threshold=threshold),
        (q, k, v, q_pos, rel, sigma),
    )


def fwd_bwd(run, params):
    out = run()
    grads = torch.autograd.grad(out.sum(), params)
    return grads


# --- peak memory (child process) --------------------------------------------


def child_peak_memory(args):
    torch.set_num_threads(args.threads)
    grid = parse_grid(args.grid[0])
    x = make_inputs(grid, args.batch, args.heads, args.dim)
    run, params = make_method(args.child, grid, x, args.keep)
    print(json.dumps({"peak_extra_mib": peak_extra_mib(lambda: fwd_bwd(run, params))}))


def peak_memory(method, grid_str, args):
    return child_peak_mib(__file__, child_argv(method, args, "batch", "heads", "dim", "keep", "threads", grid=grid_str))


# --- main ---------------------------------------------------------------------


def eager_bytes(grid, batch, heads):
    N, U = math.prod(grid), num_offsets(grid)
    return 4 * batch * heads * (3 * N * U + 4 * N * N)  # logits, grads, bias, probabilities


def bench_grid(grid_str, args):
    grid = parse_grid(grid_str)
    x = make_inputs(grid, args.batch, args.heads, args.dim)
    sigma, half, frac = sigma_for_fraction(grid, args.keep)
    rows = {}
    for name in METHODS:
        if name == "eager" and eager_bytes(grid, args.batch, args.heads) > args.eager_limit_gib * 2**30:
            print(
                f"  {name:9s} skipped: would need about "
                f"{eager_bytes(grid, args.batch, args.heads) / 2**30:.1f} GiB (--eager-limit-gib)"
            )
            continue
        run, params = make_method(name, grid, x, args.keep)

        def fwd():
            with torch.no_grad():
                run()

        t_fwd = median_seconds(fwd, args.warmup, args.repeats)
        t_fb = median_seconds(lambda: fwd_bwd(run, params), args.warmup, args.repeats)
        mem, err = (float("nan"), "off") if args.no_memory else peak_memory(name, grid_str, args)
        rows[name] = dict(fwd_ms=t_fwd * 1e3, fwd_bwd_ms=t_fb * 1e3, peak_mib=mem)
        extra = f"  (memory: {err})" if err and not args.no_memory else ""
        print(
            f"  {name:9s} fwd {t_fwd * 1e3:9.1f} ms   fwd+bwd {t_fb * 1e3:9.1f} ms   peak +{mem:8.1f} MiB{extra}",
            flush=True,
        )
    return dict(grid=grid_str, batch=args.batch, sigma=sigma, half=half, keep=frac, rows=rows)


def summary_lines(res, args):
    r = res["rows"]
    lines = []
    N = math.prod(parse_grid(res["grid"]))
    head = (
        f"grid {res['grid']} (N={N}), B={res['batch']}, H={args.heads}, D={args.dim}, float32, {args.threads} threads"
    )
    lines.append(head)
    if "eager" in r:
        lines.append(
            f"  (a) eager / posattn, fwd+bwd time: {ratio(r['eager']['fwd_bwd_ms'], r['posattn']['fwd_bwd_ms']):.2f}x "
            f"(target >= 1.5x); peak memory posattn / eager: "
            f"{ratio(r['posattn']['peak_mib'], r['eager']['peak_mib']):.3f} (target <= 0.25)"
        )
    lines.append(
        f"  (b) posattn / sdpa, fwd+bwd time: {ratio(r['posattn']['fwd_bwd_ms'], r['sdpa']['fwd_bwd_ms']):.2f}x "
        f"(target <= 2x); forward only: {ratio(r['posattn']['fwd_ms'], r['sdpa']['fwd_ms']):.2f}x"
    )
    lines.append(
        f"  (c) span dense / span threshold {THRESHOLD} (box keeps {100 * res['keep']:.1f}% of keys, "
        f"half widths {res['half']}), fwd+bwd: {ratio(r['span']['fwd_bwd_ms'], r['span_thr']['fwd_bwd_ms']):.2f}x "
        f"(target >= 4x); forward only: {ratio(r['span']['fwd_ms'], r['span_thr']['fwd_ms']):.2f}x"
    )
    return lines


def records(results, args) -> list[dict]:
    out = []
    for res in results:
        r, case = res["rows"], f"grid {res['grid']}, B={res['batch']}, H={args.heads}, D={args.dim}, fwd+bwd"
        if "eager" in r:
            out.append(
                record(
                    "relpos_attention",
                    case,
                    "posattn",
                    "eager bias + SDPA",
                    r["posattn"]["fwd_bwd_ms"],
                    r["eager"]["fwd_bwd_ms"],
                    r["posattn"]["peak_mib"],
                    r["eager"]["peak_mib"],
                )
            )
        out.append(
            record(
                "relpos_attention",
                case,
                "posattn",
                "SDPA without positions (floor)",
                r["posattn"]["fwd_bwd_ms"],
                r["sdpa"]["fwd_bwd_ms"],
                r["posattn"]["peak_mib"],
                r["sdpa"]["peak_mib"],
            )
        )
        out.append(
            record(
                "relpos_attention",
                case,
                f"span threshold ({100 * res['keep']:.0f}% kept)",
                "span dense",
                r["span_thr"]["fwd_bwd_ms"],
                r["span"]["fwd_bwd_ms"],
                r["span_thr"]["peak_mib"],
                r["span"]["peak_mib"],
            )
        )
    return out


def markdown(results, args):
    return results_markdown(results, args.threads, lambda res: summary_lines(res, args), note=False)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", action="append", help="grid such as 32x32 (repeatable)")
    p.add_argument("--batch", type=int, default=None, help="batch size (default 8 for 32x32, 1 for larger)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--keep", type=float, default=0.1, help="fraction of keys the span box should keep")
    add_run_arguments(p, repeats=10, eager_limit_gib=12.0)
    p.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        args.batch = args.batch or 8
        return child_peak_memory(args)
    torch.set_num_threads(args.threads)
    grids = args.grid or ["32x32", "64x64"]
    results = []
    batch_arg = args.batch
    for grid_str in grids:
        args.batch = batch_arg or (8 if math.prod(parse_grid(grid_str)) <= 1024 else 1)
        print(f"grid {grid_str}, B={args.batch}, H={args.heads}, D={args.dim}", flush=True)
        res = bench_grid(grid_str, args)
        results.append(res)
        for line in summary_lines(res, args):
            print(line)
    write_records(args.json, records(results, args))
    write_markdown(args.markdown, markdown(results, args))


if __name__ == "__main__":
    main()
