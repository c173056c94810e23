"""Running posattn's CUDA kernels on the simulated GPU (../shared/gpusim): building
the harness (tests/cuda_sim/harness.cu, one binary per element type and fast kernels'
head dim) and other torch-free test programs (build), writing a case, running it under
the simulator (run, run_case) and reading back what the kernels computed. Used by the simulated-GPU tests (tests/cuda_sim/) and by
benchmarks/sim_cycles.py.

The harness needs no torch; this module does (it turns tensors into the harness'
raw files and back). Environment:
  GPUSIM_KIT    the simulator kit (default: ../shared/gpusim beside the checkout)
  GPUSIM_HOME   its build (default ~/.cache/posattn-gpusim, as the kit's setup.sh)
  CUDA_HOME     the toolkit whose nvcc builds the harness (default: nvcc on PATH)
  POSATTN_SIM_BUILD  where the built programs are kept (default ~/.cache/posattn-sim-builds):
                a program is rebuilt only when a file it is built from, a flag or nvcc changed
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Sequence

import torch

REPO = Path(__file__).resolve().parent.parent
HARNESS = REPO / "tests" / "cuda_sim" / "harness.cu"
CSRC = REPO / "csrc"
# Kept outside the checkout, as the simulator's build and its ptxas cache are: a fresh clone whose
# kernels did not change (CI) builds nothing (1,452 CPU seconds of builds on 2026-12-04), and
# each program's name carries the hash of all it is built from (_sources_hash).
BUILD = Path(os.environ.get("POSATTN_SIM_BUILD", Path.home() / ".cache" / "posattn-sim-builds"))

# the element type names of the harness (-DHARNESS_T)
TYPE_NAMES = {torch.float32: "float", torch.float64: "double", torch.float16: "half", torch.bfloat16: "bf16"}
# torch's nvcc flags that change what the kernels may use (no implicit half conversions)
TORCH_HALF_FLAGS = [
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
]
# the simulator crashes in __assertfail and __trap: failed device-side checks print their message instead
FLAGS = TORCH_HALF_FLAGS + ["-DPOSATTN_DEVICE_ASSERT_PRINTS"]
ASSERT_PREFIX = "posattn device assertion failed: "


def kit_dir() -> Path:
    return Path(os.environ.get("GPUSIM_KIT", REPO.parent / "shared" / "gpusim")).resolve()


def sim_home() -> Path:
    return Path(os.environ.get("GPUSIM_HOME", Path.home() / ".cache" / "posattn-gpusim"))


def nvcc() -> Optional[str]:
    home = os.environ.get("CUDA_HOME")
    if home and (Path(home) / "bin" / "nvcc").exists():
        return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


def unavailable() -> Optional[str]:
    """Why kernels cannot run on the simulator here (None: they can)."""
    if not (kit_dir() / "run.sh").exists():
        return f"no simulator kit at {kit_dir()} (set GPUSIM_KIT)"
    if not ((sim_home() / "STAMP").exists() and (sim_home() / "lib" / "libcudart.so.13").exists()):
        return f"the simulator is not built in {sim_home()}: run bash scripts/cuda_sim.sh (or {kit_dir()}/setup.sh)"
    if nvcc() is None:
        return "nvcc not found (set CUDA_HOME)"
    return None


_NVCC_VERSION: Dict[str, str] = {}


def _sources_hash(source: Path, defines: Sequence[str] = ()) -> str:
    """A hash of all a program is built from: every header of csrc/ (the programs include no
    .cu or .cpp of it), the test programs' shared headers, the program, the flags, its defines and
    nvcc's version."""
    h = hashlib.sha256()
    headers = {".h", ".cuh", ".hpp", ".inc"}
    files = sorted(f for f in CSRC.rglob("*") if f.suffix in headers) + sorted(HARNESS.parent.glob("*.h")) + [source]
    for f in files:
        h.update(str(f.relative_to(REPO)).encode())
        h.update(f.read_bytes())
    h.update(" ".join(FLAGS + list(defines)).encode())
    cc = nvcc() or ""
    if cc not in _NVCC_VERSION:
        _NVCC_VERSION[cc] = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout if cc else ""
    h.update(_NVCC_VERSION[cc].encode())
    return h.hexdigest()[:12]


def build(source: Path, name: str, defines: Sequence[str] = (), host: bool = False, start: bool = False) -> Path:
    """The simulator binary `name` of the torch-free CUDA program `source` (compiled
    with -Icsrc, the -D`defines` and torch's half flags, PTX for compute_80), built
    if it or a header of csrc/ changed. Safe to call from several processes at once.
    host: a program with no kernel and no CUDA call (plan_table.cu), run on the CPU.
    start: a new binary is started once on the simulator, without arguments (the program
    must then exit at once), before another process may use it: its first start runs
    the simulator's ptxas over all of its PTX (30-60 s of 2 cores for a fast harness),
    whose report is cached; two processes starting it at once would both run ptxas."""
    BUILD.mkdir(parents=True, exist_ok=True)
    binary = BUILD / f"{name}-{_sources_hash(source, defines)}"
    with open(BUILD / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not binary.exists():
            for old in BUILD.glob(f"{name}-*"):
                old.unlink()
            cmd = [
                nvcc(),
                "-O3",
                "-std=c++17",
                *FLAGS,
                "-diag-suppress",
                "177",
                *([] if host else ["-gencode", "arch=compute_80,code=compute_80", "-cudart", "shared"]),
                f"-I{CSRC}",
                *(f"-D{d}" for d in defines),
                "-o",
                str(binary) + ".tmp",
                str(source),
            ]
            t0 = time.monotonic()
            done = subprocess.run(cmd, capture_output=True, text=True)
            _log_time("build", name, t0)
            if done.returncode != 0:
                raise RuntimeError(f"building {name} failed:\n{' '.join(cmd)}\n{done.stdout}{done.stderr}")
            os.replace(str(binary) + ".tmp", binary)
            if start:
                t0 = time.monotonic()
                run(binary, log=False)
                _log_time("start", name, t0)
    return binary


def harness(dtype: torch.dtype, fast_d: Optional[int] = None, packed: bool = False) -> Path:
    """The harness binary for `dtype` (with the fast kernels of head dim `fast_d`: their
    instances for single-grid calls, or with `packed` for packed ones; the general kernels
    take both kinds in every binary)."""
    defines = [f"HARNESS_T={TYPE_NAMES[dtype]}"]
    if fast_d:
        defines += [f"HARNESS_FAST_D={fast_d}", f"POSATTN_FAST_INSTANCES={2 if packed else 1}"]
    return build(HARNESS, harness_name(dtype, fast_d, packed), defines, start=True)


def harness_name(dtype: torch.dtype, fast_d: Optional[int] = None, packed: bool = False) -> str:
    """The name of harness(dtype, fast_d, packed)'s program (the tests' xdist groups)."""
    return f"harness_{TYPE_NAMES[dtype]}" + (f"_fast{fast_d}" + ("_packed" if packed else "") if fast_d else "")


# ---- cases -----------------------------------------------------------------------

# The devices the relpos cases plan for (case.txt's smem_optin: the opt-in shared memory per
# block): by default an H100 / H200's. The harness makes the extension's plan
# (csrc/cuda/relpos_plan.cuh) for it, runs what the plan chose (the fast kernels in the layouts
# of the device's class, csrc/cuda/relpos_fast_common.cuh) and reports it. The simulator itself
# enforces no such limit: the launchers refuse a layout larger than smem_optin.
SMEM_H100 = 232448  # sm_90: H100, H200
SMEM_A100 = 166912  # sm_80: A100
SMEM_SM86 = 101376  # sm_86 / sm_89: RTX 30 / 40, A10, L4, L40
PLAN_SMEM_OPTIN = SMEM_H100


def plan_settings(path: str, smem_optin: int = PLAN_SMEM_OPTIN) -> Dict[str, object]:
    """case.txt lines that make the harness plan a relpos call as the extension does on a
    device with `smem_optin` bytes of opt-in shared memory per block (default an H100 / H200's):
    path "auto" with POSATTN_CUDA_KERNEL=auto (the fast kernels where they take the call, else
    the general ones), "fast" with POSATTN_CUDA_KERNEL=fast, "general" with
    POSATTN_CUDA_KERNEL=general."""
    requests = {"auto": "auto", "fast": "fast", "general": "general"}
    if path not in requests:
        raise ValueError(f"path must be one of {sorted(requests)}, got {path!r}")
    return dict(request=requests[path], smem_optin=int(smem_optin))


def write_tensor(path: Path, t: torch.Tensor) -> None:
    t = t.detach().cpu().contiguous()
    if t.dtype in (torch.float16, torch.bfloat16):
        t = t.view(torch.int16)
    path.write_bytes(t.numpy().tobytes())


def read_tensor(path: Path, dtype: torch.dtype, shape: Sequence[int]) -> torch.Tensor:
    raw = bytearray(path.read_bytes())
    if dtype in (torch.float16, torch.bfloat16):
        return torch.frombuffer(raw, dtype=torch.int16).view(dtype).reshape(shape).clone()
    return torch.frombuffer(raw, dtype=dtype).reshape(shape).clone()


@dataclass
class SimRun:
    """What a harness run left: its directory, exit status, output and wall time."""

    dir: Path
    returncode: int
    output: str
    seconds: float

    def read(self, name: str, dtype: torch.dtype, shape: Sequence[int]) -> torch.Tensor:
        return read_tensor(self.dir / f"{name}.out.bin", dtype, shape)

    def tail(self, lines: int = 30) -> str:
        """The end of the run's output (the harness' message and the simulator log's last lines)."""
        return "\n".join(self.output.splitlines()[-lines:])

    def result(self) -> Dict[str, str]:
        lines = (self.dir / "result.txt").read_text().splitlines()
        return dict(line.split(None, 1) for line in lines if line.strip())


def run(
    binary: Path,
    args: Sequence[str] = (),
    timing: bool = False,
    timeout: float = 900,
    rundir=None,
    extra_env: Optional[Dict[str, str]] = None,
    log: bool = True,
):
    """Runs `binary` on the simulator (timing: GPGPU-Sim's cycle model, much slower; else
    with the race check on, fatal; rundir: keep the simulator's run directory, with its log,
    there; extra_env: more environment variables for the program; log: its time goes to
    POSATTN_SIM_TIMES); the process."""
    env = dict(os.environ, **(extra_env or {}))
    env.pop("GPUSIM_TIMING", None)
    if timing:
        env["GPUSIM_TIMING"] = "1"
    else:
        # the kit's race check (its README, "Race check"): a shared-memory hazard between warps or
        # lanes of a block (a missing barrier, __syncwarp or cp.async wait) ends the run with status
        # 97, which the tests see as a failure; GPUSIM_RACECHECK=0 in the environment turns it off
        env.setdefault("GPUSIM_RACECHECK", "fatal")
        if env["GPUSIM_RACECHECK"] == "0":
            del env["GPUSIM_RACECHECK"]
    env.pop("GPUSIM_RUNDIR", None)
    if rundir is not None:
        env["GPUSIM_RUNDIR"] = str(rundir)
    t0 = time.monotonic()
    done = subprocess.run(
        ["bash", str(kit_dir() / "run.sh"), str(binary), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    if log:
        _log_time("run", Path(binary).name, t0)
    return done


def _log_time(what: str, name: str, t0: float) -> None:
    """With POSATTN_SIM_TIMES set: a line "what name seconds" appended to that file (the suite's
    builds and runs, to see where its time goes: scripts/cuda_sim.sh sets it)."""
    path = os.environ.get("POSATTN_SIM_TIMES")
    if path:
        with open(path, "a") as f:
            f.write(f"{what} {name} {time.monotonic() - t0:.2f}\n")


def run_checks(source: Path, name: str, timeout: float = 600):
    """Builds and runs a check program (warp_primitives.cu, offset_order.cu: a "PASS name" or
    "FAIL name: detail" line per check); (exit status, {name: (PASS / FAIL, detail)}, output)."""
    done = run(build(source, name), timeout=timeout)
    lines = {}
    for line in done.stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("PASS", "FAIL"):
            check, _, detail = rest.partition(": ")
            lines[check] = (word, detail)
    return done.returncode, lines, done.stdout + done.stderr


def run_case(
    binary: Path,
    case_dir: Path,
    settings: Dict[str, object],
    arrays: Dict[str, torch.Tensor],
    timing: bool = False,
    timeout: float = 900,
    rundir: Optional[Path] = None,
    extra_env: Optional[Dict[str, str]] = None,
) -> SimRun:
    """Writes the case (settings as case.txt lines, arrays as NAME.bin) and runs the
    harness on the simulator (timing: GPGPU-Sim's cycle model, much slower; rundir:
    keep the simulator's run directory, with its log, there; extra_env: more environment
    variables, e.g. GPUSIM_EXTRA's config lines)."""
    case_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for key, value in settings.items():
        if value is None:
            continue
        if isinstance(value, (list, tuple)):
            value = " ".join(str(int(x)) for x in value)
        elif isinstance(value, bool):
            value = int(value)
        lines.append(f"{key} {value}")
    (case_dir / "case.txt").write_text("\n".join(lines) + "\n")
    for name, t in arrays.items():
        write_tensor(case_dir / f"{name}.bin", t)
    start = time.perf_counter()
    done = run(binary, [str(case_dir.resolve())], timing=timing, timeout=timeout, rundir=rundir, extra_env=extra_env)
    return SimRun(case_dir, done.returncode, done.stdout + done.stderr, time.perf_counter() - start)


if __name__ == "__main__":  # scripts/cuda_sim.sh: the suite must run, not skip
    import sys

    why = unavailable()
    if why:
        sys.exit("cuda_sim: cannot run the kernels on the simulator: " + why)
