"""Variable-resolution images for the packed experiment (issue 62): each image resized to its own
random height and width, cut into patches, and the patch sequences packed into batches of a fixed
token budget (NaViT's "Patch n' Pack")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from ..packed import PackedGrids, greedy_pack, patchify

__all__ = ["random_resolution", "PackedBatch", "pack_batches"]


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


def pack_batches(samples: Sequence[tuple[torch.Tensor, tuple[int, int]]], budget: int) -> list[PackedBatch]:
    """The (tokens, grid) samples packed greedily into batches of exactly `budget` tokens (tail
    padding), each sample in one batch; every batch has the same T = budget (no recompilation)."""
    groups = greedy_pack([s[0].shape[0] for s in samples], budget)
    out = []
    for group in groups:
        feats = samples[group[0]][0].shape[1]
        tokens = torch.zeros(1, budget, feats, dtype=samples[group[0]][0].dtype)
        at = 0
        for i in group:
            t = samples[i][0]
            tokens[0, at : at + t.shape[0]] = t
            at += t.shape[0]
        grids = PackedGrids.from_shapes([list(samples[i][1]) for i in group])
        out.append(PackedBatch(tokens, grids, list(group)))
    return out
