"""The CPU op's input errors in a plain process: on the H200 of 2026-11-26 (torch
2.11.0+cu130, the extension built there with /opt/gcc's g++) the CPU call with a
zero sigma died with a segmentation fault instead of raising ValueError (twice, also
outside pytest-xdist), while the same code raises here. scripts/gpu_check.sh runs
this first and, if it crashes, again under cuda-gdb for the native backtrace.

  python scripts/cpu_error_smoke.py
"""

import torch

from posattn import ops


def main() -> None:
    q = torch.randn(1, 2, 12, 4)
    print("ok: a CPU call", tuple(ops.relpos_attention(q, q, q, grid=[3, 4]).shape), flush=True)
    for name, kw in (
        ("a bad grid", dict(grid=[5, 4])),
        ("a zero sigma", dict(grid=[3, 4], sigma=torch.tensor([[0.3, 0.3], [0.0, 0.3]]))),
        ("a NaN sigma", dict(grid=[3, 4], sigma=torch.tensor([[0.3, 0.3], [float("nan"), 0.3]]))),
    ):
        try:
            ops.relpos_attention(q, q, q, **kw)
        except ValueError as e:
            print(f"ok: {name} raises ValueError: {str(e)[:70]}", flush=True)
        else:
            raise SystemExit(f"{name} raised nothing")
    print("cpu_error_smoke: every error raised")


if __name__ == "__main__":
    main()
