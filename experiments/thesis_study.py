"""The thesis study at CPU scale: its eight settings from two local sweeps, beside the published numbers.

    python cmd/main.py -mode=local_sweep --sweep_config=thesis_cpu_encodings   # 1-D/2-D x baseline/SIREN
    python cmd/main.py -mode=local_sweep --sweep_config=thesis_cpu_span        # 1-D/2-D x span, threshold 0 / 0.1
    python experiments/thesis_study.py [--runs runs] [--out experiments/results/thesis_cpu]

Names each run by its thesis setting ("2-D SIREN + span + threshold 0.1"), then writes what
``analyse_sweep.py`` writes (settings.csv, welch.csv, results.md, accuracy.png, span.png) with
Welch's t-tests for the comparisons the thesis makes, and the published CIFAR-10 numbers beside.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from analyse_sweep import ROOT, load_runs, report

SWEEPS = ("thesis_cpu_encodings", "thesis_cpu_span")
# the thesis' validation accuracy on CIFAR-10, 5 seeds: max / mean ± sd (2-D baseline: not run there)
PUBLISHED = {
    "1-D baseline": ".7624 / .7493 ± .0107",
    "1-D SIREN": ".7562 / .7269 ± .0231",
    "1-D SIREN + span": ".7325 / .7094 ± .0216",
    "1-D SIREN + span + threshold 0.1": ".7352 / .7168 ± .0178",
    "2-D baseline": "not run",
    "2-D SIREN": ".8134 / .7991 ± .0087",
    "2-D SIREN + span": ".8130 / .8026 ± .0158",
    "2-D SIREN + span + threshold 0.1": ".8130 / .8095 ± .0038",
}
PAIRS = [
    ("2-D SIREN", "1-D SIREN"),
    ("2-D baseline", "1-D baseline"),
    ("1-D baseline", "1-D SIREN"),
    ("2-D baseline", "2-D SIREN"),
    ("1-D SIREN + span", "1-D SIREN"),
    ("2-D SIREN + span", "2-D SIREN"),
    ("1-D SIREN + span + threshold 0.1", "1-D SIREN + span"),
    ("2-D SIREN + span + threshold 0.1", "2-D SIREN + span"),
]


def setting(row: dict) -> str:
    rank = "1-D" if row["model.positions"] == "sequence" else "2-D"
    if "span.threshold" not in row:
        return f"{rank} {'baseline' if row['positional_encoding'] == 'sinusoidal' else 'SIREN'}"
    return f"{rank} SIREN + span" + (" + threshold 0.1" if float(row["span.threshold"]) > 0 else "")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", default="runs", help="the folder holding the two sweeps' folders")
    p.add_argument("--out", default=os.path.join(ROOT, "experiments", "results", "thesis_cpu"))
    p.add_argument(
        "--scale",
        default="Fashion-MNIST, 7x7 tokens of 4x4 pixels, the thesis model (6 post-LN layers, dim 64, "
        "8 heads, dropout 0.1, last-token pooling), Adam 1e-3, batch 20 x 2, 12 000 training images "
        "(80/20 split), 2 epochs, 3 seeds; 1-D: the same tokens with row-major positions",
    )
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    groups: dict[str, list[dict]] = {name: [] for name in PUBLISHED}
    for sweep in SWEEPS:
        folder = os.path.join(args.runs, sweep)
        if not os.path.exists(os.path.join(folder, "sweep_summary.csv")):
            p.error(
                f"{folder}/sweep_summary.csv does not exist: run python cmd/main.py -mode=local_sweep "
                f"--sweep_config={sweep} first"
            )
        shutil.copyfile(os.path.join(folder, "sweep_summary.csv"), os.path.join(args.out, f"{sweep}_summary.csv"))
        for row in load_runs(folder):
            groups[setting(row)].append(row)
    groups = {k: v for k, v in groups.items() if v}
    pairs = [(a, b) for a, b in PAIRS if a in groups and b in groups]
    lines = report(
        groups,
        args.out,
        "thesis_cpu",
        args.scale,
        setting="thesis setting",
        pairs=pairs,
        published={k: f"{v} (CIFAR-10)" if v != "not run" else v for k, v in PUBLISHED.items()},
    )
    print("\n".join(lines))
    print(f"\nwritten: {args.out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
