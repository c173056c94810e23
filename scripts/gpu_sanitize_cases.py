"""Small calls of every CUDA kernel of posattn, forward and backward, for
compute-sanitizer (memcheck, racecheck, synccheck) in scripts/gpu_check.sh.
Sizes are small (the sanitizers slow kernels down ~100x) but still run every
loop of a kernel more than once: N > 128 keys per block, D > 128 channels.

  python scripts/gpu_sanitize_cases.py [--device cuda]
"""

import argparse
import math

import torch

from posattn import PackedGrids, ops


def relpos_cases(device):
    g = torch.Generator().manual_seed(0)
    cases = [
        dict(grid=[5, 31], D=8, Dv=6, kw=dict(sigma=True, pos=True, threshold=0.3)),
        dict(grid=[3, 4, 11], D=130, Dv=5, kw=dict(sigma=True, pos=True, bias=True, span_mode="multiply")),
        dict(grid=[150], D=4, Dv=140, kw=dict(pos=False, bias=True, window=[9], window_border="shift", causal=True)),
        dict(grid=[1, 7, 1], D=3, Dv=3, kw=dict(sigma=True, pos=True, causal=True, threshold=0.5)),
    ]
    # float16/bfloat16 with D == Dv in {32, 64, 128} and q_pos: the fast forward and backward
    # (D = 128 on the 3-D [3, 5, 7]: the general backward, d rel from the fast offset kernel with
    # its rows in chunks, as on the 2-D [10, 9]): span with threshold, causal, NATTEN kernels (even
    # size, stride, causal axis; the fast forward skips key blocks and masks per range there).
    fast = [
        dict(grid=[9, 13], D=64, Dv=64, kw=dict(sigma=True, pos=True, threshold=0.3)),
        dict(grid=[3, 5, 7], D=128, Dv=128, kw=dict(pos=True, bias=True, causal=True)),
        dict(grid=[150], D=32, Dv=32, kw=dict(pos=True, bias=True, kernel_size=[8], window_stride=[3])),
        dict(
            grid=[11, 12], D=64, Dv=64, kw=dict(sigma=True, pos=True, kernel_size=[5, 4], window_causal=[True, False])
        ),
        # dense ([3, 5, 7] above too: its offset tile in one stage behind a second barrier): several
        # key blocks on every axis, both pipeline stages
        dict(grid=[17, 19], D=64, Dv=64, kw=dict(sigma=True, pos=True, span_mode="multiply")),
        dict(grid=[200], D=32, Dv=32, kw=dict(pos=True, bias=True, causal=True)),
        dict(grid=[10, 9], D=128, Dv=128, kw=dict(sigma=True, pos=True, bias=True)),
    ]
    # float32 through TF32 (allow_tf32): the fast forward and backward, d rel from the fast offset
    # kernel (its rows in four chunks at D = 64 on 2-D grids, whole at D = 32 and at D = 64 on 1-D,
    # in chunks at D = 128 on 1-D; the general one at D = 128 on 2-D)
    tf32_cases = [
        fast[0],
        fast[4],
        fast[5],
        dict(grid=[9, 13], D=32, Dv=32, kw=dict(sigma=True, pos=True, bias=True, causal=True)),
        dict(grid=[150], D=64, Dv=64, kw=dict(sigma=True, pos=True, bias=True, span_mode="multiply", threshold=0.3)),
        # D = 128: the fast forward with its offset tile in chunks (2-D: one stage of K and V, 2
        # chunks; 1-D: two stages, 4 chunks; the barriers between chunks), the general backward
        dict(grid=[10, 9], D=128, Dv=128, kw=dict(sigma=True, pos=True, bias=True, threshold=0.5)),
        dict(grid=[150], D=128, Dv=128, kw=dict(pos=True, bias=True, causal=True)),
    ]
    runs = [(torch.float32, False, cases)]
    if device.type == "cuda":
        runs += [
            (torch.float32, True, tf32_cases),
            (torch.bfloat16, False, cases + fast),
            (torch.float16, False, cases + fast),
        ]
    allow_tf32 = torch.backends.cuda.matmul.allow_tf32
    for dtype, tf32, todo in runs:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for c in todo:
            grid, kw = c["grid"], dict(c["kw"])
            N, U, H, G = 1, 1, 2, len(grid)
            for n in grid:
                N, U = N * n, U * (2 * n - 1)

            def rand(*shape):
                return torch.randn(*shape, generator=g).to(device, dtype).requires_grad_()

            x = dict(q=rand(2, H, N, c["D"]), k=rand(2, H, N, c["D"]), v=rand(2, H, N, c["Dv"]))
            if kw.pop("pos", False):
                x.update(q_pos=rand(2, H, N, c["D"]), rel=rand(H, U, c["D"]))
            if kw.pop("bias", False):
                x["bias"] = rand(H, U)
            if kw.pop("sigma", False):
                x["sigma"] = (0.2 + torch.rand(H, G, generator=g)).to(device).requires_grad_()
            out, lse = ops.relpos_attention(**x, grid=grid, return_lse=True, **kw)
            grads = torch.autograd.grad((out.float() ** 2).sum() + lse.sum(), list(x.values()))
            assert all(torch.isfinite(t).all() for t in grads)
            yield f"relpos {dtype}{' (TF32)' if tf32 else ''} grid {grid} D={c['D']} {sorted(kw)}"
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32


def packed_cases(device):
    """Packed calls: on the general kernels, 2-D and 3-D samples of several shapes, tail tokens, a
    sample of more than 128 tokens (key chunks), a span box, a window, causal order; on the fast
    kernels (bfloat16, D = 32), samples of several query tiles and key blocks, a window, with and
    without a span."""
    g = torch.Generator().manual_seed(2)
    for shapes, max_grid, D, kw in (
        ([[5, 31], [3, 4], [1, 7], [12, 12]], [12, 31], 8, dict(sigma=True, bias=True, threshold=0.3)),
        ([[2, 3, 4], [1, 1, 5], [3, 2, 2]], None, 8, dict(sigma=True, window=[1, 1, 2], causal=True)),
        ([[9, 12], [5, 7], [1, 1], [17, 8]], [17, 13], 32, dict(bias=True, window=[3, 2])),
        ([[9, 12], [5, 7], [1, 1], [17, 8]], [17, 13], 32, dict(sigma=True, bias=True, threshold=0.3)),
    ):
        pk = PackedGrids.from_shapes(shapes, max_grid=max_grid, device=device)
        T, H, U = pk.num_tokens + 3, 2, math.prod(2 * m - 1 for m in pk.max_grid)
        for dtype in (torch.float32, torch.bfloat16) if device.type == "cuda" else (torch.float32,):

            def rand(*shape):
                return torch.randn(*shape, generator=g).to(device, dtype).requires_grad_()

            x = dict(q=rand(1, H, T, D), k=rand(1, H, T, D), v=rand(1, H, T, D), q_pos=rand(1, H, T, D))
            x.update(rel=rand(H, U, D))
            kw = dict(kw)
            if kw.pop("sigma", False):
                x["sigma"] = (0.2 + torch.rand(H, pk.num_axes, generator=g)).to(device).requires_grad_()
            if kw.pop("bias", False):
                x["bias"] = rand(H, U)
            out, lse = ops.relpos_attention(**x, packed=pk, return_lse=True, **kw)
            fin = torch.isfinite(lse)
            grads = torch.autograd.grad((out.float() ** 2).sum() + lse[fin].sum(), list(x.values()))
            assert all(torch.isfinite(t).all() for t in grads)
            yield f"relpos packed {dtype} shapes {shapes} {sorted(kw)}"


def apply_maps_cases(device):
    g = torch.Generator().manual_seed(1)
    for B, H, N, A, m, P, batched in (
        (3, 2, 9, 2, 70, 5, False),
        (2, 1, 140, 65, 2, 7, True),
        (1, 1, 4, 1, 128, 3, False),
    ):
        x = torch.randn(B, H, N, A * m, generator=g).to(device).requires_grad_()
        maps = torch.randn(P, H, A, m, m, generator=g).to(device).requires_grad_()
        index = torch.randint(0, P, (B, N, A) if batched else (N, A), generator=g).to(device)
        y = ops.apply_maps(x, maps, index)
        torch.autograd.grad((y**2).sum(), (x, maps))
        torch.use_deterministic_algorithms(True)
        try:
            torch.autograd.grad((ops.apply_maps(x, maps, index) ** 2).sum(), (x, maps))
        finally:
            torch.use_deterministic_algorithms(False)
        yield f"apply_maps B={B} N={N} A={A} m={m} batched={batched}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    device = torch.device(p.parse_args().device)
    for name in list(relpos_cases(device)) + list(packed_cases(device)) + list(apply_maps_cases(device)):
        print("ok", name, flush=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    print("gpu_sanitize_cases: every case ran")


if __name__ == "__main__":
    main()
