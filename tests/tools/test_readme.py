"""The Python examples of the README and of the documentation's pages (docs/**/*.md) run as
written (keeps the docs true); the pages the documentation site generates cover what they
describe."""

import importlib.util
import pathlib
import re

import pytest
import yaml
from helpers import ROOT
from helpers.timm import import_timm

from posattn.training.config import flatten

README = pathlib.Path(ROOT) / "README.md"
DOCS = pathlib.Path(ROOT) / "docs"
PAGES = [README] + sorted(DOCS.rglob("*.md"))
BLOCKS = list(
    {  # each distinct example once (the README shows some of the guides' examples), where it first appears
        block: (page.relative_to(ROOT).as_posix(), i, block)
        for page in reversed(PAGES)
        for i, block in reversed(list(enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S))))
    }.values()
)


def test_readme_has_examples():
    assert sum(1 for page, _, _ in BLOCKS if page == "README.md") >= 8


def needs_timm(block: str) -> bool:
    return re.search(r"^(import|from) timm\b", block, flags=re.M) is not None


@pytest.mark.parametrize(
    "page, index, block",
    BLOCKS,
    ids=[f"{page}-{i}{'-timm' if needs_timm(b) else ''}" for page, i, b in BLOCKS],
)
def test_example_runs(page, index, block, capsys):
    if needs_timm(block):  # run by scripts/cuda_build.sh, where timm imports
        import_timm()
    exec(compile(block, f"{page}[python block {index}]", "exec"), {})


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_config_page_lists_every_key_of_the_config_with_its_default():
    page = _hooks().config_keys_page()
    config = yaml.safe_load((pathlib.Path(ROOT) / "cmd" / "config.yml").read_text())
    rows = dict(re.findall(r"^\| `([\w.]+)` \| `([^`]*)` \|", page, flags=re.M))
    keys = flatten(config)
    assert set(keys) <= set(rows), sorted(set(keys) - set(rows))
    for key, value in keys.items():
        assert yaml.safe_load(rows[key]) == value, (key, rows[key], value)


def test_the_thesis_keys_page_lists_every_thesis_key():
    from posattn.training import thesis

    hooks = _hooks()
    page = hooks.thesis_keys_page()
    for entry in thesis.THESIS_KEYS:
        assert f"| `{entry.key}` | {hooks._cell(entry.posattn)} |" in page, entry.key
