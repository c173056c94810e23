"""Horn et al.'s shifted-image evaluation (-mode=shift_test): accuracy of a
trained model on test images of one class shifted horizontally by
-min_shift .. +min_shift pixels; writes a CSV and a plot. It uses the whole
test split of the dataset, also for runs trained on a subset."""

from __future__ import annotations

import os

import torch

from ..nn.favor import set_favor_kernel
from .config import ConfigError
from .data import full_test_split, shifted_images
from .report import pyplot, save_figure, write_csv
from .runs import load_trained

__all__ = ["shift_test"]


@torch.no_grad()
def shift_test(cfg: dict) -> dict:
    """Accuracy per horizontal shift of the checkpoint ``cfg`` names (-Dname, -Dcheckpoint)."""
    run_cfg, model, splits, device, path = load_trained(cfg)
    if run_cfg["data"]["sequential"]:
        raise ConfigError("-mode=shift_test needs a model trained on 2-D images (data.sequential: false)")
    s = cfg["shift"]
    min_shift, step, cls = int(s["min_shift"]), int(s["step"]), int(s["class_index"])
    if min_shift < 0 or step < 1:
        raise ConfigError(f"shift.min_shift must be >= 0 and shift.step >= 1, got {min_shift}, {step}")
    exact = bool(s["exact_kernel"])
    if exact and not set_favor_kernel(model, "softmax"):
        raise ConfigError("shift.exact_kernel: the model has no FAVOR+ attention")
    background = [(-m / sd) for m, sd in zip(splits.mean, splits.std)]
    if len(set(round(b, 6) for b in background)) != 1:
        raise ConfigError("the shift test assumes one background value for all channels")
    shifts = list(range(-min_shift, min_shift + 1, step))
    d = run_cfg["data"]
    # the whole test split, also for a run trained on a subset (which shrinks its test split)
    test = full_test_split(splits, d["name"], d["root"], int(d["pad_to"])) if int(d["small_dataset"]) else splits.test
    sets = shifted_images(*test, background=background[0], class_index=cls, min_shift=min_shift, shifts=shifts)
    n = len(sets[shifts[0]][1])
    if n == 0:
        raise ConfigError(
            f"no test image of class {cls} has {min_shift} empty columns on both sides; lower shift.min_shift"
        )
    results = {}
    for shift in shifts:
        x, y = sets[shift]
        correct = 0
        for start in range(0, len(y), 512):
            logits = model(x[start : start + 512].to(device))
            correct += (logits.argmax(-1).cpu() == y[start : start + 512]).sum().item()
        results[shift] = correct / len(y)
    out_dir = os.path.join(os.path.dirname(path), "shift_test_exact_kernel" if exact else "shift_test")
    os.makedirs(out_dir, exist_ok=True)
    write_csv(
        os.path.join(out_dir, "shift_accuracy.csv"),
        [{"shift": shift, "accuracy": f"{acc:.4f}", "images": n} for shift, acc in results.items()],
    )
    _plot(results, os.path.join(out_dir, "shift_accuracy.png"), title=f"{run_cfg['name']}: class {cls}, {n} images")
    print(
        f"\nshifted-image test{' (exact softmax kernel)' if exact else ''} ({n} test images of class {cls} with >= {min_shift} empty columns each side)"
    )
    print(" shift: " + " ".join(f"{k:>6d}" for k in results))
    print("   acc: " + " ".join(f"{v:6.3f}" for v in results.values()))
    print(f"written: {out_dir}/shift_accuracy.csv and shift_accuracy.png", flush=True)
    return results


def _plot(results: dict, path: str, title: str) -> None:
    fig, ax = pyplot().subplots(figsize=(6, 3.5))
    ax.plot(list(results), list(results.values()), marker="o")
    ax.set_xlabel("horizontal shift (pixels)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=9)
    save_figure(fig, path)
