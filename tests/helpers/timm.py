"""timm for the tests, or a skip that says why.

timm imports torchvision, whose PyPI wheels do not import on the CPU build of
torch (their C++ operators need CUDA libraries). CI runs the timm tests in the
CUDA torch environment of ``scripts/cuda_build.sh`` (torch + torchvision + timm
from ``requirements-timm.txt``, on the CPU) with ``POSATTN_REQUIRE_TIMM=1``: there
a timm that does not import fails instead of skipping."""

from __future__ import annotations

import os

import pytest


def import_timm(module_level: bool = False):
    """timm, or a pytest skip naming the error (a failure under POSATTN_REQUIRE_TIMM=1)."""
    try:
        import timm
    except Exception as e:  # ImportError, or torchvision's RuntimeError on a torch it was not built for
        if os.environ.get("POSATTN_REQUIRE_TIMM") == "1":
            raise
        pytest.skip(
            f"timm does not import here ({type(e).__name__}: {e}); scripts/cuda_build.sh runs these tests",
            allow_module_level=module_level,
        )
    return timm
