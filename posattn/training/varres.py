"""Variable-resolution images for the packed experiment (issue 62): each image resized to its own
random height and width, cut into patches, and the patch sequences packed into batches of a fixed
token budget (NaViT's "Patch n' Pack")."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from ..packed import PackedGrids, greedy_pack, patchify

__all__ = ["random_resolution", "PackedBatch", "pack_batches", "VariableResolution", "RESOLUTIONS"]

RESOLUTIONS = ("fixed", "variable")


def random_resolution(
    images: torch.Tensor, sides: Sequence[int], patch: int, generator: torch.Generator
) -> list[tuple[torch.Tensor, tuple[int, int]]]:
    """Each (H, W, C) image of `images` (N, H, W, C) resized (bilinear) to a height and a width drawn
    apart, uniform in [sides[0], sides[1]] pixels and rounded down to a multiple of `patch` (so
    aspect ratios vary too), then cut into patches: a list of (tokens (h w, C patch^2), (h, w))."""
    lo, hi = int(sides[0]), int(sides[1])
    if patch < 1 or lo < patch or hi < lo:
        raise ValueError(
            f"random_resolution: sides must satisfy patch <= sides[0] <= sides[1], got {list(sides)}, patch {patch}"
        )
    if images.dim() != 4:
        raise ValueError(f"random_resolution: images must be (N, H, W, C), got shape {tuple(images.shape)}")
    n = images.shape[0]
    hw = torch.randint(lo, hi + 1, (n, 2), generator=generator) // patch * patch
    out = []
    for i in range(n):
        h, w = hw[i].tolist()
        img = F.interpolate(images[i].permute(2, 0, 1)[None].float(), size=(h, w), mode="bilinear", align_corners=False)
        out.append(patchify(img[0], patch))
    return out


@dataclass
class PackedBatch:
    """One packed batch: `tokens` (1, budget, F), the samples' tokens one after another and zeros
    after them; `grids` their packing; `index` the samples' positions in the input list."""

    tokens: torch.Tensor
    grids: PackedGrids
    index: list[int]


def pack_batches(
    samples: Sequence[tuple[torch.Tensor, tuple[int, int]]],
    budget: int,
    max_grid: Optional[Sequence[int]] = None,
    order: Optional[Sequence[int]] = None,
) -> list[PackedBatch]:
    """The (tokens, grid) samples packed into batches of exactly `budget` tokens (tail padding),
    each sample in one batch; every batch has the same T = budget and, given `max_grid`, the same
    tables (no recompilation). Default: NaViT's greedy first fit in decreasing size
    (:func:`posattn.packed.greedy_pack`); with `order` (e.g. a shuffled one, for new batches each
    epoch), the samples in that order, a batch closed when the next one does not fit."""
    if order is None:
        groups = greedy_pack([s[0].shape[0] for s in samples], budget)
    else:
        groups, room = [], 0
        for i in order:
            n = samples[i][0].shape[0]
            if n > budget:
                raise ValueError(f"pack_batches: sample {i} has {n} tokens, over the budget of {budget}")
            if not groups or n > room:
                groups.append([])
                room = budget
            groups[-1].append(i)
            room -= n
    out = []
    for group in groups:
        feats = samples[group[0]][0].shape[1]
        tokens = torch.zeros(1, budget, feats, dtype=samples[group[0]][0].dtype)
        at = 0
        for i in group:
            t = samples[i][0]
            tokens[0, at : at + t.shape[0]] = t
            at += t.shape[0]
        grids = PackedGrids.from_shapes([list(samples[i][1]) for i in group], max_grid=max_grid)
        out.append(PackedBatch(tokens, grids, list(group)))
    return out


class VariableResolution:
    """The packed data of the variable-resolution experiment (``-Ddata.resolution=variable``):
    every image of a split at its own random size (sides uniform in ``sides`` pixels, rounded
    down to the patch: aspect ratios vary too), drawn once per split from ``seed``, as patch
    tokens packed into batches of ``budget`` tokens on the tables of the largest grid
    (``sides[1] // patch`` per axis). Training batches are repacked each epoch in a shuffled
    order; evaluation batches are packed once (NaViT's greedy first fit).

    ``budget`` 0: about ``batch_size`` images of the mean size per batch (at least the largest
    image), a multiple of 64 tokens."""

    def __init__(self, train_images: torch.Tensor, sides: Sequence[int], patch: int, batch_size: int, budget: int,
                 seed: int):  # fmt: skip
        self.sides, self.patch, self.seed = (int(sides[0]), int(sides[1])), int(patch), int(seed)
        side = self.sides[1] // self.patch
        self.max_grid = (side, side)
        self.train = self._draw(train_images, 0)
        sizes = [t.shape[0] for t, _ in self.train]
        if budget <= 0:
            mean = sum(sizes) / max(len(sizes), 1)
            budget = max(max(sizes, default=1), math.ceil(batch_size * mean / 64) * 64)
        elif budget < max(sizes, default=1):
            raise ValueError(
                f"data.token_budget = {budget} is smaller than the largest image's {max(sizes)} tokens "
                f"(data.max_side = {self.sides[1]}, patch {self.patch})"
            )
        self.budget = int(budget)
        self._eval: dict = {}

    def _draw(self, images: torch.Tensor, stream: int):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + stream)
        return random_resolution(images, self.sides, self.patch, g)

    def train_batches(self, labels: torch.Tensor, generator: torch.Generator) -> list[tuple[PackedBatch, torch.Tensor]]:
        """The training images in a new shuffled order, packed: (batch, its labels) pairs."""
        order = torch.randperm(len(self.train), generator=generator).tolist()
        return [(b, labels[b.index]) for b in pack_batches(self.train, self.budget, self.max_grid, order)]

    def eval_batches(self, images: torch.Tensor, labels: torch.Tensor) -> list[tuple[PackedBatch, torch.Tensor]]:
        """A split's images at their own random sizes (drawn once per split), packed."""
        key = (images.data_ptr(), tuple(images.shape))
        if key not in self._eval:
            samples = self._draw(images, 1 + images.shape[0])  # the same sizes whichever split comes first
            self._eval[key] = pack_batches(samples, self.budget, self.max_grid)
        return [(b, labels[b.index]) for b in self._eval[key]]
