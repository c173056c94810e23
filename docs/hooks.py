"""MkDocs hooks of the documentation site (mkdocs.yml):

- pages generated at build time, so that they cannot drift from what they describe: the
  configuration keys of `cmd/main.py` from `cmd/config.yml` (its keys, defaults and comments), the
  thesis' keys from `posattn/training/thesis.py` (its THESIS_KEYS table, read without importing
  posattn), and BENCHMARKS.md and CHANGELOG.md as they are in the repository's root;
- a check that every public name of the reference's modules (docs/griffe_roles.py,
  PUBLIC_MODULES) has a docstring: a missing one is a warning, which the strict build fails on.
"""

from __future__ import annotations

import ast
import importlib.util
import logging
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
log = logging.getLogger("mkdocs.plugins.posattn")


def _roles_module():
    spec = importlib.util.spec_from_file_location("griffe_roles", os.path.join(ROOT, "docs", "griffe_roles.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _read(*parts: str) -> str:
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as f:
        return f.read()


def _cell(text: str) -> str:
    """Text for a table cell: pipes escaped, and angle brackets outside code spans (markdown would
    take them for HTML; inside a code span they show as they are)."""
    parts = text.replace("|", "\\|").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts).strip()


def config_keys_page() -> str:
    """The keys of cmd/config.yml as a table: dotted key, default, the file's comment."""
    rows, stack = [], []  # stack: (indent, section name)
    lines = _read("cmd", "config.yml").splitlines()
    intro = []
    for line in lines:
        if line.startswith("#"):
            intro.append(line[1:].strip())
        else:
            break
    item = re.compile(r"^(?P<ind> *)(?P<key>[A-Za-z_][\w]*):(?P<val>[^#]*)(?:#(?P<com>.*))?$")
    for line in lines:
        if not line.strip() or line.startswith("#"):
            continue
        m = item.match(line)
        if m is None:
            if line.strip().startswith("#") and rows:  # a comment continued on the next line
                rows[-1][2] += " " + line.strip()[1:].strip()
            continue
        ind = len(m["ind"])
        while stack and stack[-1][0] >= ind:
            stack.pop()
        key = ".".join([s for _, s in stack] + [m["key"]])
        val = m["val"].strip()
        if not val:  # a section
            stack.append((ind, m["key"]))
            if m["com"]:
                rows.append([key, "(section)", m["com"].strip()])
            continue
        rows.append([key, val, (m["com"] or "").strip()])
    out = [
        "# Configuration keys of `cmd/main.py`",
        "",
        "Generated from `cmd/config.yml` (its keys, defaults and comments) when the site is built.",
        "Override any key with `-D<key>=<value>`; see [the experiments guide](../guide/cli.md).",
        "",
        "> " + _cell(" ".join(intro)).replace("\\|", "|"),
        "",
        "| key | default | meaning |",
        "|---|---|---|",
    ]
    out += [f"| `{k}` | `{_cell(v)}` | {_cell(c)} |" for k, v, c in rows]
    return "\n".join(out) + "\n"


THESIS_INTRO = """# The thesis' configuration keys

Every key of the thesis' `config.yaml` and sweep files (github.com/MeenaAlfons/posattn) is
accepted, in `-D` overrides, `--config` files, sweep files and W&B agents' `wandb.config`, with the
thesis' meaning where posattn has it. The table below, generated when the site is built from `posattn/training/thesis.py` (the one place
this mapping lives), says what each key becomes. Keys that configure nothing here are accepted and named
once in a warning; a value posattn cannot honour (a feature it lacks) exits with status 2, naming
the key and why. `experiments/thesis_config.yml` is the thesis' 2-D span run written with every
key, and `experiments/sweeps/thesis_keys_quick.yml` a quick sweep in the thesis' format:

    python cmd/main.py --config experiments/thesis_config.yml -Ddataset=fashion_mnist -Dinput_dim=1 -Ddevice=auto
    python cmd/main.py -mode=local_sweep --sweep_config=thesis_keys_quick

The thesis' sweep files themselves run unchanged where their data exists: they name CIFAR-10 on
CUDA, and say so clearly where either is missing. Keys are applied in order, like any override
(`include_position: false` after `positional_encoding: implicit` wins, and the other way round).
"""


def thesis_keys_page() -> str:
    """The thesis' keys and what each becomes here, from THESIS_KEYS (read with ast)."""
    tree = ast.parse(_read("posattn", "training", "thesis.py"))
    entries = None
    for node in tree.body:
        target = getattr(node, "target", None) or (node.targets[0] if isinstance(node, ast.Assign) else None)
        if getattr(target, "id", None) == "THESIS_KEYS":
            entries = node.value.elts
    if not entries:
        raise RuntimeError("docs/hooks.py: posattn/training/thesis.py has no THESIS_KEYS table")
    rows = [(e.args[0].value, e.args[1].value) for e in entries]
    return (
        THESIS_INTRO
        + "\n| thesis key | in posattn |\n|---|---|\n"
        + "\n".join(f"| `{k}` | {_cell(v)} |" for k, v in rows)
        + "\n"
    )


def _root_page(name: str) -> str:
    """A markdown file of the repository's root as a page: its links to docs/ pages made the site's,
    links to other files of the repository (not pages of the site) made their path in code."""
    text = _read(name).replace("](docs/", "](")
    text = re.sub(r"\]\((BENCHMARKS|CHANGELOG)\.md", lambda m: "](" + m[1].lower() + ".md", text)
    # links to files of the repository (not pages of the site) become their path in code
    return re.sub(r"\[([^\]]+)\]\((?!https?://|#)(?![\w/]+\.md\b)([^)]+)\)", r"\1 (`\2`)", text)


def on_files(files, config):
    from mkdocs.structure.files import File  # (the page generators above import without MkDocs: the tests call them)

    for path, content in (
        ("reference/config.md", config_keys_page()),
        ("reference/thesis_keys.md", thesis_keys_page()),
        ("index.md", _root_page("README.md")),
        ("benchmarks.md", _root_page("BENCHMARKS.md")),
        ("changelog.md", _root_page("CHANGELOG.md")),
    ):
        files.append(File.generated(config, path, content=content))
    return files


def on_pre_build(config):
    import griffe

    roles = _roles_module()
    pkg = griffe.load("posattn", search_paths=[ROOT], resolve_aliases=True, resolve_external=False)
    missing = [path for path, obj in roles.public_objects(pkg) if not obj.docstring]
    for path in missing:
        log.warning(f"public name without a docstring: {path}")
