"""Build posattn and its C++/CUDA extension ``posattn._C`` against the installed torch.

Install with ``pip install --no-build-isolation -e .`` after installing torch
(see scripts/setup.sh): the extension must be compiled against the very torch
that will load it, so pip must not build it in an isolated environment.

Environment:
  FORCE_CUDA=1        build the CUDA sources even if torch or nvcc look CPU-only
  FORCE_CUDA=0        never build the CUDA sources
  POSATTN_CPU_ARCH    value for -march of the whole extension (default: "x86-64-v2" on x86-64,
                      nothing elsewhere; "" for the compiler's default). The CPU kernels are
                      compiled for this baseline and again for AVX2 and AVX-512, and each call
                      runs the widest set the CPU has (csrc/cpu/capability.h), so the default
                      build runs on any x86-64-v2 CPU, within a few percent of a native one.
  POSATTN_NVCC_SPLIT  nvcc --split-compile value (unset: not passed; 0: as many threads as
                      cores): runs nvcc's optimiser on several threads, which takes the
                      tiled kernels' translation unit (removed since) from ~270 s to ~160 s on 2 cores
                      (scripts/gpu_check.sh sets it to spend less of a lent GPU's time)
  POSATTN_CUDA_PTX_ONLY=1  device code as PTX only, for each architecture of TORCH_CUDA_ARCH_LIST
                      (default 9.0), no SASS: ptxas does not run (about a third of the device
                      compilation) and the driver compiles the PTX when the kernels first load on
                      a GPU. For a build that only has to link, import and register (scripts/cuda_build.sh
                      on CI); scripts/ptxas_fast.sh checks what ptxas makes of the kernels.
  POSATTN_CUDA_DEVICE_OPT=0  device code not optimised (nvcc -Xcicc -O0): the device compilation
                      takes about half the time (the bf16 D = 64 harness: 24 s against 55 s). Only for a
                      build whose kernels never run (scripts/cuda_build.sh on CI, with
                      POSATTN_CUDA_PTX_ONLY=1); the simulated suite runs the -O3 kernels.
"""

import glob
import os
import platform
import sys

from setuptools import find_packages, setup

try:
    import torch
    from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension
except ImportError:  # pragma: no cover - build-time message
    sys.exit(
        "posattn builds against the installed PyTorch: install it first "
        "(pip install torch==2.13.0), then `pip install --no-build-isolation -e .`"
    )

HERE = os.path.dirname(os.path.abspath(__file__))


def want_cuda() -> bool:
    force = os.environ.get("FORCE_CUDA")
    if force is not None:
        return force == "1"
    return torch.version.cuda is not None and CUDA_HOME is not None


def ptx_archs():
    """The compute capabilities of TORCH_CUDA_ARCH_LIST (default 9.0) as nvcc writes them ("90").
    torch's own arch flags are left out once ours are given (it skips them when a flag names an arch)."""
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0").replace(",", ";").replace(" ", ";")
    out = []
    for a in filter(None, archs.split(";")):
        a = a.removesuffix("+PTX")
        if not a.replace(".", "").rstrip("af").isdigit() or "." not in a:
            sys.exit(f"setup.py: POSATTN_CUDA_PTX_ONLY=1 takes TORCH_CUDA_ARCH_LIST as numbers such as 9.0, got {a!r}")
        out.append(a.replace(".", ""))
    return out


def extension():
    cpp = sorted(glob.glob(os.path.join("csrc", "**", "*.cpp"), recursive=True))
    cu = sorted(glob.glob(os.path.join("csrc", "**", "*.cu"), recursive=True))
    default_arch = "x86-64-v2" if platform.machine() in ("x86_64", "AMD64") else ""
    arch = os.environ.get("POSATTN_CPU_ARCH", default_arch)
    # -fopenmp: at::parallel_for is a header template around `omp parallel`;
    # without it the kernels would silently run on one thread.
    # -Wno-psabi: GCC notes that 32/64-byte vector arguments change the ABI between
    # targets; the vectors never cross between the capability builds (csrc/cpu/).
    cxx = ["-O3", "-fopenmp", "-fno-math-errno", "-Wall", "-Wno-psabi"]
    if arch:
        cxx.append(f"-march={arch}")
    nvcc = ["-O3", "-lineinfo"]
    split = os.environ.get("POSATTN_NVCC_SPLIT")
    if split:
        nvcc.append(f"--split-compile={int(split)}")
    if os.environ.get("POSATTN_CUDA_DEVICE_OPT") == "0":
        nvcc += ["-Xcicc", "-O0"]
    if os.environ.get("POSATTN_CUDA_PTX_ONLY") == "1":
        nvcc += [f"-gencode=arch=compute_{a},code=compute_{a}" for a in ptx_archs()]
    if want_cuda() and cu:
        return CUDAExtension(
            "posattn._C",
            cpp + cu,
            extra_compile_args={"cxx": cxx + ["-DPOSATTN_WITH_CUDA"], "nvcc": nvcc},
            extra_link_args=["-fopenmp"],
        )
    return CppExtension("posattn._C", cpp, extra_compile_args={"cxx": cxx}, extra_link_args=["-fopenmp"])


setup(
    packages=find_packages(include=["posattn", "posattn.*"]),
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension},
)
