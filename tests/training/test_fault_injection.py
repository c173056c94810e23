"""Training survives `kill -9` at any point of its file writes, and damaged
checkpoints: a killed run, resumed, ends bitwise equal to an uninterrupted one
(weights, optimizer, best checkpoint, each epoch's metrics exactly once)."""

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys

import helpers.cli as cli_helpers
import pytest
import torch
from helpers.cli import ROOT

from posattn.training.checkpoints import MANIFEST, CheckpointStore
from posattn.training.data import DEBIAN_FASHION

pytestmark = pytest.mark.skipif(
    not os.path.exists(os.path.join(DEBIAN_FASHION, "train-images-idx3-ubyte.gz")),
    reason="needs the Debian package dataset-fashion-mnist (installed by scripts/setup.sh)",
)

HARNESS = os.path.join(ROOT, "tests", "training", "fault_inject.py")
# the worker imports the tests' helpers, as pytest does (tests/ on the path)
WORKER_ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [os.path.join(ROOT, "tests"), os.environ.get("PYTHONPATH")])),
}
# One thread: the CPU kernels' sums are then in one order, so runs are bitwise reproducible.
TINY = [
    "-Ddata.small_dataset=64",
    "-Dmodel.depth=1",
    "-Dmodel.dim=16",
    "-Dmodel.heads=2",
    "-Dmodel.ffn_dim=16",
    "-Dpe.hidden_dim=8",
    "-Dtrain.batch_size=32",
    "-Dtrain.warmup_steps=2",
    "-Dtrain.epochs=2",
    "-Dnum_threads=1",
    "-Dseed=3",
    "-no_wandb=T",
    "-Dname=run",
]
TIMING = ("time/", "train_seconds", "per_sample_ms")  # wall-clock values differ between runs


def harness(point, n, out_dir):
    return subprocess.Popen(
        [sys.executable, HARNESS, point, str(n), "--", *TINY, f"-Dout_dir={out_dir}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env=WORKER_ENV,
    )


def resume(run_dir) -> int:
    threads = torch.get_num_threads()
    try:
        # the command of the run again, with --resume (its config counts only if the run left none)
        return cli_helpers.main([*TINY, f"--resume={run_dir}"])
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run, and how many of each write event it makes."""
    out = tmp_path_factory.mktemp("reference")
    proc = harness("count", 0, out)
    stdout, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, stdout
    return out / "run", json.loads(stdout.strip().splitlines()[-1])


def _untimed(row: dict) -> dict:
    return {k: v for k, v in row.items() if not any(k.startswith(t) or k.endswith(t) for t in TIMING)}


def _metrics(run_dir):
    return [_untimed(json.loads(line)) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_same_run(run_dir, ref_dir):
    for tag in ("last", "best"):
        a = torch.load(ref_dir / f"{tag}.pt", weights_only=False)
        b = torch.load(run_dir / f"{tag}.pt", weights_only=False)
        assert (a["epoch"], a["step"], a["best_val_acc"]) == (b["epoch"], b["step"], b["best_val_acc"]), tag
        for key, value in a["model"].items():
            assert torch.equal(value, b["model"][key]), f"{tag}.pt model {key}"
        for pa, pb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
            for key in pa:
                assert torch.equal(pa[key], pb[key]), f"{tag}.pt optimizer {key}"
    assert _metrics(run_dir) == _metrics(ref_dir)  # each epoch's line (and the test line) exactly once
    summary = _untimed(json.loads((run_dir / "summary.json").read_text()))
    assert summary == _untimed(json.loads((ref_dir / "summary.json").read_text()))
    assert not list(run_dir.glob(".tmp-*")), "temporary files of killed writes are cleaned up"
    store = CheckpointStore(str(run_dir))
    for tag in ("last", "best"):
        store.load(tag)  # listed in the manifest with its hash


def kill_points(counts):
    """Every distinct state a kill can leave: before each rename (after the
    previous one, and after anything written in between), after the last one,
    after each metrics line, and after a temporary checkpoint file is complete."""
    points = [("before-replace", n) for n in range(1, counts["replace"] + 1)]
    points.append(("after-replace", counts["replace"]))
    points += [("after-log", n) for n in range(1, counts["log"] + 1)]
    # every write fsyncs its file, then the folder: 5 is the manifest naming best.pt's two hashes, 7 best.pt
    points += [("after-fsync", 5), ("after-fsync", 7)]
    return points


def test_a_kill_at_any_write_resumes_to_the_same_run(reference, tmp_path):
    ref_dir, counts = reference
    points = kill_points(counts)
    assert len(points) >= 15 and counts["log"] == 3  # 2 epochs + the test line
    procs = {}
    pending = list(points)
    results = {}
    while pending or procs:  # two killed runs at a time (one thread each)
        while pending and len(procs) < 2:
            point = pending.pop(0)
            procs[point] = harness(*point, tmp_path / f"{point[0]}-{point[1]}")
        point, proc = next(iter(procs.items()))
        stdout, _ = proc.communicate(timeout=300)
        results[point] = (proc.returncode, stdout)
        del procs[point]
    for point in points:
        code, stdout = results[point]
        assert code == -signal.SIGKILL, f"{point}: the run was not killed (exit {code}):\n{stdout[-2000:]}"
        run_dir = tmp_path / f"{point[0]}-{point[1]}" / "run"
        if point == ("after-fsync", 7):  # killed between best.pt's temporary file and its rename
            assert list(run_dir.glob(".tmp-*.pt")), "the kill point is where it is meant to be"
        assert resume(run_dir) == 0, point
        assert_same_run(run_dir, ref_dir)


def _copy_reference(reference, tmp_path):
    ref_dir, _ = reference
    run_dir = tmp_path / "run"
    shutil.copytree(ref_dir, run_dir)
    return run_dir


@pytest.fixture(scope="module")
def epoch1(tmp_path_factory):
    """The reference run killed in epoch 2, as its metrics line is written: last.pt
    and best.pt hold epoch 1."""
    out = tmp_path_factory.mktemp("epoch1")
    proc = harness("after-log", 2, out)
    proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL
    return out / "run"


@pytest.fixture
def epoch1_run(epoch1, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(epoch1, run_dir)
    return run_dir


DAMAGE = {
    "truncated": lambda data: data[: len(data) // 2],
    "empty": lambda data: b"",
    "random bytes": lambda data: random.Random(0).randbytes(len(data)),
    "one flipped byte": lambda data: data[:1000] + bytes([data[1000] ^ 1]) + data[1001:],
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_last_checkpoint_falls_back_to_best(reference, epoch1_run, damage, capsys):
    run_dir = epoch1_run
    last = run_dir / "last.pt"
    last.write_bytes(DAMAGE[damage](last.read_bytes()))
    assert resume(run_dir) == 0
    out = capsys.readouterr().out
    assert "last.pt is" in out and ("damaged" in out or "not a readable" in out)
    assert "continuing from best.pt (epoch 1)" in out
    assert_same_run(run_dir, reference[0])


def test_a_checkpoint_of_other_content_is_refused(reference, epoch1_run, capsys):
    run_dir = epoch1_run
    torch.save({"weights": torch.zeros(3)}, run_dir / "last.pt")
    manifest = json.loads((run_dir / MANIFEST).read_text())
    # even when the manifest vouches for it
    manifest["checkpoints"]["last"]["sha256"] = [hashlib.sha256((run_dir / "last.pt").read_bytes()).hexdigest()]
    (run_dir / MANIFEST).write_text(json.dumps(manifest))
    assert resume(run_dir) == 0
    assert "is not a posattn checkpoint (it lacks model, optimizer" in capsys.readouterr().out
    assert_same_run(run_dir, reference[0])


def test_no_intact_checkpoint_starts_over_from_the_saved_config(reference, epoch1_run, capsys):
    run_dir = epoch1_run
    for tag in ("last", "best"):
        (run_dir / f"{tag}.pt").write_bytes(b"garbage")
    assert resume(run_dir) == 0
    assert "the run starts over from its saved config" in capsys.readouterr().out
    assert_same_run(run_dir, reference[0])


def test_a_damaged_manifest_is_a_clear_error(reference, tmp_path, capsys):
    run_dir = _copy_reference(reference, tmp_path)
    (run_dir / MANIFEST).write_text("{ not json")
    assert cli_helpers.main([f"--resume={run_dir}"]) == 2
    assert f"{MANIFEST} is damaged" in capsys.readouterr().err


def test_resuming_a_finished_run_changes_nothing(reference, tmp_path):
    run_dir = _copy_reference(reference, tmp_path)
    assert resume(run_dir) == 0
    assert_same_run(run_dir, reference[0])  # the test line is not duplicated


def test_test_mode_refuses_damaged_and_foreign_checkpoints(reference, tmp_path, capsys):
    run_dir = _copy_reference(reference, tmp_path)
    best = run_dir / "best.pt"
    best.write_bytes(DAMAGE["one flipped byte"](best.read_bytes()))
    assert cli_helpers.main(["-mode=test", f"-Dcheckpoint={best}"]) == 2
    assert "best.pt is damaged: its SHA-256" in capsys.readouterr().err
    text = tmp_path / "notes.pt"
    text.write_text("hello")
    assert cli_helpers.main(["-mode=test", f"-Dcheckpoint={text}"]) == 2
    assert "notes.pt is not a readable posattn checkpoint" in capsys.readouterr().err
    assert cli_helpers.main(["-mode=test", f"-Dcheckpoint={run_dir / 'last.pt'}"]) == 0


def test_a_best_checkpoint_damaged_after_training_still_finishes(reference, tmp_path, capsys):
    run_dir = _copy_reference(reference, tmp_path)
    (run_dir / "best.pt").write_bytes(b"")
    (run_dir / "summary.json").unlink()
    assert resume(run_dir) == 0
    out = capsys.readouterr().out
    assert "warning:" in out and "best.pt" in out and "the last epoch's model" in out
    assert (run_dir / "summary.json").exists()
