"""equiv, bisect and ablate on real images and real vLLM servers of the cpu target. Each vLLM start costs 30-120 s
on this machine: keep them few. The module's two starts are its fixture ``planted`` (they were three, one
per test): the base image plus two planted steps, break-hermes (tool-call parsing: the dummy suite's tools-required
fails) and scaled-softmax (the math: equiv fails), in float32, and the base plus break-hermes alone. Every command here
runs with --reuse-servers and finds its servers among those and the session's (conftest ``cpu_base_run``: the base
image, float32; ``cpu_server``: the shipped image, float32):

* bisect over the two steps probes the base (``cpu_base_run``), both steps (``planted.full``) and break-hermes alone
  (``planted.hermes``): the failing probe is also test_smoke's former "a patch that breaks tool-call parsing";
* ablate drops scaled-softmax (full ``planted.full``, variant ``planted.hermes``) and skips break-hermes (required);
* the shipped image's equiv compares ``cpu_server`` with ``cpu_base_run``; the scaled softmax's, ``planted.full``
  with ``cpu_base_run`` (``compare_urls``), and then ``planted.full``, no longer needed, is the server test_smoke's
  claim "a server killed mid-suite" kills: that test is the module's last.

``equiv_target``'s own orchestration (build the candidate, serve both sides, compare, remove both) is
tests/unit/test_equiv.py's, with the servers faked at that boundary.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from imageforge.equiv.compare import EquivError
from imageforge.errors import EXIT_SMOKE
from imageforge.labels import L_RUN
from imageforge.manifest.load import load_manifest
from imageforge.manifest.resolve import resolve
from tests.integration.helpers import REPO, kill_mid_suite, labelled, remove_tags, write_cpu_variant

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LOGITS = "vllm/model_executor/layers/logits_processor.py"
# LogitsProcessor.forward of vllm 0.32 (the base image's file): the one place every logit passes.
SCALE_OLD = "            if self.scale != 1.0:\n                logits *= self.scale\n        return logits\n"
SCALED_SOFTMAX = {
    "id": "scaled-softmax", "kind": "patch", "file": LOGITS, "old": SCALE_OLD,
    # a math change: the softmax over the vocabulary sees logits x 1e4 (temperature 1e-4)
    "new": "            logits = logits * 1.0e4  # test: scaled softmax\n        return logits\n",
    "why": "test: changes the math",
}
HERMES = "vllm/tool_parsers/hermes_tool_parser.py"
BREAK_HERMES = {
    "id": "break-hermes", "kind": "patch", "file": HERMES,
    "why": "fault test: the hermes parser looks for a tag the model never writes",
    "old": 'tool_call_start_token: str = "<tool_call>"',
    "new": 'tool_call_start_token: str = "<tool_call_x>"',
}
SUMMARY = re.compile(r"^(\d+) passed, (\d+) failed(?:, (\d+) skipped)?$", re.M)


def _prompts(resolved: Any, n: int, greedy: int) -> Any:
    s = resolved.target.equiv
    return dataclasses.replace(s, prompts=s.prompts[:n], greedy_tokens=greedy)


PLANTED = "imageforge-test/planted"


@dataclasses.dataclass
class Planted:
    """The module's servers (see the module): ``full`` = base + break-hermes + scaled-softmax, ``hermes`` = base +
    break-hermes; both in float32, conservative, as bisect's and ablate's cuts of ``path`` serve them."""

    path: Path
    resolved: Any
    full: Any
    hermes: Any
    full_stack: contextlib.ExitStack

    def stop_full(self) -> None:
        """``full``'s ``serving()`` block ends: its server removed, its log kept."""
        self.full_stack.close()

    def up(self) -> None:
        """Both servers answer (``full`` is stopped by the scaled-softmax test, which must run after the others)."""
        assert self.full.running() and self.hermes.running(), (
            "the planted servers are down: test_equiv_catches_a_scaled_softmax_with_exit_4 stops `full`, so it "
            "runs after the module's other tests (file order)")


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory, docker_ready: None) -> Iterator[Planted]:
    from imageforge.build import build_target
    from imageforge.forensics.subsets import subset_resolved
    from imageforge.serve.container import serving, wait_ready

    path = write_cpu_variant(tmp_path_factory.mktemp("planted"), PLANTED,
                             steps=[{**BREAK_HERMES, "required": True}, SCALED_SOFTMAX])
    data = yaml.safe_load(path.read_text())
    target = data["targets"]["cpu"]
    target["steps"] = [s for s in target["steps"] if s["id"] in ("break-hermes", "scaled-softmax")]
    target["verify"]["imports"] = ["vllm.v1.attention.ops.prefix_prefill"]  # the cpu steps' modules are not there
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    resolved = resolve(load_manifest(path), "cpu", "conservative", environ=os.environ, sets=["dtype=float32"])
    subjects = (resolved, subset_resolved(resolved, ["break-hermes"], suffix="hermes"))
    full_stack, hermes_stack = contextlib.ExitStack(), contextlib.ExitStack()
    try:
        servers = []
        for subject, stack in zip(subjects, (full_stack, hermes_stack), strict=True):
            built = build_target(subject, environ=os.environ, echo=print)
            servers.append(stack.enter_context(serving(subject, environ=os.environ, image=built.image_id, log=print,
                                                       wait=False)))
        for subject, server in zip(subjects, servers, strict=True):  # both start at once
            wait_ready(server, timeout=resolved.target.smoke.startup_timeout, log=print, resolved=subject)
        yield Planted(path, resolved, servers[0], servers[1], full_stack)
    finally:
        hermes_stack.close()
        full_stack.close()
        remove_tags([PLANTED, *(f"{PLANTED}-{suffix}" for suffix in ("hermes", "bisect", "ablate"))])


def test_bisect_finds_a_planted_break_within_the_bound(planted: Planted, invoke_cli: Callable[..., Any],
                                                        cpu_base_run: Any) -> None:
    """`imageforge bisect` (in process) finds a patch that breaks tool-call parsing, and shows why its probe failed.

    Also the home of the former test_smoke::test_patch_that_breaks_tool_call_parsing (its own server start): its
    claims hold on bisect's failing probe, which ran the whole dummy suite on the broken image. The smoke command's
    own error path for failing checks ("smoke failure: N of M smoke checks failed: <ids>", exit 4) is
    test_smoke.py::test_server_answering_500s's (a local stub, no vLLM); the verdict naming the check,
    tests/unit/test_smoke.py::test_failures_show_request_response_and_exit_4's.
    """
    planted.up()
    path = planted.path
    ids = [s.id for s in planted.resolved.steps]
    assert ids == ["break-hermes", "scaled-softmax"]
    # two steps: the base passes, the final image fails, the midpoint (break-hermes alone) fails too: the culprit
    # is the first step; the bound is ceil(log2 2) + 2 = 3 points, in the midpoint order [0, 2, 1] (the search for
    # any n and any break is tests/unit/test_bisect.py's). Every check of the dummy suite on each probe. In float32
    # with --reuse-servers, no probe starts a server: k = 0 (the base image served as `run --base` serves it) is the
    # session's `run --base --set dtype=float32`; k = 2 and k = 1 are the module's planted servers.
    base_name = re.findall(r"started (imageforge-cpu-\S+) from", cpu_base_run.up().output)[-1]
    cli = invoke_cli("bisect", "--manifest", str(path), "--target", "cpu", "--profile", "conservative",
                     "--set", "dtype=float32", "--reuse-servers", "--suite", str(REPO / "smoke" / "dummy.yaml"),
                     timeout=900)
    assert cli.code == EXIT_SMOKE == 4, cli.output  # raise_for: a step broke the checks
    assert cpu_base_run.answers() and planted.full.running() and planted.hermes.running()  # reused: left running
    assert "smoke failure: bisect: the first failing step is break-hermes" in cli.output
    bisect_json = Path(re.findall(r"reports: \S+, (\S+/bisect\.json)", cli.output)[-1])
    saved = json.loads(bisect_json.read_text())
    for k, name, url in ((0, base_name, cpu_base_run.url), (2, planted.full.name, planted.full.url),
                         (1, planted.hermes.name, planted.hermes.url)):
        probe_log = (bisect_json.parent / f"cut-{k}.log").read_text()
        assert f"reusing {name} on {url}" in probe_log and f"left {name} running" in probe_log, (k, probe_log)
    assert saved["status"] == "found", cli.output
    assert saved["first_failing"] == 1 and saved["last_passing"] == 0
    assert saved["culprit"]["id"] == "break-hermes"
    assert [p["k"] for p in saved["points"]] == [0, 2, 1]  # base, final, the midpoint
    assert saved["bound"] == math.ceil(math.log2(2)) + 2 == 3 and saved["runs"] <= saved["bound"]
    assert f"first failing step: break-hermes (patch) at {path}:" in cli.output
    assert f"{HERMES} (patched x1)" in cli.output
    # why the probe failed, as `smoke` prints it: the FAIL lines, the closing line, the report and the log
    found = SUMMARY.findall(cli.output)
    assert found, "no closing line `N passed, N failed` in the output"
    passed, failed = int(found[-1][0]), int(found[-1][1])
    assert failed >= 1 and passed >= 25
    assert re.search(r"^  FAIL  tools-required\b", cli.output, re.M)
    assert "PASS" not in cli.output.split("probe k=1 (")[-1]  # short: the passing checks' lines are in the log
    log = Path(re.findall(r"  log: (\S+/cut-1\.log)$", cli.output, re.M)[-1])
    assert log == Path(saved["failing_probe"]["log"])
    assert re.search(r"^  PASS  health\b", log.read_text(), re.M)
    report_path = re.findall(r"^report: (\S+/smoke\.json)  log: ", cli.output, re.M)[-1]
    assert report_path == saved["failing_probe"]["report"] and saved["failing_probe"]["k"] == 1
    report = json.loads(Path(report_path).read_text())
    assert report["summary"] == found[-1][0] + " passed, " + found[-1][1] + " failed" + (
        f", {found[-1][2]} skipped" if found[-1][2] else "")
    tools = next(c for c in report["checks"] if c["id"] == "tools-required")
    assert tools["status"] == "failed"
    assert any("tool_calls" in f for f in tools["failures"])
    assert tools["exchanges"][0]["body"]["tool_choice"] == "required"
    assert "<tool_call>" in tools["exchanges"][0]["response"]  # the unparsed call is in the content
    # the error names the culprit and, first in what it found, every failing check of its probe
    assert re.search(r"found: +\d+ passed, \d+ failed \([^)]*\btools-required\b", cli.output.split("smoke failure:")[1])


def test_ablate_benches_abab_and_skips_required_steps(planted: Planted, tmp_path: Path) -> None:
    """ablate in float32 with ``IMAGEFORGE_REUSE_SERVERS=1`` over the planted manifest: the full image is
    ``planted.full``, the variant without scaled-softmax is ``planted.hermes`` (each found by its run spec, reused,
    left running: no start here); break-hermes, ``required: true``, is skipped. The variant's equiv against the full
    image fails: the step it drops changes the math."""
    from imageforge.bench import Workload
    from imageforge.forensics.ablate_runner import ablate_target
    from imageforge.serve.container import ContainerRuntime
    from imageforge.settings import ENV_REUSE_SERVERS

    planted.up()
    workload = Workload(requests=4, concurrency=2, prompt_tokens=64, output_tokens=8, duration=120)
    out = tmp_path / "ablate-out"
    lines: list[str] = []
    run = ablate_target(planted.resolved, workload, ContainerRuntime(), steps=["scaled-softmax", "break-hermes"],
                        repeats=2, out=out,
                        environ={**os.environ, ENV_REUSE_SERVERS: "1"}, echo=lines.append)
    print("\n".join(lines))
    assert [(v.step, v.dropped) for v in run.plan.variants] == [("scaled-softmax", ("scaled-softmax",))]
    assert [(s.step, s.reason) for s in run.table.skipped] == [("break-hermes", "required: true")]
    assert [(r.role, r.round) for r in run.plan.schedule] == [("full", 0), ("variant", 0), ("full", 1),
                                                               ("variant", 1)]
    row = run.table.rows[0]
    assert row.pairs == 2 and row.failed_runs == 0 and row.weighted_tps is not None and row.spread is not None
    assert row.equiv == "FAIL"  # without the scaled softmax the logits are the base's: far from the full image's
    assert any(line.startswith("    equiv vs full (float32): ") and line.endswith("-> FAIL") for line in lines)
    # both sides were the planted servers, reused; they are still up
    assert f"  full image serving at {planted.full.url} ({planted.full.name} reused)" in lines, lines
    servers_log = (out / "servers.log").read_text()
    assert f"reusing {planted.hermes.name} on {planted.hermes.url}" in servers_log, servers_log
    assert planted.full.running() and planted.hermes.running()
    saved = json.loads((out / "ablate.json").read_text())
    assert saved["variants"][0]["step"] == "scaled-softmax" and len(saved["load"]["before"]) == 3
    csv_lines = (out / "ablate.csv").read_text().splitlines()
    assert csv_lines[0].startswith("step,dropped,weighted_tps,delta_weighted_tps")
    assert csv_lines[2].startswith("scaled-softmax,scaled-softmax,")
    assert csv_lines[3].startswith("break-hermes,") and "skipped: required: true" in csv_lines[3]
    assert len(list((out / "runs").iterdir())) == 4  # one bench.json per scheduled run


# the prompts of the former test_cpu_moe_served (plain text, a question, a tool call's JSON, a list of steps)
MOE_PROMPTS = (
    "The quick brown fox jumps over the lazy dog.",
    "What is the weather like in Paris today? Let me check the weather for you.",
    '{"name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}}',
    "First, we read the input. Second, we compute the value. Finally, we return the output.",
)


def test_equiv_the_shipped_cpu_image_matches_its_base(cpu_resolved: Any, cpu_server: Any, cpu_base_run: Any,
                                                      tmp_path: Path) -> None:
    """The shipped steps are retunes (BLOCK/NUM_WARPS) and modules (the MoE through sorted_moe): nothing flagged,
    in float32 on both sides, teacher-forced. The one home of that claim (test_cpu_moe_served served the same two
    images a second time for it; its assertions are here). The candidate is the session's ``cpu_server``, which
    serves exactly what ``equiv --against base`` would (asserted first): no vLLM start of its own."""
    import dataclasses

    from imageforge.build import build_target
    from imageforge.docker_engine import client
    from imageforge.equiv.runner import compare_urls, sides
    from imageforge.serve.command import config_file_args

    settings = _prompts(cpu_resolved, 3, 4)
    settings = dataclasses.replace(settings, prompts=(*settings.prompts, *MOE_PROMPTS))
    assert "load-format" not in cpu_resolved.serving_args()  # the tiny model's real seeded weights
    # `run --base --set dtype=float32` serves exactly what `equiv --against base` starts as its reference
    side = sides(cpu_resolved, "base", dtype="float32")[1]
    assert side.base and side.image is None
    run_base = resolve(cpu_resolved.manifest, "cpu", None, environ=os.environ, sets=["dtype=float32"])
    assert run_base.profile_name == cpu_resolved.profile_name
    assert side.resolved.serving_args() == run_base.serving_args()
    # the session's cpu_server is equiv's candidate: the image equiv builds for it (a cached build), in float32
    cand_side = sides(cpu_resolved, "base", dtype="float32")[0]
    assert cand_side.resolved.serving_args()["dtype"] == "float32"
    assert cand_side.resolved.target.image == f"{cpu_resolved.target.image}-equiv"
    built = build_target(cand_side.resolved, environ=os.environ, echo=print)
    assert cpu_server.image in built.tags and client().images.get(cpu_server.image).id == built.image_id
    assert cpu_server.profile == cpu_resolved.profile_name and not cpu_server.base and cpu_server.running()
    code, out = cpu_server.container.exec_run(["cat", cpu_resolved.target.serving.config_path])
    assert code == 0, out
    served_config = yaml.safe_load(out)
    assert served_config == config_file_args(cand_side.resolved.serving_args())
    assert served_config["dtype"] == "float32"
    cpu_base_run.up()
    result = compare_urls(cpu_base_run.url, cpu_server.url, settings, "float32",
                          labels=(cand_side.label, "base image"), run_dir=tmp_path / "equiv")
    print(result.text())
    assert result.labels == ("cpu:conservative", "base image")
    assert result.verdict.dtype == "float32"
    assert result.verdict.passed, result.text()
    assert {c.name for c in result.verdict.checks} == {"max_abs", "mean_abs", "p95_abs", "top1"}
    assert result.verdict.comparison.overall.max_abs < 1e-3
    assert result.reference.url != result.candidate.url  # two servers, distinct ports
    assert result.run_dir is not None
    saved = json.loads((result.run_dir / "equiv.json").read_text())
    assert saved["passed"] is True and saved["dtype"] == "float32"
    assert (result.run_dir / "evidence-reference.json").is_file()
    assert "equiv PASSED" in (result.run_dir / "equiv.txt").read_text()
    # the weights make the logprobs mean something (dummy weights would give flat logits: nothing to compare)
    reference = [pos for prompt in result.reference.prompts for pos in prompt.positions]
    candidate = [pos for prompt in result.candidate.prompts for pos in prompt.positions]
    assert len(reference) == len(candidate) > 0
    gaps = sorted(pos.best_logprob() - pos.smallest_logprob() for pos in reference)
    assert min(pos.best_logprob() for pos in reference) > -6.0, "near -ln(vocab): flat logits (dummy weights?)"
    assert gaps[len(gaps) // 2] > 1.0, "top-1 and top-5 within a nat: nothing to compare"
    # every reference top-5 token is scored by the candidate, and the top-1 agrees at every position
    for ref, cand in zip(reference, candidate, strict=True):
        ref_top = [token for token, _ in ref.top(5)]
        assert set(ref_top) <= set(cand.entries), f"reference top-5 {ref_top} missing from the candidate's"
        assert cand.top(1)[0][0] == ref_top[0]
    overall = result.verdict.comparison.overall
    assert overall.top1_agree == overall.positions


def test_equiv_catches_a_scaled_softmax_with_exit_4(planted: Planted, cpu_base_run: Any, cpu_resolved: Any,
                                                     tmp_path: Path) -> None:
    """equiv flags the math change (exit 4) of ``planted.full`` (break-hermes changes no logit, scaled-softmax every
    one) against the base; then that server, compared and no longer needed, is the one that test_smoke's claim "a
    server killed mid-suite" kills (``helpers.kill_mid_suite``: no vLLM start of its own). The module's last test."""
    from imageforge.equiv.compare import raise_if_failed
    from imageforge.equiv.runner import compare_urls

    planted.up()
    served = planted.full
    # the shared reference serves the cpu target's config: the planted image's is the same, only its steps differ
    assert planted.resolved.serving_args() == {**cpu_resolved.serving_args(), "dtype": "float32"}
    cpu_base_run.up()
    result = compare_urls(cpu_base_run.url, served.url, _prompts(planted.resolved, 3, 4), "float32",
                          labels=("planted", "base image"))
    lines: list[str] = []
    killed = kill_mid_suite(served, tmp_path, lines.append)  # the comparison is done: the server may go
    planted.stop_full()  # its serving() block ends: removed, its log kept
    print(result.text())
    assert not result.verdict.passed, result.text()
    failed = {c.name for c in result.verdict.checks if not c.passed}
    assert "max_abs" in failed, result.text()
    with pytest.raises(EquivError) as info:
        raise_if_failed(result.verdict)
    assert info.value.exit_code == EXIT_SMOKE == 4
    # test_smoke's "a server killed mid-suite": the report names the exit, the checks after it are not run, the
    # killed server is removed all the same (serving()), its log and the JUnit report are kept
    assert not killed.ok and killed.passed == 0 and killed.failed == 4
    assert killed.server_problem is not None and "exited" in killed.server_problem
    by_id = {r.check.id: r for r in killed.results}
    assert any("the server is down" in f for f in by_id["long-generation"].failures)
    for check_id in ("after-1", "after-2", "after-3"):
        assert by_id[check_id].failures[0].startswith("not run: the server is down")
    text = "\n".join(lines)
    assert "the server went away during the suite" in text and "0 passed, 4 failed" in text
    assert labelled({L_RUN: served.run_id}) == []  # always removed
    assert (served.run_dir / "server.log").is_file() and (served.run_dir / "smoke-junit.xml").is_file()
