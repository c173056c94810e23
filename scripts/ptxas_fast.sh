#!/usr/bin/env bash
# ptxas' report of every fast-path kernel (csrc/cuda/fast/*.cu: forward, backward, offset kernel,
# their order and rounding kernels, in every layout class) for each GPU architecture given
# (default: sm_80 sm_86 sm_90, the A100's, the RTX 30's / A10's / L4's family, the H100's):
# registers, stack frame and spills per kernel, one line each, then a summary. Exits non-zero
# where a kernel of the fast path has a stack frame or spills (the fast kernels' contract:
# accumulators in registers, no local memory). Torch-free; ~10 minutes per architecture on 2 cores.
#   bash scripts/ptxas_fast.sh [sm_XY ...]      (OUT=DIR keeps the raw reports, default build/ptxas)
set -euo pipefail
. "$(dirname "$0")/lib.sh"

archs=("$@")
[ ${#archs[@]} -gt 0 ] || archs=(sm_80 sm_86 sm_90)
command -v nvcc >/dev/null || { echo "ptxas_fast: nvcc not found" >&2; exit 1; }
out=${OUT:-build/ptxas}
mkdir -p "$out"
flags=(-std=c++17 -O3 -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__
  -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__ --expt-relaxed-constexpr -Icsrc)
bad=0
for arch in "${archs[@]}"; do
  for src in csrc/cuda/fast/*.cu; do
    name=$(basename "$src" .cu)
    log="$out/$arch.$name.ptxas"
    nvcc "${flags[@]}" -cubin -arch="$arch" -Xptxas -v -o "$out/$arch.$name.cubin" "$src" > "$log" 2>&1 || {
      cat "$log" >&2
      exit 1
    }
  done
done
# ptxas -v: "Compiling entry function 'NAME' for 'sm_XY'", then "N bytes stack frame, N bytes
# spill stores, N bytes spill loads" and "Used N registers" for it
"$PY" - "$out" "${archs[@]}" <<'EOF' || bad=1
import re, subprocess, sys
from pathlib import Path

out, archs = Path(sys.argv[1]), sys.argv[2:]
bad = kernels = 0
for arch in archs:
    for log in sorted(out.glob(f"{arch}.*.ptxas")):
        name = None
        for line in log.read_text().splitlines():
            m = re.search(r"Compiling entry function '(\w+)' for '(sm_\d+)'", line)
            if m:
                name = m.group(1)
                continue
            m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
            if m and name:
                stack, st, ld = map(int, m.groups())
                regs = None
            m2 = re.search(r"Used (\d+) registers", line)
            if m2 and name:
                regs = int(m2.group(1))
                demangled = subprocess.run(["c++filt", name], capture_output=True, text=True).stdout.strip()
                flag = "" if stack == st == ld == 0 else "   <-- stack or spills"
                print(f"{arch}  {regs:3d} regs  stack {stack:4d}  spills {st:4d}/{ld:4d}  {demangled}{flag}")
                kernels += 1
                bad += bool(flag)
                name = None
print(f"ptxas_fast: {kernels} kernels over {', '.join(archs)}; {bad} with a stack frame or spills")
sys.exit(1 if bad or kernels == 0 else 0)
EOF
exit $bad
