"""The GitHub workflows: valid against the workflow schema, and every task they call exists."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))


def test_there_are_workflows() -> None:
    assert {p.name for p in WORKFLOWS} == {"ci.yml", "competition-image.yml"}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_matches_the_github_schema(path: Path) -> None:
    exe = shutil.which("check-jsonschema") or str(Path(sys.executable).parent / "check-jsonschema")
    proc = subprocess.run([exe, "--builtin-schema", "vendor.github-workflows", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_calls_only_existing_tasks(path: Path) -> None:
    sys.path.insert(0, str(REPO))
    try:
        import tasks
    finally:
        sys.path.remove(str(REPO))
    known = set(tasks.ns.task_names)
    data = yaml.safe_load(path.read_text())
    runs = [step["run"] for job in data["jobs"].values() for step in job["steps"] if "run" in step]
    called = [m.group(1) for run in runs for m in re.finditer(r"bootstrap\.sh (\S+)", run)]
    for task in called:
        assert task in known, f"{path.name} calls unknown task {task!r}"
    if path.name == "ci.yml":
        assert runs == ["bash .ci/run"]
    else:
        assert called == ["validate", "check-patches", "build", "smoke", "export", "submission", "submission",
                          "smoke"]
        # the submission tree: written, checked, built with plain docker build, uploaded
        text = path.read_text()
        assert 'submission --target bi100 --profile "$PROFILE" --out submission/ --git' in text
        assert 'submission --target bi100 --profile "$PROFILE" --out submission/ --check' in text
        assert 'docker build --tag "imageforge-submission/bi100:$PROFILE" submission/' in text
        assert any(step.get("with", {}).get("path") == "submission/"
                   for job in data["jobs"].values() for step in job["steps"])
