"""Running a suite against a server: setup, each check's requests, liveness, /metrics snapshots.

The I/O half: whether what came back meets the expectations is :mod:`.evaluate`'s (pure functions)."""

from __future__ import annotations

import json
import threading
import time
from collections import ChainMap
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

import httpx
import jsonpath

from ..serve.openai_wire import (
    SSE_CONTENT_TYPE,
    MetricRow,
    assemble_stream,
    parse_metrics,
    parse_sse,
    short,
)
from ..serve.waits import probe_health, wait_until
from .evaluate import evaluate, metric_deltas, metric_misses, namespace
from .expr import ExprError, render
from .results import FAIL, PASS, SKIP, CheckResult, Exchange
from .suite import DEFAULT_TIMEOUT, Check, Request, Suite
from .table import LiveTable

Log = Callable[[str], None]

METRICS_SETTLE = 5.0  # seconds to wait for /metrics counters to catch up


@dataclass(frozen=True)
class ServerHooks:
    """What the runner may ask about the server besides HTTP (a container, when it owns one)."""

    alive: Callable[[], str | None] | None = None  # None when fine, else why the server is gone
    log_tail: Callable[[int], list[str]] | None = None


class Runner:
    def __init__(self, suite: Suite, url: str, *, tags: Sequence[str], vars: Mapping[str, Any] | None = None,
                 hooks: ServerHooks | None = None, echo: Log = print, concurrency: int | None = None,
                 transport: Any = None, params: Mapping[str, Any] | None = None) -> None:
        self.suite = suite
        self.url = url.rstrip("/")
        self.tags = tuple(tags)
        # the suite's parameters (defaults, or resolved --param values) are names like the runner's vars
        self.params = suite.resolve_params() if params is None else dict(params)
        self.provided = {**dict(vars or {}), **self.params}
        self.hooks = hooks or ServerHooks()
        self.echo = echo
        self.concurrency = concurrency or suite.concurrency
        self.http = httpx.Client(base_url=self.url, transport=transport,
                                 limits=httpx.Limits(max_connections=128, max_keepalive_connections=32))
        self.names: dict[str, Any] = {}
        self.setup_problems: list[str] = []
        self.server_down: str | None = None
        self._lock = threading.Lock()

    def close(self) -> None:
        self.http.close()

    # -- HTTP ------------------------------------------------------------------

    def send(self, method: str, endpoint: str, *, body: Any = None, raw_body: str | None = None,
             headers: Mapping[str, str] | None = None, stream: bool = False,
             timeout: float = DEFAULT_TIMEOUT) -> Exchange:
        ex = Exchange(method, self.url + endpoint, body, raw_body)
        hdrs = dict(headers or {})
        kwargs: dict[str, Any] = {"headers": hdrs, "timeout": httpx.Timeout(timeout)}
        if raw_body is not None:
            kwargs["content"] = raw_body.encode()
            hdrs.setdefault("content-type", "application/json")
        elif body is not None:
            kwargs["json"] = body
        t0 = time.monotonic()
        deadline = t0 + timeout
        try:
            with self.http.stream(method, endpoint, **kwargs) as response:
                parts: list[bytes] = []
                for part in response.iter_bytes():
                    parts.append(part)
                    if time.monotonic() > deadline:
                        raise httpx.ReadTimeout("total time exceeded")
                ex.status = response.status_code
                ex.headers = dict(response.headers)
                ex.text = b"".join(parts).decode("utf-8", "replace")
        except httpx.TimeoutException as exc:
            ex.seconds = time.monotonic() - t0
            ex.error = f"timed out after {ex.seconds:.2f}s (the check's timeout is {timeout:g}s; {type(exc).__name__})"
            return ex
        except httpx.HTTPError as exc:
            ex.seconds = time.monotonic() - t0
            ex.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return ex
        ex.seconds = time.monotonic() - t0
        content_type = ex.headers.get("content-type", "")
        if stream and ex.status == 200 and SSE_CONTENT_TYPE in content_type:
            chunks, done, problems = parse_sse(ex.text)
            ex.chunks = chunks
            ex.body = assemble_stream(chunks, done)
            if problems:
                ex.body["stream_problems"] = problems
        else:
            try:
                ex.body = json.loads(ex.text) if ex.text.strip() else None
            except ValueError:
                ex.body = None
        return ex

    def scope(self) -> Mapping[str, Any]:
        """The names templates see outside a check: every variable, and ``vars`` (all of them, as a mapping:
        ``get(vars, 'x')`` for one that setup may not have bound)."""
        return ChainMap({"vars": self.names}, self.names)

    def render_request(self, request: Request) -> tuple[str, Any]:
        names = self.scope()
        endpoint = str(render(request.endpoint, names))
        body = render(request.body, names) if request.body is not None else None
        if request.merge is not None and isinstance(body, dict):
            extra = render(request.merge, names)
            if extra is not None and not isinstance(extra, Mapping):
                raise ExprError(f"merge gave {type(extra).__name__}, not a mapping: {short(extra, 80)}")
            for key, value in (extra or {}).items():
                if isinstance(value, Mapping) and isinstance(body.get(key), Mapping):
                    body[key] = {**body[key], **value}
                else:
                    body[key] = value
        if request.stream and isinstance(body, dict):
            body["stream"] = True
        return endpoint, body

    def timeout_of(self, request: Request) -> float:
        """The request's timeout in seconds: its number, or its ``${...}`` template rendered (e.g. a suite
        parameter); ExprError unless that gives a number > 0."""
        if not isinstance(request.timeout, str):
            return request.timeout
        value = render(request.timeout, self.scope())
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ExprError(f"timeout {request.timeout} gave {short(value, 80)}, not a number of seconds > 0")
        return float(value)

    def send_request(self, request: Request, endpoint: str, body: Any) -> Exchange:
        """``request`` sent as rendered (after its ``delay``)."""
        if request.delay > 0:
            time.sleep(request.delay)
        return self.send(request.method, endpoint, body=body, raw_body=request.raw_body, headers=request.headers,
                         stream=request.stream, timeout=self.timeout_of(request))

    # -- setup ------------------------------------------------------------------

    def prepare(self) -> None:
        """Setup requests bind variables; suite vars fill in the rest; the runner's vars win.

        Suite vars are rendered as soon as what they refer to is known, so setup requests can
        use plain vars and later vars can use what setup bound.
        """
        self.names = {**self.provided}
        pending = {k: v for k, v in self.suite.vars.items() if k not in self.names}
        self._fill(pending)
        for step in self.suite.setup:
            try:
                endpoint, body = self.render_request(step.request)
                self.timeout_of(step.request)
            except ExprError as exc:
                self.setup_problems.append(f"setup {step.id}: {exc}")
                continue
            ex = self.send_request(step.request, endpoint, body)
            if ex.error or ex.status != 200 or ex.body is None:
                if not step.optional:
                    why = ex.error or f"HTTP {ex.status}: {short(ex.text, 200)}"
                    self.setup_problems.append(f"setup {step.id} ({step.request.method} {endpoint}) failed: {why}")
                continue
            for name, path in step.bind.items():
                if name in self.provided:
                    continue
                matches = jsonpath.findall(path, ex.body)
                if step.all_matches:
                    self.names[name] = matches
                elif len(matches) == 1:
                    self.names[name] = matches[0]
                else:
                    self.setup_problems.append(f"setup {step.id}: {path} matched {len(matches)} values, "
                                               f"expected exactly 1 (to bind {name})")
            self._fill(pending)
        # once every setup step has run, the variables again from scratch: one that read a binding of a later
        # (or optional, failed) step through get(vars, ...) had rendered without it
        bound = {name for step in self.suite.setup for name in step.bind}
        pending = {k: v for k, v in self.suite.vars.items() if k not in self.provided and k not in bound}
        for name in pending:
            self.names.pop(name, None)
        self._fill(pending)
        for name, value in pending.items():
            try:
                render(value, self.scope())
            except ExprError as exc:
                self.setup_problems.append(f"variable {name}: {exc}")

    def _fill(self, pending: dict[str, Any]) -> None:
        """Render every pending var whose names are known (repeatedly: vars may use each other)."""
        progressed = True
        while progressed and pending:
            progressed = False
            for name, value in list(pending.items()):
                try:
                    self.names[name] = render(value, self.scope())
                except ExprError:
                    continue
                del pending[name]
                progressed = True

    # -- liveness ---------------------------------------------------------------

    def check_server(self) -> str | None:
        """None when the server still answers; else why not (and remember it)."""
        if self.server_down:
            return self.server_down
        reason: str | None = None
        if self.hooks.alive is not None:
            reason = self.hooks.alive()
        if reason is None:
            health = probe_health(self.http, timeout=5)
            if not health.ok:
                reason = health.describe()
            if reason and self.hooks.alive is not None:
                time.sleep(0.5)  # a container that just died may still read as running
                reason = self.hooks.alive() or reason
        if reason:
            with self._lock:
                self.server_down = self.server_down or reason
        return reason

    # -- one check ----------------------------------------------------------------

    def run_check(self, check: Check) -> CheckResult:
        result = CheckResult(check)
        t0 = time.monotonic()
        try:
            self._run_check(check, result)
        except Exception as exc:  # a bug in an expectation must not kill the suite
            result.fail(f"internal error while checking: {type(exc).__name__}: {exc}")
        result.seconds = time.monotonic() - t0
        if result.status == "pending":
            result.status = FAIL if result.failures else PASS
        if result.status == FAIL and not result.message:
            result.message = result.failures[0] if result.failures else "failed"
        lat = sorted(e.seconds for e in result.exchanges if e.status is not None)
        result.latency = lat[len(lat) // 2] if lat else None
        return result

    def _run_check(self, check: Check, result: CheckResult) -> None:
        if check.skip:
            result.status, result.message = SKIP, check.skip
            return
        if self.server_down:
            result.fail(f"not run: the server is down ({self.server_down})")
            return
        if self._skipped_by_rule(check, result, self.scope(), before=True):
            return
        req = check.request
        try:
            endpoint, body = self.render_request(req)
            timeout = self.timeout_of(req)
        except ExprError as exc:
            extra = ("; " + "; ".join(self.setup_problems)) if self.setup_problems else ""
            result.fail(f"cannot render the request: {exc}{extra}")
            return
        expect = check.expect
        before: list[MetricRow] | None = None
        if expect.metrics:
            before = self.scrape_metrics(result)
            if before is None:
                return

        def one(_: int) -> Exchange:
            return self.send_request(req, endpoint, body)

        if req.repeat == 1:
            exchanges = [one(0)]
        else:
            with ThreadPoolExecutor(max_workers=min(req.concurrency, req.repeat)) as pool:
                exchanges = list(pool.map(one, range(req.repeat)))
        result.exchanges = list(exchanges)
        transport = [e for e in exchanges if e.error]
        if transport:
            for e in transport[:3]:
                result.fail(f"{req.method} {endpoint}: {e.error}")
            if len(transport) > 3:
                result.fail(f"... and {len(transport) - 3} more requests failed the same way")
            if any("timed out" not in (e.error or "") for e in transport):
                down = self.check_server()
                if down:
                    result.fail(f"the server is down: {down}")
            return

        non_stream: Exchange | None = None
        if expect.stream_equals_non_stream and isinstance(body, dict):
            plain = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
            non_stream = self.send(req.method, endpoint, body=plain, headers=req.headers, timeout=timeout)
            result.exchanges.append(non_stream)
            if non_stream.error or non_stream.status != 200:
                result.fail(f"the non-stream request failed: {non_stream.error or f'HTTP {non_stream.status}'}")
                non_stream = None

        reference: tuple[Any, Any] = (None, None)
        if check.reference is not None:
            try:
                ref_endpoint, ref_body = self.render_request(check.reference)
            except ExprError as exc:
                result.fail(f"cannot render the reference request: {exc}")
                return
            ref = self.send_request(check.reference, ref_endpoint, ref_body)
            result.exchanges.append(ref)
            if ref.error or ref.status != 200:
                result.fail(f"the reference request {check.reference.method} {ref_endpoint} failed: "
                            f"{ref.error or f'HTTP {ref.status}: {short(ref.text.strip(), 200)}'}")
                return
            reference = (ref_body, ref.body)

        bodies = [e.body for e in exchanges]
        if check.skip_if:
            names = namespace(body, exchanges[0], bodies, non_stream, reference, self.names)
            if self._skipped_by_rule(check, result, names, before=False):
                return
        for i, ex in enumerate(exchanges):
            prefix = f"[{i + 1}/{len(exchanges)}] " if len(exchanges) > 1 else ""
            names = namespace(body, ex, bodies, non_stream, reference, self.names)
            for message in evaluate(expect, ex, names, stream=req.stream, non_stream=non_stream):
                result.fail(prefix + message)
            if result.failures and len(exchanges) > 1:
                break

        if any(e.status is not None and e.status >= 500 for e in result.exchanges):
            down = self.check_server()
            if down:
                result.fail(f"the server is down: {down}")
                return
        if before is not None:
            self.check_metrics(check, result, before, body, bodies, exchanges)
        if expect.healthy_after:
            health = probe_health(self.http, timeout=10)
            if not health.ok:
                result.fail(f"the server is not healthy after the check: {health.error or health.short}")

    def _skipped_by_rule(self, check: Check, result: CheckResult, names: Mapping[str, Any], *, before: bool) -> bool:
        """Mark ``result`` skipped by the first of the check's ``skip_if`` rules (of this phase) that holds."""
        for rule in check.skip_if:
            if rule.before != before:
                continue
            try:
                holds = rule.when.evaluate(names)
                why = str(render(rule.why, names)) if holds else ""
            except ExprError as exc:
                result.fail(f"skip_if {rule.when.text!r} ({rule.location}): {exc}")
                return True
            if holds:
                result.status, result.message = SKIP, why
                return True
        return False

    # -- metrics ------------------------------------------------------------------

    def scrape_metrics(self, result: CheckResult) -> list[MetricRow] | None:
        ex = self.send("GET", "/metrics", timeout=15)
        if ex.error or ex.status != 200:
            result.fail(f"GET /metrics failed: {ex.error or f'HTTP {ex.status}'}")
            return None
        try:
            return parse_metrics(ex.text)
        except ValueError as exc:
            result.fail(f"GET /metrics: not the Prometheus text format ({exc})")
            return None

    def check_metrics(self, check: Check, result: CheckResult, before: list[MetricRow],
                      request_body: Any, bodies: Sequence[Any], exchanges: Sequence[Exchange]) -> None:
        names = namespace(request_body, exchanges[-1], bodies, None, vars=self.names)
        wanted, problems = metric_deltas(check.expect.metrics, names, before)
        for problem in problems:
            result.fail(problem)
        if not wanted:
            return
        misses: list[str] = []

        def settled() -> bool | None:
            """True when every counter grew as expected (or /metrics failed: recorded); None: not yet."""
            after = self.scrape_metrics(result)
            if after is None:
                return True
            misses[:] = metric_misses(wanted, before, after)
            return None if misses else True

        if wait_until(settled, timeout=METRICS_SETTLE, interval=0.25) is None:
            for m in misses:
                result.fail(m)

    # -- the whole suite --------------------------------------------------------

    def run(self, checks: Sequence[Check], table: LiveTable) -> list[CheckResult]:
        results: dict[str, CheckResult] = {}
        serial = [c for c in checks if c.serial and not c.skip]
        parallel = [c for c in checks if not c.serial or c.skip]
        for check in serial:
            table.running(check)
            result = self.run_check(check)
            results[check.id] = result
            table.done(result)
        pool = ThreadPoolExecutor(max_workers=max(1, self.concurrency), thread_name_prefix="smoke")
        try:
            futures: dict[Future[CheckResult], Check] = {}
            for check in parallel:
                futures[pool.submit(self._run_tracked, check, table)] = check
            for future in as_completed(futures):
                result = future.result()
                results[result.check.id] = result
                table.done(result)
        except BaseException:
            # Ctrl-C: do not wait for checks in flight (the caller removes the server, which ends them)
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        return [results[c.id] for c in checks]

    def _run_tracked(self, check: Check, table: LiveTable) -> CheckResult:
        table.running(check)
        return self.run_check(check)

