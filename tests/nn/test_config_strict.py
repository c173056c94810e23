"""ModelConfig checks every field's type and range, without coercing, and names
the field by its dotted path (found by fuzzing the config with wrong types)."""

import math

import numpy as np
import pytest

from posattn.nn import ModelConfig, SpanConfig, TransformerClassifier

SMALL = dict(grid=[4, 4], dim=16, heads=2, ffn_dim=16, depth=1)


@pytest.mark.parametrize(
    "values, message",
    [
        # bools must be bools: a string "false" used to switch the span on
        ({"span": {"enabled": "false"}}, r"span\.enabled must be a bool \(true/false\), got 'false' \(str\)"),
        ({"span": {"learnable": "true"}}, r"span\.learnable must be a bool"),
        ({"span": {"per_head": 1}}, r"span\.per_head must be a bool"),
        ({"residual": 0}, r"residual must be a bool"),
        ({"causal": None}, r"causal must be a bool"),
        ({"pe": {"shared": "no"}}, r"pe\.shared must be a bool"),
        ({"pe": {"algebraic_shared": 1.0}}, r"pe\.algebraic_shared must be a bool"),
        # ints must be ints: not floats, bools or strings
        ({"dim": 3.7}, r"dim must be an int, got 3\.7 \(float\)"),
        ({"dim": 16.0}, r"dim must be an int, got 16\.0 \(float\)"),
        ({"depth": True}, r"depth must be an int, got True \(bool\)"),
        ({"heads": "2"}, r"heads must be an int, got '2' \(str\)"),
        ({"in_channels": None}, r"in_channels must be an int"),
        ({"num_classes": math.inf}, r"num_classes must be an int"),
        ({"patch_size": "1"}, r"patch_size must be an int"),
        ({"ffn_dim": 0}, r"ffn_dim must be an int >= 1, got 0"),
        ({"pe": {"hidden_dim": 0}}, r"pe\.hidden_dim must be an int >= 1, got 0"),
        ({"pe": {"hidden_layers": 2.5}}, r"pe\.hidden_layers must be an int"),
        ({"pe": {"max_distance": -1}}, r"pe\.max_distance must be an int >= 0"),
        ({"pe": {"num_features": 3}}, r"pe\.num_features must be even"),
        ({"performer": {"num_features": 2.5}}, r"performer\.num_features must be an int"),
        ({"performer": {"feature_redraw_interval": -1}}, r"performer\.feature_redraw_interval must be an int >= 0"),
        ({"performer": {"num_frequencies": 0}}, r"performer\.num_frequencies must be an int >= 1"),
        ({"performer": {"clip": "4"}}, r"performer\.clip must be an int"),
        # grid: a list of ints >= 1, not a string or floats
        ({"grid": "28"}, r"grid must be a non-empty list of ints >= 1, got '28' \(str\)"),
        ({"grid": [4.5, 4]}, r"grid must be a non-empty list of ints >= 1"),
        ({"grid": ["4", 4]}, r"grid must be a non-empty list of ints >= 1"),
        ({"grid": [4, 0]}, r"grid must be a non-empty list of ints >= 1"),
        ({"grid": None}, r"grid must be a non-empty list of ints >= 1"),
        # floats: int or float, finite, in range
        ({"dropout": "0.1"}, r"dropout must be a finite number, got '0\.1' \(str\)"),
        ({"dropout": None}, r"dropout must be a finite number"),
        ({"input_dropout": True}, r"input_dropout must be a finite number"),
        ({"pe": {"w0": math.nan}}, r"pe\.w0 must be a finite number"),
        ({"pe": {"w0": math.inf}}, r"pe\.w0 must be a finite number"),
        ({"pe": {"w0": 0}}, r"pe\.w0 must be a finite number > 0"),
        ({"span": {"init": "0.3"}}, r"span\.init must be a finite number"),
        ({"span": {"threshold": None}}, r"span\.threshold must be a finite number"),
        ({"span": {"threshold": 1.0}}, r"span\.threshold must be in \[0, 1\)"),
        ({"span": {"min_sigma": -1}}, r"span\.min_sigma must be a finite number > 0"),
        # choices and nested sections
        ({"norm": 1}, r"norm must be a string"),
        ({"pe": {"name": ["siren"]}}, r"pe\.name must be a string"),
        ({"performer": {"kernel": None}}, r"performer\.kernel must be a string"),
        ({"pe": "lookup"}, r"pe must be a mapping, got 'lookup' \(str\)"),
        ({"span": [1]}, r"span must be a mapping"),
        ({"span": {"enabled": True, "mode": "mul"}}, r"span\.mode must be one of 'add', 'multiply'"),
    ],
)
def test_bad_values_are_value_errors_naming_the_field(values, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dict({**SMALL, **values})
    with pytest.raises(ValueError, match=message):
        TransformerClassifier(**{**SMALL, **values})


def test_a_config_built_directly_is_checked_too():
    with pytest.raises(ValueError, match=r"span\.enabled must be a bool"):
        TransformerClassifier(ModelConfig(**SMALL, span=SpanConfig(enabled="false")))
    with pytest.raises(ValueError, match=r"span must be a SpanConfig \(or a mapping, in ModelConfig\.from_dict\)"):
        TransformerClassifier(ModelConfig(**SMALL, span={"enabled": True}))


def test_from_dict_needs_a_mapping_and_names_unknown_keys():
    with pytest.raises(ValueError, match="model config must be a mapping, got 'abc'"):
        ModelConfig.from_dict("abc")
    with pytest.raises(ValueError, match="unknown model config key '1'"):
        ModelConfig.from_dict({1: 2})
    with pytest.raises(ValueError, match="unknown model config key 'span.enable'; did you mean span.enabled"):
        ModelConfig.from_dict({"span": {"enable": True}})


def test_valid_values_of_the_other_numeric_kinds_still_work():
    cfg = ModelConfig.from_dict({**SMALL, "grid": (4, 4), "dropout": 0, "pe": {"w0": 10}, "span": {"threshold": 0}})
    assert cfg.grid == [4, 4] and cfg.dropout == 0 and cfg.pe.w0 == 10
    assert ModelConfig.from_dict({**SMALL, "grid": [np.int64(4), 4]}).token_grid == [4, 4]
    assert ModelConfig.from_dict({**SMALL, "performer": {"num_features": None}}).performer.num_features is None
    assert not ModelConfig.from_dict({**SMALL, "span": {"enabled": False}}).span.enabled
