"""The scaling study (background §4, seed 004): how the cost of one training
step grows with the number of tokens and with depth, and whether gradients
vanish in deep stacks, for every attention method of posattn.

``python experiments/scaling.py`` or ``python cmd/main.py -mode=scaling`` run
:func:`run_study` and write, into one folder:

- ``runtime.csv``: one row per (study, method, size): seconds per training step
  (forward + backward; median of repeats after warm-up, synchronised on CUDA),
  peak memory the step adds (MiB), the span's kept-key fraction, and a status
  (``ok`` or why the point was skipped);
- ``exponents.csv``: fitted growth exponents k (time ~ N^k, or ~ depth^k);
- ``gradients.csv``: mean |grad| of the token embedding, the first and last
  encoder layer and the positional parameters at initialisation, vs depth, with
  and without residual connections and LayerNorm, for fixed sinusoidal and
  learnable (per-position table) encodings;
- ``runtime_vs_tokens.png``, ``memory_vs_tokens.png``, ``runtime_vs_depth.png``,
  ``gradients_vs_depth.png`` and ``summary.md``.
"""
from __future__ import annotations

import csv
import dataclasses
import datetime
import math
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from .._grid import span_sigma_for_keep
from .._timing import freed_memory_returned_to_os, peak_extra_mib

__all__ = [
    "METHODS", "QUICK", "ScalingConfig", "run_study", "runtime_sweep", "gradient_study", "fit_exponent", "exponent_table",
    "write_outputs", "model_for",
]

# name -> (label, ModelConfig overrides). Every method shares the model of
# ScalingConfig (dim, heads, ffn_dim, depth); only attention and positions differ.
METHODS: dict[str, tuple[str, dict]] = {
    "reference": ("dense reference (PyTorch, N x N tensors)",
                  {"attention": "relpos", "backend": "reference", "pe": {"name": "siren"}}),
    "relpos": ("relpos_attention, dense", {"attention": "relpos", "backend": "fused", "pe": {"name": "siren"}}),
    "relpos_span10": ("relpos_attention, span threshold (~10% kept)",
                      {"attention": "relpos", "backend": "fused", "pe": {"name": "siren"}}),
    "relpos_span1": ("relpos_attention, span threshold (~1% kept)",
                     {"attention": "relpos", "backend": "fused", "pe": {"name": "siren"}}),
    "performer": ("Performer (FAVOR+), no positions", {"attention": "favor", "pe": {"name": "none"}}),
    "algebraic_sdpa": ("algebraic encoding (apply_maps) + SDPA", {"attention": "relpos", "pe": {"name": "algebraic_grid"}}),
    "sdpa": ("plain SDPA, no positions", {"attention": "sdpa", "pe": {"name": "none"}}),
}
SPAN_KEEP = {"relpos_span10": 0.10, "relpos_span1": 0.01}
QUADRATIC = ("reference", "relpos", "sdpa", "algebraic_sdpa")  # exact attention over all pairs

GRADIENT_ARCHS = {  # name -> (residual, norm)
    "residual+LN": (True, "post"),
    "residual, no LN": (True, "none"),
    "LN, no residual": (False, "post"),
    "no residual, no LN": (False, "none"),
}
GRADIENT_ENCODINGS = {"abs_sinusoidal": "fixed sinusoidal", "abs_learned": "learnable table"}

# Tiny sizes for a smoke run (seconds): ``experiments/scaling.py --quick``, the tests.
QUICK = dict(lengths=[64, 256, 1024], grid_sides=[4, 8, 16], depths=[1, 2, 4], depth_grid=[8, 8], token_depth=1,
             dim=16, heads=2, ffn_dim=32, gradient_depths=[1, 2, 4], gradient_tokens=16, gradient_batch=8,
             gradient_seeds=1)

RUNTIME_COLUMNS = ["study", "method", "grid", "tokens", "depth", "batch", "seconds", "peak_mib", "keep_fraction",
                   "status"]
EXPONENT_COLUMNS = ["study", "method", "points", "exponent_all", "exponent_large", "expected"]
GRADIENT_COLUMNS = ["encoding", "arch", "residual", "norm", "depth", "tokens", "seeds", "embedding_grad",
                    "first_layer_grad", "last_layer_grad", "positional_grad", "loss"]


@dataclass
class ScalingConfig:
    """What the study measures. Sizes are token counts (1-D) and square 2-D grid sides."""

    lengths: list = field(default_factory=lambda: [64, 128, 256, 512, 1024, 2048, 4096])
    grid_sides: list = field(default_factory=lambda: [8, 12, 16, 24, 32, 48, 64])
    depths: list = field(default_factory=lambda: [2, 4, 8, 16, 32, 64])
    depth_grid: list = field(default_factory=lambda: [16, 16])  # tokens of the depth sweep
    token_depth: int = 2      # layers of the token sweeps
    methods: list = field(default_factory=lambda: list(METHODS))
    dim: int = 64
    heads: int = 4
    ffn_dim: int = 128
    in_channels: int = 4
    batch: int = 1
    warmup: int = 1
    repeats: int = 3
    threshold: float = 0.1    # span threshold of the relpos_span* methods
    max_step_seconds: float = 30.0  # a method whose step took longer skips its larger sizes
    max_memory_gib: float = 8.0     # the reference's N x N tensors must fit in this (estimate)
    gradient_depths: list = field(default_factory=lambda: [2, 4, 8, 16, 32, 64])
    gradient_tokens: int = 64
    gradient_batch: int = 32
    gradient_seeds: int = 3
    studies: list = field(default_factory=lambda: ["length", "grid", "depth", "gradients"])
    device: str = "cpu"
    threads: int = 0
    out: str = "runs/scaling"

    @classmethod
    def from_dict(cls, values: dict) -> "ScalingConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"unknown scaling setting(s) {', '.join(unknown)}; valid: {', '.join(sorted(names))}")
        cfg = cls(**values)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        bad = [m for m in self.methods if m not in METHODS]
        if bad:
            raise ValueError(f"scaling.methods: unknown method(s) {bad}; valid: {', '.join(METHODS)}")
        bad = [s for s in self.studies if s not in ("length", "grid", "depth", "gradients")]
        if bad:
            raise ValueError(f"scaling.studies: unknown {bad}; valid: length, grid, depth, gradients")
        for name in ("lengths", "grid_sides", "depths", "gradient_depths", "depth_grid"):
            values = getattr(self, name)
            if not isinstance(values, (list, tuple)) or not values or any(int(v) < 1 for v in values):
                raise ValueError(f"scaling.{name} must be a non-empty list of integers >= 1, got {values!r}")
        for name in ("dim", "heads", "ffn_dim", "in_channels", "batch", "repeats", "token_depth",
                     "gradient_tokens", "gradient_batch", "gradient_seeds"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"scaling.{name} must be >= 1, got {getattr(self, name)}")
        if self.dim % self.heads or (self.dim // self.heads) % 4:
            raise ValueError(f"scaling.dim ({self.dim}) / heads ({self.heads}) must be a multiple of 4 "
                             "(the 2-D algebraic encoding needs two even blocks per head)")
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"scaling.threshold must be in (0, 1), got {self.threshold}")
        if self.warmup < 0 or self.max_step_seconds <= 0 or self.max_memory_gib <= 0:
            raise ValueError("scaling.warmup must be >= 0, max_step_seconds and max_memory_gib > 0")


# --- models ------------------------------------------------------------------


def span_sigma_cells(cfg: ScalingConfig, method: str, largest_grid: Sequence[int]) -> float:
    """Span sigma in cells whose box keeps SPAN_KEEP[method] of the keys on the
    largest grid of a sweep; the box then has the same size on every grid, so
    the cost per query stays constant as the grid grows."""
    sigma, _, _ = span_sigma_for_keep(largest_grid, SPAN_KEEP[method], cfg.threshold)
    return sigma * max(max(largest_grid) - 1, 1)


def model_for(cfg: ScalingConfig, method: str, grid: Sequence[int], depth: int, sigma_cells: Optional[float] = None,
              **overrides):
    """The study's TransformerClassifier for ``method`` on ``grid`` (input (B, *grid, C))."""
    from ..nn import TransformerClassifier

    spec = dict(METHODS[method][1])
    spec.update(grid=list(grid), in_channels=cfg.in_channels, num_classes=10, dim=cfg.dim, depth=depth,
                heads=cfg.heads, ffn_dim=cfg.ffn_dim, dropout=0.0, input_dropout=0.0, pooling="mean", head="linear")
    if method in SPAN_KEEP:
        spec["span"] = {"enabled": True, "threshold": cfg.threshold, "units": "cells", "init": sigma_cells}
    spec.update(overrides)
    return TransformerClassifier(**spec)


def keep_fraction(model, grid: Sequence[int]) -> float:
    """Mean fraction of keys a query attends to (1 without a span threshold)."""
    stats = model.span_stats(grid)
    return stats.get("layer0/keep_fraction", 1.0)


def reference_bytes(cfg: ScalingConfig, tokens: int, depth: int) -> float:
    """Rough peak of the dense reference: ~12 (B, H, N, N) float32 tensors per layer kept for backward."""
    return 12.0 * depth * cfg.batch * cfg.heads * tokens * tokens * 4


# --- timing ------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _step_fn(model, x, y):
    def step():
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        _sync(x.device)

    return step


def time_step(model, x, y, cfg: ScalingConfig) -> float:
    """Median seconds of one forward + backward step after warm-up."""
    step = _step_fn(model, x, y)
    for _ in range(cfg.warmup):
        step()
    times = []
    for _ in range(cfg.repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    model.zero_grad(set_to_none=True)
    return statistics.median(times)


def step_peak_mib(model, x, y) -> float:
    """Peak memory one forward + backward step adds (CUDA: allocator statistics;
    CPU: resident set, inside :func:`freed_memory_returned_to_os`)."""
    step = _step_fn(model, x, y)
    step()  # warm-up: one-time allocations are not the step's
    model.zero_grad(set_to_none=True)
    if x.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(x.device)
        base = torch.cuda.memory_allocated(x.device)
        step()
        peak = (torch.cuda.max_memory_allocated(x.device) - base) / 2**20
    else:
        peak = peak_extra_mib(step)
    model.zero_grad(set_to_none=True)
    return peak


def _points(cfg: ScalingConfig) -> list[tuple[str, list[int], int]]:
    """(study, grid, depth) of every runtime point, in the order they run."""
    points = []
    if "length" in cfg.studies:
        points += [("length", [int(n)], int(cfg.token_depth)) for n in sorted(cfg.lengths)]
    if "grid" in cfg.studies:
        points += [("grid", [int(s), int(s)], int(cfg.token_depth)) for s in sorted(cfg.grid_sides)]
    if "depth" in cfg.studies:
        points += [("depth", [int(n) for n in cfg.depth_grid], int(d)) for d in sorted(cfg.depths)]
    return points


def _setup(cfg: ScalingConfig, method: str, grid: list[int], depth: int, sigma: Optional[float]):
    device = torch.device(cfg.device)
    torch.manual_seed(0)
    model = model_for(cfg, method, grid, depth, sigma).to(device)
    x = torch.randn(cfg.batch, *grid, cfg.in_channels, device=device)
    y = torch.randint(0, 10, (cfg.batch,), device=device)
    return model, x, y


def runtime_sweep(cfg: ScalingConfig, progress: bool = True) -> list[dict]:
    """Times every (study, method, size) point, then measures the peak memory
    of each measured point in a second pass (CPU memory measurement changes
    how the allocator works, so it must not overlap the timings). Rows with the
    RUNTIME_COLUMNS."""
    from tqdm import tqdm

    device = torch.device(cfg.device)
    points = _points(cfg)
    largest = {}
    for study, grid, _ in points:
        if study not in largest or math.prod(grid) > math.prod(largest[study]):
            largest[study] = grid
    rows, over_budget = [], set()
    bar = tqdm(total=len(points) * len(cfg.methods), desc="scaling: time", disable=not progress, unit="point")
    for method in cfg.methods:
        for study, grid, depth in points:
            tokens = math.prod(grid)
            bar.set_postfix_str(f"{method} {study} {'x'.join(map(str, grid))} depth {depth}")
            sigma = span_sigma_cells(cfg, method, largest[study]) if method in SPAN_KEEP else None
            row = dict(study=study, method=method, grid="x".join(map(str, grid)), tokens=tokens, depth=depth,
                       batch=cfg.batch, seconds=float("nan"), peak_mib=float("nan"), keep_fraction=float("nan"),
                       sigma=sigma)
            if (method, study) in over_budget:
                row["status"] = f"skipped: a smaller size took over max_step_seconds={cfg.max_step_seconds}"
            elif method == "reference" and reference_bytes(cfg, tokens, depth) > cfg.max_memory_gib * 2**30:
                row["status"] = (f"skipped: the reference's N x N tensors need ~{reference_bytes(cfg, tokens, depth) / 2**30:.0f}"
                                 f" GiB > max_memory_gib={cfg.max_memory_gib}")
            else:
                model, x, y = _setup(cfg, method, grid, depth, sigma)
                try:
                    seconds = time_step(model, x, y, cfg)
                except torch.OutOfMemoryError:
                    row["status"] = "skipped: out of memory"
                    over_budget.add((method, study))
                else:
                    row.update(seconds=seconds, keep_fraction=keep_fraction(model, grid), status="ok")
                    if seconds > cfg.max_step_seconds:
                        over_budget.add((method, study))
                del model, x, y
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            rows.append(row)
            bar.update()
    bar.close()
    measured = [r for r in rows if r["status"] == "ok"]
    with freed_memory_returned_to_os():
        for r in tqdm(measured, desc="scaling: memory", disable=not progress, unit="point"):
            grid = [int(n) for n in r["grid"].split("x")]
            model, x, y = _setup(cfg, r["method"], grid, r["depth"], r["sigma"])
            r["peak_mib"] = step_peak_mib(model, x, y)
            del model, x, y
            if device.type == "cuda":
                torch.cuda.empty_cache()
    for r in rows:
        r.pop("sigma")
    return rows


# --- exponents ---------------------------------------------------------------


def fit_exponent(sizes: Sequence[float], seconds: Sequence[float]) -> float:
    """Least-squares slope k of log(seconds) against log(size) (time ~ size^k);
    NaN with fewer than two distinct sizes."""
    pts = [(math.log(s), math.log(t)) for s, t in zip(sizes, seconds) if s > 0 and t > 0 and math.isfinite(t)]
    if len({p[0] for p in pts}) < 2:
        return float("nan")
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx


def exponent_table(rows: list[dict]) -> list[dict]:
    """Per study and method: exponent over all measured sizes and over the
    larger half (at least three points), where fixed per-step costs matter least."""
    out = []
    studies = ("length", "grid", "depth")
    keys = sorted({(r["study"], r["method"]) for r in rows},
                  key=lambda k: (studies.index(k[0]), list(METHODS).index(k[1])))
    for study, method in keys:
        pts = sorted((r["depth"] if study == "depth" else r["tokens"], r["seconds"]) for r in rows
                     if r["study"] == study and r["method"] == method and r["status"] == "ok")
        if study == "depth":
            expected = "1"
        elif method in QUADRATIC:
            expected = "2"
        else:
            expected = "1"
        large = pts[-max(3, math.ceil(len(pts) / 2)):]
        out.append(dict(study=study, method=method, points=len(pts),
                        exponent_all=fit_exponent([p[0] for p in pts], [p[1] for p in pts]),
                        exponent_large=fit_exponent([p[0] for p in large], [p[1] for p in large]),
                        expected=expected))
    return out


# --- gradients ---------------------------------------------------------------


def _mean_abs_grad(params) -> float:
    grads = [p.grad.detach().abs().flatten() for p in params if p.grad is not None]
    if not grads:
        return float("nan")
    return torch.cat(grads).double().mean().item()


def gradient_point(cfg: ScalingConfig, encoding: str, residual: bool, norm: str, depth: int, seed: int) -> dict:
    """Mean |grad| at initialisation on a dummy task (seed 004's set-up): random
    token features, labels from a fixed rule of the sequence."""
    from ..nn import TransformerClassifier

    torch.manual_seed(seed)
    n, c = int(cfg.gradient_tokens), cfg.in_channels
    model = TransformerClassifier(grid=[n], in_channels=c, num_classes=c, dim=cfg.dim, depth=depth, heads=cfg.heads,
                                  ffn_dim=cfg.ffn_dim, dropout=0.0, input_dropout=0.0, attention="sdpa",
                                  pe={"name": encoding}, norm=norm, residual=residual, pooling="mean", head="linear")
    x = torch.randn(cfg.gradient_batch, n, c)
    y = x[:, : n // 2].mean(1).argmax(-1)  # which channel is largest over the first half: needs positions
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    positional = list(model.absolute.parameters()) if model.absolute is not None else []
    return dict(embedding_grad=_mean_abs_grad(model.input.parameters()),
                first_layer_grad=_mean_abs_grad(model.blocks[0].parameters()),
                last_layer_grad=_mean_abs_grad(model.blocks[-1].parameters()),
                positional_grad=_mean_abs_grad(positional), loss=loss.item())


def gradient_study(cfg: ScalingConfig, progress: bool = True) -> list[dict]:
    """Rows with the GRADIENT_COLUMNS: mean over ``gradient_seeds`` seeds."""
    from tqdm import tqdm

    combos = [(e, a, d) for e in GRADIENT_ENCODINGS for a in GRADIENT_ARCHS for d in sorted(cfg.gradient_depths)]
    rows = []
    for encoding, arch, depth in tqdm(combos, desc="scaling: gradients", disable=not progress, unit="model"):
        residual, norm = GRADIENT_ARCHS[arch]
        runs = [gradient_point(cfg, encoding, residual, norm, int(depth), seed) for seed in range(cfg.gradient_seeds)]
        row = dict(encoding=encoding, arch=arch, residual=residual, norm=norm, depth=int(depth),
                   tokens=cfg.gradient_tokens, seeds=cfg.gradient_seeds)
        for key in ("embedding_grad", "first_layer_grad", "last_layer_grad", "positional_grad", "loss"):
            row[key] = statistics.fmean(r[key] for r in runs)
        rows.append(row)
    return rows


# --- outputs -----------------------------------------------------------------


def _write_csv(path: str, columns: list[str], rows: list[dict]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in columns})
    os.replace(tmp, path)


def _style(method: str) -> dict:
    colors = {"reference": "tab:red", "relpos": "tab:blue", "relpos_span10": "tab:cyan", "relpos_span1": "tab:green",
              "performer": "tab:purple", "algebraic_sdpa": "tab:orange", "sdpa": "tab:gray"}
    return dict(color=colors.get(method), marker="o", markersize=4, label=method)


def _reference_slopes(ax, xs: list[float], ys: list[float]) -> None:
    """Dashed N and N^2 guides through the geometric middle of the data."""
    if len(xs) < 2 or not ys:
        return
    x0, x1 = min(xs), max(xs)
    ymid = math.exp(statistics.fmean(math.log(y) for y in ys))
    xmid = math.sqrt(x0 * x1)
    for k, style in ((1, ":"), (2, "--")):
        ax.plot([x0, x1], [ymid * (x0 / xmid) ** k, ymid * (x1 / xmid) ** k], style, color="black", lw=1,
                label=f"slope {k} (N^{k})" if k == 2 else "slope 1 (N)")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _log_axes(ax, xlabel: str, ylabel: str, legend_size: int = 7) -> None:
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=legend_size)


def _save(plt, fig, title: str, path: str) -> None:
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_tokens(rows: list[dict], value: str, ylabel: str, path: str, title: str) -> None:
    plt = _pyplot()
    studies = [s for s in ("length", "grid") if any(r["study"] == s for r in rows)]
    fig, axes = plt.subplots(1, max(len(studies), 1), figsize=(6.2 * max(len(studies), 1), 4.6), squeeze=False)
    for ax, study in zip(axes[0], studies):
        allx, ally = [], []
        for method in METHODS:
            pts = sorted((r["tokens"], r[value]) for r in rows
                         if r["study"] == study and r["method"] == method and r["status"] == "ok" and r[value] > 0)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], **_style(method))
                allx += [p[0] for p in pts]
                ally += [p[1] for p in pts]
        if value == "seconds":
            _reference_slopes(ax, allx, ally)
        _log_axes(ax, "tokens N (" + ("1-D sequence" if study == "length" else "2-D grid n x n") + ")", ylabel)
    _save(plt, fig, title, path)


def plot_depth(rows: list[dict], path: str, title: str) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12.4, 4.6))
    for ax, value, ylabel in ((axes[0], "seconds", "seconds per training step"), (axes[1], "peak_mib", "peak extra MiB")):
        for method in METHODS:
            pts = sorted((r["depth"], r[value]) for r in rows
                         if r["study"] == "depth" and r["method"] == method and r["status"] == "ok" and r[value] > 0)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], **_style(method))
        _log_axes(ax, "depth (layers)", ylabel)
    _save(plt, fig, title, path)


def plot_gradients(rows: list[dict], path: str, title: str) -> None:
    plt = _pyplot()
    colors = dict(zip(GRADIENT_ARCHS, ("tab:blue", "tab:green", "tab:orange", "tab:red")))
    lines = {"abs_sinusoidal": "-", "abs_learned": "--"}
    panels = (("first_layer_grad", "first encoder layer"), ("embedding_grad", "token embedding"),
              ("positional_grad", "learnable positional table"))
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    floor = 1e-45  # exact zeros (underflow) are drawn at the floor of the log axis
    for ax, (key, name) in zip(axes, panels):
        for encoding in GRADIENT_ENCODINGS:
            for arch in GRADIENT_ARCHS:
                pts = sorted((r["depth"], r[key]) for r in rows
                             if r["encoding"] == encoding and r["arch"] == arch and math.isfinite(r[key]))
                if pts:
                    ax.plot([p[0] for p in pts], [max(p[1], floor) for p in pts], lines[encoding], marker="o",
                            markersize=3, color=colors[arch], label=f"{arch}, {GRADIENT_ENCODINGS[encoding]}")
        _log_axes(ax, "depth (layers)", f"mean |grad|, {name}", legend_size=6)
    _save(plt, fig, title, path)


def _fmt(value: float, digits: int = 1) -> str:
    return "—" if not isinstance(value, (int, float)) or not math.isfinite(value) else f"{value:.{digits}f}"


def _method_table(methods: list[str], rows: list[dict], column: str, keys: list, value: str, digits: int) -> list[str]:
    """Markdown table: a row per method, a column per value of ``row[column]``
    ("skip" where the point was not measured)."""
    lines = ["| method | " + " | ".join(map(str, keys)) + " |", "|---" * (len(keys) + 1) + "|"]
    for m in methods:
        cells = []
        for key in keys:
            r = next((r for r in rows if r["method"] == m and r[column] == key), None)
            cells.append(_fmt(r[value], digits) if r and r["status"] == "ok" else "skip")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return lines


def machine_line(cfg: ScalingConfig) -> str:
    device = torch.device(cfg.device)
    if device.type == "cuda":
        what = torch.cuda.get_device_name(device)
    else:
        what = f"CPU {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    return f"{what}; torch {torch.__version__}; {datetime.date.today().isoformat()}"


def summary_markdown(cfg: ScalingConfig, rows: list[dict], exponents: list[dict], grads: list[dict],
                     command: str) -> str:
    lines = [f"# Scaling study ({machine_line(cfg)})", "", f"Command: `{command}`", "",
             f"Model: {cfg.token_depth} layers for the token sweeps, dim {cfg.dim}, {cfg.heads} heads, feed-forward "
             f"{cfg.ffn_dim}, batch {cfg.batch}, float32. One training step = forward + backward "
             f"(median of {cfg.repeats} after {cfg.warmup} warm-up); peak memory = what one step adds.", "",
             "Methods:"]
    for m in cfg.methods:
        lines.append(f"- `{m}`: {METHODS[m][0]}")
    spans = sorted({r['keep_fraction'] for r in rows if r['method'] in SPAN_KEEP and r['status'] == 'ok'})
    if spans:
        lines.append(f"\nThe span methods keep a box of fixed size in cells (threshold {cfg.threshold}), "
                     "chosen to keep ~10% / ~1% of the keys on the largest grid of each sweep; on smaller grids the same "
                     "box keeps a larger fraction (column keep_fraction of runtime.csv).")
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
        lines += ["", "## Fitted growth exponents (time ~ size^k)", "",
                  "k over all measured sizes, and over the larger half (at least 3 points), where fixed per-step "
                  "costs weigh least.", "", "| study | method | points | k (all) | k (larger half) | expected |",
                  "|---|---|---|---|---|---|"]
        for e in exponents:
            lines.append(f"| {e['study']} | {e['method']} | {e['points']} | {_fmt(e['exponent_all'], 2)} | "
                         f"{_fmt(e['exponent_large'], 2)} | {e['expected']} |")
    skipped = [r for r in rows if r["status"] != "ok"]
    if skipped:
        lines += ["", "Skipped points:", ""]
        lines += [f"- {r['method']} {r['study']} {r['grid']} depth {r['depth']}: {r['status']}" for r in skipped]
    if grads:
        depths = sorted({g["depth"] for g in grads})
        lines += ["", f"## Mean |grad| at initialisation vs depth ({grads[0]['tokens']} tokens, mean of "
                  f"{grads[0]['seeds']} seeds, SDPA attention)", ""]
        for key, name in (("first_layer_grad", "first encoder layer"), ("embedding_grad", "token embedding"),
                          ("positional_grad", "learnable positional table")):
            lines += [f"{name}:", "", "| encoding | arch | " + " | ".join(map(str, depths)) + " |",
                      "|---|---" + "|---" * len(depths) + "|"]
            for enc in GRADIENT_ENCODINGS:
                for arch in GRADIENT_ARCHS:
                    vals = {g["depth"]: g[key] for g in grads if g["encoding"] == enc and g["arch"] == arch}
                    if not any(math.isfinite(v) for v in vals.values()):
                        continue
                    cells = [f"{vals[d]:.2e}" if d in vals and math.isfinite(vals[d]) else "—" for d in depths]
                    lines.append(f"| {GRADIENT_ENCODINGS[enc]} | {arch} | " + " | ".join(cells) + " |")
            lines.append("")
    lines += ["Plots: `runtime_vs_tokens.png`, `memory_vs_tokens.png`, `runtime_vs_depth.png`, "
              "`gradients_vs_depth.png`. Data: `runtime.csv`, `exponents.csv`, `gradients.csv`."]
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
        _write_csv(p("runtime.csv"), RUNTIME_COLUMNS, rows)
        _write_csv(p("exponents.csv"), EXPONENT_COLUMNS, exponents)
        token_rows = [r for r in rows if r["study"] in ("length", "grid")]
        if token_rows:
            plot_tokens(token_rows, "seconds", "seconds per training step (fwd + bwd)", p("runtime_vs_tokens.png"),
                        f"one training step, {cfg.token_depth} layers, dim {cfg.dim}, batch {cfg.batch} ({machine})")
            plot_tokens(token_rows, "peak_mib", "peak extra memory of one step (MiB)", p("memory_vs_tokens.png"),
                        f"peak memory, {cfg.token_depth} layers, dim {cfg.dim}, batch {cfg.batch} ({machine})")
        if any(r["study"] == "depth" for r in rows):
            plot_depth(rows, p("runtime_vs_depth.png"), f"cost vs depth, grid {'x'.join(map(str, cfg.depth_grid))} "
                       f"({machine})")
    if grads:
        _write_csv(p("gradients.csv"), GRADIENT_COLUMNS, grads)
        plot_gradients(grads, p("gradients_vs_depth.png"),
                       f"mean |grad| at initialisation, {cfg.gradient_tokens} tokens, SDPA attention "
                       f"(solid: fixed sinusoidal, dashed: learnable table; exact zeros drawn at 1e-45)")
    tmp = p("summary.md") + ".tmp"
    with open(tmp, "w") as f:
        f.write(summary_markdown(cfg, rows, exponents, grads, command))
    os.replace(tmp, paths["summary.md"])
    return paths


def run_study(cfg: ScalingConfig, command: str = "python experiments/scaling.py", progress: bool = True,
              log: Callable[[str], None] = print) -> dict:
    """Runs the studies of ``cfg.studies``; writes and returns the output paths
    (plus ``rows``, ``exponents``, ``gradients``)."""
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    device = torch.device(cfg.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"scaling.device={cfg.device!r} but CUDA is not available")
    log(f"scaling study on {machine_line(cfg)}; output in {cfg.out}")
    rows = runtime_sweep(cfg, progress) if set(cfg.studies) & {"length", "grid", "depth"} else []
    grads = gradient_study(cfg, progress) if "gradients" in cfg.studies else []
    exponents = exponent_table(rows)
    paths = write_outputs(cfg, rows, exponents, grads, command)
    for e in exponents:
        log(f"  {e['study']:6s} {e['method']:15s} k = {_fmt(e['exponent_all'], 2)} (all {e['points']} sizes), "
            f"{_fmt(e['exponent_large'], 2)} (larger half); expected ~{e['expected']}")
    log("wrote " + ", ".join(sorted(os.path.basename(v) for v in paths.values())))
    return dict(paths, rows=rows, exponents=exponents, gradients=grads)
