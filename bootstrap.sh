#!/usr/bin/env bash
# Make sure .venv/ exists with imageforge and its dev tools, then run `.venv/bin/invoke ARGS...`.
#   ./bootstrap.sh demo    # build + smoke the embedded `cpu` target
#   ./bootstrap.sh test    # lint, type-check and run every test
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
venv="$here/.venv"
stamp="$venv/.imageforge-installed"
want="$(cat pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -e ".[dev,overlays,plots,model]"
  echo "$want" > "$stamp"
fi
exec "$venv/bin/invoke" "$@"
