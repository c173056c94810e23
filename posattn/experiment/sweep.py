"""Sweeps: W&B server sweeps and agents, and local sweeps driven by W&B's own
open-source sweep engine (the ``sweeps`` package: grid, random, bayes, and
hyperband early termination) for machines without a W&B server.

A sweep file is a W&B sweep configuration (experiments/sweeps/*.yml); its
parameter names are dot keys of cmd/config.yml (``span.enabled``, ``seed``).
"""
from __future__ import annotations

import copy
import csv
import os
from typing import Callable, Optional

from .config import ConfigError, flatten, load_yaml, set_key

__all__ = ["load_sweep", "local_sweep", "create_sweep", "run_agent", "METHODS"]

METHODS = ("grid", "random", "bayes")


SWEEP_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         "experiments", "sweeps")


def sweep_path(name: Optional[str]) -> str:
    """A sweep file path, or the name of one in experiments/sweeps/ (with or without .yml)."""
    if not name:
        raise ConfigError("this mode needs --sweep_config=FILE (a file, or a name in experiments/sweeps/)")
    if os.path.exists(name):
        return name
    for candidate in (os.path.join(SWEEP_DIR, name), os.path.join(SWEEP_DIR, name + ".yml")):
        if os.path.exists(candidate):
            return candidate
    known = sorted(f[:-4] for f in os.listdir(SWEEP_DIR) if f.endswith(".yml")) if os.path.isdir(SWEEP_DIR) else []
    raise ConfigError(f"sweep config {name!r} not found (a path, or one of: {', '.join(known)})")


def load_sweep(path: Optional[str], defaults_flat: Optional[dict] = None) -> dict:
    """Reads and checks a sweep file: method, metric, parameters naming config keys."""
    path = sweep_path(path)
    sweep = load_yaml(path)
    if sweep.get("method") not in METHODS:
        raise ConfigError(f"{path}: method must be one of {', '.join(METHODS)}, got {sweep.get('method')!r}")
    metric = sweep.get("metric") or {}
    if not metric.get("name") or metric.get("goal", "maximize") not in ("maximize", "minimize"):
        raise ConfigError(f"{path}: needs metric: {{name: <metric, e.g. val/best_acc>, goal: maximize|minimize}}")
    params = sweep.get("parameters")
    if not isinstance(params, dict) or not params:
        raise ConfigError(f"{path}: needs a non-empty parameters mapping")
    if defaults_flat is not None:
        probe = {}
        for key, spec in params.items():
            if not isinstance(spec, dict):
                raise ConfigError(f"{path}: parameter {key!r} must be a mapping (value:, values:, min:/max:, ...)")
            set_key(probe, defaults_flat, key, spec.get("value", (spec.get("values") or [None])[0]))
    return sweep


def _apply(cfg: dict, defaults_flat: dict, params: dict) -> dict:
    run_cfg = copy.deepcopy(cfg)
    for key, value in params.items():
        set_key(run_cfg, defaults_flat, key, value)
    return run_cfg


def _metric(summary: dict, history: list, name: str) -> Optional[float]:
    if name in summary and isinstance(summary[name], (int, float)):
        return float(summary[name])
    values = [h[name] for h in history if isinstance(h.get(name), (int, float))]
    return values[-1] if values else None


def local_sweep(cfg: dict, path: Optional[str], train_fn: Callable, defaults_flat: Optional[dict] = None) -> list:
    """Runs a sweep on this machine, one configuration after another.

    Writes ``<out_dir>/<sweep name>/sweep_summary.csv`` (a row per run, written as
    runs finish) and ``sweep_metric.png`` (the metric per configuration).
    """
    import sweeps

    defaults_flat = defaults_flat or flatten(cfg)
    sweep = load_sweep(path, defaults_flat)
    method, metric = sweep["method"], sweep["metric"]["name"]
    count = int(cfg["sweep"]["count"])
    if method != "grid" and count <= 0:
        raise ConfigError(f"a {method} sweep never ends by itself: give -count=N")
    name = sweep.get("name") or os.path.splitext(os.path.basename(sweep_path(path)))[0]
    sweep_dir = os.path.join(cfg["out_dir"], name)
    os.makedirs(sweep_dir, exist_ok=True)
    csv_path = os.path.join(sweep_dir, "sweep_summary.csv")
    engine_config = {k: v for k, v in sweep.items() if k in ("method", "metric", "parameters", "early_terminate")}
    runs, rows = [], []
    print(f"local sweep {name!r}: method {method}, metric {metric} ({sweep['metric'].get('goal', 'maximize')}), "
          f"results in {sweep_dir}", flush=True)
    while not count or len(runs) < count:
        suggestion = sweeps.next_run(engine_config, runs)
        if suggestion is None:
            break
        params = {k: v["value"] for k, v in suggestion.config.items()}
        run_name = f"{name}-{len(runs):03d}"
        run_cfg = _apply(cfg, defaults_flat, params)
        run_cfg["name"] = run_name
        run_cfg["out_dir"] = sweep_dir
        current = sweeps.SweepRun(name=run_name, state=sweeps.RunState.running, config=suggestion.config,
                                  history=[], search_info=suggestion.search_info)
        runs.append(current)
        print(f"\n[{len(runs)}{'/' + str(count) if count else ''}] {run_name}: "
              + ", ".join(f"{k}={v}" for k, v in params.items()), flush=True)

        def on_epoch(epoch: int, metrics: dict, current=current) -> bool:
            current.history.append(dict(metrics))
            if "early_terminate" not in engine_config:
                return False
            return any(r.name == current.name for r in sweeps.stop_runs(engine_config, runs))

        summary = train_fn(run_cfg, epoch_callback=on_epoch)
        value = _metric(summary, summary.get("history", []), metric)
        current.summary_metrics = {metric: value} if value is not None else {}
        current.state = sweeps.RunState.finished
        row = {"run": run_name, **params, metric: value, "test/acc": summary.get("test/acc"),
               "epochs": summary.get("epochs"), "train_seconds": round(summary.get("train_seconds", 0.0), 1)}
        rows.append(row)
        _write_csv(csv_path, rows)
    if not rows:
        raise ConfigError(f"{path}: the sweep engine proposed no configuration")
    plot_path = _plot(rows, metric, os.path.join(sweep_dir, "sweep_metric.png"), title=name)
    print(f"\nsweep {name!r}: {len(rows)} runs; summary {csv_path}; plot {plot_path}", flush=True)
    return rows


def _write_csv(path: str, rows: list) -> None:
    fields = []
    for r in rows:
        fields += [k for k in r if k not in fields]
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


def _plot(rows: list, metric: str, path: str, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in rows[0] if k not in ("run", metric, "test/acc", "epochs", "train_seconds")]
    varying = [k for k in keys if len({str(r.get(k)) for r in rows}) > 1] or keys
    labels = [", ".join(f"{k}={r.get(k)}" for k in varying) for r in rows]
    values = [r[metric] if r[metric] is not None else float("nan") for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(rows) + 3), 4.5))
    ax.bar(range(len(rows)), values, color="tab:blue")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(metric)
    ax.set_title(f"{title}: {metric} per configuration")
    finite = [v for v in values if v == v]
    if finite:
        lo, hi = min(finite), max(finite)
        ax.set_ylim(max(0.0, lo - 0.1 * (hi - lo + 1e-3) - 0.02), hi + 0.1 * (hi - lo + 1e-3) + 0.01)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def create_sweep(path: Optional[str]) -> str:
    """Creates a sweep on the W&B server (needs credentials and network); prints its id."""
    import wandb

    sweep = load_sweep(path)
    sweep_id = wandb.sweep(sweep, project=os.environ.get("WANDB_PROJECT", "posattn"),
                           entity=os.environ.get("WANDB_ENTITY"))
    print(f"created sweep {sweep_id}; run agents with: python cmd/main.py -mode=sweep_agent --sweep_id={sweep_id}")
    return sweep_id


def run_agent(cfg: dict, sweep_id: Optional[str], train_fn: Callable, defaults_flat: Optional[dict] = None) -> None:
    """A W&B agent in this process: each run's values arrive through wandb.config."""
    import wandb

    if not sweep_id:
        raise ConfigError("-mode=sweep_agent needs --sweep_id=ID (printed by -mode=sweep)")
    if cfg["no_wandb"]:
        raise ConfigError("-mode=sweep_agent needs W&B: drop -no_wandb=T")
    defaults_flat = defaults_flat or flatten(cfg)

    def one_run():
        run = wandb.init()
        params = {k: v for k, v in dict(run.config).items() if k in defaults_flat}
        run_cfg = _apply(cfg, defaults_flat, params)
        run_cfg["name"] = run.name or run.id
        train_fn(run_cfg, tracker_run=run)
        run.finish()

    count = int(cfg["sweep"]["count"]) or None
    wandb.agent(sweep_id, function=one_run, count=count, project=os.environ.get("WANDB_PROJECT"),
                entity=os.environ.get("WANDB_ENTITY"))
