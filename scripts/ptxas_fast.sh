#!/usr/bin/env bash
# ptxas' report of every fast-path kernel (csrc/cuda/fast/*.cu: forward, backward, offset kernel,
# their order and rounding kernels, in every layout class) for each GPU architecture given
# (default: sm_80 sm_86 sm_90, the A100's, the RTX 30's / A10's / L4's family, the H100's):
# registers, stack frame and spills per kernel, one line each, then a summary. Exits non-zero
# where a kernel of the fast path has a stack frame or spills (the fast kernels' contract:
# accumulators in registers, no local memory), but for a forward or backward kernel of a layout
# class the architecture's devices never run (relpos_fast_common.cuh: class 0 needs 227 KiB of
# shared memory per block, sm_90's; class 1 163 KiB, sm_80's / sm_87's), which it lists apart.
# Torch-free; ~10 minutes per architecture on 2 cores.
#   bash scripts/ptxas_fast.sh [sm_XY ...]      (OUT=DIR keeps the raw reports, default build/ptxas;
#                                                 FILES='csrc/cuda/fast/*_d128*.cu': only those files;
#                                                 NVCC_FLAGS=-DPOSATTN_FAST_INSTANCES=2: more nvcc flags,
#                                                 here only the packed calls' instances)
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
  for src in ${FILES:-csrc/cuda/fast/*.cu}; do
    name=$(basename "$src" .cu)
    log="$out/$arch.$name.ptxas"
    # shellcheck disable=SC2086  # (NVCC_FLAGS: words)
    nvcc "${flags[@]}" ${NVCC_FLAGS:-} -cubin -arch="$arch" -Xptxas -v -o "$out/$arch.$name.cubin" "$src" > "$log" 2>&1 || {
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
# the layout classes each architecture's devices run (by their opt-in shared memory per block)
RUNS = {"sm_80": {1, 2}, "sm_87": {1, 2}, "sm_86": {2}, "sm_89": {2}, "sm_120": {2}}
bad = kernels = idle = 0
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
                # the layout class: the forward's fifth template argument (T, D, POS, NDIM, SC, PACKED), the
                # backward's sixth (T, D, POS, NDIM, KEYS, SC, HALF)
                m3 = re.search(r"fast_(forward|backward)_kernel<([^<>]*)>\(", demangled)
                sc = int(m3.group(2).split(", ")[4 if m3.group(1) == "forward" else 5]) if m3 else None
                runs = sc is None or sc in RUNS.get(arch, {0, 1, 2})
                flag = ""
                if not stack == st == ld == 0:
                    flag = "   <-- stack or spills" if runs else "   (stack or spills: a class these devices never run)"
                print(f"{arch}  {regs:3d} regs  stack {stack:4d}  spills {st:4d}/{ld:4d}  {demangled}{flag}")
                kernels += 1
                bad += bool(flag) and runs
                idle += bool(flag) and not runs
                name = None
print(
    f"ptxas_fast: {kernels} kernels over {', '.join(archs)}; {bad} with a stack frame or spills"
    + (f" ({idle} more in a layout class that architecture's devices never run)" if idle else "")
)
sys.exit(1 if bad or kernels == 0 else 0)
EOF
exit $bad
