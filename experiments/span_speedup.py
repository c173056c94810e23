"""Does the learned span pay off in training time? Two runs of cmd/main.py on
Fashion-MNIST with a token per pixel (28x28), a learnable Gaussian span and the
adaptive-span penalty (``span.penalty``), one with threshold 0.1 (a moving
window that skips the keys outside the span box) and one without (dense). Both
log, per epoch, the training time and each layer's sigma and kept-key fraction;
this script plots time per epoch against the kept fraction as the spans narrow.

    python experiments/span_speedup.py                      # both runs, then the plot (~15 min on 2 cores)
    python experiments/span_speedup.py --plot-only          # re-plot the runs already in --runs
    (a finished run is not trained again unless --rerun: a killed script goes on where it stopped)
    python experiments/span_speedup.py --epochs 4 --images 500   # a quicker look

Writes ``<out>/span_speedup.png``, ``<out>/span_speedup.csv`` and ``<out>/summary.md``
(default out: experiments/results/span_speedup). Each run is an ordinary
``python cmd/main.py`` command, printed before it starts.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RUNS = {"threshold 0.1": ("span-thr", 0.1), "dense (no threshold)": ("span-dense", 0.0)}  # label: (run, threshold)


def command(args, name: str, threshold: float) -> list[str]:
    return [
        sys.executable,
        os.path.join(ROOT, "cmd", "main.py"),
        "-no_wandb=T",
        f"-Dname={name}",
        f"-Dout_dir={args.runs}",
        "-Dmodel.patch_size=1",
        "-Dmodel.dim=32",
        "-Dmodel.depth=2",
        "-Dmodel.heads=4",
        "-Dmodel.ffn_dim=64",
        "-Dpe.hidden_dim=32",
        "-Dspan.enabled=true",
        f"-Dspan.threshold={threshold}",
        f"-Dspan.penalty={args.penalty}",
        f"-Dspan.init={args.span_init}",
        f"-Ddata.small_dataset={args.images}",
        f"-Dtrain.epochs={args.epochs}",
        "-Dtrain.batch_size=32",
        f"-Dtrain.lr={args.lr}",
        "-Dtrain.warmup_steps=20",
        f"-Dnum_threads={args.threads}",
        "-Dseed=1",
    ]


def epochs_of(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        raise SystemExit(f"span_speedup: {path} does not exist (run without --plot-only first)")
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    return [r for r in rows if "epoch" in r and "train/loss" in r]


def layer_mean(row: dict, suffix: str) -> float:
    values = [v for k, v in row.items() if k.startswith("span/layer") and k.endswith(suffix)]
    return sum(values) / len(values)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default=os.path.join(ROOT, "runs", "span_speedup"), help="where the two runs go")
    p.add_argument("--out", default=os.path.join(HERE, "results", "span_speedup"), help="plot, CSV, summary")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--images", type=int, default=1000, help="training images (data.small_dataset)")
    p.add_argument("--penalty", type=float, default=2.0, help="span.penalty")
    p.add_argument("--lr", type=float, default=0.008)
    p.add_argument("--span-init", type=float, default=0.3, help="span.init: the spans' starting sigma")
    p.add_argument("--threads", type=int, default=0, help="num_threads (0: torch's default)")
    p.add_argument("--plot-only", action="store_true", help="only plot the runs in --runs")
    p.add_argument("--rerun", action="store_true", help="train runs that have finished already again")
    args = p.parse_args()

    if not args.plot_only:
        for label, (name, threshold) in RUNS.items():
            if os.path.exists(os.path.join(args.runs, name, "summary.json")) and not args.rerun:
                print(f"{label}: {os.path.join(args.runs, name)} is finished already (--rerun trains it again)")
                continue
            cmd = command(args, name, threshold)
            print("$ python " + " ".join([os.path.relpath(cmd[1], ROOT)] + cmd[2:]), flush=True)
            start = time.perf_counter()
            subprocess.run(cmd, check=True, cwd=ROOT)
            print(f"{label}: {time.perf_counter() - start:.0f} s", flush=True)

    history = {label: epochs_of(os.path.join(args.runs, name)) for label, (name, _) in RUNS.items()}
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for label, epochs in history.items():
        for r in epochs:
            rows.append(
                {
                    "run": label,
                    "epoch": r["epoch"],
                    "epoch_s": round(r["time/epoch_s"], 2),
                    "ms_per_sample": round(r["time/per_sample_ms"], 3),
                    "sigma": round(layer_mean(r, "sigma_axis0"), 4),
                    "keep_fraction": round(layer_mean(r, "keep_fraction"), 4),
                    "val_acc": round(r["val/acc"], 4),
                }
            )
    with open(os.path.join(args.out, "span_speedup.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_k) = plt.subplots(1, 2, figsize=(11, 4))
    for label, epochs in history.items():
        e = [r["epoch"] for r in epochs]
        ax_t.plot(e, [r["time/epoch_s"] for r in epochs], marker="o", label=label)
        ax_k.plot(e, [layer_mean(r, "keep_fraction") for r in epochs], marker="o", label=label)
    ax_t.set(xlabel="epoch", ylabel="training time per epoch (s)", title="time per epoch")
    ax_k.set(
        xlabel="epoch",
        ylabel="kept-key fraction (mean over layers)",
        ylim=(0, 1.05),
        title="span box: fraction of keys kept",
    )
    for ax in (ax_t, ax_k):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(
        f"Fashion-MNIST 28x28, a token per pixel: learned span with span.penalty {args.penalty}, {args.images} images"
    )
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "span_speedup.png"), dpi=120)

    thr, dense = history["threshold 0.1"], history["dense (no threshold)"]
    first, last = thr[0], thr[-1]
    lines = [
        "# Learned span: training time as the spans narrow",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.processor() or platform.machine()}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads.",
        "",
        "Command: `" + " ".join(["python", "experiments/span_speedup.py", *sys.argv[1:]]) + "`",
        "",
        "| epoch | threshold 0.1: s | kept | sigma | dense: s | dense / threshold |",
        "|---|---|---|---|---|---|",
    ]
    for a, b in zip(thr, dense):
        lines.append(
            f"| {a['epoch']} | {a['time/epoch_s']:.1f} | {layer_mean(a, 'keep_fraction'):.3f} | "
            f"{layer_mean(a, 'sigma_axis0'):.3f} | {b['time/epoch_s']:.1f} | "
            f"{b['time/epoch_s'] / a['time/epoch_s']:.2f}x |"
        )
    lines += [
        "",
        f"Threshold run: epoch 1 {first['time/epoch_s']:.1f} s at {layer_mean(first, 'keep_fraction'):.0%} "
        f"of the keys, epoch {last['epoch']} {last['time/epoch_s']:.1f} s at "
        f"{layer_mean(last, 'keep_fraction'):.0%}. Final val acc: threshold {last['val/acc']:.4f}, "
        f"dense {dense[-1]['val/acc']:.4f}.",
        "",
    ]
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))
    print(f"wrote {args.out}/span_speedup.png, span_speedup.csv, summary.md")


if __name__ == "__main__":
    main()
