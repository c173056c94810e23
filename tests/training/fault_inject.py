"""Runs the experiment CLI and kills itself (SIGKILL, as `kill -9` would) at a
chosen point of its file writes; for tests/training/test_fault_injection.py.

    python tests/training/fault_inject.py POINT N -- CLI ARGS...

POINT is where to die, at the N-th (1-based) such event of the run:
  before-replace / after-replace   around an os.replace (every atomic write ends in one)
  after-fsync                      after an os.fsync (a temporary file is complete, not renamed)
  after-log                        after a metrics line is appended to metrics.jsonl
  count                            run to the end; the last stdout line is the JSON event counts
"""

import json
import os
import signal
import sys

from helpers.cli import main

from posattn.training.tracking import Tracker

POINTS = ("before-replace", "after-replace", "after-fsync", "after-log", "count")


def install(point: str, n: int) -> dict:
    counts = {"replace": 0, "fsync": 0, "log": 0}

    def hook(event: str, when: str):
        if when == "before":
            counts[event] += 1
        if point == f"{when}-{event}" and counts[event] == n:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    def wrap(event, fn):
        def wrapped(*args, **kwargs):
            hook(event, "before")
            result = fn(*args, **kwargs)
            hook(event, "after")
            return result

        return wrapped

    os.replace = wrap("replace", os.replace)
    os.fsync = wrap("fsync", os.fsync)
    Tracker.log = wrap("log", Tracker.log)
    return counts


if __name__ == "__main__":
    point, n, sep, *args = sys.argv[1:]
    if point not in POINTS or sep != "--":
        sys.exit(__doc__)
    counts = install(point, int(n))
    status = main(args)
    print(json.dumps(counts))
    sys.exit(status)
