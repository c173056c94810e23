"""Packed variable-size grids (NaViT's "Patch n' Pack"): many images of different shapes in one
token sequence, each attending within itself with its own relative offsets.

A :class:`PackedGrids` is built once per batch, outside the model, and passed to every layer. Its
samples lie one after another along the token axis: sample ``s`` has the grid ``shapes[s]`` (G
axes; a 2-D image in a 3-D call is ``(1, h, w)``), its tokens row-major from ``offsets[s]`` to
``offsets[s + 1]`` (FlashAttention's ``cu_seqlens``); tokens past ``offsets[-1]`` are tail padding.
The per-offset tables (``rel``, ``bias``) are those of ``max_grid``: U = prod(2 m_d - 1) rows,
the offset ``delta`` at row-major index ``delta + (max_grid - 1)``, so that every sample reads the
rows of its own offsets from one table.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from .grid import MAX_GRID_AXES, _grid_sizes, num_offsets, offset_rows, relative_offsets

INT32_MAX = 2**31 - 1
"""The largest token count a packing can hold: its offsets are int32 (as ``cu_seqlens``)."""


def _ints(name: str, value, dims: int) -> torch.Tensor:
    """`value` (a tensor or nested sequence of ints) as an int64 CPU tensor of `dims` dimensions."""
    if isinstance(value, torch.Tensor):
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise TypeError(f"PackedGrids: {name} must hold integers, got a tensor of {value.dtype}")
        t = value.detach().to("cpu", torch.int64)
    else:
        try:
            t = torch.tensor(value, dtype=torch.int64)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"PackedGrids: {name} must be a sequence of ints, got {value!r}") from None
    if t.dim() != dims:
        raise ValueError(f"PackedGrids: {name} must have {dims} dimension(s), got shape {tuple(t.shape)}")
    return t


class PackedGrids:
    """Grids of different shapes packed into one token sequence (see the module's docstring).

    Attributes:
        offsets: (S + 1,) int32 on ``device``: cumulative token counts, ``offsets[0] == 0``.
        shapes: (S, G) int32 on ``device``: each sample's grid.
        max_grid: tuple of G ints: the extent of the ``rel`` / ``bias`` tables.

    Build it with :meth:`from_shapes`; the constructor takes ``offsets`` and ``shapes`` given
    apart (for instance by a data loader) and checks that they agree. Both keep a host copy of the
    values, to check them and to serve the reference; the operators read the tensors on `device`
    (default: where the given tensors are, else the CPU).
    """

    def __init__(self, offsets, shapes, max_grid: Optional[Sequence[int]] = None, device=None):
        dev = torch.device(device) if device is not None else None
        for value in (offsets, shapes):
            if device is None and isinstance(value, torch.Tensor):
                if dev is not None and value.device != dev:
                    raise ValueError(
                        f"PackedGrids: offsets and shapes must be on one device, got {dev} and {value.device}"
                    )
                dev = value.device
        dev = dev if dev is not None else torch.device("cpu")
        off = _ints("offsets", offsets, 1)
        shp = _ints("shapes", shapes, 2)
        S, G = shp.shape
        if S < 1:
            raise ValueError("PackedGrids: shapes must list at least one sample")
        if not 1 <= G <= MAX_GRID_AXES:
            raise ValueError(f"PackedGrids: shapes must have 1 to {MAX_GRID_AXES} axes per sample, got {G}")
        if off.numel() != S + 1:
            raise ValueError(
                f"PackedGrids: offsets must have S + 1 = {S + 1} entries (S = {S} samples), got {off.numel()}"
            )
        if bool((shp < 1).any()):
            s, d = (shp < 1).nonzero()[0].tolist()
            raise ValueError(
                f"PackedGrids: shapes[{s}] = {shp[s].tolist()} has extent {shp[s, d].item()} < 1 on axis {d}"
            )
        if off[0].item() != 0:
            raise ValueError(f"PackedGrids: offsets must start at 0, got offsets[0] = {off[0].item()}")
        step = off[1:] - off[:-1]
        if bool((step <= 0).any()):
            s = int((step <= 0).nonzero()[0])
            raise ValueError(
                f"PackedGrids: offsets must increase, got offsets[{s}] = {off[s].item()} and "
                f"offsets[{s + 1}] = {off[s + 1].item()}"
            )
        if off[-1].item() > INT32_MAX:
            raise ValueError(f"PackedGrids: offsets[-1] = {off[-1].item()} tokens overflow int32 (at most {INT32_MAX})")
        tokens = shp.prod(dim=1)
        if bool((tokens != step).any()):
            s = int((tokens != step).nonzero()[0])
            raise ValueError(
                f"PackedGrids: shapes[{s}] = {shp[s].tolist()} has {tokens[s].item()} tokens but offsets give it "
                f"offsets[{s + 1}] - offsets[{s}] = {step[s].item()}"
            )
        largest = shp.max(dim=0).values.tolist()
        if max_grid is None:
            mg = largest
        else:
            mg = _grid_sizes(max_grid)
            if len(mg) != G:
                raise ValueError(f"PackedGrids: max_grid must have G = {G} axes (as shapes), got {mg}")
            if any(m < 1 for m in mg):
                raise ValueError(f"PackedGrids: max_grid's extents must be >= 1, got {mg}")
            past = (shp > torch.tensor(mg)).any(dim=1)
            if bool(past.any()):
                s = int(past.nonzero()[0])
                raise ValueError(f"PackedGrids: shapes[{s}] = {shp[s].tolist()} exceeds max_grid = {mg} on some axis")
        if num_offsets(mg) > INT32_MAX:
            raise ValueError(f"PackedGrids: max_grid = {mg} has too many offsets prod(2 m - 1) for int32")
        self.offsets = off.to(dev, torch.int32)
        self.shapes = shp.to(dev, torch.int32)
        self.max_grid = tuple(mg)
        self._offsets_host = off.tolist()
        self._shapes_host = [tuple(r) for r in shp.tolist()]

    @classmethod
    def from_shapes(
        cls, shapes: Sequence[Sequence[int]], max_grid: Optional[Sequence[int]] = None, device=None
    ) -> "PackedGrids":
        """The samples of grids `shapes` (S lists of G ints) one after another, on `device`."""
        shp = _ints("shapes", shapes, 2)
        off = torch.zeros(shp.shape[0] + 1, dtype=torch.int64)
        if shp.shape[0] > 0:
            off[1:] = shp.prod(dim=1).cumsum(0)
        return cls(off, shp, max_grid, device=device)

    @property
    def num_samples(self) -> int:
        return len(self._shapes_host)

    @property
    def num_axes(self) -> int:
        return len(self.max_grid)

    @property
    def num_tokens(self) -> int:
        """The samples' tokens, ``offsets[-1]`` (the tokens past it are tail padding)."""
        return self._offsets_host[-1]

    @property
    def device(self) -> torch.device:
        return self.offsets.device

    def samples(self) -> list[tuple[int, tuple[int, ...]]]:
        """(first token, grid) of each sample, from the host copy."""
        return [(self._offsets_host[s], self._shapes_host[s]) for s in range(self.num_samples)]

    def to(self, device) -> "PackedGrids":
        """The same packing with its tensors on `device`."""
        out = object.__new__(PackedGrids)
        out.__dict__.update(self.__dict__)
        out.offsets, out.shapes = self.offsets.to(device), self.shapes.to(device)
        return out

    def __len__(self) -> int:
        return self.num_samples

    def __repr__(self) -> str:
        shown = ", ".join("x".join(map(str, s)) for s in self._shapes_host[:4])
        more = f", ... ({self.num_samples} samples)" if self.num_samples > 4 else ""
        return f"PackedGrids([{shown}{more}], tokens={self.num_tokens}, max_grid={list(self.max_grid)}, device={self.device})"


def check_packed_call(packed, grid, window_dilation, additional_keys, additional_values) -> None:
    """What a packed relpos_attention call cannot take (the operator and the reference check
    the rest)."""
    if not isinstance(packed, PackedGrids):
        raise TypeError(f"relpos_attention: packed must be a posattn.PackedGrids, got {type(packed).__name__}")
    if grid is not None:
        raise ValueError("relpos_attention: with packed=, grid must be None (each sample's grid is packed.shapes[s])")
    if window_dilation is not None:
        raise ValueError("relpos_attention: window_dilation is not supported with packed=")
    if additional_keys is not None or additional_values is not None:
        raise ValueError("relpos_attention: additional_keys / additional_values are not supported with packed=")


def sample_offset_rows(shape: Sequence[int], max_grid: Sequence[int], device=None) -> torch.Tensor:
    """The rows of `max_grid`'s offset table (U = prod(2 m - 1)) that hold grid `shape`'s offsets,
    in that grid's own table order: ``rel[:, sample_offset_rows(shape, max_grid)]`` is the (H,
    prod(2 n - 1), D) table a single-grid call on `shape` takes."""
    return offset_rows(relative_offsets(shape, device=device), max_grid)


def greedy_pack(token_counts: Sequence[int], budget: int) -> list[list[int]]:
    """NaViT's greedy packing: the samples (their token counts) into groups of at most `budget`
    tokens each, first fit in decreasing order of size (ties by index), each group's indices in
    increasing order; deterministic. A sample larger than the budget is an error (NaViT would drop
    tokens; here the caller chooses the sizes)."""
    budget = int(budget)
    if budget < 1:
        raise ValueError(f"greedy_pack: budget must be >= 1 token, got {budget}")
    counts = [int(c) for c in token_counts]
    for i, c in enumerate(counts):
        if c < 1:
            raise ValueError(f"greedy_pack: token_counts[{i}] = {c} must be >= 1")
        if c > budget:
            raise ValueError(f"greedy_pack: token_counts[{i}] = {c} exceeds the budget of {budget} tokens")
    groups: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(counts)), key=lambda i: (-counts[i], i)):
        for g, room in enumerate(free):
            if counts[i] <= room:
                groups[g].append(i)
                free[g] -= counts[i]
                break
        else:
            groups.append([i])
            free.append(budget - counts[i])
    return [sorted(g) for g in groups]


def patchify(image: torch.Tensor, patch: int) -> tuple[torch.Tensor, tuple[int, int]]:
    """A (C, H, W) image as (H / patch * W / patch, patch * patch * C) tokens, row-major over its
    (H / patch, W / patch) grid of patches, each token its patch's rows, then columns, then
    channels (the order of :meth:`posattn.nn.TransformerClassifier.patchify`, so that a model
    reads packed and fixed-size images alike), and that grid."""
    if image.dim() != 3:
        raise ValueError(f"patchify: image must be (C, H, W), got shape {tuple(image.shape)}")
    C, H, W = image.shape
    if patch < 1 or H % patch or W % patch:
        raise ValueError(f"patchify: patch = {patch} must divide the image's height {H} and width {W}")
    h, w = H // patch, W // patch
    tokens = image.reshape(C, h, patch, w, patch).permute(1, 3, 2, 4, 0).reshape(h * w, patch * patch * C)
    return tokens, (h, w)
