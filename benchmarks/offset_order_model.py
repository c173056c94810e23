"""A model of how the fast offset kernel's blocks share a GPU's SMs (no GPU needed).

The fast offset kernel (csrc/cuda/relpos_fast_offsets.cuh) has one block per (head, tile offset
dT, column block); a block's work is its pairs (batch element, query tile) at dT, B prod_a
(nt_a - |dT_a|), plus a fixed cost (copying its offset box, adding it into d rel). Its shared
memory allows one block per SM. This model assigns blocks greedily to SMs in launch order and
prints the makespan against the ideal (all pairs spread evenly), for:

  parity:  one launch per parity class of tile offsets (2^axes in a row, each with its tail):
           the kernel before 2026-11-29;
  rowmajor: one launch, items ordered row-major by each component's |dT| rank, a block waiting
           before its adds for the overlapping items (tile offsets within 1 per axis) taken before it;
  l1:      the same with items ordered by sum |dT_a| (the kernel's order since 2026-11-29).

Units: one pair = 1; --fixed: a block's fixed cost before its adds, --adds: its adds (the part
that waits for the earlier neighbours). These are assumptions, not measurements: a GPU's ncu
gives the real ones.

    python benchmarks/offset_order_model.py [--sms 132] [--fixed 1.0] [--adds 0.5]
"""

from __future__ import annotations

import argparse
import heapq
import itertools
from typing import List, Sequence, Tuple

# (grid, B, H, tile extents): the shapes of issue 43's GPU targets, and smaller ones
SHAPES = [
    ((64, 64), 4, 8, (8, 8)),
    ((32, 32), 4, 8, (8, 8)),
    ((16, 16, 16), 4, 8, (4, 4, 4)),
    ((1024,), 4, 8, (64,)),
    ((16, 16), 1, 12, (8, 8)),
]


def _rank(v: int) -> int:
    return -2 * v - 1 if v < 0 else 2 * v


def _tiles(grid: Sequence[int], tile: Sequence[int]) -> List[int]:
    return [(n + e - 1) // e for n, e in zip(grid, tile)]


def makespans(grid, B, H, tile, sms: int, fixed: float, adds: float) -> Tuple[float, float, float, float]:
    """(parity, rowmajor, l1, ideal) makespans."""
    nt = _tiles(grid, tile)
    reach = [t - 1 for t in nt]
    nd = len(grid)

    def pairs(dT):
        p = B
        for a in range(nd):
            p *= nt[a] - abs(dT[a])
        return p

    every = list(itertools.product(*[range(-r, r + 1) for r in reach]))
    ideal = sum(pairs(d) for d in every) * H / sms

    parity = 0.0
    for cls in range(1 << nd):
        # (the kernel's order: row-major by each component's |dT| rank, heads fastest)
        members = [d for d in every if all((d[a] + reach[a]) % 2 == (cls >> a) & 1 for a in range(nd))]
        if not members:
            continue
        sm = [0.0] * sms
        for d in sorted(members, key=lambda d: tuple(_rank(x) for x in d)):
            for _ in range(H):
                t = heapq.heappop(sm)
                heapq.heappush(sm, t + pairs(d) + fixed + adds)
        parity += max(sm)

    def ordered(key) -> float:
        done = {}
        sm = [0.0] * sms
        for d in sorted(every, key=key):
            for h in range(H):
                t = heapq.heappop(sm)
                ready = t + pairs(d) + fixed
                for nb in itertools.product((-1, 0, 1), repeat=nd):
                    k = (tuple(d[a] + nb[a] for a in range(nd)), h)
                    if k in done:
                        ready = max(ready, done[k])
                done[(d, h)] = ready + adds
                heapq.heappush(sm, ready + adds)
        return max(done.values())

    rowmajor = ordered(lambda d: tuple(_rank(x) for x in d))
    l1 = ordered(lambda d: (sum(abs(x) for x in d), d))
    return parity, rowmajor, l1, ideal


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sms", type=int, default=132, help="SMs (H100 / H200 SXM: 132)")
    ap.add_argument("--fixed", type=float, default=1.0, help="a block's fixed cost, in pairs")
    ap.add_argument("--adds", type=float, default=0.5, help="a block's adds into d rel, in pairs")
    a = ap.parse_args()
    print(f"makespan / ideal on {a.sms} SMs (fixed cost {a.fixed}, adds {a.adds} pairs per block)")
    print(f"{'grid':>14} {'B':>2} {'H':>3} | {'parity':>7} {'rowmajor':>8} {'l1':>6}")
    for grid, B, H, tile in SHAPES:
        parity, rowmajor, l1, ideal = makespans(grid, B, H, tile, a.sms, a.fixed, a.adds)
        name = "x".join(map(str, grid))
        print(f"{name:>14} {B:>2} {H:>3} | {parity / ideal:>7.2f} {rowmajor / ideal:>8.2f} {l1 / ideal:>6.2f}")


if __name__ == "__main__":
    main()
