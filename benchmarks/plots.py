"""The plots of BENCHMARKS.md's "Where it stands", drawn from measured data only (the newest folder
of each kind under benchmarks/measured/), into docs/img/:

  cpu_window.png   CPU forward + backward time against the kept fraction of a window
                   (bench_cpu_curves.py's window.csv)
  cpu_grid.png     CPU forward time against the number of tokens of n x n grids: posattn, SDPA,
                   NATTEN (bench_cpu_curves.py's grid.csv)
  sim_control.png  simulated cycles of the fast CUDA kernels against the FlashAttention-2 control
                   (control_cycles.csv: --sim-table DIR makes it from sim_cycles.py's JSON files
                   there, control_{all,none}_GRID.json, and prints it as a markdown table)

    python benchmarks/plots.py [--out docs/img]
    python benchmarks/plots.py --sim-table benchmarks/measured/sim_<date>    # then the plots
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MEASURED = os.path.join(HERE, "measured")


def newest(pattern: str) -> str:
    found = sorted(glob.glob(os.path.join(MEASURED, pattern)))
    if not found:
        raise SystemExit(f"plots: no measured data matches benchmarks/measured/{pattern}")
    return found[-1]


def rows(path: str) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def caption(folder: str) -> str:
    path = os.path.join(folder, "machine.txt")
    return open(path).read().strip() if os.path.exists(path) else os.path.basename(folder)


def save(fig, out: str, name: str, source: str) -> None:
    fig.text(0.01, 0.005, textwrap.fill(source, 130), fontsize=6, color="0.4")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    path = os.path.join(out, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


LABELS = {
    "sdpa": "SDPA, no positional term",
    "posattn dense": "posattn dense (q_pos . rel)",
    "posattn.na2d": "posattn.na2d, 7 x 7",
    "natten.na2d": "natten.na2d, 7 x 7 (its CPU backend)",
    "sdpa + window mask": "SDPA + the 7 x 7 windows as a mask",
}


def log_axes(ax, xlabel: str, ylabel: str, title: str) -> None:
    """The CPU plots' finish: both axes logarithmic, labels, a small title, legend and grid."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)


def window_plot(out: str) -> None:
    path = newest("cpu_curves_*/window.csv")
    data = rows(path)
    fig, ax = plt.subplots(figsize=(6, 4))
    win = [r for r in data if r["method"] == "posattn window"]
    ax.plot([100 * float(r["kept"]) for r in win], [float(r["ms"]) for r in win], "o-", label="posattn with a window")
    for name, style in (("posattn dense", "--"), ("sdpa", ":")):
        for r in data:
            if r["method"] == name:
                ax.axhline(float(r["ms"]), linestyle=style, color="0.3" if name == "sdpa" else "C1", label=LABELS[name])
    log_axes(
        ax,
        "keys kept per query (%)",
        "forward + backward (ms)",
        "relpos_attention on the CPU: the window's work scales with what it keeps",
    )
    save(fig, out, "cpu_window.png", f"{os.path.relpath(path, HERE)}: {caption(os.path.dirname(path))}")


def grid_plot(out: str) -> None:
    path = newest("cpu_curves_*/grid.csv")
    data = rows(path)
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in dict.fromkeys(r["method"] for r in data):
        pts = [r for r in data if r["method"] == name]
        ax.plot([int(r["tokens"]) for r in pts], [float(r["ms"]) for r in pts], "o-", label=LABELS.get(name, name))
    log_axes(ax, "tokens (n x n grids)", "forward (ms)", "Forward time against grid size (CPU; windows 7 x 7)")
    save(fig, out, "cpu_grid.png", f"{os.path.relpath(path, HERE)}: {caption(os.path.dirname(path))}")


def control_plot(out: str) -> None:
    path = newest("sim_*/control_cycles.csv")
    data = rows(path)
    labels = [r["call"] for r in data]
    ctrl = [float(r["control"]) for r in data]
    pos = [float(r["positional"]) for r in data]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], [c / 1e3 for c in ctrl], 0.4, label="FlashAttention-2 control (no positional term)")
    ax.bar([x + 0.2 for x in xs], [p / 1e3 for p in pos], 0.4, label="posattn fast kernels (q_pos . rel, bias, span)")
    for x, c, p in zip(xs, ctrl, pos):
        ax.text(x + 0.2, p / 1e3, f"{p / c:.2f}x", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([textwrap.fill(label, 18) for label in labels], fontsize=7)
    ax.set_ylabel("simulated cycles (thousands)")
    ax.set_title("Simulated GPU (GPGPU-Sim, Ampere model): the positional term's cost")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7)
    save(fig, out, "sim_control.png", f"{os.path.relpath(path, HERE)}: {caption(os.path.dirname(path))}")


def sim_table(folder: str) -> None:
    """control_cycles.csv in folder, from sim_cycles.py's JSON of each grid with every term per offset
    (q_pos . rel, a bias and a span: "all") and with none (the FA2 control): the forward, the backward
    (d q, d k, d v) and, positional only, the offset kernel (d rel, d bias, d sigma) and the tables."""

    def split(path):
        runs = json.load(open(path))
        fwd = next(v for k, v in runs.items() if k.endswith("|fwd"))
        bwd = next((v for k, v in runs.items() if k.endswith("|bwd")), None)
        out = {"forward": sum(c for name, c in fwd["kernels"] if "fwd" in name)}
        out["tables"] = sum(c for name, c in fwd["kernels"] if "tables" in name)
        if bwd is not None:
            later = bwd["kernels"][len(fwd["kernels"]) :]  # the backward run repeats the forward first
            out["backward"] = sum(c for name, c in later if name.startswith("fast d"))
            out["offsets"] = sum(c for name, c in later if "offsets" in name or "tables" in name)
        return out

    rows = []
    for path in sorted(glob.glob(os.path.join(folder, "control_all_*.json"))):
        grid = os.path.basename(path)[len("control_all_") : -len(".json")]
        other = os.path.join(folder, f"control_none_{grid}.json")
        if not os.path.exists(other):
            continue
        pos, ctrl = split(path), split(other)
        rows.append(dict(call=f"{grid} forward", control=ctrl["forward"], positional=pos["forward"] + pos["tables"]))
        if "backward" in pos and "backward" in ctrl:
            rows.append(
                dict(call=f"{grid} backward: d q, d k, d v", control=ctrl["backward"], positional=pos["backward"])
            )
            rows.append(
                dict(
                    call=f"{grid} backward with d rel, d bias, d sigma",
                    control=ctrl["backward"],
                    positional=pos["backward"] + pos["offsets"],
                )
            )
    if not rows:
        raise SystemExit(f"plots: no pair of control_all_*.json and control_none_*.json in {folder}")
    with open(os.path.join(folder, "control_cycles.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print("| call | FA2 control | posattn | posattn / control |\n|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['call']} | {r['control']:,} | {r['positional']:,} | {r['positional'] / r['control']:.2f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "docs", "img"))
    p.add_argument(
        "--sim-table", metavar="DIR", help="first make DIR/control_cycles.csv from sim_cycles.py's JSON files"
    )
    args = p.parse_args()
    if args.sim_table:
        sim_table(args.sim_table)
    os.makedirs(args.out, exist_ok=True)
    window_plot(args.out)
    grid_plot(args.out)
    control_plot(args.out)


if __name__ == "__main__":
    main()
