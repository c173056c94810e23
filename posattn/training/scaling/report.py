"""The files of the scaling study: ``runtime.csv``, ``exponents.csv``,
``gradients.csv``, the PNG plots and ``summary.md``."""

from __future__ import annotations

import datetime
import math
import os
import platform
import statistics

import torch

from ..report import pyplot, save_figure, write_csv
from .study import (
    EXPONENT_COLUMNS,
    GRADIENT_ARCHS,
    GRADIENT_COLUMNS,
    GRADIENT_ENCODINGS,
    METHODS,
    RUNTIME_COLUMNS,
    SPAN_KEEP,
    ScalingConfig,
)

__all__ = ["write_outputs", "summary_markdown", "machine_line", "fmt"]


def _style(method: str) -> dict:
    colors = {
        "reference": "tab:red",
        "relpos": "tab:blue",
        "relpos_span10": "tab:cyan",
        "relpos_span1": "tab:green",
        "performer": "tab:purple",
        "algebraic_sdpa": "tab:orange",
        "sdpa": "tab:gray",
    }
    return dict(color=colors.get(method), marker="o", markersize=4, label=method)


def _reference_slopes(ax, xs: list[float], ys: list[float]) -> None:
    """Dashed N and N^2 guides through the geometric middle of the data."""
    if len(xs) < 2 or not ys:
        return
    x0, x1 = min(xs), max(xs)
    ymid = math.exp(statistics.fmean(math.log(y) for y in ys))
    xmid = math.sqrt(x0 * x1)
    for k, style in ((1, ":"), (2, "--")):
        ax.plot(
            [x0, x1],
            [ymid * (x0 / xmid) ** k, ymid * (x1 / xmid) ** k],
            style,
            color="black",
            lw=1,
            label=f"slope {k} (N^{k})" if k == 2 else "slope 1 (N)",
        )


def _log_axes(ax, xlabel: str, ylabel: str, legend_size: int = 7) -> None:
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=legend_size)


def plot_tokens(rows: list[dict], value: str, ylabel: str, path: str, title: str) -> None:
    studies = [s for s in ("length", "grid") if any(r["study"] == s for r in rows)]
    fig, axes = pyplot().subplots(1, max(len(studies), 1), figsize=(6.2 * max(len(studies), 1), 4.6), squeeze=False)
    for ax, study in zip(axes[0], studies):
        allx, ally = [], []
        for method in METHODS:
            pts = sorted(
                (r["tokens"], r[value])
                for r in rows
                if r["study"] == study and r["method"] == method and r["status"] == "ok" and r[value] > 0
            )
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], **_style(method))
                allx += [p[0] for p in pts]
                ally += [p[1] for p in pts]
        if value == "seconds":
            _reference_slopes(ax, allx, ally)
        _log_axes(ax, "tokens N (" + ("1-D sequence" if study == "length" else "2-D grid n x n") + ")", ylabel)
    save_figure(fig, path, title, dpi=110)


def plot_depth(rows: list[dict], path: str, title: str) -> None:
    fig, axes = pyplot().subplots(1, 2, figsize=(12.4, 4.6))
    for ax, value, ylabel in (
        (axes[0], "seconds", "seconds per training step"),
        (axes[1], "peak_mib", "peak extra MiB"),
    ):
        for method in METHODS:
            pts = sorted(
                (r["depth"], r[value])
                for r in rows
                if r["study"] == "depth" and r["method"] == method and r["status"] == "ok" and r[value] > 0
            )
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], **_style(method))
        _log_axes(ax, "depth (layers)", ylabel)
    save_figure(fig, path, title, dpi=110)


def plot_gradients(rows: list[dict], path: str, title: str) -> None:
    colors = dict(zip(GRADIENT_ARCHS, ("tab:blue", "tab:green", "tab:orange", "tab:red")))
    lines = {"abs_sinusoidal": "-", "abs_learned": "--"}
    panels = (
        ("first_layer_grad", "first encoder layer"),
        ("embedding_grad", "token embedding"),
        ("positional_grad", "learnable positional table"),
    )
    fig, axes = pyplot().subplots(1, 3, figsize=(16, 4.6))
    floor = 1e-45  # exact zeros (underflow) are drawn at the floor of the log axis
    for ax, (key, name) in zip(axes, panels):
        for encoding in GRADIENT_ENCODINGS:
            for arch in GRADIENT_ARCHS:
                pts = sorted(
                    (r["depth"], r[key])
                    for r in rows
                    if r["encoding"] == encoding and r["arch"] == arch and math.isfinite(r[key])
                )
                if pts:
                    ax.plot(
                        [p[0] for p in pts],
                        [max(p[1], floor) for p in pts],
                        lines[encoding],
                        marker="o",
                        markersize=3,
                        color=colors[arch],
                        label=f"{arch}, {GRADIENT_ENCODINGS[encoding]}",
                    )
        _log_axes(ax, "depth (layers)", f"mean |grad|, {name}", legend_size=6)
    save_figure(fig, path, title, dpi=110)


def fmt(value: float, digits: int = 1) -> str:
    return "—" if not isinstance(value, (int, float)) or not math.isfinite(value) else f"{value:.{digits}f}"


def _method_table(methods: list[str], rows: list[dict], column: str, keys: list, value: str, digits: int) -> list[str]:
    """Markdown table: a row per method, a column per value of ``row[column]``
    ("skip" where the point was not measured)."""
    lines = ["| method | " + " | ".join(map(str, keys)) + " |", "|---" * (len(keys) + 1) + "|"]
    for m in methods:
        cells = []
        for key in keys:
            r = next((r for r in rows if r["method"] == m and r[column] == key), None)
            cells.append(fmt(r[value], digits) if r and r["status"] == "ok" else "skip")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return lines


def machine_line(cfg: ScalingConfig) -> str:
    device = torch.device(cfg.device)
    if device.type == "cuda":
        what = torch.cuda.get_device_name(device)
    else:
        what = f"CPU {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    return f"{what}; torch {torch.__version__}; {datetime.date.today().isoformat()}"


def summary_markdown(
    cfg: ScalingConfig, rows: list[dict], exponents: list[dict], grads: list[dict], command: str
) -> str:
    lines = [
        f"# Scaling study ({machine_line(cfg)})",
        "",
        f"Command: `{command}`",
        "",
        f"Model: {cfg.token_depth} layers for the token sweeps, dim {cfg.dim}, {cfg.heads} heads, feed-forward "
        f"{cfg.ffn_dim}, batch {cfg.batch}, float32. One training step = forward + backward "
        f"(median of {cfg.repeats} after {cfg.warmup} warm-up); peak memory = what one step adds.",
        "",
        "Methods:",
    ]
    for m in cfg.methods:
        lines.append(f"- `{m}`: {METHODS[m][0]}")
    spans = sorted({r["keep_fraction"] for r in rows if r["method"] in SPAN_KEEP and r["status"] == "ok"})
    if spans:
        lines.append(
            f"\nThe span methods keep a box of fixed size in cells (threshold {cfg.threshold}), "
            "chosen to keep ~10% / ~1% of the keys on the largest grid of each sweep; on smaller grids the same "
            "box keeps a larger fraction (column keep_fraction of runtime.csv)."
        )
    for study, what in (("length", "1-D sequences"), ("grid", "2-D grids")):
        srows = [r for r in rows if r["study"] == study]
        if not srows:
            continue
        sizes = [g for _, g in sorted({(r["tokens"], r["grid"]) for r in srows})]
        lines += ["", f"## Seconds per training step vs tokens, {what}", ""]
        lines += _method_table(cfg.methods, srows, "grid", sizes, "seconds", 3)
        lines += ["", f"Peak extra memory (MiB), {what}:", ""]
        lines += _method_table(cfg.methods, srows, "grid", sizes, "peak_mib", 1)
    drows = [r for r in rows if r["study"] == "depth"]
    if drows:
        lines += ["", f"## Seconds per training step vs depth (grid {drows[0]['grid']})", ""]
        lines += _method_table(cfg.methods, drows, "depth", sorted({r["depth"] for r in drows}), "seconds", 3)
    if exponents:
        lines += [
            "",
            "## Fitted growth exponents (time ~ size^k)",
            "",
            "k over all measured sizes, and over the larger half (at least 3 points), where fixed per-step "
            "costs weigh least.",
            "",
            "| study | method | points | k (all) | k (larger half) | expected |",
            "|---|---|---|---|---|---|",
        ]
        for e in exponents:
            lines.append(
                f"| {e['study']} | {e['method']} | {e['points']} | {fmt(e['exponent_all'], 2)} | "
                f"{fmt(e['exponent_large'], 2)} | {e['expected']} |"
            )
    skipped = [r for r in rows if r["status"] != "ok"]
    if skipped:
        lines += ["", "Skipped points:", ""]
        lines += [f"- {r['method']} {r['study']} {r['grid']} depth {r['depth']}: {r['status']}" for r in skipped]
    if grads:
        depths = sorted({g["depth"] for g in grads})
        lines += [
            "",
            f"## Mean |grad| at initialisation vs depth ({grads[0]['tokens']} tokens, mean of "
            f"{grads[0]['seeds']} seeds, SDPA attention)",
            "",
        ]
        for key, name in (
            ("first_layer_grad", "first encoder layer"),
            ("embedding_grad", "token embedding"),
            ("positional_grad", "learnable positional table"),
        ):
            lines += [
                f"{name}:",
                "",
                "| encoding | arch | " + " | ".join(map(str, depths)) + " |",
                "|---|---" + "|---" * len(depths) + "|",
            ]
            for enc in GRADIENT_ENCODINGS:
                for arch in GRADIENT_ARCHS:
                    vals = {g["depth"]: g[key] for g in grads if g["encoding"] == enc and g["arch"] == arch}
                    if not any(math.isfinite(v) for v in vals.values()):
                        continue
                    cells = [f"{vals[d]:.2e}" if d in vals and math.isfinite(vals[d]) else "—" for d in depths]
                    lines.append(f"| {GRADIENT_ENCODINGS[enc]} | {arch} | " + " | ".join(cells) + " |")
            lines.append("")
    lines += [
        "Plots: `runtime_vs_tokens.png`, `memory_vs_tokens.png`, `runtime_vs_depth.png`, "
        "`gradients_vs_depth.png`. Data: `runtime.csv`, `exponents.csv`, `gradients.csv`."
    ]
    return "\n".join(lines) + "\n"


def write_outputs(cfg: ScalingConfig, rows: list[dict], exponents: list[dict], grads: list[dict], command: str) -> dict:
    """Writes the CSVs, plots and summary into cfg.out; returns {name: path}."""
    os.makedirs(cfg.out, exist_ok=True)
    paths = {}

    def p(name):
        paths[name] = os.path.join(cfg.out, name)
        return paths[name]

    machine = machine_line(cfg)
    if rows:
        write_csv(p("runtime.csv"), rows, RUNTIME_COLUMNS)
        write_csv(p("exponents.csv"), exponents, EXPONENT_COLUMNS)
        token_rows = [r for r in rows if r["study"] in ("length", "grid")]
        if token_rows:
            plot_tokens(
                token_rows,
                "seconds",
                "seconds per training step (fwd + bwd)",
                p("runtime_vs_tokens.png"),
                f"one training step, {cfg.token_depth} layers, dim {cfg.dim}, batch {cfg.batch} ({machine})",
            )
            plot_tokens(
                token_rows,
                "peak_mib",
                "peak extra memory of one step (MiB)",
                p("memory_vs_tokens.png"),
                f"peak memory, {cfg.token_depth} layers, dim {cfg.dim}, batch {cfg.batch} ({machine})",
            )
        if any(r["study"] == "depth" for r in rows):
            plot_depth(
                rows, p("runtime_vs_depth.png"), f"cost vs depth, grid {'x'.join(map(str, cfg.depth_grid))} ({machine})"
            )
    if grads:
        write_csv(p("gradients.csv"), grads, GRADIENT_COLUMNS)
        plot_gradients(
            grads,
            p("gradients_vs_depth.png"),
            f"mean |grad| at initialisation, {cfg.gradient_tokens} tokens, SDPA attention "
            f"(solid: fixed sinusoidal, dashed: learnable table; exact zeros drawn at 1e-45)",
        )
    tmp = p("summary.md") + ".tmp"
    with open(tmp, "w") as f:
        f.write(summary_markdown(cfg, rows, exponents, grads, command))
    os.replace(tmp, paths["summary.md"])
    return paths
