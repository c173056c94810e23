import math
import os

import pytest
import torch

import posattn  # noqa: F401  (registers torch.ops.posattn)

# Tests never talk to a W&B server: W&B is disabled unless a test asks for offline mode.
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def make_relpos_inputs(
    grid,
    *,
    B=2,
    H=3,
    D=5,
    Dv=4,
    pos=True,
    sigma=False,
    bias=False,
    dtype=torch.float64,
    device="cpu",
    seed=0,
    requires_grad=False,
):
    """Random inputs for relpos_attention on `grid` (never zeros)."""
    g = torch.Generator().manual_seed(seed)
    N = math.prod(grid)
    U = math.prod(2 * n - 1 for n in grid)

    def rand(*shape, scale=1.0):
        t = (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype=dtype, device=device)
        return t.requires_grad_(requires_grad)

    x = dict(q=rand(B, H, N, D), k=rand(B, H, N, D), v=rand(B, H, N, Dv))
    if pos:
        x["q_pos"] = rand(B, H, N, D)
        x["rel"] = rand(H, U, D, scale=0.7)
    if bias:
        x["bias"] = rand(H, U, scale=0.8)
    if sigma:
        s = (0.15 + 0.6 * torch.rand(H, len(grid), generator=g, dtype=torch.float64)).to(dtype=dtype, device=device)
        x["sigma"] = s.requires_grad_(requires_grad)
    return x
