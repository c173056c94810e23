"""CPU benchmark of the posattn.nn models: one training step (forward + backward)
of the thesis classifier, on the fused operator against the same model on the
dense reference (what the module would cost without the operator), with a span
threshold, and with plain SDPA attention instead (no positional term: the
floor); plus the Performer variants for scale (--no-performers skips them).

Median of repeated steps after warm-up, in one process; prints ratios.

Usage:
  python benchmarks/bench_models_cpu.py                     # 14x14 and 28x28, batch 32
  python benchmarks/bench_models_cpu.py --grid 28x28 --batch 16 --repeats 5
  python benchmarks/bench_models_cpu.py --grid 28x28 --no-performers
"""

from __future__ import annotations

import argparse
import math
import platform
from datetime import date

import torch
import torch.nn.functional as F
from bench_common import record, write_records

import posattn
from posattn.nn import ClippedRelativePerformer, NoPosPerformer, Performer, RelativePerformer, TransformerClassifier
from posattn.utils.timing import median_seconds

THRESHOLD = 0.1


def thesis_model(grid, backend, span_sigma=None):
    span = {"enabled": True, "threshold": THRESHOLD, "init": span_sigma} if span_sigma else {}
    return TransformerClassifier(grid=grid, backend=backend, span=span)


def step_seconds(model, x, y, repeats):
    def step():
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()

    return median_seconds(step, warmup=1, repeats=repeats)


def bench_grid(grid, args):
    torch.manual_seed(0)
    x = torch.rand(args.batch, *grid, 1)
    y = torch.randint(0, 10, (args.batch,))
    n = math.prod(grid)
    # the reference builds (B, H, N, N) tensors: skip it where they would not fit
    ref_bytes = 6 * 8 * args.batch * n * n * 4 * 6  # ~6 saved N x N tensors per layer, 6 layers
    rows = {}
    rows["fused"] = step_seconds(thesis_model(grid, "fused"), x, y, args.repeats)
    rows["fused_span_thr"] = step_seconds(thesis_model(grid, "fused", args.sigma), x, y, args.repeats)
    sdpa = TransformerClassifier(grid=grid, attention="sdpa", pe={"name": "none"})
    rows["sdpa"] = step_seconds(sdpa, x, y, args.repeats)
    if ref_bytes < args.max_reference_gib * 2**30:
        rows["reference"] = step_seconds(thesis_model(grid, "reference"), x, y, args.repeats)
    for cls in () if args.no_performers else (Performer, NoPosPerformer, RelativePerformer, ClippedRelativePerformer):
        m = cls(in_channels=1, num_classes=10, grid=grid, dim=64, depth=6, heads=8, ffn_dim=128)
        rows[cls.__name__] = step_seconds(m, x, y, args.repeats)
    keep = thesis_model(grid, "fused", args.sigma).span_stats(grid)["layer0/keep_fraction"]
    return rows, keep


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", action="append", help="e.g. 28x28 (repeatable); default 14x14 and 28x28")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sigma", type=float, default=0.1, help="initial span sigma of the threshold run")
    p.add_argument("--max-reference-gib", type=float, default=8.0)
    p.add_argument("--no-performers", action="store_true", help="time only the thesis model and its SDPA twin")
    p.add_argument("--json", help="also write ratio records for benchmarks/compare.py to this file")
    args = p.parse_args()
    recs = []
    grids = [[int(s) for s in g.split("x")] for g in (args.grid or ["14x14", "28x28"])]
    print(
        f"posattn {posattn.__version__}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}, {date.today()}"
    )
    print(
        f"one training step (fwd+bwd), batch {args.batch}, thesis model (6 layers, dim 64, 8 heads, SIREN); "
        f"Performers with the same depth/dim/heads"
    )
    for grid in grids:
        rows, keep = bench_grid(grid, args)
        g = "x".join(map(str, grid))
        print(f"\ngrid {g}:")
        for name, t in rows.items():
            print(f"  {name:26s} {1e3 * t:9.1f} ms   {1e3 * t / args.batch:7.2f} ms/sample")
        case = f"thesis model, grid {g}, batch {args.batch}, training step"
        if "reference" in rows:
            recs.append(
                record(
                    "models", case, "fused backend", "reference backend", 1e3 * rows["fused"], 1e3 * rows["reference"]
                )
            )
            print(f"  fused vs reference backend: {rows['reference'] / rows['fused']:.2f}x faster")
        else:
            print("  reference backend skipped (its N x N tensors would exceed --max-reference-gib)")
        print(f"  fused / same model on plain SDPA (no positional term): {rows['fused'] / rows['sdpa']:.2f}x the time")
        print(
            f"  span threshold {THRESHOLD} at sigma {args.sigma} (keeps {100 * keep:.1f}% of keys): "
            f"{rows['fused'] / rows['fused_span_thr']:.2f}x faster than dense"
        )
        recs.append(
            record(
                "models",
                case,
                f"span threshold ({100 * keep:.0f}% kept)",
                "dense",
                1e3 * rows["fused_span_thr"],
                1e3 * rows["fused"],
            )
        )
        recs.append(
            record(
                "models", case, "fused backend", "SDPA attention, no positions", 1e3 * rows["fused"], 1e3 * rows["sdpa"]
            )
        )
        if "Performer" in rows:
            recs.append(
                record(
                    "models", case, "fused backend", "Performer (FAVOR+)", 1e3 * rows["fused"], 1e3 * rows["Performer"]
                )
            )
    write_records(args.json, recs)


if __name__ == "__main__":
    main()
