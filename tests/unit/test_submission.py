"""The submission tree without a daemon: determinism, form, the generated applier, --check, --git.

The base facts (site directory, python, ENTRYPOINT) are given here as the facts note states them for
bi100 and as the cpu recipe makes them; the integration tests read them from real images.
"""

from __future__ import annotations

import inspect
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from imageforge.errors import ConfigError
from imageforge.manifest.load import load_manifest
from imageforge.manifest.resolve import Resolved, resolve
from imageforge.patches.anchored import apply_patch, describe
from imageforge.patches.pycheck import check_python
from imageforge.plan import make_plan
from imageforge.submission import RECORD, BaseFacts, check_submission, render_tree, run_yaml_doc, write_submission
from imageforge.submission.applier import applier_source

REPO = Path(__file__).resolve().parents[2]
BASELINE = REPO / "tests" / "fixtures" / "bi100-baseline" / "qwen3_6_scripts"
BI100_ENV = {"IMAGEFORGE_BI100_BASE": "enginex-iluvatar/bi100-3.2.3-x86-ubuntu20.04-py3.10-poc-llm-infer:v1.2.3",
             "IMAGEFORGE_BI100_SCRIPTS": str(BASELINE)}
BI100_FACTS = BaseFacts("/usr/local/corex/lib64/python3/dist-packages", "/usr/bin/python3")
CPU_FACTS = BaseFacts("/opt/venv/lib/python3.11/site-packages", "/opt/venv/bin/python3")
CPU_REF = "imageforge/vllm-cpu-base:0123456789abcdef"

# The organisers' computility-run.yaml command (facts note, "How a submission is built and run"), typed in.
ORGANISERS = shlex.split(
    "python3 -m vllm.entrypoints.openai.api_server --model /model --served-model-name llm --max-model-len 100000 "
    "--gpu-memory-utilization 0.9 --trust-remote-code -tp 4 --max-num-seqs 1 --disable-log-requests "
    "--disable-frontend-multiprocessing --max-num-batched-tokens 8192 --enable-chunked-prefill "
    "--max-seq-len-to-capture 32768 --enable-auto-tool-choice --tool-call-parser qwen3_coder --reasoning-parser qwen3 "
    "--enable-prefix-caching"
)
ALIASES = {"-tp": "--tensor-parallel-size"}


def flag_map(argv: list[str]) -> tuple[list[str], dict[str, str | None]]:
    """(program words, flag -> value or None for a bare flag), aliases normalised; written here, not imported."""
    i = next(n for n, a in enumerate(argv) if a.startswith("-") and n > 2)
    program, out = argv[:i], dict[str, str | None]()
    while i < len(argv):
        flag = ALIASES.get(argv[i], argv[i])
        assert flag.startswith("--"), argv[i]
        if i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            out[flag], i = argv[i + 1], i + 2
        else:
            out[flag], i = None, i + 1
    return program, out


def bi100(profile: str = "baseline", sets: tuple[str, ...] = ()) -> Resolved:
    return resolve(load_manifest(REPO / "build.yaml"), "bi100", profile, environ=BI100_ENV, sets=list(sets))


def cpu(profile: str = "conservative") -> Resolved:
    return resolve(load_manifest(REPO / "build.yaml"), "cpu", profile, environ={})


def tree_of(root: Path) -> dict[str, tuple[bytes, int]]:
    return {p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mode & 0o777)
            for p in sorted(root.rglob("*")) if p.is_file() and ".git" not in p.relative_to(root).parts}


# --------------------------------------------------------------------------- bi100: the organisers' command


def test_bi100_baseline_yaml_equals_the_organisers_command(tmp_path: Path) -> None:
    write_submission(bi100(), tmp_path / "t", environ=BI100_ENV, base_ref=BI100_ENV["IMAGEFORGE_BI100_BASE"],
                     base=BI100_FACTS, log=lambda _: None)
    doc = yaml.safe_load((tmp_path / "t" / "computility-run.yaml").read_text())
    assert set(doc) == {"concurrency", "command", "env"}
    assert doc["concurrency"] == 1
    assert all(isinstance(x, str) for x in doc["command"]), "every flag and value a string"
    assert flag_map(doc["command"]) == flag_map(ORGANISERS)
    assert flag_map(doc["command"])[0] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert doc["env"] == [{"name": "VLLM_ENGINE_ITERATION_TIMEOUT_S", "value": "3600"}]


def test_bi100_false_boolean_is_left_out_and_a_changed_value_shows() -> None:
    doc = run_yaml_doc(make_plan(bi100("baseline", ("enable-prefix-caching=false", "max-num-seqs=2")),
                                 environ=BI100_ENV, probe=None))
    _, flags = flag_map(doc["command"])
    _, want = flag_map(ORGANISERS)
    assert "--enable-prefix-caching" not in flags and "--no-enable-prefix-caching" not in flags
    assert flags["--max-num-seqs"] == "2"
    del want["--enable-prefix-caching"]
    want["--max-num-seqs"] = "2"
    assert flags == want


def test_bi100_tree_copies_the_organisers_folder_and_runs_it_in_place(tmp_path: Path) -> None:
    out = tmp_path / "t"
    write_submission(bi100("replay"), out, environ=BI100_ENV, base_ref=BI100_ENV["IMAGEFORGE_BI100_BASE"],
                     base=BI100_FACTS, log=lambda _: None)
    files = tree_of(out)
    for path in sorted(BASELINE.rglob("*")):
        if path.is_file():
            assert files[f"qwen3_6_scripts/{path.relative_to(BASELINE).as_posix()}"][0] == path.read_bytes()
    dockerfile = (out / "Dockerfile").read_text()
    lines = [ln for ln in dockerfile.splitlines() if ln and not ln.startswith("#")]
    assert lines[0] == f"FROM {BI100_ENV['IMAGEFORGE_BI100_BASE']}"
    assert "COPY qwen3_6_scripts/ /workspace/qwen3_6_scripts/" in lines
    run = next(ln for ln in lines if "patch_ops.sh" in ln and ln.startswith("RUN"))
    assert json.loads(run[4:])[:2] == ["/bin/sh", "-c"]
    assert "cd /workspace/qwen3_6_scripts && bash patch_ops.sh" in json.loads(run[4:])[2]
    # the image's CMD is the yaml's command
    cmd = json.loads(next(ln for ln in lines if ln.startswith("CMD "))[4:])
    assert cmd == yaml.safe_load((out / "computility-run.yaml").read_text())["command"]


# --------------------------------------------------------------------------- form and determinism


def test_same_inputs_give_a_byte_identical_tree(tmp_path: Path) -> None:
    for name in ("a", "b"):
        write_submission(cpu(), tmp_path / name, environ={}, base_ref=CPU_REF, base=CPU_FACTS, log=lambda _: None)
    a, b = tree_of(tmp_path / "a"), tree_of(tmp_path / "b")
    assert a == b and len(a) > 10
    # rewriting over an existing tree removes what is no longer part of it
    (tmp_path / "a" / "imageforge" / "steps" / "stale.txt").write_text("x")
    write_submission(cpu(), tmp_path / "a", environ={}, base_ref=CPU_REF, base=CPU_FACTS, log=lambda _: None)
    assert tree_of(tmp_path / "a") == b


def test_the_tree_is_lf_only_and_names_no_host_path() -> None:
    files = render_tree(make_plan(cpu(), environ={}, probe=None), environ={}, base_ref=CPU_REF, base=CPU_FACTS)
    host_bits = {str(REPO), str(Path.home()), "/work/"}
    for path, file in files.items():
        assert file.data.startswith(b"\x7fELF") or b"\r" not in file.data, path  # a native step's .so: binary
        for bit in host_bits:
            assert bit.encode() not in file.data, (path, bit)


def test_dockerfile_one_group_per_step_in_order_with_its_why_and_legacy_syntax_only() -> None:
    r = cpu()
    plan = make_plan(r, environ={}, probe=None)
    files = render_tree(plan, environ={}, base_ref=CPU_REF, base=CPU_FACTS)
    text = files["Dockerfile"].data.decode()
    heads = [ln for ln in text.splitlines() if ln.startswith("# step ")]
    ids = [s.id for s in plan.steps]
    assert [h.split()[3] for h in heads] == ids
    assert ids[-2:] == ["verify", "serving-config"]
    for head, step in zip(heads, r.steps, strict=False):
        assert head.startswith(f"# step {ids.index(step.id) + 1}/{len(ids)} {step.id} ({step.kind}): ")
        assert " ".join((step.why or "").split()) in head
    instructions = [ln.split()[0] for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert instructions[0] == "FROM" and text.count("\nFROM ") == 1
    assert set(instructions) <= {"FROM", "LABEL", "COPY", "RUN", "ENV", "CMD"}
    body = "\n".join(ln for ln in text.splitlines() if not ln.startswith("#"))
    for forbidden in ("--chmod", "--mount", "<<", "--link", "--chown"):
        assert forbidden not in body
    assert r.manifest.digest in text and "imageforge 0.1.0" in text
    record = json.loads(files[RECORD].data)
    assert record["manifest_digest"] == r.manifest.digest and record["imageforge"] == "0.1.0"
    assert record["files"]["Dockerfile"]["sha256"] == __import__("hashlib").sha256(files["Dockerfile"].data).hexdigest()
    # cpu: the command is the image's CMD (style config), the env the serving env
    doc = yaml.safe_load(files["computility-run.yaml"].data)
    assert doc["command"] == ["vllm", "serve", "--config", "/etc/imageforge/serving.yaml"]
    assert doc["env"] == [{"name": k, "value": v} for k, v in r.serving_env().items()]
    assert f'CMD {json.dumps(doc["command"])}' in text


# --------------------------------------------------------------------------- the generated applier


def run_applier(tmp_path: Path, spec: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    stage = tmp_path / "stage"
    stage.mkdir(exist_ok=True)
    (stage / "apply.py").write_text(applier_source())
    (stage / "step.json").write_text(json.dumps(spec))
    # -I -S: no site-packages, no user site, no PYTHONPATH: the standard library only
    return subprocess.run([sys.executable, "-I", "-S", str(stage / "apply.py"), str(stage / "step.json")],
                          capture_output=True, text=True, timeout=60)


def test_applier_embeds_imageforge_patching_verbatim() -> None:
    source = applier_source()
    assert inspect.getsource(apply_patch) in source
    assert "import imageforge" not in source and "from imageforge" not in source


@pytest.mark.parametrize(("text", "status"), [
    ("a\nNUM = 8\nb\n", "applies"), ("a\nNUM = 4\nb\n", "already-applied"),
    ("a\n    NUM = 8\n", "applies"), ("a\nNUM=8\nb\n", "anchor-missing"), ("NUM = 8\nNUM = 8\n", "ambiguous"),
])
def test_applier_counts_anchors_as_imageforge_does(tmp_path: Path, text: str, status: str) -> None:
    target = tmp_path / "site" / "pkg" / "f.txt"  # not .py: this is about counting (the .py check has its own test)
    target.parent.mkdir(parents=True)
    target.write_text(text)
    os.chmod(target, 0o640)
    os.utime(target, (1600000000, 1600000000))
    expected = apply_patch(text, "NUM = 8", "NUM = 4")
    assert expected.status == status
    proc = run_applier(tmp_path, {"op": "edit", "step": "my-step", "path": str(target),
                                  "site": str(tmp_path / "site"), "old": "NUM = 8", "new": "NUM = 4", "count": 1})
    if status in ("applies", "already-applied"):
        assert proc.returncode == 0, proc.stderr
        assert target.read_text() == (expected.result if status == "applies" else text)
        assert target.stat().st_mode & 0o777 == 0o640 and int(target.stat().st_mtime) == 1600000000
    else:
        assert proc.returncode == 3
        assert "imageforge: step my-step failed" in proc.stderr
        assert ("anchor not found" if status == "anchor-missing" else "anchor found 2 times") in proc.stderr
        assert target.read_text() == text, "nothing written on failure"
    assert not (tmp_path / "stage").exists(), "the applier removes its stage folder"


def test_applier_symlink_glob_and_refusals(tmp_path: Path) -> None:
    src = tmp_path / "lib"
    src.mkdir()
    for name in ("libb.so.1", "liba.so", "other.txt"):
        (src / name).write_text(name)
    (src / "libdir.so").mkdir()
    into = tmp_path / "into"
    spec = {"op": "link", "step": "links", "glob": f"{src}/lib*.so*", "into": str(into)}
    assert run_applier(tmp_path, spec).returncode == 0
    assert sorted(p.name for p in into.iterdir()) == ["liba.so", "libb.so.1"]
    assert os.readlink(into / "liba.so") == f"{src}/liba.so"
    assert run_applier(tmp_path, spec).returncode == 0, "links already in place are skipped"
    (into / "liba.so").unlink()
    (into / "liba.so").write_text("a real file")
    proc = run_applier(tmp_path, spec)
    assert proc.returncode == 3 and "already exists" in proc.stderr and "step links" in proc.stderr
    proc = run_applier(tmp_path, {**spec, "glob": f"{src}/nothing*"})
    assert proc.returncode == 3 and "matches nothing" in proc.stderr


# --------------------------------------------------------------------------- --check and --git


@pytest.fixture
def cpu_tree(tmp_path: Path) -> Path:
    out = tmp_path / "tree"
    write_submission(cpu(), out, environ={}, base_ref=CPU_REF, base=CPU_FACTS, log=lambda _: None)
    return out


def check_problems(tree: Path, resolved: Resolved | None = None, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        check_submission(resolved or cpu(), tree, environ=environ or {}, log=lambda _: None)
    assert info.value.exit_code == 2
    return info.value.render()


def test_check_passes_on_a_fresh_tree_without_a_daemon(cpu_tree: Path) -> None:
    assert check_submission(cpu(), cpu_tree, environ={}, log=lambda _: None) == len(tree_of(cpu_tree))


def test_check_reports_an_edited_dockerfile_and_a_missing_file(cpu_tree: Path) -> None:
    df = cpu_tree / "Dockerfile"
    df.write_text(df.read_text().replace("RUN [\"chmod\", \"0644\"", "RUN [\"chmod\", \"0666\""))
    (cpu_tree / "imageforge" / "apply.py").unlink()
    text = check_problems(cpu_tree)
    assert "content differs: Dockerfile" in text and '0666' in text
    assert "missing: imageforge/apply.py" in text


def test_check_reports_yaml_flags_and_env(cpu_tree: Path) -> None:
    path = cpu_tree / "computility-run.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["command"].append("--max-num-seqs")
    doc["command"].append("64")
    doc["env"][0]["value"] = "7"
    path.write_text(yaml.safe_dump(doc))
    text = check_problems(cpu_tree)
    assert "--max-num-seqs '64' is not in the manifest" in text
    assert f"env {doc['env'][0]['name']}: expected '1', found '7'" in text


def test_check_reports_a_profile_change(cpu_tree: Path) -> None:
    text = check_problems(cpu_tree, cpu("aggressive"))
    assert "serving.yaml" in text and "VLLM_CPU_KVCACHE_SPACE: expected '2', found '1'" in text


def test_check_reports_cr_line_endings_and_bash_syntax(tmp_path: Path) -> None:
    out = tmp_path / "t"
    write_submission(bi100(), out, environ=BI100_ENV, base_ref=BI100_ENV["IMAGEFORGE_BI100_BASE"], base=BI100_FACTS,
                     log=lambda _: None)
    script = out / "qwen3_6_scripts" / "patch_ops.sh"
    script.write_bytes(script.read_bytes().replace(b"\n", b"\r\n", 1) + b"\nif then fi\n")
    text = check_problems(out, bi100(), BI100_ENV)
    assert "CR line ending in qwen3_6_scripts/patch_ops.sh" in text
    assert "bash -n qwen3_6_scripts/patch_ops.sh" in text
    assert "content differs: qwen3_6_scripts/patch_ops.sh" in text


def test_git_commits_the_tree(cpu_tree: Path) -> None:
    from imageforge.submission.tree import git_commit

    head = git_commit(cpu_tree, cpu(), lambda _: None)
    listed = subprocess.run(["git", "-C", str(cpu_tree), "ls-files"], capture_output=True, text=True,
                            check=True).stdout.split()
    assert sorted(listed) == sorted(tree_of(cpu_tree))
    assert git_commit(cpu_tree, cpu(), lambda _: None) == head, "nothing changed: no new commit"
    assert check_submission(cpu(), cpu_tree, environ={}, log=lambda _: None) > 0, ".git is not part of the tree"


@pytest.mark.parametrize(("text", "old", "new", "status", "message"), [
    ("def f():\n    if a:\n        pass\n    else:\n            x = 1\n", "        x = 1\n", "        y = 2\n",
     "inside-line", "found inside line 5 at column 5: the line is indented 12 spaces, the anchor 8 spaces"),
    ("def f():\r\n    x = 1\r\n", "    x = 1\n", "    y = 2\n", "crlf", "CRLF line ends"),
    ("def f(a):\n    x = 1\n    return a\n", "    x = 1\n", "    x = b\n", "applies",
     "line 2: NameError: name 'b' is not bound in its scope"),
    ("def f(a):\n    x = 1\n    return a\n", "    x = 1\n", "    x = (1\n", "applies", "line "),
])
def test_applier_refuses_what_the_engine_refuses(tmp_path: Path, text: str, old: str, new: str, status: str,
                                                 message: str) -> None:
    """Inside a line, CRLF, an unbound name, a syntax error: the applier's exit 3 and the engine's own message."""
    target = tmp_path / "site" / "pkg" / "f.py"
    target.parent.mkdir(parents=True)
    target.write_bytes(text.encode())
    expected = apply_patch(text, old, new)
    assert expected.status == status
    proc = run_applier(tmp_path, {"op": "edit", "step": "my-step", "path": str(target), "python_version": "3.10.12",
                                  "site": str(tmp_path / "site"), "old": old, "new": new, "count": 1})
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.startswith("imageforge: step my-step failed: ") and message in proc.stderr
    if status == "applies":  # it applies, but breaks the file: the engine's check says the same
        assert expected.result is not None
        problem = check_python(expected.result, str(target), python_version="3.10.12", lines=expected.new_lines)
        assert problem is not None and problem.error in proc.stderr
    else:
        assert describe(expected) in proc.stderr
    assert target.read_bytes() == text.encode(), "nothing written on failure"
