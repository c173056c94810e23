"""Experiment config parsing: types, overrides, files, errors."""

import pytest
from helpers.cli import SWEEP_DIR, defaults_flat, load_config

from posattn.training.config import ConfigError, cast_value, flatten, parse_bool


@pytest.mark.parametrize("text", ["true", "True", "T", "t", "1", "yes", "YES", "y"])
def test_bool_true(text):
    assert parse_bool(text) is True


@pytest.mark.parametrize("text", ["false", "FALSE", "F", "f", "0", "no", "No", "n"])
def test_bool_false(text):
    assert parse_bool(text) is False


def test_bool_rejects_other_text():
    with pytest.raises(ConfigError, match="span.enabled: expected a bool"):
        cast_value("span.enabled", "maybe", False)


@pytest.mark.parametrize(
    "raw, default, expected",
    [
        ("32", 64, 32),
        ("1e3", 5, 1000),
        ("0.5", 0.1, 0.5),
        ("2", 0.1, 2.0),
        ("pre", "post", "pre"),
        ("[0.9, 0.98]", [0.9, 0.999], [0.9, 0.98]),
        ("{a: 1}", {"b": 2}, {"a": 1}),
        ("null", 3, None),
        ("12", None, 12),
        ("abc", None, "abc"),
        ("001", "x", "001"),
    ],
)
def test_cast_from_the_default_type(raw, default, expected):
    value = cast_value("key", raw, default)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(
    "raw, default, match",
    [
        ("3.5", 64, "expected an int"),
        ("abc", 0.1, "expected a float"),
        ("true", 1, "expected an int"),
        ("1", [1], "expected a list"),
        ("[1]", {"a": 1}, "expected a mapping"),
    ],
)
def test_cast_errors_name_key_and_type(raw, default, match):
    with pytest.raises(ConfigError, match=match):
        cast_value("key", raw, default)


def test_defaults_load_and_overrides_apply():
    cfg = load_config(
        [
            "pe.hidden_dim=32",
            "span.enabled=T",
            "train.betas=[0.9, 0.98]",
            "model.depth=2",
            "name=run-a",
            "performer.num_features=64",
        ]
    )
    assert cfg["pe"]["hidden_dim"] == 32 and cfg["span"]["enabled"] is True
    assert cfg["train"]["betas"] == [0.9, 0.98] and cfg["model"]["depth"] == 2 and cfg["name"] == "run-a"
    assert cfg["performer"]["num_features"] == 64
    defaults = load_config()
    assert defaults["pe"]["hidden_dim"] == 64  # untouched defaults


def test_unknown_key_names_close_matches():
    with pytest.raises(ConfigError, match=r"unknown config key 'pe.hiden_dim'; did you mean pe.hidden_dim"):
        load_config(["pe.hiden_dim=3"])
    with pytest.raises(ConfigError, match=r"unknown config key 'epochs'; did you mean .*train.epochs"):
        load_config(["epochs=3"])
    with pytest.raises(ConfigError, match="expected -D<key>=<value>"):
        load_config(["model.depth"])


def test_config_file_over_defaults(tmp_path):
    path = tmp_path / "exp.yml"
    path.write_text("model:\n  depth: 3\n  patch_size: 1\nspan:\n  enabled: yes\n")
    cfg = load_config(["model.depth=4"], str(path))
    assert cfg["model"]["depth"] == 4 and cfg["model"]["patch_size"] == 1 and cfg["span"]["enabled"] is True
    bad = tmp_path / "bad.yml"
    bad.write_text("model:\n  deepth: 3\n")
    with pytest.raises(ConfigError, match="model.deepth"):
        load_config(config_file=str(bad))
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(config_file=str(tmp_path / "missing.yml"))


def test_flatten():
    assert flatten({"a": {"b": 1, "c": {"d": 2}}, "e": []}) == {"a.b": 1, "a.c.d": 2, "e": []}


def test_every_shipped_sweep_file_is_valid_and_found_by_name():
    import glob
    import os

    from posattn.training.sweep import load_sweep

    flat = defaults_flat()
    files = sorted(glob.glob(os.path.join(SWEEP_DIR, "*.yml")))
    assert len(files) >= 10
    for path in files:
        sweep = load_sweep(path, flat)  # every parameter is a config key with a valid value
        assert sweep["metric"]["name"] in ("val/best_acc", "val/acc", "val/acc.max")
    assert load_sweep("thesis_2d_siren_span_threshold", flat, SWEEP_DIR)["parameters"]["span.threshold"] == {
        "value": 0.1
    }
    with pytest.raises(ConfigError, match="not found .*quick_encodings"):
        load_sweep("no_such_sweep", flat, SWEEP_DIR)
