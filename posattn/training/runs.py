"""One run of the experiment CLI: train a configuration (or resume it), and load
or evaluate its checkpoints. The sweep and shift-test modes build on these."""

from __future__ import annotations

import copy
import datetime
import json
import os
import secrets
import time
from typing import Callable, Optional

import torch

from .checkpoints import MANIFEST, CheckpointError, CheckpointStore, load_checkpoint_file, write_atomic
from .config import ConfigError, dump_config, flatten, mode_view, set_key
from .data import Splits, load_splits
from .optional import require
from .report import print_table
from .tracking import Tracker
from .train import Distributed, Trainer, build_model, resolve_device, set_seed, upgrade_saved_config
from .validate import check_values

__all__ = ["run_name", "load_data", "train", "checkpoint_file", "load_trained", "test"]


def run_name(cfg: dict) -> str:
    if cfg.get("name"):
        return str(cfg["name"])
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{cfg['data']['name']}-{cfg['positional_encoding']}-{stamp}"


def load_data(cfg: dict) -> Splits:
    d = cfg["data"]
    return load_splits(
        d["name"],
        d["root"],
        float(d["val_fraction"]),
        int(cfg["seed"]),
        int(d["small_dataset"]),
        int(d["pad_to"]),
        bool(d["sequential"]),
    )


def _draw_seed(dist: Distributed) -> int:
    """A random seed (``seed: null``, the thesis' ``random_state: null``), the same on every rank."""
    seed = [secrets.randbelow(2**31)]
    if dist.active:
        torch.distributed.broadcast_object_list(seed, src=0)
    return seed[0]


def train(
    cfg: dict,
    resume: Optional[str] = None,
    tracker_run=None,
    epoch_callback: Optional[Callable[[int, dict], bool]] = None,
    progress: bool = True,
    resume_overrides: tuple = (),
    defaults: Optional[dict] = None,
) -> dict:
    """Trains one configuration; returns the summary (also saved as summary.json).

    ``resume``: "" (the run named by cfg["name"]) or a run folder; the run goes on
    with its saved config, with ``resume_overrides`` (KEY=VALUE) applied over it
    (e.g. more epochs). ``epoch_callback(epoch, metrics)`` returning True stops early."""
    if not cfg["no_wandb"] and tracker_run is None:
        require("wandb", "Weights & Biases logging", "pass -no_wandb=T to train without it")
    dist = Distributed()
    device = dist.device(resolve_device(cfg["device"]))
    dist.init(device)
    if cfg["num_threads"]:
        torch.set_num_threads(int(cfg["num_threads"]))
    saved = None
    if resume is not None:
        run_dir = resume if resume else os.path.join(cfg["out_dir"], run_name(cfg))
        cfg, saved = _resume_state(run_dir, cfg, resume_overrides, defaults)
    else:
        cfg = copy.deepcopy(cfg)
        cfg["name"] = run_name(cfg)
        run_dir = os.path.join(cfg["out_dir"], cfg["name"])
    if cfg["seed"] is None:
        cfg["seed"] = _draw_seed(dist)
    set_seed(int(cfg["seed"]) + dist.rank)
    splits = load_data(cfg)
    model = build_model(cfg, splits)
    store = CheckpointStore(run_dir)
    if dist.is_main:
        os.makedirs(run_dir, exist_ok=True)
        removed = store.clean()
        if removed:
            print(f"removed {len(removed)} temporary file(s) of interrupted writes from {run_dir}", flush=True)
        if resume is None and os.path.exists(store.path("last")):
            print(f"note: {run_dir} held an earlier run; this run replaces it (--resume continues a run)", flush=True)
        store.start(cfg, fresh=resume is None)
        print("resolved config:\n" + dump_config(mode_view(cfg)).rstrip(), flush=True)
        write_atomic(os.path.join(run_dir, "config.yml"), dump_config(cfg).encode())
        print(
            f"data: {splits.describe()}\nmodel: {model.num_parameters():,} parameters, device {device}, "
            f"run folder {run_dir}",
            flush=True,
        )
    tracker = Tracker(run_dir, enabled=not cfg["no_wandb"], is_main=dist.is_main)
    # metrics.jsonl holds each epoch once: lines past the resumed epoch (and the test line) go
    tracker.keep_epochs(saved["epoch"] if saved is not None else 0)
    tracker.start(dict(cfg, num_parameters=model.num_parameters()), cfg["name"], reuse_run=tracker_run)
    trainer = Trainer(cfg, splits, model, device, run_dir, tracker, dist, progress=progress, store=store)
    if saved is not None:
        trainer.load_state(saved)
        print(f"resumed {run_dir} after epoch {trainer.epoch}", flush=True)
    start = time.perf_counter()
    result = trainer.fit(epoch_callback)
    # test metrics of the best checkpoint
    try:
        best = store.load("best")
    except CheckpointError as e:  # damaged on disk after it was written: the last state stands in
        print(f"warning: {e}; the test metrics are those of the last epoch's model", flush=True)
        best = trainer.state()
    trainer.module.load_state_dict(best["model"])
    test_metrics = trainer.evaluate(*splits.test)
    summary = {
        "name": cfg["name"],
        "best_val_acc": result["best_val_acc"],
        "best_epoch": best["epoch"],
        "test/acc": test_metrics["acc"],
        "test/loss": test_metrics["loss"],
        "num_parameters": model.num_parameters(),
        "epochs": trainer.epoch,
        "train_seconds": time.perf_counter() - start,
        "per_sample_ms": result["history"][-1]["time/per_sample_ms"] if result["history"] else float("nan"),
    }
    if dist.is_main:
        tracker.log({"test/acc": test_metrics["acc"], "test/loss": test_metrics["loss"]}, step=trainer.epoch)
        tracker.summary({**summary, "val/best_acc": result["best_val_acc"]})
        write_atomic(os.path.join(run_dir, "summary.json"), json.dumps(summary, indent=2).encode())
        print_table(
            f"final metrics ({cfg['name']})",
            [
                ("best val accuracy", f"{summary['best_val_acc']:.4f} (epoch {summary['best_epoch']})"),
                ("test accuracy (best checkpoint)", f"{summary['test/acc']:.4f}"),
                ("test loss", f"{summary['test/loss']:.4f}"),
                ("parameters", f"{summary['num_parameters']:,}"),
                ("epochs", str(summary["epochs"])),
                ("training time", f"{summary['train_seconds']:.1f} s"),
                ("time per training sample", f"{summary['per_sample_ms']:.2f} ms"),
            ],
        )
    if tracker_run is None:
        tracker.finish()
    dist.barrier()  # no rank leaves (and ends the process group) while rank 0 still writes
    summary["history"] = result["history"]
    return summary


def _resume_state(run_dir: str, given: dict, overrides: tuple, defaults: Optional[dict]) -> tuple[dict, Optional[dict]]:
    """(config, training state) to resume ``run_dir`` from: the newest intact
    checkpoint, or, when none was written or survived, the run's saved config
    (the run starts over), or, when the run was killed before it saved even
    that, the ``given`` config of the command line."""
    if not os.path.isdir(run_dir):
        raise ConfigError(f"--resume: {run_dir} does not exist (name the run with -Dname=... or pass its folder)")
    store = CheckpointStore(run_dir)
    try:
        saved, tag = store.load_resumable()
        cfg = saved["config"] if saved is not None else store.config()
    except CheckpointError as e:
        raise ConfigError(f"--resume: {e}") from None
    if saved is None and cfg is None:
        print(
            f"resume: {run_dir} holds neither an intact checkpoint nor the run's {MANIFEST}; the run "
            "starts over with the config of this command line",
            flush=True,
        )
        cfg = given
    elif saved is None:
        print(f"resume: {run_dir} holds no intact checkpoint; the run starts over from its saved config", flush=True)
    elif tag != "last":
        print(f"resume: continuing from {tag}.pt (epoch {saved['epoch']}), the newest intact checkpoint", flush=True)
    cfg = upgrade_saved_config(copy.deepcopy(cfg))
    for item in overrides:
        key, raw = item.split("=", 1)
        if key.strip() == "model.variant" and raw.strip() != str(cfg["model"].get("variant")):
            raise ConfigError(
                "--resume: model.variant cannot change in a resumed run (its recipe set the "
                "model the checkpoints hold); start a new run instead"
            )
        set_key(cfg, defaults or flatten(cfg), key.strip(), raw)
    check_values(cfg)
    cfg["name"] = os.path.basename(os.path.normpath(run_dir))
    return cfg, saved


def checkpoint_file(cfg: dict) -> str:
    """The checkpoint ``-Dcheckpoint`` names: best / last of the run ``-Dname``, or a path."""
    choice = str(cfg["checkpoint"])
    if choice in ("best", "last"):
        if not cfg.get("name"):
            raise ConfigError(
                f"-mode={cfg['mode']} needs the run: -Dname=<run name> (a folder in {cfg['out_dir']}) "
                "or -Dcheckpoint=<path to a .pt file>"
            )
        path = os.path.join(cfg["out_dir"], str(cfg["name"]), f"{choice}.pt")
    else:
        path = choice
    if not os.path.exists(path):
        raise ConfigError(f"checkpoint {path} does not exist")
    return path


def load_trained(cfg: dict):
    """(run config, model with the checkpoint's weights, splits, device, checkpoint path)."""
    path = checkpoint_file(cfg)
    try:
        saved = load_checkpoint_file(path)
    except CheckpointError as e:
        raise ConfigError(f"-mode={cfg['mode']}: {e}") from None
    run_cfg = upgrade_saved_config(copy.deepcopy(saved["config"]))
    splits = load_data(run_cfg)
    model = build_model(run_cfg, splits)
    model.load_state_dict(saved["model"])
    device = resolve_device(cfg["device"])
    return run_cfg, model.to(device).eval(), splits, device, path


def test(cfg: dict) -> dict:
    """-mode=test: the checkpoint's loss and accuracy on the test split."""
    run_cfg, model, splits, device, path = load_trained(cfg)
    tracker = Tracker(os.path.dirname(path), enabled=False)
    trainer = Trainer(run_cfg, splits, model, device, os.path.dirname(path), tracker, progress=False)
    result = trainer.evaluate(*splits.test)
    print_table(
        f"test split of {run_cfg['data']['name']} ({path})",
        [
            ("test accuracy", f"{result['acc']:.4f}"),
            ("test loss", f"{result['loss']:.4f}"),
            ("test images", str(len(splits.test[1]))),
        ],
    )
    return result
