"""Simulated GPU cycles of posattn's CUDA kernels, as ratios (GPGPU-Sim's timing model of an
RTX 3070-class Ampere GPU, ../shared/gpusim): the fast tensor-core kernels against the
general path on the same call, windows keeping ~10 % and ~25 % of the keys against the same
call dense, and forward against backward.

These are simulated cycles, not GPU time: they show whether the kernels skip the work outside
a window and how the paths compare inside one model; the figures that count come from a real
GPU (scripts/gpu_check.sh). Each run takes minutes (timing mode is ~10x slower than the
functional mode of the tests), so the problem is small: one batch element and head (--heads: more,
so that every simulated SM gets a block), a 16 x 16 grid (256 tokens), bfloat16 (--dtype: float16, or
float32 through TF32), D = Dv = 32 (--dim),
positional term on (--terms: a bias alone, or none). Paths: fast (the plan's choice under
POSATTN_CUDA_KERNEL=auto: the fast forward and backward where they take the call), general
(POSATTN_CUDA_KERNEL=general). --offsets general: d rel, d bias, d sigma from the general offset
kernel whatever the plan says. (The WMMA tiled kernels this compared against until 2026-11-29 are
gone; their figures stay in BENCHMARKS.md.)

    python benchmarks/sim_cycles.py                 # all rows, table to stdout
    python benchmarks/sim_cycles.py --grid 12 12    # a smaller grid, quicker
    python benchmarks/sim_cycles.py --json out.json
    python benchmarks/sim_cycles.py --grid 8 8 --dim 64 --windows none --sms 1 --full-only
                                                    # a model GPU of 1 SM, which the call fills: the
                                                    # kernels' throughput, not one block's latency

Needs the simulator built (bash scripts/cuda_sim.sh builds it) and nvcc.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import simlib
import torch

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
KERNEL_RE = re.compile(r"^kernel_name = (\S+)", re.M)
CYCLE_RE = re.compile(r"^gpu_sim_cycle = (\d+)", re.M)


def short_name(mangled: str) -> str:
    if "fast_backward_kernel" in mangled:  # KEYS, the layout class SC, the half HALF (PACKED): ...Lb1ELi0ELi0EE
        m = re.search(r"Lb([01])ELi\d+ELi([01])E(?:Lb[01]E)?E", mangled)
        name = "fast dk/dv" if m and m.group(1) == "1" else "fast dq"
        return name + (" (second half of the columns)" if m and m.group(2) == "1" else "")
    for key, name in (
        ("fast_offsets_order_kernel", "fast offsets: their order's table"),
        ("fast_offsets_kernel", "fast offsets (d rel, d bias, d sigma)"),
        ("round_to_kernel", "offsets: rounding"),
        ("fast_forward_kernel", "fast fwd"),
        ("offset_tables_kernel", "fast: offset tables"),
        ("relpos_forward_kernel", "general fwd"),
        ("relpos_backward_dq", "general dq"),
        ("relpos_backward_dkv", "general dk/dv"),
        ("relpos_backward_offset", "offset (d rel, d bias, d sigma)"),
        ("relpos_packed_check_kernel", "packed: its offsets' and shapes' check"),
        ("packed_schedule_kernel", "packed: the fast kernels' schedule"),
    ):
        if key in mangled:
            return name
    return mangled


def kernel_cycles(log: str):
    """(kernel, cycles) per launch, from the simulator's log in timing mode."""
    names = KERNEL_RE.findall(log)
    cycles = [int(c) for c in CYCLE_RE.findall(log)]
    return [(short_name(n), c) for n, c in zip(names, cycles)]


def run(
    path: str,
    grid,
    window,
    backward: bool,
    dtype=torch.bfloat16,
    D: int = 32,
    workdir: Path = None,
    H: int = 1,
    terms: str = "pos",
    offsets: str = None,
    smem_optin: int = simlib.PLAN_SMEM_OPTIN,
    sms: int = None,
):
    # sms: the model GPU's SMs (GPGPU-Sim's -gpgpu_n_clusters; None: the config's 46)
    # terms: what the logits have per offset: "pos" (q_pos . rel), "all" (q_pos . rel, a bias and a
    # span, add), "bias" (a bias alone: the fast kernels' tables only), "none" (plain attention: the
    # fast path runs its control's kernels)
    # path "fast": the plan's choice (POSATTN_CUDA_KERNEL=auto), "general": the general kernels;
    # offsets "general" forces the general offset kernel (d rel, d bias, d sigma)
    if path not in ("fast", "general"):
        raise ValueError(f"path must be fast or general, got {path!r}")
    N, U = math.prod(grid), math.prod(2 * n - 1 for n in grid)
    g = torch.Generator().manual_seed(0)
    rand = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dtype)  # noqa: E731
    arrays = dict(
        q=rand(1, H, N, D),
        k=rand(1, H, N, D),
        v=rand(1, H, N, D),
        gout=rand(1, H, N, D),
        glse=torch.zeros(1, H, N, dtype=torch.float32),
    )
    if terms in ("pos", "all"):
        arrays.update(q_pos=rand(1, H, N, D), rel=rand(H, U, D))
    if terms == "all":
        arrays.update(bias=rand(H, U), sigma=0.3 + 0.4 * torch.rand(H, len(grid), generator=g, dtype=torch.float64))
    elif terms == "bias":
        arrays.update(bias=rand(H, U))
    settings = dict(
        op="relpos",
        **simlib.plan_settings("auto" if path == "fast" else "general", smem_optin),
        general_offsets=int(offsets == "general"),
        B=1,
        H=H,
        D=D,
        Dv=D,
        grid=list(grid),
        has_pos=int(terms in ("pos", "all")),
        has_bias=int(terms in ("bias", "all")),
        has_sigma=int(terms == "all"),
        scale=repr(D**-0.5),
        window=window,
        window_shift=1 if window else 0,
        backward=int(backward),
        has_glse=1,
    )
    case = (
        workdir
        / f"{path}-{smem_optin}-{sms or 'all'}sm-{terms}-{offsets or 'plan'}-{'x'.join(map(str, window)) if window else 'dense'}-{'bwd' if backward else 'fwd'}"
    )
    res = simlib.run_case(
        simlib.harness(dtype, D if path == "fast" else None),
        case,
        settings,
        arrays,
        timing=True,
        timeout=7200,
        rundir=case / "sim",
        extra_env={"GPUSIM_EXTRA": f"-gpgpu_n_clusters {sms}"} if sms else None,
    )
    if res.returncode != 0:
        raise RuntimeError(res.tail())
    return kernel_cycles((case / "sim" / "gpgpusim.log").read_text()), res.seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", type=int, nargs="+", default=[16, 16])
    ap.add_argument(
        "--windows",
        default="2,2;3,4",
        help="window half widths per axis, ';' between windows "
        "(shifted windows: (2w+1) keys per axis for every query). Default: 5x5 (9.8 %%) and 7x9 (24.6 %%) "
        "of a 16x16 grid; 'none' for the dense call only",
    )
    ap.add_argument(
        "--paths",
        default="fast,general",
        help="kernel paths to run (fast: the plan's choice, the fast kernels where they take the call; general)",
    )
    ap.add_argument(
        "--no-backward", action="store_true", help="forward only (the general backward is slow to simulate)"
    )
    ap.add_argument("--heads", type=int, default=1, help="heads H (B = 1): H query tiles per tile of the grid")
    ap.add_argument(
        "--terms",
        choices=("pos", "all", "bias", "none"),
        default="pos",
        help="the logits' terms per offset: q_pos . rel (default), all (q_pos . rel, a bias and a span), a bias "
        "alone, or none (plain attention)",
    )
    ap.add_argument(
        "--dtype", choices=sorted(DTYPES), default="bf16", help="the inputs' type (f32: through TF32 tensor cores)"
    )
    ap.add_argument("--dim", type=int, default=32, choices=(32, 64, 128), help="head dim D = Dv")
    ap.add_argument(
        "--offsets",
        choices=("general",),
        help="d rel, d bias, d sigma from this offset kernel, not the plan's",
    )
    ap.add_argument(
        "--smem-optin",
        type=int,
        default=simlib.PLAN_SMEM_OPTIN,
        help="the opt-in shared memory per block of the device the plan is made for: its class of fast "
        f"layouts (default {simlib.SMEM_H100}, an H100's; {simlib.SMEM_A100}: an A100's; {simlib.SMEM_SM86}: an "
        "RTX 30 / 40's, A10's, L4's)",
    )
    ap.add_argument(
        "--sms",
        type=int,
        help="the model GPU's SMs (default: the config's 46): with few, a small call fills the GPU, so that "
        "cycles measure the kernels' throughput rather than one block's latency on an idle GPU",
    )
    ap.add_argument(
        "--full-only",
        action="store_true",
        help="only the dense forward + backward run of each path (not the forward-only one it contains)",
    )
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.full_only and args.no_backward:
        ap.error("--full-only runs forward + backward only: it cannot go with --no-backward")
    if simlib.unavailable():
        sys.exit("sim_cycles: " + simlib.unavailable())
    grid = args.grid
    N = math.prod(grid)
    windows = [None]
    if args.windows != "none" and not args.full_only:
        windows += [[int(x) for x in w.split(",")] for w in args.windows.split(";")]
    paths = args.paths.split(",")
    jobs = [
        (path, w, bwd)
        for path in paths
        for w in windows
        for bwd in (False, True)
        if not bwd or (w is None and not args.no_backward)
        if not (args.full_only and not bwd)
    ]
    work = Path(tempfile.mkdtemp(prefix="sim_cycles-"))
    start = time.time()
    with ThreadPoolExecutor(args.jobs) as ex:
        results = list(
            ex.map(
                lambda j: run(
                    j[0],
                    grid,
                    j[1],
                    j[2],
                    dtype=DTYPES[args.dtype],
                    D=args.dim,
                    workdir=work,
                    H=args.heads,
                    terms=args.terms,
                    offsets=args.offsets,
                    smem_optin=args.smem_optin,
                    sms=args.sms,
                ),
                jobs,
            )
        )
    rows = {}
    for (path, w, bwd), (cycles, secs) in zip(jobs, results):
        kept = N if w is None else math.prod(min(2 * x + 1, n) for x, n in zip(w, grid))
        fwd = sum(c for name, c in cycles if "fwd" in name)
        rows[(path, None if w is None else tuple(w), bwd)] = dict(
            kernels=cycles, fwd=fwd, total=sum(c for _, c in cycles), kept=kept, seconds=round(secs)
        )
    if args.full_only:  # the forward's row from the forward + backward run's forward kernels
        for path in paths:
            r = rows[(path, None, True)]
            fwd_kernels = [(n, c) for n, c in r["kernels"] if "fwd" in n]
            rows[(path, None, False)] = dict(r, kernels=fwd_kernels, total=r["fwd"])
    if args.json:
        args.json.write_text(
            json.dumps({f"{k[0]}|{k[1]}|{'bwd' if k[2] else 'fwd'}": v for k, v in rows.items()}, indent=1)
        )
    print(
        f"simulated cycles (GPGPU-Sim SM86_RTX3070 timing model), grid {grid}, {args.dtype}, D = Dv = {args.dim}, "
        f"B = 1, offsets: {args.offsets or 'the plan'}, smem_optin {args.smem_optin}, "
        f"H = {args.heads}, SMs: {args.sms or 46}, "
        f"terms per offset: {args.terms}; wall {time.time() - start:.0f} s"
    )
    print(
        "| call | kept keys per query | "
        + " | ".join(f"{p} fwd cycles | {p} vs dense" for p in paths)
        + (" | fast / general |" if sorted(paths) == ["fast", "general"] else " |")
    )
    print("|---|---|" + "---|---|" * len(paths) + ("---|" if sorted(paths) == ["fast", "general"] else ""))
    for w in windows:
        key = None if w is None else tuple(w)
        label = "dense" if w is None else f"window {'x'.join(str(2 * x + 1) for x in w)} (shift)"
        cells = []
        for p in paths:
            r, d = rows[(p, key, False)], rows[(p, None, False)]
            cells.append(f"{r['fwd']:,} | {r['fwd'] / d['fwd']:.3f}")
        kept = rows[(paths[0], key, False)]["kept"]
        ratio = (
            f" | {rows[('fast', key, False)]['fwd'] / rows[('general', key, False)]['fwd']:.3f}"
            if sorted(paths) == ["fast", "general"]
            else ""
        )
        print(f"| {label} | {kept} ({100 * kept / N:.1f} %) | " + " | ".join(cells) + ratio + " |")
    if args.no_backward:
        return
    print()
    print("| dense call, forward + backward | cycles per kernel | total | backward / forward |")
    print("|---|---|---|---|")
    for path in paths:
        r = rows[(path, None, True)]
        bwd = r["total"] - r["fwd"]
        per = ", ".join(f"{n} {c:,}" for n, c in r["kernels"])
        print(f"| {path} | {per} | {r['total']:,} | {bwd / r['fwd']:.2f} |")
    if sorted(paths) == ["fast", "general"]:
        ratio = rows[("general", None, True)]["total"] / rows[("fast", None, True)]["total"]
        print(f"\nforward + backward, general / fast: {ratio:.2f}")


if __name__ == "__main__":
    main()
