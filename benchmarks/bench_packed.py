"""Benchmark of packed relpos_attention (posattn.PackedGrids, NaViT's "Patch n' Pack"), CPU or CUDA.

A NaViT-like mix: S images whose sides are 4..16 patches with aspect ratios from 1:2 to 2:1
(seeded), B = 1, with q_pos / rel and a learned bias, dense and in a 7x7 window. Forward and
forward + backward (gradients of q, k, v, q_pos, rel, bias), float32 (on CUDA also bfloat16),
median of interleaved rounds after warm-up, in one process (on CUDA each time after a
synchronisation, and the peak memory of each method's forward + backward).

  packed      ops.relpos_attention(..., packed=grids): one call over all samples
  loop        one ops.relpos_attention call per sample on its own grid, with its rows of the
              tables (the ideal the packed call is held to: the sum of the single calls)
  padded      what a user does today without packing: the samples padded to the largest grid
              and batched, dense PyTorch attention with a mask (padding and window) and the
              positional term and bias gathered into (B, H, N, N) logits
  padded-op   the padded batch through ops.relpos_attention on the largest grid: its time only
              (the op has no key mask, so the padding keys take part: not the same result)

Usage:
  python benchmarks/bench_packed.py                  # the issue's mix: 32 images, H = 4, D = 32
  python benchmarks/bench_packed.py --images 64 --repeats 5 --markdown results.md
  python benchmarks/bench_packed.py --device cuda --dtype bfloat16   # (scripts/gpu_check.sh bench)
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time

import torch
from bench_common import record, write_markdown, write_records

from posattn import PackedGrids, ops
from posattn.grid import grid_coords, num_offsets, offset_rows
from posattn.packed import sample_offset_rows

METHODS = ("packed", "loop", "padded", "padded-op")


def navit_shapes(images: int, seed: int, lo: int = 4, hi: int = 16) -> list[list[int]]:
    """Image grids in patches: the height uniform in [lo, hi], the width from an aspect ratio
    log-uniform in [1/2, 2], clipped to [lo, hi]."""
    rng = random.Random(seed)
    shapes = []
    for _ in range(images):
        h = rng.randint(lo, hi)
        w = min(hi, max(lo, round(h * math.exp(rng.uniform(math.log(0.5), math.log(2.0))))))
        shapes.append([h, w])
    return shapes


def make_inputs(pk: PackedGrids, heads: int, dim: int, seed: int = 0, dtype=torch.float32) -> dict:
    g = torch.Generator().manual_seed(seed)
    T, U = pk.num_tokens, num_offsets(pk.max_grid)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(pk.device, dtype).requires_grad_()

    return dict(
        q=rand(1, heads, T, dim),
        k=rand(1, heads, T, dim),
        v=rand(1, heads, T, dim),
        q_pos=rand(1, heads, T, dim),
        rel=rand(heads, U, dim, scale=0.3),
        bias=rand(heads, U, scale=0.3),
    )


def padded_batch(x: dict, pk: PackedGrids) -> tuple:
    """Each sample's tokens at its cells of the largest grid (zeros elsewhere), as a (S, H, M, D)
    batch, and the (S, M) mask of real tokens; differentiable in x."""
    mh, mw = pk.max_grid
    M = mh * mw
    dev = pk.device
    parts, masks = {n: [] for n in ("q", "k", "v", "q_pos")}, []
    for start, (h, w) in pk.samples():
        cells = (torch.arange(h, device=dev)[:, None] * mw + torch.arange(w, device=dev)[None]).reshape(-1)
        mask = torch.zeros(M, dtype=torch.bool, device=dev)
        mask[cells] = True
        masks.append(mask)
        for n in parts:
            t = x[n][0, :, start : start + h * w]
            parts[n].append(t.new_zeros(t.shape[0], M, t.shape[-1]).index_copy(1, cells, t))
    return {n: torch.stack(p) for n, p in parts.items()}, torch.stack(masks)


def make_method(name: str, x: dict, pk: PackedGrids, window):
    q, k, v, qp, rel, bias = (x[n] for n in ("q", "k", "v", "q_pos", "rel", "bias"))
    params = tuple(x.values())
    if name == "packed":
        return lambda: ops.relpos_attention(q, k, v, qp, rel, bias=bias, packed=pk, window=window), params
    if name == "loop":
        rows = [sample_offset_rows(shape, pk.max_grid, device=pk.device) for _, shape in pk.samples()]

        def loop():
            outs = []
            for (start, shape), r in zip(pk.samples(), rows):
                part = slice(start, start + math.prod(shape))
                outs.append(
                    ops.relpos_attention(
                        q[:, :, part],
                        k[:, :, part],
                        v[:, :, part],
                        qp[:, :, part],
                        rel[:, r],
                        list(shape),
                        bias=bias[:, r],
                        window=window,
                    )  # fmt: skip
                )
            return torch.cat(outs, dim=2)

        return loop, params
    grid = list(pk.max_grid)
    coords = grid_coords(grid)
    delta = (coords[None] - coords[:, None]).to(pk.device)  # (M, M, 2): key minus query
    rows = offset_rows(delta, grid).to(pk.device)
    if name == "padded-op":

        def padded_op():
            b, _ = padded_batch(x, pk)
            return ops.relpos_attention(b["q"], b["k"], b["v"], b["q_pos"], rel, grid, bias=bias, window=window)

        return padded_op, params
    keep_window = torch.ones(rows.shape, dtype=torch.bool, device=pk.device)
    if window is not None:
        keep_window = (delta.abs() <= window).all(-1)
    scale = q.shape[-1] ** -0.5

    def padded():
        b, real = padded_batch(x, pk)
        logits = b["q"] @ b["k"].transpose(-1, -2)
        pos = b["q_pos"] @ rel.transpose(-1, -2)  # (S, H, M, U)
        logits = logits + pos.gather(-1, rows.expand(*pos.shape[:2], *rows.shape))
        logits = scale * logits + bias[:, rows]
        keep = keep_window & real[:, None, None, :]
        w = torch.softmax(logits.masked_fill(~keep, float("-inf")), dim=-1)
        return w @ b["v"]

    return padded, params


def fwd_bwd(run, params):
    out = run()
    return torch.autograd.grad(out.square().sum(), params)


def bench(args) -> tuple[list[dict], list[str]]:
    shapes = navit_shapes(args.images, args.seed)
    pk = PackedGrids.from_shapes(shapes, device=args.device)
    x = make_inputs(pk, args.heads, args.dim, dtype=getattr(torch, args.dtype))
    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    tokens = pk.num_tokens
    mh, mw = pk.max_grid
    print(
        f"{args.images} images, {tokens} tokens, largest grid {mh}x{mw} (padded: {args.images * mh * mw} tokens), "
        f"H = {args.heads}, D = {args.dim}, {args.dtype}, "
        + (torch.cuda.get_device_name() if cuda else f"CPU, {torch.get_num_threads()} threads"),
        flush=True,
    )
    records, lines = [], []
    for window in (None, 3):
        label = "dense" if window is None else f"{2 * window + 1}x{2 * window + 1} window"
        runs = {m: make_method(m, x, pk, window) for m in args.methods}
        times = {(m, kind): [] for m in runs for kind in ("fwd", "fwd_bwd")}
        peak = {}
        for rnd in range(args.warmup + args.repeats):
            for m, (run, params) in runs.items():
                sync()
                t0 = time.perf_counter()
                with torch.no_grad():
                    run()
                sync()
                t1 = time.perf_counter()
                if cuda and rnd == 0:
                    torch.cuda.reset_peak_memory_stats()
                fwd_bwd(run, params)
                sync()
                t2 = time.perf_counter()
                if cuda and rnd == 0:
                    peak[m] = torch.cuda.max_memory_allocated() / 2**20
                if rnd >= args.warmup:
                    times[(m, "fwd")].append(1e3 * (t1 - t0))
                    times[(m, "fwd_bwd")].append(1e3 * (t2 - t1))
        med = {key: statistics.median(v) for key, v in times.items()}
        lines.append(f"| {label} | method | fwd ms | fwd+bwd ms |" + (" peak MiB |" if cuda else ""))
        lines.append("|---|---|---|---|" + ("---|" if cuda else ""))
        for m in runs:
            lines.append(
                f"| {label} | {m} | {med[(m, 'fwd')]:.2f} | {med[(m, 'fwd_bwd')]:.2f} |"
                + (f" {peak[m]:.0f} |" if cuda else "")
            )
        if "packed" in runs:
            for base in [b for b in runs if b != "packed"]:
                for kind in ("fwd", "fwd_bwd"):
                    records.append(
                        record(
                            "packed relpos_attention",
                            f"{label} {kind}",
                            "packed",
                            base,
                            med[("packed", kind)],
                            med[(base, kind)],
                        )  # fmt: skip
                    )
                lines.append(
                    f"  {label}: {base} / packed = {med[(base, 'fwd')] / med[('packed', 'fwd')]:.2f}x forward, "
                    f"{med[(base, 'fwd_bwd')] / med[('packed', 'fwd_bwd')]:.2f}x forward + backward"
                )
        lines.append("")
        print("\n".join(lines[-(len(runs) + 3 + max(0, len(runs) - 1)) :]), flush=True)
    return records, lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=32)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="bfloat16: CUDA only")
    p.add_argument("--markdown", help="also write the results table to this file")
    p.add_argument("--json", help="also write ratio records for benchmarks/compare.py to this file")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device")
    if args.dtype == "bfloat16" and args.device != "cuda":
        p.error("--dtype bfloat16 needs --device cuda (the CPU kernels take float32 and float64)")
    torch.set_num_threads(args.threads)
    records, lines = bench(args)
    write_records(args.json, records)
    write_markdown(args.markdown, "\n".join(lines))


if __name__ == "__main__":
    main()
