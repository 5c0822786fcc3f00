"""The equiv client against a real vLLM server of the cpu target (one server: compared with itself).

The two-server test (shipped image vs base, and a math-changing variant) is wired with `invoke equiv`.
"""

from __future__ import annotations

from typing import Any

import pytest

from imageforge.equiv import collect_against, collect_reference, compare, gate
from imageforge.manifest.tolerances import EquivSettings

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_server_compared_with_itself_passes_with_zero_deltas(cpu_server: Any) -> None:
    settings = EquivSettings(prompts=EquivSettings().prompts[:3], greedy_tokens=6)
    ref = collect_reference(cpu_server.url, settings.prompts, top_k=settings.top_k,
                            greedy_tokens=settings.greedy_tokens)
    for prompt in ref.prompts:
        # teacher-forced over prompt + continuation: one distribution per token after the first
        assert len(prompt.greedy) == settings.greedy_tokens
        assert prompt.sequence == prompt.prompt_ids + prompt.greedy
        assert len(prompt.positions) == len(prompt.sequence) - 1
        for pos, token in zip(prompt.positions, prompt.sequence[1:], strict=True):
            assert pos.token_id == token and pos.logprob(token) is not None
            assert len(pos.top(settings.top_k)) == settings.top_k
            assert all(lp <= 0.0 for lp, _ in pos.entries.values())
    again = collect_against(cpu_server.url, ref)
    assert [p.sequence for p in again.prompts] == [p.sequence for p in ref.prompts]
    for dtype in ("float32", "bfloat16"):
        verdict = gate(compare(ref, again), settings.tolerance(dtype), dtype)
        assert verdict.passed, verdict.text()
        overall = verdict.comparison.overall
        assert overall.max_abs < 1e-5 and overall.top1 == 1.0 and overall.missing == 0
        assert verdict.comparison.diverged == 0
