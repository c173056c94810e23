"""Which kernels the CUDA plan gives each class of fast call on each class of GPU, by their
opt-in shared memory per block (csrc/cuda/relpos_fast_common.cuh: the fast layouts' classes),
as the extension would plan it there: tests/cuda_sim/plan_table.cu, a host program over the
plan itself (csrc/cuda/relpos_plan.cuh), built with nvcc and run on the CPU (no GPU needed).

    python benchmarks/plan_table.py            # docs/developer/plan.md's table (markdown)
    python benchmarks/plan_table.py --tsv      # one line per (dtype, D, axes, terms, device)
    python benchmarks/plan_table.py --summary  # the README's table: per device, how many run fast

A cell says which of the forward, the backward (d q, d k, d v, d q_pos) and d rel / d bias /
d sigma run on the fast kernels: "fwd bwd rel" all three, "fwd" the forward alone, "-" none
(the general kernels); plain calls (no term per offset) have no d rel. The table of docs/developer/plan.md is
this script's output, and so is the README's summary per device (tests/cuda_sim/test_plan_table.py
checks both).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import simlib  # noqa: E402

SOURCE = simlib.REPO / "tests" / "cuda_sim" / "plan_table.cu"
# the devices of the table: (opt-in shared memory per block, name)
DEVICES = [
    (simlib.SMEM_H100, "H100 / H200"),
    (simlib.SMEM_A100, "A100"),
    (simlib.SMEM_SM86, "RTX 30 / 40, A10, L4, L40"),
]
# the README's summary: each device class's architectures and layout class
ARCHS = {simlib.SMEM_H100: "sm_90", simlib.SMEM_A100: "sm_80", simlib.SMEM_SM86: "sm_86, sm_89, sm_120"}


class Row(NamedTuple):
    dtype: str
    D: int
    axes: int
    terms: str
    smem_optin: int
    forward: str
    backward: str
    offsets: str
    forward_smem: int
    backward_smem: int

    @property
    def all_fast(self) -> bool:
        return self.forward == "fast" and self.backward == "fast" and self.offsets != "general"


def rows() -> List[Row]:
    """The plan of every (dtype, D, axes, terms, device) of plan_table.cu."""
    binary = simlib.build(SOURCE, "plan_table", host=True)
    out = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout
    result = []
    for line in out.splitlines():
        f = line.split("\t")
        result.append(Row(f[0], int(f[1]), int(f[2]), f[3], int(f[4]), *f[5:8], int(f[8]), int(f[9])))
    return result


def cell(r: Row) -> str:
    parts = [("fwd", r.forward == "fast"), ("bwd", r.backward == "fast"), ("rel", r.offsets == "fast")]
    return " ".join(name for name, fast in parts if fast) or "-"


def markdown(table: List[Row]) -> str:
    """docs/developer/plan.md's table: per call class (D, axes, with or without a term per offset) and
    device, what runs fast for 16-bit types and for float32 through TF32. float16 and bfloat16
    share their layouts; "span" (a bias and a span) plans as "pos" (q_pos and rel) does."""
    by: Dict[tuple, Row] = {(r.dtype, r.D, r.axes, r.terms, r.smem_optin): r for r in table}
    for r in table:  # (the claim above, checked: the table would be wrong otherwise)
        if r.dtype == "f16":
            assert cell(r) == cell(by[("bf16", r.D, r.axes, r.terms, r.smem_optin)]), r
        if r.terms == "span":
            assert cell(r) == cell(by[(r.dtype, r.D, r.axes, "pos", r.smem_optin)]), r
    head = ["D", "axes", "term per offset"]
    head += [f"16-bit, {name}" for _, name in DEVICES] + [f"TF32, {name}" for _, name in DEVICES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for D in (32, 64, 128):
        for axes in (1, 2, 3):
            for terms in ("pos", "plain"):
                cells = [str(D), str(axes), "yes" if terms == "pos" else "no"]
                for dtype in ("bf16", "f32"):
                    cells += [cell(by[(dtype, D, axes, terms, optin)]) for optin, _ in DEVICES]
                lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def summary_markdown(table: List[Row]) -> str:
    """The README's table: per device class, of the fast path's call classes (float16, bfloat16,
    float32 through TF32; D = 32, 64, 128; 1-3 axes; plain, q_pos and rel, a bias and a span), how many
    run the forward, the backward and d rel / d bias / d sigma (calls with a term per offset) on the
    fast kernels."""
    head = ["GPU", "shared memory per block", "forward fast", "backward fast", "d rel / d bias / d sigma fast"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---:|---:|---:|"]
    for optin, name in DEVICES:
        mine = [r for r in table if r.smem_optin == optin]
        terms = [r for r in mine if r.terms != "plain"]
        counts = [
            sum(r.forward == "fast" for r in mine),
            sum(r.backward == "fast" for r in mine),
            sum(r.offsets == "fast" for r in terms),
        ]
        totals = [len(mine), len(mine), len(terms)]
        cells = [f"{name} ({ARCHS[optin]})", f"{optin:,} bytes"]
        cells += [f"{c} of {t}" for c, t in zip(counts, totals)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tsv", action="store_true", help="the plan of every call and device, tab-separated")
    ap.add_argument(
        "--summary", action="store_true", help="the README's table: per device, how many call classes run fast"
    )
    args = ap.parse_args(argv)
    if simlib.nvcc() is None:
        print("plan_table: nvcc not found (set CUDA_HOME)", file=sys.stderr)
        return 1
    table = rows()
    if args.tsv:
        print("\t".join(Row._fields))
        for r in table:
            print("\t".join(str(x) for x in r))
    elif args.summary:
        print(summary_markdown(table), end="")
    else:
        print(markdown(table), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
