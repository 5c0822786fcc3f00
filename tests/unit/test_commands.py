"""The `imageforge` command, in process through invoke's Program: one flag table, help everywhere, results on
stdout and the rest on stderr, --json documents, `init`; and a closed stdout ending quietly (a real pipe)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from imageforge.cli import commands
from imageforge.cli import options as command_options
from imageforge.cli.output import EXIT_CLOSED_PIPE
from tests.cli import imageforge

REPO = Path(__file__).resolve().parents[2]
OPTION = re.compile(r"^  (-\S.*?)(?:\s{2,}|$)")  # an option line of a task's help: its flags


def run(*argv: str) -> tuple[int, str, str]:
    """``imageforge ARGV`` in this process: (exit code, stdout, stderr)."""
    proc = imageforge(*argv, cwd=Path.cwd())  # where the test stands (a test may chdir)
    return proc.returncode, proc.stdout, proc.stderr


def task_help(name: str) -> tuple[dict[str, set[str]], str]:
    """A task's ``--help``: {long name: its other flags}, and its text less the usage line."""
    code, out, err = run(name, "--help")
    assert code == 0, err
    flags: dict[str, set[str]] = {}
    for line in out.partition("\nOptions:\n")[2].splitlines():
        if m := OPTION.match(line):
            names = {re.sub(r"[= \[].*", "", part.strip()) for part in m.group(1).split(", ")}
            longs = sorted(n for n in names if n.startswith("--"))
            flags[longs[0]] = names - {longs[0]}
    return flags, out.partition("\nDocstring:\n")[2]


def all_task_names() -> list[str]:
    return sorted(commands.ns.task_names)


def test_one_meaning_per_short_flag_and_h_is_always_help() -> None:
    meaning: dict[str, str] = {}
    table = {f"-{short}": "--" + name.rstrip("_").replace("_", "-")
             for name, short in command_options.SHORT_FLAGS.items()}
    for name in all_task_names():
        flags, text = task_help(name)
        assert flags, name
        for long_name, others in flags.items():
            for flag in others:
                if flag.startswith("--"):
                    continue  # a long alias (vllm bench serve's names)
                assert flag != "-h", (name, long_name)
                assert table.get(flag) == long_name.replace("--[no-]", "--"), (name, flag, long_name)
                assert meaning.setdefault(flag, long_name) == long_name, (name, flag, long_name, meaning[flag])
        assert "--=" not in text, name
    assert set(meaning) == set(table)  # every short flag of the table is used somewhere


def test_help_names_only_options_that_exist() -> None:
    for name in all_task_names():
        flags, text = task_help(name)
        known = {n for long_name, others in flags.items() for n in (long_name, *others)}
        known |= {n.replace("--[no-]", "--no-") for n in known} | {n.replace("--[no-]", "--") for n in known}
        for mentioned in set(re.findall(r"(?<![\w-])--[a-z][a-z-]*[a-z]", text)):
            assert mentioned in known, (name, mentioned)


def test_every_task_answers_h_and_float_options_show_a_placeholder() -> None:
    code, out, _ = run("bench", "-h")
    assert code == 0 and "Usage: imageforge [--core-opts] bench" in out
    for option in ("--duration=FLOAT", "--shared-prefix=FLOAT", "--max-error-rate=FLOAT", "--timeout=FLOAT"):
        assert option in out
    assert "--requests=INT, --num-prompts=INT" in out and "--concurrency=INT, --max-concurrency=INT" in out
    assert "min_tokens" not in out  # the bench sends max_tokens + ignore_eos
    _, clean_help, _ = run("clean", "-h")
    assert "--min-age=FLOAT" in clean_help and "-m STRING, --manifest=STRING" in clean_help


def test_validate_json_is_one_document_on_stdout(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # the manifest default: ./build.yaml
    code, out, err = run("validate", "-j")
    assert code == 0, err
    data = json.loads(out)
    assert data["ok"] is True and set(data["targets"]) == {"cpu", "bi100"}
    code, out, _ = run("plan", "-t", "cpu", "-p", "aggressive", "-s", "max-num-seqs=3", "--no-daemon", "-j")
    assert code == 0 and json.loads(out)["serving"]["max-num-seqs"] == 3


def test_errors_go_to_stderr_with_their_exit_code(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nversion: 2\n")
    code, out, err = run("validate", "-m", str(bad), "--json")
    assert (code, out) == (2, "") and "duplicate key 'version'" in err and "Traceback" not in err
    code, out, err = run("validate", "--no-such-option")  # invoke's own usage error: exit 1
    assert code == 1 and out == "" and "No idea what '--no-such-option' is!" in err


def test_init_writes_a_starter_project_that_validates(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "proj"
    code, out, err = run("init", "--dir", str(project))
    assert code == 0, err
    for rel in ("build.yaml", "images/cpu/base.yaml", "images/cpu/install.sh", "images/cpu/requirements.lock",
                "smoke/dummy.yaml"):
        assert (project / rel).is_file() and f"wrote   {project / rel}" in out
    assert (project / "images/cpu/base.yaml").read_bytes() == (REPO / "images/cpu/base.yaml").read_bytes()
    for name in ("build.schema.json", "smoke.schema.json"):  # what the YAML files' first lines name
        assert (project / "schema" / name).read_bytes() == (REPO / "schema" / name).read_bytes()
    for rel, schema in (("build.yaml", "build"), ("smoke/dummy.yaml", "smoke")):
        first = (project / rel).read_text().splitlines()[0]
        named = first.removeprefix("# yaml-language-server: $schema=")
        assert named != first and (project / rel).parent.joinpath(named).resolve() == \
            (project / "schema" / f"{schema}.schema.json").resolve(), first
    monkeypatch.chdir(project)
    code, out, err = run("validate", "--json")
    assert code == 0, err
    assert set(json.loads(out)["targets"]) == {"cpu"}
    code, out, err = run("plan", "--no-daemon", "--json")
    assert code == 0, err
    assert json.loads(out)["target"] == "cpu"
    (project / "build.yaml").write_text("# mine\n")
    code, out, _ = run("init", "--dir", str(project))
    assert code == 0 and f"kept    {project / 'build.yaml'}" in out
    assert (project / "build.yaml").read_text() == "# mine\n"


def test_a_closed_stdout_ends_quietly() -> None:
    """`imageforge validate --json | head -c0`: the reader is gone before the first write."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMAGEFORGE_")}
    env["PYTHONPATH"] = str(REPO / "src")
    proc = subprocess.Popen([sys.executable, "-c", "from imageforge.cli.commands import main; main()", "validate",
                             "--json"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command writes anything
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == EXIT_CLOSED_PIPE, err
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err
    listing = subprocess.Popen([sys.executable, "-c", "from imageforge.cli.commands import main; main()", "--list"],
                               cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert listing.stdout is not None and listing.stderr is not None
    listing.stdout.close()
    err = listing.stderr.read().decode()
    assert listing.wait(timeout=60) == EXIT_CLOSED_PIPE and "Traceback" not in err, err
