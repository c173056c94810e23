"""Comparative benchmark: every operator benchmark of posattn in one table of
ratios (and one plot), for the machine it runs on, CPU or GPU.

It runs, each in its own process with ``--json``:
  bench_relpos_cpu.py   relpos_attention vs eager bias + SDPA, SDPA, span dense (CPU only)
  bench_bias_cpu.py     a learned bias (Swin / T5) dense and with a 7x7 window vs SDPA with a
                        gathered bias (CPU only)
  bench_apply_maps.py   apply_maps vs gather + einsum; tree maps level by level vs a loop
  bench_models_cpu.py   thesis model: fused vs reference backend, span threshold (CPU only)
and, in this process, the third-party attention libraries that are installed:
  FlexAttention         torch.nn.attention.flex_attention (compiled) with the same
                        relative term as a score_mod (dense, and with a block mask
                        for the span's box); forward only on CPU, where
                        FlexAttention has no backward
  NATTEN                neighbourhood attention with the span's window
  xformers              memory_efficient_attention (no positions: the floor)
Whatever cannot run here is listed as skipped, with the reason.

speedup = baseline time / posattn time (> 1: posattn is faster);
memory = posattn peak / baseline peak (< 1: posattn uses less), where measured.

Usage:
  python benchmarks/compare.py --quick          # small sizes, a few minutes on 2 CPU cores
  python benchmarks/compare.py                  # the scripts' own default sizes
  python benchmarks/compare.py --device cuda --out benchmarks/results/gpu
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import date
from typing import Callable

import torch
from bench_common import record

import posattn
from posattn import ops
from posattn.grid import num_offsets, span_sigma_for_keep

HERE = os.path.dirname(os.path.abspath(__file__))

THRESHOLD = 0.1

# name, script, CPU only?, arguments for --quick, arguments otherwise
SUITES = [
    (
        "relpos_attention",
        "bench_relpos_cpu.py",
        True,
        ["--grid", "32x32", "--grid", "48x48", "--repeats", "5", "--warmup", "1"],
        [],
    ),
    (
        "relpos_attention bias",
        "bench_bias_cpu.py",
        True,
        ["--grid", "32x32", "--methods", "eager,posattn,window", "--repeats", "3", "--warmup", "1"],
        [],
    ),
    (
        "apply_maps",
        "bench_apply_maps.py",
        False,
        ["--tokens", "1024", "--repeats", "3", "--tree-nodes", "4000", "--tree-dims", "16"],
        [],
    ),
    ("models", "bench_models_cpu.py", True, ["--grid", "14x14", "--batch", "8", "--repeats", "2"], []),
]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    times.sort()
    return 1e3 * times[len(times) // 2]


# --- the suites (subprocesses) ------------------------------------------------


def run_suite(name, script, args, device, log_dir):
    """Runs one benchmark script; returns (records, skipped reason or None)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [sys.executable, os.path.join(HERE, script), "--json", out] + args
    if script == "bench_apply_maps.py":
        cmd += ["--device", device.type if device.type == "cpu" else str(device)]
    print(f"[{name}] {' '.join(cmd[1:])}", flush=True)
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True)
    with open(os.path.join(log_dir, f"{name}.log"), "w") as f:
        f.write(res.stdout + res.stderr)
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return [], f"failed (exit {res.returncode}): {last}"
    with open(out) as f:
        recs = json.load(f)
    os.unlink(out)
    print(f"[{name}] {len(recs)} records in {time.perf_counter() - t0:.0f} s (log: {log_dir}/{name}.log)", flush=True)
    return recs, None


# --- third-party libraries (in process) ---------------------------------------


def relpos_problem(side: int, batch: int, heads: int, dim: int, device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    grid = [side, side]
    N, U = side * side, num_offsets(grid)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device).requires_grad_()

    x = dict(
        q=rand(batch, heads, N, dim),
        k=rand(batch, heads, N, dim),
        v=rand(batch, heads, N, dim),
        q_pos=rand(batch, heads, N, dim),
        rel=rand(heads, U, dim, scale=0.1),
    )
    return grid, x


def fwd_bwd(fn, params):
    out = fn()
    torch.autograd.grad(out.sum(), params)


def flex_records(args, device) -> tuple[list[dict], list[str]]:
    """FlexAttention with the relative term as a score_mod: the positional
    logits q_pos . r (B, H, N, U) are computed first (FlexAttention cannot take
    a per-offset dot product inside score_mod) and gathered per (query, key)."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as e:
        return [], [f"FlexAttention: not available in torch {torch.__version__} ({e})"]
    side = args.flex_side
    grid, x = relpos_problem(side, 1, 4, 32, device)
    # FlexAttention has no backward on CPU (torch 2.13) and refuses inputs that
    # require grad there: compare forward passes on detached inputs
    backward = device.type != "cpu"
    if not backward:
        x = {name: t.detach() for name, t in x.items()}
    q, k, v, q_pos, rel = x["q"], x["k"], x["v"], x["q_pos"], x["rel"]
    n, D = side, q.shape[-1]
    scale = D**-0.5
    compiled = torch.compile(flex_attention, dynamic=False)
    params = (q, k, v, q_pos, rel)

    def flex_dense(block_mask=None):
        pos = q_pos @ rel.transpose(-1, -2)  # (B, H, N, U)

        def score_mod(score, b, h, qi, ki):
            row = (ki // n - qi // n + n - 1) * (2 * n - 1) + (ki % n - qi % n + n - 1)
            return score + scale * pos[b, h, qi, row]

        return compiled(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)

    recs, skipped = [], []
    case = f"grid {side}x{side}, B=1, H=4, D=32, " + (
        "fwd+bwd" if backward else "forward (no CPU backward in FlexAttention)"
    )

    def timed(fn, ps):
        if backward:
            return median_ms(lambda: fwd_bwd(fn, ps), device, 2, args.repeats)

        def fwd():
            with torch.no_grad():
                fn()

        return median_ms(fwd, device, 2, args.repeats)

    try:
        with torch.no_grad():  # the same function? (else the timing compares different work)
            diff = (flex_dense() - ops.relpos_attention(q, k, v, q_pos, rel, grid=grid)).abs().max().item()
        if not diff < 1e-3:
            return [], [f"FlexAttention: its output differs from relpos_attention's by {diff:.2e}; not timed"]
        t_flex = timed(flex_dense, params)
        t_ours = timed(lambda: ops.relpos_attention(q, k, v, q_pos, rel, grid=grid), params)
        recs.append(
            record(
                "third party",
                case + " (dense)",
                "posattn relpos_attention",
                "FlexAttention + gathered positional logits",
                t_ours,
                t_flex,
            )
        )
        # the span's box as a block mask: a moving window of half width h per axis
        sigma, half, keep = span_sigma_for_keep(grid, args.keep, THRESHOLD)
        h = half[0]

        def window(b, hh, qi, ki):
            return ((ki // n - qi // n).abs() <= h) & ((ki % n - qi % n).abs() <= h)

        mask = create_block_mask(window, None, None, n * n, n * n, device=str(device))
        sig = torch.full((4, 2), sigma, device=device, requires_grad=backward)
        t_flex_w = timed(lambda: flex_dense(mask), params)
        t_ours_w = timed(
            lambda: ops.relpos_attention(q, k, v, q_pos, rel, grid=grid, sigma=sig, threshold=THRESHOLD),
            params + (sig,),
        )
        recs.append(
            record(
                "third party",
                case + f" (window {2 * h + 1}x{2 * h + 1}, {100 * keep:.0f}% kept)",
                "posattn span threshold",
                "FlexAttention + block mask",
                t_ours_w,
                t_flex_w,
                note="FlexAttention has no Gaussian term here; posattn computes it",
            )
        )
    except Exception as e:  # a compile or runtime failure of a third-party path is reported, not fatal
        skipped.append(f"FlexAttention on {device.type}: failed ({type(e).__name__}: {str(e).splitlines()[0][:160]})")
    return recs, skipped


def natten_records(args, device) -> tuple[list[dict], list[str]]:
    try:
        from natten.functional import na2d
    except ImportError:
        return [], ["NATTEN: not installed (pip install natten; GPU builds are the supported ones)"]
    side = args.flex_side
    grid, x = relpos_problem(side, 1, 4, 32, device)
    sigma, half, keep = span_sigma_for_keep(grid, args.keep, THRESHOLD)
    kernel = 2 * half[0] + 1
    q, k, v = (
        x[n].detach().transpose(1, 2).reshape(1, side, side, 4, 32).contiguous().requires_grad_()
        for n in ("q", "k", "v")
    )
    sig = torch.full((4, 2), sigma, device=device, requires_grad=True)
    try:
        t_nat = median_ms(
            lambda: fwd_bwd(lambda: na2d(q, k, v, kernel_size=kernel), (q, k, v)), device, 2, args.repeats
        )
    except Exception as e:
        return [], [f"NATTEN: failed ({type(e).__name__}: {str(e).splitlines()[0][:160]})"]
    p = (x["q"], x["k"], x["v"], x["q_pos"], x["rel"], sig)
    t_ours = median_ms(
        lambda: fwd_bwd(lambda: ops.relpos_attention(*p[:5], grid=grid, sigma=sig, threshold=THRESHOLD), p),
        device,
        2,
        args.repeats,
    )
    return [
        record(
            "third party",
            f"grid {side}x{side}, window {kernel}, fwd+bwd",
            "posattn span threshold",
            "NATTEN na2d (no positional term)",
            t_ours,
            t_nat,
        )
    ], []


def xformers_records(args, device) -> tuple[list[dict], list[str]]:
    try:
        import xformers.ops as xops
    except ImportError:
        return [], ["xformers: not installed"]
    side = args.flex_side
    grid, x = relpos_problem(side, 1, 4, 32, device)
    q, k, v = (x[n].detach().transpose(1, 2).contiguous().requires_grad_() for n in ("q", "k", "v"))
    try:
        t_x = median_ms(
            lambda: fwd_bwd(lambda: xops.memory_efficient_attention(q, k, v), (q, k, v)), device, 2, args.repeats
        )
    except Exception as e:
        return [], [f"xformers: failed ({type(e).__name__}: {str(e).splitlines()[0][:160]})"]
    p = tuple(x[n] for n in ("q", "k", "v", "q_pos", "rel"))
    t_ours = median_ms(lambda: fwd_bwd(lambda: ops.relpos_attention(*p, grid=grid), p), device, 2, args.repeats)
    return [
        record(
            "third party",
            f"grid {side}x{side}, fwd+bwd",
            "posattn relpos_attention (with positions)",
            "xformers memory_efficient_attention (no positions)",
            t_ours,
            t_x,
        )
    ], []


# --- output -------------------------------------------------------------------


def fmt(x, spec):
    return "—" if x is None else format(x, spec)


def table(records: list[dict]) -> list[str]:
    lines = [
        "| benchmark | case | posattn | baseline | posattn ms | baseline ms | speedup | memory ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(
            f"| {r['benchmark']} | {r['case']} | {r['method']} | {r['baseline']} | {fmt(r['method_ms'], '.1f')} | "
            f"{fmt(r['baseline_ms'], '.1f')} | {fmt(r['speedup'], '.2f')}x | {fmt(r['memory_ratio'], '.3f')} |"
        )
    return lines


def plot(records: list[dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in records if r["speedup"]]
    if not rows:
        return
    labels = [f"{r['benchmark']}: {r['method']} vs {r['baseline']}\n{r['case']}" for r in rows]
    fig, ax = plt.subplots(figsize=(11, 0.55 * len(rows) + 1.5))
    colors = ["tab:green" if r["speedup"] >= 1 else "tab:red" for r in rows]
    ax.barh(range(len(rows)), [r["speedup"] for r in rows], color=colors)
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xscale("log")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels, fontsize=6)
    ax.invert_yaxis()
    for i, r in enumerate(rows):
        ax.text(r["speedup"], i, f" {r['speedup']:.2f}x", va="center", fontsize=7)
    ax.set_xlabel("speedup = baseline time / posattn time (log; > 1: posattn faster)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes (each script's --quick arguments)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument(
        "--out", default=os.path.join(HERE, "results"), help="folder for compare.md, compare.png, compare.json, logs"
    )
    p.add_argument("--only", nargs="+", choices=[s[0] for s in SUITES] + ["third_party"], help="run only these parts")
    p.add_argument(
        "--flex-side",
        type=int,
        default=None,
        help="grid side of the third-party comparisons (default 32, 64 without --quick)",
    )
    p.add_argument("--keep", type=float, default=0.1, help="fraction of keys the span's box keeps (window comparisons)")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else ("cpu" if args.device == "auto" else args.device)
    )
    if device.type == "cuda" and not torch.cuda.is_available():
        print("compare.py: error: --device cuda but CUDA is not available", file=sys.stderr)
        return 2
    args.flex_side = args.flex_side or (32 if args.quick else 64)
    os.makedirs(args.out, exist_ok=True)
    log_dir = os.path.join(args.out, "logs")
    os.makedirs(log_dir, exist_ok=True)
    machine = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"CPU {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    )
    header = f"{machine}; torch {torch.__version__}; posattn {posattn.__version__}; {date.today().isoformat()}"
    print(header, flush=True)
    records, skipped = [], []
    for name, script, cpu_only, quick, full in SUITES:
        if args.only and name not in args.only:
            continue
        if cpu_only and device.type != "cpu":
            skipped.append(f"{name} ({script}): CPU-only script, not run on {device.type}")
            continue
        recs, why = run_suite(name, script, quick if args.quick else full, device, log_dir)
        records += recs
        if why:
            skipped.append(f"{name} ({script}): {why}")
    if not args.only or "third_party" in args.only:
        for fn in (flex_records, natten_records, xformers_records):
            recs, why = fn(args, device)
            records += recs
            skipped += why
    command = "python benchmarks/compare.py " + " ".join(argv if argv is not None else sys.argv[1:])
    md = [f"Machine: {header}", "", f"Command: `{command.strip()}`", ""] + table(records)
    md += ["", "Skipped:" if skipped else "Skipped: nothing."] + [f"- {s}" for s in skipped]
    with open(os.path.join(args.out, "compare.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    with open(os.path.join(args.out, "compare.json"), "w") as f:
        json.dump(dict(machine=header, records=records, skipped=skipped), f, indent=1)
    plot(records, os.path.join(args.out, "compare.png"), f"posattn vs baselines ({header})")
    print("\n" + "\n".join(md))
    print(f"\nwrote {args.out}/compare.md, compare.png, compare.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
