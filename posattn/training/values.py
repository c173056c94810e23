"""Typed config values: the error type of every bad setting, and how a value
given on the command line or in YAML becomes the type of its default.

A leaf module (no posattn imports), so both the config loader and the thesis
vocabulary (``thesis.py``) can use it.
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["ConfigError", "TRUE", "FALSE", "parse_bool", "parse_yaml", "cast_value"]

TRUE = {"true", "t", "1", "yes", "y"}
FALSE = {"false", "f", "0", "no", "n"}


class ConfigError(ValueError):
    """A bad configuration key or value (the CLI exits with status 2)."""


def parse_bool(text: Any, key: str = "value") -> bool:
    """true/false/t/f/1/0/yes/no (any case), or a bool."""
    if isinstance(text, bool):
        return text
    s = str(text).strip().lower()
    if s in TRUE:
        return True
    if s in FALSE:
        return False
    raise ConfigError(f"{key}: expected a bool (true/false/t/f/1/0/yes/no), got {text!r}")


def parse_yaml(raw: Any) -> Any:
    """A command-line string read as YAML (``"0.1"`` -> 0.1, ``"[1, 2]"`` -> [1, 2]);
    anything else, or a string that is not valid YAML, unchanged."""
    if not isinstance(raw, str) or not raw.strip():
        return raw
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def cast_value(key: str, raw: Any, default: Any) -> Any:
    """``raw`` (a string from the command line, or a YAML value) as the type of ``default``."""
    parsed = parse_yaml(raw)
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
