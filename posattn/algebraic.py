"""Building the maps of algebraic (orthogonal-power) positional encodings.

Kogkalidis et al. (NeurIPS 2024): scores ``q^T W^(p_k - p_q) k`` with W
orthogonal, computed as ``(W^p_q q) . (W^p_k k)``. Everything here is batched,
differentiable and stays on the device (no host synchronisation):

- :func:`orthogonal`: ``W = matrix_exp(S - S^T)`` from unconstrained S.
- :func:`power_table`: ``W^0 .. W^(P-1)`` by repeated doubling (log2 P matmuls).
- :func:`rope_rotation` / :func:`rope_generator_init`: the RoPE rotation, and the
  S whose W equals it (RoPE-like initialisation).
- Trees: :func:`tree_maps_heap` (breadth-first heap positions, level by level)
  and :func:`tree_maps_parents` ((parent, branch) arrays, pointer doubling).

Maps are returned in the layout :func:`posattn.ops.apply_maps` takes:
(P, H, A, m, m).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

__all__ = [
    "orthogonal",
    "power_table",
    "rope_angles",
    "rope_rotation",
    "rope_generator_init",
    "tree_maps_heap",
    "tree_maps_parents",
    "heap_depth",
]


def orthogonal(s: torch.Tensor) -> torch.Tensor:
    """``matrix_exp(S - S^T)`` over the last two dims: an orthogonal matrix (det +1)."""
    return torch.linalg.matrix_exp(s - s.transpose(-1, -2))


def power_table(w: torch.Tensor, num_powers: int) -> torch.Tensor:
    """(num_powers, *w.shape): ``W^0, W^1, ..., W^(num_powers - 1)`` by repeated
    doubling: powers [k, 2k) are powers [0, k) times W^k (ceil(log2 P) batched matmuls)."""
    if num_powers < 1:
        raise ValueError(f"power_table: num_powers must be >= 1, got {num_powers}")
    eye = torch.eye(w.shape[-1], dtype=w.dtype, device=w.device).expand_as(w)
    table = eye.unsqueeze(0)
    step = w  # W^k for k = len(table)
    while table.shape[0] < num_powers:
        table = torch.cat([table, table @ step], dim=0)
        step = step @ step
    return table[:num_powers]


def rope_angles(m: int, base: float = 10000.0, dtype=torch.float32, device=None) -> torch.Tensor:
    """(m // 2,) RoPE frequencies ``base ** (-2 i / m)``."""
    if m % 2:
        raise ValueError(f"RoPE needs an even block size, got m = {m}")
    return base ** (-torch.arange(0, m, 2, dtype=dtype, device=device) / m)


def rope_rotation(m: int, base: float = 10000.0, dtype=torch.float32, device=None) -> torch.Tensor:
    """(m, m) block-diagonal rotation with 2x2 blocks [[cos t, -sin t], [sin t, cos t]],
    t = ``rope_angles``: W^p rotates pair i by p t_i (RoPE at position p)."""
    theta = rope_angles(m, base, dtype, device)
    w = torch.zeros(m, m, dtype=dtype, device=device)
    i = torch.arange(0, m, 2, device=device)
    w[i, i] = torch.cos(theta)
    w[i + 1, i + 1] = torch.cos(theta)
    w[i, i + 1] = -torch.sin(theta)
    w[i + 1, i] = torch.sin(theta)
    return w


def rope_generator_init(m: int, base: float = 10000.0, dtype=torch.float32) -> torch.Tensor:
    """The S with ``orthogonal(S) == rope_rotation(m)``: half the skew-symmetric
    matrix logarithm of the rotation (whose angles are below pi)."""
    theta = rope_angles(m, base, torch.float64)
    log_w = torch.zeros(m, m, dtype=torch.float64)
    i = torch.arange(0, m, 2)
    log_w[i, i + 1] = -theta
    log_w[i + 1, i] = theta
    return (0.5 * log_w).to(dtype)


def heap_depth(num_positions: int, kappa: int) -> int:
    """Depth of the deepest level whose heap indices (root 1, children kappa p + c)
    are below ``num_positions``."""
    depth, first = 0, 1
    while first * kappa < num_positions:
        first *= kappa
        depth += 1
    return depth


def tree_maps_heap(branch: torch.Tensor, max_depth: int, num_rows: Optional[int] = None) -> torch.Tensor:
    """Maps of every node of a kappa-ary tree up to ``max_depth``, by heap index.

    Args:
        branch: (kappa, ...) orthogonal branch generators (one per child slot; the
            trailing dims are e.g. (H, 1, m, m)).
        max_depth: deepest level (the root is level 0).
        num_rows: build only rows [0, num_rows) (default: all 2 kappa^max_depth).

    Returns:
        (rows, ...) table: row ``p`` is the product of the branch maps along the
        path from the root to the node with heap index p (root 1, children
        ``kappa p + c``); rows that are no node hold the identity. Built level by
        level: per level and child slot, one GEMM of all the level's parent maps
        stacked, (n m, m) @ (m, m), batched over heads.
    """
    kappa, m = branch.shape[0], branch.shape[-1]
    lead = branch.shape[1:-2]  # e.g. (H, 1)
    total = 2 * kappa**max_depth if max_depth > 0 else 2
    num_rows = total if num_rows is None else min(int(num_rows), total)
    br = branch.reshape(kappa, -1, m, m)  # (kappa, G, m, m), G = prod(lead)
    G = br.shape[1]
    eye = torch.eye(m, dtype=branch.dtype, device=branch.device).expand(G, 1, m, m)
    # Levels are kept head-major, (G, rows, m, m), so that a level's parents of one
    # head form one (n m, m) matrix without copies.
    levels = [eye, eye][: min(2, num_rows)]  # row 0: no node; row 1: the root
    parent, filled = eye, 2
    for level in range(1, max_depth + 1):
        start = kappa**level
        if start >= num_rows:
            break
        if start > filled:  # for kappa > 2, heap rows between levels are no node
            levels.append(eye.expand(G, start - filled, m, m))
        n_children = min(kappa * parent.shape[1], num_rows - start)
        parent = parent[:, : -(-n_children // kappa)]
        n = parent.shape[1]
        stacked = parent.reshape(G, n * m, m)
        # the child in slot c of parent p sits at row kappa p + c
        children = torch.stack([torch.bmm(stacked, br[c]).view(G, n, m, m) for c in range(kappa)], dim=2)
        parent = children.view(G, n * kappa, m, m)[:, :n_children]
        levels.append(parent)
        filled = start + n_children
    table = torch.cat(levels, dim=1)  # (G, rows, m, m)
    return table.transpose(0, 1).reshape(table.shape[1], *lead, m, m)


def tree_maps_parents(branch: torch.Tensor, parent: torch.Tensor, child: torch.Tensor) -> torch.Tensor:
    """Maps of the nodes of trees given as (parent, branch) arrays, by pointer doubling.

    Args:
        branch: (kappa, ...) branch generators (trailing dims e.g. (H, 1, m, m)).
        parent: int64 (..., N): the parent's position in the same tree, the node's
            own position for a root.
        child: int64 (..., N): which child slot (0 .. kappa-1) the node is of its
            parent (ignored for roots).

    Returns:
        (..., N, *branch.shape[1:]) maps: root-to-node products of the branch maps.
        ceil(log2 N) + 1 rounds of gather + batched matmul, whatever the depth,
        with no host synchronisation.
    """
    n = parent.shape[-1]
    is_root = parent == torch.arange(n, device=parent.device)
    eye = torch.eye(branch.shape[-1], dtype=branch.dtype, device=branch.device).expand(branch.shape[1:])
    acc = branch[child.clamp(0, branch.shape[0] - 1)]  # (..., N, *mat): map from the parent to the node
    acc = torch.where(is_root.reshape(*is_root.shape, *([1] * eye.dim())), eye, acc)
    anc = parent
    flat = acc.shape[: parent.dim()]
    for _ in range(max(1, math.ceil(math.log2(max(n, 2)))) + 1):
        # acc_n <- acc_{anc_n} @ acc_n ; anc_n <- anc_{anc_n}   (roots stay: anc = self, acc = I)
        gather_idx = anc.reshape(*anc.shape, *([1] * eye.dim())).expand(*flat, *eye.shape)
        acc = torch.gather(acc, parent.dim() - 1, gather_idx) @ acc
        anc = torch.gather(anc, -1, anc)
    return acc
