"""A serving config against the evaluator's functional gate, before anything is built.

The platform's functional_acceptance module fails a submission on any of its 56 checks; some of them fail
for the serving flags alone, whatever the image does. :func:`serving_risks` names them from a resolved
target (its serving args, its package and the files its steps put in the tree), each with the evaluator check
it breaks and the numbers behind it:

- ``t3_max_tokens_over``: max-model-len above the evaluator's ``max_context_tokens`` (131072 by default): its
  request for ``max_context_tokens + 1`` tokens is answered 200 instead of a 4xx;
- ``t3_max_tokens_max`` / ``t3_max_tokens_mid``: max-model-len too small for ``max_context_tokens - reserve``
  (or ``min(65536, ...)``) tokens plus the prompt: a 400 (the platform's logs: a 100000-token server);
- ``t2_n_2``: max-num-seqs below 2 while the tree's ``serving_chat.py`` refuses ``n > max_num_seqs`` (the
  organisers' deadlock guard): n=2 is a 400;
- ``d03_tool_call`` / ``t5_function_calling``: no tool parser (tool_choice auto is refused);
- ``d07_reasoning_plus_content``: no reasoning parser (the thinking stays inline in the content);
- ``d06_cache_hit``: prefix caching off (no cached_tokens on the second request).

A profile takes a risk on purpose by naming the check in its ``why`` or in the reason of the flag concerned:
the risk is then reported as accepted, not as a warning. ``validate`` and ``plan`` print the warnings (and
refuse them with ``--strict``); a submission preflight calls the same function.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..manifest.model import Step
from ..manifest.resolve import Resolved
from ..steps import OverlaySpec, PatchSpec, ScriptSpec, one_file

#: the evaluator's default context limit (its max_context_tokens parameter; the platform's logs fit it)
EVALUATOR_MAX_CONTEXT_TOKENS = 131072
#: tokens t3's prompt ("Write a short story") takes with a chat template, at most
T3_PROMPT_TOKENS = 64
SERVING_CHAT = "entrypoints/openai/serving_chat.py"
#: the organisers' guard in serving_chat.py: a request whose n exceeds max_num_seqs is refused (code, not a comment)
N_GUARD = re.compile(r"^[^#\n]*\bn\s*>\s*(?:self\.)?[\w.]*max_num_seqs\b", re.MULTILINE)


@dataclass(frozen=True)
class EvaluatorRisk:
    """One evaluator check a serving config makes fail."""

    check: str  # the evaluator's key, e.g. t3_max_tokens_over
    flag: str  # the serving flag that decides it
    message: str  # the check, the numbers, what happens
    accepted: str | None = None  # the profile's words that take the risk, when they name the check

    def line(self, where: str) -> str:
        if self.accepted is not None:
            return f"{where}: accepted evaluator risk {self.check}: {self.message} (said: {self.accepted!r})"
        return f"{where}: evaluator check {self.check} would fail: {self.message}"


@dataclass(frozen=True)
class NGuard:
    """Whether the tree's serving_chat.py refuses n > max_num_seqs: True, False, or None (cannot see it)."""

    kept: bool | None
    where: str


def n_guard_in_tree(resolved: Resolved, environ: Mapping[str, str]) -> NGuard:
    """The n guard as the target's steps leave serving_chat.py, read from host files (no image needed).

    In step order: an overlay of serving_chat.py decides by its source; a patch of it by whether its new text
    (or only its old one) holds the guard; a directory script step carrying a serving_chat.py (the organisers'
    baseline copies theirs over the vendor's) by that file. The package's own file is upstream vLLM's: no guard.
    """
    state = NGuard(False, "the package's own serving_chat.py (upstream vLLM has no n guard)")
    for step in (*resolved.shared_steps, *resolved.profile_steps):
        found = _step_guard(step, environ)
        if found is not None:
            state = found
    return state


def _step_guard(step: Step, environ: Mapping[str, str]) -> NGuard | None:
    written = one_file(step)
    if written is not None and written.endswith(SERVING_CHAT):
        spec = step.spec
        if isinstance(spec, OverlaySpec):
            text = step.source.read_text(errors="replace") if step.source.is_file() else ""
            return NGuard(bool(N_GUARD.search(text)), f"step {step.id} (overlay {spec.source})")
        if isinstance(spec, PatchSpec):
            if N_GUARD.search(spec.new):
                return NGuard(True, f"step {step.id} (its new text)")
            if N_GUARD.search(spec.old):
                return NGuard(False, f"step {step.id} (removes it)")
        return None
    if isinstance(step.spec, ScriptSpec) and step.spec.directory is not None:
        folder = step.directory(environ)
        if folder is None:
            return NGuard(None, f"step {step.id}: its folder's ${{VAR}} is unset")
        candidate = folder / "serving_chat.py"
        if candidate.is_file():
            return NGuard(bool(N_GUARD.search(candidate.read_text(errors="replace"))), f"step {step.id} ({candidate})")
    return None


def _version_below(version: str, major: int, minor: int) -> bool:
    match = re.match(r"(\d+)\.(\d+)", version)
    return match is not None and (int(match.group(1)), int(match.group(2))) < (major, minor)


def _said(resolved: Resolved, check: str, *flags: str) -> str | None:
    """The profile's why, or a reason of one of ``flags``, when it names ``check``."""
    texts: list[str] = []
    if resolved.profile is not None and resolved.profile.why:
        texts.append(resolved.profile.why)
    texts.extend(v.reason for v in resolved.serving if v.key in flags and v.reason)
    return next((t for t in texts if check in t), None)


def serving_risks(resolved: Resolved, environ: Mapping[str, str], *,
                  max_context_tokens: int = EVALUATOR_MAX_CONTEXT_TOKENS) -> list[EvaluatorRisk]:
    """Every evaluator check the resolved serving config makes fail (see the module doc)."""
    args: Mapping[str, Any] = resolved.serving_args()
    risks: list[EvaluatorRisk] = []

    def risk(check: str, flag: str, message: str, *flags: str) -> None:
        risks.append(EvaluatorRisk(check, flag, message, _said(resolved, check, flag, *flags)))

    length = args.get("max-model-len")
    if isinstance(length, int) and not isinstance(length, bool):
        reserve = min(2048, max(1, max_context_tokens // 4))
        if length > max_context_tokens:
            risk("t3_max_tokens_over", "max-model-len",
                 f"max-model-len {length} is above the evaluator's max_context_tokens {max_context_tokens}: its "
                 f"request for {max_context_tokens + 1} tokens is answered 200, not the 4xx it needs")
        for check, tokens in (("t3_max_tokens_max", max_context_tokens - reserve),
                              ("t3_max_tokens_mid", min(65536, max_context_tokens - reserve))):
            if length < tokens + T3_PROMPT_TOKENS:
                risk(check, "max-model-len",
                     f"max-model-len {length} leaves no room for its {tokens} tokens plus a prompt (max_context_tokens "
                     f"{max_context_tokens}): a 400 where the evaluator wants a 200")
    seqs = args.get("max-num-seqs")
    if isinstance(seqs, int) and not isinstance(seqs, bool) and seqs < 2:
        guard = n_guard_in_tree(resolved, environ)
        if guard.kept:
            risk("t2_n_2", "max-num-seqs",
                 f"max-num-seqs {seqs} while serving_chat.py refuses n > max_num_seqs ({guard.where}): n=2 is a 400")
        elif guard.kept is None:
            risk("t2_n_2", "max-num-seqs",
                 f"max-num-seqs {seqs}, and serving_chat.py cannot be read ({guard.where}): if it keeps the "
                 "organisers' n > max_num_seqs guard, n=2 is a 400")
    if not args.get("tool-call-parser") or args.get("enable-auto-tool-choice") is not True:
        for check in ("d03_tool_call", "t5_function_calling"):
            risk(check, "tool-call-parser",
                 "no tool-call-parser with enable-auto-tool-choice: tool_choice auto is refused (400)",
                 "enable-auto-tool-choice")
    if not args.get("reasoning-parser"):
        risk("d07_reasoning_plus_content", "reasoning-parser",
             "no reasoning-parser: the thinking stays inline in the content, never split into its field")
    caching = args.get("enable-prefix-caching")
    default_off = _version_below(resolved.target.package.version, 0, 8)  # vLLM's V0 engine: off unless asked
    if caching is False or (caching is None and default_off):
        risk("d06_cache_hit", "enable-prefix-caching",
             "prefix caching is off" + (f" (vLLM {resolved.target.package.version}'s default)" if caching is None
                                        else "") + ": the second identical request reports no cached_tokens")
    return risks


@dataclass(frozen=True)
class RiskReport:
    """What validate / plan print: warnings (risks not taken on purpose) and notes (accepted ones)."""

    warnings: tuple[str, ...]
    notes: tuple[str, ...]


def report_risks(resolved: list[Resolved] | tuple[Resolved, ...], environ: Mapping[str, str], *,
                 strict: bool = False,
                 max_context_tokens: int = EVALUATOR_MAX_CONTEXT_TOKENS) -> RiskReport:
    """:func:`serving_risks` of each resolved target/profile as lines; ``strict``: a ConfigError (exit 2) naming
    every risk no profile took on purpose."""
    warnings: list[str] = []
    notes: list[str] = []
    for one in resolved:
        where = f"target {one.target.name}, profile {one.profile_name}"
        for item in serving_risks(one, environ, max_context_tokens=max_context_tokens):
            (notes if item.accepted is not None else warnings).append(item.line(where))
    if strict and warnings:
        raise ConfigError(
            f"{len(warnings)} serving value(s) make an evaluator check fail",
            found="\n".join(warnings),
            hint="change the flag, or take the risk on purpose: name the check in the profile's why or in the "
                 "flag's reason",
        )
    return RiskReport(tuple(warnings), tuple(notes))
