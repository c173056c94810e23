"""The experiment CLI behind ``python cmd/main.py``: parses the command line and
runs the mode. ``cmd/main.py`` passes its defaults file and sweep folder, so the
package never looks for files of the repository."""

from __future__ import annotations

import argparse
import sys
from typing import Iterable, Optional

from . import runs, sweep
from .config import ConfigError, dump_config, flatten, load_config, load_yaml, mode_view, set_key
from .data import DataError
from .scaling import run_study, scaling_config, scaling_defaults, scaling_section
from .shift import shift_test
from .train import Distributed, apply_model_variant, resolve_device
from .validate import check_output_folders, check_values

MODES = ("train", "test", "sweep", "sweep_agent", "local_sweep", "shift_test", "scaling")

USAGE_EPILOG = """examples:
  python cmd/main.py                                   # quick Fashion-MNIST run (default config)
  python cmd/main.py -Dlearning_rate=0.05              # thesis key names work too (docs/reference/thesis_keys.md)
  python cmd/main.py -Dtrain.epochs=10 -Dspan.enabled=true -Dspan.threshold=0.1 -no_wandb=T
  python cmd/main.py --config experiments/thesis_config.yml -Ddataset=fashion_mnist -Dinput_dim=1
  python cmd/main.py -mode=test -Dname=my-run          # evaluate runs/my-run/best.pt on the test split
  python cmd/main.py --resume -Dname=my-run            # continue runs/my-run from last.pt
  python cmd/main.py -mode=local_sweep --sweep_config=experiments/sweeps/thesis_2d_siren_span.yml
  python cmd/main.py -mode=local_sweep --sweep_config=quick_encodings   # a sweep of experiments/sweeps by name
  python cmd/main.py -mode=sweep --sweep_config=thesis_2d_siren_span    # on a W&B server (credentials needed)
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
    p = _Parser(
        prog="cmd/main.py",
        description="posattn experiments: train, evaluate and sweep positional "
        "self-attention models. Defaults: cmd/config.yml.",
        epilog=USAGE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-mode", "--mode", choices=MODES, help="what to do (default: the config's mode, train)")
    p.add_argument(
        "-D",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, dot keys for nested ones (-Dpe.hidden_dim=32); the thesis' key "
        "names are accepted too (-Dlearning_rate=0.05)",
    )
    p.add_argument("--config", help="YAML file applied over the defaults (posattn's keys or the thesis')")
    p.add_argument("-no_wandb", "--no_wandb", metavar="T|F", help="T: no Weights & Biases; F: use it")
    p.add_argument(
        "--resume",
        nargs="?",
        const="",
        metavar="RUN_DIR",
        help="continue a run from its last.pt (the run of -Dname, or RUN_DIR)",
    )
    p.add_argument(
        "--sweep_config", help="sweep YAML (a path, or a name in experiments/sweeps/) for -mode=sweep / local_sweep"
    )
    p.add_argument("-sid", "--sweep_id", help="W&B sweep id for -mode=sweep_agent")
    p.add_argument("-count", "--count", type=int, help="at most this many sweep runs")
    p.add_argument(
        "assignments",
        nargs="*",
        metavar="KEY=VALUE",
        help="the same as -DKEY=VALUE (the form `wandb agent` passes with ${args_no_hyphens})",
    )
    return p


def load_defaults(path: str) -> dict:
    """The defaults file, plus the scaling study's settings (stated once, in ScalingConfig)."""
    defaults = load_yaml(path)
    defaults["scaling"] = {**scaling_defaults(), **(defaults.get("scaling") or {})}
    return defaults


def resolve(args, defaults: dict, explicit: Optional[set] = None) -> dict:
    """The config of the command line; ``explicit`` (if given) receives the keys it sets."""
    for item in args.assignments:
        if "=" not in item:
            raise CliError(f"unexpected argument {item!r} (overrides are -DKEY=VALUE or KEY=VALUE)")
    cfg = load_config(defaults, args.config, list(args.overrides) + list(args.assignments), explicit)
    flat = flatten(defaults)
    if args.mode:
        cfg["mode"] = args.mode
    if args.no_wandb is not None:
        set_key(cfg, flat, "no_wandb", args.no_wandb)
    if args.count is not None:
        set_key(cfg, flat, "sweep.count", args.count)
    if cfg["mode"] not in MODES:
        raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {cfg['mode']!r}")
    return cfg


def scaling(cfg: dict, argv: Optional[list[str]] = None, explicit: Iterable[str] = ()) -> dict:
    """-mode=scaling: the scaling study with cfg["scaling"]; the ``explicit`` keys
    (scaling.<field>) keep their values under scaling.quick."""
    top = {"device": str(resolve_device(cfg["device"])), "num_threads": int(cfg["num_threads"] or 0)}
    given = [k.split(".", 1)[1] for k in explicit if k.startswith("scaling.")]
    try:
        study = scaling_config(cfg["scaling"], top, given)
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from e
    effective = dict(scaling_section(study), quick=cfg["scaling"]["quick"])  # with quick's sizes applied
    print("resolved config:\n" + dump_config(mode_view(dict(cfg, scaling=effective))).rstrip(), flush=True)
    command = "python cmd/main.py " + " ".join(argv if argv is not None else sys.argv[1:])
    return run_study(study, command=command.strip())


def dispatch(
    args, cfg: dict, defaults: dict, sweep_dir: Optional[str], argv: Optional[list[str]], explicit: Iterable[str] = ()
) -> None:
    mode = cfg["mode"]
    if mode == "train":
        runs.train(
            cfg,
            resume=args.resume,
            resume_overrides=tuple(args.overrides) + tuple(args.assignments),
            defaults=flatten(defaults),
        )
    elif mode == "test":
        runs.test(cfg)
    elif mode == "scaling":
        scaling(cfg, argv, explicit)
    elif mode == "shift_test":
        shift_test(cfg)
    elif mode == "local_sweep":
        sweep.local_sweep(cfg, args.sweep_config, flatten(defaults), sweep_dir, given=explicit)
    elif mode == "sweep":
        sweep.create_sweep(args.sweep_config, flatten(defaults), sweep_dir)
    else:
        sweep.run_agent(cfg, args.sweep_id, flatten(defaults), given=explicit)


def main(argv: Optional[list[str]] = None, *, defaults_file: str, sweep_dir: Optional[str] = None) -> int:
    """Runs ``cmd/main.py``'s command line ``argv`` with the defaults in ``defaults_file``;
    sweep files are also looked up by name in ``sweep_dir``. Returns the exit status:
    0, 1 (data not found or unreadable) or 2 (bad command line or configuration)."""
    parser = make_parser()
    try:
        args = parser.parse_args(argv)
        defaults = load_defaults(defaults_file)
        explicit: set = set()
        cfg = resolve(args, defaults, explicit)
        check_values(cfg)
        apply_model_variant(cfg, explicit)
        check_output_folders(cfg, args.resume)
        dispatch(args, cfg, defaults, sweep_dir, argv, explicit)
        # under torchrun every rank ends the group before it exits (pytorch#190489); only on
        # success: after a failure another rank may still wait in a collective (a deadlock)
        Distributed.close()
    except (CliError, ConfigError) as e:
        print(f"cmd/main.py: error: {e}", file=sys.stderr)
        return 2
    except DataError as e:
        print(f"cmd/main.py: data error: {e}", file=sys.stderr)
        return 1
    except ValueError as e:  # bad model/training settings found while building
        print(f"cmd/main.py: error: {e}", file=sys.stderr)
        return 2
    return 0
