"""The instruction mix of a CUDA kernel's main loop in its sm_90 machine code (SASS):
how much of the loop is tensor-core work (HMMA) and how much is everything else
(ldmatrix LDSM, shared LDS / STS, local LDL / STL, cp.async LDGSTS, FP32, integer,
MUFU, barriers, ...). Evidence of a kernel's shape without a GPU; the executed counts
come from ncu on a GPU.

The main loop is the outermost loop of the kernel: the backward branch that spans
the most instructions. Its body is counted **statically**: every instruction between
the branch's target and the branch once, both sides of an if, inner loops once. For
a fully unrolled loop body with few branches (the fast path's kernels) that is close
to what one iteration executes; for loops with inner loops (the WMMA tiled kernels,
removed on 2026-11-29) it understates the inner loops' share.

    python benchmarks/sass_mix.py                       # the fast forwards (positional and the FA2 control)
    python benchmarks/sass_mix.py --backward            # the fast backward's kernels
    python benchmarks/sass_mix.py --cubin x.cubin --kernel fast_forward

Needs nvcc (CUDA_HOME or PATH) and cuobjdump, which CUDA 13's toolkit here lacks:
``pip install nvidia-cuda-cuobjdump`` gives it (found on PATH, in CUOBJDUMP, or in
that wheel's nvidia/cu13/bin).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import simlib

REPO = simlib.REPO
LINE_RE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)\s*([^;]*);")
FUNC_RE = re.compile(r"Function : (\S+)")

# opcode (without modifiers) -> class, in the order of the table
CLASSES: List[Tuple[str, Tuple[str, ...]]] = [
    ("HMMA (tensor cores)", ("HMMA",)),
    ("LDSM (ldmatrix)", ("LDSM",)),
    ("LDS / STS (shared)", ("LDS", "STS")),
    ("LDGSTS (cp.async)", ("LDGSTS", "LDGDEPBAR", "DEPBAR")),
    ("LDG / STG (global)", ("LDG", "STG", "RED", "ATOM", "ATOMG")),
    ("LDL / STL (local)", ("LDL", "STL")),
    ("FP32", ("FADD", "FMUL", "FFMA", "FMNMX", "FSEL", "FSETP", "FSET", "FCHK", "F2FP", "F2F", "FRND")),
    ("MUFU (exp, log, rcp)", ("MUFU",)),
    (
        "integer / address",
        (
            "IMAD",
            "IADD3",
            "IADD",
            "VIADD",
            "LOP3",
            "SHF",
            "LEA",
            "ISETP",
            "SEL",
            "IMNMX",
            "PRMT",
            "IABS",
            "I2F",
            "F2I",
            "MOV",
            "CS2R",
            "S2R",
            "S2UR",
            "PLOP3",
            "P2R",
            "R2P",
            "LDC",
            "POPC",
            "FLO",
            "BREV",
            "IMUL",
        ),
    ),  # fmt: skip
    ("uniform datapath (U*)", ()),
    ("SHFL (shuffles)", ("SHFL",)),
    ("BAR (barriers)", ("BAR", "WARPSYNC")),
    ("branches / control", ("BRA", "BSSY", "BSYNC", "CALL", "RET", "EXIT", "NOP", "BREAK", "YIELD", "JMP")),
]


def classify(op: str) -> str:
    for name, ops in CLASSES:
        if op in ops:
            return name
    if op.startswith("U"):
        return "uniform datapath (U*)"
    return "other"


def find_tool(name: str, env: str) -> str:
    if os.environ.get(env):
        return os.environ[env]
    found = shutil.which(name)
    if found:
        return found
    try:  # the PyPI wheel (nvidia-cuda-cuobjdump) puts it under nvidia/cu13/bin
        import nvidia

        for base in nvidia.__path__:
            candidate = Path(base) / "cu13" / "bin" / name
            if candidate.exists():
                return str(candidate)
    except ImportError:
        pass
    sys.exit(f"sass_mix: {name} not found: pip install nvidia-cuda-{name}, or set {env}")


def build_cubin(source: Path, defines: List[str], out: Path) -> Path:
    nvcc = simlib.nvcc()
    if nvcc is None:
        sys.exit("sass_mix: nvcc not found (set CUDA_HOME)")
    cmd = [nvcc, "-cubin", "-arch=sm_90", "-O3", "-std=c++17", *simlib.FLAGS, "-diag-suppress", "177",
           f"-I{simlib.CSRC}", *(f"-D{d}" for d in defines), "-o", str(out), str(source)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"sass_mix: building {source.name} failed:\n{done.stderr[-3000:]}")
    return out


def functions(sass: str) -> Dict[str, List[Tuple[int, str, str]]]:
    """kernel name -> [(address, opcode, operands)]."""
    out: Dict[str, List[Tuple[int, str, str]]] = {}
    current: Optional[str] = None
    for line in sass.splitlines():
        m = FUNC_RE.search(line)
        if m:
            current = m.group(1)
            out[current] = []
            continue
        m = LINE_RE.search(line)
        # (@!PT: never executed, padding the compiler puts around some instructions)
        if m and current is not None and (m.group(2) or "").strip() != "@!PT":
            out[current].append((int(m.group(1), 16), m.group(3), m.group(5)))
    return out


def main_loop(code: List[Tuple[int, str, str]]) -> Optional[Tuple[int, int]]:
    """(first, last) address of the outermost loop: the backward branch spanning most."""
    best = None
    for addr, op, args in code:
        if op != "BRA":
            continue
        target = re.search(r"0x([0-9a-f]+)", args)
        if target and int(target.group(1), 16) < addr:
            span = (int(target.group(1), 16), addr)
            if best is None or span[1] - span[0] > best[1] - best[0]:
                best = span
    return best


def loop_mix(code: List[Tuple[int, str, str]]) -> Tuple[Counter, int]:
    loop = main_loop(code)
    if loop is None:
        return Counter(), 0
    body = [op for addr, op, _ in code if loop[0] <= addr <= loop[1]]
    return Counter(classify(op) for op in body), len(body)


def pick(funcs: Dict[str, list], needle: str) -> Tuple[str, list]:
    """The kernel whose mangled name holds every space-separated part of `needle`."""
    names = [n for n in funcs if all(part in n for part in needle.split())]
    if not names:
        sys.exit(f"sass_mix: no kernel matching {needle!r} in {sorted(funcs)}")
    return names[0], funcs[names[0]]


def table(rows: List[Tuple[str, Counter, int]]) -> str:
    head = "| class | " + " | ".join(label for label, _, _ in rows) + " |"
    lines = [head, "|---|" + "---:|" * len(rows)]
    order = [name for name, _ in CLASSES] + ["other"]
    for name in order:
        if not any(c[name] for _, c, _ in rows):
            continue
        cells = [f"{c[name]} ({100 * c[name] / total:.1f} %)" if total else "-" for _, c, total in rows]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("| **instructions in the loop** | " + " | ".join(str(total) for _, _, total in rows) + " |")
    return "\n".join(lines)


def mixes(args: argparse.Namespace, cuobjdump: str, work: Path) -> List[Tuple[str, Counter, int]]:
    """(label, class counts, loop size) of each kernel asked for (cubins built in `work`)."""
    jobs: List[Tuple[str, Path, str]] = []
    if args.cubin:
        jobs.append((args.kernel or "kernel", args.cubin, args.kernel or ""))
    else:
        fast = build_cubin(
            REPO / "tests" / "cuda_sim" / "fast_forward.cu", [f"FAST_T={args.dtype}", f"FAST_D={args.d}"],
            work / "fast.cubin",
        )  # fmt: skip
        # (the kernels of the layout class of sm_90, Li0EE: fast_forward.cu holds every class's)
        if args.backward:  # (fast_forward.cu holds the backward's kernels too)
            jobs += [
                ("fast dq, FA2 control (2-D)", fast, "fast_backward_kernel Lb0ELi2ELb0ELi0ELi0EE"),
                ("fast dk/dv, FA2 control (2-D)", fast, "fast_backward_kernel Lb0ELi2ELb1ELi0ELi0EE"),
                ("fast dq, positional (1-D)", fast, "fast_backward_kernel Lb1ELi1ELb0ELi0ELi0EE"),
                ("fast dk/dv, positional (1-D)", fast, "fast_backward_kernel Lb1ELi1ELb1ELi0ELi0EE"),
                ("fast dq, positional (2-D)", fast, "fast_backward_kernel Lb1ELi2ELb0ELi0ELi0EE"),
                ("fast dk/dv, positional (2-D)", fast, "fast_backward_kernel Lb1ELi2ELb1ELi0ELi0EE"),
                ("fast dq, positional (3-D)", fast, "fast_backward_kernel Lb1ELi3ELb0ELi0ELi0EE"),
                ("fast dk/dv, positional (3-D)", fast, "fast_backward_kernel Lb1ELi3ELb1ELi0ELi0EE"),
            ]  # (the tiled backward's WMMA kernels, against which BENCHMARKS.md compared these, are gone)
            return _run_jobs(jobs, cuobjdump)
        jobs += [
            ("fast forward, FA2 control (2-D boxes)", fast, "fast_forward_kernel Lb0ELi2ELi0EE"),
            ("fast forward, positional (1-D)", fast, "fast_forward_kernel Lb1ELi1ELi0EE"),
            ("fast forward, positional (2-D)", fast, "fast_forward_kernel Lb1ELi2ELi0EE"),
            ("fast forward, positional (3-D)", fast, "fast_forward_kernel Lb1ELi3ELi0EE"),
        ]  # (the tiled forward's WMMA kernel, against which BENCHMARKS.md compared these, is gone)
    return _run_jobs(jobs, cuobjdump)


def _run_jobs(jobs: List[Tuple[str, Path, str]], cuobjdump: str) -> List[Tuple[str, Counter, int]]:
    rows = []
    for label, cubin, needle in jobs:
        sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
        name, code = pick(functions(sass), needle)
        mix, total = loop_mix(code)
        print(f"{label}: {name}, {len(code)} instructions, main loop {total}", file=sys.stderr)
        rows.append((label, mix, total))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cubin", type=Path, help="a cubin to read instead of building the default pair")
    p.add_argument("--kernel", default=None, help="substring of the kernel's (mangled) name, with --cubin")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "half"])
    p.add_argument("--d", type=int, default=64, choices=[32, 64, 128], help="head dim")
    p.add_argument("--backward", action="store_true", help="the backward's kernels instead of the forwards")
    args = p.parse_args()
    cuobjdump = find_tool("cuobjdump", "CUOBJDUMP")

    with tempfile.TemporaryDirectory(prefix="sass_mix-") as tmp:
        rows = mixes(args, cuobjdump, Path(tmp))
    print(f"sm_90 SASS, {args.dtype}, D = {args.d}: the main loop's instructions, each counted once (static)\n")
    print(table(rows))


if __name__ == "__main__":
    main()
