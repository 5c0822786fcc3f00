"""A script step that copies a host directory (``${VAR}``) into the image and runs in it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.forge_fixtures import (
    assert_clean_failure,
    invoke,
    read_from_image,
    tiny_base,
    write_manifest,
)

pytestmark = pytest.mark.integration

STEPS = """\
  - id: extra
    kind: overlay
    source: overlays/extra.py
    dest: vllm/ops/extra.py
  - id: payload
    kind: script
    directory: ${IMAGEFORGE_TEST_PAYLOAD}
    load_hint: "export IMAGEFORGE_TEST_PAYLOAD=<the payload folder>"
    dest: /srv/payload
    command: [sh, run.sh, hello]
"""


def test_directory_is_copied_run_in_place_and_keyed_by_its_files(tmp_path: Path) -> None:
    manifest, target = write_manifest(tmp_path / "m", tiny_base(), steps=STEPS)
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "run.sh").write_text('echo "cwd=$(pwd) arg=$1" > /opt/where\ncat data.txt >> /opt/where\necho ran-it\n')
    (payload / "data.txt").write_text("first\n")
    env = {"IMAGEFORGE_TEST_PAYLOAD": str(payload)}

    proc = invoke("build", "--manifest", str(manifest), "--json", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = {s["id"]: s for s in json.loads(proc.stdout)["steps"]}
    assert steps["payload"]["cache"] == "BUILT" and steps["payload"]["detail"] == "ran-it"
    image = f"imageforge-test/{target}:small"
    assert read_from_image(image, "/opt/where") == b"cwd=/srv/payload arg=hello\nfirst\n"
    assert read_from_image(image, "/srv/payload/data.txt") == b"first\n", "the folder stays in the image, like COPY"

    again = invoke("build", "--manifest", str(manifest), "--json", env=env)
    assert again.returncode == 0, again.stderr
    assert all(s["cache"] == "HIT" for s in json.loads(again.stdout)["steps"])

    (payload / "data.txt").write_text("second\n")
    changed = invoke("build", "--manifest", str(manifest), "--json", env=env)
    assert changed.returncode == 0, changed.stderr
    steps = {s["id"]: s for s in json.loads(changed.stdout)["steps"]}
    assert steps["extra"]["cache"] == "HIT" and steps["payload"]["cache"] == "BUILT"
    assert read_from_image(image, "/opt/where") == b"cwd=/srv/payload arg=hello\nsecond\n"

    unset = invoke("build", "--manifest", str(manifest), env={"IMAGEFORGE_TEST_PAYLOAD": ""})
    assert_clean_failure(unset, 5)
    assert "$IMAGEFORGE_TEST_PAYLOAD, which is not set" in unset.stderr
    assert "export IMAGEFORGE_TEST_PAYLOAD=<the payload folder>" in unset.stderr
    plan = invoke("plan", "--manifest", str(manifest), "--no-daemon", env={"IMAGEFORGE_TEST_PAYLOAD": ""})
    assert plan.returncode == 0 and "$IMAGEFORGE_TEST_PAYLOAD is not set" in plan.stdout
