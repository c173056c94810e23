"""Packages only some modes need (W&B and its sweep engine), imported where used,
so that ``-no_wandb=T`` runs on a machine that has neither."""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType

from .values import ConfigError

__all__ = ["MissingDependency", "require"]


class MissingDependency(ConfigError):
    """A mode needs a package that is not installed (the CLI exits with status 2)."""


def require(module: str, purpose: str, alternative: str = "") -> ModuleType:
    """Imports ``module``, or raises MissingDependency saying what needs it and
    how to install it (``pip install .`` installs both W&B packages)."""
    try:
        with warnings.catch_warnings():  # their import-time warnings are about their own internals
            warnings.simplefilter("ignore")
            return importlib.import_module(module)
    except ImportError as e:
        hint = f", or {alternative}" if alternative else ""
        raise MissingDependency(
            f"{purpose} needs the Python package {module!r}, which cannot be imported ({e}): "
            f"install it with `python -m pip install {module}`{hint}"
        ) from None
