"""Fuzzing the operators' argument checks: thousands of generated bad inputs
(tests/ops/fuzz_ops.py) through the wrappers, the raw ops, their backward ops and
their fake kernels. Each must raise a clear error; none may crash the process,
be accepted, or fail with an error that does not say what is wrong."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "fuzz_ops.py")
SEED, CASES = 0, 3000


def run_cases(seed: int, count: int) -> tuple[dict, list]:
    """Runs every case in worker processes; a crash restarts after the crashing case.
    Returns ({case: verdict line}, [crash descriptions])."""
    verdicts, crashes, first = {}, [], 0
    while first < count:
        proc = subprocess.run(
            [sys.executable, WORKER, str(seed), str(first), str(count - first)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        current = None
        for line in proc.stdout.splitlines():
            word, _, rest = line.partition(" ")
            if word == "CASE":
                current = int(rest)
            elif word in ("OK", "BAD"):
                verdicts[int(rest.split(" ", 1)[0])] = line
                current = None
        if proc.returncode == 0 and current is None:
            break
        crashed = current if current is not None else max(verdicts, default=first - 1) + 1
        crashes.append(f"case {crashed}: exit {proc.returncode}\n{proc.stderr[-1500:]}")
        first = crashed + 1
    return verdicts, crashes


def test_generated_bad_inputs_get_clear_errors_and_never_crash():
    verdicts, crashes = run_cases(SEED, CASES)
    assert not crashes, "\n".join(crashes)
    bad = [line for line in verdicts.values() if line.startswith("BAD")]
    assert not bad, "\n".join(bad[:30])
    assert len(verdicts) == CASES


def test_the_fuzzer_sees_a_crash_and_goes_on(monkeypatch, tmp_path):
    """The harness itself: a worker that dies at a case is reported, and the cases after it still run."""
    worker = tmp_path / "worker.py"
    worker.write_text(
        "import os, signal, sys\n"
        "first, count = int(sys.argv[2]), int(sys.argv[3])\n"
        "for i in range(first, first + count):\n"
        "    print(f'CASE {i}', flush=True)\n"
        "    if i == 3: os.kill(os.getpid(), signal.SIGSEGV)\n"
        "    print(f'OK {i} fine', flush=True)\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "WORKER", str(worker))
    verdicts, crashes = run_cases(0, 6)
    assert len(crashes) == 1 and crashes[0].startswith("case 3: exit -11")
    assert sorted(verdicts) == [0, 1, 2, 4, 5]
