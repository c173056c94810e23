#!/usr/bin/env bash
# GPU verification and benchmark in one command, for the lent GPU machine (torch with
# CUDA, Python 3.12, nvcc, compute-sanitizer; no network, no wandb):
#   build     posattn with CUDA for this device's architecture, in place (PYTHONPATH=.)
#   test      a CUDA test selection (~3 min, not yet timed on a GPU): the fast forward's tests,
#             relpos' CUDA contract tests (graph capture, opcheck, determinism, device
#             asserts), apply_maps, the plan
#   test-rest every other CUDA test (pytest -m cuda over tests/, the selection deselected):
#             a follow-up call
#   sanitize  compute-sanitizer memcheck, racecheck and synccheck on small calls of every
#             kernel (scripts/gpu_sanitize_cases.py)
#   bench     benchmarks/bench_relpos_cuda.py and bench_apply_maps.py on CUDA
#   packed    benchmarks/bench_packed.py on CUDA (bfloat16, then float32): packed calls against a
#             loop of single calls and the padded batch (not in the default run)
#   profile   ncu (basic set) on the relpos kernels of the sanitizer cases (not in the default run)
#   profile64 ncu on the fast forward, backward and offset kernels of one bf16 64x64 forward + backward
#             (B = 4, H = 8, D = 64, the benchmark's inputs): speed of light, tensor-pipe use, executed
#             HMMA share, warp stall reasons (ncu.log; not in the default run)
#   tf32      the relpos benchmark in float32 through TF32 at 64x64 (into bench.log; not in the default run)
#   small     the sanitizers and the relpos benchmark again with the plan made for a smaller GPU
#             (POSATTN_CUDA_SMEM_OPTIN=$GPU_CHECK_SMEM_OPTIN, default 101376: an RTX 30 / 40's, A10's,
#             L4's; 166912: an A100's): what those devices run, measured here (not in the default run;
#             its benchmark table: bench_small.md)
# Usage: bash scripts/gpu_check.sh [build] [test] [test-rest] [sanitize] [bench] [packed] [profile] [profile64]
#                                  [tf32] [small]
#   (default: build test sanitize bench)
# Limits per step (seconds): GPU_CHECK_BUILD_SECONDS, _TEST_, _SANITIZE_ (each tool), _BENCH_;
# GPU_CHECK_BENCH_ARGS adds arguments to bench_relpos_cuda.py (e.g. "--grid 64x64"; "--dtype float32
# --tf32": the fast kernels in TF32).
# Every log goes under $OUT (default build/gpu_check), at most 8 files: summary.txt (the
# device, versions and each step's status and seconds), build.log, pytest.log,
# sanitizer.log, bench.log, bench_relpos_cuda.md, bench_relpos_cuda.json (profile: ncu.log
# instead of build.log when run alone; small: bench_small.md; packed: bench_packed_{bfloat16,float32}.md,
# run it in a call of its own). Steps share one
# deadline (GPU_CHECK_SECONDS, default 560 s: a device call is limited to 600 s); a step
# that would not fit is skipped and says so, and a later call can run it alone
# (`bash scripts/gpu_check.sh bench`: the build stays on a warm machine, and `build` is
# skipped when the extension is already built for this device). Exits non-zero if any
# step failed. GPU_CHECK_RESUME=1: a step that ran in an earlier call on this machine (passed,
# failed or timed out; GPU_CHECK_STATE, default build/gpu_check_state/, keeps the record) is not
# run again, so that a follow-up call can name every step and run only those the first call
# skipped for time. A lent GPU's first call, as prepared on 2026-12-04 (then not lent):
#   GPU_CHECK_SECONDS=578 GPU_CHECK_BUILD_SECONDS=420 GPU_CHECK_TEST_SECONDS=130 GPU_CHECK_TEST_PROCS=8 \
#   GPU_CHECK_SANITIZE_SECONDS=100 GPU_CHECK_BENCH_SECONDS=150 \
#   GPU_CHECK_BENCH_ARGS="--grid 64x64 --grid 16x16x16 --methods sdpa,posattn,window,flex,eager" \
#   bash scripts/gpu_check.sh build test bench sanitize profile64 tf32     (timeout_s 595)
# and the follow-up at once on the warm machine (it waits 30 s): the same with GPU_CHECK_RESUME=1
# and the steps ... profile64 tf32 small packed (small: what an RTX / A10 / L4 runs, issue 61's
# layouts; GPU_CHECK_SANITIZE_SECONDS=60 there). (One nvcc translation unit, fast/relpos_fast_f32_d128_
# backward.cu, takes 220 s of device compilation for sm_90 on this project's 2-core machine.)
set -uo pipefail
. "$(dirname "$0")/lib.sh"
OUT=${OUT:-build/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
deadline=$(( $(date +%s) + ${GPU_CHECK_SECONDS:-560} ))
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(build test sanitize bench)
summary="$OUT/summary.txt"
state=${GPU_CHECK_STATE:-build/gpu_check_state}
mkdir -p "$state"
failed=0

{
  echo "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) steps: ${steps[*]}"
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (modified)')"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | sed 's/^/gpu /'
  "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name() if torch.cuda.is_available() else "none")' 2>&1
  nvcc --version 2>&1 | tail -1
} >> "$summary"

# run NAME LIMIT LOG COMMAND...: one step under the remaining time, its status in summary.txt
run() {
  local name=$1 limit=$2 log=$3
  shift 3
  if [ "${GPU_CHECK_RESUME:-0}" = 1 ] && [ -e "$state/$name" ]; then
    echo "$name: ran in an earlier call ($(cat "$state/$name"))" | tee -a "$summary"
    return
  fi
  local left=$(( deadline - $(date +%s) ))
  if [ "$left" -lt 30 ]; then
    echo "$name: SKIPPED (no time left in this call; run \`bash scripts/gpu_check.sh $name\` next)" | tee -a "$summary"
    failed=1
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local start rc
  start=$(date +%s)
  echo "== $name (at most ${limit} s) -> $log"
  timeout "$limit" "$@" >> "$log" 2>&1
  rc=$?
  local verdict=ok
  [ $rc -eq 124 ] && verdict="TIMED OUT after ${limit} s"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && verdict="FAILED (exit $rc)"
  [ $rc -ne 0 ] && failed=1
  echo "$name: $verdict in $(( $(date +%s) - start )) s" | tee -a "$summary"
  echo "$verdict" > "$state/$name"
  tail -n 3 "$log" | sed 's/^/    /'
}

# the test step's selection (test-rest: the others); pytest-xdist, where installed, spreads the
# tests over processes sharing the GPU
quick_tests=(
  tests/ops/relpos/test_relpos_fast_cuda.py tests/ops/relpos/test_relpos_cuda.py
  tests/ops/apply_maps/test_apply_maps_cuda.py tests/ops/relpos/test_relpos_plan.py
)
xdist=()
"$PY" -c 'import xdist' 2>/dev/null && xdist=(-n "${GPU_CHECK_TEST_PROCS:-6}")

arch=$("$PY" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())' 2>/dev/null || echo "9.0")

for step in "${steps[@]}"; do
  case "$step" in
    build)
      # on a follow-up call the copied sources may look newer than the library: the record decides
      if [ "${GPU_CHECK_RESUME:-0}" = 1 ] && [ "$(cat "$state/build" 2>/dev/null)" = ok ] && ls posattn/_C*.so >/dev/null 2>&1; then
        echo "build: built in an earlier call" | tee -a "$summary"
        continue
      fi
      if "$PY" -c 'import torch, posattn, sys; sys.exit(not torch._C._dispatch_has_kernel_for_dispatch_key("posattn::relpos_attention", "CUDA"))' 2>/dev/null \
         && [ -z "$(find csrc -newer posattn/_C*.so 2>/dev/null | head -1)" ]; then
        echo "build: up to date (CUDA kernels registered)" | tee -a "$summary"
        continue
      fi
      run build "${GPU_CHECK_BUILD_SECONDS:-300}" "$OUT/build.log" env FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST="$arch" MAX_JOBS="$(nproc)" POSATTN_NVCC_SPLIT=0 \
        "$PY" setup.py build_ext --inplace
      run registered 60 "$OUT/build.log" "$PY" -c '
import torch, posattn
for op in ("relpos_attention", "relpos_attention_backward", "apply_maps", "apply_maps_backward"):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"posattn::{op}", "CUDA"), op
print("CUDA kernels registered")'
      ;;
    test)
      # the CPU op's errors in a plain process (a segfault on the H200 of 2026-11-26);
      # if it crashes, its native backtrace from cuda-gdb (no gdb on the GPU machine)
      run cpu-errors 60 "$OUT/pytest.log" bash -c "\"$PY\" scripts/cpu_error_smoke.py || { rc=\$?; \
        command -v cuda-gdb >/dev/null && cuda-gdb -batch -ex run -ex bt --args \"$PY\" scripts/cpu_error_smoke.py 2>&1 | tail -60; exit \$rc; }"
      run test "${GPU_CHECK_TEST_SECONDS:-240}" "$OUT/pytest.log" "$PY" -m pytest -q -m cuda -p no:cacheprovider -rfEs \
        "${xdist[@]}" "${quick_tests[@]}"
      ;;
    test-rest)
      deselect=()
      for t in "${quick_tests[@]}"; do deselect+=(--deselect "$t"); done
      run test-rest "${GPU_CHECK_TEST_SECONDS:-400}" "$OUT/pytest.log" "$PY" -m pytest -q -m cuda -p no:cacheprovider -rfEs \
        "${xdist[@]}" tests "${deselect[@]}"
      ;;
    sanitize)
      for tool in memcheck racecheck synccheck; do
        run "sanitize-$tool" "${GPU_CHECK_SANITIZE_SECONDS:-150}" "$OUT/sanitizer.log" compute-sanitizer --tool "$tool" --error-exitcode 1 \
          "$PY" scripts/gpu_sanitize_cases.py
      done
      ;;
    bench)
      run bench-relpos "${GPU_CHECK_BENCH_SECONDS:-300}" "$OUT/bench.log" "$PY" benchmarks/bench_relpos_cuda.py --repeats 5 ${GPU_CHECK_BENCH_ARGS:-} \
        --markdown "$OUT/bench_relpos_cuda.md" --json "$OUT/bench_relpos_cuda.json"
      run bench-apply-maps 120 "$OUT/bench.log" "$PY" benchmarks/bench_apply_maps.py --device cuda --repeats 10
      ;;
    packed)
      for dtype in bfloat16 float32; do
        run "packed-$dtype" "${GPU_CHECK_BENCH_SECONDS:-300}" "$OUT/bench.log" "$PY" benchmarks/bench_packed.py --device cuda \
          --dtype "$dtype" --repeats 5 --markdown "$OUT/bench_packed_$dtype.md"
      done
      ;;
    profile64)
      run profile64 "${GPU_CHECK_PROFILE_SECONDS:-240}" "$OUT/ncu.log" ncu --clock-control none \
        --kernel-name "regex:fast_(forward|backward|offsets)_kernel" --launch-count 6 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats \
        --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_hmma.sum,smsp__inst_executed.sum \
        "$PY" benchmarks/profile_relpos_cuda.py --grid 64x64 --once
      ;;
    tf32)
      run tf32 "${GPU_CHECK_BENCH_SECONDS:-300}" "$OUT/bench.log" "$PY" benchmarks/bench_relpos_cuda.py --repeats 5 \
        --dtype float32 --tf32 --grid 64x64 --methods sdpa,posattn,window,flex
      ;;
    small)
      small=${GPU_CHECK_SMEM_OPTIN:-101376}
      for tool in memcheck racecheck; do
        run "small-sanitize-$tool" "${GPU_CHECK_SANITIZE_SECONDS:-150}" "$OUT/sanitizer.log" env POSATTN_CUDA_SMEM_OPTIN="$small" \
          compute-sanitizer --tool "$tool" --error-exitcode 1 "$PY" scripts/gpu_sanitize_cases.py
      done
      run small-bench "${GPU_CHECK_BENCH_SECONDS:-300}" "$OUT/bench.log" env POSATTN_CUDA_SMEM_OPTIN="$small" \
        "$PY" benchmarks/bench_relpos_cuda.py --repeats 5 ${GPU_CHECK_BENCH_ARGS:-} --markdown "$OUT/bench_small.md"
      ;;
    profile)
      run profile 240 "$OUT/ncu.log" ncu --set basic --kernel-name "regex:relpos|fast_forward|fast_backward|fast_offsets" --launch-count 12 \
        "$PY" scripts/gpu_sanitize_cases.py
      ;;
    *)
      echo "gpu_check: unknown step '$step' (build, test, test-rest, sanitize, bench, packed, profile, profile64, tf32, small)" >&2
      exit 2
      ;;
  esac
done

echo
cat "$summary"
exit $failed
