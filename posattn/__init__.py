"""posattn: fast positional self-attention operators for PyTorch.

Importing the package loads the compiled extension, which registers the
operators under ``torch.ops.posattn``; :mod:`posattn.ops` holds their documented
Python wrappers and :mod:`posattn.reference` dense pure-PyTorch equivalents.
"""

import torch  # noqa: F401  (loads libc10/libtorch, which the extension links)

from . import (
    _C,  # noqa: F401  (registers torch.ops.posattn.*)
    grid,
    neighborhood,
    nn,
    ops,
    packed,
    reference,
)
from .neighborhood import na1d, na2d, na3d
from .ops import apply_maps, relpos_attention
from .packed import PackedGrids

__all__ = [
    "grid",
    "nn",
    "ops",
    "packed",
    "reference",
    "neighborhood",
    "relpos_attention",
    "apply_maps",
    "na1d",
    "na2d",
    "na3d",
    "PackedGrids",
]
__version__ = "0.1.0"
