"""Load benchmarks and parameter sweeps against OpenAI-compatible servers, and the evaluator's replay.

* :class:`Workload` (``workload``) -- N requests at concurrency C: prompt length and output length in tokens,
  the fraction of each prompt shared by every request (it exercises the prefix cache), a seed.
  Prompts are deterministic words (:func:`prompt_words`); against a server with ``/tokenize``
  (vLLM) they become token-ID prompts of exactly the requested length, otherwise plain text of
  about that length.  Output lengths are forced with ``max_tokens`` and ``ignore_eos: true`` (no
  ``min_tokens``: vLLM's min-tokens logits processor costs every decode step, and ``vllm bench serve`` does
  not send it), so random weights produce exactly the tokens asked for.
* :func:`run_bench` (``runner``, over ``client``) -- the load client (asyncio + httpx, streaming through
  :mod:`imageforge.serve.openai_wire` for the time to first token).  It stops by itself: after ``requests``
  requests or ``duration`` seconds, whichever is first; it talks only to the URL it is given.
* Measures (``results``, ``metrics``): Output TPS (generated tokens / wall), Input TPS (prompt tokens / wall; uncached:
  prompt - cached),
  Cache TPS (prompt tokens served from the prefix cache / wall: from ``usage.prompt_tokens_details.cached_tokens``
  when the server reports it -- vLLM only with ``--enable-prompt-tokens-details`` -- else from the
  delta of vLLM's ``/metrics`` counter ``vllm:prompt_tokens_cached_total`` or ``vllm:prefix_cache_hits_total``),
  TTFT / latency / time per output token percentiles, errors, and ``weighted_tps`` (:func:`metrics.weighted_tps`:
  the replay score's formula on these wall-clock rates; comparisons rank by it).
* :func:`bench_target` -- build if needed, serve, bench, always remove; :func:`sweep` (``sweeps``) -- one
  server per parameter combination (``--set`` values; only the serving-config layer is rebuilt),
  best weighted_tps and Output-TPS plateau marked, ``sweep.json`` + ``sweep.md``.

* The evaluator's replay (``replay_workload``: the request model and the seeded generator; ``replay_loading``:
  a dataset in imageforge's or the harness's format, and the token counters; ``replay``: the runner, with the
  harness's retries and the time cap; ``evaluator``: the harness's metrics and the platform's score;
  ``redlines``: redlines and targets as data, each naming its source; ``sampling``: whole-session stratified
  samples and the full replay they predict): requests sent **one at a time** on a blocking client
  (:func:`.client.stream_request_sync`: the bench's chunk counting, no event loop); :func:`replay_bench` /
  :func:`replay_target` (``invoke bench --replay``).
* ``plots``: the PNGs of a replay (``bench.png``) and of a sweep (``sweep.png``), matplotlib's Agg canvas.

One percentile (:func:`metrics.percentile`, numpy's linear) and one set of score weights serve all of it.
Reports go to ``.imageforge/runs/<run id>/`` (``bench.json``: ``report``; ``sweep.json``, ``sweep.md``).
A bench fails (SmokeError, exit 4) when its error rate exceeds the threshold or no token came back.
"""

from __future__ import annotations

from ..workload import APIS, Prompt, Workload, prompt_words
from .client import BenchClient
from .evaluator import EvalReport, RequestRecord, classify_http, evaluate
from .metrics import (
    CACHED_TOKEN_COUNTERS,
    CACHED_WEIGHT,
    GENERATION_TOKEN_COUNTERS,
    OUTPUT_WEIGHT,
    PLATEAU_TOLERANCE,
    PLATFORM_FACTOR,
    PROMPT_TOKEN_COUNTERS,
    UNCACHED_INPUT_WEIGHT,
    counter_delta,
    metrics_counters,
    percentile,
    plateau_index,
    platform_score,
    weighted_tps,
)
from .redlines import REDLINES, Redline
from .replay import ReplayBench, ReplayOptions, replay_bench, replay_options, run_replay
from .replay_loading import load_jsonl
from .replay_workload import ReplaySpec, generate
from .report import bench_rows, print_bench, write_bench
from .results import BenchResult, RequestResult
from .runner import bench_target, median_run, replay_report, replay_target, run_bench, verdict
from .sweeps import (
    SweepPoint,
    SweepResult,
    combinations,
    parse_params,
    print_sweep,
    report_sweep,
    set_args,
    sweep,
    sweep_image,
    sweep_workload,
)

__all__ = [
    "APIS",
    "CACHED_TOKEN_COUNTERS",
    "CACHED_WEIGHT",
    "GENERATION_TOKEN_COUNTERS",
    "OUTPUT_WEIGHT",
    "PLATEAU_TOLERANCE",
    "PLATFORM_FACTOR",
    "PROMPT_TOKEN_COUNTERS",
    "REDLINES",
    "UNCACHED_INPUT_WEIGHT",
    "BenchClient",
    "BenchResult",
    "EvalReport",
    "Prompt",
    "Redline",
    "ReplayBench",
    "ReplayOptions",
    "ReplaySpec",
    "RequestRecord",
    "RequestResult",
    "SweepPoint",
    "SweepResult",
    "Workload",
    "bench_rows",
    "bench_target",
    "classify_http",
    "combinations",
    "counter_delta",
    "evaluate",
    "generate",
    "load_jsonl",
    "median_run",
    "metrics_counters",
    "parse_params",
    "percentile",
    "plateau_index",
    "platform_score",
    "print_bench",
    "print_sweep",
    "prompt_words",
    "replay_bench",
    "replay_options",
    "replay_report",
    "replay_target",
    "report_sweep",
    "run_bench",
    "run_replay",
    "set_args",
    "sweep",
    "sweep_image",
    "sweep_workload",
    "verdict",
    "weighted_tps",
    "write_bench",
]
