"""Helpers for the posattn.nn tests."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an operator returns."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


def quadrant_task(n: int, size: int = 8, seed: int = 0):
    """Images (n, size, size, 1) of faint noise with one bright pixel; the label
    is the quadrant (0..3) that holds it. Only positions carry the answer."""
    g = torch.Generator().manual_seed(seed)
    x = 0.1 * torch.rand(n, size, size, 1, generator=g)
    rows = torch.randint(0, size, (n,), generator=g)
    cols = torch.randint(0, size, (n,), generator=g)
    x[torch.arange(n), rows, cols, 0] = 1.0
    label = (rows >= size // 2).long() * 2 + (cols >= size // 2).long()
    return x, label
