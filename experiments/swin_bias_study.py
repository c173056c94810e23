"""A small Swin / NAT-style classifier on Fashion-MNIST, trained twice from the same
initialisation: on posattn's fused operator (learned bias table + 7x7 shifted window,
only the window's keys visited) and on the eager composition a user would write
today (the table gathered into an (H, N, N) bias, the window as -inf entries of it,
scaled_dot_product_attention). Same model, same data order: the accuracies should
agree within seed noise; the time and memory should not.

Model: 2x2-pixel patches (a 14x14 token grid; --patch 1: 28x28), no positional encoding besides the
bias (``pe.name: none``, ``pe.bias: table`` with 13x13 entries per head, as Swin's
7x7 windows have), ``model.window: 7`` with NATTEN's border rule, pre-LN, mean pooling.

Usage:
  python experiments/swin_bias_study.py                     # 3 seeds x 2 backends, ~12 min on 2 cores
  python experiments/swin_bias_study.py --seeds 0 --train-images 2000 --epochs 1   # a quick look
  python experiments/swin_bias_study.py --replot            # redraw from the saved CSV
Writes experiments/results/swin_bias/{runs.csv,summary.md,swin_bias.png}.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import platform
import statistics
import sys
import time
from datetime import date

import torch
import torch.nn.functional as F

from posattn.grid import grid_coords, offset_rows, window_key_range
from posattn.nn import PositionalSelfAttention, TransformerClassifier
from posattn.training.data import batches, full_test_split, load_splits
from posattn.utils.timing import freed_memory_returned_to_os, peak_extra_mib

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "swin_bias")
BACKENDS = ("posattn", "eager")


class EagerBiasAttention(PositionalSelfAttention):
    """The same module (same parameters) computed the eager way: the bias table
    gathered into (H, N, N), the window added as -inf, then SDPA. O(N^2) memory."""

    def forward(self, x, grid, has_cls=False, shared=None):
        args, _ = self._inputs(x, grid, has_cls, shared)
        grid = args["grid"]
        coords = grid_coords(grid, device=x.device)
        rows = offset_rows(coords[None] - coords[:, None], grid)  # (N, N)
        mask = args["bias"][:, rows]  # (H, N, N)
        if self.window is not None:
            keep = torch.ones(rows.shape, dtype=torch.bool, device=x.device)
            half = [self.window] * len(grid) if isinstance(self.window, int) else self.window
            for d, (n, w) in enumerate(zip(grid, half)):
                w = min(w, n - 1)
                lo, hi = window_key_range(coords[:, d], n, w, w, self.window_border)
                keep &= (coords[None, :, d] >= lo[:, None]) & (coords[None, :, d] <= hi[:, None])
            mask = mask.masked_fill(~keep, float("-inf"))
        out = F.scaled_dot_product_attention(args["q"], args["k"], args["v"], attn_mask=mask[None])
        return self.output(out)


def build_model(args, seed: int, backend: str) -> TransformerClassifier:
    torch.manual_seed(seed)
    model = TransformerClassifier(
        in_channels=1,
        num_classes=10,
        grid=[28, 28],
        patch_size=args.patch,
        dim=args.dim,
        depth=args.depth,
        heads=args.heads,
        ffn_dim=2 * args.dim,
        dropout=0.0,
        input_dropout=0.0,
        norm="pre",
        pooling="mean",
        head="linear",
        pe={"name": "none", "bias": "table", "bias_max_distance": args.window - 1},
        window=args.window,
        window_border="shift",
        backend="fused",
    )
    if backend == "eager":
        for block in model.blocks:
            block.attention.__class__ = EagerBiasAttention
    return model


def evaluate(model, x, y, batch_size=500) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for xb, yb in batches(x, y, batch_size):
            correct += (model(xb).argmax(-1) == yb).sum().item()
    model.train()
    return correct / len(y)


def train_one(args, splits, seed: int, backend: str) -> dict:
    model = build_model(args, seed, backend)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    x, y = splits.train
    steps = args.epochs * math.ceil(len(y) / args.batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=steps, pct_start=0.1)
    g = torch.Generator().manual_seed(seed)
    step_times = []
    for epoch in range(args.epochs):
        for xb, yb in batches(x, y, args.batch_size, shuffle=True, generator=g):
            t0 = time.perf_counter()
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step_times.append(time.perf_counter() - t0)
        print(
            f"  {backend:8s} seed {seed} epoch {epoch + 1}/{args.epochs}: loss {loss.item():.3f}, "
            f"{1e3 * statistics.median(step_times):.0f} ms/step",
            flush=True,
        )
    xb, yb = x[: args.batch_size], y[: args.batch_size]

    def one_step():
        F.cross_entropy(model(xb), yb).backward()
        model.zero_grad(set_to_none=True)

    with freed_memory_returned_to_os():
        peak = peak_extra_mib(one_step)
    return dict(
        backend=backend,
        seed=seed,
        test_acc=evaluate(model, *splits.test),
        ms_per_step=1e3 * statistics.median(step_times[len(step_times) // 10 :]),
        peak_step_mib=peak,
    )


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def read_csv(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["seed"] = int(r["seed"])
        for k in ("test_acc", "ms_per_step", "peak_step_mib"):
            r[k] = float(r[k])
    return rows


def summarise(rows, args) -> str:
    by = {b: [r for r in rows if r["backend"] == b] for b in BACKENDS}

    def ms(vals):
        return f"{statistics.mean(vals):.4f} ± {statistics.stdev(vals):.4f}" if len(vals) > 1 else f"{vals[0]:.4f}"

    lines = [
        f"Fashion-MNIST, {args.train_images} training images, {args.epochs} epochs, full test set (10,000); "
        f"{28 // args.patch}x{28 // args.patch} tokens, dim {args.dim}, depth {args.depth}, {args.heads} heads, 7x7 shifted window, bias table; "
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch "
        f"{torch.__version__}, {date.today().isoformat()}",
        "",
        "| backend | seeds | test accuracy (mean ± sd) | ms / training step (batch "
        f"{args.batch_size}) | "
        "peak extra MiB of a step |",
        "|---|---|---|---|---|",
    ]
    for b in BACKENDS:
        rs = by[b]
        if not rs:
            continue
        lines.append(
            f"| {b} | {len(rs)} | {ms([r['test_acc'] for r in rs])} | "
            f"{statistics.median(r['ms_per_step'] for r in rs):.1f} | "
            f"{statistics.median(r['peak_step_mib'] for r in rs):.1f} |"
        )
    if by["posattn"] and by["eager"]:
        diffs = [p["test_acc"] - e["test_acc"] for p in by["posattn"] for e in by["eager"] if p["seed"] == e["seed"]]
        t = statistics.median(r["ms_per_step"] for r in by["eager"]) / statistics.median(
            r["ms_per_step"] for r in by["posattn"]
        )
        m = statistics.median(r["peak_step_mib"] for r in by["posattn"]) / statistics.median(
            r["peak_step_mib"] for r in by["eager"]
        )
        lines += [
            "",
            f"Same seed, posattn - eager test accuracy: {', '.join(f'{d:+.4f}' for d in diffs)}; "
            f"eager / posattn time per step {t:.2f}x; posattn / eager peak memory of a step {m:.2f}.",
        ]
    return "\n".join(lines)


def plot(rows, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    colours = {"posattn": "tab:blue", "eager": "tab:orange"}
    for ax, key, label in zip(
        axes,
        ("test_acc", "ms_per_step", "peak_step_mib"),
        ("test accuracy", "ms per training step", "peak extra MiB of a step"),
    ):
        for i, b in enumerate(BACKENDS):
            vals = [r[key] for r in rows if r["backend"] == b]
            ax.scatter([i] * len(vals), vals, color=colours[b], zorder=3)
            if vals:
                ax.bar(i, statistics.mean(vals), color=colours[b], alpha=0.3)
        ax.set_xticks(range(len(BACKENDS)), BACKENDS)
        ax.set_title(label)
        if key == "test_acc":
            lo = min(r[key] for r in rows)
            ax.set_ylim(lo - 0.02, min(1.0, max(r[key] for r in rows) + 0.01))
    fig.suptitle("Swin/NAT-style model: bias table + 7x7 shifted window, posattn vs eager (SDPA + gathered bias)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--train-images", type=int, default=10000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument(
        "--patch", type=int, default=2, choices=[1, 2, 4], help="patch size: 1 (28x28 tokens), 2 (14x14), 4 (7x7)"
    )
    p.add_argument("--dim", type=int, default=48)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--heads", type=int, default=3)
    p.add_argument("--window", type=int, default=7)
    p.add_argument("--data-root", default="data")
    p.add_argument("--out", default=OUT)
    p.add_argument("--replot", action="store_true", help="only redraw the plot and summary from runs.csv")
    args = p.parse_args()
    if args.window < 1 or args.window % 2 == 0:
        raise SystemExit(f"--window must be an odd size >= 1, got {args.window}")
    os.makedirs(args.out, exist_ok=True)
    csv_path = os.path.join(args.out, "runs.csv")
    if args.replot:
        if not os.path.exists(csv_path):
            raise SystemExit(f"--replot: {csv_path} does not exist; run the study first")
        rows = read_csv(csv_path)
    else:
        splits = load_splits("fashion_mnist", args.data_root, small_dataset=args.train_images, seed=0)
        splits.test = full_test_split(splits, "fashion_mnist", args.data_root, pad_to=0)  # every test image
        print(splits.describe(), "(test: all 10,000)", flush=True)
        rows = []
        for seed in args.seeds:
            for backend in BACKENDS:
                rows.append(train_one(args, splits, seed, backend))
                print(f"  -> {rows[-1]}", flush=True)
                write_csv(csv_path, rows)
    summary = summarise(rows, args)
    print(summary)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(summary + "\n")
    plot(rows, os.path.join(args.out, "swin_bias.png"))


if __name__ == "__main__":
    sys.exit(main())
