"""Bad experiment settings end the CLI with one clear line and exit status 2
(checked before any data is loaded or folder written), never a traceback, and
are never silently replaced by something else (found by fuzzing the CLI)."""

import os
import re

import helpers.cli as cli_helpers
import pytest

from posattn.training import cli
from posattn.training.config import ConfigError
from posattn.training.data import load_splits
from posattn.training.scaling import QUICK, ScalingConfig
from posattn.training.sweep import load_sweep

TINY = [
    "-Ddata.small_dataset=64",
    "-Dmodel.depth=1",
    "-Dmodel.dim=16",
    "-Dmodel.heads=2",
    "-Dmodel.ffn_dim=16",
    "-Dtrain.epochs=1",
    "-no_wandb=T",
]


def fails(capsys, argv, message):
    """main(argv) exits 2 with one line on stderr that matches ``message``."""
    assert cli_helpers.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and re.search(message, err), err
    return err


@pytest.mark.parametrize(
    "args, message",
    [
        (["-Ddevice=tpu"], r"device must be auto, cpu, cuda, cuda:N or mps, got 'tpu'"),
        (["-Ddevice=cuda:x"], r"device must be auto, cpu, cuda, cuda:N or mps"),
        (["-Ddevice=tpu", "-mode=scaling"], r"device must be auto, cpu, cuda"),
        (
            ["-Dtrain.betas=[0.9]"],
            r"train\.betas must be two numbers in \[0, 1\), e\.g\. \[0\.9, 0\.999\], got \[0\.9\]",
        ),
        (["-Dtrain.betas=[0.9, 1.5]"], r"train\.betas must be two numbers in \[0, 1\)"),
        (["-Dnum_threads=-1"], r"num_threads must be an int >= 0 or null"),
        (["-Ddata.small_dataset=-5"], r"data\.small_dataset must be an int >= 0 \(0: all images\), got -5"),
        (["-Ddata.val_fraction=1.5"], r"data\.val_fraction must be a number in \(0, 1\), got 1\.5"),
        (["-Ddata.pad_to=-2"], r"data\.pad_to must be an int >= 0"),
        (["-Ddata.name=imagenet"], r"data\.name must be one of fashion_mnist, mnist, cifar10"),
        (["-Dtrain.lr=-1"], r"train\.lr must be a positive finite number, got -1"),
        (["-Dtrain.lr=inf"], r"train\.lr must be a positive finite number, got inf"),
        (["-Dtrain.weight_decay=-0.1"], r"train\.weight_decay must be a finite number >= 0"),
        (["-Dtrain.epochs=0"], r"train\.epochs must be an int >= 1, got 0"),
        (["-Dtrain.batch_size=-64"], r"train\.batch_size must be an int >= 1"),
        (["-Dtrain.warmup_steps=-1"], r"train\.warmup_steps must be an int >= 0"),
        (["-Dtrain.grad_clip=-1"], r"train\.grad_clip must be a finite number >= 0 \(0: off\)"),
        (["-Dtrain.schedule=linear"], r"train\.schedule must be one of constant, warmup_cosine, noam"),
        (["-Dsweep.count=-1"], r"sweep\.count must be an int >= 0"),
        (["-Dshift.step=0"], r"shift\.step must be an int >= 1"),
        (["-Dout_dir=null"], r"out_dir must be a non-empty string, got None"),
        (["-Dmodel.in_channels=1.5"], r"model\.in_channels must be an int >= 1 or null \(null: from the data\)"),
        (["-Dmodel.variant=Perf"], r"model\.variant must be one of Performer, .* or null, got 'Perf'"),
    ],
)
def test_bad_values_exit_2_naming_the_key(tmp_path, capsys, args, message):
    fails(capsys, [*TINY, f"-Dout_dir={tmp_path}", *args], message)
    assert os.listdir(tmp_path) == []  # nothing was written


def test_an_output_folder_that_cannot_be_created_exits_2(tmp_path, capsys):
    fails(capsys, [*TINY, "-Dout_dir=/dev/null/x"], r"out_dir '/dev/null/x' cannot be created \(Not a directory\)")
    (tmp_path / "file").write_text("")
    fails(capsys, [*TINY, f"-Dout_dir={tmp_path / 'file'}"], r"out_dir '.*file' cannot be created")
    fails(capsys, ["-mode=scaling", "-Dscaling.out=/dev/null/s"], r"scaling\.out '/dev/null/s' cannot be created")


@pytest.fixture
def permissions_count(monkeypatch):
    """root may write anywhere: make os.access answer from the mode bits, as for any other user."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        real = os.access

        def access(path, mode, **kwargs):
            return real(path, mode, **kwargs) and not (mode & os.W_OK and not os.stat(path).st_mode & 0o200)

        monkeypatch.setattr(os, "access", access)


def test_a_read_only_run_folder_or_out_dir_exits_2(tmp_path, capsys, permissions_count):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_dir.chmod(0o555)
    try:
        fails(capsys, [*TINY, f"-Dout_dir={tmp_path}", "-Dname=run"], r"run folder '.*run' is not writable")
        fails(capsys, [*TINY, f"-Dout_dir={run_dir}"], r"out_dir '.*run' is not writable")
        fails(capsys, [*TINY, f"-Dout_dir={tmp_path}", f"--resume={run_dir}"], r"run folder '.*run' is not writable")
    finally:
        run_dir.chmod(0o755)


@pytest.fixture
def studies(monkeypatch):
    """The ScalingConfig each -mode=scaling run gets (the study itself is not run)."""
    seen = []
    monkeypatch.setattr(cli, "run_study", lambda study, command: seen.append(study) or {})
    return seen


def test_explicit_scaling_settings_win_over_quick(tmp_path, studies):
    base = ["-mode=scaling", f"-Dscaling.out={tmp_path}"]
    assert cli_helpers.main([*base, "-Dscaling.dim=32", "-Dscaling.quick=true", "-Dscaling.lengths=[8, 16]"]) == 0
    config = tmp_path / "scaling.yml"
    config.write_text("scaling:\n  quick: true\n  heads: 4\n")
    assert cli_helpers.main([*base, f"--config={config}"]) == 0
    assert cli_helpers.main([*base, "-Dscaling.quick=true"]) == 0
    explicit, from_file, quick = studies
    assert explicit.dim == 32 and explicit.lengths == [8, 16]
    assert explicit.heads == QUICK["heads"] and explicit.grid_sides == QUICK["grid_sides"]
    assert from_file.heads == 4 and from_file.dim == QUICK["dim"]
    assert quick.dim == QUICK["dim"] and quick.lengths == QUICK["lengths"]


def test_scaling_with_num_threads_null(tmp_path, studies):
    assert cli_helpers.main(["-mode=scaling", f"-Dscaling.out={tmp_path}", "-Dnum_threads=null"]) == 0
    assert studies[0].threads == 0


def test_scaling_sizes_must_be_ints():
    with pytest.raises(ValueError, match=r"scaling\.lengths must be a non-empty list of integers >= 1, got \[64\.5\]"):
        ScalingConfig.from_dict({"lengths": [64.5]})
    with pytest.raises(ValueError, match=r"scaling\.dim must be an int >= 1, got '16'"):
        ScalingConfig.from_dict({"dim": "16"})
    with pytest.raises(ValueError, match=r"scaling\.methods: unknown method"):
        ScalingConfig.from_dict({"methods": [["relpos"]]})


def test_sweep_values_are_checked_like_the_command_line(tmp_path):
    sweep = tmp_path / "s.yml"
    sweep.write_text("method: grid\nmetric: {name: val/acc}\nparameters:\n  train.lr: {values: [0.01, -1]}\n")
    with pytest.raises(ConfigError, match=r"train\.lr must be a positive finite number, got -1"):
        load_sweep(str(sweep), cli_helpers.defaults_flat())


def test_load_splits_rejects_a_negative_subset_size():
    with pytest.raises(ValueError, match=r"data\.small_dataset .* must be >= 0"):
        load_splits("fashion_mnist", small_dataset=-5)
