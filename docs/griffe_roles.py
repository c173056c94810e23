"""A griffe extension for the API pages: the docstrings' Sphinx roles (:func:`x`, :class:`x`,
:mod:`x`, :meth:`x`, ...) become links where x is a public name of a page of the reference
(PUBLIC_MODULES), and inline code elsewhere (private helpers, torch), so that no role shows raw.

Also the list of public names each reference page documents, which docs/hooks.py checks for
docstrings (public_objects)."""

from __future__ import annotations

import re

import griffe

# the modules the reference renders (docs/reference/api/*.md), each with its public names:
# __all__ where it has one, else its public functions, classes and constants
PUBLIC_MODULES = (
    "posattn",
    "posattn.ops",
    "posattn.nn",
    "posattn.neighborhood",
    "posattn.integrations",
    "posattn.packed",
    "posattn.algebraic",
    "posattn.reference",
    "posattn.grid",
)

ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|obj|exc):`~?([^`]+)`")


def _get(pkg: griffe.Module, path: str):
    if path == pkg.path:
        return pkg
    if not path.startswith(pkg.path + "."):
        return None
    try:
        return pkg[path[len(pkg.path) + 1 :]]
    except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None


def _target(obj):
    try:
        return obj.final_target if obj.is_alias else obj
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None


def public_names(mod: griffe.Module) -> list[str]:
    """A module's public names: its __all__, else its own public functions, classes, constants."""
    if mod.exports is not None:
        return [e if isinstance(e, str) else e.name for e in mod.exports]
    return [n for n, m in mod.members.items() if not n.startswith("_") and not m.is_alias and not m.is_module]


def public_objects(pkg: griffe.Module, unique: bool = True):
    """(public path, object) for every public name of the reference's modules, their classes'
    public methods too (but nn.Module's extra_repr); each object once with ``unique``."""
    seen = set()
    for mp in PUBLIC_MODULES:
        mod = _get(pkg, mp)
        yield mp, mod
        for name in public_names(mod):
            obj = _target(mod[name]) if name in mod.members else None
            if obj is None or (unique and obj.path in seen) or (obj.is_module and obj.path not in PUBLIC_MODULES):
                continue
            seen.add(obj.path)
            yield f"{mp}.{name}", obj
            if obj.is_class:
                for n, m in obj.members.items():
                    t = _target(m)
                    if not n.startswith("_") and n != "extra_repr" and t is not None and t.is_function:
                        yield f"{mp}.{name}.{n}", t


def link_paths(pkg: griffe.Module) -> dict:
    """Canonical path -> the path a reference page shows the object under: its own module's page,
    not the root's list of re-exports (the root page renders no members)."""
    paths = {}
    for path, obj in public_objects(pkg, unique=False):
        parts = path.split(".")
        root_member = len(parts) > 1 and f"posattn.{parts[1]}" not in PUBLIC_MODULES  # posattn.X, posattn.X.method
        if not root_member and (obj.path not in paths or paths[obj.path].count(".") > path.count(".")):
            paths[obj.path] = path
    return paths


class SphinxRoles(griffe.Extension):
    """Rewrites the Sphinx roles of every docstring of the package (see the module's docstring)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        if pkg.path != "posattn":
            return
        public = link_paths(pkg)

        def resolve(ctx, name: str):
            mod = ctx if ctx.is_module else ctx.module
            if name.startswith("."):  # relative module, as in :mod:`.report`
                base = mod.path if mod.is_package else mod.path.rsplit(".", 1)[0]
                name = base + name
            cands = [name] if name.startswith("posattn") else []
            scope = ctx if ctx.is_class else ctx.parent
            while scope is not None:
                cands.append(f"{scope.path}.{name}")
                scope = scope.parent
            cands += [f"posattn.{m}.{name}" for m in ("nn", "ops")]
            for c in cands:
                t = _target(_get(pkg, c)) if _get(pkg, c) is not None else None
                if t is not None and public.get(t.path):
                    return public[t.path]
            return None

        def walk(obj):
            if obj.is_alias:
                return
            if obj.docstring is not None and ":" in obj.docstring.value:

                def sub(m):
                    name = m.group(1)
                    path = resolve(obj, name)
                    shown = name.lstrip(".")
                    return f"[`{shown}`][{path}]" if path else f"`{shown}`"

                obj.docstring.value = ROLE.sub(sub, obj.docstring.value)
            for member in obj.members.values():
                if not member.is_alias:
                    walk(member)

        walk(pkg)
