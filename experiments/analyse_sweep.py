"""Statistics and plots of a local sweep that repeats settings over seeds.

    python experiments/analyse_sweep.py runs/<sweep> [--out experiments/results/<sweep>] [--scale "..."]

Reads ``runs/<sweep>/sweep_summary.csv`` (a row per run) and each run's
``metrics.jsonl``, groups the runs by setting (every swept parameter except
``seed``), and writes under ``--out``:

- ``sweep_summary.csv``: the sweep's own summary, copied;
- ``settings.csv`` and ``results.md``: per setting the number of seeds, validation
  accuracy (best epoch) and test accuracy as mean ± sd, and the mean time per training step;
- ``welch.csv`` (and in ``results.md``): Welch's t-test (unequal variances, two-sided,
  uncorrected) of every pair of settings, on validation and on test accuracy;
- ``accuracy.png``: accuracy per setting, mean ± sd with each seed as a dot;
- ``span.png`` (runs with a differentiable span): learned sigma and kept-key fraction
  per layer at the end of training, mean ± sd over seeds.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import re
import shutil
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from scipy import stats  # noqa: E402

from posattn.training.report import write_csv  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METRICS = ("val/best_acc", "test/acc")
NOT_SETTINGS = {"run", "seed", "epochs", "train_seconds", *METRICS, "step_ms", "sigma", "keep"}  # + run_metrics' keys


def read_csv(path: str) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def run_metrics(path: str) -> dict:
    """Mean time per step over the epochs, and the last epoch's span statistics per layer."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        epochs = [row for row in map(json.loads, filter(str.strip, f)) if "epoch" in row]  # not the test line
    out = {}
    steps = [e["time/per_step_ms"] for e in epochs if isinstance(e.get("time/per_step_ms"), (int, float))]
    if steps:
        out["step_ms"] = statistics.fmean(steps)
    last = epochs[-1] if epochs else {}
    sigma, keep = {}, {}
    for key, value in last.items():
        m = re.fullmatch(r"span/layer(\d+)/sigma_axis(\d+)", key)
        if m:
            sigma.setdefault(int(m.group(1)), []).append(float(value))
        m = re.fullmatch(r"span/layer(\d+)/keep_fraction", key)
        if m:
            keep[int(m.group(1))] = float(value)
    if sigma:
        out["sigma"] = [statistics.fmean(sigma[k]) for k in sorted(sigma)]  # mean over axes, per layer
    if keep:
        out["keep"] = [keep[k] for k in sorted(keep)]
    return out


def mean_sd(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def fmt(values: list[float]) -> str:
    m, s = mean_sd(values)
    return f"{m:.4f} ± {s:.4f}"


def load_runs(sweep_dir: str) -> list[dict]:
    """The rows of a sweep's summary, each with its run's metrics (:func:`run_metrics`)."""
    rows = read_csv(os.path.join(sweep_dir, "sweep_summary.csv"))
    for r in rows:
        r.update(run_metrics(os.path.join(sweep_dir, r["run"], "metrics.jsonl")))
    return rows


def report(
    groups: dict[str, list[dict]],
    out: str,
    name: str,
    scale: str = "",
    setting: str = "-",
    pairs: list[tuple[str, str]] | None = None,
    published: dict[str, str] | None = None,
) -> list[str]:
    """Writes settings.csv, welch.csv, results.md, accuracy.png (and span.png) for runs grouped by
    setting label; ``pairs``: the Welch comparisons (default every pair); ``published``: a column of
    published figures per label. Returns the lines of results.md."""
    settings = []
    for label, runs in groups.items():
        row = {"setting": label, "seeds": len(runs)}
        for metric in METRICS:
            m, s = mean_sd([float(r[metric]) for r in runs])
            row[f"{metric} mean"], row[f"{metric} sd"] = f"{m:.4f}", f"{s:.4f}"
        row["val/best_acc max"] = f"{max(float(r['val/best_acc']) for r in runs):.4f}"
        steps = [r["step_ms"] for r in runs if "step_ms" in r]
        row["ms per step"] = f"{statistics.fmean(steps):.0f}" if steps else ""
        settings.append(row)
    write_csv(os.path.join(out, "settings.csv"), settings)

    welch = []
    for a, b in pairs if pairs is not None else itertools.combinations(groups, 2):
        row = {"A": a, "B": b}
        for metric in METRICS:
            xa = [float(r[metric]) for r in groups[a]]
            xb = [float(r[metric]) for r in groups[b]]
            res = stats.ttest_ind(xa, xb, equal_var=False)
            row[f"{metric} A-B"] = f"{statistics.fmean(xa) - statistics.fmean(xb):+.4f}"
            row[f"{metric} p"] = f"{res.pvalue:.3g}"
        welch.append(row)
    if welch:
        write_csv(os.path.join(out, "welch.csv"), welch)

    lines = [f"# {name}", ""]
    if scale:
        lines += [f"Scale: {scale}", ""]
    extra = " published |" if published else ""
    lines += [
        f"Setting: {setting}; metric: validation accuracy at the best epoch, and test accuracy "
        "of that checkpoint; mean ± sd over seeds.",
        "",
        "| setting | seeds | val acc | val max | test acc | ms/step |" + extra,
        "|---|---|---|---|---|---|" + ("---|" if published else ""),
    ]
    for label, runs in groups.items():
        steps = [r["step_ms"] for r in runs if "step_ms" in r]
        step = f"{statistics.fmean(steps):.0f}" if steps else ""
        lines.append(
            f"| {label} | {len(runs)} | {fmt([float(r['val/best_acc']) for r in runs])} | "
            f"{max(float(r['val/best_acc']) for r in runs):.4f} | {fmt([float(r['test/acc']) for r in runs])} | "
            f"{step} |" + (f" {published.get(label, '')} |" if published else "")
        )
    if welch:
        lines += [
            "",
            "Welch's t-test (two-sided, unequal variances, uncorrected for the number of pairs)"
            + (":" if pairs is None else ", for the comparisons the paper makes:"),
            "",
            "| A | B | val A−B | p | test A−B | p |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {w['A']} | {w['B']} | {w['val/best_acc A-B']} | {w['val/best_acc p']} | {w['test/acc A-B']} | "
            f"{w['test/acc p']} |"
            for w in welch
        ]
    spans = {label: runs for label, runs in groups.items() if all("sigma" in r for r in runs)}
    if spans:
        lines += [
            "",
            "Learned span at the end of training, per layer (mean ± sd over seeds; sigma in units of the grid, "
            "mean over axes):",
            "",
            "| setting | layer | sigma | kept keys |",
            "|---|---|---|---|",
        ]
        for label, runs in spans.items():
            for layer in range(len(runs[0]["sigma"])):
                keep = [r["keep"][layer] for r in runs if "keep" in r]
                lines.append(
                    f"| {label} | {layer} | {fmt([r['sigma'][layer] for r in runs])} | {fmt(keep) if keep else ''} |"
                )
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")

    labels = list(groups)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(labels)), 4))
    for j, metric in enumerate(METRICS):
        xs = [i + (j - 0.5) * 0.25 for i in range(len(labels))]
        means = [mean_sd([float(r[metric]) for r in groups[lab]]) for lab in labels]
        ax.errorbar(
            xs,
            [m for m, _ in means],
            yerr=[s for _, s in means],
            fmt="o",
            capsize=4,
            color=f"C{j}",
            label=f"{metric} (mean ± sd)",
        )
        for x, lab in zip(xs, labels):
            ax.scatter([x] * len(groups[lab]), [float(r[metric]) for r in groups[lab]], s=10, color=f"C{j}", alpha=0.4)
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{name}" + (f"\n{scale}" if scale else ""), fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "accuracy.png"), dpi=120)
    plt.close(fig)

    if spans:
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
        for i, (label, runs) in enumerate(spans.items()):
            for ax, key, what in (
                (axes[0], "sigma", "learned sigma (grid units)"),
                (axes[1], "keep", "kept-key fraction"),
            ):
                per_layer = list(zip(*[r[key] for r in runs if key in r]))
                if not per_layer:
                    continue
                ms = [mean_sd(list(v)) for v in per_layer]
                ax.errorbar(
                    range(len(ms)),
                    [m for m, _ in ms],
                    yerr=[s for _, s in ms],
                    marker="o",
                    capsize=3,
                    color=f"C{i}",
                    label=label,
                )
                ax.set_xlabel("layer")
                ax.set_ylabel(what)
                ax.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
        fig.suptitle(f"{name}: span at the end of training (mean ± sd over seeds)", fontsize=9)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "span.png"), dpi=120)
        plt.close(fig)
    return lines


def sweep_paths(parser: argparse.ArgumentParser, sweep_dir: str, out: str | None) -> tuple[str, str, str]:
    """(the sweep's summary CSV, the sweep's name, the results folder, created)."""
    summary = os.path.join(sweep_dir, "sweep_summary.csv")
    if not os.path.exists(summary):
        parser.error(f"{summary} does not exist: run the sweep first (cmd/main.py -mode=local_sweep)")
    name = os.path.basename(os.path.normpath(sweep_dir))
    out = out or os.path.join(ROOT, "experiments", "results", name)
    os.makedirs(out, exist_ok=True)
    return summary, name, out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep_dir")
    p.add_argument("--out", default=None, help="results folder (default experiments/results/<sweep name>)")
    p.add_argument("--scale", default="", help="one line on the scale of the runs, written above the tables")
    args = p.parse_args(argv)
    summary, name, out = sweep_paths(p, args.sweep_dir, args.out)
    shutil.copyfile(summary, os.path.join(out, "sweep_summary.csv"))

    rows = load_runs(args.sweep_dir)
    keys = [k for k in rows[0] if k not in NOT_SETTINGS and len({r[k] for r in rows}) > 1]
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(" / ".join(r[k] for k in keys) or "all", []).append(r)
    lines = report(groups, out, name, args.scale, setting=" / ".join(keys) or "-")
    print("\n".join(lines))
    print(
        f"\nwritten: {out}/ (sweep_summary.csv, settings.csv, welch.csv, results.md, accuracy.png, span.png "
        "where the runs have a span)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
