"""Runtime CPU dispatch (csrc/cpu/): the extension is built for a portable
baseline and holds the CPU kernels three times (base, AVX2, AVX-512); each call
runs the widest set the CPU has. Checks that the choice is one this CPU runs,
that every set this CPU runs gives the reference's results (the rest of the
suite runs only the default one), and that the default build keeps wide
instructions inside their kernels, so that it runs on any x86-64-v2 CPU."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess

import pytest
import torch
from helpers.relpos import make_relpos_inputs

import posattn._C
from posattn import ops, reference

ORDER = ["base", "avx2", "avx512"]
X86_LINUX = platform.machine() == "x86_64" and os.path.exists("/proc/cpuinfo")

# What libgcc's __builtin_cpu_supports("x86-64-v3" / "x86-64-v4") requires, in
# /proc/cpuinfo's names (Linux lists a flag only where the OS enabled its state).
V3 = {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}
V4 = V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}


def cpu_flags() -> set:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def supported() -> list:
    """The capabilities this CPU runs, lowest first (from the extension's own choice)."""
    return ORDER[: ORDER.index(ops.cpu_capability()) + 1]


def dispatch_expected() -> bool:
    """Whether this build should hold the AVX2 / AVX-512 kernels: built by GCC >= 12 for
    x86-64 (the compiler named in the shared object's .comment section). Other
    compilers build the base kernels only; a GCC 12 build without them fails below."""
    if platform.machine() != "x86_64" or shutil.which("readelf") is None:
        return False
    comment = subprocess.run(["readelf", "-p", ".comment", posattn._C.__file__], capture_output=True, text=True).stdout
    majors = [int(m) for m in re.findall(r"GCC: \(.*?\) (\d+)\.", comment)]
    return bool(majors) and max(majors) >= 12 and "clang" not in comment


NO_WIDE = "not built by GCC >= 12 for x86-64: the build holds only the base kernels"


@pytest.fixture
def no_override(monkeypatch):
    monkeypatch.delenv("POSATTN_CPU_CAPABILITY", raising=False)


@pytest.mark.skipif(not X86_LINUX, reason="reads the CPU's flags from /proc/cpuinfo (x86-64 Linux)")
@pytest.mark.skipif(not dispatch_expected(), reason=NO_WIDE)
def test_dispatch_picks_the_widest_set_this_cpu_runs(no_override):
    flags = cpu_flags()
    expected = "avx512" if V4 <= flags else "avx2" if V3 <= flags else "base"
    assert ops.cpu_capability() == expected, f"CPU flags: {sorted(flags & V4)}"


def test_environment_picks_a_lower_set_and_refuses_others(monkeypatch, no_override):
    best = ops.cpu_capability()
    for name in supported():
        monkeypatch.setenv("POSATTN_CPU_CAPABILITY", name)
        assert ops.cpu_capability() == name
    for name in ORDER[ORDER.index(best) + 1 :]:  # sets this CPU lacks (none on an AVX-512 CPU)
        monkeypatch.setenv("POSATTN_CPU_CAPABILITY", name)
        with pytest.raises(ValueError, match=f"runs at most '{best}'"):
            ops.cpu_capability()
    monkeypatch.setenv("POSATTN_CPU_CAPABILITY", "sse9")
    with pytest.raises(ValueError, match="POSATTN_CPU_CAPABILITY must be 'base', 'avx2' or 'avx512'.*got 'sse9'"):
        ops.cpu_capability()
    q = torch.randn(1, 1, 6, 4)
    with pytest.raises(ValueError, match="POSATTN_CPU_CAPABILITY"):  # the op refuses too, nothing runs
        ops.relpos_attention(q, q, q, grid=[6])
    monkeypatch.setenv("POSATTN_CPU_CAPABILITY", "")
    assert ops.cpu_capability() == best


# (grid, kernel, dtype, call): both CPU kernels; 1-D/2-D/3-D; lines that are no
# multiple of any vector width (tails), size-1 axes, several runs per line; an
# additive span with a bias, a multiplicative causal one, a fixed window, and
# the dense call without span or window.
CASES = [
    ([150], "window", torch.float32, "span"),
    ([150], "window", torch.float64, "span"),
    ([5, 37], "window", torch.float32, "span"),
    ([2, 3, 70], "window", torch.float32, "causal_multiply"),
    ([5, 37], "window", torch.float32, "window"),
    ([9, 1, 13], "tiled", torch.float32, "span"),
    ([9, 1, 13], "tiled", torch.float64, "causal_multiply"),
    ([1, 41], "tiled", torch.float32, "window"),
    ([6, 7, 5], "tiled", torch.float32, "span"),
    ([6, 7, 5], "tiled", torch.float32, "dense"),
    ([300], "tiled", torch.float64, "dense"),
]


def loss_grads(x, out, lse):
    g = torch.Generator().manual_seed(5)
    go = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.dtype)
    return torch.autograd.grad((out * go).sum() + lse.sum(), list(x.values()))


def run_relpos(grid, dtype, op, call):
    """(out, lse, d inputs...) of ``op`` on the case's inputs (in ``dtype``), and the input names."""
    span = call in ("span", "causal_multiply")
    x = make_relpos_inputs(grid, B=2, H=2, D=9, Dv=7, sigma=span, bias=call != "causal_multiply", dtype=dtype, seed=3)
    kw = dict(grid=grid, return_lse=True)
    if span:
        x["sigma"] = x["sigma"] * 0.15  # boxes small against the grid: the window kernel's case
        kw["threshold"] = 0.05
    if call == "causal_multiply":
        kw.update(causal=True, span_mode="multiply")
    if call == "window":
        kw["window"] = [min(2, n - 1) for n in grid]
    x = {k: v.detach().requires_grad_() for k, v in x.items()}
    out, lse = op(**x, **kw)
    return (out, lse, *loss_grads(x, out, lse)), list(x)


@pytest.mark.parametrize(
    "grid,kernel,dtype,call", CASES, ids=lambda v: "x".join(map(str, v)) if isinstance(v, list) else str(v)
)
def test_every_set_this_cpu_runs_matches_the_reference(monkeypatch, grid, kernel, dtype, call):
    monkeypatch.setenv("POSATTN_CPU_KERNEL", kernel)
    tol = dict(rtol=2e-4, atol=2e-5) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)
    ref, names = run_relpos(grid, torch.float64, reference.relpos_attention, call)
    labels = ["out", "lse"] + [f"d{n}" for n in names]
    for name in supported():
        monkeypatch.setenv("POSATTN_CPU_CAPABILITY", name)
        got, _ = run_relpos(grid, dtype, ops.relpos_attention, call)
        for label, a, b in zip(labels, got, ref):
            assert a.dtype == dtype
            torch.testing.assert_close(a.double(), b, **tol, msg=lambda m: f"{name}, {label}: {m}")


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_apply_maps_on_every_set(monkeypatch, batched, dtype):
    g = torch.Generator().manual_seed(0)
    B, H, N, A, m, P = 2, 3, 11, 2, 19, 5  # m = 19: vectors of every width and a tail
    x = torch.randn(B, H, N, A * m, generator=g, dtype=dtype, requires_grad=True)
    maps = torch.randn(P, H, A, m, m, generator=g, dtype=dtype, requires_grad=True)
    index = torch.randint(0, P, (B, N, A) if batched else (N, A), generator=g)
    gy = torch.randn(B, H, N, A * m, generator=g, dtype=dtype)
    xd, mapsd = x.detach().double().requires_grad_(), maps.detach().double().requires_grad_()
    ref = reference.apply_maps(xd, mapsd, index)
    ref_grads = torch.autograd.grad(ref, [xd, mapsd], gy.double())
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)
    for name in supported():
        monkeypatch.setenv("POSATTN_CPU_CAPABILITY", name)
        y = ops.apply_maps(x, maps, index)
        grads = torch.autograd.grad(y, [x, maps], gy)
        torch.testing.assert_close(y.double(), ref, **tol, msg=lambda msg: f"{name} y: {msg}")
        for label, a, b in zip(["dx", "dmaps"], grads, ref_grads):
            torch.testing.assert_close(a.double(), b, **tol, msg=lambda msg: f"{name} {label}: {msg}")


# Instructions beyond x86-64-v2 (SSE4.2, POPCNT): every AVX / AVX2 / AVX-512
# instruction is VEX / EVEX encoded ("v" mnemonics; k-register moves start
# with "k"), and the BMI / LZCNT / MOVBE ones of x86-64-v3. (Not tzcnt:
# objdump shows the baseline's `rep bsf` as tzcnt.)
BEYOND_V2 = re.compile(
    r"^(v[a-z0-9]+|k[a-z]+[bwdq]|andn|bextr|blsi|blsmsk|blsr|bzhi|mulx|pdep|pext|rorx|"
    r"sarx|shlx|shrx|lzcnt|movbe)$"
)
WIDE_512 = re.compile(r"%zmm|%k[0-7]")


def functions_with(path, test):
    """{demangled function name: first offending instruction} of the shared object."""
    dump = subprocess.run(
        ["objdump", "-d", "-C", "--no-show-raw-insn", path], check=True, capture_output=True, text=True
    ).stdout
    bad, fn = {}, None
    for line in dump.splitlines():
        head = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if head:
            fn = head.group(1)
            continue
        parts = line.split("\t")
        if fn is not None and len(parts) >= 2 and fn not in bad and test(parts[1].strip()):
            bad[fn] = parts[1].strip()
    return bad


@pytest.mark.skipif(
    platform.machine() != "x86_64" or shutil.which("objdump") is None,
    reason="inspects the x86-64 machine code with objdump",
)
@pytest.mark.skipif(not dispatch_expected(), reason=NO_WIDE)
@pytest.mark.skipif(
    bool(os.environ.get("POSATTN_CPU_ARCH")),
    reason="POSATTN_CPU_ARCH is set: the extension was built for another baseline",
)
def test_default_build_keeps_wide_instructions_in_their_kernels():
    """The default build (-march=x86-64-v2) runs on any x86-64-v2 CPU: AVX and
    later instructions appear only in the AVX2 / AVX-512 kernels (their C++
    namespaces ...::avx2:: / ...::avx512::), AVX-512 only in the latter.
    Fails on a -march=native build of an AVX2 or AVX-512 machine."""
    path = posattn._C.__file__

    def outside(names):
        return lambda fn: not any(f"::{n}::" in fn for n in names)

    beyond = functions_with(path, lambda insn: bool(BEYOND_V2.match(insn.split()[0])))
    stray = {fn: i for fn, i in beyond.items() if outside(["avx2", "avx512"])(fn)}
    assert not stray, (
        f"{len(stray)} baseline functions use instructions beyond x86-64-v2, e.g. {list(stray.items())[:3]}"
    )
    wide = functions_with(path, lambda insn: bool(WIDE_512.search(insn)))
    stray = {fn: i for fn, i in wide.items() if outside(["avx512"])(fn)}
    assert not stray, f"{len(stray)} functions outside the AVX-512 kernels use AVX-512, e.g. {list(stray.items())[:3]}"
    # and the wide kernels are there (the dispatch has something to pick)
    assert any("::avx512::" in fn for fn in wide) and any("::avx2::" in fn for fn in beyond)
