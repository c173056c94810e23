"""GPU benchmark of posattn.ops.relpos_attention (Transformer-XL term + Gaussian span) against
what people use today, in one run, with ratios.

Per grid, bf16 by default, B=4, H=8, D=64, forward and forward+backward (the gradients of
q, k, v, q_pos, rel and sigma), median of interleaved rounds (one call of each method per
round) after warm-up, timed with CUDA events:

  sdpa      scaled_dot_product_attention without positions (flash backend on CUDA): the
            floor, what attention costs with no positional term at all
  posattn   relpos_attention(q, k, v, q_pos, rel, grid, sigma): dense (the fast tensor-core
            forward where it applies, POSATTN_CUDA_KERNEL=auto)
  general   the same on the general CUDA path (POSATTN_CUDA_KERNEL=general)
  window    the same with a window keeping about --keep of the keys (half widths chosen per
            grid; the kept fraction is printed), against posattn dense
  flex      flex_attention (compiled) with a score_mod adding the same positional term
            (the (B, H, N, U) products q_pos . rel, computed inside the timed call) and the
            span; the window as a block mask
  eager     posattn.reference.relpos_attention: the dense PyTorch composition, (B, H, N, N)

Outputs are checked against each other before anything is timed. Achieved TFLOP/s count
useful work only: 2 (2D + Dv) FLOPs per kept pair forward (q.k, q_pos.rel, p.v; sdpa: 2
(D + Dv)), 3.5x that forward+backward (the backward as 2.5 forwards, FlashAttention's
convention), against a bf16 matmul measured on the same device. Peak memory: what one
forward + backward allocates on top of its inputs (torch.cuda.max_memory_allocated after a reset),
CUDA only.

Usage (on the GPU machine):
  python benchmarks/bench_relpos_cuda.py                          # 32x32, 64x64, 16x16x16
  python benchmarks/bench_relpos_cuda.py --grid 64x64 --repeats 30 --markdown out.md --json out.json
  python benchmarks/bench_relpos_cuda.py --dtype float32 --tf32 --grid 64x64   # float32 through TF32
  python benchmarks/bench_relpos_cuda.py --device cpu --dtype float32 --grid 6x6 --batch 1 --heads 2 \\
      --dim 8 --methods sdpa,posattn,window,eager --repeats 2          # a smoke test without a GPU
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import time
from datetime import date

import torch
import torch.nn.functional as F
from bench_common import parse_grid, ratio, record, write_records

import posattn
from posattn import ops, reference
from posattn.grid import num_offsets, span_keep_fraction

METHODS = ("sdpa", "posattn", "general", "window", "flex", "eager")
DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
}


def make_inputs(grid, batch, heads, dim, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    N, U = math.prod(grid), num_offsets(grid)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype).requires_grad_()

    sigma = (0.2 + 0.3 * torch.rand(heads, len(grid), generator=g)).to(device).requires_grad_()  # float32
    return dict(
        q=rand(batch, heads, N, dim),
        k=rand(batch, heads, N, dim),
        v=rand(batch, heads, N, dim),
        q_pos=rand(batch, heads, N, dim),
        rel=rand(heads, U, dim, scale=0.5),
        sigma=sigma,
    )


def window_for(grid, keep):
    """Half widths (the same on every axis) whose (2r+1)^G box holds about `keep` of the keys."""
    N = math.prod(grid)
    r = max(0, round(((keep * N) ** (1 / len(grid)) - 1) / 2))
    return [min(r, n - 1) for n in grid]


def offset_tables(grid, sigma, scale):
    """Per pair of token indices: the offset's row in rel, and (H, U) quad = 0.5 sum (x/sigma)^2."""
    U = num_offsets(grid)
    rows = torch.arange(U, device=sigma.device)
    quad = torch.zeros(sigma.shape[0], U, device=sigma.device, dtype=torch.float32)
    rest = rows
    for d in reversed(range(len(grid))):
        n = grid[d]
        delta = rest % (2 * n - 1) - (n - 1)
        rest = rest // (2 * n - 1)
        x = delta.float() / max(n - 1, 1)
        quad = quad + 0.5 * (x[None] / sigma[:, d : d + 1].float()) ** 2
    return quad


def flex_method(grid, x, window, scale):
    """flex_attention with the positional term and span in a score_mod, the window as a block mask.
    The (B, H, N, U) products and the span table are computed eagerly inside the timed call and
    passed to the compiled attention as inputs (so that the score_mod's tensors are graph inputs,
    not new closures that would recompile)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    N = x["q"].shape[2]

    def offsets(q_idx, kv_idx):
        row, stride, qi, ki, inside = 0, 1, q_idx, kv_idx, None
        for d, n in reversed(list(enumerate(grid))):
            delta = ki % n - qi % n
            row = row + (delta + n - 1) * stride
            if window is not None:
                ok = (delta <= window[d]) & (delta >= -window[d])
                inside = ok if inside is None else inside & ok
            stride *= 2 * n - 1
            qi, ki = qi // n, ki // n
        return row, inside

    block_mask = None
    if window is not None:

        def mask_mod(b, h, q_idx, kv_idx):
            return offsets(q_idx, kv_idx)[1]

        block_mask = create_block_mask(mask_mod, None, None, N, N, device=x["q"].device)

    def attention(q, k, v, ppos, quad):
        def score_mod(score, b, h, q_idx, kv_idx):
            row, _ = offsets(q_idx, kv_idx)
            return score + scale * ppos[b, h, q_idx, row] - quad[h, row]

        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)

    compiled = torch.compile(attention, dynamic=False)

    def run():
        # detached without autograd: flex_attention refuses inputs requiring grad where it has no backward
        t = {n: (x[n] if torch.is_grad_enabled() else x[n].detach()) for n in ("q", "k", "v", "q_pos", "rel", "sigma")}
        ppos = torch.einsum("bhnd,hud->bhnu", t["q_pos"], t["rel"])  # (B, H, N, U), part of the timed call
        quad = offset_tables(grid, t["sigma"], scale).to(t["q"].dtype)  # (H, U)
        return compiled(t["q"], t["k"], t["v"], ppos, quad)

    return run


def make_method(name, grid, x, window, scale):
    """(closure computing the output, the tensors it differentiates)."""
    q, k, v = x["q"], x["k"], x["v"]
    pos = dict(q_pos=x["q_pos"], rel=x["rel"], sigma=x["sigma"])
    if name == "sdpa":

        def run():
            if q.is_cuda:
                from torch.nn.attention import SDPBackend, sdpa_kernel

                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, scale=scale)
            return F.scaled_dot_product_attention(q, k, v, scale=scale)

        return run, [q, k, v]
    params = [q, k, v, x["q_pos"], x["rel"], x["sigma"]]
    if name == "posattn":
        return (lambda: ops.relpos_attention(q, k, v, grid=grid, scale=scale, **pos)), params
    if name == "general":

        def general():
            old = os.environ.get("POSATTN_CUDA_KERNEL")
            os.environ["POSATTN_CUDA_KERNEL"] = "general"
            try:
                return ops.relpos_attention(q, k, v, grid=grid, scale=scale, **pos)
            finally:
                if old is None:
                    del os.environ["POSATTN_CUDA_KERNEL"]
                else:
                    os.environ["POSATTN_CUDA_KERNEL"] = old

        return general, params
    if name == "window":
        return (lambda: ops.relpos_attention(q, k, v, grid=grid, scale=scale, window=window, **pos)), params
    if name in ("flex", "flex_window"):
        table = math.prod(q.shape[:3]) * num_offsets(grid)  # B * H * N * U
        if table >= 2**31:
            # FlexAttention indexes the score_mod's (B, H, N, U) table with 32-bit offsets: past
            # 2^31 elements it reads out of bounds (an illegal address on an H200, 16x16x16, B=4, H=8)
            raise ValueError(f"its (B, H, N, U) table has {table:.3g} >= 2^31 elements")
        return flex_method(grid, x, None if name == "flex" else window, scale), params
    if name == "eager":
        return (lambda: reference.relpos_attention(q, k, v, grid=grid, scale=scale, **pos)), params
    raise ValueError(name)


def short(e: Exception) -> str:
    """An exception's type and first line, for a table cell."""
    first = str(e).splitlines()[0][:200] if str(e) else ""
    return f"{type(e).__name__}: {first}"


def timer(device):
    """A function timing one call of fn in milliseconds (CUDA events on CUDA)."""
    if device.type == "cuda":

        def time_ms(fn):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
    else:

        def time_ms(fn):
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3

    return time_ms


def matmul_tflops(device, dtype, n=8192, repeats=10):
    """Measured dense matmul rate of the device in this dtype (the roofline the TFLOP/s are read against)."""
    if device.type != "cuda":
        n = 512
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    time_ms = timer(device)
    for _ in range(3):
        a @ b
    ms = statistics.median(time_ms(lambda: a @ b) for _ in range(repeats))
    return 2 * n**3 / (ms * 1e-3) / 1e12


def bench_grid(grid, args, device, dtype, methods):
    N = math.prod(grid)
    x = make_inputs(grid, args.batch, args.heads, args.dim, dtype, device)
    scale = args.dim**-0.5
    window = window_for(grid, args.keep)
    keep = span_keep_fraction(grid, window)
    print(
        f"grid {'x'.join(map(str, grid))}: N = {N}, window half widths {window} keep {keep:.1%} of the keys", flush=True
    )
    g_out = torch.randn(args.batch, args.heads, N, args.dim, device=device, dtype=dtype)
    runs, rows, outputs, notes = {}, {}, {}, {}
    names = list(methods) + (["flex_window"] if "flex" in methods and "window" in methods else [])
    for name in names:
        if name == "eager" and 6 * args.batch * args.heads * N * N * 4 > args.eager_limit_gib * 2**30:
            print(
                f"  {name:11s} skipped: about {6 * args.batch * args.heads * N * N * 4 / 2**30:.0f} GiB "
                "(--eager-limit-gib)",
                flush=True,
            )
            continue
        try:
            run, params = make_method(name, grid, x, window, scale)
            with torch.no_grad():
                for _ in range(max(args.warmup, 1)):
                    outputs[name] = run().float()
        except Exception as e:  # noqa: BLE001 - a baseline that does not run here is reported, not fatal
            print(f"  {name:11s} did not run: {short(e)}", flush=True)
            rows[name] = dict(fwd_ms=float("nan"), fwd_bwd_ms=float("nan"), note="did not run: " + short(e))
            continue
        try:
            for _ in range(args.warmup):
                torch.autograd.grad(run(), params, g_out)
        except Exception as e:  # noqa: BLE001
            print(f"  {name:11s} forward only, the backward did not run: {short(e)}", flush=True)
            notes[name] = "forward only: " + short(e)
            params = None
        if device.type == "cuda":
            torch.cuda.synchronize()
        runs[name] = (run, params)
    # outputs agree before anything is timed (dense methods with posattn, windowed with window)
    tol = 3e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-4
    for name, out in outputs.items():
        base = outputs.get("window" if name == "flex_window" else "posattn")
        if name in ("sdpa", "posattn", "window") or base is None:
            continue
        err = ((out - base).abs().max() / base.abs().max().clamp(min=1e-6)).item()
        print(f"  {name:11s} output check: max relative difference {err:.2e}", flush=True)
        if not err <= tol:
            runs.pop(name, None)
            rows[name] = dict(
                fwd_ms=float("nan"), fwd_bwd_ms=float("nan"), note=f"output differs from posattn ({err:.1e}); not timed"
            )
    time_ms = timer(device)
    times = {name: ([], []) for name in runs}
    for _ in range(args.repeats):
        for name, (run, params) in runs.items():
            with torch.no_grad():
                times[name][0].append(time_ms(run))
            if params is not None:
                times[name][1].append(time_ms(lambda: torch.autograd.grad(run(), params, g_out)))
    peak = {}
    if device.type == "cuda":
        for name, (run, params) in runs.items():
            if params is None:
                continue
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            torch.autograd.grad(run(), params, g_out)
            torch.cuda.synchronize()
            peak[name] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    pairs_dense = args.batch * args.heads * N * N
    for name, (fwd, fb) in times.items():
        pairs = pairs_dense * (keep if name in ("window", "flex_window") else 1.0)
        flops = 2 * pairs * ((args.dim + args.dim) if name == "sdpa" else (2 * args.dim + args.dim))
        f_ms, fb_ms = statistics.median(fwd), statistics.median(fb) if fb else float("nan")
        rows[name] = dict(
            fwd_ms=f_ms,
            fwd_bwd_ms=fb_ms,
            fwd_tflops=flops / (f_ms * 1e-3) / 1e12,
            fwd_bwd_tflops=3.5 * flops / (fb_ms * 1e-3) / 1e12,
            peak_mib=peak.get(name, float("nan")),
            note=notes.get(name, ""),
        )
        print(
            f"  {name:11s} fwd {f_ms:9.3f} ms  fwd+bwd {fb_ms:9.3f} ms  "
            f"{rows[name]['fwd_tflops']:7.3g} / {rows[name]['fwd_bwd_tflops']:7.3g} useful TFLOP/s  "
            f"peak {rows[name]['peak_mib']:.0f} MiB",
            flush=True,
        )
    return dict(grid="x".join(map(str, grid)), window=window, keep=keep, rows=rows)


def summary(res, matmul):
    """Ratio lines and the issue's targets for one grid."""
    r = res["rows"]

    def get(name, key):
        return r.get(name, {}).get(key, float("nan"))

    lines = [f"grid {res['grid']}:"]
    for key, what in (("fwd_ms", "fwd"), ("fwd_bwd_ms", "fwd+bwd")):
        lines.append(
            f"  {what}: posattn / sdpa (no positions) {ratio(get('posattn', key), get('sdpa', key)):.2f}x; "
            f"flex / posattn {ratio(get('flex', key), get('posattn', key)):.2f}x; "
            f"eager / posattn {ratio(get('eager', key), get('posattn', key)):.2f}x; "
            f"general / posattn {ratio(get('general', key), get('posattn', key)):.2f}x; "
            f"dense / window ({res['keep']:.0%} kept) {ratio(get('posattn', key), get('window', key)):.2f}x; "
            f"flex window / posattn window {ratio(get('flex_window', key), get('window', key)):.2f}x"
        )
    lines.append(
        f"  fwd+bwd peak memory over the inputs: posattn / sdpa {ratio(get('posattn', 'peak_mib'), get('sdpa', 'peak_mib')):.2f}x "
        f"({get('posattn', 'peak_mib'):.0f} / {get('sdpa', 'peak_mib'):.0f} MiB)"
    )
    lines.append(
        f"  posattn forward {get('posattn', 'fwd_tflops'):.3g} useful TFLOP/s "
        f"({ratio(get('posattn', 'fwd_tflops'), matmul):.1%} of the measured matmul rate {matmul:.3g})"
    )
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--grid", action="append", help="a grid like 64x64 (repeatable); default 32x32, 64x64, 16x16x16")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--device", default="cuda")
    p.add_argument(
        "--tf32",
        action="store_true",
        help="float32: allow TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32) for every method, "
        "which lets posattn's fast kernels take the call",
    )
    p.add_argument("--keep", type=float, default=0.1, help="fraction of the keys the window keeps")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {','.join(METHODS)}")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--eager-limit-gib", type=float, default=24.0)
    p.add_argument("--markdown", help="also write the results to this file")
    p.add_argument("--json", help="also write ratio records for benchmarks/compare.py to this file")
    args = p.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        p.error(f"--methods: unknown {', '.join(bad)} (choose from {', '.join(METHODS)})")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_relpos_cuda: no CUDA device here; use --device cpu for a smoke test")
    dtype = DTYPES[args.dtype]
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    grids = [parse_grid(g) for g in (args.grid or ["32x32", "64x64", "16x16x16"])]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    matmul = matmul_tflops(device, dtype)
    head = (
        f"Device: {name}, torch {torch.__version__}, posattn {posattn.__version__}, {args.dtype}"
        f"{' (TF32 allowed)' if args.tf32 and dtype == torch.float32 else ''}, "
        f"B={args.batch} H={args.heads} D={args.dim}, {date.today().isoformat()}; measured matmul "
        f"{matmul:.3g} TFLOP/s"
    )
    print(head, flush=True)
    results = [bench_grid(g, args, device, dtype, methods) for g in grids]
    out = [
        head,
        "",
        "| grid | method | fwd ms | fwd+bwd ms | fwd TFLOP/s | fwd+bwd TFLOP/s | fwd+bwd peak MiB | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        for m, row in res["rows"].items():
            out.append(
                f"| {res['grid']} | {m} | {row['fwd_ms']:.3f} | {row['fwd_bwd_ms']:.3f} | "
                f"{row.get('fwd_tflops', float('nan')):.3g} | {row.get('fwd_bwd_tflops', float('nan')):.3g} | "
                f"{row.get('peak_mib', float('nan')):.0f} | "
                f"{row.get('note', '')} |"
            )
    out.append("")
    for res in results:
        out.extend(summary(res, matmul))
    text = "\n".join(out)
    print("\n" + text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    records = []
    for res in results:
        case = f"grid {res['grid']} {args.dtype} B={args.batch} H={args.heads} D={args.dim} ({device.type})"
        r = res["rows"]
        for base in ("sdpa", "flex", "eager", "general"):
            if base in r and "posattn" in r:
                records.append(
                    record(
                        "relpos_attention cuda fwd+bwd",
                        case,
                        "posattn",
                        base,
                        r["posattn"]["fwd_bwd_ms"],
                        r[base]["fwd_bwd_ms"],
                    )
                )
        if "window" in r and "posattn" in r:
            records.append(
                record(
                    "relpos_attention cuda fwd+bwd",
                    case + f" window {res['keep']:.0%}",
                    "posattn window",
                    "posattn dense",
                    r["window"]["fwd_bwd_ms"],
                    r["posattn"]["fwd_bwd_ms"],
                )
            )
    write_records(args.json, records)


if __name__ == "__main__":
    main()
