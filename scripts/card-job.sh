#!/usr/bin/env bash
# The competition workflow's card job, as one script: what runs on the machine that holds the cards (the vendor
# image's own instance, reached over SSH: no Docker there). A team without a runner on that machine copies the
# repository and the wheelhouse there and runs exactly this by hand:
#
#   IMAGEFORGE_MODEL_DIR=/root/public-storage/models/Qwen/Qwen3.6-35B-A3B \
#     bash scripts/card-job.sh --wheelhouse ../wheelhouse --profile replay
#
# Steps: join the wheelhouse's parts if given those (checked against SHA256SUMS); install imageforge from it
# (hash-pinned, offline) into its own venv; apply the target's steps in place; serve it as a process; smoke it;
# bench --replay; then (always, also after a failure or Ctrl-C) stop the server and revert the install to what
# it was. Exit status: the first failing step's.
#
# Options (each also from the environment):
#   --wheelhouse DIR   `invoke wheels --python 3.10 --out DIR`'s DIR, or its parts/   (IMAGEFORGE_WHEELHOUSE)
#   --target T         default bi100                                                  (IMAGEFORGE_TARGET)
#   --profile P        default: the target's default profile                          (IMAGEFORGE_PROFILE)
#   --venv DIR         where imageforge is installed, default .venv-card              (IMAGEFORGE_CARD_VENV)
#   --port N           the server's port on 127.0.0.1, default 8000                   (IMAGEFORGE_PORT)
#   --tags T           smoke tags, default real-weights,dummy-ok                      (IMAGEFORGE_SMOKE_TAGS)
#   --no-install       use the venv as it is (the wheelhouse is not read)
#   --no-bench         skip bench --replay
#   --keep             leave the server up and the steps applied (no stop, no revert)
# IMAGEFORGE_CMD names the imageforge command to run (default: the venv's `imageforge`, else its `invoke`).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
wheelhouse="${IMAGEFORGE_WHEELHOUSE:-}"
target="${IMAGEFORGE_TARGET:-bi100}"
profile="${IMAGEFORGE_PROFILE:-}"
venv="${IMAGEFORGE_CARD_VENV:-$here/.venv-card}"
port="${IMAGEFORGE_PORT:-8000}"
tags="${IMAGEFORGE_SMOKE_TAGS:-real-weights,dummy-ok}"
install=1
bench=1
keep=0

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "card-job: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --wheelhouse) [ $# -ge 2 ] || die "--wheelhouse needs a directory"; wheelhouse="$2"; shift 2 ;;
    --target) [ $# -ge 2 ] || die "--target needs a name"; target="$2"; shift 2 ;;
    --profile) [ $# -ge 2 ] || die "--profile needs a name"; profile="$2"; shift 2 ;;
    --venv) [ $# -ge 2 ] || die "--venv needs a directory"; venv="$2"; shift 2 ;;
    --port) [ $# -ge 2 ] || die "--port needs a number"; port="$2"; shift 2 ;;
    --tags) [ $# -ge 2 ] || die "--tags needs a list"; tags="$2"; shift 2 ;;
    --no-install) install=0; shift ;;
    --no-bench) bench=0; shift ;;
    --keep) keep=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done
case "$port" in ''|*[!0-9]*) die "--port must be a number, got '$port'" ;; esac

step() { printf '\n== card-job: %s\n' "$*"; }

# The box's PYTHONPATH (corex dist-packages) would shadow the venv's packages during the install; imageforge
# itself strips it and hands the caller's environment to the target interpreter and the server.
if [ "$install" = 1 ]; then
  [ -n "$wheelhouse" ] || die "--wheelhouse DIR is required (or --no-install)"
  [ -d "$wheelhouse" ] || die "no wheelhouse at $wheelhouse"
  # either the wheelhouse itself (wheels + requirements.txt) or its parts (NAME.tar.NNN + SHA256SUMS +
  # wheelhouse_join.py, as copied over SSH): the parts are checked and joined into WHEELHOUSE/joined first
  if [ ! -f "$wheelhouse/requirements.txt" ] && [ -f "$wheelhouse/parts/wheelhouse_join.py" ]; then
    wheelhouse="$wheelhouse/parts"
  fi
  if [ ! -f "$wheelhouse/requirements.txt" ] && [ -f "$wheelhouse/wheelhouse_join.py" ]; then
    step "check and join the wheelhouse's parts ($wheelhouse)"
    env -u PYTHONPATH python3 "$wheelhouse/wheelhouse_join.py" --parts "$wheelhouse" --out "$wheelhouse/joined"
    wheelhouse="$wheelhouse/joined"
  fi
  requirements="$wheelhouse/requirements.txt"
  [ -f "$requirements" ] || die "no $requirements: is $wheelhouse an \`invoke wheels\` output (or its parts)?"
  step "install imageforge into $venv (offline)"
  [ -x "$venv/bin/python" ] || env -u PYTHONPATH python3 -m venv "$venv"
  env -u PYTHONPATH "$venv/bin/python" -m pip install --quiet --no-index --find-links "$wheelhouse" \
    --require-hashes --requirement "$requirements"
fi

if [ -n "${IMAGEFORGE_CMD:-}" ]; then
  read -r -a forge <<< "$IMAGEFORGE_CMD"
elif [ -x "$venv/bin/imageforge" ]; then
  forge=("$venv/bin/imageforge")
elif [ -x "$venv/bin/invoke" ]; then
  forge=("$venv/bin/invoke")
else
  die "neither $venv/bin/imageforge nor $venv/bin/invoke: install first (drop --no-install)"
fi
cd "$here"  # the manifest (build.yaml) and the overlays it names are the repository's

selector=(--target "$target")
[ -z "$profile" ] || selector+=(--profile "$profile")
url="http://127.0.0.1:$port"

applied=0
serving=0
finish() {
  status=$?
  trap - EXIT INT TERM HUP
  if [ "$keep" = 0 ]; then
    if [ "$serving" = 1 ]; then
      step "stop the server"
      "${forge[@]}" stop --in-place || status=$((status ? status : $?))
    fi
    if [ "$applied" = 1 ]; then
      step "revert the install"
      "${forge[@]}" revert || status=$((status ? status : $?))
    fi
  fi
  if [ "$status" = 0 ]; then echo "card-job: OK"; else echo "card-job: FAILED (exit $status)" >&2; fi
  exit "$status"
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

step "apply ${selector[*]} in place"
applied=1  # from here on a partial apply is reverted too (revert reads the journal)
"${forge[@]}" apply "${selector[@]}" --in-place

step "serve it as a process on $url"
serving=1
"${forge[@]}" run "${selector[@]}" --in-place --port "$port"

step "smoke ($tags)"
"${forge[@]}" smoke --url "$url" --tags "$tags"

if [ "$bench" = 1 ]; then
  step "bench --replay"
  "${forge[@]}" bench --url "$url" --replay --target "$target"  # the target's time cap and gating redlines
fi
