"""How the simulated suite shares CI's two cores (scripts/cuda_sim.sh: pytest-xdist with
--dist loadgroup --no-loadscope-reorder).

A test of a harness or fast_forward program carries an xdist_group mark with the program's name,
so that all tests of one program run on one worker: the program is built and first started (the
simulator's ptxas over all of its PTX, 30-60 s of 2 cores for a fast harness) once, and the other
worker meanwhile works on another program instead of waiting for that build or repeating that
ptxas. The groups are sent out costliest first (the order below), so that no long one starts last
and leaves a core idle at the end; tests without a group (short ones) follow.
"""

import collections

# CPU seconds of each program's build, first start and runs in CI's selection, from scripts/cuda_sim.sh's
# table (2026-12-04, this machine, cold): only the order matters. A program not named here counts
# 60 s plus 30 s a test.
PROGRAM_COST = {
    "harness_float_fast128": 660,
    "harness_bf16_fast64": 400,
    "harness_float_fast64": 340,
    "harness_bf16_fast128": 290,
    "harness_double": 280,
    "harness_half_fast128": 275,
    "harness_float_fast32": 260,
    "harness_half_fast32": 250,
    "harness_bf16_fast32": 220,
    "harness_float_fast32_packed": 220,
    "harness_float": 210,
    "fast_forward_bf16_d64": 180,
    "harness_half_fast64": 180,
    "harness_half_fast128_packed": 170,
    "harness_half_fast32_packed": 150,
    "harness_bf16_fast32_packed": 140,
    "harness_bf16_fast64_packed": 140,
    "harness_bf16": 130,
    "harness_half": 115,
}


def _group(item):
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return None
    return mark.args[0] if mark.args else mark.kwargs.get("name")


def pytest_collection_modifyitems(config, items):
    tests = collections.Counter(_group(item) for item in items)

    def cost(item):
        group = _group(item)
        if group is None:
            return 0
        return PROGRAM_COST.get(group, 60 + 30 * tests[group])

    items.sort(key=lambda item: -cost(item))  # stable: a group's tests keep their order
