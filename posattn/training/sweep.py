"""Sweeps: W&B server sweeps and agents, and local sweeps driven by W&B's own
open-source sweep engine (the ``sweeps`` package: grid, random, bayes, and
hyperband early termination) for machines without a W&B server.

A sweep file is a W&B sweep configuration; its parameter names are config keys
(``span.enabled``, ``seed``) or keys of the thesis' vocabulary (``learning_rate``,
``apply_positional_mask``), so the thesis' own sweep files run unchanged. Its
metric is a logged metric (``val/best_acc``: its last value) or, the thesis' way,
a W&B summary aggregate of one (``val/acc.max``).
"""

from __future__ import annotations

import copy
import os
import statistics
from typing import Callable, Iterable, Optional

from . import runs
from .config import ConfigError, load_yaml, set_key, warn_ignored
from .optional import require
from .report import pyplot, save_figure, write_csv
from .train import apply_model_variant
from .validate import check_values, is_safe_run_name, safe_run_name

__all__ = ["load_sweep", "local_sweep", "create_sweep", "run_agent", "metric_value", "sweep_path", "METHODS"]

METHODS = ("grid", "random", "bayes")
# W&B summary aggregates a sweep metric may name: ``val/acc.max``
AGGREGATES = {"max": max, "min": min, "mean": statistics.fmean, "last": lambda v: v[-1], "first": lambda v: v[0]}


def sweep_path(name: Optional[str], sweep_dir: Optional[str] = None) -> str:
    """A sweep file path, or the name of one in ``sweep_dir`` (with or without .yml / .yaml)."""
    if not name:
        raise ConfigError("this mode needs --sweep_config=FILE (a file, or the name of one in experiments/sweeps/)")
    if os.path.exists(name):
        return name
    if sweep_dir:
        for candidate in (name, name + ".yml", name + ".yaml"):
            if os.path.exists(os.path.join(sweep_dir, candidate)):
                return os.path.join(sweep_dir, candidate)
    known = (
        sorted(os.path.splitext(f)[0] for f in os.listdir(sweep_dir) if f.endswith((".yml", ".yaml")))
        if sweep_dir and os.path.isdir(sweep_dir)
        else []
    )
    listing = f" (a path, or one of: {', '.join(known)})" if known else " (no such file)"
    raise ConfigError(f"sweep config {name!r} not found{listing}")


def load_sweep(path: Optional[str], defaults_flat: dict, sweep_dir: Optional[str] = None) -> dict:
    """Reads and checks a sweep file: method, metric, and parameters that name
    config keys (or thesis keys) with valid values."""
    path = sweep_path(path, sweep_dir)
    sweep = load_yaml(path)
    if sweep.get("method") not in METHODS:
        raise ConfigError(f"{path}: method must be one of {', '.join(METHODS)}, got {sweep.get('method')!r}")
    metric = sweep.get("metric") or {}
    if not metric.get("name") or metric.get("goal", "maximize") not in ("maximize", "minimize"):
        raise ConfigError(f"{path}: needs metric: {{name: <metric, e.g. val/best_acc>, goal: maximize|minimize}}")
    params = sweep.get("parameters")
    if not isinstance(params, dict) or not params:
        raise ConfigError(f"{path}: needs a non-empty parameters mapping")
    probe, ignored = {}, set()
    for key, spec in params.items():
        if not isinstance(spec, dict):
            raise ConfigError(f"{path}: parameter {key!r} must be a mapping (value:, values:, min:/max:, ...)")
        # the values a run may get: the listed ones, or a distribution's bounds
        if "values" in spec and not isinstance(spec["values"], list):
            raise ConfigError(f"{path}: parameter {key!r}: values must be a list, got {spec['values']!r}")
        probes = spec["values"] if "values" in spec else [spec[k] for k in ("value", "min", "max") if k in spec]
        for value in probes:
            try:
                set_key(probe, defaults_flat, key, value, ignored)
                check_values(probe)
            except ConfigError as e:
                raise ConfigError(f"{path}: {e}") from None
    warn_ignored(ignored)
    return sweep


def _apply(cfg: dict, defaults_flat: dict, params: dict, ignored: set, given: Iterable[str] = ()) -> dict:
    """cfg with a run's parameter values, then the recipe of its ``model.variant``
    (keeping the keys the command line ``given`` and the parameters set); thesis
    keys that configure nothing go to ``ignored``."""
    run_cfg = copy.deepcopy(cfg)
    given = set(given)
    for key, value in params.items():
        given.update(set_key(run_cfg, defaults_flat, key, value, ignored))
    check_values(run_cfg)
    try:
        apply_model_variant(run_cfg, given)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return run_cfg


def _logged(history: list, name: str) -> list:
    return [h[name] for h in history if isinstance(h.get(name), (int, float))]


def metric_value(history: list, name: str, summary: Optional[dict] = None) -> Optional[float]:
    """A sweep metric of a run: ``summary[name]``; for ``<metric>.<max|min|mean|last|first>``
    (a W&B summary aggregate, e.g. ``val/acc.max``) that aggregate over the logged
    values of ``<metric>``; else the last logged value of ``name``."""
    if summary and isinstance(summary.get(name), (int, float)):
        return float(summary[name])
    base, _, aggregate = name.rpartition(".")
    if aggregate in AGGREGATES and _logged(history, base):
        return float(AGGREGATES[aggregate](_logged(history, base)))
    values = _logged(history, name)
    return float(values[-1]) if values else None


def local_sweep(
    cfg: dict,
    path: Optional[str],
    defaults_flat: dict,
    sweep_dir: Optional[str] = None,
    train_fn: Callable = runs.train,
    given: Iterable[str] = (),
) -> list:
    """Runs a sweep on this machine, one configuration after another.

    Writes ``<out_dir>/<sweep name>/sweep_summary.csv`` (a row per run, written as
    runs finish) and ``sweep_metric.png`` (the metric per configuration).
    ``train_fn`` trains one configuration (:func:`runs.train`; tests pass a stand-in);
    ``given``: the keys the command line set (they keep their values under a model.variant).
    """
    sweeps = require("sweeps", "-mode=local_sweep (W&B's sweep engine)")
    sweep = load_sweep(path, defaults_flat, sweep_dir)
    method, metric = sweep["method"], sweep["metric"]["name"]
    count = int(cfg["sweep"]["count"])
    if method != "grid" and count <= 0:
        raise ConfigError(f"a {method} sweep never ends by itself: give -count=N")
    name = sweep.get("name") or os.path.splitext(os.path.basename(sweep_path(path, sweep_dir)))[0]
    if not is_safe_run_name(str(name)):
        raise ConfigError(
            f"sweep name {name!r} (the sweep file's name:) must be a folder name without '/', '\\', "
            "control characters, '.' or '..': its runs are written to <out_dir>/<sweep name>/"
        )
    out_dir = os.path.join(cfg["out_dir"], name)
    os.makedirs(out_dir, exist_ok=True)
    csv_path = os.path.join(out_dir, "sweep_summary.csv")
    engine_config = {k: v for k, v in sweep.items() if k in ("method", "metric", "parameters", "early_terminate")}
    engine_runs, rows = [], []
    print(
        f"local sweep {name!r}: method {method}, metric {metric} ({sweep['metric'].get('goal', 'maximize')}), "
        f"results in {out_dir}",
        flush=True,
    )
    while not count or len(engine_runs) < count:
        suggestion = sweeps.next_run(engine_config, engine_runs)
        if suggestion is None:
            break
        params = {k: v["value"] for k, v in suggestion.config.items()}
        run_name = f"{name}-{len(engine_runs):03d}"
        run_cfg = _apply(cfg, defaults_flat, params, set(), given)  # load_sweep reported the ignored keys
        run_cfg["name"] = run_name
        run_cfg["out_dir"] = out_dir
        current = sweeps.SweepRun(
            name=run_name,
            state=sweeps.RunState.running,
            config=suggestion.config,
            history=[],
            search_info=suggestion.search_info,
        )
        engine_runs.append(current)
        print(
            f"\n[{len(engine_runs)}{'/' + str(count) if count else ''}] {run_name}: "
            + ", ".join(f"{k}={v}" for k, v in params.items()),
            flush=True,
        )

        def on_epoch(epoch: int, metrics: dict, current=current) -> bool:
            row = dict(metrics)
            row[metric] = metric_value(current.history + [row], metric)  # e.g. val/acc.max so far, for hyperband
            current.history.append(row)
            if "early_terminate" not in engine_config:
                return False
            return any(r.name == current.name for r in sweeps.stop_runs(engine_config, engine_runs))

        summary = train_fn(run_cfg, epoch_callback=on_epoch)
        value = metric_value(summary.get("history", []), metric, summary)
        current.summary_metrics = {metric: value} if value is not None else {}
        current.state = sweeps.RunState.finished
        rows.append(
            {
                "run": run_name,
                **params,
                metric: value,
                "test/acc": summary.get("test/acc"),
                "epochs": summary.get("epochs"),
                "train_seconds": round(summary.get("train_seconds", 0.0), 1),
            }
        )
        write_csv(csv_path, rows)
    if not rows:
        raise ConfigError(f"{path}: the sweep engine proposed no configuration")
    plot_path = _plot(rows, metric, os.path.join(out_dir, "sweep_metric.png"), title=name)
    print(f"\nsweep {name!r}: {len(rows)} runs; summary {csv_path}; plot {plot_path}", flush=True)
    return rows


def _plot(rows: list, metric: str, path: str, title: str) -> str:
    keys = [k for k in rows[0] if k not in ("run", metric, "test/acc", "epochs", "train_seconds")]
    varying = [k for k in keys if len({str(r.get(k)) for r in rows}) > 1] or keys
    labels = [", ".join(f"{k}={r.get(k)}" for k in varying) for r in rows]
    values = [r[metric] if r[metric] is not None else float("nan") for r in rows]
    fig, ax = pyplot().subplots(figsize=(max(6, 0.5 * len(rows) + 3), 4.5))
    ax.bar(range(len(rows)), values, color="tab:blue")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(metric)
    ax.set_title(f"{title}: {metric} per configuration")
    finite = [v for v in values if v == v]
    if finite:
        lo, hi = min(finite), max(finite)
        ax.set_ylim(max(0.0, lo - 0.1 * (hi - lo + 1e-3) - 0.02), hi + 0.1 * (hi - lo + 1e-3) + 0.01)
    return save_figure(fig, path)


def create_sweep(path: Optional[str], defaults_flat: dict, sweep_dir: Optional[str] = None) -> str:
    """Creates a sweep on the W&B server (needs credentials and network); prints its id."""
    wandb = require("wandb", "-mode=sweep (a sweep on the W&B server)")
    sweep = load_sweep(path, defaults_flat, sweep_dir)
    sweep_id = wandb.sweep(
        sweep, project=os.environ.get("WANDB_PROJECT", "posattn"), entity=os.environ.get("WANDB_ENTITY")
    )
    print(f"created sweep {sweep_id}; run agents with: python cmd/main.py -mode=sweep_agent --sweep_id={sweep_id}")
    return sweep_id


def run_agent(
    cfg: dict, sweep_id: Optional[str], defaults_flat: dict, train_fn: Callable = runs.train, given: Iterable[str] = ()
) -> None:
    """A W&B agent in this process: each run's values arrive through wandb.config
    (config keys or thesis keys; anything else is an error)."""
    if not sweep_id:
        raise ConfigError("-mode=sweep_agent needs --sweep_id=ID (printed by -mode=sweep)")
    if cfg["no_wandb"]:
        raise ConfigError("-mode=sweep_agent needs W&B: drop -no_wandb=T")
    wandb = require("wandb", "-mode=sweep_agent (a W&B agent)")

    def one_run():
        run = wandb.init()
        # "posattn" holds the resolved config a resumed run logged; "_..." are W&B's own
        params = {k: v for k, v in dict(run.config).items() if k != "posattn" and not k.startswith("_")}
        ignored: set = set()
        run_cfg = _apply(cfg, defaults_flat, params, ignored, given)
        warn_ignored(ignored)
        # W&B names the run (a sweep may name it from values): keep it one folder inside out_dir
        run_cfg["name"] = safe_run_name(run.name or run.id)
        train_fn(run_cfg, tracker_run=run)
        run.finish()

    count = int(cfg["sweep"]["count"]) or None
    wandb.agent(
        sweep_id,
        function=one_run,
        count=count,
        project=os.environ.get("WANDB_PROJECT"),
        entity=os.environ.get("WANDB_ENTITY"),
    )
