"""equiv one server at a time: the record file, --record / --against through a served process, the dtype rules."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from imageforge import app
from imageforge.equiv.compare import EquivError
from imageforge.equiv.record import FORMAT, Record, is_record_path, load_record, make_record, write_record
from imageforge.equiv.runner import check_fits, required_resolved
from imageforge.errors import ConfigError, SmokeError
from imageforge.manifest.load import load_manifest
from imageforge.manifest.resolve import resolve
from imageforge.manifest.tolerances import EquivSettings
from imageforge.serve.ports import free_port
from imageforge.serve.process import ProcessRuntime, running_records
from imageforge.serve.waits import wait_healthy

from .test_equiv import evidence, pos

REPO = Path(__file__).resolve().parents[2]


def test_record_round_trips_and_says_what_was_served(tmp_path: Path) -> None:
    ev = evidence("http://ref", [[pos(2, {2: 0.7, 3: 0.3}), pos(3, {3: 0.6, 1: 0.4})]], [(3,)])
    settings = EquivSettings(top_k=2, greedy_tokens=1, prompts=("a b",))
    rec = make_record(ev, settings, "float32", served="sha256:abc", label="base image", target="cpu",
                      profile="base", flags={"max-num-seqs": 8, "model": "/models/m"}, env={"X": "1"})
    path = write_record(rec, tmp_path / "sub" / "ref.json")
    data = json.loads(path.read_text())
    assert data["format"] == FORMAT and data["served"] == "sha256:abc" and data["dtype"] == "float32"
    assert data["flags"] == {"max-num-seqs": 8, "model": "/models/m"}
    assert data["settings"] == {"top_k": 2, "greedy_tokens": 1, "prompts": ["a b"]}
    prompt = data["evidence"]["prompts"][0]
    assert prompt["sequence"] == [1, 2, 3] and prompt["positions"][0]["entries"]["2"]["logprob"] < 0
    back = load_record(path)
    assert back == rec
    assert back.settings(EquivSettings()).prompts == ("a b",) and back.settings(EquivSettings()).top_k == 2
    assert "sha256:abc" in back.describe()


def test_bad_records_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such record"):
        load_record(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text('{"format": "other"}')
    with pytest.raises(ConfigError, match="is not an equiv record"):
        load_record(tmp_path / "x.json")
    (tmp_path / "y.json").write_text(json.dumps({"format": FORMAT, "dtype": "float32"}))
    with pytest.raises(ConfigError, match="incomplete"):
        load_record(tmp_path / "y.json")
    with pytest.raises(ConfigError, match="unknown dtype"):
        Record.from_json({"format": FORMAT, "dtype": "fp8"})
    assert is_record_path("ref.json") and is_record_path(str(tmp_path / "x.json"))
    assert not is_record_path("base") and not is_record_path("replay") and not is_record_path("imageforge/cpu:x")


def test_bi100_float32_is_refused_with_the_arithmetic_and_its_reference_is_the_baseline() -> None:
    bi100 = resolve(load_manifest(REPO / "build.yaml"), "bi100", None, environ={})
    assert bi100.target.equiv.dtype == "bfloat16"
    with pytest.raises(ConfigError, match="cannot be served in float32") as info:
        check_fits(bi100, bi100.target.equiv, "float32")
    assert info.value.found == "35B x 4 B = 140 GB of weights in float32 > 4 x 32 GB = 128 GB"
    assert "bfloat16" in (info.value.hint or "")
    check_fits(bi100, bi100.target.equiv, "bfloat16")  # 70 GB fits 128 GB
    assert [s.id for s in required_resolved(bi100).steps] == ["organisers-baseline"]
    cpu = resolve(load_manifest(REPO / "build.yaml"), "cpu", None, environ={})
    check_fits(cpu, cpu.target.equiv, "float32")  # no memory block: nothing refused
    assert required_resolved(cpu).steps == ()


#: A deterministic stand-in for vLLM's OpenAI server: /health, /v1/models, /tokenize (one token per character) and
#: /v1/completions with prompt_logprobs, or streamed (``stream``: one SSE chunk per token, then usage and [DONE]: the
#: bench's requests); --scale sharpens its softmax (a changed model), --max-model-len is what /v1/models reports
#: (default 64), --dtype and any other flag (e.g. --max-num-seqs) are accepted.
FAKE_VLLM = """\
import argparse, http.server, json, math
p = argparse.ArgumentParser()
for flag in ("--host", "--port", "--model", "--dtype", "--scale", "--max-model-len"):
    p.add_argument(flag)
a, _ = p.parse_known_args()
scale = float(a.scale or 1.0)
V = 12
def dist(prefix):
    raw = [scale * math.sin(1.0 + 0.7 * t + 0.31 * sum(prefix[-3:])) for t in range(V)]
    z = math.log(sum(math.exp(r) for r in raw))
    return [r - z for r in raw]
def top(lps, k):
    order = sorted(range(V), key=lambda t: (-lps[t], t))
    return {t: order.index(t) + 1 for t in order[:k]}, order
class H(http.server.BaseHTTPRequestHandler):
    def reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code); self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data))); self.end_headers(); self.wfile.write(data)
    def do_GET(self):
        if self.path == "/health": return self.reply(200, {})
        if self.path == "/v1/models":
            return self.reply(200, {"data": [{"id": "fake", "root": a.model,
                                              "max_model_len": int(a.max_model_len or 64)}]})
        self.reply(404, {})
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if self.path == "/tokenize":
            return self.reply(200, {"tokens": [1 + (ord(c) % (V - 1)) for c in body["prompt"]]})
        ids = list(body["prompt"])
        if body.get("prompt_logprobs"):
            k = int(body["prompt_logprobs"]); out = [None]
            for i in range(1, len(ids)):
                lps = dist(ids[:i]); ranks, order = top(lps, k)
                entry = {str(t): {"logprob": lps[t], "rank": r} for t, r in ranks.items()}
                entry[str(ids[i])] = {"logprob": lps[ids[i]], "rank": order.index(ids[i]) + 1}
                out.append(entry)
            return self.reply(200, {"choices": [{"text": "", "prompt_logprobs": out}]})
        gen = []
        for _ in range(int(body["max_tokens"])):
            lps = dist(ids + gen); gen.append(max(range(V), key=lambda t: (lps[t], -t)))
        if not body.get("stream"):
            return self.reply(200, {"choices": [{"text": "", "token_ids": gen}]})
        self.send_response(200); self.send_header("content-type", "text/event-stream"); self.end_headers()
        usage = {"prompt_tokens": len(ids), "completion_tokens": len(gen)}
        for chunk in [{"choices": [{"index": 0, "text": chr(96 + t), "token_ids": [t]}]} for t in gen] + [
                {"choices": [], "usage": usage}]:
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\\n\\n")
        self.wfile.write(b"data: [DONE]\\n\\n")
    def log_message(self, *args): pass
http.server.HTTPServer((a.host, int(a.port)), H).serve_forever()
"""


@pytest.fixture
def fake_manifest(tmp_path: Path, write_manifest: Callable[[str], Path]) -> Path:
    return fake_vllm_manifest(tmp_path, write_manifest)


def fake_vllm_manifest(tmp_path: Path, write_manifest: Callable[[str], Path]) -> Path:
    """Target ``p`` served in place by :data:`FAKE_VLLM` (profiles same, retuned, changed), two equiv prompts."""
    (tmp_path / "fake_vllm.py").write_text(FAKE_VLLM)
    (tmp_path / "weights").mkdir()
    return write_manifest(textwrap.dedent(f"""\
        version: 1
        default_target: p
        targets:
          p:
            base: {{image: "debian:bookworm"}}
            package: {{import: vllm, distribution: vllm, version: "1.0"}}
            run: {{port: 18991, volumes: [{{source: weights, target: /model, read_only: true}}]}}
            steps: []
            serving:
              config_path: /x.yaml
              style: argv
              command: [python3, {tmp_path / "fake_vllm.py"}]
              args: {{model: /model}}
            default_profile: same
            profiles:
              same: {{}}
              retuned: {{args: {{scale: 1.0000001}}}}
              changed: {{args: {{scale: 1.5}}}}
            smoke: {{startup_timeout: 20}}
            equiv: {{top_k: 3, greedy_tokens: 4, prompts: ["hello", "abc def"]}}
        """))


def test_record_then_against_one_server_at_a_time(fake_manifest: Path, tmp_path: Path) -> None:
    s = app.settings(manifest=str(fake_manifest))
    (tmp_path / "root").mkdir()
    where = ProcessRuntime(root=tmp_path / "root", python=sys.executable)
    lines: list[str] = []
    ref = tmp_path / "ref.json"
    assert app.equiv(s, "p", "same", [], record=str(ref), runtime=where, echo=lines.append) is None
    rec = load_record(ref)
    assert rec.dtype == "float32" and rec.top_k == 3 and rec.profile == "same"
    assert rec.served.startswith(f"in place: {tmp_path / 'root'}") and rec.flags["dtype"] == "float32"
    assert len(rec.evidence.prompts) == 2 and len(rec.evidence.prompts[0].greedy) == 4
    assert running_records(fake_manifest.parent) == []  # its server was stopped
    result = app.equiv(s, "p", "retuned", [], against=str(ref), runtime=where, echo=lines.append)
    assert result is not None and result.verdict.passed
    assert (result.run_dir / "equiv.json").exists()  # type: ignore[operator]
    with pytest.raises(EquivError) as failed:
        app.equiv(s, "p", "changed", [], against=str(ref), runtime=where, echo=lines.append)
    assert failed.value.exit_code == 4
    assert running_records(fake_manifest.parent) == []
    with pytest.raises(ConfigError, match="served in float32, --dtype says bfloat16"):
        app.equiv(s, "p", "same", [], against=str(ref), dtype="bfloat16", runtime=where)
    with pytest.raises(ConfigError, match="recorded prompts"):
        app.equiv(s, "p", "same", [], against=str(ref), top_k=2, runtime=where)
    both = app.equiv(s, "p", "retuned", [], runtime=where, echo=lines.append)  # record, then compare
    assert both is not None and both.verdict.passed
    assert "equiv in place on " in "\n".join(lines) and "2 server start(s)" in "\n".join(lines)
    with pytest.raises(ConfigError, match="the reference is the required steps applied"):
        app.equiv(s, "p", "same", [], against="changed", runtime=where)
    assert running_records(fake_manifest.parent) == []


# --------------------------------------------------------------------------- equiv --record --url: a running server


@pytest.fixture
def running_fake(tmp_path: Path, fake_manifest: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The fake server already running (as `run` leaves one): its URL and process; ended by the test only."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(tmp_path / "fake_vllm.py"), "--host", "127.0.0.1", "--port",
                             str(port), "--model", "/model"])
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, timeout=20)
        yield url, proc
    finally:
        proc.kill()
        proc.wait()


def test_record_from_a_running_server_starts_nothing_and_says_what_it_read(
        fake_manifest: Path, tmp_path: Path, running_fake: tuple[str, subprocess.Popen[bytes]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from imageforge.equiv.client import EquivClient

    url, proc = running_fake
    s = app.settings(manifest=str(fake_manifest))
    ref = tmp_path / "ref.json"
    lines: list[str] = []
    asked: list[str] = []
    real_entry = EquivClient.model_entry

    def model_entry(self: EquivClient) -> dict[str, Any]:
        asked.append(self.url)
        return real_entry(self)

    monkeypatch.setattr(EquivClient, "model_entry", model_entry)
    assert app.equiv(s, "p", None, [], record=str(ref), url=url, echo=lines.append) is None
    assert asked == [url]  # /v1/models read once: the flags it reports and the model the prompts go to
    rec = load_record(ref)
    # provenance: the URL and the model the server names at /v1/models, what it reports there, nothing claimed
    assert rec.served == f"{url} serving fake (/v1/models)"
    assert rec.flags == {"served-model-name": "fake", "model": "/model", "max-model-len": 64}
    assert rec.profile == "" and rec.env == {} and rec.target == "p"
    assert rec.label.startswith("running server (--url; not started by imageforge")
    assert rec.dtype == "float32" and rec.top_k == 3 and len(rec.evidence.prompts) == 2
    assert rec.evidence.url == url and len(rec.evidence.prompts[0].greedy) == 4
    assert f"recorded 2 prompts of {url} serving fake (/v1/models) to {ref}" in lines
    assert "its dtype is not visible over HTTP, it must compute in float32" in lines[0]
    # nothing started, stopped or applied: the server still runs, no run directory, no journal under the root
    assert proc.poll() is None and running_records(fake_manifest.parent) == []
    assert not (fake_manifest.parent / ".imageforge").exists()
    # the record compares like any other: the same model passes, a changed one is exit 4
    (tmp_path / "root").mkdir()
    where = ProcessRuntime(root=tmp_path / "root", python=sys.executable)
    result = app.equiv(s, "p", "same", [], against=str(ref), runtime=where, echo=lines.append)
    assert result is not None and result.verdict.passed and result.verdict.dtype == "float32"
    assert result.labels[1].startswith(f"{ref}: record of running server (--url")
    with pytest.raises(EquivError):
        app.equiv(s, "p", "changed", [], against=str(ref), runtime=where, echo=lines.append)
    # --dtype: the record is in the dtype stated, --prompts/--top-k choose what is recorded
    assert app.equiv(s, "p", None, [], record=str(ref), url=url, dtype="bfloat16", prompts=1, top_k=2,
                     echo=lines.append) is None
    rec = load_record(ref)
    assert rec.dtype == "bfloat16" and rec.top_k == 2 and rec.prompts == ("hello",)
    assert proc.poll() is None


@pytest.mark.parametrize(("options", "message", "hint"), [
    ({}, "only --record FILE takes it", "equiv --record FILE --url URL"),
    ({"record": "r.json", "in_place": True}, "--in-place would apply and start one", "drop --in-place"),
    ({"record": "r.json", "against": "changed"}, "not --against 'changed'", "drop --against"),
    ({"record": "r.json", "against": "ref.json"}, "not --against 'ref.json'", "drop --against"),
    ({"record": "r.json", "profile": "same"}, "--profile and --set pick what is served", "--target names"),
    ({"record": "r.json", "sets": ["dtype=float32"]}, "--profile and --set pick what is served", "drop them"),
])
def test_equiv_url_refuses_what_makes_no_sense_with_a_running_server(
        fake_manifest: Path, tmp_path: Path, options: dict[str, Any], message: str, hint: str) -> None:
    s = app.settings(manifest=str(fake_manifest))
    options = dict(options)
    where = ProcessRuntime(root=tmp_path, python=sys.executable) if options.pop("in_place", False) else None
    profile, sets = options.pop("profile", None), options.pop("sets", [])
    with pytest.raises(ConfigError, match=message) as info:
        app.equiv(s, "p", profile, sets, url="http://127.0.0.1:9", runtime=where, **options)
    assert info.value.exit_code == 2 and hint in (info.value.hint or "")
    assert not (tmp_path / "r.json").exists()


def test_equiv_url_must_be_an_http_url(fake_manifest: Path, tmp_path: Path) -> None:
    s = app.settings(manifest=str(fake_manifest))
    with pytest.raises(ConfigError, match="not an http URL"):
        app.equiv(s, "p", None, [], record=str(tmp_path / "r.json"), url="ftp://127.0.0.1:9")
    with pytest.raises(SmokeError, match="gave no model"):  # nothing listens there: exit 4, no file
        app.equiv(s, "p", None, [], record=str(tmp_path / "r.json"), url="http://127.0.0.1:9", echo=lambda _: None)
    assert not (tmp_path / "r.json").exists()
