"""Smoke suites: checks as data, run against an OpenAI-compatible server, with reports.

A suite is a YAML file (top-level ``schema/smoke.schema.json``, strict; errors name file:line like the
manifest's).  Each check is a request (method, endpoint, body, stream, repeat, concurrency,
timeout) and expectations (status, JSON Schema of the body, JSONPath comparisons, regular
expressions, relations between fields, stream == non-stream, /metrics counters growing by a
computed amount, healthy afterwards).  Checks carry tags (``dummy-ok``, ``real-weights``)
chosen with ``--tags``; ``serial`` checks run alone, the rest concurrently.

Expressions (relations, metric deltas, ``${...}`` templates) are a small, safe subset of Python
(:mod:`.expr`).  Names: ``request`` (the body sent), ``response`` (the body received; for streams the
assembled answer, with ``chunks``), ``responses`` (all of a repeated request), ``status``,
``non_stream``, the suite's variables, and, as a fallback, the top-level fields of the response
body -- so ``usage.completion_tokens <= request.max_tokens`` reads naturally.

Reports: a live table (check, status, latency), a closing line ``N passed, N failed``
(``, N skipped``), ``smoke.json`` and ``smoke-junit.xml`` under ``.imageforge/runs/<run id>/``,
and for each failure the request, the response and the server's last log lines.

The modules, lowest first: ``expr`` (the expression language and templates), ``operators`` (the
``expect.json`` comparisons), ``suite`` (the model and its loader), ``results`` (exchanges, check
results, the report object), ``evaluate`` (whether a check's expectations hold for a response: pure,
no I/O), ``table``
(the live table), ``report`` (JSON/JUnit files, failure texts, the verdict), ``runner`` (one suite
against one server), ``entry`` (a suite against a URL, or build + serve + smoke + remove a target;
``invoke smoke`` and ``invoke demo`` reach them through :mod:`imageforge.app`).
The wire formats (SSE, /metrics, the URL check) are shared with bench in :mod:`imageforge.serve.openai_wire`.
"""

from __future__ import annotations

from ..serve.openai_wire import assemble_stream, check_url, comparable_choices, metric_value, parse_metrics, parse_sse
from .entry import (
    parse_tags,
    run_suite,
    smoke_target,
    smoke_url,
    suite_for,
    target_vars,
)
from .evaluate import describe_difference, evaluate, evaluate_path, evaluate_regex, namespace
from .expr import FUNCTIONS, Expr, ExprError, check_templates, parse_expr, render, template_parts
from .operators import PATH_OPS, compare, schema_errors
from .report import LOG_TAIL, failure_text, interesting_lines, print_failures, verdict, write_reports
from .results import FAIL, PASS, SKIP, CheckResult, Exchange, SmokeReport, summary_line
from .runner import Runner, ServerHooks
from .suite import (
    DEFAULT_CONCURRENCY,
    DEFAULT_TAGS,
    DEFAULT_TIMEOUT,
    SCHEMA_NAME,
    Check,
    Expectations,
    MetricExpectation,
    PathExpectation,
    RegexExpectation,
    Relation,
    Request,
    SetupStep,
    Suite,
    load_suite,
)
from .table import LiveTable, result_line

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_TAGS",
    "DEFAULT_TIMEOUT",
    "FAIL",
    "FUNCTIONS",
    "LOG_TAIL",
    "PASS",
    "PATH_OPS",
    "SCHEMA_NAME",
    "SKIP",
    "Check",
    "CheckResult",
    "Exchange",
    "Expectations",
    "Expr",
    "ExprError",
    "LiveTable",
    "MetricExpectation",
    "PathExpectation",
    "RegexExpectation",
    "Relation",
    "Request",
    "Runner",
    "ServerHooks",
    "SetupStep",
    "SmokeReport",
    "Suite",
    "assemble_stream",
    "check_templates",
    "check_url",
    "comparable_choices",
    "compare",
    "describe_difference",
    "evaluate",
    "evaluate_path",
    "evaluate_regex",
    "failure_text",
    "interesting_lines",
    "load_suite",
    "metric_value",
    "namespace",
    "parse_expr",
    "parse_metrics",
    "parse_sse",
    "parse_tags",
    "print_failures",
    "render",
    "result_line",
    "run_suite",
    "schema_errors",
    "smoke_target",
    "smoke_url",
    "suite_for",
    "summary_line",
    "target_vars",
    "template_parts",
    "verdict",
    "write_reports",
]
