"""Scaling study: runtime and peak memory of one training step vs tokens
(1-D 64 ... 4096, 2-D 8x8 ... 64x64) and vs depth (2 ... 64), fitted growth
exponents, and mean |grad| vs depth with and without residuals and LayerNorm.
Writes CSVs, PNG plots and summary.md (see posattn/training/scaling/).

Usage:
  python experiments/scaling.py                          # the full study, into runs/scaling
  python experiments/scaling.py --quick --out /tmp/s     # tiny sizes, a few seconds
  python experiments/scaling.py --studies length grid --methods relpos relpos_span1 sdpa
  python experiments/scaling.py --device cuda --out runs/scaling_gpu

Every ScalingConfig field is a flag (--lengths 64 128, --max-step-seconds 60, ...).
The same study: python cmd/main.py -mode=scaling (settings as -Dscaling.<field>=...).
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import typing

from posattn.training.scaling import METHODS, QUICK, ScalingConfig, run_study


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run); other flags still apply")
    hints = typing.get_type_hints(ScalingConfig)
    for f in dataclasses.fields(ScalingConfig):
        flag = "--" + f.name.replace("_", "-")
        kind = hints[f.name]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if kind is list:
            item = str if f.name in ("methods", "studies") else int
            choices = list(METHODS) if f.name == "methods" else None
            p.add_argument(
                flag,
                dest=f.name,
                nargs="+",
                type=item,
                choices=choices,
                default=None,
                help=f"default: {' '.join(map(str, default))}",
            )
        else:
            p.add_argument(flag, dest=f.name, type=kind, default=None, help=f"default: {default}")
    return p


def main(argv=None) -> int:
    args = make_parser().parse_args(argv)
    values = dict(QUICK) if args.quick else {}
    values.update({k: v for k, v in vars(args).items() if k != "quick" and v is not None})
    try:
        cfg = ScalingConfig.from_dict(values)
    except ValueError as e:
        print(f"experiments/scaling.py: error: {e}", file=sys.stderr)
        return 2
    command = "python experiments/scaling.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    run_study(cfg, command=command.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
