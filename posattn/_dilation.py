"""Dilated windows by regrouping tokens, as NATTEN does.

A window with dilation d on an axis keeps, for a query at cell i, only keys of
i's residue modulo d, and places the window on the sub-grid of those cells (cell
r + d t is sub-grid cell t). So a dilated call is an undilated call on each
sub-grid: the tokens of every residue class are gathered into a grid of their
own, the classes of equal shape go to the batch axis of one operator call, and
the outputs are put back in token order. The kernels thus still visit only the
keys inside each window. Relative embeddings and biases are the original
table's rows of the real offsets (``d * delta'`` for a sub-grid offset
``delta'``), and the span's sigma is rescaled so that every kept pair gets the
same Gaussian term as in the original grid.
"""

from __future__ import annotations

import itertools
from typing import Callable, NamedTuple, Optional, Sequence

import torch

from .grid import offset_rows, relative_offsets

__all__ = ["DilationClass", "dilation_classes", "dilated_call"]


class DilationClass(NamedTuple):
    """The residue classes of one sub-grid shape: ``count`` sub-grids of shape
    ``grid``; ``tokens`` (count * prod(grid),) their token indices (class by class,
    each row-major); ``rows`` (prod(2 n' - 1),) the rows of the original offset
    table for the sub-grid's offsets."""

    grid: list[int]
    count: int
    tokens: torch.Tensor
    rows: torch.Tensor


def dilation_classes(grid: Sequence[int], dilation: Sequence[int], device=None) -> list[DilationClass]:
    """The sub-grids of a dilated ``grid``, grouped by shape (at most 2^G shapes:
    an axis of n cells and dilation d has n % d residues of n // d + 1 cells and
    the others of n // d)."""
    dil = [min(max(int(d), 1), n) for d, n in zip(dilation, grid)]
    strides = [1] * len(grid)
    for a in range(len(grid) - 2, -1, -1):
        strides[a] = strides[a + 1] * grid[a + 1]
    per_axis = []  # per axis: [(sub-grid length, residues)], longer first
    for n, d in zip(grid, dil):
        length, extra = divmod(n, d)
        options = [(length + 1, list(range(extra)))] if extra else []
        if length > 0 and d > extra:
            options.append((length, list(range(extra, d))))
        per_axis.append(options)
    classes = []
    G = len(grid)
    for choice in itertools.product(*per_axis):
        sub = [c[0] for c in choice]
        # token index of residue r_a + d_a t_a per axis, over (residues..., t...)
        index = torch.zeros([len(c[1]) for c in choice] + sub, dtype=torch.long, device=device)
        for a, (length, residues) in enumerate(choice):
            shape_r = [1] * (2 * G)
            shape_r[a] = len(residues)
            shape_t = [1] * (2 * G)
            shape_t[G + a] = length
            r = torch.tensor(residues, dtype=torch.long, device=device).reshape(shape_r)
            t = torch.arange(length, dtype=torch.long, device=device).reshape(shape_t)
            index = index + (r + dil[a] * t) * strides[a]
        delta = relative_offsets(sub, device=device) * torch.tensor(dil, dtype=torch.long, device=device)
        count = 1
        for c in choice:
            count *= len(c[1])
        classes.append(DilationClass(sub, count, index.reshape(-1), offset_rows(delta, grid)))
    return classes


def _to_groups(x: torch.Tensor, c: DilationClass) -> torch.Tensor:
    """(B, H, N, D) -> (B * count, H, N', D): the tokens of each sub-grid of the class."""
    B, H, _, D = x.shape
    n_sub = c.tokens.numel() // c.count
    x = x.index_select(2, c.tokens).reshape(B, H, c.count, n_sub, D)
    return x.transpose(1, 2).reshape(B * c.count, H, n_sub, D)


def _from_groups(y: torch.Tensor, B: int, count: int) -> torch.Tensor:
    """(B * count, H, N', ...) -> (B, H, count * N', ...), the inverse of _to_groups' layout."""
    y = y.reshape(B, count, *y.shape[1:]).transpose(1, 2)
    return y.reshape(B, y.shape[1], count * y.shape[3], *y.shape[4:])


def _sigma_for(sigma: torch.Tensor, grid: Sequence[int], sub: Sequence[int], dil: Sequence[int]) -> torch.Tensor:
    """sigma (H, G) of a sub-grid: the span normalises offsets by n - 1, so a
    sub-grid offset delta' (the real offset d delta') needs sigma (n - 1) / (d (n' - 1))."""
    factor = [
        (n - 1) / (min(d, n) * (m - 1)) if d > 1 and m > 1 else 1.0 for n, m, d in zip(grid, sub, dil)
    ]  # fmt: skip
    if all(f == 1.0 for f in factor):
        return sigma
    return sigma * torch.tensor(factor, dtype=sigma.dtype, device=sigma.device)


def dilated_call(
    call: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: Optional[torch.Tensor],
    rel: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    sigma: Optional[torch.Tensor],
    grid: Sequence[int],
    dilation: Sequence[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, H, N, Dv), lse (B, H, N)) of a dilated window from undilated calls
    ``call(q, k, v, q_pos, rel, bias, sigma, sub_grid) -> (out, lse)``, one per
    sub-grid shape, each on every sub-grid of that shape at once."""
    B = q.shape[0]
    outs, lses, order = [], [], []
    for c in dilation_classes(grid, dilation, device=q.device):
        out, lse = call(
            _to_groups(q, c),
            _to_groups(k, c),
            _to_groups(v, c),
            None if q_pos is None else _to_groups(q_pos, c),
            None if rel is None else rel.index_select(1, c.rows),
            None if bias is None else bias.index_select(1, c.rows),
            None if sigma is None else _sigma_for(sigma, grid, c.grid, dilation),
            c.grid,
        )
        outs.append(_from_groups(out, B, c.count))
        lses.append(_from_groups(lse.unsqueeze(-1), B, c.count).squeeze(-1))
        order.append(c.tokens)
    inverse = torch.argsort(torch.cat(order))  # token -> its place in the concatenated classes
    return torch.cat(outs, 2).index_select(2, inverse), torch.cat(lses, 2).index_select(2, inverse)
