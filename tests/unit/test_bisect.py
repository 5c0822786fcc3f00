"""bisect: the pure search; the probe bound proven over arbitrary step counts and break points (hypothesis)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imageforge.errors import EXIT_CONFIG, EXIT_SMOKE, ConfigError, SmokeError
from imageforge.forensics import Outcome, bisect, probe_bound, raise_for, with_predecessors
from imageforge.forensics.search import BisectResult


class Probe:
    """probe(k): pass iff ``ok(k)``; records every call."""

    def __init__(self, ok: Callable[[int], bool]) -> None:
        self.ok = ok
        self.calls: list[int] = []

    def __call__(self, k: int) -> Outcome:
        self.calls.append(k)
        passed = self.ok(k)
        return Outcome(passed, "" if passed else f"check failed on image {k}")


def breaks_at(first: int) -> Probe:
    return Probe(lambda k: k < first)


@given(n=st.integers(1, 2000), data=st.data())
@settings(max_examples=400, deadline=None)
def test_finds_the_first_failing_step_within_the_bound(n: int, data: st.DataObject) -> None:
    first = data.draw(st.integers(1, n))
    probe = breaks_at(first)
    result = bisect(n, probe)
    assert result.status == "found"
    assert result.first_failing == first and result.last_passing == first - 1
    assert len(probe.calls) == len(set(probe.calls)) == result.probes == result.runs
    assert result.probes <= math.ceil(math.log2(n)) + 2
    assert probe.calls[:2] == [0, n]  # base and final first


@given(n=st.integers(1, 300), data=st.data())
@settings(max_examples=300, deadline=None)
def test_any_predicate_gives_a_pass_fail_edge_within_the_bound(n: int, data: st.DataObject) -> None:
    table = data.draw(st.lists(st.booleans(), min_size=n + 1, max_size=n + 1))
    table[0], table[n] = True, False
    probe = Probe(lambda k: table[k])
    result = bisect(n, probe)
    assert result.status == "found" and result.first_failing is not None
    k = result.first_failing
    assert table[k - 1] and not table[k]
    assert result.point(k - 1) is not None and result.point(k) is not None  # both ends were probed
    assert result.probes <= math.ceil(math.log2(n)) + 2 == result.bound


def test_base_fails_stops_after_one_probe() -> None:
    probe = Probe(lambda k: False)
    result = bisect(9, probe)
    assert result.status == "base-fails" and probe.calls == [0]
    assert "base image already fails" in result.text()
    with pytest.raises(SmokeError) as info:
        raise_for(result)
    assert info.value.exit_code == EXIT_SMOKE and "check failed on image 0" in info.value.render()


def test_final_passes_stops_after_two_probes() -> None:
    probe = Probe(lambda k: True)
    result = bisect(9, probe)
    assert result.status == "final-passes" and probe.calls == [0, 9]
    raise_for(result)  # nothing to report: no exception


def test_one_step() -> None:
    probe = breaks_at(1)
    result = bisect(1, probe)
    assert result.first_failing == 1 and probe.calls == [0, 1] and probe_bound(1) == 2


def test_two_steps_broken_by_the_second_probe_base_final_then_the_midpoint() -> None:
    """The search between base and final (was asserted by tests/integration/test_forensics_run.py's bisect with a
    retune before the planted break; that test now plants the break alone: base and final, 2 starts)."""
    probe = breaks_at(2)
    result = bisect(2, probe)
    assert result.status == "found" and result.first_failing == 2 and result.last_passing == 1
    assert probe.calls == [p.k for p in result.points] == [0, 2, 1]  # base, final, then the binary search's midpoint
    assert result.bound == math.ceil(math.log2(2)) + 2 == probe_bound(2) == 3 and result.runs <= result.bound
    assert [p.verdict(result.flaky) for p in result.points] == ["pass", "fail", "pass"]


def test_no_steps_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        bisect(0, breaks_at(1))
    assert info.value.exit_code == EXIT_CONFIG and "no steps" in info.value.render()
    with pytest.raises(ConfigError):
        bisect(3, breaks_at(1), repeat=0)


def test_found_result_text_json_and_error() -> None:
    result = bisect(8, breaks_at(5))
    labels = ["base", *(f"after step {i} s{i}" for i in range(1, 9))]
    text = result.text(labels)
    assert "first failing: after step 5 s5 (last passing: after step 4 s4)" in text
    data = result.to_json()
    assert data["first_failing"] == 5 and data["probes"] == result.probes <= 5
    assert [p["k"] for p in data["points"]][:2] == [0, 8]
    with pytest.raises(SmokeError) as info:
        raise_for(result, "s5 (build.yaml:40)")
    assert "s5 (build.yaml:40)" in info.value.render() and "check failed on image 5" in info.value.render()


# --------------------------------------------------------------------------- flaky checks


class Flaky:
    """Steps >= ``first`` fail; point ``flip`` fails on every ``period``-th call only."""

    def __init__(self, first: int, flip: int, period: int) -> None:
        self.first, self.flip, self.period = first, flip, period
        self.count = 0

    def __call__(self, k: int) -> Outcome:
        if k == self.flip:
            self.count += 1
            return Outcome(self.count % self.period != 0, "flaky")
        return Outcome(k < self.first, "broken")


def test_flipped_point_counts_as_failing_by_default_and_the_flip_rate_is_reported() -> None:
    # 16 steps, real break at 12; point 8 (the first midpoint) fails 1 run in 4
    result = bisect(16, Flaky(first=12, flip=8, period=4), repeat=4)
    p8 = result.point(8)
    assert p8 is not None and p8.flipped and p8.passes == 3 and p8.flip_rate == 0.25
    assert result.status == "found" and result.first_failing == 8  # counted as failing: the search went left
    assert result.runs == 4 * result.probes
    assert result.flip_rate == pytest.approx(1 / result.runs)
    assert "flipped 3/4 pass (rate 0.25)" in result.text() and "flip rate" in result.text()


def test_flipped_point_with_policy_unknown_is_inconclusive() -> None:
    result = bisect(16, Flaky(first=12, flip=8, period=4), repeat=4, flaky="unknown")
    assert result.status == "inconclusive"
    assert (result.last_passing, result.first_failing) == (0, 16)
    assert "inconclusive" in result.text()
    with pytest.raises(SmokeError):
        raise_for(result)


def test_repeat_without_flakes_is_still_within_the_point_bound() -> None:
    probe = breaks_at(3)
    result = bisect(10, probe, repeat=3)
    assert result.first_failing == 3 and result.flip_rate == 0.0
    assert result.probes <= probe_bound(10) and len(probe.calls) == 3 * result.probes


# --------------------------------------------------------------------------- cut lists and requires


def test_custom_cuts_search_only_those_images() -> None:
    probe = breaks_at(5)
    result = bisect(9, probe, cuts=[0, 2, 6, 9])
    assert result.first_failing == 6 and result.last_passing == 2
    assert set(probe.calls) <= {0, 2, 6, 9}
    with pytest.raises(ConfigError):
        bisect(9, probe, cuts=[0, 6, 2, 9])


class S:
    def __init__(self, ident: str, requires: tuple[str, ...] = (), required: bool = False) -> None:
        self.id, self.requires, self.required = ident, requires, required


def test_chosen_steps_never_skip_a_required_predecessor() -> None:
    steps = [S("a"), S("b"), S("c", ("a",)), S("d", ("c",)), S("e")]
    picked, added = with_predecessors(steps, ["d", "e"])
    assert picked == ["a", "c", "d", "e"]
    assert added == {"a": "required by d", "c": "required by d"}
    with pytest.raises(ConfigError) as info:
        with_predecessors(steps, ["dd"])
    assert "did you mean 'd'?" in info.value.render()


def test_result_is_frozen() -> None:
    result = bisect(2, breaks_at(2))
    assert isinstance(result, BisectResult)
    with pytest.raises(AttributeError):
        result.status = "x"  # type: ignore[misc, assignment]
