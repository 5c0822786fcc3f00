"""apply --in-place / revert / status on a tmp root holding a fake package tree (no daemon, real processes).

The target interpreter is this test's Python with ``PYTHONPATH`` at the fake site directory: discovery,
the hash-checked ``.pyc`` and the import check all run in it, as on the card's machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from imageforge import inplace
from imageforge.errors import BuildError, ConfigError
from imageforge.manifest.load import load_manifest
from imageforge.manifest.resolve import Resolved, resolve
from tests.unit.conftest import manifest_text

SRC = Path(__file__).resolve().parents[2] / "src"

MANIFEST = manifest_text("""\
    steps:
      - id: over
        kind: overlay
        source: overlays/sorted.py
        dest: vllm/sorted.py
      - id: same-size
        kind: patch
        file: vllm/y.py
        old: "A = 1"
        new: "A = 2"
      - id: moe-one
        kind: patch
        file: vllm/moe.py
        old: "ONE = 1"
        new: "ONE = 7"
      - id: libs
        kind: symlink
        glob: /opt/libs/lib*.so*
        into: /usr/local/lib
      - id: ldconfig
        kind: script
        source: overlays/ldconfig.sh
        args: [/usr/local/lib]
        touches: [/usr/local/lib, /etc/ld.so.cache, /var/cache/ldconfig]
    verify:
      imports: [vllm.y, vllm.sorted]
    serving:
      config_path: /etc/serve.yaml
      args: {model: /m, max-num-seqs: 1, gpu-memory-utilization: 0.9, enforce-eager: true}
    default_profile: small
    profiles:
      small: {args: {max-num-seqs: 2}}
      big:
        args: {max-num-seqs: 4}
        steps:
          - id: moe-two
            kind: patch
            file: vllm/moe.py
            old: "TWO = 2"
            new: "TWO = 9"
""")

LDCONFIG = """\
#!/bin/sh
set -eu
n=$(ls "$IMAGEFORGE_ROOT$1" | wc -l)
echo "cache of $n libs" > "$IMAGEFORGE_ROOT/etc/ld.so.cache"
echo aux > "$IMAGEFORGE_ROOT/var/cache/ldconfig/aux-cache"   # made and removed: only the directory's mtime moves
rm "$IMAGEFORGE_ROOT/var/cache/ldconfig/aux-cache"
echo "ldconfig: $n"
"""


def make_root(tmp: Path) -> Path:
    root = tmp / "root"
    site = root / "site"
    pkg = site / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "y.py").write_text("A = 1\n")
    (pkg / "moe.py").write_text("ONE = 1\nTWO = 2\n")
    dist = site / "vllm-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 1.0\n")
    import base64
    import hashlib

    rows = []
    for rel in ("vllm/__init__.py", "vllm/y.py", "vllm/moe.py"):
        digest = base64.urlsafe_b64encode(hashlib.sha256((site / rel).read_bytes()).digest()).rstrip(b"=").decode()
        rows.append(f"{rel},sha256={digest},{(site / rel).stat().st_size}")
    (dist / "RECORD").write_text("\n".join([*rows, "vllm-1.0.dist-info/RECORD,,"]) + "\n")
    (root / "opt/libs").mkdir(parents=True)
    (root / "opt/libs/libfoo.so.1").write_bytes(b"\x7fELF")
    (root / "usr/local/lib").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "var/cache/ldconfig").mkdir(parents=True)
    (root / "etc/ld.so.cache").write_text("old cache\n")
    # an old timestamp pyc of y.py: a same-size patch that keeps the mtime must not import it
    subprocess.run([sys.executable, "-c", "import py_compile,sys; py_compile.compile(sys.argv[1])", str(pkg / "y.py")],
                   check=True)
    past = time.time_ns() - 10**11
    for path in [root, *root.rglob("*")]:
        os.utime(path, ns=(past, past), follow_symlinks=False)
    return root


@pytest.fixture
def box(tmp_path: Path) -> dict[str, Any]:
    repo = tmp_path / "repo"
    (repo / "overlays").mkdir(parents=True)
    (repo / "overlays/sorted.py").write_text("def fused_experts():\n    return 1\n")
    (repo / "overlays/ldconfig.sh").write_text(LDCONFIG)
    (repo / "overlays/ldconfig.sh").chmod(0o755)
    (repo / "build.yaml").write_text(textwrap.dedent(MANIFEST))
    root = make_root(tmp_path)
    environ = {**os.environ, "PYTHONPATH": str(root / "site")}
    return {"repo": repo, "root": root, "environ": environ}


def resolved(box: dict[str, Any], profile: str | None = None, manifest: str = "build.yaml") -> Resolved:
    return resolve(load_manifest(box["repo"] / manifest), "t", profile, environ=box["environ"])


def apply(box: dict[str, Any], profile: str | None = None, **kwargs: Any) -> inplace.ApplyReport:
    return inplace.apply(resolved(box, profile), root=box["root"], python=sys.executable, environ=box["environ"],
                         log=lambda _l: None, **kwargs)


def listing(root: Path) -> list[tuple[Any, ...]]:
    return [row for row in inplace.listing(root)]


def module_value(box: dict[str, Any], expr: str) -> str:
    done = subprocess.run([sys.executable, "-c", f"import vllm.y, vllm.moe; print({expr})"], env=box["environ"],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_apply_then_revert_restores_the_listing(box: dict[str, Any]) -> None:
    root = box["root"]
    before = listing(root)
    report = apply(box)
    assert [s.id for s in report.steps] == ["over", "same-size", "moe-one", "libs", "ldconfig", "verify"]
    assert (root / "site/vllm/y.py").read_text() == "A = 2\n"
    assert os.readlink(root / "usr/local/lib/libfoo.so.1") == "/opt/libs/libfoo.so.1"
    assert (root / "etc/ld.so.cache").read_text() == "cache of 1 libs\n"
    assert module_value(box, "vllm.y.A") == "2"  # the stale timestamp pyc did not win
    assert report.verify["ok"] and report.verify["imports"] == 2
    journal = json.loads((root / "var/lib/imageforge/journal.json").read_text())
    assert journal["environ"]["PYTHONPATH"] == str(root / "site")
    assert [a["id"] for a in journal["applied"]] == [s.id for s in report.steps]
    # .pyc written after apply by an import (bytecode writing on, whatever this shell says): the overlay's own
    # (journaled) and the unchanged package __init__'s next to it (new in a journaled __pycache__): revert removes both
    writing = {k: v for k, v in box["environ"].items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-c", "import vllm.sorted"], env=writing, check=True)
    assert (root / f"site/vllm/__pycache__/__init__.{sys.implementation.cache_tag}.pyc").is_file()
    back = inplace.revert(root)
    assert back.restored > 0
    assert listing(root) == before
    assert module_value(box, "vllm.y.A") == "1"


def test_second_apply_after_revert_gives_the_same_hashes(box: dict[str, Any]) -> None:
    apply(box)
    first = {r[0]: r[7] for r in listing(box["root"]) if "var/lib/imageforge" not in r[0]}
    inplace.revert(box["root"])
    apply(box)
    again = {r[0]: r[7] for r in listing(box["root"]) if "var/lib/imageforge" not in r[0]}
    assert first == again


def test_the_same_apply_again_has_nothing_to_do(box: dict[str, Any]) -> None:
    apply(box)
    snapshot = listing(box["root"] / "site")
    report = apply(box)
    assert report.nothing_to_do and not report.steps
    assert "nothing to do" in report.text()
    assert listing(box["root"] / "site") == snapshot


def test_another_profile_reapplies_the_file_two_steps_touch(box: dict[str, Any]) -> None:
    apply(box, "big")
    assert (box["root"] / "site/vllm/moe.py").read_text() == "ONE = 7\nTWO = 9\n"
    report = apply(box, "small")
    assert report.undone == ("verify", "moe-two")
    assert (box["root"] / "site/vllm/moe.py").read_text() == "ONE = 7\nTWO = 2\n"
    report = apply(box, "small", skip=["moe-one"])
    assert "moe-one" in report.undone
    assert (box["root"] / "site/vllm/moe.py").read_text() == "ONE = 1\nTWO = 2\n"
    assert module_value(box, "vllm.moe.ONE") == "1"


def test_drift_stops_apply_and_revert_and_force_keeps_the_copy(box: dict[str, Any]) -> None:
    root = box["root"]
    before = listing(root)
    apply(box)
    (root / "site/vllm/y.py").write_text("A = 3\n")
    with pytest.raises(BuildError) as caught:
        inplace.revert(root)
    assert caught.value.exit_code == 3
    assert any("site/vllm/y.py" in line and "expected" in line for line in caught.value.log_tail)
    with pytest.raises(BuildError):
        apply(box, "big")
    report = inplace.revert(root, force=True)
    assert len(report.drift_kept) == 1 and Path(report.drift_kept[0]).read_text() == "A = 3\n"
    assert (root / "site/vllm/y.py").read_text() == "A = 1\n"
    def outside_journal(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:  # the kept copy stays there
        return [r for r in rows if "var" not in Path(r[0]).relative_to(root).parts[:1] and r[0] != str(root)]

    assert outside_journal(listing(root)) == outside_journal(before)


def _stopped(box: dict[str, Any], more_script: str) -> BuildError:
    """The ldconfig script with ``more_script`` appended: apply stops at it with exit 3, its declared paths
    restored, the steps before it journaled as applied, none in progress."""
    (box["repo"] / "overlays/ldconfig.sh").write_text(LDCONFIG + more_script)
    root = box["root"]
    with pytest.raises(BuildError) as caught:
        apply(box)
    assert caught.value.exit_code == 3
    assert (root / "etc/ld.so.cache").read_text() == "old cache\n"
    journal = json.loads((root / "var/lib/imageforge/journal.json").read_text())
    assert [a["id"] for a in journal["applied"]] == ["over", "same-size", "moe-one", "libs"]
    assert journal["in_progress"] is None
    return caught.value


def test_a_script_changing_an_undeclared_path_is_stopped_and_restored(box: dict[str, Any]) -> None:
    error = _stopped(box, 'echo sneaky > "$IMAGEFORGE_ROOT/site/vllm/extra.py"\n')
    assert any("extra.py" in line for line in error.log_tail)
    assert not (box["root"] / "site/vllm/extra.py").exists()


def test_a_same_size_rewrite_with_its_mtime_put_back_is_stopped(box: dict[str, Any]) -> None:
    """ctime cannot be set: the undeclared-change scan sees what an mtime-and-size comparison would miss."""
    (box["root"] / "site/vllm/__init__.py").write_text("# 0\n")
    error = _stopped(box, 'f="$IMAGEFORGE_ROOT/site/vllm/__init__.py"; touch -r "$f" /tmp/ref.$$; '
                          'echo "# 1" > "$f"; touch -r /tmp/ref.$$ "$f"; rm /tmp/ref.$$\n')
    assert list(error.log_tail) == [str(box["root"] / "site/vllm/__init__.py")]


class _ClockSetBack:
    """The clock source of the undeclared-change scan, set back 30 s while the script runs (a real one needs
    CAP_SYS_TIME)."""

    def __init__(self) -> None:
        self.offset = 0

    def arm(self) -> bool:
        return True

    def was_set(self) -> bool:
        self.offset = -30 * 10**9
        return True

    def offset_ns(self) -> int:
        return self.offset

    def close(self) -> None:
        return None


def test_a_clock_set_while_the_script_runs_stops_the_step(box: dict[str, Any],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from imageforge.inplace import changescan

    monkeypatch.setattr(changescan, "KernelClock", _ClockSetBack)
    error = _stopped(box, 'echo new > "$IMAGEFORGE_ROOT/site/vllm/added.py"\n')
    assert "clock" in str(error) and "-30.000 s" in str(error)
    # every scanned path counts as changed: at least every file of the box's tree (the scan also covers the
    # interpreter's install scheme, the test venv here, whose paths may sort first in the 20 the error names)
    counted = int(re.search(r"changed (\d+) path", str(error)).group(1))  # type: ignore[union-attr]
    in_tree = [p for p in (box["root"] / "site").rglob("*") if p.is_file()]
    assert len(in_tree) >= 3 and counted >= len(in_tree)
    assert not (box["root"] / "site/vllm/added.py").exists()


def test_dry_run_writes_nothing_and_prints_the_table(box: dict[str, Any]) -> None:
    before = listing(box["root"])
    report = inplace.dry_run(resolved(box), root=box["root"], python=sys.executable, environ=box["environ"])
    text = report.text()
    assert "same-size" in text and "applies" in text and "not checked" in text
    assert listing(box["root"]) == before
    # the .py files the steps would write, compiled by the target interpreter in one call
    assert report.final.python >= 1 and report.final.ok
    assert report.final.compiled_by == f"the target's Python {sys.version.split()[0]}, {sys.executable}"
    assert f"compile (compiled by the target's Python {sys.version.split()[0]}" in text


def test_the_target_interpreter_compiles_the_sources_or_says_it_did_not(box: dict[str, Any]) -> None:
    from imageforge.inplace.package import discover_local
    from imageforge.inplace.verify import compile_sources

    pkg = discover_local(resolved(box).target, box["root"], sys.executable, box["environ"], check_version=False)
    said = compile_sources(pkg, box["environ"], [("/site/vllm/a.py", "X = 1\n"),
                                                 ("/site/vllm/b.py", "def f():\n    pass\nreturn 1\n")])
    assert said is not None and said.executable == sys.executable
    assert [(i, line) for i, _, line, _, _ in said.errors] == [(1, 3)]
    assert "'return' outside function" in said.errors[0][1]
    gone = dataclasses.replace(pkg, python=str(box["root"] / "no-such-python"))
    assert compile_sources(gone, box["environ"], [("/site/vllm/a.py", "X = 1\n")]) is None


def test_status_reports_steps_drift_and_record(box: dict[str, Any]) -> None:
    apply(box)
    report = inplace.status(box["root"])
    assert report.applied[-1] == "verify" and report.ok
    assert report.record_checked == 3 and len(report.record_changed) == 2
    (box["root"] / "site/vllm/__init__.py").write_text("# edited\n")
    report = inplace.status(box["root"])
    assert not report.ok and any("__init__.py" in p for p in report.record_foreign)


# --------------------------------------------------------------------------- real processes, real signals

RUNNER = """
import os, sys
from pathlib import Path
from imageforge import inplace
from imageforge.manifest.load import load_manifest
from imageforge.manifest.resolve import resolve
repo, root = Path(sys.argv[1]), Path(sys.argv[2])
env = dict(os.environ)
r = resolve(load_manifest(repo / "build.yaml"), "t", None, environ=env)
try:
    inplace.apply(r, root=root, python=sys.executable, environ=env, log=print, echo=print)
except inplace.apply_module.Interrupted as exc:
    print("INTERRUPTED", exc.signum, flush=True); sys.exit(exc.exit_code)
"""


def _slow_script(box: dict[str, Any]) -> None:
    (box["repo"] / "overlays/ldconfig.sh").write_text(
        LDCONFIG.replace('echo "ldconfig: $n"', 'echo "ldconfig: $n"; echo STARTED $$; exec sleep 60'))


def _start(box: dict[str, Any]) -> subprocess.Popen[str]:
    runner = RUNNER.replace("inplace.apply_module.Interrupted", "__import__('imageforge.inplace.interrupts', "
                            "fromlist=['x']).Interrupted")
    env = {**box["environ"], "PYTHONPATH": f"{SRC}{os.pathsep}{box['root'] / 'site'}"}
    return subprocess.Popen([sys.executable, "-u", "-c", runner, str(box["repo"]), str(box["root"])], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(proc: subprocess.Popen[str], mark: str) -> int:
    """The pid the script printed after ``mark`` (its own process group: it outlives a SIGKILLed imageforge)."""
    assert proc.stdout is not None
    seen: list[str] = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith(mark):
            return int(line.split()[1])
    raise AssertionError("".join(seen))


def _kill_script(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_rolls_back_the_step_in_progress(box: dict[str, Any], sig: int) -> None:
    _slow_script(box)
    root = box["root"]
    cache = (root / "etc/ld.so.cache").read_bytes()
    proc = _start(box)
    _wait_for(proc, "STARTED")
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert f"INTERRUPTED {int(sig)}" in out
    assert (root / "etc/ld.so.cache").read_bytes() == cache  # the script's change rolled back
    journal = json.loads((root / "var/lib/imageforge/journal.json").read_text())
    assert journal["in_progress"] is None
    assert [a["id"] for a in journal["applied"]] == ["over", "same-size", "moe-one", "libs"]
    assert (root / "site/vllm/y.py").read_text() == "A = 2\n"  # the completed steps stay


def test_after_sigkill_revert_recovers_from_the_journal(box: dict[str, Any]) -> None:
    _slow_script(box)
    root = box["root"]
    before = listing(root)
    proc = _start(box)
    script = _wait_for(proc, "STARTED")
    proc.kill()
    proc.wait(timeout=30)
    _kill_script(script)
    journal = json.loads((root / "var/lib/imageforge/journal.json").read_text())
    assert journal["in_progress"]["id"] == "ldconfig"
    assert (root / "etc/ld.so.cache").read_text() == "cache of 1 libs\n"
    report = inplace.revert(root)
    assert report.recovered == "ldconfig"
    assert listing(root) == before


def test_after_sigkill_the_next_apply_recovers(box: dict[str, Any]) -> None:
    _slow_script(box)
    proc = _start(box)
    script = _wait_for(proc, "STARTED")
    proc.kill()
    proc.wait(timeout=30)
    _kill_script(script)
    (box["repo"] / "overlays/ldconfig.sh").write_text(LDCONFIG)
    report = apply(box)
    assert [s.id for s in report.steps] == ["ldconfig", "verify"]
    assert (box["root"] / "etc/ld.so.cache").read_text() == "cache of 1 libs\n"


def test_an_in_place_dry_run_never_imports_docker(box: dict[str, Any]) -> None:
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from imageforge import app
        s = app.settings(manifest={str(box['repo'] / 'build.yaml')!r})
        app.apply(s, "t", None, root={str(box['root'])!r}, python=sys.executable, dry_run=True,
                           show=lambda text: print(text))
        assert "docker" not in sys.modules, sorted(m for m in sys.modules if m.startswith("docker"))
        print("NO-DOCKER")
    """)
    env = {**box["environ"], "PYTHONPATH": f"{SRC}{os.pathsep}{box['root'] / 'site'}"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "NO-DOCKER" in done.stdout and "same-size" in done.stdout


def test_never_writes_through_a_link_leaving_the_root(box: dict[str, Any], tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    root = box["root"]
    (root / "usr/local/lib").rmdir()
    (root / "usr/local/lib").symlink_to(outside)
    with pytest.raises(BuildError, match="outside the root"):
        apply(box)
    assert list(outside.iterdir()) == []


def test_the_console_command_runs_without_the_callers_pythonpath(tmp_path: Path) -> None:
    """A corex-like PYTHONPATH holding a broken `yaml` must not reach imageforge's own process; the target gets it."""
    shadow = tmp_path / "corex"
    shadow.mkdir()
    (shadow / "yaml.py").write_text("raise ImportError('the box PYTHONPATH shadowed imageforge')\n")
    script = tmp_path / "imageforge"
    script.write_text(f"import sys\nsys.path.insert(0, {str(SRC)!r})\nfrom imageforge.cli.launch import main\n"
                      "from imageforge import settings\nprint('CALLER', settings.Settings.from_cli().environ"
                      ".get('PYTHONPATH'), file=sys.stderr)\nmain()\n")
    env = {**os.environ, "PYTHONPATH": str(shadow)}
    done = subprocess.run([sys.executable, str(script), "status", "--root", str(tmp_path), "--json"], env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["applied"] == []
    assert f"CALLER {shadow}" in done.stderr  # Settings.environ gives the caller's PYTHONPATH back


def test_pythonpath_is_cut_to_imageforges_own_folder() -> None:
    from imageforge.cli.launch import without_caller_pythonpath

    assert without_caller_pythonpath({"PYTHONPATH": str(SRC)}, str(SRC)) is None
    env = without_caller_pythonpath({"PYTHONPATH": f"{SRC}{os.pathsep}/usr/local/corex", "A": "1"}, str(SRC))
    assert env == {"PYTHONPATH": str(SRC), "IMAGEFORGE_CALLER_PYTHONPATH": f"{SRC}{os.pathsep}/usr/local/corex",
                   "A": "1"}
    assert without_caller_pythonpath({"PYTHONPATH": "/x", "IMAGEFORGE_CALLER_PYTHONPATH": "/x"}, str(SRC)) is None


def directory_step(touches: str) -> str:
    """A manifest whose one step is the organisers' shape: a folder copied to ``dest``, its command run there."""
    return manifest_text(f"""\
    steps:
      - id: baseline
        kind: script
        directory: baseline
        dest: /workspace/scripts
        command: [sh, patch_ops.sh]
        touches: {touches}
    serving:
      config_path: /etc/serve.yaml
      args: {{model: /m}}
""")


DIRECTORY_STEP = directory_step("[vllm, /workspace/scripts]")


def test_a_directory_script_is_copied_to_dest_and_run_there(box: dict[str, Any]) -> None:
    """The organisers' shape: a folder copied to ``dest`` and its command run in it; revert removes both."""
    folder = box["repo"] / "baseline"
    folder.mkdir()
    (folder / "y.py").write_text("A = 5\n")
    (folder / "patch_ops.sh").write_text('test -f ./patch_ops.sh\ncp y.py "$IMAGEFORGE_ROOT/site/vllm/y.py"\n')
    (box["repo"] / "dir.yaml").write_text(DIRECTORY_STEP)
    root = box["root"]
    before = listing(root)
    report = inplace.apply(resolved(box, manifest="dir.yaml"), root=root, python=sys.executable,
                           environ=box["environ"], log=lambda _l: None)
    assert report.steps[0].status == "ran" and report.steps[0].paths >= 3  # y.py, the folder, its two files
    assert (root / "workspace/scripts/patch_ops.sh").is_file()
    assert module_value(box, "vllm.y.A") == "5"
    inplace.revert(root)
    after = listing(root)
    assert ([r for r in after if r not in before], [r for r in before if r not in after]) == ([], [])
    assert not (root / "workspace").exists()


def _dead_patcher_folder(box: dict[str, Any], copied: str) -> None:
    """The organisers' folder as the facts describe it: a patcher the script runs, one it never runs nor imports
    with a real syntax error (their patch_paged_attention_v2.py), and a file copied into the package."""
    folder = box["repo"] / "baseline"
    folder.mkdir()
    (folder / "y.py").write_text(copied)
    (folder / "patch_run.py").write_text("import patch_helpers\nprint(patch_helpers.NAME)\n")
    (folder / "patch_helpers.py").write_text("NAME = 'patched'\n")
    (folder / "patch_paged_attention_v2.py").write_text("def forward(:\n    pass\n")
    (folder / "patch_ops.sh").write_text('set -e\ncp y.py "$IMAGEFORGE_ROOT/site/vllm/y.py"\n'
                                         f"{sys.executable} patch_run.py\n")
    (box["repo"] / "dir.yaml").write_text(DIRECTORY_STEP)


def test_a_dead_patcher_in_the_scripts_folder_is_listed_not_compiled(box: dict[str, Any]) -> None:
    _dead_patcher_folder(box, "A = 5\n")
    report = inplace.apply(resolved(box, manifest="dir.yaml"), root=box["root"], python=sys.executable,
                           environ=box["environ"], log=lambda _l: None, imports=False)
    verify = report.to_json()["verify"]
    # the folder's copy of y.py is dead too: copied into the package, never run from the folder
    assert verify["ok"] and verify["dead"] == ["/workspace/scripts/patch_paged_attention_v2.py",
                                               "/workspace/scripts/y.py"]
    assert verify["run"] == ["/workspace/scripts/patch_helpers.py", "/workspace/scripts/patch_run.py"]
    assert verify["python"] == 1, "the copied vllm/y.py: under the interpreter's import root"
    assert "2 dead (listed, not compiled): /workspace/scripts/patch_paged_attention_v2.py" in report.text()
    # no bytecode of the dead files (the scripts' own run may leave patch_helpers' when bytecode is written)
    assert not [*(box["root"] / "workspace/scripts").glob("__pycache__/patch_paged_attention_v2.*"),
                *(box["root"] / "workspace/scripts").glob("__pycache__/y.*")]
    inplace.revert(box["root"])


def test_a_broken_file_a_script_copies_into_the_package_fails_verify(box: dict[str, Any]) -> None:
    _dead_patcher_folder(box, "A = (5\n")
    with pytest.raises(BuildError, match="do not compile") as caught:
        inplace.apply(resolved(box, manifest="dir.yaml"), root=box["root"], python=sys.executable,
                      environ=box["environ"], log=lambda _l: None, imports=False)
    assert any("site/vllm/y.py does not compile" in line for line in caught.value.log_tail or [])
    inplace.revert(box["root"])


PIP_STEP = directory_step('[vllm, /workspace/scripts, "{purelib}/extra", "{purelib}/extra-*.dist-info", '
                          '"{scripts}/extra*"]')

#: What `pip install extra==1.0` over extra 0.9 does to the interpreter's scheme: the package's files replaced,
#: the old dist-info removed, the new one made, the console script rewritten.
PIP_LIKE = """\
set -eu
test -f ./patch_ops.sh
P={purelib}
rm -rf "$P/extra" "$P/extra-0.9.dist-info"
mkdir -p "$P/extra/__pycache__" "$P/extra-1.0.dist-info"
echo 'VERSION = "1.0"' > "$P/extra/__init__.py"
echo pyc > "$P/extra/__pycache__/__init__.cpython-311.pyc"
printf 'Name: extra\\nVersion: 1.0\\n' > "$P/extra-1.0.dist-info/METADATA"
printf '#!/bin/sh\\necho 1.0\\n' > {scripts}/extra-cli
"""


def venv_box(box: dict[str, Any]) -> tuple[Path, Path, Path]:
    """A target interpreter inside the root (a venv): its purelib and scripts directory are under the root,
    holding extra 0.9 (package, dist-info, console script) as pip would have left it."""
    root = box["root"]
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    python = root / "venv/bin/python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    (purelib / "extra").mkdir()
    (purelib / "extra/__init__.py").write_text('VERSION = "0.9"\n')
    (purelib / "extra-0.9.dist-info").mkdir()
    (purelib / "extra-0.9.dist-info/METADATA").write_text("Name: extra\nVersion: 0.9\n")
    (root / "venv/bin/extra-cli").write_text("#!/bin/sh\necho 0.9\n")
    past = time.time_ns() - 10**11
    for path in [root / "venv", *(root / "venv").rglob("*")]:
        os.utime(path, ns=(past, past), follow_symlinks=False)
    folder = box["repo"] / "baseline"
    folder.mkdir()
    (box["repo"] / "pip.yaml").write_text(PIP_STEP)
    (folder / "patch_ops.sh").write_text(PIP_LIKE.format(purelib=purelib, scripts=root / "venv/bin"))
    return python, purelib, root / "venv/bin"


def test_a_script_installing_into_the_interpreters_purelib_is_journaled_and_reverted(box: dict[str, Any]) -> None:
    python, purelib, scripts = venv_box(box)
    root = box["root"]
    before = listing(root)
    assert any(str(r[0]).endswith("extra-0.9.dist-info/METADATA") for r in before)
    report = inplace.apply(resolved(box, manifest="pip.yaml"), root=root, python=str(python),
                           environ=box["environ"], log=lambda _l: None, imports=False)
    assert report.steps[0].status == "ran"
    assert (purelib / "extra/__init__.py").read_text() == 'VERSION = "1.0"\n'
    journal = json.loads((root / "var/lib/imageforge/journal.json").read_text())
    for changed in ("extra/__init__.py", "extra-1.0.dist-info/METADATA", "extra-0.9.dist-info/METADATA",
                    "extra/__pycache__/__init__.cpython-311.pyc"):
        assert str(purelib / changed) in journal["paths"], changed
    assert str(scripts / "extra-cli") in journal["paths"]
    inplace.revert(root)
    after = listing(root)
    assert ([r for r in after if r not in before], [r for r in before if r not in after]) == ([], [])


def test_an_undeclared_change_in_the_interpreters_purelib_is_stopped(box: dict[str, Any]) -> None:
    python, purelib, _ = venv_box(box)
    script = box["repo"] / "baseline/patch_ops.sh"
    script.write_text(script.read_text() + f'echo sneaky > "{purelib}/other.py"\n')
    root = box["root"]
    with pytest.raises(BuildError) as caught:
        inplace.apply(resolved(box, manifest="pip.yaml"), root=root, python=str(python), environ=box["environ"],
                      log=lambda _l: None, imports=False)
    assert caught.value.exit_code == 3
    assert any("other.py" in line for line in caught.value.log_tail)
    assert not (purelib / "other.py").exists()
    assert (purelib / "extra/__init__.py").read_text() == 'VERSION = "0.9"\n'  # the declared paths came back


def test_a_touches_entry_naming_no_install_path_is_refused(box: dict[str, Any]) -> None:
    python, _, _ = venv_box(box)
    manifest = box["repo"] / "pip.yaml"
    manifest.write_text(manifest.read_text().replace("{scripts}/extra*", "{bindir}/extra*"))
    with pytest.raises(ConfigError) as caught:
        inplace.apply(resolved(box, manifest="pip.yaml"), root=box["root"], python=str(python),
                      environ=box["environ"], log=lambda _l: None, imports=False)
    assert "{bindir}" in str(caught.value)


def _fake_path(tmp_path: Path) -> tuple[Path, Path]:
    """A venv-like bin directory whose python3 links to the system one's, and the target's bin directory."""
    venv_bin, target_bin = tmp_path / "venv" / "bin", tmp_path / "target" / "bin"
    venv_bin.mkdir(parents=True)
    target_bin.mkdir(parents=True)
    (target_bin / "python3").write_text("#!/bin/sh\nexec " + sys.executable + ' "$@"\n')
    (target_bin / "python3").chmod(0o755)
    (venv_bin / "python3").symlink_to(target_bin / "python3")  # as a venv's links to the system python3
    return venv_bin, target_bin


def test_discovery_skips_imageforges_own_venv_on_path(tmp_path: Path) -> None:
    from imageforge.inplace.package import find_python

    venv_bin, target_bin = _fake_path(tmp_path)
    environ = {"PATH": f"{venv_bin}:{target_bin}"}
    chosen = find_python("python3", environ, own_bin=str(venv_bin))
    assert chosen.path == str(target_bin / "python3"), "the directory is compared, not the resolved executable"
    assert chosen.why == f"the first python3 on PATH, imageforge's own venv ({venv_bin}) skipped"
    # the venv's bin named another way (a trailing slash, a link to it) is the same directory
    (tmp_path / "alias").symlink_to(venv_bin)
    assert find_python("python3", {"PATH": f"{tmp_path / 'alias'}:{target_bin}"},
                       own_bin=str(venv_bin) + "/").path == str(target_bin / "python3")
    # installed into the target's own interpreter (no venv): nothing skipped
    assert find_python("python3", environ, own_bin="").path == str(venv_bin / "python3")
    # --python with a path overrides, even the venv's own
    given = find_python(str(venv_bin / "python3"), environ, own_bin=str(venv_bin))
    assert given.path == str(venv_bin / "python3") and given.why == "given with --python"
    with pytest.raises(Exception, match="outside imageforge's own venv"):
        find_python("python3", {"PATH": str(venv_bin)}, own_bin=str(venv_bin))


def test_own_venv_is_read_from_the_prefixes() -> None:
    from imageforge.inplace.package import own_venv_bin

    assert own_venv_bin("/opt/if", "/usr") == "/opt/if/bin"
    assert own_venv_bin("/usr", "/usr") is None


def test_apply_reports_the_interpreter_and_why(box: dict[str, Any], tmp_path: Path) -> None:
    """An activated venv first on PATH (this test's own venv, when it runs in one) is not the target."""
    from imageforge.inplace.package import own_venv_bin

    venv_bin, target_bin = _fake_path(tmp_path)
    own = own_venv_bin()
    first = own or str(venv_bin)
    environ = {**box["environ"], "PATH": f"{first}:{target_bin}:{os.environ.get('PATH', '')}"}
    report = inplace.apply(resolved(box), root=box["root"], python="python3", environ=environ,
                           log=lambda _l: None, imports=False)
    data = report.to_json()
    if own:  # pytest from a venv: imageforge's own venv bin was skipped
        assert data["python"] == str(target_bin / "python3")
        assert data["python_why"] == f"the first python3 on PATH, imageforge's own venv ({own}) skipped"
    else:
        assert data["python"] == str(venv_bin / "python3") and data["python_why"] == "the first python3 on PATH"
    assert f"python {data['python']}: {data['python_why']}" in report.text()
    inplace.revert(box["root"])


def test_a_script_in_place_runs_without_imageforges_venv_on_its_path(box: dict[str, Any]) -> None:
    """With imageforge's venv activated, a script's `python3 -m pip install` must reach the target's interpreter:
    the scripts get the caller's environment less that venv (PATH entries, VIRTUAL_ENV)."""
    from imageforge.inplace.package import own_venv_bin

    own = own_venv_bin()
    if own is None:
        pytest.skip("imageforge does not run in a venv here")
    folder = box["repo"] / "baseline"
    folder.mkdir()
    (folder / "patch_ops.sh").write_text('command -v python3 > found.txt\necho "${VIRTUAL_ENV:-none}" >> found.txt\n')
    (box["repo"] / "dir.yaml").write_text(DIRECTORY_STEP)
    environ = {**box["environ"], "PATH": f"{own}:/usr/bin:/bin", "VIRTUAL_ENV": sys.prefix}
    inplace.apply(resolved(box, manifest="dir.yaml"), root=box["root"], python=sys.executable, environ=environ,
                  log=lambda _l: None, imports=False)
    python3, virtual_env = (box["root"] / "workspace/scripts/found.txt").read_text().split()
    assert python3 == "/usr/bin/python3" and virtual_env == "none"
    inplace.revert(box["root"])
