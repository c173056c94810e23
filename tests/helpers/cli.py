"""The experiment CLI as cmd/main.py runs it: with the repository's defaults
file and sweep folder (the package itself never looks for them)."""

import os

from helpers import ROOT
from posattn.training import cli
from posattn.training.config import flatten
from posattn.training.config import load_config as _load_config

DEFAULTS_FILE = os.path.join(ROOT, "cmd", "config.yml")
SWEEP_DIR = os.path.join(ROOT, "experiments", "sweeps")
MAIN = os.path.join(ROOT, "cmd", "main.py")


def main(argv) -> int:
    return cli.main(list(argv), defaults_file=DEFAULTS_FILE, sweep_dir=SWEEP_DIR)


def defaults() -> dict:
    return cli.load_defaults(DEFAULTS_FILE)


def defaults_flat() -> dict:
    return flatten(defaults())


def load_config(overrides=(), config_file=None) -> dict:
    """The resolved config of ``-D`` overrides (without the leading ``-D``)."""
    return _load_config(defaults(), config_file, list(overrides))
