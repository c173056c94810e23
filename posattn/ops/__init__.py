"""Documented Python wrappers of the ``torch.ops.posattn`` operators.

One private module per operator (``_relpos``, ``_apply_maps``) holds its wrapper,
its fake kernels for ``torch.compile`` and its autograd (backward passes are
operators of their own, ``torch.ops.posattn.<op>_backward``); ``_checks`` holds the
Python twins of the C++ argument checks, ``_schema`` relpos_attention's argument
list (:class:`RelposArgs`), ``_kernels`` where each operator has a kernel.
"""

from ._apply_maps import apply_maps
from ._checks import SPAN_MODES, lse_dtype
from ._kernels import cpu_capability, has_kernel
from ._relpos import relpos_attention, relpos_plan
from ._schema import RelposArgs

__all__ = [
    "relpos_attention",
    "relpos_plan",
    "apply_maps",
    "has_kernel",
    "cpu_capability",
    "SPAN_MODES",
    "RelposArgs",
    "lse_dtype",
]
