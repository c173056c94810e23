"""Neighbourhood attention on the CPU: posattn.na2d / na3d against natten (its
Flex backend), FlexAttention compiled with natten's own block mask, and SDPA
with a dense boolean mask, in one run; forward (natten has no CPU backward) and
posattn's forward + backward.

Shapes: (B, *grid, H, D) in NATTEN's layout, 2-D 56x56 and 3-D 16x16x16 grids
(--shapes), kernel 7 and 13, dilation 1 and 2 (--kernels, --dilations). Median of
--repeats after --warmup calls; ratios are baseline / posattn (> 1: posattn is
faster). natten 0.21.7 refuses ``torch_compile=True`` without a CUDA device
(its check wants compute capability >= 70; the script asks once and prints the
answer), so the compiled baseline is ``torch.compile(flex_attention)`` with the
block mask natten builds (``natten.backends.flex.get_na_flex_mask``, the same
windows), compiled once per case before timing (compile time printed, not
counted); where it fails, the error's first line is printed instead.

    python benchmarks/bench_natten_cpu.py [--shapes 56x56,16x16x16] [--kernels 7,13]
        [--dilations 1,2] [--batch 1] [--heads 4] [--dim 32] [--repeats 5] [--warmup 1]
        [--no-compile] [--threads 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings

import torch
from bench_common import parse_grid, ratio, record, write_records

import posattn
from posattn import reference
from posattn.utils.timing import median_seconds


def natten_call(natten, G, q, k, v, kw, compiled):
    fn = {1: natten.na1d, 2: natten.na2d, 3: natten.na3d}[G]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(q, k, v, **kw, torch_compile=compiled)


def dense_mask(grid, kernel, dilation):
    """(N, N) boolean mask of NATTEN's windows (from the reference's rule)."""
    N = math.prod(grid)
    q = torch.zeros(1, 1, N, 1)
    scores = reference.relpos_scores(
        q, q, grid=grid, kernel_size=kernel, window_dilation=dilation, window_border="shift", scale=1.0
    )
    return torch.isfinite(scores[0, 0])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="56x56,16x16x16", help="comma-separated grids, e.g. 56x56,16x16x16")
    p.add_argument("--kernels", default="7,13", help="comma-separated kernel sizes (every axis)")
    p.add_argument("--dilations", default="1,2", help="comma-separated dilations (every axis)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--no-compile", action="store_true", help="skip the compiled FlexAttention baseline")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--json", default=None, help="write the ratio records there")
    args = p.parse_args(argv)
    try:
        import natten
    except ImportError:
        raise SystemExit("bench_natten_cpu: natten is not installed (pip install --no-build-isolation natten==0.21.7)")
    if args.threads:
        torch.set_num_threads(args.threads)
    grids = [parse_grid(s) for s in args.shapes.split(",")]
    kernels = [int(s) for s in args.kernels.split(",")]
    dilations = [int(s) for s in args.dilations.split(",")]
    print(
        f"torch {torch.__version__}, natten {natten.__version__}, {torch.get_num_threads()} threads, "
        f"posattn CPU kernels: {posattn.ops.cpu_capability()}; B={args.batch} H={args.heads} D={args.dim} float32, "
        f"median of {args.repeats}"
    )
    flex_compiled = None
    if not args.no_compile:
        from natten.backends.flex import get_na_flex_mask
        from torch.nn.attention.flex_attention import flex_attention

        flex_compiled = flex_attention
        natten.allow_flex_compile(True, backprop=False)  # natten's guard for torch_compile=True (forward only)
        try:
            x = torch.randn(1, 16, 16, 1, 32)
            natten_call(natten, 2, x, x, x, dict(kernel_size=3), True)
            print("natten torch_compile=True: runs here")
        except Exception as e:
            print(f"natten torch_compile=True: refused ({str(e).splitlines()[0][:100]})")
    header = (
        f"{'grid':>9} {'k':>3} {'d':>2} {'keep':>6} | {'posattn':>9} {'natten':>9} {'flex-c':>9} {'sdpa':>9} | "
        f"{'natten/pa':>9} {'flex-c/pa':>9} {'sdpa/pa':>8} | {'pa fwd+bwd':>10}"
    )
    print(header)
    records = []
    for grid in grids:
        G = len(grid)
        N = math.prod(grid)
        g = torch.Generator().manual_seed(0)
        shape = (args.batch, *grid, args.heads, args.dim)
        q, k, v = (torch.randn(shape, generator=g) for _ in range(3))
        for kernel in kernels:
            for dil in dilations:
                if any(kernel * dil > n for n in grid):
                    print(f"{'x'.join(map(str, grid)):>9} {kernel:>3} {dil:>2}  skipped: kernel x dilation > grid")
                    continue
                kw = dict(kernel_size=kernel, dilation=dil)
                case = f"{'x'.join(map(str, grid))} k{kernel} d{dil}"
                t_pa = median_seconds(lambda: posattn.neighborhood.neighborhood_attention(q, k, v, **kw),
                                      args.warmup, args.repeats) * 1e3  # fmt: skip
                t_nat = median_seconds(lambda: natten_call(natten, G, q, k, v, kw, False), args.warmup,
                                       args.repeats) * 1e3  # fmt: skip
                t_flex, note = float("nan"), ""
                qh, kh, vh = (t.reshape(args.batch, N, args.heads, args.dim).transpose(1, 2) for t in (q, k, v))
                if flex_compiled is not None:
                    try:
                        # a fresh static-shape compile per case: recompiling one function for new shapes
                        # (dynamic) fails in inductor's CPU flex template here
                        torch._dynamo.reset()
                        compiled = torch.compile(flex_compiled, dynamic=False)
                        t0 = time.perf_counter()
                        block_mask = get_na_flex_mask("cpu", G, tuple(grid), (kernel,) * G, (1,) * G, (dil,) * G,
                                                      (False,) * G)  # fmt: skip
                        compiled(qh, kh, vh, block_mask=block_mask)
                        note = f"flex mask + compile {time.perf_counter() - t0:.0f} s"
                        t_flex = median_seconds(lambda: compiled(qh, kh, vh, block_mask=block_mask),
                                                args.warmup, args.repeats) * 1e3  # fmt: skip
                    except Exception as e:  # report, do not hide: the row says why
                        note = f"compiled flex failed: {str(e).splitlines()[0][:120]}"
                mask = dense_mask(grid, [kernel] * G, [dil] * G)
                keep = mask.float().mean().item()
                t_sdpa = median_seconds(
                    lambda: torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask),
                    args.warmup, args.repeats,
                ) * 1e3  # fmt: skip
                qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))

                def fwd_bwd():
                    posattn.neighborhood.neighborhood_attention(qg, kg, vg, **kw).sum().backward()

                t_fb = median_seconds(fwd_bwd, args.warmup, args.repeats) * 1e3
                print(
                    f"{'x'.join(map(str, grid)):>9} {kernel:>3} {dil:>2} {keep:>6.3f} | {t_pa:>9.2f} {t_nat:>9.2f} "
                    f"{t_flex:>9.2f} {t_sdpa:>9.2f} | {ratio(t_nat, t_pa):>9.2f} {ratio(t_flex, t_pa):>9.2f} "
                    f"{ratio(t_sdpa, t_pa):>8.2f} | {t_fb:>10.2f}" + (f"   ({note})" if note else "")
                )
                records.append(record("natten_cpu", case, "posattn", "natten flex", t_pa, t_nat))
                records.append(record("natten_cpu", case, "posattn", "flex compiled, natten's mask", t_pa, t_flex,
                                      note=note))  # fmt: skip
                records.append(record("natten_cpu", case, "posattn", "sdpa dense mask", t_pa, t_sdpa))
                records.append(record("natten_cpu", case, "posattn fwd+bwd", "posattn fwd", t_fb, t_pa))
    write_records(args.json, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
