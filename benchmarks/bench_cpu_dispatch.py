"""Does the portable build (baseline -march=x86-64-v2 plus runtime dispatch to
AVX2 / AVX-512 kernels, csrc/cpu/) lose anything against a -march=native build?

Builds a native copy of the extension once (into --native-dir, ~2 min on 2
cores; kept for later runs), then times the CPU kernels in a fresh process per
variant, each loading its own ``_C`` (two cannot share a process):

- ``native``: the -march=native build (what the extension shipped before);
- ``dispatch``: the installed build with the capability it picks on this CPU;
- ``dispatch:<set>``: the installed build forced to each lower set
  (POSATTN_CPU_CAPABILITY), i.e. what a CPU with only that set runs.

Cases (float32, B=1): the tiled relpos kernel on a 32x32 grid (dense), the
windowed kernel on 64x64 and on a 4096-token sequence (span box of ~1-3 % of
the keys), apply_maps at N=4096; forward and backward ops timed separately,
median of --repeats after warm-up, in --rounds interleaved runs of every
variant (median over the rounds). Prints ms and the ratio native / variant
(> 1: the variant is faster).

    python benchmarks/bench_cpu_dispatch.py [--repeats 15] [--rounds 3] [--threads 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, math, statistics, sys, time
import torch
torch.ops.load_library(sys.argv[1])
threads, repeats = int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
torch.manual_seed(0)
P = torch.ops.posattn


def median_ms(fn):
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def relpos(grid, D, H, sigma_cells, threshold, kernel):
    import os
    os.environ["POSATTN_CPU_KERNEL"] = kernel
    N, G = math.prod(grid), len(grid)
    U = math.prod(2 * n - 1 for n in grid)
    q, k, v, qp = (torch.randn(1, H, N, D) for _ in range(4))
    rel = torch.randn(H, U, D) * 0.1
    bias = torch.randn(H, U) * 0.1
    sigma = None if sigma_cells is None else torch.tensor([[c / n for c, n in zip(sigma_cells, grid)]] * H)
    args = (q, k, v, qp, rel, grid, sigma, threshold, "add", D ** -0.5, False, bias, None, "clip")
    out, lse = P.relpos_attention(*args)
    go = torch.randn_like(out)
    fwd = median_ms(lambda: P.relpos_attention(*args))
    bwd = median_ms(lambda: P.relpos_attention_backward(go, None, q, k, v, qp, rel, grid, sigma, threshold, "add",
                                                        D ** -0.5, False, out, lse, bias, None, "clip"))
    return fwd, bwd


def maps(N, H, A, m, Pn):
    x = torch.randn(4, H, N, A * m)
    M = torch.randn(Pn, H, A, m, m)
    idx = torch.randint(0, Pn, (N, A))
    gy = torch.randn_like(x)
    return (median_ms(lambda: P.apply_maps(x, M, idx)),
            median_ms(lambda: P.apply_maps_backward(gy, x, M, idx, True, True)))


rows = {
    "relpos tiled 32x32 D=32 dense": relpos([32, 32], 32, 4, None, 0.0, "tiled"),
    "relpos window 64x64 D=32 box 7x7": relpos([64, 64], 32, 4, [1.2, 1.2], 0.1, "window"),
    "relpos window 4096 D=32 box 81": relpos([4096], 32, 4, [16.0], 0.1, "window"),
    "apply_maps N=4096 H=4 A=2 m=16": maps(4096, 4, 2, 16, 64),
}
print(json.dumps({"capability": P.cpu_capability(), "rows": rows}))
"""


def native_build(out_dir: str) -> str:
    """Path of a -march=native ``_C`` built from this checkout (built once, then reused)."""
    found = glob.glob(os.path.join(out_dir, "posattn", "_C*.so"))
    if found:
        return found[0]
    print(f"building a -march=native copy of the extension into {out_dir} (once; about 2 minutes) ...", flush=True)
    env = dict(os.environ, POSATTN_CPU_ARCH="native", FORCE_CUDA="0")
    t = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "setup.py",
            "-q",
            "build_ext",
            "--build-lib",
            out_dir,
            "--build-temp",
            os.path.join(out_dir, "tmp"),
        ],
        cwd=ROOT,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    print(f"built in {time.perf_counter() - t:.0f} s", flush=True)
    return glob.glob(os.path.join(out_dir, "posattn", "_C*.so"))[0]


def run_variant(so: str, capability: str | None, threads: int, repeats: int) -> dict:
    env = dict(os.environ)
    env.pop("POSATTN_CPU_CAPABILITY", None)
    if capability:
        env["POSATTN_CPU_CAPABILITY"] = capability
    res = subprocess.run(
        [sys.executable, "-c", CHILD, so, str(threads), str(repeats)], env=env, capture_output=True, text=True
    )
    if res.returncode != 0:
        raise SystemExit(f"variant {capability or 'default'} of {so} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help="runs of every variant, interleaved")
    p.add_argument("--native-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "posattn-native-build"))
    p.add_argument("--json", help="also write the table as JSON here")
    args = p.parse_args(argv)
    if platform.machine() != "x86_64":
        raise SystemExit("the dispatch exists on x86-64 only")
    import posattn._C  # the installed (dispatched) build

    installed = posattn._C.__file__
    native = native_build(args.native_dir)
    best = run_variant(installed, None, 1, 1)["capability"]
    order = ["base", "avx2", "avx512"]
    variants = {"native": (native, None), "dispatch": (installed, None)}
    variants.update({f"dispatch:{cap}": (installed, cap) for cap in order[: order.index(best)]})
    # every variant once per round, rounds interleaved (the machine's drift hits all alike);
    # per case, the median over the rounds of each run's median
    runs = {name: [] for name in variants}
    for r in range(args.rounds):
        for name, (so, cap) in variants.items():
            print(f"round {r + 1}/{args.rounds}: {name}", flush=True)
            runs[name].append(run_variant(so, cap, args.threads, args.repeats)["rows"])
    variants_out = {
        name: {"rows": {case: [statistics.median(run[case][i] for run in rs) for i in range(2)] for case in rs[0]}}
        for name, rs in runs.items()
    }

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(
        f"\nCPU: {cpu}; {args.threads} threads; float32; median of {args.repeats} after warm-up; "
        f"{args.rounds} interleaved rounds; the installed build picks '{best}'"
    )
    names = list(variants_out)
    header = (
        "| case | op | "
        + " | ".join(f"{n} ms" for n in names)
        + " | "
        + " | ".join(f"native / {n}" for n in names[1:])
        + " |"
    )
    print(header)
    print("|" + "---|" * (2 + 2 * len(names) - 1))
    table = []
    for case in variants_out["native"]["rows"]:
        for i, op in enumerate(["forward", "backward"]):
            ms = [variants_out[n]["rows"][case][i] for n in names]
            ratios = [ms[0] / m for m in ms[1:]]
            table.append(dict(case=case, op=op, ms=dict(zip(names, ms)), native_over=dict(zip(names[1:], ratios))))
            print(
                f"| {case} | {op} | "
                + " | ".join(f"{m:.2f}" for m in ms)
                + " | "
                + " | ".join(f"{r:.2f}" for r in ratios)
                + " |"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(cpu=cpu, threads=args.threads, repeats=args.repeats, rows=table), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
