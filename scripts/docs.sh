#!/usr/bin/env bash
# The documentation site (mkdocs.yml, docs/): builds it in strict mode into build/site, as CI does
# (a broken link or cross-reference, a public name without a docstring, a page missing from the
# navigation fails), or serves it while you edit.
#   bash scripts/docs.sh          build (open build/site/index.html)
#   bash scripts/docs.sh serve    serve at http://127.0.0.1:8000, rebuilt on every change
# The generator and its pinned dependencies (requirements-docs.txt) go into a virtual environment of
# their own, build/docs-venv, made once (and again when requirements-docs.txt changes). The API pages
# are read from the source: posattn need not be built or importable.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
venv=build/docs-venv
stamp="$venv/requirements-docs.txt"
if ! cmp -s requirements-docs.txt "$stamp" 2>/dev/null; then
  rm -rf "$venv"
  "$PY" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r requirements-docs.txt 2>&1 | sed "/WARNING: Location/d"
  cp requirements-docs.txt "$stamp"
fi
export NO_MKDOCS_2_WARNING=1
if [ "${1:-}" = serve ]; then
  exec "$venv/bin/mkdocs" serve --strict
fi
"$venv/bin/mkdocs" build --strict --quiet
echo "docs: built strict into build/site ($(find build/site -name '*.html' | wc -l) pages)"
