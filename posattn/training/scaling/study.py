"""What the scaling study measures: its settings (:class:`ScalingConfig`), the
models of each attention method, the timing and peak memory of one training
step, fitted growth exponents, and mean |grad| vs depth. The files it writes are
made by :mod:`.report`; :func:`posattn.training.scaling.run_study` runs both.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

import torch
import torch.nn.functional as F

from ...grid import span_sigma_for_keep
from ...utils.timing import freed_memory_returned_to_os, median_seconds, peak_extra_mib

__all__ = [
    "METHODS",
    "QUICK",
    "ScalingConfig",
    "scaling_defaults",
    "scaling_config",
    "scaling_section",
    "runtime_sweep",
    "gradient_study",
    "fit_exponent",
    "exponent_table",
    "model_for",
    "RUNTIME_COLUMNS",
    "EXPONENT_COLUMNS",
    "GRADIENT_COLUMNS",
]

# name -> (label, ModelConfig overrides). Every method shares the model of
# ScalingConfig (dim, heads, ffn_dim, depth); only attention and positions differ.
METHODS: dict[str, tuple[str, dict]] = {
    "reference": (
        "dense reference (PyTorch, N x N tensors)",
        {"attention": "relpos", "backend": "reference", "pe": {"name": "siren"}},
    ),
    "relpos": ("relpos_attention, dense", {"attention": "relpos", "backend": "fused", "pe": {"name": "siren"}}),
    "relpos_span10": (
        "relpos_attention, span threshold (~10% kept)",
        {"attention": "relpos", "backend": "fused", "pe": {"name": "siren"}},
    ),
    "relpos_span1": (
        "relpos_attention, span threshold (~1% kept)",
        {"attention": "relpos", "backend": "fused", "pe": {"name": "siren"}},
    ),
    "performer": ("Performer (FAVOR+), no positions", {"attention": "favor", "pe": {"name": "none"}}),
    "algebraic_sdpa": (
        "algebraic encoding (apply_maps) + SDPA",
        {"attention": "relpos", "pe": {"name": "algebraic_grid"}},
    ),
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
QUICK = dict(
    lengths=[64, 256, 1024],
    grid_sides=[4, 8, 16],
    depths=[1, 2, 4],
    depth_grid=[8, 8],
    token_depth=1,
    dim=16,
    heads=2,
    ffn_dim=32,
    gradient_depths=[1, 2, 4],
    gradient_tokens=16,
    gradient_batch=8,
    gradient_seeds=1,
)

RUNTIME_COLUMNS = [
    "study",
    "method",
    "grid",
    "tokens",
    "depth",
    "batch",
    "seconds",
    "peak_mib",
    "keep_fraction",
    "status",
]
EXPONENT_COLUMNS = ["study", "method", "points", "exponent_all", "exponent_large", "expected"]
GRADIENT_COLUMNS = [
    "encoding",
    "arch",
    "residual",
    "norm",
    "depth",
    "tokens",
    "seeds",
    "embedding_grad",
    "first_layer_grad",
    "last_layer_grad",
    "positional_grad",
    "loss",
]


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class ScalingConfig:
    """What the study measures. Sizes are token counts (1-D) and square 2-D grid sides."""

    lengths: list = field(default_factory=lambda: [64, 128, 256, 512, 1024, 2048, 4096])
    grid_sides: list = field(default_factory=lambda: [8, 12, 16, 24, 32, 48, 64])
    depths: list = field(default_factory=lambda: [2, 4, 8, 16, 32, 64])
    depth_grid: list = field(default_factory=lambda: [16, 16])  # tokens of the depth sweep
    token_depth: int = 2  # layers of the token sweeps
    methods: list = field(default_factory=lambda: list(METHODS))
    dim: int = 64
    heads: int = 4
    ffn_dim: int = 128
    in_channels: int = 4
    batch: int = 1
    warmup: int = 1
    repeats: int = 3
    threshold: float = 0.1  # span threshold of the relpos_span* methods
    max_step_seconds: float = 30.0  # a method whose step took longer skips its larger sizes
    max_memory_gib: float = 8.0  # the reference's N x N tensors must fit in this (estimate)
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
        bad = [m for m in self.methods if not isinstance(m, str) or m not in METHODS]
        if bad:
            raise ValueError(f"scaling.methods: unknown method(s) {bad}; valid: {', '.join(METHODS)}")
        bad = [s for s in self.studies if not isinstance(s, str) or s not in ("length", "grid", "depth", "gradients")]
        if bad:
            raise ValueError(f"scaling.studies: unknown {bad}; valid: length, grid, depth, gradients")
        for name in ("lengths", "grid_sides", "depths", "gradient_depths", "depth_grid"):
            values = getattr(self, name)
            if not isinstance(values, (list, tuple)) or not values or not all(_is_int(v) and v >= 1 for v in values):
                raise ValueError(f"scaling.{name} must be a non-empty list of integers >= 1, got {values!r}")
        for name in (
            "dim",
            "heads",
            "ffn_dim",
            "in_channels",
            "batch",
            "repeats",
            "token_depth",
            "gradient_tokens",
            "gradient_batch",
            "gradient_seeds",
        ):
            if not _is_int(getattr(self, name)) or getattr(self, name) < 1:
                raise ValueError(f"scaling.{name} must be an int >= 1, got {getattr(self, name)!r}")
        if self.dim % self.heads or (self.dim // self.heads) % 4:
            raise ValueError(
                f"scaling.dim ({self.dim}) / heads ({self.heads}) must be a multiple of 4 "
                "(the 2-D algebraic encoding needs two even blocks per head)"
            )
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"scaling.threshold must be in (0, 1), got {self.threshold}")
        if self.warmup < 0 or self.max_step_seconds <= 0 or self.max_memory_gib <= 0:
            raise ValueError("scaling.warmup must be >= 0, max_step_seconds and max_memory_gib > 0")


# Fields that cmd/main.py takes from its top-level settings, not from `scaling:`.
_FROM_TOP_LEVEL = {"device": "device", "threads": "num_threads"}


def scaling_section(cfg: ScalingConfig) -> dict:
    """``cfg`` as the CLI's ``scaling:`` block: every field but those set from the
    top level (``device``, ``num_threads``)."""
    return {k: v for k, v in dataclasses.asdict(cfg).items() if k not in _FROM_TOP_LEVEL}


def scaling_defaults() -> dict:
    """The defaults of the CLI's ``scaling:`` block, plus ``quick`` (tiny sizes).
    The one statement of the study's defaults is ScalingConfig."""
    return dict(scaling_section(ScalingConfig()), quick=False)


def scaling_config(section: dict, top_level: dict, explicit: Iterable[str] = ()) -> ScalingConfig:
    """The ScalingConfig of the CLI's ``scaling:`` block and top-level settings.
    ``quick`` sets the sizes of QUICK, but not the fields named in ``explicit``
    (those the user gave: an explicit value wins over the preset)."""
    values, explicit = dict(section), set(explicit)
    if values.pop("quick", False):
        values.update({k: v for k, v in QUICK.items() if k not in explicit})
    values.update({field: top_level[key] for field, key in _FROM_TOP_LEVEL.items()})
    return ScalingConfig.from_dict(values)


# --- models ------------------------------------------------------------------


def span_sigma_cells(cfg: ScalingConfig, method: str, largest_grid: Sequence[int]) -> float:
    """Span sigma in cells whose box keeps SPAN_KEEP[method] of the keys on the
    largest grid of a sweep; the box then has the same size on every grid, so
    the cost per query stays constant as the grid grows."""
    sigma, _, _ = span_sigma_for_keep(largest_grid, SPAN_KEEP[method], cfg.threshold)
    return sigma * max(max(largest_grid) - 1, 1)


def model_for(
    cfg: ScalingConfig, method: str, grid: Sequence[int], depth: int, sigma_cells: Optional[float] = None, **overrides
):
    """The study's TransformerClassifier for ``method`` on ``grid`` (input (B, *grid, C))."""
    from ...nn import TransformerClassifier

    spec = dict(METHODS[method][1])
    spec.update(_model_spec(cfg, grid, depth, num_classes=10))
    if method in SPAN_KEEP:
        spec["span"] = {"enabled": True, "threshold": cfg.threshold, "units": "cells", "init": sigma_cells}
    spec.update(overrides)
    return TransformerClassifier(**spec)


def _model_spec(cfg: ScalingConfig, grid: Sequence[int], depth: int, num_classes: int) -> dict:
    """The TransformerClassifier arguments every model of the study shares: the config's
    sizes, no dropout, mean pooling, a linear head."""
    return dict(
        grid=list(grid),
        in_channels=cfg.in_channels,
        num_classes=num_classes,
        dim=cfg.dim,
        depth=depth,
        heads=cfg.heads,
        ffn_dim=cfg.ffn_dim,
        dropout=0.0,
        input_dropout=0.0,
        pooling="mean",
        head="linear",
    )


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
    seconds = median_seconds(_step_fn(model, x, y), warmup=cfg.warmup, repeats=cfg.repeats)
    model.zero_grad(set_to_none=True)
    return seconds


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
            row = dict(
                study=study,
                method=method,
                grid="x".join(map(str, grid)),
                tokens=tokens,
                depth=depth,
                batch=cfg.batch,
                seconds=float("nan"),
                peak_mib=float("nan"),
                keep_fraction=float("nan"),
                sigma=sigma,
            )
            if (method, study) in over_budget:
                row["status"] = f"skipped: a smaller size took over max_step_seconds={cfg.max_step_seconds}"
            elif method == "reference" and reference_bytes(cfg, tokens, depth) > cfg.max_memory_gib * 2**30:
                row["status"] = (
                    f"skipped: the reference's N x N tensors need ~{reference_bytes(cfg, tokens, depth) / 2**30:.0f}"
                    f" GiB > max_memory_gib={cfg.max_memory_gib}"
                )
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
    keys = sorted(
        {(r["study"], r["method"]) for r in rows}, key=lambda k: (studies.index(k[0]), list(METHODS).index(k[1]))
    )
    for study, method in keys:
        pts = sorted(
            (r["depth"] if study == "depth" else r["tokens"], r["seconds"])
            for r in rows
            if r["study"] == study and r["method"] == method and r["status"] == "ok"
        )
        if study == "depth":
            expected = "1"
        elif method in QUADRATIC:
            expected = "2"
        else:
            expected = "1"
        large = pts[-max(3, math.ceil(len(pts) / 2)) :]
        out.append(
            dict(
                study=study,
                method=method,
                points=len(pts),
                exponent_all=fit_exponent([p[0] for p in pts], [p[1] for p in pts]),
                exponent_large=fit_exponent([p[0] for p in large], [p[1] for p in large]),
                expected=expected,
            )
        )
    return out


# --- gradients ---------------------------------------------------------------


def _mean_abs_grad(params) -> float:
    grads = [p.grad.detach().abs().flatten() for p in params if p.grad is not None]
    if not grads:
        return float("nan")
    return torch.cat(grads).double().mean().item()


def gradient_point(cfg: ScalingConfig, encoding: str, residual: bool, norm: str, depth: int, seed: int) -> dict:
    """Mean |grad| at initialisation on a dummy task (the stacked-attention study's set-up): random
    token features, labels from a fixed rule of the sequence."""
    from ...nn import TransformerClassifier

    torch.manual_seed(seed)
    n, c = int(cfg.gradient_tokens), cfg.in_channels
    spec = _model_spec(cfg, [n], depth, num_classes=c)
    model = TransformerClassifier(**spec, attention="sdpa", pe={"name": encoding}, norm=norm, residual=residual)
    x = torch.randn(cfg.gradient_batch, n, c)
    y = x[:, : n // 2].mean(1).argmax(-1)  # which channel is largest over the first half: needs positions
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    positional = list(model.absolute.parameters()) if model.absolute is not None else []
    return dict(
        embedding_grad=_mean_abs_grad(model.input.parameters()),
        first_layer_grad=_mean_abs_grad(model.blocks[0].parameters()),
        last_layer_grad=_mean_abs_grad(model.blocks[-1].parameters()),
        positional_grad=_mean_abs_grad(positional),
        loss=loss.item(),
    )


def gradient_study(cfg: ScalingConfig, progress: bool = True) -> list[dict]:
    """Rows with the GRADIENT_COLUMNS: mean over ``gradient_seeds`` seeds."""
    from tqdm import tqdm

    combos = [(e, a, d) for e in GRADIENT_ENCODINGS for a in GRADIENT_ARCHS for d in sorted(cfg.gradient_depths)]
    rows = []
    for encoding, arch, depth in tqdm(combos, desc="scaling: gradients", disable=not progress, unit="model"):
        residual, norm = GRADIENT_ARCHS[arch]
        runs = [gradient_point(cfg, encoding, residual, norm, int(depth), seed) for seed in range(cfg.gradient_seeds)]
        row = dict(
            encoding=encoding,
            arch=arch,
            residual=residual,
            norm=norm,
            depth=int(depth),
            tokens=cfg.gradient_tokens,
            seeds=cfg.gradient_seeds,
        )
        for key in ("embedding_grad", "first_layer_grad", "last_layer_grad", "positional_grad", "loss"):
            row[key] = statistics.fmean(r[key] for r in runs)
        rows.append(row)
    return rows
