"""The style checks (scripts/lint.sh, run by .ci/run) can fail: each tool, with the
repository's configuration, rejects a badly formatted file. (Whether the
repository itself is clean is lint.sh's job in CI.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from helpers import ROOT


def clang_format() -> str | None:
    try:
        import clang_format as cf
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(cf.__file__), "data", "bin", "clang-format")
    return path if os.path.exists(path) else None


def test_ci_runs_the_style_checks():
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        assert "bash scripts/lint.sh" in f.read()
    with open(os.path.join(ROOT, "requirements-dev.txt")) as f:
        pins = f.read()
    assert "ruff==" in pins and "clang-format==" in pins


@pytest.mark.skipif(
    shutil.which("ruff") is None
    and subprocess.run([sys.executable, "-m", "ruff", "--version"], capture_output=True).returncode != 0,
    reason="ruff is not installed (requirements-dev.txt)",
)
def test_ruff_with_the_repository_config_rejects_bad_code(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nimport os\nx = {'a':1}\n")  # unsorted imports, unused, unformatted
    cfg = ["--config", os.path.join(ROOT, "pyproject.toml")]
    check = subprocess.run([sys.executable, "-m", "ruff", "check", *cfg, str(bad)], capture_output=True, text=True)
    assert check.returncode != 0 and "I001" in check.stdout and "F401" in check.stdout
    fmt = subprocess.run([sys.executable, "-m", "ruff", "format", "--check", *cfg, str(bad)], capture_output=True)
    assert fmt.returncode != 0


@pytest.mark.skipif(clang_format() is None, reason="clang-format is not installed (requirements-dev.txt)")
def test_clang_format_with_the_repository_config_rejects_bad_code(tmp_path):
    shutil.copy(os.path.join(ROOT, ".clang-format"), tmp_path / ".clang-format")
    bad = tmp_path / "bad.cpp"
    bad.write_text("int  f(int x){return x+1;}\n")
    res = subprocess.run([clang_format(), "--dry-run", "--Werror", str(bad)], capture_output=True, text=True)
    assert res.returncode != 0 and "code should be clang-formatted" in res.stderr
    good = tmp_path / "good.cpp"  # what the repository's style makes of it passes
    good.write_text(subprocess.run([clang_format(), str(bad)], capture_output=True, text=True, check=True).stdout)
    assert good.read_text() == "int f(int x) {\n  return x + 1;\n}\n"
    assert subprocess.run([clang_format(), "--dry-run", "--Werror", str(good)], capture_output=True).returncode == 0
