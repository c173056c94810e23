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
