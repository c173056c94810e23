"""The thesis' configuration vocabulary: every key of its config.yaml and sweep
files is accepted with its meaning, refused with a reason, or (when it configures
nothing here) named once in a warning; its sweep format runs."""

import csv
import json
import os
import re

import helpers.cli as cli_helpers
import pytest
import yaml
from helpers.cli import ROOT, SWEEP_DIR, defaults_flat, load_config

from posattn.training import thesis
from posattn.training.config import ConfigError, flatten, mode_view
from posattn.training.data import DEBIAN_FASHION
from posattn.training.sweep import load_sweep, metric_value

needs_fashion = pytest.mark.skipif(
    not os.path.exists(os.path.join(DEBIAN_FASHION, "train-images-idx3-ubyte.gz")),
    reason="needs the Debian package dataset-fashion-mnist (installed by scripts/setup.sh)",
)

# Every key of the thesis' config.yaml (github.com/MeenaAlfons/posattn), with values of its own.
THESIS_CONFIG = os.path.join(ROOT, "experiments", "thesis_config.yml")
THESIS_SWEEP_KEYS = [  # the keys every thesis sweep file sets
    "accumulation_steps",
    "batch_size",
    "positional_encoding",
    "apply_positional_mask",
    "positional_mask_threshold",
    "random_state",
    "causal",
    "channels_last",
    "cls_token",
    "dataset",
    "device",
    "dim_feedforward",
    "dropout",
    "include_position",
    "input_dim",
    "learning_rate",
    "model",
    "model_dim",
    "multiply_positional_mask_with",
    "num_epochs",
    "num_heads",
    "num_layers",
    "pe.activation",
    "pe.activation_params.w0",
    "pe.final_activation",
    "pe.hidden_dim",
    "pe.num_layers",
    "pe.num_positional_dims",
    "positional_attention_version",
    "positional_logits_operation",
    "resolution_reduction",
    "same_positional_encoding",
    "sigma.default",
]


def get(cfg, key):
    for part in key.split("."):
        cfg = cfg[part]
    return cfg


def test_the_thesis_config_file_loads_with_its_meaning(capsys):
    cfg = load_config(config_file=THESIS_CONFIG)
    expected = {
        "data.name": "cifar10",
        "data.sequential": False,
        "data.small_dataset": 0,
        "seed": 9188,
        "device": "cuda",
        "train.epochs": 80,
        "train.batch_size": 20,
        "train.accumulation_steps": 2,
        "train.lr": 0.001,
        "train.schedule": "constant",
        "train.warmup_steps": 0,
        "model.num_classes": 10,
        "model.in_channels": 3,
        "model.depth": 6,
        "model.dim": 64,
        "model.heads": 8,
        "model.ffn_dim": 128,
        "model.dropout": 0.1,
        "model.input_dropout": 0.1,
        "positional_encoding": "siren",
        "pe.shared": False,
        "model.causal": False,
        "span.enabled": True,
        "span.threshold": 0.1,
        "span.mode": "multiply",
        "span.init": 0.3,
        "span.learnable": True,
        "model.pooling": "last",
        "pe.hidden_layers": 2,
        "pe.hidden_dim": 64,
        "model.positions": "grid",
        "pe.w0": 10.0,
    }
    for key, value in expected.items():
        assert get(cfg, key) == value, key
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "ignored thesis key" in line]
    assert len(warnings) == 1  # named once, in one line
    for key in (
        "channels_last",
        "hooks",
        "save_onnx",
        "model_dir",
        "checkpoint_path",
        "log_times_per_epoch",
        "positional_attention_version",
        "scheduler_params",
        "resolution_reduction_kernel_size",
        "profile",
    ):
        assert key in warnings[0], key


def test_every_key_of_the_thesis_config_is_in_the_table():
    flat = flatten(yaml.safe_load(open(THESIS_CONFIG)))
    assert set(flat) == set(thesis.thesis_key_names())  # the example file has every key, the table every key
    for key in THESIS_SWEEP_KEYS:
        assert thesis.lookup(key) is not None, key


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("learning_rate", "0.05", {"train.lr": 0.05}),
        ("num_epochs", "3", {"train.epochs": 3}),
        ("dataset", "smnist", {"data.name": "mnist", "data.sequential": True}),
        ("dataset", "mnist", {"data.name": "mnist", "data.sequential": False}),
        ("small_dataset", "True", {"data.small_dataset": 1000}),
        ("small_dataset", "f", {"data.small_dataset": 0}),
        ("small_dataset", "250", {"data.small_dataset": 250}),
        ("random_state", "null", {"seed": None}),
        ("positional_encoding", "baseline", {"positional_encoding": "sinusoidal"}),
        ("positional_encoding", "lookup", {"positional_encoding": "lookup"}),
        ("include_position", "false", {"positional_encoding": "none"}),
        ("positional_mask_threshold", "-1", {"span.threshold": 0.0}),
        ("positional_mask_threshold", "0.2", {"span.threshold": 0.2}),
        ("pe.num_layers", "4", {"pe.hidden_layers": 3}),
        ("pe.num_positional_dims", "1", {"model.positions": "sequence"}),
        ("cls_token", "max", {"model.pooling": "max"}),
        ("dropout", "0.2", {"model.dropout": 0.2, "model.input_dropout": 0.2}),
        ("same_positional_encoding", "t", {"pe.shared": True}),
        ("learn_sigma", "false", {"span.learnable": False}),
        ("sigma.layer_3", "0.0", {"span.init": 0.3}),  # no override: the default stays
        ("pe.activation_params.layer_2.w0", "-1", {"pe.w0": 10.0}),
        ("causal", "true", {"model.causal": True}),
    ],
)
def test_a_thesis_key_sets_its_posattn_keys(key, value, expected):
    cfg = load_config([f"{key}={value}"])
    for target, v in expected.items():
        assert get(cfg, target) == v and type(get(cfg, target)) is type(v), target


@pytest.mark.parametrize(
    "arg, message",
    [
        ("positional_logits_operation=multiply", "positional_logits_operation='multiply': posattn adds"),
        ("multiply_positional_mask_with=positional_logits", "positional_logits alone is not available"),
        ("resolution_reduction=[false, true]", "resolution reduction .* is not available"),
        ("sigma.layer_1=0.2", "sigma.layer_1='0.2': posattn has one initial sigma for all layers"),
        ("pe.activation=ReLU", "pe.activation='ReLU': .*other activations are not available"),
        ("pe.activation_params.w0_initial=30", "one w0 for all layers"),
        ("pe.normalized=false", "normalised to \\[-1, 1\\]"),
        ("save_onnx=true", "save_onnx='true': no ONNX export"),
        ("channels_last=false", "channels-last images only"),
        ("model=resnet", "model='resnet': posattn builds the thesis' transformer classifier"),
        ("scheduler=CosineAnnealingLR", "torch schedulers by name are not available"),
        ("pe.num_positional_dims=3", "expected 1 .* or 2"),
        ("pe.num_layers=1", "expected an int >= 2"),
        ("dataset=imagenet", "expected cifar10, mnist or smnist"),
        ("num_layers=two", "num_layers \\(the thesis' name of model.depth\\): model.depth: expected an int"),
        ("learning_rat=0.1", "unknown config key 'learning_rat'; did you mean .*learning_rate"),
    ],
)
def test_values_posattn_cannot_honour_exit_2_naming_the_key(tmp_path, capsys, arg, message):
    assert cli_helpers.main([f"-Dout_dir={tmp_path}", "-no_wandb=T", f"-D{arg}"]) == 2
    assert re.search(message, capsys.readouterr().err)


def test_metric_value_reads_a_wandb_summary_aggregate():
    history = [{"val/acc": 0.5}, {"val/acc": 0.7}, {"val/acc": 0.6}]
    assert metric_value(history, "val/acc.max") == 0.7
    assert metric_value(history, "val/acc.min") == 0.5
    assert metric_value(history, "val/acc.last") == 0.6
    assert metric_value(history, "val/acc") == 0.6
    assert metric_value(history, "val/acc.max", {"val/acc.max": 0.9}) == 0.9
    assert metric_value(history, "val/loss.max") is None
    # the local sweep adds the running aggregate to each epoch's row (for hyperband): it must not stick
    running = [{"val/acc": 0.5, "val/acc.max": 0.5}, {"val/acc": 0.7}]
    assert metric_value(running, "val/acc.max") == 0.7


def test_a_sweep_in_the_thesis_format_validates_and_warns_once(tmp_path, capsys):
    sweep = load_sweep("thesis_keys_quick", defaults_flat(), SWEEP_DIR)
    assert sweep["metric"]["name"] == "val/acc.max"
    assert set(THESIS_SWEEP_KEYS) <= set(sweep["parameters"])  # every key a thesis sweep file sets
    assert capsys.readouterr().err.count("ignored thesis key") == 1
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "method: grid\nmetric: {name: val/acc.max}\nparameters:\n"
        "  positional_logits_operation: {values: [add, multiply]}\n"
    )
    with pytest.raises(ConfigError, match="multiply"):
        load_sweep(str(bad), defaults_flat())


@needs_fashion
def test_the_thesis_sweep_format_runs_locally(tmp_path):
    """thesis_keys_quick.yml (thesis keys, metric val/acc.max) through -mode=local_sweep, made tinier."""
    sweep = yaml.safe_load(open(os.path.join(SWEEP_DIR, "thesis_keys_quick.yml")))
    sweep["parameters"].update(
        {
            "num_epochs": {"value": 2},
            "small_dataset": {"value": 120},
            "num_layers": {"value": 1},
            "model_dim": {"value": 16},
        }
    )
    path = tmp_path / "thesis_sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    assert (
        cli_helpers.main([f"-Dout_dir={tmp_path}", "-no_wandb=T", "-mode=local_sweep", f"--sweep_config={path}"]) == 0
    )
    with open(tmp_path / "thesis_keys_quick" / "sweep_summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["apply_positional_mask"] for r in rows] == ["False", "True"]
    for r in rows:
        run_dir = tmp_path / "thesis_keys_quick" / r["run"]
        accs = [
            m["val/acc"]
            for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if "val/acc" in m
        ]
        assert float(r["val/acc.max"]) == pytest.approx(max(accs))
        used = yaml.safe_load((run_dir / "config.yml").read_text())
        assert used["span"]["enabled"] == (r["apply_positional_mask"] == "True")
        assert used["span"]["mode"] == "multiply" and used["span"]["threshold"] == 0.1
        assert used["model"]["depth"] == 1 and used["train"]["lr"] == 0.005 and used["data"]["small_dataset"] == 120


def test_a_thesis_sweep_on_missing_data_or_device_says_so(tmp_path, capsys):
    """The thesis' own sweeps name CIFAR-10 on CUDA: where neither exists, a clear error."""
    sweep = yaml.safe_load(open(os.path.join(SWEEP_DIR, "thesis_keys_quick.yml")))
    sweep["parameters"].update({"dataset": {"value": "cifar10"}, "input_dim": {"value": 3}, "device": {"value": "cpu"}})
    path = tmp_path / "cifar.yaml"
    path.write_text(yaml.safe_dump(sweep))
    args = [
        f"-Dout_dir={tmp_path}",
        "-no_wandb=T",
        "-mode=local_sweep",
        f"--sweep_config={path}",
        f"-Ddata.root={tmp_path / 'nodata'}",
    ]
    assert cli_helpers.main(args) == 1
    assert "dataset 'cifar10' (train) not found" in capsys.readouterr().err
    import torch

    if not torch.cuda.is_available():
        sweep["parameters"]["device"] = {"value": "cuda"}
        path.write_text(yaml.safe_dump(sweep))
        assert cli_helpers.main(args) == 2
        assert "CUDA is not available" in capsys.readouterr().err


@needs_fashion
def test_thesis_keys_on_the_command_line_train(tmp_path):
    args = [
        f"-Dout_dir={tmp_path}",
        "-no_wandb=T",
        "-Dname=t",
        "-Dlearning_rate=0.05",
        "-Dnum_epochs=1",
        "-Dsmall_dataset=100",
        "-Dnum_layers=1",
        "-Dmodel_dim=16",
        "-Dnum_heads=2",
        "-Drandom_state=null",
        "-Dapply_positional_mask=true",
        "-Dpositional_mask_threshold=0.1",
        "-Dinput_dim=1",
    ]
    assert cli_helpers.main(args) == 0
    used = yaml.safe_load((tmp_path / "t" / "config.yml").read_text())
    assert used["train"]["lr"] == 0.05 and used["model"]["depth"] == 1 and used["span"]["enabled"] is True
    assert isinstance(used["seed"], int)  # random_state null: a seed was drawn and saved
    assert (
        cli_helpers.main(
            [
                f"-Dout_dir={tmp_path}",
                "-no_wandb=T",
                "-Dname=u",
                "-Dinput_dim=3",
                "-Dsmall_dataset=100",
                "-Dnum_epochs=1",
            ]
        )
        == 2
    )


def test_printed_config_shows_the_sections_of_the_mode():
    cfg = load_config()
    train = mode_view(cfg, "train")
    assert {"pe", "span", "model", "data", "train", "positional_encoding"} <= set(train)
    assert not {"scaling", "shift", "sweep", "checkpoint", "performer"} & set(train)
    assert "performer" in mode_view(load_config(["model.attention=favor", "positional_encoding=none"]), "train")
    assert set(mode_view(cfg, "scaling")) & {"scaling", "model", "train"} == {"scaling"}
    assert {"checkpoint", "shift"} <= set(mode_view(cfg, "shift_test"))


def test_wandb_runs_keep_the_summary_aggregates_a_thesis_sweep_names(tmp_path):
    """A server sweep with metric val/acc.max reads the run summary: the tracker asks W&B
    for the max (and last) of val/acc, for a run it starts and for an agent's run alike."""
    from posattn.training.tracking import SUMMARIES, Tracker

    class Run:  # stands in for a W&B run
        def __init__(self):
            self.defined, self.config = {}, type("Config", (), {"update": lambda *a, **k: None})()

        def define_metric(self, name, summary=None):
            self.defined[name] = summary

    run = Run()
    Tracker(str(tmp_path)).start({"a": 1}, "r", reuse_run=run)
    assert run.defined == SUMMARIES
    assert "max" in SUMMARIES["val/acc"].split(",") and "last" in SUMMARIES["val/acc"].split(",")
