"""The experiment CLI behind ``python cmd/main.py`` (see ``main --help``)."""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import sys
import time
from typing import Optional

import torch
import yaml

from .config import DEFAULT_CONFIG, ConfigError, flatten, load_config, set_key
from .data import DataError, load_splits
from .tracking import Tracker
from .train import Distributed, Trainer, build_model, resolve_device, set_seed

MODES = ("train", "test", "sweep", "sweep_agent", "local_sweep", "shift_test", "scaling")

USAGE_EPILOG = """examples:
  python cmd/main.py                                   # quick Fashion-MNIST run (default config)
  python cmd/main.py -Dtrain.epochs=10 -Dspan.enabled=true -Dspan.threshold=0.1 -no_wandb=T
  python cmd/main.py --config experiments/thesis/2d_siren_span.yml -Dname=my-run
  python cmd/main.py -mode=test -Dname=my-run          # evaluate runs/my-run/best.pt on the test split
  python cmd/main.py --resume -Dname=my-run            # continue runs/my-run from last.pt
  python cmd/main.py -mode=local_sweep --sweep_config=experiments/sweeps/thesis_2d_span.yml
  python cmd/main.py -mode=sweep --sweep_config=experiments/sweeps/thesis_2d_span.yml   # W&B server needed
  python cmd/main.py -mode=sweep_agent --sweep_id=ENTITY/PROJECT/ID -count=5
  python cmd/main.py -mode=shift_test -Dname=my-run    # accuracy per horizontal shift (Horn et al.)
  python cmd/main.py -mode=scaling -Dscaling.out=runs/scaling   # cost and gradients vs N and depth (plots, CSV)
  python cmd/main.py -mode=scaling -Dscaling.quick=true          # the same on tiny sizes, in seconds
"""


class CliError(Exception):
    """Bad command-line input: printed with the usage, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse exits 2 too; keep its format
        self.print_usage(sys.stderr)
        raise CliError(message)


def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="cmd/main.py", description="posattn experiments: train, evaluate and sweep positional "
                "self-attention models. Defaults: cmd/config.yml.", epilog=USAGE_EPILOG,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-mode", "--mode", choices=MODES, help="what to do (default: the config's mode, train)")
    p.add_argument("-D", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, dot keys for nested ones (-Dpe.hidden_dim=32)")
    p.add_argument("--config", help="YAML file applied over the defaults (e.g. an experiment file)")
    p.add_argument("-no_wandb", "--no_wandb", metavar="T|F", help="T: no Weights & Biases; F: use it")
    p.add_argument("--resume", nargs="?", const="", metavar="RUN_DIR",
                   help="continue a run from its last.pt (the run of -Dname, or RUN_DIR)")
    p.add_argument("--sweep_config", help="sweep YAML (experiments/sweeps/*.yml) for -mode=sweep / local_sweep")
    p.add_argument("--sweep_id", help="W&B sweep id for -mode=sweep_agent")
    p.add_argument("-count", "--count", type=int, help="at most this many sweep runs")
    p.add_argument("--defaults", default=DEFAULT_CONFIG, help=argparse.SUPPRESS)
    p.add_argument("assignments", nargs="*", metavar="KEY=VALUE",
                   help="the same as -DKEY=VALUE (the form `wandb agent` passes with ${args_no_hyphens})")
    return p


def resolve(args) -> dict:
    for item in args.assignments:
        if "=" not in item:
            raise CliError(f"unexpected argument {item!r} (overrides are -DKEY=VALUE or KEY=VALUE)")
    cfg = load_config(args.config, list(args.overrides) + list(args.assignments), args.defaults)
    flat = defaults_flat(args)
    if args.mode:
        cfg["mode"] = args.mode
    if args.no_wandb is not None:
        set_key(cfg, flat, "no_wandb", args.no_wandb)
    if args.count is not None:
        set_key(cfg, flat, "sweep.count", args.count)
    if cfg["mode"] not in MODES:
        raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {cfg['mode']!r}")
    return cfg


def defaults_flat(args) -> dict:
    return flatten(load_config(None, (), args.defaults))


def run_name(cfg: dict) -> str:
    if cfg.get("name"):
        return str(cfg["name"])
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{cfg['data']['name']}-{cfg['positional_encoding']}-{stamp}"


def print_table(title: str, rows: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    vwidth = max(len(v) for _, v in rows)
    line = "+" + "-" * (width + 2) + "+" + "-" * (vwidth + 2) + "+"
    print(f"\n{title}\n{line}")
    for k, v in rows:
        print(f"| {k:<{width}} | {v:>{vwidth}} |")
    print(line, flush=True)


def load_data(cfg: dict):
    d = cfg["data"]
    return load_splits(d["name"], d["root"], float(d["val_fraction"]), int(cfg["seed"]), int(d["small_dataset"]),
                       int(d["pad_to"]), bool(d["sequential"]))


def train(cfg: dict, resume: Optional[str] = None, tracker_run=None, epoch_callback=None, progress=True,
          resume_overrides: tuple = (), defaults: Optional[dict] = None) -> dict:
    """Trains one configuration; returns the summary (also saved as summary.json).

    ``resume``: "" (the run named by cfg["name"]) or a run folder; the run goes on
    with its saved config, with ``resume_overrides`` (KEY=VALUE) applied over it
    (e.g. more epochs)."""
    dist = Distributed()
    device = dist.device(resolve_device(cfg["device"]))
    dist.init(device)
    if cfg["num_threads"]:
        torch.set_num_threads(int(cfg["num_threads"]))
    if resume is not None:
        run_dir = resume if resume else os.path.join(cfg["out_dir"], run_name(cfg))
        last = os.path.join(run_dir, "last.pt")
        if not os.path.exists(last):
            raise ConfigError(f"--resume: {last} does not exist (name the run with -Dname=... or pass its folder)")
        saved = torch.load(last, map_location="cpu", weights_only=False)
        cfg = saved["config"]
        for item in resume_overrides:
            key, raw = item.split("=", 1)
            set_key(cfg, defaults or flatten(cfg), key.strip(), raw)
        cfg["name"] = os.path.basename(os.path.normpath(run_dir))
    else:
        cfg["name"] = run_name(cfg)
        run_dir = os.path.join(cfg["out_dir"], cfg["name"])
        saved = None
    set_seed(int(cfg["seed"]) + dist.rank)
    splits = load_data(cfg)
    model = build_model(cfg, splits)
    if dist.is_main:
        os.makedirs(run_dir, exist_ok=True)
        print("resolved config:\n" + yaml.safe_dump(cfg, sort_keys=False).rstrip(), flush=True)
        with open(os.path.join(run_dir, "config.yml"), "w") as f:
            yaml.safe_dump(cfg, f, sort_keys=False)
        print(f"data: {splits.describe()}\nmodel: {model.num_parameters():,} parameters, device {device}, "
              f"run folder {run_dir}", flush=True)
    tracker = Tracker(run_dir, enabled=not cfg["no_wandb"], is_main=dist.is_main)
    tracker.start(dict(cfg, num_parameters=model.num_parameters()), cfg["name"], reuse_run=tracker_run)
    trainer = Trainer(cfg, splits, model, device, run_dir, tracker, dist, progress=progress)
    if saved is not None:
        trainer.load_state(saved)
        print(f"resumed {run_dir} after epoch {trainer.epoch}", flush=True)
    start = time.perf_counter()
    result = trainer.fit(epoch_callback)
    # test metrics of the best checkpoint
    best = torch.load(trainer.checkpoint_path("best"), map_location="cpu", weights_only=False)
    trainer.module.load_state_dict(best["model"])
    test = trainer.evaluate(*splits.test)
    summary = {
        "name": cfg["name"], "best_val_acc": result["best_val_acc"], "best_epoch": best["epoch"],
        "test/acc": test["acc"], "test/loss": test["loss"], "num_parameters": model.num_parameters(),
        "epochs": trainer.epoch, "train_seconds": time.perf_counter() - start,
        "per_sample_ms": result["history"][-1]["time/per_sample_ms"] if result["history"] else float("nan"),
    }
    if dist.is_main:
        tracker.log({"test/acc": test["acc"], "test/loss": test["loss"]}, step=trainer.epoch)
        tracker.summary({**summary, "val/best_acc": result["best_val_acc"]})
        with open(os.path.join(run_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        print_table(f"final metrics ({cfg['name']})", [
            ("best val accuracy", f"{summary['best_val_acc']:.4f} (epoch {summary['best_epoch']})"),
            ("test accuracy (best checkpoint)", f"{summary['test/acc']:.4f}"),
            ("test loss", f"{summary['test/loss']:.4f}"),
            ("parameters", f"{summary['num_parameters']:,}"),
            ("epochs", str(summary["epochs"])),
            ("training time", f"{summary['train_seconds']:.1f} s"),
            ("time per training sample", f"{summary['per_sample_ms']:.2f} ms"),
        ])
    if tracker_run is None:
        tracker.finish()
    summary["history"] = result["history"]
    return summary


def checkpoint_file(cfg: dict) -> str:
    choice = str(cfg["checkpoint"])
    if choice in ("best", "last"):
        if not cfg.get("name"):
            raise ConfigError(f"-mode={cfg['mode']} needs the run: -Dname=<run name> (a folder in {cfg['out_dir']}) "
                              "or -Dcheckpoint=<path to a .pt file>")
        path = os.path.join(cfg["out_dir"], str(cfg["name"]), f"{choice}.pt")
    else:
        path = choice
    if not os.path.exists(path):
        raise ConfigError(f"checkpoint {path} does not exist")
    return path


def load_trained(cfg: dict):
    """(run config, model with the checkpoint's weights, splits, device) for test modes."""
    path = checkpoint_file(cfg)
    saved = torch.load(path, map_location="cpu", weights_only=False)
    run_cfg = copy.deepcopy(saved["config"])
    splits = load_data(run_cfg)
    model = build_model(run_cfg, splits)
    model.load_state_dict(saved["model"])
    device = resolve_device(cfg["device"])
    return run_cfg, model.to(device).eval(), splits, device, path


def test(cfg: dict) -> dict:
    run_cfg, model, splits, device, path = load_trained(cfg)
    tracker = Tracker(os.path.dirname(path), enabled=False)
    trainer = Trainer(run_cfg, splits, model, device, os.path.dirname(path), tracker, progress=False)
    result = trainer.evaluate(*splits.test)
    print_table(f"test split of {run_cfg['data']['name']} ({path})",
                [("test accuracy", f"{result['acc']:.4f}"), ("test loss", f"{result['loss']:.4f}"),
                 ("test images", str(len(splits.test[1])))])
    return result


def scaling(cfg: dict, argv: Optional[list[str]] = None) -> dict:
    """-mode=scaling: the scaling study of posattn.experiment.scaling with cfg["scaling"]."""
    from .scaling import QUICK, ScalingConfig, run_study

    values = dict(cfg["scaling"])
    if values.pop("quick", False):
        values.update(QUICK)
    values["device"] = str(resolve_device(cfg["device"]))
    values["threads"] = int(cfg["num_threads"])
    try:
        study = ScalingConfig.from_dict(values)
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from e
    command = "python cmd/main.py " + " ".join(argv if argv is not None else sys.argv[1:])
    return run_study(study, command=command.strip())


def main(argv: Optional[list[str]] = None) -> int:
    parser = make_parser()
    try:
        args = parser.parse_args(argv)
        cfg = resolve(args)
        mode = cfg["mode"]
        if mode == "train":
            train(cfg, resume=args.resume, resume_overrides=tuple(args.overrides) + tuple(args.assignments),
                  defaults=defaults_flat(args))
        elif mode == "test":
            test(cfg)
        elif mode == "scaling":
            scaling(cfg, argv)
        elif mode == "shift_test":
            from .shift import shift_test

            shift_test(cfg, load_trained)
        else:
            from . import sweep

            if mode == "local_sweep":
                sweep.local_sweep(cfg, args.sweep_config, train, defaults_flat(args))
            elif mode == "sweep":
                sweep.create_sweep(args.sweep_config)
            else:
                sweep.run_agent(cfg, args.sweep_id, train, defaults_flat(args))
    except CliError as e:
        print(f"cmd/main.py: error: {e}", file=sys.stderr)
        return 2
    except ConfigError as e:
        print(f"cmd/main.py: error: {e}", file=sys.stderr)
        return 2
    except DataError as e:
        print(f"cmd/main.py: data error: {e}", file=sys.stderr)
        return 1
    except ValueError as e:  # bad model/training settings found while building
        print(f"cmd/main.py: error: {e}", file=sys.stderr)
        return 2
    return 0
