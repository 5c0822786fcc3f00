"""imageforge: one YAML manifest -> a patched, layered, smoke-tested vLLM serving image.

Thin invoke shell over the imageforge library: each task parses its options and calls one
function. Run `invoke --list`, or `invoke --help TASK` for a task's options.
Exit codes: 0 ok, 2 config, 3 build, 4 smoke/bench, 5 infrastructure, 130 interrupted.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from invoke.collection import Collection
from invoke.context import Context
from invoke.tasks import task

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "src"))

from imageforge.cli import user_errors  # noqa: E402

MANIFEST_HELP = "Manifest file (default: $IMAGEFORGE_MANIFEST or ./build.yaml)"
TRACEBACK_HELP = "Show Python tracebacks (also IMAGEFORGE_TRACEBACK=1)"


@task(
    help={"manifest": MANIFEST_HELP, "json": "Print one JSON object", "traceback": TRACEBACK_HELP},
)
def validate(c: Context, manifest: str = "", json: bool = False, traceback: bool = False) -> None:
    """Check the manifest: YAML, schema, files, paths, profiles of every target. No daemon needed."""
    from imageforge.resolve import validate_all

    with user_errors(traceback):
        summary = validate_all(manifest or None)
        _print(summary.to_json() if json else summary.text(), json)


@task(
    iterable=["set_"],
    help={
        "target": "Target name (default: the manifest's default_target)",
        "profile": "Profile name (default: the target's default_profile)",
        "set_": "Override a value: KEY=VALUE (serving flag, env.NAME, run.port); repeatable",
        "manifest": MANIFEST_HELP,
        "json": "Print one JSON object",
        "no_daemon": "Do not ask the Docker daemon for cache state",
        "traceback": TRACEBACK_HELP,
    },
)
def plan(
    c: Context,
    target: str = "",
    profile: str = "",
    set_: list[str] | None = None,
    manifest: str = "",
    json: bool = False,
    no_daemon: bool = False,
    traceback: bool = False,
) -> None:
    """Show every resolved value (and where it came from), the ordered steps, cache keys and HIT/MISS."""
    from imageforge.plan import plan_for_cli

    with user_errors(traceback):
        result = plan_for_cli(manifest or None, target or None, profile or None, set_ or [], use_daemon=not no_daemon)
        _print(result.to_json() if json else result.text(), json)


@task(help={"unit": "Only the fast tests (no Docker daemon)", "k": "pytest -k expression",
            "lint": "Run ruff and mypy first (default true)"})
def test(c: Context, unit: bool = False, k: str = "", lint: bool = True) -> None:
    """Lint, type-check and run the tests (sets up the Docker engine and base images first)."""
    py = sys.executable
    if lint:
        c.run(f"{py} -m ruff check src tests tasks.py bench overlays images", pty=False)
        c.run(f"{py} -m mypy", pty=False)
    paths = "tests/unit tests/overlays" if unit else "tests"
    if not unit:
        from imageforge.build import prepare_base

        with user_errors():
            prepare_base(str(ROOT / "build.yaml"), "cpu")
    selector = f" -k {json_quote(k)}" if k else ""
    c.run(f"{py} -m pytest {paths}{selector}", pty=False)


@task(help={"target": "Target whose recipe base image to make (default: cpu)", "manifest": MANIFEST_HELP,
            "traceback": TRACEBACK_HELP})
def base(c: Context, target: str = "cpu", manifest: str = "", traceback: bool = False) -> None:
    """Make the target's base image from its recipe (OS image, wheelhouse, vLLM venv) and its model."""
    from imageforge.build import prepare_base

    with user_errors(traceback):
        ref = prepare_base(manifest or None, target)
        print(f"BASE={ref}")


@task(
    iterable=["set_"],
    help={
        "target": "Target name (default: the manifest's default_target)",
        "profile": "Profile name (default: the target's default_profile)",
        "set_": "Override a value: KEY=VALUE (serving flag, env.NAME, run.port); repeatable",
        "manifest": MANIFEST_HELP,
        "verbose": "Show script and verification output live",
        "json": "Print a JSON summary at the end",
        "traceback": TRACEBACK_HELP,
    },
)
def build(
    c: Context,
    target: str = "",
    profile: str = "",
    set_: list[str] | None = None,
    manifest: str = "",
    verbose: bool = False,
    json: bool = False,
    traceback: bool = False,
) -> None:
    """Build (or reuse from cache) every layer of TARGET:PROFILE, verify it, then move its tags."""
    from imageforge.build import build_for_cli

    with user_errors(traceback):
        result = build_for_cli(manifest or None, target or None, profile or None, set_ or [], verbose=verbose,
                               quiet=json)
        if json:
            _print(result.to_json(), True)


def json_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def _print(payload: object, as_json: bool) -> None:
    if as_json:
        print(json.dumps(payload, indent=2, default=str))
    else:
        print(payload)


ns = Collection(validate, plan, base, build, test)
ns.configure({"run": {"echo": True}})
os.environ.setdefault("PYTHONUNBUFFERED", "1")
