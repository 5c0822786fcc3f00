"""ablate planning: variants without a step and its dependents, required steps, the ABAB schedule, the table."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping

import pytest

from imageforge.errors import ConfigError
from imageforge.forensics import Metrics, RunResult, dependents, plan_ablation, summarize
from imageforge.forensics.ablate import FULL


class S:
    def __init__(self, ident: str, requires: tuple[str, ...] = (), required: bool = False) -> None:
        self.id, self.requires, self.required = ident, requires, required


STEPS = [
    S("libs"),
    S("ldconfig", ("libs",)),
    S("moe-module"),
    S("moe-skip-prepack", ("moe-module",)),
    S("moe-call", ("moe-skip-prepack",)),
    S("warps"),
    S("serving-fix", required=True),
]


def test_dependents_are_transitive_and_in_manifest_order() -> None:
    assert dependents(STEPS, "moe-module") == ["moe-skip-prepack", "moe-call"]
    assert dependents(STEPS, "libs") == ["ldconfig"]
    assert dependents(STEPS, "warps") == []


def test_each_variant_drops_the_step_and_its_dependents_and_required_steps_are_skipped() -> None:
    plan = plan_ablation(STEPS, repeats=2)
    by_step = {v.step: v for v in plan.variants}
    assert list(by_step) == ["libs", "ldconfig", "moe-module", "moe-skip-prepack", "moe-call", "warps"]
    assert by_step["moe-module"].dropped == ("moe-module", "moe-skip-prepack", "moe-call")
    assert by_step["moe-module"].steps == ("libs", "ldconfig", "warps", "serving-fix")
    assert by_step["moe-call"].steps == ("libs", "ldconfig", "moe-module", "moe-skip-prepack", "warps",
                                         "serving-fix")
    assert [(s.step, s.reason) for s in plan.skipped] == [("serving-fix", "required: true")]
    assert "skipped serving-fix: required: true" in plan.text()
    assert "and its dependents moe-skip-prepack, moe-call" in plan.text()


def test_a_step_a_required_step_needs_is_skipped() -> None:
    steps = [S("a"), S("b", ("a",), required=True), S("c")]
    plan = plan_ablation(steps, ["a", "c"])
    assert [v.step for v in plan.variants] == ["c"]
    assert [(s.step, s.reason) for s in plan.skipped] == [("a", "required step(s) b require it")]


def test_chosen_steps_are_checked_and_kept_in_manifest_order() -> None:
    plan = plan_ablation(STEPS, ["warps", "libs", "warps"], repeats=1)
    assert [v.step for v in plan.variants] == ["libs", "warps"]
    assert plan.skipped == ()
    with pytest.raises(ConfigError) as info:
        plan_ablation(STEPS, ["wraps"])
    assert "did you mean 'warps'?" in info.value.render()
    with pytest.raises(ConfigError):
        plan_ablation(STEPS, repeats=0)


def test_schedule_is_abab_per_variant_block() -> None:
    plan = plan_ablation(STEPS, ["libs", "warps"], repeats=3)
    order = [(r.block, r.round, r.image) for r in plan.schedule]
    assert order == [
        (0, 0, FULL), (0, 0, "libs"), (0, 1, FULL), (0, 1, "libs"), (0, 2, FULL), (0, 2, "libs"),
        (1, 0, FULL), (1, 0, "warps"), (1, 1, FULL), (1, 1, "warps"), (1, 2, FULL), (1, 2, "warps"),
    ]
    assert [r.index for r in plan.schedule] == list(range(12))


def run_all(plan_steps: list[str], values: Mapping[tuple[str, int], Metrics | None],
            repeats: int = 3) -> list[RunResult]:
    plan = plan_ablation(STEPS, plan_steps, repeats=repeats)
    out = []
    for run in plan.schedule:
        key = (run.image if run.role == "variant" else f"full{run.block}", run.round)
        out.append(RunResult(run, values[key]))
    return out


def m(score: float, out: float, inp: float, cache: float = 0.0) -> Metrics:
    return Metrics(score, out, inp, cache)


def test_summary_uses_medians_of_paired_ratios() -> None:
    plan = plan_ablation(STEPS, ["warps"], repeats=3)
    values = {
        ("full0", 0): m(100, 10, 100, 50), ("warps", 0): m(110, 11, 100, 50),
        ("full0", 1): m(50, 5, 50, 0), ("warps", 1): m(60, 6, 40, 10),  # the machine got slower: pairs cancel it
        ("full0", 2): m(100, 10, 100, 50), ("warps", 2): m(90, 9, 110, 25),
    }
    table = summarize(plan, run_all(["warps"], values), {"warps": "pass"})
    (row,) = table.rows
    assert row.step == "warps" and row.pairs == 3 and row.failed_runs == 0
    assert row.weighted_tps == 90  # median of 110, 60, 90
    assert row.deltas["weighted_tps"] == pytest.approx(0.1)  # median of +10%, +20%, -10%
    assert row.deltas["output_tps"] == pytest.approx(0.1)
    assert row.deltas["uncached_input_tps"] == pytest.approx(0.0)  # median of 0, -20%, +10%
    assert row.deltas["cache_tps"] == pytest.approx(-0.25)  # full cache 0 in round 1: that pair has no ratio
    assert row.spread == pytest.approx((-0.1, 0.2))
    assert row.equiv == "pass"
    assert table.full.weighted_tps == 100 and table.full.pairs == 3
    assert table.full.spread == pytest.approx((-0.5, 0.0))


def test_failed_runs_are_left_out_and_counted() -> None:
    plan = plan_ablation(STEPS, ["warps"], repeats=2)
    values: dict[tuple[str, int], Metrics | None] = {
        ("full0", 0): m(100, 10, 100), ("warps", 0): None,
        ("full0", 1): m(100, 10, 100), ("warps", 1): m(80, 8, 100),
    }
    table = summarize(plan, run_all(["warps"], values, repeats=2))
    (row,) = table.rows
    assert row.failed_runs == 1 and row.pairs == 1 and row.deltas["weighted_tps"] == pytest.approx(-0.2)
    assert row.equiv == "-"
    assert "1 run(s) failed" in table.text()


def test_table_as_text_json_and_csv() -> None:
    plan = plan_ablation(STEPS, ["warps", "serving-fix"], repeats=1)
    values = {("full0", 0): m(200, 20, 100, 10), ("warps", 0): m(150, 15, 100, 10)}
    table = summarize(plan, run_all(["warps", "serving-fix"], values, repeats=1), {"warps": "FAIL"})
    text = table.text()
    assert "warps" in text and "-25.0%" in text and "FAIL" in text
    assert "serving-fix                  skipped: required: true" in text
    data = json.loads(json.dumps(table.to_json()))
    assert data["variants"][0]["delta_weighted_tps"] == pytest.approx(-0.25)
    assert data["variants"][0]["equiv"] == "FAIL"
    assert data["skipped"] == [{"step": "serving-fix", "reason": "required: true"}]
    rows = list(csv.DictReader(io.StringIO(table.csv())))
    assert [r["step"] for r in rows] == [FULL, "warps", "serving-fix"]
    assert float(rows[1]["delta_weighted_tps"]) == pytest.approx(-0.25)
    assert float(rows[1]["delta_output_tps"]) == pytest.approx(-0.25)
    assert rows[1]["delta_uncached_input_tps"] == "0" and rows[1]["equiv"] == "FAIL"
    assert rows[2]["equiv"] == "skipped: required: true"


# --------------------------------------------------------------------------- in place: one server at a time


def test_in_place_schedule_is_full_each_variant_full() -> None:
    from imageforge.forensics.ablate import one_at_a_time_slots

    plan = plan_ablation(STEPS, ["warps", "libs"], repeats=2)
    slots = one_at_a_time_slots(plan)
    assert [(s.role, s.label, s.block) for s in slots] == [
        ("full", "full (before)", None), ("variant", "without libs", 0), ("variant", "without warps", 1),
        ("full", "full (after)", None)]
    assert slots[0].steps == slots[-1].steps == plan.full
    assert slots[1].steps == plan.variants[0].steps and slots[2].steps == plan.variants[1].steps


def mm(score: float) -> Metrics:
    return Metrics(score, score / 2, score * 3, 0.0)


def test_in_place_pairs_each_variant_with_the_full_runs_around_it() -> None:
    from imageforge.forensics.ablate import bracket, bracketed_results

    plan = plan_ablation(STEPS, ["warps", "libs"], repeats=2)
    before = [mm(100), mm(110)]
    after = [mm(81), None]  # drift: the machine got slower; round 2 of the last full server failed
    variants = {0: [mm(99), mm(121)], 1: [mm(45), mm(55)]}
    results = bracketed_results(plan, before, after, variants)
    assert len(results) == len(plan.schedule)
    full = {(r.run.block, r.run.round): r.metrics for r in results if r.run.role == "full"}
    assert full[(0, 0)] == full[(1, 0)] and full[(0, 0)] is not None
    assert full[(0, 0)].weighted_tps == pytest.approx(90.0)  # sqrt(100 * 81)
    assert full[(0, 1)] == before[1]  # only one side: that one
    assert bracket(None, None) is None
    table = summarize(plan, results)
    b_row, c_row = table.rows
    assert b_row.deltas["weighted_tps"] == pytest.approx((99 / 90 - 1 + 121 / 110 - 1) / 2)
    assert c_row.deltas["weighted_tps"] == pytest.approx((45 / 90 - 1 + 55 / 110 - 1) / 2)
    assert b_row.pairs == c_row.pairs == 2
