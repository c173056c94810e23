"""What the experiment modes write: terminal tables, CSV files (atomically)
and PNG plots (matplotlib without a display)."""

from __future__ import annotations

import csv
import os
from typing import Optional, Sequence

__all__ = ["print_table", "write_csv", "pyplot", "save_figure"]


def print_table(title: str, rows: Sequence[tuple[str, str]]) -> None:
    """A two-column box of (name, value) rows under ``title``."""
    width = max(len(k) for k, _ in rows)
    vwidth = max(len(v) for _, v in rows)
    line = "+" + "-" * (width + 2) + "+" + "-" * (vwidth + 2) + "+"
    print(f"\n{title}\n{line}")
    for k, v in rows:
        print(f"| {k:<{width}} | {v:>{vwidth}} |")
    print(line, flush=True)


def write_csv(path: str, rows: Sequence[dict], columns: Optional[Sequence[str]] = None) -> None:
    """Writes ``rows`` to a temporary file, then renames it over ``path``: a reader
    never sees half a file. Columns: ``columns``, or every key in order of appearance."""
    if columns is None:
        columns = []
        for r in rows:
            columns += [k for k in r if k not in columns]
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns))
        writer.writeheader()
        for r in rows:
            writer.writerow({k: r.get(k, "") for k in columns})
    os.replace(tmp, path)


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str, title: Optional[str] = None, dpi: int = 120) -> str:
    """Lays out ``fig`` (with a ``title`` above its axes), writes it to ``path`` and closes it."""
    plt = pyplot()
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
