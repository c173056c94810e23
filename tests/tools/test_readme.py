"""The README's Python examples run as written (keeps the docs true)."""

import pathlib
import re

import pytest
from helpers import ROOT
from helpers.timm import import_timm

README = pathlib.Path(ROOT) / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples():
    assert len(BLOCKS) >= 2


def needs_timm(block: str) -> bool:
    return re.search(r"^(import|from) timm\b", block, flags=re.M) is not None


@pytest.mark.parametrize(
    "index", range(len(BLOCKS)), ids=[f"{i}-timm" if needs_timm(b) else str(i) for i, b in enumerate(BLOCKS)]
)
def test_readme_example_runs(index, capsys):
    if needs_timm(BLOCKS[index]):  # run by scripts/cuda_build.sh, where timm imports
        import_timm()
    exec(compile(BLOCKS[index], f"README.md[python block {index}]", "exec"), {})
