"""The CUDA plan on each class of GPU (benchmarks/plan_table.py over tests/cuda_sim/plan_table.cu:
the extension's own plan, csrc/cuda/relpos_plan.cuh, for a device's opt-in shared memory per
block), checked without a GPU: on an H100 the fast kernels take what they always took; a smaller
device runs no more fast than a larger one; no plan asks for more shared memory than its device
has; and the tables of docs/developer/plan.md and the README are the plan's (they cannot drift from
the layouts)."""

from __future__ import annotations

import re

import plan_table
import pytest
import simlib

pytestmark = [
    pytest.mark.cuda_sim,
    pytest.mark.skipif(simlib.nvcc() is None, reason="nvcc not found (set CUDA_HOME)"),
]


@pytest.fixture(scope="module")
def rows():
    table = plan_table.rows()
    assert len(table) == 3 * 3 * 3 * 3 * len(plan_table.DEVICES)  # dtypes, D, axes, terms, devices
    return table


def test_h100_runs_every_call_fast(rows):
    for r in rows:
        if r.smem_optin != simlib.SMEM_H100:
            continue
        # (float32 D = 128 with a term per offset: the backward in two halves of the gradients' columns,
        # on 2-3 axes with its operands in chunks)
        assert (r.forward, r.backward) == ("fast", "fast"), r
        assert r.offsets == ("none" if r.terms == "plain" else "fast"), r


def test_the_backward_runs_fast_wherever_the_forward_does(rows):
    # every device class: d q, d k, d v, d q_pos never fall back for lack of shared memory once the
    # forward runs fast (the backward's last layout holds its operands in chunks, down to 8 columns)
    for r in rows:
        assert r.backward == r.forward, r


def test_every_device_runs_every_kernel_fast(rows):
    # the forward's smallest layouts (K and V in turn through one buffer, Q's fragments from the
    # tensor) and the offset kernel's (on 3-D grids in 99 KiB: d rel's accumulators in registers, q_pos
    # in chunks, the end's sums over the spent positional buffers; float32 in chunks of 8 columns) fit
    # 99 KiB for every call class: no kernel falls back for lack of shared memory on any device
    for r in rows:
        assert (r.forward, r.backward) == ("fast", "fast"), r
        assert r.offsets == ("none" if r.terms == "plain" else "fast"), r


def test_a_smaller_device_runs_no_more_fast(rows):
    by = {(r.dtype, r.D, r.axes, r.terms, r.smem_optin): r for r in rows}
    order = [optin for optin, _ in plan_table.DEVICES]  # largest first
    for r in rows:
        i = order.index(r.smem_optin)
        if i == 0:
            continue
        larger = by[(r.dtype, r.D, r.axes, r.terms, order[i - 1])]
        for kernels in ("forward", "backward", "offsets"):
            if getattr(r, kernels) == "fast":
                assert getattr(larger, kernels) == "fast", (kernels, r, larger)


def test_no_plan_asks_for_more_shared_memory_than_its_device_has(rows):
    for r in rows:
        assert r.forward_smem <= r.smem_optin and r.backward_smem <= r.smem_optin, r
        # (the fast layouts' own sizes: more than the 48 KiB every device gives)
        if r.forward == "fast" and r.terms != "plain":
            assert r.forward_smem > 48 * 1024, r


def test_the_docs_table_is_the_plans(rows):
    page = (simlib.REPO / "docs" / "developer" / "plan.md").read_text()
    m = re.search(r"<!-- plan_table -->\n(.*?)<!-- /plan_table -->", page, re.S)
    assert m, "docs/developer/plan.md has no <!-- plan_table --> section"
    assert m.group(1) == plan_table.markdown(rows), (
        "docs/developer/plan.md's table is not the plan's: paste `python benchmarks/plan_table.py` between its markers"
    )


def test_the_readme_summary_is_the_plans(rows):
    readme = (simlib.REPO / "README.md").read_text()
    m = re.search(r"<!-- device_table -->\n(.*?)<!-- /device_table -->", readme, re.S)
    assert m, "README.md has no <!-- device_table --> section"
    assert m.group(1) == plan_table.summary_markdown(rows), (
        "README.md's table per GPU is not the plan's: paste `python benchmarks/plan_table.py --summary` "
        "between its markers"
    )
