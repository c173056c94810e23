"""Experiment configuration: YAML defaults, --config files and -Dkey=value overrides.

Every key must exist in the defaults (``cmd/config.yml``); a value's type is the
default's: bools accept true/false/t/f/1/0/yes/no (any case), ints and floats
parse as numbers, lists and dicts as YAML, a null default takes any YAML value.
Errors are ``ConfigError`` naming the key, the expected type and close matches.
"""
from __future__ import annotations

import copy
import difflib
import os
from typing import Any, Iterable

import yaml

__all__ = ["ConfigError", "DEFAULT_CONFIG", "load_yaml", "load_config", "parse_bool", "cast_value", "set_key",
           "flatten", "merge"]

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                              "cmd", "config.yml")

TRUE = {"true", "t", "1", "yes", "y"}
FALSE = {"false", "f", "0", "no", "n"}


class ConfigError(ValueError):
    """A bad configuration key or value (the CLI exits with status 2)."""


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
    """{"a": {"b": 1}} -> {"a.b": 1} (dict leaves of null defaults stay whole)."""
    out = {}
    for key, value in cfg.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def parse_bool(text: Any, key: str = "value") -> bool:
    if isinstance(text, bool):
        return text
    s = str(text).strip().lower()
    if s in TRUE:
        return True
    if s in FALSE:
        return False
    raise ConfigError(f"{key}: expected a bool (true/false/t/f/1/0/yes/no), got {text!r}")


def _type_name(value: Any) -> str:
    return "null (any YAML value)" if value is None else type(value).__name__


def cast_value(key: str, raw: Any, default: Any) -> Any:
    """``raw`` (a string from the command line, or a YAML value) as the type of ``default``."""
    if isinstance(raw, str):
        try:
            parsed = yaml.safe_load(raw) if raw.strip() else raw
        except yaml.YAMLError:
            parsed = raw
    else:
        parsed = raw
    if default is None:
        return parsed
    if isinstance(default, bool):
        return parse_bool(raw if isinstance(raw, str) else parsed, key)
    if parsed is None:
        return None  # null is allowed for every key (e.g. -Dname=null)
    if isinstance(default, (int, float)) and isinstance(parsed, str):
        try:  # YAML 1.1 reads "1e3" as a string
            parsed = float(parsed)
        except ValueError:
            pass
    if isinstance(default, int):
        if isinstance(parsed, bool) or not isinstance(parsed, int):
            if isinstance(parsed, float) and parsed.is_integer():
                return int(parsed)
            raise ConfigError(f"{key}: expected an int, got {raw!r}")
        return parsed
    if isinstance(default, float):
        if isinstance(parsed, bool) or not isinstance(parsed, (int, float)):
            raise ConfigError(f"{key}: expected a float, got {raw!r}")
        return float(parsed)
    if isinstance(default, str):
        return raw if isinstance(raw, str) else str(parsed)
    if isinstance(default, list):
        if not isinstance(parsed, list):
            raise ConfigError(f"{key}: expected a list (YAML, e.g. [1, 2]), got {raw!r}")
        return parsed
    if isinstance(default, dict):
        if not isinstance(parsed, dict):
            raise ConfigError(f"{key}: expected a mapping (YAML, e.g. {{a: 1}}), got {raw!r}")
        return parsed
    return parsed


def _unknown_key(key: str, known: Iterable[str]) -> ConfigError:
    known = list(known)
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.5)
    if not close:
        close = [k for k in known if k.split(".")[-1] == key.split(".")[-1]][:3]
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return ConfigError(f"unknown config key {key!r}{hint}")


def set_key(cfg: dict, defaults_flat: dict, key: str, raw: Any) -> None:
    """Sets dot ``key`` of ``cfg`` to ``raw`` cast to the default's type."""
    if key not in defaults_flat:
        raise _unknown_key(key, defaults_flat)
    value = cast_value(key, raw, defaults_flat[key])
    node = cfg
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def merge(cfg: dict, update: dict, defaults_flat: dict) -> None:
    """Applies a (nested) mapping of values over ``cfg``, checking every key."""
    for key, value in flatten(update).items():
        set_key(cfg, defaults_flat, key, value)


def load_config(config_file: str | None = None, overrides: Iterable[str] = (), defaults_file: str = DEFAULT_CONFIG) -> dict:
    """Defaults, then ``config_file`` (if any), then ``-D`` overrides ``key=value``."""
    defaults = load_yaml(defaults_file)
    defaults_flat = flatten(defaults)
    cfg = copy.deepcopy(defaults)
    if config_file:
        merge(cfg, load_yaml(config_file), defaults_flat)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"-D{item}: expected -D<key>=<value>")
        key, raw = item.split("=", 1)
        set_key(cfg, defaults_flat, key.strip(), raw)
    return cfg
