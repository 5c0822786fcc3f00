#!/usr/bin/env bash
# Make sure .venv/ exists with imageforge and its dev tools, then run `.venv/bin/invoke ARGS...`.
#   ./bootstrap.sh demo    # build + smoke the embedded `cpu` target
#   ./bootstrap.sh test    # lint, type-check and run every test
# The packages go in with uv (from PyPI into the venv, then from its cache: seconds instead of pip's minute),
# resolved as pip would (pip's configured indexes, find-links and constraints: scripts/uv_args.py); where uv
# cannot be had or fails, with pip.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
venv="$here/.venv"
stamp="$venv/.imageforge-installed"
want="$(cat pyproject.toml | sha256sum | cut -c1-16)"
extras=".[dev,overlays,plots,model]"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
with_uv() {
  "$venv/bin/python" -m pip install -q uv >/dev/null 2>&1 || return 1
  local args
  mapfile -t args < <("$venv/bin/python" scripts/uv_args.py)
  "$venv/bin/uv" pip install -q --python "$venv/bin/python" --index-strategy unsafe-best-match "${args[@]}" \
    -e "$extras"
}
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  if ! with_uv; then
    echo "bootstrap: uv unavailable or failed; installing with pip" >&2
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q -e "$extras"
  fi
  echo "$want" > "$stamp"
fi
exec "$venv/bin/invoke" "$@"
