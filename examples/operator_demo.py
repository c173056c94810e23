"""posattn operator demo: relative-position attention over Fashion-MNIST images, offline.

(The experiment CLI is cmd/main.py; this script shows the operator on its own.)

It reads a batch of Fashion-MNIST images from the Debian package
dataset-fashion-mnist (/usr/share/datasets/fashion-mnist), treats every pixel
as a token on the 28x28 grid, and runs torch.ops.posattn.relpos_attention:

  1. checks the fused operator against the dense reference (forward and grads),
  2. times forward+backward dense and with the Gaussian span threshold, and
     reports how many keys the span keeps,
  3. writes a PNG of the attention weights of one query pixel (dense vs span).

Usage: python examples/operator_demo.py [--images 16] [--sigma 0.08] [--threshold 0.1] [--out runs/demo]
"""

from __future__ import annotations

import argparse
import gzip
import math
import os
import sys

import torch

import posattn
from posattn import ops, reference
from posattn.grid import num_offsets, span_half_widths, span_keep_fraction
from posattn.utils.timing import median_seconds

FASHION_DIR = "/usr/share/datasets/fashion-mnist"


def load_fashion_mnist(count: int, directory: str = FASHION_DIR) -> tuple[torch.Tensor, torch.Tensor]:
    """First `count` test images (count, 28, 28) in [0, 1] and their labels, from IDX files."""
    images_path = os.path.join(directory, "t10k-images-idx3-ubyte.gz")
    labels_path = os.path.join(directory, "t10k-labels-idx1-ubyte.gz")
    for path in (images_path, labels_path):
        if not os.path.exists(path):
            raise SystemExit(
                f"{path} not found. Install the offline data with `apt-get install dataset-fashion-mnist` "
                "(scripts/setup.sh does this)."
            )
    with gzip.open(images_path, "rb") as f:
        header = f.read(16)
        n, rows, cols = (int.from_bytes(header[i : i + 4], "big") for i in (4, 8, 12))
        count = min(count, n)
        pixels = f.read(count * rows * cols)
    with gzip.open(labels_path, "rb") as f:
        f.read(8)
        labels = torch.tensor(list(f.read(count)), dtype=torch.long)
    images = torch.frombuffer(bytearray(pixels), dtype=torch.uint8).view(count, rows, cols)
    return images.float() / 255.0, labels


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=16, help="batch of test images")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=16, help="head dim")
    p.add_argument("--sigma", type=float, default=0.08, help="span width (normalised units)")
    p.add_argument("--threshold", type=float, default=0.1)
    p.add_argument("--out", default="runs/demo", help="folder for the attention plot")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.images < 1 or args.heads < 1 or args.dim < 1:
        p.error("--images, --heads and --dim must be >= 1")
    if not (args.sigma > 0 and 0 <= args.threshold < 1):
        p.error("--sigma must be > 0 and --threshold in [0, 1)")

    torch.manual_seed(args.seed)
    images, labels = load_fashion_mnist(args.images)
    B, H, D = images.shape[0], args.heads, args.dim
    grid = list(images.shape[1:])
    N = math.prod(grid)
    U = num_offsets(grid)
    print(f"posattn {posattn.__version__}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(
        f"{B} Fashion-MNIST images (labels {labels.tolist()}), grid {grid} -> N={N} tokens, "
        f"H={H}, D={D}, U={U} relative offsets"
    )

    # Tokens: pixel intensity lifted to H*D features by a fixed random projection.
    tokens = images.view(B, N, 1)
    w = torch.randn(3, 1, H * D)
    q, k, v = [(tokens * w[i] + 0.1 * torch.randn(H * D)).view(B, N, H, D).transpose(1, 2) for i in range(3)]
    q_pos = q + 0.1 * torch.randn(H, 1, D)
    rel = 0.5 * torch.randn(H, U, D)
    sigma = torch.full((H, len(grid)), args.sigma)
    leaves = [t.requires_grad_() for t in (q, k, v, q_pos, rel, sigma)]
    kw = dict(grid=grid, sigma=sigma, span_mode="add")

    # 1. Correctness against the dense reference.
    out, lse = ops.relpos_attention(q, k, v, q_pos, rel, threshold=args.threshold, return_lse=True, **kw)
    ref, ref_lse = reference.relpos_attention(q, k, v, q_pos, rel, threshold=args.threshold, return_lse=True, **kw)
    grads = torch.autograd.grad(out.square().sum(), leaves)
    ref_grads = torch.autograd.grad(ref.square().sum(), leaves)
    err = max((out - ref).abs().max().item(), (lse - ref_lse).abs().max().item())
    gerr = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item() for a, b in zip(grads, ref_grads))
    print(f"1. fused vs reference: max |out/lse diff| = {err:.2e}, max relative grad diff = {gerr:.2e}")
    if not (err < 1e-3 and gerr < 1e-3):
        print("   MISMATCH between the operator and the reference", file=sys.stderr)
        return 1

    # 2. Cost: dense vs span-limited.
    if args.threshold > 0:
        half = span_half_widths(sigma[:1], args.threshold, grid)[0]
    else:  # no threshold: the span only reweights, every key is visited
        half = [n - 1 for n in grid]
    kept = span_keep_fraction(grid, half)

    def step(threshold):
        o = ops.relpos_attention(q, k, v, q_pos, rel, threshold=threshold, **kw)
        torch.autograd.grad(o.sum(), leaves)

    t_dense = 1e3 * median_seconds(lambda: step(0.0))
    t_span = 1e3 * median_seconds(lambda: step(args.threshold))
    print(
        f"2. forward+backward: dense {t_dense:.1f} ms, span threshold {args.threshold} "
        f"(box half widths {half}, keeps {100 * kept:.1f}% of keys) {t_span:.1f} ms "
        f"-> {t_dense / t_span:.1f}x faster"
    )

    # 3. Attention weights of one query pixel.
    path = save_attention_plot(q, k, q_pos, rel, sigma, grid, args, images[0])
    if path:
        print(f"3. attention of the centre pixel (dense vs span): {path}")
    return 0


def save_attention_plot(q, k, q_pos, rel, sigma, grid, args, image):
    """Attention weights of the centre pixel of image 0, head 0, dense vs thresholded."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("3. (matplotlib not installed: no attention plot)")
        return None
    centre = (grid[0] // 2) * grid[1] + grid[1] // 2
    with torch.no_grad():
        maps = [_weights_row(q, k, q_pos, rel, sigma, grid, thr, centre).view(*grid) for thr in (0.0, args.threshold)]
    os.makedirs(args.out, exist_ok=True)
    fig, axes = plt.subplots(1, 3, figsize=(9, 3.2))
    axes[0].imshow(image, cmap="gray")
    axes[0].set_title("image 0")
    for ax, m, title in zip(axes[1:], maps, ("dense", f"span, threshold {args.threshold}")):
        ax.imshow(m, cmap="viridis")
        ax.set_title(title)
    for ax in axes:
        ax.plot(grid[1] // 2, grid[0] // 2, "r+")
        ax.axis("off")
    fig.tight_layout()
    path = os.path.join(args.out, "attention_centre_pixel.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _weights_row(q, k, q_pos, rel, sigma, grid, threshold, query):
    """Softmax weights of one query (image 0, head 0): values = identity, so out = weights."""
    N = math.prod(grid)
    v = torch.eye(N).view(1, 1, N, N)
    out = ops.relpos_attention(
        q[:1, :1].detach(),
        k[:1, :1].detach(),
        v,
        q_pos[:1, :1].detach(),
        rel[:1].detach(),
        grid=grid,
        sigma=sigma[:1].detach(),
        threshold=threshold,
    )
    return out[0, 0, query]


if __name__ == "__main__":
    sys.exit(main())
