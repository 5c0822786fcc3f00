"""The server as a process (in-place mode): command rendering, rewrites (serve/process_spec.py), /proc checks
(serve/procfs.py), start/wait/stop (serve/process.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from imageforge.errors import ConfigError, InfraError, SmokeError
from imageforge.manifest.load import load_manifest
from imageforge.manifest.resolve import Resolved, resolve
from imageforge.serve import process as sp
from imageforge.serve import process_spec as ps
from imageforge.serve import procfs
from imageforge.serve.ports import free_port
from imageforge.serve.runtime import Prepared

REPO = Path(__file__).resolve().parents[2]


def rooted(resolved: Resolved, root: Path) -> Resolved:
    return replace(resolved, manifest=replace(resolved.manifest, root=root))


@pytest.fixture
def cpu(tmp_path: Path) -> Resolved:
    (tmp_path / ".imageforge" / "models" / "tiny-qwen3-moe").mkdir(parents=True)
    return rooted(resolve(load_manifest(REPO / "build.yaml"), "cpu", None, environ={}), tmp_path)


def fake_venv(tmp_path: Path) -> Path:
    """A venv-like bin/ with python3 (a link to this interpreter) and an executable vllm."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python3").symlink_to(sys.executable)
    (bin_dir / "vllm").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "vllm").chmod(0o755)
    return bin_dir / "python3"


def test_cpu_config_style_renders_into_the_run_directory(cpu: Resolved, tmp_path: Path) -> None:
    python = fake_venv(tmp_path)
    run = tmp_path / "run"
    spec = ps.process_spec(cpu, host="127.0.0.1", port=18555, run_directory=run, python=str(python), environ={},
                           prefixes=[])
    # the built image's CMD is `vllm serve --config /etc/imageforge/serving.yaml`: here the file is the run's
    assert spec.argv == (str(python.parent / "vllm"), "serve", "--config", str(run / "serving.yaml"))
    assert spec.config is not None and spec.config_path == run / "serving.yaml"
    config = yaml.safe_load(spec.config)
    model = str((tmp_path / ".imageforge" / "models" / "tiny-qwen3-moe").resolve())
    assert config["model"] == model  # /models/tiny-qwen3-moe (the volume target) -> its source
    assert (config["host"], config["port"]) == ("127.0.0.1", 18555)  # 0.0.0.0:8000 in the manifest
    assert config["max-num-seqs"] == 8 and config["enforce-eager"] is True
    assert spec.env["VLLM_CPU_KVCACHE_SPACE"] == "1"  # the serving env (a built image has it in its config)
    assert spec.rewritten == {"/models/tiny-qwen3-moe": model}
    # vLLM's cache is a named volume in Docker mode: in place there is no Docker, nothing is mounted or rewritten
    assert ps.mounts(cpu, {}) == {"/models/tiny-qwen3-moe": model}
    assert [v.target for v in cpu.run.volumes if v.named] == ["/root/.cache/vllm"]
    assert not (run / "serving.yaml").exists()  # process_spec writes nothing
    assert spec.url == "http://127.0.0.1:18555"


def test_bi100_argv_style_flags_by_name_model_from_its_variable(tmp_path: Path) -> None:
    model = tmp_path / "Qwen3.6"
    model.mkdir()
    box_pythonpath = "/usr/local/corex/lib64/python3/dist-packages"
    own = tmp_path / "imageforge-venv"
    environ = {"IMAGEFORGE_MODEL_DIR": str(model), "CUDA_VISIBLE_DEVICES": "0,1,2,3",
               "PYTHONPATH": f"{own}/lib/python3.10/site-packages:{box_pythonpath}",
               "PATH": f"{own}/bin:/usr/local/bin:/usr/bin", "VIRTUAL_ENV": str(own)}
    resolved = resolve(load_manifest(REPO / "build.yaml"), "bi100", "replay", environ=environ)
    spec = ps.process_spec(resolved, host="127.0.0.1", port=8000, run_directory=tmp_path / "run",
                           python="/usr/bin/python3", environ=environ, prefixes=[str(own)])
    argv = list(spec.argv)
    assert argv[:3] == ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--model") + 1] == str(model.resolve())
    assert argv[argv.index("-tp") + 1] == "4" and "--tensor-parallel-size" not in argv
    assert argv[argv.index("--max-model-len") + 1] == "131072"  # the evaluator's max_context_tokens
    assert argv[-4:] == ["--host", "127.0.0.1", "--port", "8000"]  # not in the manifest's args: appended
    assert spec.config is None
    assert spec.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert spec.env["PYTHONPATH"] == box_pythonpath  # imageforge's own venv left out, the box's kept
    assert spec.env["PATH"] == "/usr/local/bin:/usr/bin" and "VIRTUAL_ENV" not in spec.env
    assert spec.env["VLLM_ENGINE_ITERATION_TIMEOUT_S"] == "3600"
    assert spec.changed_env(environ)["PYTHONPATH"] == box_pythonpath


def test_host_address_and_a_missing_volume_source(cpu: Resolved, tmp_path: Path) -> None:
    spec = ps.process_spec(cpu, host="10.0.0.7", port=9000, run_directory=tmp_path, python=str(fake_venv(tmp_path)),
                           environ={}, prefixes=[])
    assert yaml.safe_load(spec.config or b"")["host"] == "10.0.0.7"
    with pytest.raises(InfraError, match="does not exist"):
        ps.process_spec(rooted(cpu, tmp_path / "elsewhere"), host="127.0.0.1", port=1, run_directory=tmp_path,
                        environ={})


def test_own_prefixes_hold_the_folder_imageforge_is_imported_from() -> None:
    import imageforge
    from imageforge.inplace.package import own_prefixes

    root = os.path.realpath(str(Path(imageforge.__file__).resolve().parent.parent))  # src/ in a checkout
    assert root in own_prefixes()
    # a PYTHONPATH entry naming that folder is imageforge's own: the server's environment leaves it out
    env = ps.child_environ({"PYTHONPATH": f"{root}:/opt/box"}, {}, own_prefixes())
    assert env["PYTHONPATH"] == "/opt/box"


def test_rewrite_value_equal_or_under_only() -> None:
    where = {"/model": "/data/q", "/models/tiny": "/srv/t/"}
    assert ps.rewrite_value("/model", where) == "/data/q"
    assert ps.rewrite_value("/model/", where) == "/data/q"
    assert ps.rewrite_value("/model/tokenizer.json", where) == "/data/q/tokenizer.json"
    assert ps.rewrite_value("/models/tiny/x", where) == "/srv/t/x"
    assert ps.rewrite_value("/modelx", where) == "/modelx"  # not under /model
    assert ps.rewrite_value("llm", where) == "llm"
    assert ps.rewrite_value(["/model", 3, "a"], where) == ["/data/q", 3, "a"]
    assert ps.rewrite_value(8000, where) == 8000


def test_program_needs_a_known_interpreter_or_path(tmp_path: Path) -> None:
    with pytest.raises(InfraError, match="not on this machine"):
        ps.program(["no-such-server-xyz"], "/usr/bin/python3", {"PATH": str(tmp_path)})
    assert ps.program(["sh", "-c", "x"], "/nowhere/python3", {"PATH": "/usr/bin:/bin"})[0].endswith("/sh")


def test_parse_size_and_the_shm_check(cpu: Resolved, tmp_path: Path) -> None:
    assert ps.parse_size("1g") == 1024**3
    assert ps.parse_size("512m") == 512 * 1024**2
    assert ps.parse_size("16G") == 16 * 1024**3
    assert ps.parse_size("65536") == 65536
    with pytest.raises(Exception, match="not a size"):
        ps.parse_size("lots")
    sp.check_shm(replace(cpu, run=replace(cpu.run, shm_size="1k")), tmp_path)
    with pytest.raises(InfraError, match=r"less than run\.shm_size 900t") as info:
        sp.check_shm(replace(cpu, run=replace(cpu.run, shm_size="900t")), tmp_path)
    assert "remount" in (info.value.hint or "")
    assert info.value.exit_code == 5


def test_parse_stat_survives_odd_command_names() -> None:
    fields = " ".join(["S", "1", "4242", "4242"] + ["0"] * 15 + ["987654", "0"])
    stat = procfs.parse_stat(f"4243 (a) (b c) {fields}")
    assert (stat.pid, stat.state, stat.pgrp, stat.starttime) == (4243, "S", 4242, 987654)
    own = procfs.proc_stat(os.getpid())
    assert own is not None and own.pid == os.getpid()
    assert procfs.alive(os.getpid(), own.starttime)
    assert not procfs.alive(os.getpid(), own.starttime + 1)  # a recycled pid: another start time


def test_end_group_checks_the_start_time_then_terms_the_whole_group() -> None:
    group = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & wait"], start_new_session=True)
    try:
        time.sleep(0.3)
        stat = procfs.proc_stat(group.pid)
        assert stat is not None and len(procfs.group_members(group.pid)) == 3
        assert sp.end_group(group.pid, stat.starttime + 5, popen=group) == "gone"  # another process: untouched
        assert group.poll() is None and len(procfs.group_members(group.pid)) == 3
        assert sp.end_group(group.pid, stat.starttime, grace=5, popen=group) == "terminated"
        assert group.poll() is not None and procfs.group_members(group.pid) == []
    finally:
        if group.poll() is None:
            os.killpg(group.pid, 9)


def test_end_group_kills_after_the_grace() -> None:
    group = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 60"], start_new_session=True)
    time.sleep(0.3)
    stat = procfs.proc_stat(group.pid)
    assert stat is not None
    assert sp.end_group(group.pid, stat.starttime, grace=0.5, popen=group) == "killed"
    assert group.wait(timeout=5) == -9


FAKE_SERVER = """\
import argparse, http.server, os, sys
p = argparse.ArgumentParser()
p.add_argument("--host"); p.add_argument("--port", type=int); p.add_argument("--model"); p.add_argument("--fail")
a, _ = p.parse_known_args()
if a.fail:
    print("ModuleNotFoundError: No module named 'broken'", flush=True)
    sys.exit(3)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *args): pass
print("model", a.model, "PYTHONPATH", os.environ.get("PYTHONPATH"), flush=True)
http.server.HTTPServer((a.host, a.port), H).serve_forever()
"""


@pytest.fixture
def fake(tmp_path: Path, write_manifest: Callable[[str], Path]) -> Resolved:
    (tmp_path / "fake_server.py").write_text(FAKE_SERVER)
    (tmp_path / "weights").mkdir()
    text = textwrap.dedent(f"""\
        version: 1
        default_target: p
        targets:
          p:
            base: {{image: "debian:bookworm"}}
            package: {{import: vllm, distribution: vllm, version: "1.0"}}
            run:
              shm_size: 1k
              volumes: [{{source: weights, target: /model, read_only: true}}]
            steps: []
            serving:
              config_path: /x.yaml
              style: argv
              command: [python3, {tmp_path / "fake_server.py"}]
              args: {{model: /model}}
            default_profile: one
            profiles:
              one: {{}}
              broken: {{args: {{fail: "yes"}}}}
            smoke: {{startup_timeout: 20}}
        """)
    return resolve(load_manifest(write_manifest(text)), "p", None, environ={})


def test_serving_starts_records_waits_and_stops_the_process(fake: Resolved, tmp_path: Path) -> None:
    runtime = sp.ProcessRuntime(root=tmp_path / "root", python=sys.executable)
    port = free_port()
    environ = {**os.environ, "PYTHONPATH": "/box/own/path"}
    prepared = Prepared(served="in place", note="", line="")
    with runtime.serving(fake, prepared, port=port, environ=environ, log=lambda _line: None) as server:
        assert server.running() and server.startup_seconds is not None
        record = json.loads((server.run_dir / "server.json").read_text())
        assert record["pid"] == server.pid and record["starttime"] == procfs.proc_stat(server.pid).starttime  # type: ignore[union-attr]
        assert record["url"] == f"http://127.0.0.1:{port}" and record["served"].startswith("in place:")
        assert [r["pid"] for r in sp.running_records(fake.manifest.root)] == [server.pid]
        with pytest.raises(InfraError, match=f"still up: pid {server.pid}") as busy:
            sp.start_process(fake, runtime, port=free_port(), environ=environ, log=lambda _line: None)
        assert busy.value.exit_code == 5
        pid = server.pid
    assert not procfs.alive(pid, record["starttime"])
    assert json.loads((server.run_dir / "server.json").read_text())["stopped"] == "terminated"
    assert sp.running_records(fake.manifest.root) == []
    log = (server.run_dir / "server.log").read_text()
    assert f"model {(tmp_path / 'weights').resolve()} PYTHONPATH /box/own/path" in log


def test_a_server_that_exits_fails_with_its_log(fake: Resolved, tmp_path: Path) -> None:
    broken = resolve(fake.manifest, "p", "broken", environ={})
    with pytest.raises(SmokeError, match="stopped before it was ready") as info, sp.serving(
            broken, sp.ProcessRuntime(python=sys.executable), port=free_port(), log=lambda _line: None):
        pass
    assert "import failed" in (info.value.hint or "")
    assert any("No module named" in line for line in info.value.log_tail)


def test_a_busy_port_names_its_pid(fake: Resolved) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        assert procfs.port_holder(port) == os.getpid()
        with pytest.raises(InfraError, match=f"port {port} on 127.0.0.1 is already in use by pid {os.getpid()}"):
            sp.start_process(fake, sp.ProcessRuntime(python=sys.executable), port=port, log=lambda _line: None)


def test_run_detached_then_stop_in_place(fake: Resolved) -> None:
    server = sp.start_detached(fake, sp.ProcessRuntime(python=sys.executable), port=free_port(), timeout=20,
                               host_address="127.0.0.1", log=lambda _line: None)
    assert server.running()
    server.popen = None  # as `invoke stop --in-place` sees it: another process, only the record
    lines: list[str] = []
    assert sp.stop_processes(fake.manifest.root, log=lines.append) == [server.pid]
    assert "terminated" in lines[0]
    assert sp.stop_processes(fake.manifest.root, log=lines.append) == []
    assert lines[-1] == "no in-place server is running"


def test_a_stale_record_is_never_signalled(fake: Resolved, tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        stat = procfs.proc_stat(sleeper.pid)
        assert stat is not None
        run = tmp_path / ".imageforge" / "runs" / "r-stale"
        run.mkdir(parents=True)
        (run / "server.json").write_text(json.dumps({"pid": sleeper.pid, "starttime": stat.starttime - 1,
                                                     "target": "p", "profile": "one", "run_id": "r-stale"}))
        assert sp.stop_processes(tmp_path, log=lambda _line: None) == []
        assert sleeper.poll() is None  # a recycled pid is left alone
        assert json.loads((run / "server.json").read_text())["stopped"].startswith("stale")
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_process_path_never_imports_docker(tmp_path: Path) -> None:
    (tmp_path / ".imageforge" / "models" / "tiny-qwen3-moe").mkdir(parents=True)
    python = fake_venv(tmp_path)
    code = textwrap.dedent(f"""\
        import sys
        from dataclasses import replace
        from pathlib import Path
        from imageforge import app
        from imageforge.manifest.load import load_manifest
        from imageforge.manifest.resolve import resolve
        from imageforge.serve.process import ProcessRuntime
        from imageforge.serve.process_spec import process_spec
        r = resolve(load_manifest(Path({str(REPO / "build.yaml")!r})), "cpu", None, environ={{}})
        r = replace(r, manifest=replace(r.manifest, root=Path({str(tmp_path)!r})))
        process_spec(r, host="127.0.0.1", port=1, run_directory=Path({str(tmp_path)!r}), python={str(python)!r},
                     environ={{"PATH": "/usr/bin:/bin"}})
        print("docker" in sys.modules)
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert out.stdout.strip() == "False"


def test_the_front_door_runs_and_stops_in_place(fake: Resolved) -> None:
    from imageforge import app

    s = app.settings(manifest=str(fake.manifest.root / "build.yaml"))
    where = app.runtime(s, process=True, python=sys.executable)
    assert where == sp.ProcessRuntime(Path("/"), sys.executable)
    assert app.runtime(s).where == "in Docker containers" and not app.runtime(s).one_at_a_time
    with pytest.raises(Exception, match="go with --in-place"):
        app.runtime(s, root="/x")
    reusing = app.settings(manifest=str(fake.manifest.root / "build.yaml"), reuse_servers=True)
    with pytest.raises(ConfigError, match="--reuse-servers is for servers in Docker containers") as info:
        app.runtime(reusing, process=True)
    assert info.value.found == "reuse_servers from cli" and "--url" in (info.value.hint or "")
    assert app.runtime(reusing, process=True, serves=False).one_at_a_time  # `stop --in-place` starts nothing
    with pytest.raises(Exception, match="--base does not apply"):
        app.run(s, "p", None, [], base=True, port=None, timeout=20, runtime=where)
    server = app.run(s, "p", None, [], base=False, port=free_port(), timeout=20, runtime=where)
    assert isinstance(server, sp.ProcessServer) and server.running()
    assert app.stop("p", every=False, s=s, runtime=app.runtime(s, process=True, serves=False)) == [str(server.pid)]
    assert not server.running()


def test_run_and_stop_in_place_never_import_docker(fake: Resolved) -> None:
    code = textwrap.dedent(f"""\
        import sys
        from imageforge import app
        from imageforge.serve.ports import free_port
        s = app.settings(manifest={str(fake.manifest.root / "build.yaml")!r})
        where = app.runtime(s, process=True, python=sys.executable)
        server = app.run(s, "p", None, [], base=False, port=free_port(), timeout=20, runtime=where)
        stopped = app.stop("p", every=False, s=s, runtime=app.runtime(s, process=True, serves=False))
        print(stopped == [str(server.pid)], "docker" in sys.modules)
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert out.stdout.strip().splitlines()[-1] == "True False", out.stdout + out.stderr
