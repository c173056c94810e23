"""cmd/main.py end to end on a tiny Fashion-MNIST subset (offline data)."""

import csv
import glob
import json
import os
import re
import subprocess
import sys

import helpers.cli as cli_helpers
import pytest
import torch
from helpers.cli import MAIN, ROOT, load_config

from posattn.training import runs
from posattn.training.data import DEBIAN_FASHION

pytestmark = pytest.mark.skipif(
    not os.path.exists(os.path.join(DEBIAN_FASHION, "train-images-idx3-ubyte.gz")),
    reason="needs the Debian package dataset-fashion-mnist (installed by scripts/setup.sh)",
)

TINY = [
    "-Ddata.small_dataset=192",
    "-Dmodel.depth=1",
    "-Dmodel.dim=16",
    "-Dmodel.heads=2",
    "-Dmodel.ffn_dim=16",
    "-Dpe.hidden_dim=8",
    "-Dtrain.batch_size=64",
    "-Dtrain.warmup_steps=2",
    "-Dtrain.epochs=2",
]


def run(tmp_path, *args):
    return cli_helpers.main([*TINY, f"-Dout_dir={tmp_path}", "-no_wandb=T", *args])


def test_train_writes_checkpoints_metrics_and_summary(tmp_path, capsys):
    assert run(tmp_path, "-Dname=a") == 0
    out = capsys.readouterr().out
    assert "resolved config:" in out and "final metrics (a)" in out and "test accuracy (best checkpoint)" in out
    d = tmp_path / "a"
    for name in ("config.yml", "last.pt", "best.pt", "metrics.jsonl", "summary.json"):
        assert (d / name).exists(), name
    lines = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in lines if "epoch" in m] == [1, 2]
    for key in ("train/loss", "val/loss", "val/acc", "lr", "time/per_sample_ms"):
        assert key in lines[0]
    summary = json.loads((d / "summary.json").read_text())
    assert 0.0 <= summary["test/acc"] <= 1.0 and summary["num_parameters"] > 0
    assert not glob.glob(str(d / ".tmp-*"))  # atomic writes leave no temporaries


def test_resume_continues_exactly(tmp_path):
    straight = tmp_path / "straight"
    assert run(straight, "-Dname=r") == 0
    # the same run interrupted after epoch 1, then resumed
    cfg = load_config([*[a[2:] for a in TINY], f"out_dir={tmp_path / 'split'}", "no_wandb=true", "name=r"])
    runs.train(cfg, epoch_callback=lambda epoch, metrics: epoch == 1, progress=False)
    assert torch.load(tmp_path / "split" / "r" / "last.pt", weights_only=False)["epoch"] == 1
    assert cli_helpers.main([f"-Dout_dir={tmp_path / 'split'}", "-Dname=r", "--resume"]) == 0
    a = torch.load(straight / "r" / "last.pt", weights_only=False)
    b = torch.load(tmp_path / "split" / "r" / "last.pt", weights_only=False)
    assert a["epoch"] == b["epoch"] == 2
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key


def test_test_mode_evaluates_the_checkpoint(tmp_path, capsys):
    assert run(tmp_path, "-Dname=t") == 0
    summary = json.loads((tmp_path / "t" / "summary.json").read_text())
    capsys.readouterr()
    assert cli_helpers.main([f"-Dout_dir={tmp_path}", "-Dname=t", "-mode=test"]) == 0
    out = capsys.readouterr().out
    assert f"{summary['test/acc']:.4f}" in out  # same checkpoint (best), same test split
    assert cli_helpers.main([f"-Dout_dir={tmp_path}", "-Dname=missing", "-mode=test"]) == 2


def test_gradient_accumulation_matches_one_large_batch(tmp_path, monkeypatch):
    """batch 32 x 2 accumulation steps gives the gradient of batch 64 (same samples)."""
    grads = {}  # run -> the gradients at its first optimizer step
    original = torch.optim.Adam.step

    def spy(self, *args, **kwargs):
        grads.setdefault(current[0], [p.grad.clone() for p in self.param_groups[0]["params"]])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", spy)
    common = ["-Dtrain.epochs=1", "-Dtrain.grad_clip=0", "-Dmodel.dropout=0.0"]
    current = ["big"]
    assert run(tmp_path / "big", "-Dname=x", "-Dtrain.batch_size=64", *common) == 0
    current = ["acc"]
    assert run(tmp_path / "acc", "-Dname=x", "-Dtrain.batch_size=32", "-Dtrain.accumulation_steps=2", *common) == 0
    big, acc = grads["big"], grads["acc"]
    assert len(big) == len(acc) > 0
    for a, b in zip(big, acc):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    assert max(g.abs().max() for g in big) > 0


def test_offline_wandb_run_writes_its_files(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert cli_helpers.main([*TINY, f"-Dout_dir={tmp_path}", "-Dname=w", "-Dtrain.epochs=1", "-no_wandb=F"]) == 0
    runs = glob.glob(str(tmp_path / "w" / "wandb" / "offline-run-*"))
    assert len(runs) == 1
    assert glob.glob(os.path.join(runs[0], "*.wandb")) and os.path.exists(os.path.join(runs[0], "files"))


def test_offline_wandb_run_honours_WANDB_DIR(tmp_path, monkeypatch):
    """WANDB_DIR (W&B's documented setting) says where W&B's files go; without it
    they stay in the run folder (the test above)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    wandb_dir = tmp_path / "elsewhere" / "wb"  # not there yet: created
    monkeypatch.setenv("WANDB_DIR", str(wandb_dir))
    out = tmp_path / "runs"
    assert cli_helpers.main([*TINY, f"-Dout_dir={out}", "-Dname=w", "-Dtrain.epochs=1", "-no_wandb=F"]) == 0
    assert len(glob.glob(str(wandb_dir / "wandb" / "offline-run-*"))) == 1
    assert not (out / "w" / "wandb").exists()
    assert (out / "w" / "last.pt").exists()


def test_WANDB_DIR_that_cannot_be_created_is_an_error(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("WANDB_DIR", str(blocker / "wb"))
    assert cli_helpers.main([*TINY, f"-Dout_dir={tmp_path}", "-Dname=w", "-no_wandb=F"]) == 2
    assert "WANDB_DIR" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", ".", "a\\b", "/abs", "tab\there"])
def test_run_name_must_be_one_folder_inside_out_dir(tmp_path, capsys, name):
    out = tmp_path / "runs"
    assert run(out, f"-Dname={name}", "-Dtrain.epochs=1") == 2
    err = capsys.readouterr().err
    assert "name must be a folder name" in err and repr(name) in err
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], ["runs"])  # nothing written outside out_dir
    assert not any(out.rglob("*.pt")) if out.exists() else True


def test_sweep_file_name_must_be_one_folder(tmp_path, capsys):
    sweep = tmp_path / "s.yml"
    sweep.write_text(
        "name: ../up\nmethod: grid\nmetric: {name: val/best_acc}\nparameters:\n  train.epochs: {value: 1}\n"
    )
    assert run(tmp_path / "runs", "-mode=local_sweep", f"--sweep_config={sweep}") == 2
    assert "sweep name '../up'" in capsys.readouterr().err
    assert not (tmp_path / "up").exists()


def test_sweep_agent_keeps_a_run_name_from_wandb_inside_out_dir(tmp_path, monkeypatch):
    """A W&B run's name (a sweep may set it from values) becomes one folder name."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    real_init = wandb.init
    monkeypatch.setattr(
        wandb,
        "init",
        lambda **kw: real_init(config={"train.epochs": 1}, dir=str(tmp_path / "wb"), name="../../up/run", **kw),
    )
    monkeypatch.setattr(wandb, "agent", lambda sweep_id, function, count=None, **kw: function())
    out = tmp_path / "runs"
    assert cli_helpers.main([*TINY, f"-Dout_dir={out}", "-mode=sweep_agent", "--sweep_id=x", "-count=1"]) == 0
    assert (out / ".._.._up_run" / "last.pt").exists()
    assert not (tmp_path / "up").exists() and not (tmp_path.parent / "up").exists()


def test_local_sweep_with_the_wandb_sweep_engine(tmp_path):
    sweep = tmp_path / "tiny.yml"
    sweep.write_text(
        "name: tiny\nmethod: grid\nmetric: {name: val/best_acc, goal: maximize}\n"
        "parameters:\n  positional_encoding: {values: [siren, none]}\n  span.enabled: {values: [false, true]}\n"
        "  train.epochs: {value: 1}\n"
    )
    assert run(tmp_path, "-mode=local_sweep", f"--sweep_config={sweep}") == 0
    with open(tmp_path / "tiny" / "sweep_summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    assert {(r["positional_encoding"], r["span.enabled"]) for r in rows} == {
        ("siren", "False"),
        ("siren", "True"),
        ("none", "False"),
        ("none", "True"),
    }
    assert all(0.0 <= float(r["val/best_acc"]) <= 1.0 for r in rows)
    with open(tmp_path / "tiny" / "sweep_metric.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_local_random_sweep_needs_a_count(tmp_path, capsys):
    sweep = tmp_path / "r.yml"
    sweep.write_text("method: random\nmetric: {name: val/acc}\nparameters:\n  train.lr: {min: 0.0001, max: 0.01}\n")
    assert run(tmp_path, "-mode=local_sweep", f"--sweep_config={sweep}") == 2
    assert "give -count=N" in capsys.readouterr().err
    assert run(tmp_path, "-mode=local_sweep", f"--sweep_config={sweep}", "-count=1", "-Dtrain.epochs=1") == 0


def test_shift_test_writes_csv_and_plot(tmp_path, capsys):
    assert run(tmp_path, "-Dname=s", "-Dtrain.epochs=1", "-Ddata.small_dataset=600") == 0
    assert cli_helpers.main([f"-Dout_dir={tmp_path}", "-Dname=s", "-mode=shift_test", "-Dshift.min_shift=2"]) == 0
    out = capsys.readouterr().out
    assert "shifted-image test" in out
    with open(tmp_path / "s" / "shift_test" / "shift_accuracy.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["shift"]) for r in rows] == [-2, -1, 0, 1, 2]
    assert all(0.0 <= float(r["accuracy"]) <= 1.0 for r in rows)
    with open(tmp_path / "s" / "shift_test" / "shift_accuracy.png", "rb") as f:
        assert f.read(4) == b"\x89PNG"


def test_shift_test_exact_kernel_on_the_whole_test_split(tmp_path, capsys):
    """A FAVOR+ model evaluated with the exact kernel, on every qualifying test image (the run saw a
    shrunk test split); without positions, a shift by whole 4x4 patches changes nothing."""
    assert run(tmp_path, "-Dname=p", "-Dmodel.variant=NoPosPerformer", "-Dmodel.patch_size=4", "-Dtrain.epochs=1") == 0
    args = [f"-Dout_dir={tmp_path}", "-Dname=p", "-mode=shift_test", "-Dshift.min_shift=4", "-Dshift.step=4"]
    assert cli_helpers.main([*args, "-Dshift.exact_kernel=true"]) == 0
    assert "exact softmax kernel" in capsys.readouterr().out
    with open(tmp_path / "p" / "shift_test_exact_kernel" / "shift_accuracy.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["shift"]) for r in rows] == [-4, 0, 4]
    assert len({r["accuracy"] for r in rows}) == 1 and int(rows[0]["images"]) > 500  # of the 1000 test trousers
    assert run(tmp_path, "-Dname=r", "-Dtrain.epochs=1") == 0
    assert cli_helpers.main([f"-Dout_dir={tmp_path}", "-Dname=r", "-mode=shift_test", "-Dshift.exact_kernel=true"]) == 2
    assert "the model has no FAVOR+ attention" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["-Dpe.hiden_dim=3"], "unknown config key 'pe.hiden_dim'; did you mean pe.hidden_dim"),
        (["-Dmodel.depth=two"], "model.depth: expected an int"),
        (["-mode=fly"], "invalid choice: 'fly'"),
        (["-no_wandb=maybe"], "no_wandb: expected a bool"),
        (["-Dpositional_encoding=sirne"], "pe.name must be one of"),
        (["-Dmodel.dim=30", "-Dmodel.heads=4"], "dim \\(30\\) must be divisible by heads"),
        (["-mode=local_sweep"], "needs --sweep_config"),
        (["-mode=sweep_agent", "-no_wandb=T"], "needs --sweep_id"),
        (["stray"], "unexpected argument 'stray'"),
        (["--config", "/nonexistent.yml"], "does not exist"),
    ],
)
def test_bad_cli_input_exits_2_with_a_clear_error(tmp_path, capsys, args, message):
    assert cli_helpers.main([f"-Dout_dir={tmp_path}", *TINY, *args]) == 2
    assert re.search(message, capsys.readouterr().err)


def test_script_entry_point_help_names_only_files_that_exist():
    out = subprocess.run([sys.executable, MAIN, "--help"], capture_output=True, text=True, check=True).stdout
    assert "-mode" in out and "-D KEY=VALUE" in out and "local_sweep" in out
    paths = re.findall(r"[\w./-]+\.(?:ya?ml|py)\b", out)
    assert "cmd/main.py" in paths and "experiments/thesis_config.yml" in paths
    for path in paths:
        assert os.path.exists(os.path.join(ROOT, path)), path
    for name in re.findall(r"--sweep_config=(\w+)\s", out):  # sweep files named without a path
        assert os.path.exists(os.path.join(ROOT, "experiments", "sweeps", name + ".yml")), name


def test_cmd_main_runs_from_another_working_directory_and_with_python_O(tmp_path):
    """The defaults and sweep files come from cmd/main.py's own folder, not the working
    directory; -O (no asserts, no __debug__) changes nothing."""
    cmd = [sys.executable, "-O", MAIN, *TINY, "-Dtrain.epochs=1", "-Dname=o", "-no_wandb=T", "-Dlearning_rate=0.05"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "runs" / "o" / "summary.json").exists()
    proc = subprocess.run(
        [sys.executable, MAIN, "-mode=local_sweep", "--sweep_config=nope"], capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 2 and "thesis_keys_quick" in proc.stderr  # the shipped sweeps are listed


def test_missing_wandb_and_sweeps_exit_2_with_the_install_command(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now raises ImportError
    monkeypatch.setitem(sys.modules, "sweeps", None)
    assert run(tmp_path, "-Dname=n", "-Dtrain.epochs=1") == 0  # -no_wandb=T needs neither
    assert run(tmp_path, "-Dname=n2", "-Dtrain.epochs=1", "-no_wandb=F") == 2
    err = capsys.readouterr().err
    assert "Weights & Biases logging needs the Python package 'wandb'" in err
    assert "python -m pip install wandb" in err and "-no_wandb=T" in err
    assert run(tmp_path, "-mode=local_sweep", "--sweep_config=quick_encodings") == 2
    assert "python -m pip install sweeps" in capsys.readouterr().err
    assert run(tmp_path, "-mode=sweep", "--sweep_config=quick_encodings") == 2
    assert "python -m pip install wandb" in capsys.readouterr().err


@pytest.mark.parametrize("metric", ["val/acc", "val/acc.max"])
def test_local_sweep_hyperband_stops_weak_runs_early(tmp_path, metric):
    """With a stand-in for training, the engine's hyperband stops runs whose metric
    trails the earlier runs at a band (also for a W&B summary aggregate, the thesis' form)."""
    from posattn.training import sweep as sweep_mod

    path = tmp_path / "hb.yml"
    path.write_text(
        f"name: hb\nmethod: grid\nmetric: {{name: {metric}, goal: maximize}}\n"
        "early_terminate: {type: hyperband, min_iter: 1, eta: 2}\n"
        "parameters:\n  train.lr: {values: [0.5, 0.4, 0.1, 0.05]}\n  train.epochs: {value: 4}\n"
    )
    trained = {}

    def fake_train(cfg, epoch_callback=None, **_):
        lr, history = cfg["train"]["lr"], []
        for epoch in range(1, cfg["train"]["epochs"] + 1):
            metrics = {"epoch": epoch, "val/acc": lr * epoch / 4}
            history.append(metrics)
            if epoch_callback(epoch, metrics):
                break
        trained[lr] = len(history)
        return {"history": history, "test/acc": history[-1]["val/acc"], "epochs": len(history), "train_seconds": 0.0}

    cfg = load_config([f"out_dir={tmp_path}"])
    rows = sweep_mod.local_sweep(cfg, str(path), cli_helpers.defaults_flat(), train_fn=fake_train)
    assert len(rows) == 4
    assert trained[0.5] == 4 and trained[0.4] == 4  # the strong runs go on
    assert trained[0.05] < 4  # the weakest run is stopped at a band


@pytest.mark.slow
def test_torchrun_two_processes_on_cpu(tmp_path):
    """DistributedDataParallel (gloo) with two CPU processes, launched by torchrun."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",  # a free port of its own, not 29500 (another job on the host may hold it)
        "--nproc_per_node=2",
        MAIN,
        *TINY,
        "-Ddata.small_dataset=256",
        f"-Dout_dir={tmp_path}",
        "-Dname=ddp",
        "-no_wandb=T",
        "-Dnum_threads=1",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    # the ranks' own messages come first in stderr, the launcher's summary last: show both
    err = proc.stderr if len(proc.stderr) < 8000 else proc.stderr[:5000] + "\n[...]\n" + proc.stderr[-3000:]
    assert proc.returncode == 0, f"stdout tail:\n{proc.stdout[-1500:]}\nstderr:\n{err}"
    assert proc.stdout.count("final metrics (ddp)") == 1  # only rank 0 reports
    state = torch.load(tmp_path / "ddp" / "last.pt", weights_only=False)
    assert state["epoch"] == 2


def test_sweep_agent_takes_values_from_wandb_config(tmp_path, monkeypatch, capsys):
    """-mode=sweep_agent: the agent's runs get their values through wandb.config
    (the W&B server is replaced by an offline run holding the sweep's values)."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    real_init = wandb.init
    sweep_values = {
        "positional_encoding": "lookup",
        "train.epochs": 1,
        "model.depth": 2,
        "learning_rate": 0.003,
        "cls_token": "max",
        "channels_last": True,
    }  # thesis keys too
    monkeypatch.setattr(wandb, "init", lambda **kw: real_init(config=sweep_values, dir=str(tmp_path), **kw))
    calls = []

    def fake_agent(sweep_id, function, count=None, **kw):
        calls.append((sweep_id, count))
        function()

    monkeypatch.setattr(wandb, "agent", fake_agent)
    assert (
        cli_helpers.main([*TINY, f"-Dout_dir={tmp_path}", "-mode=sweep_agent", "--sweep_id=me/proj/abc", "-count=1"])
        == 0
    )
    assert calls == [("me/proj/abc", 1)]
    (run_dir,) = [p for p in tmp_path.iterdir() if (p / "config.yml").exists()]
    import yaml

    used = yaml.safe_load((run_dir / "config.yml").read_text())
    assert used["positional_encoding"] == "lookup" and used["model"]["depth"] == 2 and used["train"]["epochs"] == 1
    assert used["train"]["lr"] == 0.003 and used["model"]["pooling"] == "max"
    assert "ignored thesis key(s) that configure nothing in posattn: channels_last" in capsys.readouterr().err

    # a key that is neither posattn's nor the thesis' fails the run instead of being dropped
    sweep_values["modle.depth"] = 3
    assert cli_helpers.main([*TINY, f"-Dout_dir={tmp_path}", "-mode=sweep_agent", "--sweep_id=x", "-count=1"]) == 2
    assert "unknown config key 'modle.depth'" in capsys.readouterr().err


def test_sweep_mode_checks_the_file_and_sends_it_unchanged(tmp_path, monkeypatch, capsys):
    import wandb

    created = []
    monkeypatch.setattr(wandb, "sweep", lambda sweep, **kw: created.append(sweep) or "abc123")
    assert cli_helpers.main([f"-Dout_dir={tmp_path}", "-mode=sweep", "--sweep_config=thesis_keys_quick"]) == 0
    assert created[0]["metric"] == {"goal": "maximize", "name": "val/acc.max"}
    assert "learning_rate" in created[0]["parameters"]
    assert "--sweep_id=abc123" in capsys.readouterr().out
    bad = tmp_path / "bad.yml"
    bad.write_text("method: grid\nmetric: {name: val/acc}\nparameters:\n  num_layer: {value: 2}\n")
    assert cli_helpers.main([f"-Dout_dir={tmp_path}", "-mode=sweep", f"--sweep_config={bad}"]) == 2
    assert len(created) == 1 and "did you mean num_layers" in capsys.readouterr().err


@pytest.mark.parametrize("pe", ["algebraic_seq", "algebraic_grid", "rope"])
def test_cli_trains_with_algebraic_encodings(tmp_path, pe):
    assert run(tmp_path, f"-Dpositional_encoding={pe}", "-Dtrain.epochs=1", f"-Dname={pe}") == 0
    summary = json.loads((tmp_path / pe / "summary.json").read_text())
    assert 0.0 <= summary["test/acc"] <= 1.0


VARRES = ["-Ddata.resolution=variable", "-Ddata.min_side=12", "-Ddata.max_side=28", "-Dmodel.patch_size=4"]


def test_variable_resolution_trains_resumes_and_tests(tmp_path, capsys):
    """-Ddata.resolution=variable: images at their own sizes, packed (issue 62). It trains, logs
    and tests; a resumed run ends with the same weights; -mode=test finds the same accuracy (the
    test images get the same sizes again)."""
    assert run(tmp_path, "-Dname=v", *VARRES) == 0
    d = tmp_path / "v"
    summary = json.loads((d / "summary.json").read_text())
    assert 0.0 <= summary["test/acc"] <= 1.0
    lines = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in lines if "epoch" in m] == [1, 2]
    capsys.readouterr()
    assert cli_helpers.main([f"-Dout_dir={tmp_path}", "-Dname=v", "-mode=test"]) == 0
    assert f"{summary['test/acc']:.4f}" in capsys.readouterr().out
    cfg = load_config([*[a[2:] for a in TINY + VARRES], f"out_dir={tmp_path / 'split'}", "no_wandb=true", "name=v"])
    runs.train(cfg, epoch_callback=lambda epoch, metrics: epoch == 1, progress=False)
    assert cli_helpers.main([f"-Dout_dir={tmp_path / 'split'}", "-Dname=v", "--resume"]) == 0
    a = torch.load(d / "last.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "split" / "v" / "last.pt", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    # benchmarks/varres_cross_eval.py: the run at both resolutions, its own as in the summary
    import importlib

    capsys.readouterr()
    importlib.import_module("varres_cross_eval").main([str(d)])
    row = capsys.readouterr().out.splitlines()[-1]
    assert row.startswith("| v | variable |") and row.endswith(f"| {summary['test/acc']:.4f} |"), row


@pytest.mark.parametrize(
    "args,match",
    [
        (["-Dpositional_encoding=abs_sinusoidal"], "packed grids need attention='relpos'"),
        (["-Dmodel.pooling=cls"], "pooling 'cls' is not supported"),
        (["-Ddata.min_side=2"], "model.patch_size <= data.min_side <= data.max_side"),
        (["-Ddata.token_budget=20"], "data.token_budget = 20 is smaller than the largest image's 49 tokens"),
        (["-Ddata.resolution=native"], "data.resolution must be one of"),
    ],
)
def test_variable_resolution_bad_settings(tmp_path, capsys, args, match):
    assert run(tmp_path, *VARRES, *args) != 0
    captured = capsys.readouterr()
    assert re.search(match, captured.out + captured.err), captured.out[-2000:] + captured.err[-2000:]
