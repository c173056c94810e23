"""The scaling study: how the cost of one training step grows with the number
of tokens and with depth, and whether gradients vanish in deep stacks of
attention without residual connections (the two questions of a public study of
stacked self-attention with learnable positional encodings, answered here for
every attention method of posattn; experiments/README.md compares the figures).

``python experiments/scaling.py`` or ``python cmd/main.py -mode=scaling`` run
:func:`run_study`, which writes into one folder:

- ``runtime.csv``: one row per (study, method, size): seconds per training step
  (forward + backward; median of repeats after warm-up, synchronised on CUDA),
  peak memory the step adds (MiB), the span's kept-key fraction, and a status
  (``ok`` or why the point was skipped);
- ``exponents.csv``: fitted growth exponents k (time ~ N^k, or ~ depth^k);
- ``gradients.csv``: mean |grad| of the token embedding, the first and last
  encoder layer and the positional parameters at initialisation, vs depth, with
  and without residual connections and LayerNorm, for fixed sinusoidal and
  learnable (per-position table) encodings;
- ``runtime_vs_tokens.png``, ``memory_vs_tokens.png``, ``runtime_vs_depth.png``,
  ``gradients_vs_depth.png`` and ``summary.md``.

What is measured is in :mod:`.study`, the files are made by :mod:`.report`.
"""

from __future__ import annotations

import os
from typing import Callable

import torch

from .report import fmt, machine_line, summary_markdown, write_outputs
from .study import (
    EXPONENT_COLUMNS,
    GRADIENT_COLUMNS,
    METHODS,
    QUICK,
    RUNTIME_COLUMNS,
    ScalingConfig,
    exponent_table,
    fit_exponent,
    gradient_point,
    gradient_study,
    model_for,
    runtime_sweep,
    scaling_config,
    scaling_defaults,
    scaling_section,
    span_sigma_cells,
)

__all__ = [
    "run_study",
    "ScalingConfig",
    "scaling_config",
    "scaling_defaults",
    "scaling_section",
    "METHODS",
    "QUICK",
    "RUNTIME_COLUMNS",
    "EXPONENT_COLUMNS",
    "GRADIENT_COLUMNS",
    "runtime_sweep",
    "gradient_study",
    "gradient_point",
    "exponent_table",
    "fit_exponent",
    "model_for",
    "span_sigma_cells",
    "write_outputs",
    "summary_markdown",
]


def run_study(
    cfg: ScalingConfig,
    command: str = "python experiments/scaling.py",
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict:
    """Runs the studies of ``cfg.studies``; writes and returns the output paths
    (plus ``rows``, ``exponents``, ``gradients``)."""
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    device = torch.device(cfg.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"scaling.device={cfg.device!r} but CUDA is not available")
    log(f"scaling study on {machine_line(cfg)}; output in {cfg.out}")
    rows = runtime_sweep(cfg, progress) if set(cfg.studies) & {"length", "grid", "depth"} else []
    grads = gradient_study(cfg, progress) if "gradients" in cfg.studies else []
    exponents = exponent_table(rows)
    paths = write_outputs(cfg, rows, exponents, grads, command)
    for e in exponents:
        log(
            f"  {e['study']:6s} {e['method']:15s} k = {fmt(e['exponent_all'], 2)} (all {e['points']} sizes), "
            f"{fmt(e['exponent_large'], 2)} (larger half); expected ~{e['expected']}"
        )
    log("wrote " + ", ".join(sorted(os.path.basename(v) for v in paths.values())))
    return dict(paths, rows=rows, exponents=exponents, gradients=grads)
