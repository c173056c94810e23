"""Checks of an experiment config before anything runs: every value the CLI
reads has a rule (type and range) here, and every folder a mode writes must be
creatable and writable. Failures are ``ConfigError`` naming the key (exit 2).

The model's keys (``model.*``, ``pe.*``, ``span.*``, ``performer.*``) are
checked by :class:`posattn.nn.ModelConfig` when the model is built, the scaling
study's by :class:`.scaling.ScalingConfig`; the rules here are the rest, and
the model keys that the CLI reads itself.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Callable, Optional

import torch

from ..nn.performer import PERFORMER_VARIANTS
from .config import flatten
from .data import DATASETS
from .train import OPTIMIZERS, SCHEDULES
from .values import ConfigError
from .varres import RESOLUTIONS

__all__ = ["RULES", "check_values", "check_value", "check_output_folders", "is_safe_run_name", "safe_run_name"]

Rule = tuple[Callable[[Any], bool], str]  # (test, what a valid value is)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int(low: int, note: str = "") -> Rule:
    return (lambda v: _is_int(v) and v >= low), f"an int >= {low}{note}"


def _number(test: Callable[[float], bool], what: str) -> Rule:
    return (lambda v: _is_number(v) and test(v)), what


def _one_of(choices) -> Rule:
    return (lambda v: v in choices), "one of " + ", ".join(choices)


def _or_null(rule: Rule, note: str = "") -> Rule:
    return (lambda v: v is None or rule[0](v)), rule[1] + " or null" + note


def _is_device(v: Any) -> bool:
    if v == "auto":
        return True
    try:
        return isinstance(v, str) and torch.device(v).type in ("cpu", "cuda", "mps")
    except RuntimeError:
        return False


_TEXT: Rule = (lambda v: isinstance(v, str) and v.strip() != ""), "a non-empty string"

# A run name is one folder inside out_dir: no separators, not "." or "..", no
# control characters, so that nothing a run writes lands outside out_dir.
_UNSAFE_IN_NAME = re.compile(r"[/\\\x00-\x1f\x7f]")


def is_safe_run_name(name: str) -> bool:
    """Whether ``name`` is a single folder name (what ``out_dir/<name>`` needs)."""
    return isinstance(name, str) and name.strip() not in ("", ".", "..") and not _UNSAFE_IN_NAME.search(name)


def safe_run_name(name: str) -> str:
    """``name`` made a single folder name: separators and control characters
    become "_", and "." / ".." / "" become "_" (for names that come from values,
    e.g. a W&B run's name in a sweep agent)."""
    name = _UNSAFE_IN_NAME.sub("_", str(name))
    return "_" if name.strip() in ("", ".", "..") else name


_BOOL: Rule = (lambda v: isinstance(v, bool)), "true or false"

RULES: dict[str, Rule] = {
    "name": _or_null(
        (
            lambda v: v == "" or (isinstance(v, (str, int)) and not isinstance(v, bool) and is_safe_run_name(str(v))),
            "a folder name without '/', '\\\\', control characters, '.' or '..'",
        ),
        " (null: <dataset>-<positional_encoding>-<time>)",
    ),
    "seed": _or_null((_is_int, "an int")),
    "device": (_is_device, "auto, cpu, cuda, cuda:N or mps"),
    "out_dir": _TEXT,
    "no_wandb": _BOOL,
    "checkpoint": _TEXT,
    "num_threads": _or_null(_int(0), " (0, null: torch's default)"),
    "model.variant": _or_null(_one_of(PERFORMER_VARIANTS)),
    "model.in_channels": _or_null(_int(1), " (null: from the data)"),
    "model.num_classes": _or_null(_int(1), " (null: from the data)"),
    "data.name": _one_of(DATASETS),
    "data.root": _TEXT,
    "data.sequential": _BOOL,
    "data.small_dataset": _int(0, " (0: all images)"),
    "data.val_fraction": _number(lambda v: 0 < v < 1, "a number in (0, 1)"),
    "data.pad_to": _int(0, " (0: no padding)"),
    "data.resolution": _one_of(RESOLUTIONS),
    "data.min_side": _int(1),
    "data.max_side": _int(1),
    "data.token_budget": _int(0, " (0: about train.batch_size images per batch)"),
    "train.epochs": _int(1),
    "train.batch_size": _int(1),
    "train.accumulation_steps": _int(1),
    "train.eval_batch_size": _int(1),
    "train.optimizer": _one_of(OPTIMIZERS),
    "train.lr": _number(lambda v: v > 0, "a positive finite number"),
    "train.weight_decay": _number(lambda v: v >= 0, "a finite number >= 0"),
    "train.betas": (
        (lambda v: isinstance(v, (list, tuple)) and len(v) == 2 and all(_is_number(b) and 0 <= b < 1 for b in v)),
        "two numbers in [0, 1), e.g. [0.9, 0.999]",
    ),
    "train.schedule": _one_of(SCHEDULES),
    "train.warmup_steps": _int(0),
    "train.grad_clip": _number(lambda v: v >= 0, "a finite number >= 0 (0: off)"),
    "sweep.count": _int(0, " (0: all runs of a grid)"),
    "shift.min_shift": _int(0),
    "shift.step": _int(1),
    "shift.class_index": _int(0),
    "shift.exact_kernel": _BOOL,
    "scaling.quick": _BOOL,
    "scaling.out": _TEXT,
}


def check_value(key: str, value: Any) -> None:
    """ConfigError unless ``value`` is valid for dot ``key`` (keys without a rule pass)."""
    if key in RULES and not RULES[key][0](value):
        raise ConfigError(f"{key} must be {RULES[key][1]}, got {value!r}")


def check_values(cfg: dict) -> None:
    """ConfigError naming the first key of ``cfg`` whose value breaks its rule."""
    for key, value in flatten(cfg).items():
        check_value(key, value)


def _writable(folder: str, what: str) -> None:
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{what} {folder!r} cannot be created ({e.strerror or e})") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {folder!r} is not writable")


def check_output_folders(cfg: dict, resume: Optional[str] = None) -> None:
    """Creates the folder the mode writes into (``out_dir``, or ``scaling.out``)
    and checks that it, and the run folder where it already exists, are writable."""
    mode = cfg["mode"]
    if mode == "scaling":
        _writable(cfg["scaling"]["out"], "scaling.out")
    if mode not in ("train", "local_sweep", "sweep_agent"):
        return
    _writable(cfg["out_dir"], "out_dir")
    if not cfg["no_wandb"] and os.environ.get("WANDB_DIR"):
        _writable(os.environ["WANDB_DIR"], "WANDB_DIR (where W&B writes its files)")
    run_dir = resume or (
        os.path.join(cfg["out_dir"], str(cfg["name"])) if mode == "train" and cfg.get("name") else None
    )
    if run_dir and os.path.exists(run_dir):
        _writable(run_dir, "run folder")
