"""equiv one server at a time: the record file, --record / --against through a served process, the dtype rules."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from imageforge import app
from imageforge.equiv.compare import EquivError
from imageforge.equiv.record import FORMAT, Record, is_record_path, load_record, make_record, write_record
from imageforge.equiv.runner import check_fits, required_resolved
from imageforge.errors import ConfigError
from imageforge.manifest_load import load_manifest
from imageforge.resolve import resolve
from imageforge.serve.process import InPlace, running_records
from imageforge.tolerances import EquivSettings

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


#: A deterministic stand-in for vLLM's OpenAI server: /health, /v1/models, /tokenize and /v1/completions with
#: prompt_logprobs; --scale sharpens its softmax (a changed model), --dtype is accepted.
FAKE_VLLM = """\
import argparse, http.server, json, math
p = argparse.ArgumentParser()
for flag in ("--host", "--port", "--model", "--dtype", "--scale"):
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
        if self.path == "/v1/models": return self.reply(200, {"data": [{"id": "fake"}]})
        self.reply(404, {})
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if self.path == "/tokenize":
            return self.reply(200, {"tokens": [1 + (ord(c) % (V - 1)) for c in body["prompt"]][:6]})
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
        self.reply(200, {"choices": [{"text": "", "token_ids": gen}]})
    def log_message(self, *args): pass
http.server.HTTPServer((a.host, int(a.port)), H).serve_forever()
"""


@pytest.fixture
def fake_manifest(tmp_path: Path, write_manifest: Callable[[str], Path]) -> Path:
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
    where = InPlace(root=tmp_path / "root", python=sys.executable)
    lines: list[str] = []
    ref = tmp_path / "ref.json"
    assert app.equiv(s, "p", "same", [], record=str(ref), in_place=where, echo=lines.append) is None
    rec = load_record(ref)
    assert rec.dtype == "float32" and rec.top_k == 3 and rec.profile == "same"
    assert rec.served.startswith(f"in place: {tmp_path / 'root'}") and rec.flags["dtype"] == "float32"
    assert len(rec.evidence.prompts) == 2 and len(rec.evidence.prompts[0].greedy) == 4
    assert running_records(fake_manifest.parent) == []  # its server was stopped
    result = app.equiv(s, "p", "retuned", [], against=str(ref), in_place=where, echo=lines.append)
    assert result is not None and result.verdict.passed
    assert (result.run_dir / "equiv.json").exists()  # type: ignore[operator]
    with pytest.raises(EquivError) as failed:
        app.equiv(s, "p", "changed", [], against=str(ref), in_place=where, echo=lines.append)
    assert failed.value.exit_code == 4
    assert running_records(fake_manifest.parent) == []
    with pytest.raises(ConfigError, match="served in float32, --dtype says bfloat16"):
        app.equiv(s, "p", "same", [], against=str(ref), dtype="bfloat16", in_place=where)
    with pytest.raises(ConfigError, match="recorded prompts"):
        app.equiv(s, "p", "same", [], against=str(ref), top_k=2, in_place=where)
    both = app.equiv(s, "p", "retuned", [], in_place=where, echo=lines.append)  # record, then compare
    assert both is not None and both.verdict.passed
    assert "equiv --in-place on " in "\n".join(lines) and "2 server start(s)" in "\n".join(lines)
    with pytest.raises(ConfigError, match="the reference is the required steps applied"):
        app.equiv(s, "p", "same", [], against="changed", in_place=where)
    assert running_records(fake_manifest.parent) == []
