"""Experiment configuration: YAML defaults, --config files and -Dkey=value overrides.

The defaults are a mapping the caller loads (``cmd/main.py`` passes its own
``cmd/config.yml``); this package never looks for files of the repository.
Every key must exist in the defaults, or be a key of the thesis' vocabulary
(:mod:`.thesis`), which is translated to posattn's keys. A value's type is the
default's (see :func:`.values.cast_value`). Errors are ``ConfigError`` naming the
key, the expected type and close matches.
"""

from __future__ import annotations

import copy
import difflib
import os
import sys
from typing import Any, Iterable, Optional

import yaml

from . import thesis
from .values import ConfigError, cast_value, parse_bool

__all__ = [
    "ConfigError",
    "load_yaml",
    "load_config",
    "parse_bool",
    "cast_value",
    "set_key",
    "flatten",
    "merge",
    "warn_ignored",
    "mode_view",
    "dump_config",
]


def load_yaml(path: str) -> dict:
    if not os.path.exists(path):
        raise ConfigError(f"config file {path!r} does not exist")
    with open(path) as f:
        try:
            data = yaml.safe_load(f)
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path!r} is not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path!r} must hold a mapping of keys, got {type(data).__name__}")
    return data


def flatten(cfg: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1} (empty dicts stay leaves)."""
    out = {}
    for key, value in cfg.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _unknown_key(key: str, known: Iterable[str]) -> ConfigError:
    known = list(known) + thesis.thesis_key_names()
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.5)
    if not close:
        close = [k for k in known if k.split(".")[-1] == key.split(".")[-1]][:3]
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return ConfigError(f"unknown config key {key!r}{hint}")


def _set_native(cfg: dict, defaults_flat: dict, key: str, raw: Any) -> None:
    if key not in defaults_flat:
        raise _unknown_key(key, defaults_flat)
    value = cast_value(key, raw, defaults_flat[key])
    node = cfg
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def set_key(cfg: dict, defaults_flat: dict, key: str, raw: Any, ignored: Optional[set] = None) -> list[str]:
    """Sets dot ``key`` of ``cfg`` to ``raw`` cast to the default's type. A thesis
    key sets the posattn keys it stands for; one that configures nothing is added
    to ``ignored`` (or, without a set, reported on stderr at once). Returns the
    posattn keys it set."""
    entry = thesis.lookup(key)
    if entry is None:
        _set_native(cfg, defaults_flat, key, raw)
        return [key]
    assignments = entry.translate(key, raw)
    if assignments is None:
        if ignored is None:
            warn_ignored([key])
        else:
            ignored.add(key)
        return []
    for target, value in assignments.items():
        try:
            _set_native(cfg, defaults_flat, target, value)
        except ConfigError as e:
            raise ConfigError(f"{key} (the thesis' name of {target}): {e}") from None
    return list(assignments)


def warn_ignored(keys: Iterable[str]) -> None:
    """One line naming the thesis keys that configure nothing in posattn."""
    keys = sorted(set(keys))
    if keys:
        print(
            f"warning: ignored thesis key(s) that configure nothing in posattn: {', '.join(keys)} "
            "(docs/reference/thesis_keys.md: what each thesis key becomes)",
            file=sys.stderr,
            flush=True,
        )


def merge(cfg: dict, update: dict, defaults_flat: dict, ignored: Optional[set] = None) -> list[str]:
    """Applies a (nested) mapping of values over ``cfg``, checking every key;
    returns the posattn keys it set."""
    keys: list[str] = []
    for key, value in flatten(update).items():
        keys += set_key(cfg, defaults_flat, key, value, ignored)
    return keys


def load_config(
    defaults: dict, config_file: Optional[str] = None, overrides: Iterable[str] = (), explicit: Optional[set] = None
) -> dict:
    """``defaults``, then ``config_file`` (if any), then ``-D`` overrides ``key=value``.
    Thesis keys that configure nothing are named once on stderr. ``explicit``, if
    given, receives the posattn dot keys the file and the overrides set (thesis
    keys translated)."""
    defaults_flat = flatten(defaults)
    cfg = copy.deepcopy(defaults)
    ignored: set = set()
    explicit = set() if explicit is None else explicit
    if config_file:
        update = load_yaml(config_file)
        explicit.update(merge(cfg, update, defaults_flat, ignored))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"-D{item}: expected -D<key>=<value>")
        key, raw = item.split("=", 1)
        explicit.update(set_key(cfg, defaults_flat, key.strip(), raw, ignored))
    warn_ignored(ignored)
    return cfg


# The sections each mode reads; the printed config of a run shows the top-level
# settings and these, not every block of the defaults.
_TRAIN = ("positional_encoding", "pe", "span", "model", "data", "train")
MODE_SECTIONS = {
    "train": _TRAIN,
    "local_sweep": _TRAIN + ("sweep",),
    "sweep_agent": _TRAIN + ("sweep",),
    "sweep": ("sweep",),
    "test": ("checkpoint",),
    "shift_test": ("checkpoint", "shift"),
    "scaling": ("scaling",),
}
_SECTION_SCALARS = ("positional_encoding", "checkpoint")  # top-level, but read by some modes only
_PERFORMER_ATTENTIONS = ("favor", "relative_favor", "clipped_relative")


def mode_view(cfg: dict, mode: Optional[str] = None) -> dict:
    """The part of ``cfg`` that ``mode`` (default: ``cfg["mode"]``) reads: the
    top-level settings and the mode's sections (``performer`` only where a
    FAVOR+ attention is configured)."""
    sections = set(MODE_SECTIONS[mode or cfg["mode"]])
    model = cfg.get("model") or {}
    if "model" in sections and (model.get("variant") or model.get("attention") in _PERFORMER_ATTENTIONS):
        sections.add("performer")
    return {k: v for k, v in cfg.items() if k in sections or not (isinstance(v, dict) or k in _SECTION_SCALARS)}


class _Dumper(yaml.SafeDumper):
    """Lists on one line ([64, 128, 256]); mappings as blocks."""


_Dumper.add_representer(
    list, lambda dumper, value: dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=True)
)


def dump_config(cfg: dict) -> str:
    """``cfg`` as YAML, in the order of the defaults, lists on one line."""
    return yaml.dump(cfg, Dumper=_Dumper, sort_keys=False)
