"""Simulated GPU cycles of a packed relpos_attention call against one launch per sample
(GPGPU-Sim's timing model, the harness of tests/cuda_sim/): the forward and forward + backward of
a mix of small images in one packed call, and the same images as single-grid calls, one after
another (each with its own launches: what a loop over the images costs on a GPU). Prints the
cycles per kernel and the ratios. Each run takes minutes (timing mode).

    python benchmarks/sim_packed_cycles.py [--samples 6] [--max-side 6] [--dtype f32] [--window 1]
        [--path general|auto] [--no-span] [--forward-only | --backward-only] [--packed-only]

--path general (the default) compares the general kernels, packed against per sample; --path auto
the kernels the plan chooses (the fast forward and backward take packed calls, with a span at 16-bit
D <= 64; d rel, d bias and d sigma: the fast offset kernel, the same).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import simlib  # noqa: E402
from sim_cycles import DTYPES, kernel_cycles  # noqa: E402


def mix(samples: int, max_side: int, seed: int):
    """`samples` 2-D grids with sides uniform in 2..max_side (aspect ratios 1:2 to 2:1)."""
    rng = random.Random(seed)
    shapes = []
    while len(shapes) < samples:
        h, w = rng.randint(2, max_side), rng.randint(2, max_side)
        if max(h, w) <= 2 * min(h, w):
            shapes.append((h, w))
    return shapes


def run_one(
    workdir: Path, name: str, grid, shapes, window, backward: bool, dtype, H: int, D: int, path: str, span: bool
):
    """Cycles per launch of one harness run: a packed call (shapes given) or a single grid."""
    T = sum(math.prod(s) for s in shapes) if shapes else math.prod(grid)
    U = math.prod(2 * n - 1 for n in grid)
    g = torch.Generator().manual_seed(0)
    rand = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dtype)  # noqa: E731
    arrays = dict(
        q=rand(1, H, T, D),
        k=rand(1, H, T, D),
        v=rand(1, H, T, D),
        q_pos=rand(1, H, T, D),
        rel=rand(H, U, D),
        bias=rand(H, U),
        sigma=0.3 + 0.4 * torch.rand(H, len(grid), generator=g, dtype=torch.float64),
        gout=rand(1, H, T, D),
        glse=torch.zeros(1, H, T, dtype=torch.float32),
    )
    settings = dict(
        op="relpos",
        **simlib.plan_settings(path),
        B=1,
        H=H,
        D=D,
        Dv=D,
        grid=list(grid),
        has_pos=1,
        has_bias=1,
        has_sigma=int(span),
        scale=repr(D**-0.5),
        window=[window] * len(grid) if window else None,
        backward=int(backward),
        has_glse=1,
    )
    if shapes:
        offsets = [0]
        for s in shapes:
            offsets.append(offsets[-1] + math.prod(s))
        settings.update(T=T, packed_offsets=offsets, packed_shapes=[n for s in shapes for n in s])
    case = workdir / f"{name}-{'bwd' if backward else 'fwd'}"
    harness = simlib.harness(dtype, D if path != "general" else None, packed=bool(shapes))
    res = simlib.run_case(harness, case, settings, arrays, timing=True, timeout=7200, rundir=case / "sim")
    if res.returncode != 0:
        raise RuntimeError(res.tail())
    return kernel_cycles((case / "sim" / "gpgpusim.log").read_text())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=6)
    ap.add_argument("--max-side", type=int, default=6)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    ap.add_argument("--window", type=int, default=1, help="window half width (0: dense)")
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--path", choices=["general", "auto"], default="general")
    ap.add_argument("--no-span", dest="span", action="store_false", help="q_pos and bias only")
    ap.add_argument("--forward-only", action="store_true")
    ap.add_argument("--backward-only", action="store_true", help="forward + backward only")
    ap.add_argument("--packed-only", action="store_true", help="the packed call only, not one call per image")
    args = ap.parse_args()
    why = simlib.unavailable()
    if why:
        sys.exit("sim_packed_cycles: " + why)
    shapes = mix(args.samples, args.max_side, args.seed)
    max_grid = [max(s[d] for s in shapes) for d in range(2)]
    dtype = DTYPES[args.dtype]
    print(
        f"simulated cycles (GPGPU-Sim SM86_RTX3070 timing model), {len(shapes)} images {shapes}, max grid "
        f"{max_grid}, {args.dtype}, H = {args.heads}, D = {args.dim}, q_pos + bias{' + span' if args.span else ''}, "
        f"{'window ' + str(2 * args.window + 1) + 'x' + str(2 * args.window + 1) if args.window else 'dense'}; "
        f"{args.path} kernels"
    )
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        passes = (False,) if args.forward_only else (True,) if args.backward_only else (False, True)
        for backward in passes:
            what = "forward + backward" if backward else "forward"
            opts = (backward, dtype, args.heads, args.dim, args.path, args.span)
            packed = run_one(work, "packed", max_grid, shapes, args.window, *opts)
            single = []
            for i, s in enumerate([] if args.packed_only else shapes):
                single += run_one(work, f"single{i}", s, None, args.window, *opts)
            total_p, total_s = sum(c for _, c in packed), sum(c for _, c in single)
            print(f"\n{what}: packed {total_p:,} cycles in {len(packed)} launches" + ("" if args.packed_only else
                  f"; per sample {total_s:,} cycles in {len(single)} launches; per sample / packed = "
                  f"{total_s / total_p:.2f}x"))  # fmt: skip
            for name in dict.fromkeys(n for n, _ in packed + single):
                p = sum(c for n, c in packed if n == name)
                s = sum(c for n, c in single if n == name)
                print(f"  {name:40s} packed {p:>10,}  per sample {s:>10,}")


if __name__ == "__main__":
    main()
