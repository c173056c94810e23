"""Test accuracy of trained runs at fixed and at variable resolution (the packed experiment).

Loads each run's best checkpoint (``RUN/best.pt``, written by ``cmd/main.py``) and evaluates it on
its test split twice: the images at their size (``data.resolution=fixed``) and at random sizes
packed as in ``-Ddata.resolution=variable`` (the same sizes for every run of the same seed and
data), whichever resolution the run trained at. Prints a markdown table.

Usage:
  python benchmarks/varres_cross_eval.py runs/fixed runs/variable
"""

from __future__ import annotations

import argparse
import copy
import os

import torch

from posattn.training import runs
from posattn.training.train import Trainer, build_model


class _NoTracker:
    def log(self, *args, **kwargs):
        pass


def cross_eval(run_dir: str) -> dict:
    """{resolution: test accuracy} of the run's best checkpoint."""
    path = os.path.join(run_dir, "best.pt")
    if not os.path.exists(path):
        raise SystemExit(f"varres_cross_eval: {path} not found (a run folder of cmd/main.py?)")
    state = torch.load(path, weights_only=False, map_location="cpu")
    out = {}
    for resolution in ("fixed", "variable"):
        cfg = copy.deepcopy(state["config"])
        cfg["data"]["resolution"] = resolution
        splits = runs.load_data(cfg)
        model = build_model(cfg, splits)
        model.load_state_dict(state["model"])
        trainer = Trainer(cfg, splits, model, torch.device("cpu"), run_dir, _NoTracker(), progress=False)
        out[resolution] = trainer.evaluate(*splits.test)["acc"]
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="run folders (each with best.pt)")
    args = p.parse_args(argv)
    print("| run | trained at | test at fixed size | test at variable sizes |")
    print("|---|---|---|---|")
    for run in args.runs:
        acc = cross_eval(run)
        trained = torch.load(os.path.join(run, "best.pt"), weights_only=False, map_location="cpu")["config"]["data"]
        print(
            f"| {os.path.basename(os.path.normpath(run))} | {trained.get('resolution', 'fixed')} | "
            f"{acc['fixed']:.4f} | {acc['variable']:.4f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
