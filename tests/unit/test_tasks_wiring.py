"""The tasks that call the serving front door: their options reach `imageforge.app`, and Settings reach the stages.

No daemon: the app function (or the stage function below it) is replaced by a recorder that keeps its
arguments and stops the command there; the options are parsed by invoke itself, in this process.
`submission --check` runs for real on a tree written here (it needs no daemon).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from imageforge import app
from imageforge.bench import Workload
from imageforge.errors import ConfigError
from imageforge.manifest.load import load_manifest
from imageforge.manifest.resolve import resolve
from imageforge.serve.container import ContainerRuntime
from imageforge.settings import Settings
from imageforge.submission import BaseFacts, write_submission
from tests.cli import imageforge, without_imageforge_settings

REPO = Path(__file__).resolve().parents[2]
CPU_FACTS = BaseFacts("/opt/venv/lib/python3.11/site-packages", "/opt/venv/bin/python3")
CPU_REF = "imageforge/vllm-cpu-base:0123456789abcdef"


class Reached(Exception):
    """Raised by a recorder: the call got this far, nothing below it ran."""


Calls = list[tuple[tuple[Any, ...], dict[str, Any]]]


def recorder(calls: Calls) -> Callable[..., Any]:
    def record(*args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        raise Reached

    return record


@pytest.fixture
def tasks_ns() -> Iterator[Any]:
    sys.path.insert(0, str(REPO))
    try:
        import tasks
    finally:
        sys.path.remove(str(REPO))
    yield tasks.ns


def run_task(ns: Any, *argv: str) -> subprocess.CompletedProcess[str]:
    """The task through the repository's ``tasks.py`` collection (in this process: a recorder's exception escapes)."""
    return imageforge(*argv, namespace=ns)


@pytest.fixture
def no_host_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("IMAGEFORGE_HOST_ADDRESS", raising=False)


# --------------------------------------------------------------------------- options -> app function


def test_equiv_options_reach_app_equiv(tasks_ns: Any, monkeypatch: pytest.MonkeyPatch, no_host_env: None) -> None:
    calls: Calls = []
    monkeypatch.setattr(app, "equiv", recorder(calls))
    with pytest.raises(Reached):
        run_task(tasks_ns, "equiv", "--target", "cpu", "--profile", "conservative", "--against", "aggressive",
                 "--dtype", "bfloat16", "--top-k", "3", "--greedy-tokens", "7", "--prompts", "2",
                 "--set", "max-num-seqs=2", "--set", "enforce-eager=true", "--manifest", "other.yaml",
                 "--host-address", "10.0.0.9")
    [(args, kwargs)] = calls
    s, target, profile, sets = args
    assert (target, profile, sets) == ("cpu", "conservative", ["max-num-seqs=2", "enforce-eager=true"])
    assert callable(kwargs.pop("show"))  # the result (--json) is shown before the verdict
    assert kwargs == {"against": "aggressive", "dtype": "bfloat16", "top_k": 3, "greedy_tokens": 7, "prompts": 2,
                      "record": "", "url": "", "runtime": ContainerRuntime()}
    assert s.manifest == Path("other.yaml") and s.host_address == "10.0.0.9" and s.sources["host_address"] == "cli"
    assert "IMAGEFORGE_HOST_ADDRESS" not in os.environ  # the address travels in Settings only


def test_equiv_record_url_reaches_app_equiv_and_its_refusal_is_exit_2(
        tasks_ns: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: Calls = []
    real = app.equiv
    monkeypatch.setattr(app, "equiv", recorder(calls))
    with pytest.raises(Reached):
        run_task(tasks_ns, "equiv", "--target", "cpu", "--record", "ref.json", "--url", "http://127.0.0.1:8000",
                 "--dtype", "bfloat16")
    [(args, kwargs)] = calls
    assert args[1:] == ("cpu", None, []) and kwargs["runtime"] == ContainerRuntime()
    assert (kwargs["record"], kwargs["url"], kwargs["dtype"]) == ("ref.json", "http://127.0.0.1:8000", "bfloat16")
    monkeypatch.setattr(app, "equiv", real)  # the real refusal, through the one error root
    refused = run_task(tasks_ns, "equiv", "--target", "cpu", "--record", "ref.json", "--url", "http://127.0.0.1:8000",
                       "--in-place", "--manifest", str(REPO / "build.yaml"))
    assert refused.returncode == 2
    err = refused.stderr
    assert "--in-place would apply and start one" in err and "drop --in-place" in err


def test_in_place_options_reach_equiv_run_smoke_bench(tasks_ns: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from imageforge.serve.process import ProcessRuntime

    where = ProcessRuntime(Path("/box"), "/opt/venv/bin/python3")
    for name, argv in (("equiv", ["--record", "ref.json"]), ("run", []), ("smoke", []), ("bench", []),
                       ("ablate", ["--steps", "a,b"]), ("sweep", ["--param", "max-num-seqs=1,2"]),
                       ("bisect", ["--check", "equiv"])):
        calls: Calls = []
        monkeypatch.setattr(app, name, recorder(calls))
        with pytest.raises(Reached):
            run_task(tasks_ns, name, "--target", "cpu", *argv, "--in-place", "--root", "/box", "--python",
                     "/opt/venv/bin/python3")
        [(_args, kwargs)] = calls
        assert kwargs["runtime"] == where, name
        if name == "equiv":
            assert kwargs["record"] == "ref.json"
    calls = []
    monkeypatch.setattr(app, "stop", recorder(calls))
    with pytest.raises(Reached):
        run_task(tasks_ns, "stop", "--in-place")
    [(_args, kwargs)] = calls
    assert kwargs["runtime"] == ProcessRuntime()  # `stop --in-place`: the recorded processes, under the manifest


def test_base_with_in_place_is_refused_where_the_options_are_read(tasks_ns: Any) -> None:
    """`run`/`smoke --in-place --base`: the root is served as it is; --base (the base image) is refused, exit 2."""
    for name in ("run", "smoke"):
        refused = run_task(tasks_ns, name, "--target", "cpu", "--in-place", "--base",
                           "--manifest", str(REPO / "build.yaml"))
        assert refused.returncode == 2, (name, refused.stderr)
        assert "--in-place serves the files under --root: --base does not apply" in refused.stderr, name


def test_reuse_servers_reaches_every_command_that_starts_a_docker_server(
        tasks_ns: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--reuse-servers`` is a shared option of every command that starts a server; it travels in Settings and in
    the Settings' environment (what serve.container reads), and --in-place refuses it (exit 2)."""
    from imageforge.settings import ENV_REUSE_SERVERS

    monkeypatch.delenv(ENV_REUSE_SERVERS, raising=False)
    for name, argv in (("equiv", []), ("run", []), ("smoke", []), ("bench", []), ("ablate", ["--steps", "a,b"]),
                       ("sweep", ["--param", "max-num-seqs=1,2"]), ("bisect", [])):
        calls: Calls = []
        monkeypatch.setattr(app, name, recorder(calls))
        with pytest.raises(Reached):
            run_task(tasks_ns, name, "--target", "cpu", *argv, "--reuse-servers")
        [(args, _kwargs)] = calls
        s = args[0]
        assert s.reuse_servers and s.sources["reuse_servers"] == "cli" and s.environ[ENV_REUSE_SERVERS] == "1", name
    assert ENV_REUSE_SERVERS not in os.environ  # this process's own environment is left alone
    refused = run_task(tasks_ns, "smoke", "--target", "cpu", "--in-place", "--reuse-servers")
    assert refused.returncode == 2
    assert "--reuse-servers is for servers in Docker containers, not --in-place" in refused.stderr


def test_bisect_options_reach_app_bisect(tasks_ns: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: Calls = []
    monkeypatch.setattr(app, "bisect", recorder(calls))
    with pytest.raises(Reached):
        run_task(tasks_ns, "bisect", "--target", "cpu", "--check", "models-lists-served-name", "--check",
                 "chat-basic", "--suite", "smoke/evaluator.yaml", "--tags", "dummy-ok,info", "--repeat", "3",
                 "--flaky", "unknown")
    [(args, kwargs)] = calls
    assert args[1:] == ("cpu", None, [])
    assert callable(kwargs.pop("show"))
    assert kwargs == {"check": ["models-lists-served-name", "chat-basic"], "suite": "smoke/evaluator.yaml",
                      "tags": "dummy-ok,info", "repeat": 3, "flaky": "unknown", "runtime": ContainerRuntime()}


def test_ablate_options_reach_app_ablate(tasks_ns: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: Calls = []
    monkeypatch.setattr(app, "ablate", recorder(calls))
    with pytest.raises(Reached):
        run_task(tasks_ns, "ablate", "--target", "cpu", "--profile", "conservative", "--steps", "a,b", "--repeat",
                 "2", "--out", "/tmp/ablate-out", "--no-equiv", "--requests", "6", "--concurrency", "2",
                 "--prompt-tokens", "64", "--output-tokens", "8", "--seed", "5", "--warmup", "0")
    [(args, kwargs)] = calls
    assert args[1:] == ("cpu", "conservative", [])
    w = kwargs.pop("workload")
    assert kwargs == {"steps": "a,b", "repeat": 2, "out": "/tmp/ablate-out", "equiv": False,
                      "runtime": ContainerRuntime()}
    assert (w.requests, w.concurrency, w.prompt_tokens, w.output_tokens, w.seed, w.warmup, w.repeat) == \
        (6, 2, 64, 8, 5, 0, 1)
    assert (w.shared_prefix, w.duration, w.model) == (Workload().shared_prefix, Workload().duration, None)


def test_bench_answers_to_vllm_bench_serve_names(tasks_ns: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: Calls = []
    monkeypatch.setattr(app, "bench", recorder(calls))
    with pytest.raises(Reached):
        run_task(tasks_ns, "bench", "--url", "http://127.0.0.1:9", "--num-prompts", "5", "--max-concurrency", "3",
                 "--random-input-len", "40", "--random-output-len", "7", "--shared-prefix", "0.25", "-m", "x.yaml")
    [(args, kwargs)] = calls
    w = kwargs["workload"]
    assert (w.requests, w.concurrency, w.prompt_tokens, w.output_tokens, w.shared_prefix) == (5, 3, 40, 7, 0.25)
    assert kwargs["url"] == "http://127.0.0.1:9" and args[0].manifest == Path("x.yaml")


def test_sweep_zero_requests_means_from_the_swept_values(tasks_ns: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: Calls = []
    monkeypatch.setattr(app, "sweep", recorder(calls))
    with pytest.raises(Reached):
        run_task(tasks_ns, "sweep", "--param", "max-num-seqs=1,4", "--concurrency", "2")
    [(_args, kwargs)] = calls
    assert (kwargs["requests_given"], kwargs["concurrency_given"]) == (False, True)
    assert kwargs["workload"].concurrency == 2


def test_submission_options_reach_write_or_check(tasks_ns: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    written: Calls = []
    checked: Calls = []
    monkeypatch.setattr(app, "submission", recorder(written))
    monkeypatch.setattr(app, "check_submission", recorder(checked))
    with pytest.raises(Reached):
        run_task(tasks_ns, "submission", "--target", "bi100", "--profile", "replay", "--out", "sub/", "--git")
    with pytest.raises(Reached):
        run_task(tasks_ns, "submission", "--target", "bi100", "--out", "sub/", "--check", "--set", "max-num-seqs=2")
    assert [(a[1:], {k: v for k, v in kw.items() if k != "log"}) for a, kw in written] == \
        [(("bi100", "replay", []), {"out": "sub/", "git": True})]
    assert [(a[1:], k["out"]) for a, k in checked] == [(("bi100", None, ["max-num-seqs=2"]), "sub/")]


# --------------------------------------------------------------------------- Settings -> stage function


@pytest.fixture
def settings_10(write_manifest: Callable[..., Path]) -> Settings:
    """Settings whose host address comes from the command line, the process environment saying otherwise."""
    return Settings.from_cli(manifest=str(write_manifest()), host_address="10.1.2.3",
                             environ={"IMAGEFORGE_HOST_ADDRESS": "192.0.2.1", "IMAGEFORGE_SET": "max-num-seqs=7"})


def _reached(monkeypatch: pytest.MonkeyPatch, module: str, name: str) -> Calls:
    calls: Calls = []
    monkeypatch.setattr(f"{module}.{name}", recorder(calls))
    return calls


def _resolved_of(call: tuple[tuple[Any, ...], dict[str, Any]]) -> Any:
    return call[0][0]


def test_smoke_and_demo_pass_the_host_address_down(settings_10: Settings, monkeypatch: pytest.MonkeyPatch,
                                                    no_host_env: None) -> None:
    calls = _reached(monkeypatch, "imageforge.smoke", "smoke_target")
    monkeypatch.setattr("imageforge.docker_engine.ensure_daemon", lambda log=print, start=False: None)
    with pytest.raises(Reached):
        app.smoke(settings_10, None, "big", [], url=None, suite=None, tags="a,b", base=True, port=8123, wait=0)
    with pytest.raises(Reached):
        app.demo(settings_10, target="t", echo=lambda _l: None)
    (smoke_call, demo_call) = calls
    assert smoke_call[1]["host_address"] == "10.1.2.3" and demo_call[1]["host_address"] == "10.1.2.3"
    assert smoke_call[1]["environ"] is settings_10.environ
    assert (smoke_call[1]["tags"], smoke_call[1]["base"], smoke_call[1]["port"]) == (("a", "b"), True, 8123)
    resolved = _resolved_of(smoke_call)
    assert (resolved.target.name, resolved.profile_name) == ("t", "big")
    assert {v.key: v.value for v in resolved.serving}["max-num-seqs"] == 7  # IMAGEFORGE_SET of the Settings
    assert "IMAGEFORGE_HOST_ADDRESS" not in os.environ


def test_bench_sweep_equiv_bisect_ablate_pass_the_host_address_down(settings_10: Settings,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    stages = {"bench": _reached(monkeypatch, "imageforge.bench", "bench_target"),
              "sweep": _reached(monkeypatch, "imageforge.bench", "sweep"),
              "equiv": _reached(monkeypatch, "imageforge.equiv.runner", "equiv_target"),
              "bisect": _reached(monkeypatch, "imageforge.forensics.bisect_runner", "bisect_target"),
              "ablate": _reached(monkeypatch, "imageforge.forensics.ablate_runner", "ablate_target")}
    w = Workload(requests=4, concurrency=2)
    with pytest.raises(Reached):
        app.bench(settings_10, "t", None, [], url=None, port=None, workload=w)
    with pytest.raises(Reached):
        app.sweep(settings_10, "t", None, ["max-num-seqs=1,4"], [], workload=w, requests_given=False,
                  concurrency_given=False)
    with pytest.raises(Reached):
        app.equiv(settings_10, "t", None, [], against="small", top_k=2)
    with pytest.raises(Reached):
        app.bisect(settings_10, "t", None, [], check=["c1"], repeat=2)
    with pytest.raises(Reached):
        app.ablate(settings_10, "t", None, [], workload=w, steps=" over, fix ,", repeat=2)
    for name, calls in stages.items():
        [(_args, kwargs)] = calls
        assert kwargs["host_address"] == "10.1.2.3", name
        assert kwargs["environ"] is settings_10.environ, name
    sweep_args, _ = stages["sweep"][0]
    assert sweep_args[3] == [("max-num-seqs", [1, 4])]
    assert (sweep_args[4].concurrency, sweep_args[4].requests) == (4, 16)  # the sweep defaults: max seqs, 4 x that
    assert stages["equiv"][0][1]["settings"].top_k == 2 and stages["equiv"][0][1]["against"] == "small"
    assert stages["bisect"][0][1]["checks"] == ["c1"] and stages["bisect"][0][1]["repeat"] == 2
    assert stages["ablate"][0][1]["steps"] == ["over", "fix"] and stages["ablate"][0][1]["repeats"] == 2


def test_bisect_and_bench_refuse_before_loading_anything(tmp_path: Path) -> None:
    s = Settings.from_cli(manifest=str(tmp_path / "absent.yaml"), environ={})
    with pytest.raises(ConfigError, match="bisect needs --check NAME"):
        app.bisect(s, "t", None, [])
    with pytest.raises(ConfigError, match="--flaky must be 'fail' or 'unknown'"):
        app.bisect(s, "t", None, [], check=["c"], flaky="sometimes")
    with pytest.raises(ConfigError, match="--url benches a running server"):
        app.bench(s, "t", None, [], url="http://127.0.0.1:9", port=None, workload=Workload())


# --------------------------------------------------------------------------- submission --check, for real


def invoke(*args: str) -> subprocess.CompletedProcess[str]:
    """``imageforge ARGS`` with the tool's defaults (no ``IMAGEFORGE_*`` of this process)."""
    return imageforge(*args, env=without_imageforge_settings())


def test_submission_check_task_on_a_written_tree(tmp_path: Path) -> None:
    resolved = resolve(load_manifest(REPO / "build.yaml"), "cpu", "conservative", environ={})
    tree = tmp_path / "tree"
    write_submission(resolved, tree, environ={}, base_ref=CPU_REF, base=CPU_FACTS, log=lambda _l: None)
    files = sorted(p for p in tree.rglob("*") if p.is_file())
    ok = invoke("submission", "--target", "cpu", "--profile", "conservative", "--out", str(tree), "--check", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == {"out_dir": str(tree), "ok": True, "files_checked": len(files)}

    text = invoke("submission", "--target", "cpu", "--profile", "conservative", "--out", str(tree), "--check")
    assert text.returncode == 0 and f"submission tree {tree} matches the manifest ({len(files)} files)" in text.stdout

    other = invoke("submission", "--target", "cpu", "--profile", "aggressive", "--out", str(tree), "--check")
    assert other.returncode == 2 and "differs from the manifest" in other.stderr
    assert "computility-run.yaml" in other.stderr

    both = invoke("submission", "--target", "cpu", "--out", str(tree), "--check", "--git")
    assert both.returncode == 2 and "--check only reads the tree" in both.stderr


def test_smoke_json_and_junit_come_from_the_report_before_the_verdict(
        tasks_ns: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    junit = tmp_path / "run" / "smoke-junit.xml"
    junit.parent.mkdir()
    junit.write_text("<testsuites/>\n")

    class Report:
        junit_path = junit

        def summary_line(self) -> str:
            return "1 passed, 1 failed"

        def to_json(self) -> dict[str, Any]:
            return {"passed": 1, "failed": 1}

    def failing_smoke(*args: Any, show: Callable[[Any], None], **kwargs: Any) -> None:
        print("a progress line")  # a library log line: stderr
        show(Report())
        raise ConfigError("stands in for the verdict")

    monkeypatch.setattr(app, "smoke", failing_smoke)
    captured = run_task(tasks_ns, "smoke", "--url", "http://127.0.0.1:9", "--json", "--junit",
                        str(tmp_path / "out.xml"))
    assert json.loads(captured.stdout) == {"passed": 1, "failed": 1}  # stdout: the one JSON document only
    assert "a progress line" in captured.stderr and "stands in for the verdict" in captured.stderr
    assert (tmp_path / "out.xml").read_text() == "<testsuites/>\n"
    captured = run_task(tasks_ns, "smoke", "--url", "http://127.0.0.1:9", "-q")
    assert captured.stdout == "smoke: 1 passed, 1 failed\n"
    assert "a progress line" not in captured.stderr and "stands in for the verdict" in captured.stderr  # errors stay


def test_bench_replay_json_is_shown_before_the_verdict(tasks_ns: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    class Replayed:
        def lines(self) -> list[str]:
            return ["Output TPS p10 12.0  FAIL"]

        def to_json(self) -> dict[str, Any]:
            return {"report": {"targets": {"output_tps_p10": "FAIL"}}, "records": []}

    def failing_bench(*args: Any, replay: Any, show: Callable[[Any], None], **kwargs: Any) -> None:
        assert replay is not None and replay.requests == 5
        show(Replayed())
        raise ConfigError("stands in for the replay verdict")

    monkeypatch.setattr(app, "bench", failing_bench)
    captured = run_task(tasks_ns, "bench", "--url", "http://127.0.0.1:9", "--replay", "--requests", "5", "-j")
    assert json.loads(captured.stdout) == {"targets": {"output_tps_p10": "FAIL"}}
    assert "stands in for the replay verdict" in captured.stderr
    text = run_task(tasks_ns, "bench", "--url", "http://127.0.0.1:9", "--replay", "--requests", "5")
    assert text.stdout == "Output TPS p10 12.0  FAIL\n"  # stdout is no terminal here: the text result
