"""Horn et al.'s shifted-image test on every run of a Performer sweep, summarised per model.

    python experiments/shift_study.py runs/horn_cpu [--min-shift 8] [--step 2] [--out experiments/results/horn_cpu]

For each run folder of the sweep (listed in its sweep_summary.csv) this runs
``cmd/main.py -mode=shift_test`` (accuracy per horizontal shift on the test images of
class 1 with at least ``min_shift`` empty columns on both sides), then writes, under
``--out``: ``shift_runs.csv`` (a row per run and shift), ``shift_accuracy.csv`` (mean and
sd over seeds per model and shift) and ``shift_accuracy.png`` (accuracy against shift,
one line per model with error bars, beside the paper's curves where published).
With 2x2-pixel tokens use an even ``--step``: a shift by whole tokens is what a
translation-equivariant model can follow exactly.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from analyse_sweep import read_csv, sweep_paths  # noqa: E402  (beside this script)

from posattn.training.report import write_csv  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Horn et al., Fashion-MNIST, shifts -8, -6, ..., +8 (their Table / Figure of the shifted-image test)
PUBLISHED = {
    "Performer": [0.000, 0.000, 0.008, 0.509, 0.991, 0.984, 0.906, 0.021, 0.001],
    "RelativePerformer": [0.896, 0.948, 0.982, 0.990, 0.992, 0.989, 0.989, 0.987, 0.984],
}
PUBLISHED_SHIFTS = list(range(-8, 9, 2))


def run_shift_test(sweep_dir: str, run: str, min_shift: int, step: int, exact: bool) -> list[dict]:
    out_dir, name = os.path.dirname(os.path.abspath(os.path.join(sweep_dir, run))), run
    cmd = [
        sys.executable,
        os.path.join(ROOT, "cmd", "main.py"),
        "-mode=shift_test",
        "-no_wandb=T",
        f"-Dout_dir={out_dir}",
        f"-Dname={name}",
        f"-Dshift.min_shift={min_shift}",
        f"-Dshift.step={step}",
        f"-Dshift.exact_kernel={str(exact).lower()}",
    ]
    print("$ " + " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True)
    folder = "shift_test_exact_kernel" if exact else "shift_test"
    return read_csv(os.path.join(out_dir, name, folder, "shift_accuracy.csv"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep_dir", help="the local sweep's folder (runs/<sweep name>)")
    p.add_argument("--min-shift", type=int, default=8)
    p.add_argument("--step", type=int, default=2)
    p.add_argument("--out", default=None, help="results folder (default experiments/results/<sweep name>)")
    p.add_argument(
        "--exact-kernel",
        action="store_true",
        help="evaluate with the exact softmax kernel instead of the FAVOR+ features (files *_exact_kernel.*)",
    )
    p.add_argument(
        "--replot", action="store_true", help="redo the summary and plot from the shift_runs CSV written before"
    )
    args = p.parse_args(argv)
    summary, name, out = sweep_paths(p, args.sweep_dir, args.out)

    suffix = "_exact_kernel" if args.exact_kernel else ""
    runs_csv = os.path.join(out, f"shift_runs{suffix}.csv")
    if args.replot:
        per_run = [
            dict(r, shift=int(r["shift"]), accuracy=float(r["accuracy"]), images=int(r["images"]))
            for r in read_csv(runs_csv)
        ]
    else:
        per_run = []
        for row in read_csv(summary):
            for r in run_shift_test(args.sweep_dir, row["run"], args.min_shift, args.step, args.exact_kernel):
                per_run.append(
                    {
                        "run": row["run"],
                        "model": row["model.variant"],
                        "seed": row.get("seed", ""),
                        "shift": int(r["shift"]),
                        "accuracy": float(r["accuracy"]),
                        "images": int(r["images"]),
                    }
                )
        write_csv(runs_csv, per_run)

    models = list(dict.fromkeys(r["model"] for r in per_run))
    shifts = sorted({r["shift"] for r in per_run})
    table = []
    for model in models:
        for shift in shifts:
            acc = [r["accuracy"] for r in per_run if r["model"] == model and r["shift"] == shift]
            table.append(
                {
                    "model": model,
                    "shift": shift,
                    "mean": f"{statistics.fmean(acc):.4f}",
                    "sd": f"{statistics.stdev(acc) if len(acc) > 1 else 0.0:.4f}",
                    "seeds": len(acc),
                }
            )
    write_csv(os.path.join(out, f"shift_accuracy{suffix}.csv"), table)

    fig, ax = plt.subplots(figsize=(7, 5))
    for i, model in enumerate(models):
        rows = [t for t in table if t["model"] == model]
        color = f"C{i}"
        ax.errorbar(
            [t["shift"] for t in rows],
            [float(t["mean"]) for t in rows],
            yerr=[float(t["sd"]) for t in rows],
            marker="o",
            capsize=3,
            color=color,
            label=f"{model} (posattn, mean ± sd)",
        )
        if model in PUBLISHED:
            ax.plot(PUBLISHED_SHIFTS, PUBLISHED[model], linestyle=":", color=color, label=f"{model} (published)")
    ax.set_xlabel("horizontal shift (pixels)")
    ax.set_ylabel("accuracy on class 1")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    kernel = ", exact softmax kernel" if args.exact_kernel else ""
    ax.set_title(f"{name}: shifted-image test ({per_run[0]['images']} test images of class 1{kernel})", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"shift_accuracy{suffix}.png"), dpi=120)
    print(f"written: {out}/shift_runs{suffix}.csv, shift_accuracy{suffix}.csv, shift_accuracy{suffix}.png")
    for model in models:
        rows = [t for t in table if t["model"] == model]
        print(f"{model:>26}: " + " ".join(f"{float(t['mean']):.3f}" for t in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
