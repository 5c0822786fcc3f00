"""Directory script steps, their cache input, the argv serving style, and scripts inside check-patches;
pure: no daemon."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from imageforge.errors import ConfigError
from imageforge.manifest.load import load_manifest
from imageforge.manifest.model import Step
from imageforge.manifest.resolve import resolve
from imageforge.patches.check import AFTER_FAILED_SCRIPT, DictFS, Overlay, ScriptOutcome, check_steps
from imageforge.plan import make_plan, step_inputs
from imageforge.serve.command import serving_argv
from imageforge.steps import PatchSpec, ScriptSpec
from tests.unit.conftest import MINIMAL

SCRIPT_STEP = """\
      - id: baseline
        kind: script
        directory: ${SCRIPTS_DIR}
        load_hint: "export SCRIPTS_DIR=<folder>"
        dest: /workspace/scripts
        command: [bash, run.sh]
"""


def with_steps(text: str, steps: str) -> str:
    return text.replace("    steps:\n", "    steps:\n" + steps, 1)


def test_directory_step_parses_with_workdir_defaulting_to_dest(write_manifest: Callable[[str], Path]) -> None:
    m = load_manifest(write_manifest(with_steps(MINIMAL, SCRIPT_STEP)))
    step = m.target("t").steps[0]
    assert step.directory_env == "SCRIPTS_DIR" and step.load_hint == "export SCRIPTS_DIR=<folder>"
    assert step.definition() == {"id": "baseline", "kind": "script", "args": [], "command": ["bash", "run.sh"],
                                 "dest": "/workspace/scripts", "directory": "${SCRIPTS_DIR}", "env": {},
                                 "workdir": "/workspace/scripts"}, "no hint, no host path in the cache key"
    assert step.directory({}) is None


@pytest.mark.parametrize(("edit", "message"), [
    (("        command: [bash, run.sh]\n", ""), "targets.t.steps[0]"),            # a directory needs a command
    (("directory: ${SCRIPTS_DIR}", "directory: scripts-$X"), "only a whole '${VAR}'"),
    (("directory: ${SCRIPTS_DIR}", "directory: no-such-dir"), "directory does not exist"),
    (("        dest: /workspace/scripts\n", "        dest: /workspace/scripts\n        source: s.sh\n"),
     "targets.t.steps[0]"),                                                          # source and directory
])
def test_directory_step_errors(write_manifest: Callable[[str], Path], edit: tuple[str, str], message: str) -> None:
    text = with_steps(MINIMAL, SCRIPT_STEP).replace(*edit)
    with pytest.raises(ConfigError) as info:
        load_manifest(write_manifest(text))
    assert message in info.value.render()


def test_directory_digest_follows_every_file(write_manifest: Callable[[str], Path], tmp_path: Path) -> None:
    step = load_manifest(write_manifest(with_steps(MINIMAL, SCRIPT_STEP))).target("t").steps[0]
    folder = tmp_path / "scripts"
    (folder / "sub").mkdir(parents=True)
    (folder / "run.sh").write_text("echo one\n")
    (folder / "sub" / "data.txt").write_text("x\n")
    env = {"SCRIPTS_DIR": str(folder)}
    name = "directory:SCRIPTS_DIR"
    assert step_inputs(step, {}) == {name: "unset"}
    assert step_inputs(step, {"SCRIPTS_DIR": str(tmp_path / "nope")}) == {name: "missing"}
    first = step_inputs(step, env)[name]
    assert len(first) == 64 and step_inputs(step, env)[name] == first
    (folder / "sub" / "data.txt").write_text("y\n")
    second = step_inputs(step, env)[name]
    assert second != first, "a nested file's content is in the key"
    (folder / "run.sh").chmod(0o755)
    assert step_inputs(step, env)[name] != second, "so is the executable bit"
    (folder / "extra").write_text("")
    assert len({first, second, step_inputs(step, env)[name]}) == 3


def test_plan_keys_change_with_the_folder(write_manifest: Callable[[str], Path], tmp_path: Path) -> None:
    m = load_manifest(write_manifest(with_steps(MINIMAL, SCRIPT_STEP)))

    class Probe:
        def base_image_id(self, reference: str) -> str | None:
            return "sha256:" + "0" * 64

        def lookup(self, key: str) -> str | None:
            return None

    folder = tmp_path / "scripts"
    folder.mkdir()
    (folder / "run.sh").write_text("echo one\n")
    env = {"SCRIPTS_DIR": str(folder)}
    keys1 = [s.key for s in make_plan(resolve(m, "t", None, environ=env), environ=env, probe=Probe()).steps]
    (folder / "run.sh").write_text("echo two\n")
    keys2 = [s.key for s in make_plan(resolve(m, "t", None, environ=env), environ=env, probe=Probe()).steps]
    assert all(a != b for a, b in zip(keys1, keys2, strict=True)), "the script's key and every key after it"


ARGV = """\
    serving:
      config_path: /workspace/run.yaml
      style: argv
      command: [python3, -m, server]
      flag_names: {tensor-parallel-size: -tp}
      negatable: [enable-thing]
      args:
        model: /model
        tensor-parallel-size: 4
        trust-remote-code: true
        disable-log-requests: false
        enable-thing: false
        ratio: 0.9
        served-model-name: [llm, other]
        options: {a: 1}
        unset-me: null
"""


def test_argv_style(write_manifest: Callable[[str], Path]) -> None:
    text = MINIMAL.replace(MINIMAL[MINIMAL.index("    serving:"):MINIMAL.index("    default_profile")], ARGV)
    r = resolve(load_manifest(write_manifest(text)), "t", None, environ={})
    assert serving_argv(r) == ["python3", "-m", "server", "--model", "/model", "-tp", "4", "--trust-remote-code",
                               "--no-enable-thing", "--ratio", "0.9", "--served-model-name", "llm", "other",
                               "--options", '{"a":1}', "--max-num-seqs", "2"]


def test_check_steps_runs_scripts_through_the_runner() -> None:
    site = "/site"
    fs = DictFS(files={"/site/vllm/a.py": b"X = 1\n"})
    script = Step("s", "script", None, None, "targets.t.steps[1]", None,  # type: ignore[arg-type]
                  ScriptSpec(dest="/work", command=("sh", "x"), directory="${D}"))
    first = Step("p1", "patch", None, None, "targets.t.steps[0]", None,  # type: ignore[arg-type]
                 PatchSpec(file="vllm/a.py", old="X = 1", new="X = 2", count=1))
    after = Step("p2", "patch", None, None, "targets.t.steps[2]", None,  # type: ignore[arg-type]
                 PatchSpec(file="vllm/b.py", old="Y = 1", new="Y = 2", count=1))
    seen: list[bytes | None] = []

    def runner(step: Step, state: Overlay) -> ScriptOutcome:
        seen.append(state.read("/site/vllm/a.py"))  # the script gets the earlier steps' result
        return ScriptOutcome(0, DictFS(files={"/site/vllm/b.py": b"Y = 1\n"}), "exit 0")

    rows, _ = check_steps([first, script, after], {}, fs, site, run_script=runner)
    assert seen == [b"X = 2\n"]
    assert [r.status for r in rows] == ["applies", "ran", "applies"], "p2's file exists only after the script"

    def failing(step: Step, state: Overlay) -> ScriptOutcome:
        return ScriptOutcome(7, None, "exit code 7", ("boom",))

    rows, _ = check_steps([first, script, after], {"prof": [after]}, fs, site, run_script=failing)
    assert [r.status for r in rows] == ["applies", "script failed", "not checked"]
    assert rows[1].log_tail == ("boom",) and rows[1].ok is False
    assert rows[2].detail == AFTER_FAILED_SCRIPT
    rows, _ = check_steps([first, script], {}, fs, site)
    assert rows[1].status == "not checked" and "build time" in rows[1].detail, "no runner: as before"
