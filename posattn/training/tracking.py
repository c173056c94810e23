"""Weights & Biases logging with an offline fallback, plus a local metrics file.

- ``no_wandb``: W&B is not imported or started; metrics still go to
  ``<run_dir>/metrics.jsonl`` and the terminal.
- Otherwise ``wandb.init`` with project/entity from ``WANDB_PROJECT`` /
  ``WANDB_ENTITY`` (default project "posattn"). ``WANDB_MODE`` is respected; with
  no credentials (no ``WANDB_API_KEY``, no login) the run is offline, said once,
  and can be uploaded later with ``wandb sync``.
- W&B's files go to ``<run_dir>/wandb/``, or to ``$WANDB_DIR/wandb/`` when
  ``WANDB_DIR`` is set (W&B's own setting for where its files go).
"""

from __future__ import annotations

import json
import math
import netrc
import os
from typing import Any, Optional

from .checkpoints import write_atomic
from .optional import require

__all__ = ["Tracker", "wandb_credentials", "SUMMARIES"]

# Run-summary aggregates kept besides the last value, so that a W&B sweep can
# name a best-of metric the thesis' way (``metric: {name: val/acc.max}``).
SUMMARIES = {"val/acc": "max,last", "val/loss": "min,last", "train/acc": "max,last", "train/loss": "min,last"}


def wandb_credentials() -> bool:
    """Whether a W&B API key is configured (environment or ~/.netrc)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        auth = netrc.netrc().authenticators(os.environ.get("WANDB_BASE_URL", "api.wandb.ai").split("//")[-1])
        return bool(auth and auth[2])
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class Tracker:
    """Logs metrics to W&B (online, offline or not at all) and to metrics.jsonl."""

    def __init__(self, run_dir: str, enabled: bool = True, is_main: bool = True):
        self.run_dir, self.is_main = run_dir, is_main
        self.enabled = enabled and is_main
        self.run = None
        self.mode = "disabled"
        self._metrics_path = os.path.join(run_dir, "metrics.jsonl")

    @property
    def wandb_dir(self) -> str:
        """The folder W&B writes into: ``$WANDB_DIR`` when set, else the run folder."""
        return os.environ.get("WANDB_DIR") or self.run_dir

    def start(self, config: dict, name: str, group: Optional[str] = None, reuse_run=None) -> None:
        """Starts a run (or adopts ``reuse_run``, the run a sweep agent opened)."""
        if not self.enabled:
            return
        wandb = require("wandb", "Weights & Biases logging", "pass -no_wandb=T to train without it")
        if reuse_run is not None:
            self.run = reuse_run
            self.mode = "online" if not getattr(reuse_run, "offline", False) else "offline"
            self.run.config.update({"posattn": config}, allow_val_change=True)
            self._define_summaries()
            return
        mode = os.environ.get("WANDB_MODE")
        if not mode:
            if wandb_credentials():
                mode = "online"
            else:
                mode = "offline"
                print(
                    "W&B: no credentials found (WANDB_API_KEY or `wandb login`): logging offline to "
                    f"{os.path.join(self.wandb_dir, 'wandb')}; upload later with `wandb sync <that folder>/offline-run-*`"
                )
        kwargs = dict(
            project=os.environ.get("WANDB_PROJECT", "posattn"),
            entity=os.environ.get("WANDB_ENTITY"),
            name=name,
            group=group,
            config=config,
            dir=self.wandb_dir,
            reinit="finish_previous",
        )
        try:
            self.run = wandb.init(mode=mode, settings=wandb.Settings(init_timeout=60), **kwargs)
        except Exception as e:  # credentials but no reachable server
            if mode != "online":
                raise
            print(
                f"W&B: could not reach the server ({type(e).__name__}: {e}); logging offline to "
                f"{os.path.join(self.wandb_dir, 'wandb')} instead (upload later with `wandb sync`)"
            )
            mode = "offline"
            self.run = wandb.init(mode=mode, **kwargs)
        self.mode = mode
        self._define_summaries()

    def _define_summaries(self) -> None:
        for name, summary in SUMMARIES.items():
            self.run.define_metric(name, summary=summary)

    def keep_epochs(self, last_epoch: int) -> None:
        """Keeps in metrics.jsonl only the lines of epochs 1..``last_epoch`` (the
        epochs a resumed run does not train again); the test line and a line torn
        by a kill go too. So each epoch's line is there exactly once."""
        if not self.is_main or not os.path.exists(self._metrics_path):
            return
        kept = []
        with open(self._metrics_path) as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if (
                    isinstance(row, dict)
                    and isinstance(row.get("epoch"), int)
                    and row["epoch"] <= last_epoch
                    and not any(k.startswith("test/") for k in row)
                ):
                    kept.append(line if line.endswith("\n") else line + "\n")
        write_atomic(self._metrics_path, "".join(kept).encode())

    def log(self, metrics: dict, step: Optional[int] = None) -> None:
        if not self.is_main:
            return
        with open(self._metrics_path, "a") as f:
            f.write(json.dumps({k: _jsonable(v) for k, v in metrics.items()}) + "\n")
        if self.run is not None:
            self.run.log(metrics, step=step)

    def summary(self, metrics: dict) -> None:
        if self.run is not None:
            for k, v in metrics.items():
                self.run.summary[k] = v

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None
