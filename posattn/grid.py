"""Grid helpers shared by the operator wrappers and the reference."""

from __future__ import annotations

import math
import operator
from typing import NamedTuple, Optional, Sequence

import torch

MAX_GRID_AXES = 8  # kMaxGridDims of csrc/core/grid_index.h: the kernels' per-axis arrays
"""The most grid axes the operators take."""


INT64_MAX = 2**63 - 1  # the operators take the grid as int64
"""The largest token or offset count of a grid (the operators take the grid as int64)."""


def _grid_sizes(grid) -> list[int]:
    """``grid`` as a list of ints; floats, strings and bools are refused, not rounded."""
    if isinstance(grid, (str, bytes)) or isinstance(grid, bool):
        raise TypeError(f"relpos_attention: grid must be a sequence of ints, got {grid!r}")
    if isinstance(grid, int):
        grid = [grid]
    try:
        items = list(grid)
    except TypeError:
        raise TypeError(f"relpos_attention: grid must be a sequence of ints, got {grid!r}") from None
    sizes = []
    for n in items:
        if isinstance(n, bool):
            raise TypeError(f"relpos_attention: grid must be a sequence of ints, got {grid!r}")
        try:
            sizes.append(operator.index(n))  # ints, numpy ints, SymInts; not 3.7 or "3"
        except TypeError:
            raise TypeError(
                f"relpos_attention: grid must be a sequence of ints, got {grid!r} "
                f"({type(n).__name__} {n!r} is not an int)"
            ) from None
    return sizes


def normalise_grid(grid: Optional[Sequence[int]], num_tokens: int, packed: bool = False) -> list[int]:
    """``grid`` as a list of ints (default ``[num_tokens]``); checks 1..8 axes, prod(grid) == N
    and that prod(grid) and prod(2 n_d - 1) fit the operators' int64. ``packed``: ``grid`` is a
    packed call's max_grid, whose product need not be N."""
    if grid is None:
        return [int(num_tokens)]
    sizes = _grid_sizes(grid)
    if not sizes:
        raise ValueError("relpos_attention: grid must list at least one axis")
    if len(sizes) > MAX_GRID_AXES:
        raise ValueError(f"relpos_attention: grid may have at most {MAX_GRID_AXES} axes, got {len(sizes)}")
    # Plain loops (no generator expressions): torch.compile traces this code.
    prod = 1
    for d, n in enumerate(sizes):
        if n < 1:
            raise ValueError(f"relpos_attention: grid axis {d} must be >= 1, got {n} (grid {sizes})")
        prod *= n
    if prod > INT64_MAX or num_offsets(sizes) > INT64_MAX:
        raise ValueError(
            f"relpos_attention: grid {sizes} is too large: prod(grid) or the number of offsets "
            "prod(2 n_d - 1) overflows int64"
        )
    if prod != num_tokens and not packed:
        raise ValueError(
            f"relpos_attention: prod(grid) = {prod} must equal the number of tokens N = {num_tokens} (grid {sizes})"
        )
    return sizes


WINDOW_BORDERS = ("clip", "shift")
"""Window border rules: ``clip`` (centred, clipped at the borders) and ``shift`` (NATTEN's)."""


def normalise_window(window, grid: Sequence[int], cap: bool = True) -> Optional[list[int]]:
    """``window`` as a list of G half widths (an int applies to every axis), or None.

    Checks one value per grid axis, each an int >= 0 (the operators' ``window``);
    a half width beyond ``n_d - 1`` keeps the whole axis and is passed on as ``n_d - 1``."""
    if window is None:
        return None
    if isinstance(window, bool):
        raise TypeError(f"relpos_attention: window must be an int or a sequence of ints, got {window!r}")
    if isinstance(window, int):
        window = [window] * len(grid)
    try:
        sizes = list(window)
    except TypeError:
        raise TypeError(f"relpos_attention: window must be an int or a sequence of ints, got {window!r}") from None
    out = []
    for w in sizes:
        if isinstance(w, bool):
            raise TypeError(f"relpos_attention: window must be an int or a sequence of ints, got {window!r}")
        try:
            out.append(operator.index(w))
        except TypeError:
            raise TypeError(
                f"relpos_attention: window must be an int or a sequence of ints, got {window!r} "
                f"({type(w).__name__} {w!r} is not an int)"
            ) from None
    if len(out) != len(grid):
        raise ValueError(
            f"relpos_attention: window must give one half width per grid axis ({len(grid)} for grid "
            f"{list(grid)}), got {len(out)}: {out}"
        )
    for d, w in enumerate(out):
        if w < 0:
            raise ValueError(f"relpos_attention: window half widths must be >= 0, got {out} (axis {d})")
    return [min(w, n - 1) for w, n in zip(out, grid)] if cap else out


def axis_ints(name: str, value, grid: Sequence[int], lowest: int) -> list[int]:
    """One int >= ``lowest`` per grid axis (an int applies to every axis)."""
    if isinstance(value, bool) or isinstance(value, int):
        if isinstance(value, bool):
            raise TypeError(f"relpos_attention: {name} must be an int or a sequence of ints, got {value!r}")
        value = [value] * len(grid)
    try:
        items = list(value)
    except TypeError:
        raise TypeError(f"relpos_attention: {name} must be an int or a sequence of ints, got {value!r}") from None
    out = []
    for x in items:
        if isinstance(x, bool):
            raise TypeError(f"relpos_attention: {name} must be an int or a sequence of ints, got {value!r}")
        try:
            out.append(operator.index(x))
        except TypeError:
            raise TypeError(
                f"relpos_attention: {name} must be an int or a sequence of ints, got {value!r} "
                f"({type(x).__name__} {x!r} is not an int)"
            ) from None
    if len(out) != len(grid):
        raise ValueError(
            f"relpos_attention: {name} must give one value per grid axis ({len(grid)} for grid {list(grid)}), "
            f"got {len(out)}: {out}"
        )
    for d, x in enumerate(out):
        if x < lowest:
            raise ValueError(f"relpos_attention: {name} must be >= {lowest} on every axis, got {out} (axis {d})")
    return out


def axis_flags(name: str, value, grid: Sequence[int]) -> list[int]:
    """One bool per grid axis (a bool applies to every axis), as 0 / 1."""
    if isinstance(value, bool):
        value = [value] * len(grid)
    try:
        items = list(value)
    except TypeError:
        raise TypeError(f"relpos_attention: {name} must be a bool or a sequence of bools, got {value!r}") from None
    if not all(isinstance(x, bool) for x in items):
        raise TypeError(f"relpos_attention: {name} must be a bool or a sequence of bools, got {value!r}")
    if len(items) != len(grid):
        raise ValueError(
            f"relpos_attention: {name} must give one value per grid axis ({len(grid)} for grid {list(grid)}), "
            f"got {len(items)}: {items}"
        )
    return [int(x) for x in items]


class WindowSpec(NamedTuple):
    """A window per grid axis in the operators' terms: cells before and after
    its centre, the stride of the query groups sharing one window, causal (0 / 1),
    and the dilation (every d-th cell: the window lives on the sub-grid of the
    cells of the query's residue modulo d)."""

    left: list[int]
    right: list[int]
    stride: list[int]
    causal: list[int]
    dilation: list[int]


def window_spec(
    window, grid: Sequence[int], kernel_size=None, window_stride=None, window_causal=None, window_dilation=None
) -> Optional[WindowSpec]:
    """The window of a relpos_attention call from its arguments: ``window`` (half
    widths: a window of 2 w + 1 cells) or ``kernel_size`` (k cells, odd or even:
    k // 2 before the centre, k - 1 - k // 2 after, NATTEN's split), with
    ``window_stride`` (1 <= s <= k), ``window_causal`` and ``window_dilation``
    (>= 1) per axis; None without a window. ValueError / TypeError name the
    argument."""
    if window is not None and kernel_size is not None:
        raise ValueError("relpos_attention: give window (half widths) or kernel_size, not both")
    if window is None and kernel_size is None:
        extra = (("window_stride", window_stride), ("window_causal", window_causal))
        for name, value in extra + (("window_dilation", window_dilation),):
            if value is not None:
                raise ValueError(f"relpos_attention: {name} needs a window (window or kernel_size)")
        return None
    if window is not None:
        left = right = normalise_window(window, grid, cap=False)
    else:
        k = axis_ints("kernel_size", kernel_size, grid, 1)
        left, right = [x // 2 for x in k], [x - 1 - x // 2 for x in k]
    stride = [1] * len(grid) if window_stride is None else axis_ints("window_stride", window_stride, grid, 1)
    for d, (a, b, s) in enumerate(zip(left, right, stride)):
        if s > a + b + 1:
            raise ValueError(
                f"relpos_attention: window_stride must be in [1, kernel size] on every axis (kernel size "
                f"{a + b + 1} on axis {d}), got {stride}"
            )
    causal = [0] * len(grid) if window_causal is None else axis_flags("window_causal", window_causal, grid)
    dilation = [1] * len(grid) if window_dilation is None else axis_ints("window_dilation", window_dilation, grid, 1)
    return WindowSpec(list(left), list(right), stride, causal, dilation)


def check_dilation_with_span(dilation: Sequence[int], threshold: float) -> None:
    """A span threshold cuts a box in the grid's cells, which a dilated window's
    sub-grid does not have: the two are refused together (sigma without a
    threshold is fine)."""
    if threshold > 0 and any(d > 1 for d in dilation):
        raise ValueError(
            f"relpos_attention: a span threshold (threshold = {threshold}) cannot be combined with a dilated "
            f"window (window_dilation = {list(dilation)}); use sigma without a threshold, or no dilation"
        )


def window_key_range(
    coord: torch.Tensor, n, left: int, right: int, border: str, stride: int = 1, causal: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """First and last key kept along an axis of ``n`` cells (an int, or an int64
    tensor like ``coord``: one axis length per query) by queries at ``coord`` (any
    int64 shape) under a window of ``left`` cells before its centre and ``right``
    after (AxisLimit in csrc/core/grid_index.h, the kernels' rule): the centre
    is the query's stride leader (groups of ``stride`` queries share the window
    of the group's middle cell, ``g s + s // 2``, capped at n - 1); the window is
    clipped at the borders (``"clip"``), or moved to stay inside ``[0, n)``
    (``"shift"``, NATTEN's rule; a window of n cells or more covers the axis). A
    ``causal`` axis keeps the keys ``j <= i`` less than k = left + right + 1
    cells before the group's last cell."""
    n = torch.as_tensor(n, dtype=coord.dtype, device=coord.device).expand_as(coord)
    k = left + right + 1
    group = coord - coord % stride
    if causal:
        last = torch.minimum(group + stride - 1, n - 1)
        return (last - k + 1).clamp(min=0), coord.clone()
    centre = torch.minimum(group + stride // 2, n - 1)
    if border == "shift":  # max, then min: a window longer than the axis ends at its last cell
        centre = torch.minimum(centre.clamp(min=left), n - 1 - right)
    return (centre - left).clamp(min=0), torch.minimum(centre + right, n - 1)


def num_offsets(grid: Sequence[int]) -> int:
    """U = prod(2 n_d - 1): the number of rows of a relative-embedding table."""
    u = 1
    for n in grid:
        u *= 2 * n - 1
    return u


def grid_coords(grid: Sequence[int], device=None) -> torch.Tensor:
    """(N, G) int64 row-major coordinates of every token of the grid."""
    axes = [torch.arange(n, device=device) for n in grid]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, len(grid))


def offset_rows(delta: torch.Tensor, grid: Sequence[int]) -> torch.Tensor:
    """Row in the (U, D) table of offsets ``delta`` (..., G): row-major index of
    delta + (n - 1) over the shape (2 n_1 - 1, ..., 2 n_G - 1)."""
    row = torch.zeros(delta.shape[:-1], dtype=torch.long, device=delta.device)
    for d, n in enumerate(grid):
        row = row * (2 * n - 1) + (delta[..., d] + n - 1)
    return row


def span_keep_fraction(grid: Sequence[int], half: Sequence[int]) -> float:
    """Mean fraction of the keys inside a query's span box with half widths `half`
    (the box is clipped at the grid's edges)."""
    frac = 1.0
    for n, h in zip(grid, half):
        mean_len = sum(min(i + h, n - 1) - max(i - h, 0) + 1 for i in range(n)) / n
        frac *= mean_len / n
    return frac


def span_half_widths(sigma: torch.Tensor, threshold: float, grid: Sequence[int]) -> list[list[int]]:
    """(H, G) span-box half widths: min(ceil(sigma * sqrt(-2 ln t) * (n - 1)), n - 1).

    Computed in float64 on the host with the same operations as the kernels,
    so that the box is identical.
    """
    radius = math.sqrt(-2.0 * math.log(threshold))
    halves = []
    for row in sigma.detach().to("cpu", torch.float64).tolist():
        halves.append([0 if n <= 1 else min(math.ceil(s * radius * (n - 1)), n - 1) for s, n in zip(row, grid)])
    return halves


def span_sigma_for_keep(grid: Sequence[int], keep: float, threshold: float) -> tuple[float, list[int], float]:
    """A sigma, the same on every axis and in the operator's normalised units
    for ``grid``, whose threshold box keeps about ``keep`` of the keys.

    Returns (sigma, half widths, kept fraction). Multiply sigma by
    ``max(grid) - 1`` for the same box in cells (``units="cells"``).
    """
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"span_sigma_for_keep: threshold must be in (0, 1), got {threshold}")
    grid = [int(n) for n in grid]
    radius = math.sqrt(-2.0 * math.log(threshold))
    best = None
    for h in range(0, max(grid)):
        half = [min(h, n - 1) for n in grid]
        frac = span_keep_fraction(grid, half)
        if best is None or abs(frac - keep) < abs(best[2] - keep):
            best = (h, half, frac)
    h, half, frac = best
    n_max = max(grid)
    # ceil(sigma * radius * (n - 1)) == h on the largest axis; a midpoint avoids rounding at h.
    sigma = (h - 0.5) / (radius * max(n_max - 1, 1)) if h > 0 else 1e-3
    return sigma, half, frac


def relative_offsets(grid: Sequence[int], device=None) -> torch.Tensor:
    """(U, G) int64 offsets ``delta`` of every row of a relative-embedding table,
    in the row order :func:`offset_rows` (and the operators) use: row-major over
    ``delta_d`` in ``-(n_d - 1) .. n_d - 1``."""
    axes = [torch.arange(-(n - 1), n, device=device) for n in grid]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, len(grid))
