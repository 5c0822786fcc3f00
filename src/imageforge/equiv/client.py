"""Collect teacher-forced evidence from an OpenAI-compatible vLLM server over httpx.

Per prompt, three kinds of request (all ``temperature: 0``):

1. ``POST /tokenize`` (text prompts only; token-id prompts skip it), ``add_special_tokens: false``;
2. ``POST /v1/completions`` with the prompt ids, ``max_tokens: N``, ``ignore_eos``: the greedy
   continuation, as token ids (``return_token_ids``; ``return_tokens_as_token_ids`` as fallback);
3. ``POST /v1/completions`` with the teacher-forced sequence, ``max_tokens: 1`` and
   ``prompt_logprobs: K``: vLLM returns, per token after the first, the top-K of the
   distribution before it plus that token (``[None, {"id": {"logprob", "rank", ...}}, ...]``).

The REFERENCE is collected first (:func:`collect_reference`): its teacher-forced sequence is the
prompt plus its own greedy continuation, so the comparison covers generated text too.  The
candidate (:func:`collect_against`) scores exactly those ids and makes its own greedy
continuation of the same prompt ids.

How ``invoke equiv`` is wired (tasks/app): resolve the image under test and the reference
(default: the target's base with only the serving config), apply ``settings.serving_overrides()``
(``dtype``) to both, start both servers at once on distinct ports (``imageforge.serve.container``), then
``ref = collect_reference(ref_url, settings.prompts, top_k=..., greedy_tokens=...)``,
``cand = collect_against(cand_url, ref)``, ``verdict = gate(compare(ref, cand), settings.tolerance(),
settings.dtype)``; write ``verdict.to_json()`` and both evidences under the run directory, print
``verdict.text()``, then ``raise_if_failed(verdict)`` (exit 4).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import httpx

from ..errors import SmokeError
from .evidence import Evidence, Position, PromptEvidence


class EquivClient:
    """Synchronous httpx client of one server (``transport`` replaces the network in tests)."""

    def __init__(self, url: str, *, timeout: float = 300.0, transport: httpx.BaseTransport | None = None) -> None:
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, timeout=httpx.Timeout(timeout, connect=10.0), transport=transport)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> EquivClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- HTTP ------------------------------------------------------------------

    def _post(self, path: str, body: Mapping[str, Any]) -> Any:
        try:
            response = self.http.post(path, json=dict(body))
        except httpx.HTTPError as exc:
            raise SmokeError(f"equiv: {self.url}{path} did not answer", found=f"{type(exc).__name__}: {exc}",
                             hint="is the server up? `invoke run` prints its URL") from exc
        if response.status_code != 200:
            raise SmokeError(f"equiv: {self.url}{path} answered {response.status_code}",
                             expected="200", found=response.text[:400])
        try:
            return response.json()
        except ValueError as exc:
            raise SmokeError(f"equiv: {self.url}{path} did not answer JSON", found=response.text[:200]) from exc

    def model_entry(self) -> dict[str, Any]:
        """The first entry of ``GET /v1/models`` (``id``, and from vLLM ``root``, ``max_model_len``, ...)."""
        try:
            response = self.http.get("/v1/models")
            response.raise_for_status()
            entry = response.json()["data"][0]
            if not isinstance(entry, dict) or "id" not in entry:
                raise KeyError("id")
            return entry
        except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
            raise SmokeError(f"equiv: {self.url}/v1/models gave no model", found=str(exc)) from exc

    def model(self) -> str:
        """The first served model name (``GET /v1/models``)."""
        return str(self.model_entry()["id"])

    def tokenize(self, model: str, text: str) -> list[int]:
        data = self._post("/tokenize", {"model": model, "prompt": text, "add_special_tokens": False})
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(tokens, list) or not tokens:
            raise SmokeError(f"equiv: /tokenize returned no tokens for {text[:40]!r}", found=str(data)[:200])
        return [int(t) for t in tokens]

    def greedy(self, model: str, ids: Sequence[int], n: int) -> list[int]:
        """The server's greedy continuation of ``ids``: exactly ``n`` token ids (EOS ignored)."""
        if n <= 0:
            return []
        data = self._post("/v1/completions", {
            "model": model, "prompt": list(ids), "max_tokens": n, "temperature": 0.0, "ignore_eos": True,
            "logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True,
        })
        choice = _choice(data, "greedy continuation")
        if isinstance(choice.get("token_ids"), list):
            tokens = [int(t) for t in choice["token_ids"]]
        else:
            tokens = _ids_of_tokens((choice.get("logprobs") or {}).get("tokens"))
        if len(tokens) != n:
            raise SmokeError("equiv: the greedy continuation has the wrong length",
                             expected=f"{n} token ids", found=f"{len(tokens)}: {str(choice)[:200]}")
        return tokens

    def prompt_logprobs(self, model: str, ids: Sequence[int], k: int) -> list[Position]:
        """One Position per token after the first of ``ids`` (teacher-forced top-``k``)."""
        data = self._post("/v1/completions", {
            "model": model, "prompt": list(ids), "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": k,
        })
        raw = _choice(data, "prompt logprobs").get("prompt_logprobs")
        if raw is None:
            raw = data.get("prompt_logprobs") if isinstance(data, dict) else None
        if not isinstance(raw, list) or len(raw) != len(ids):
            raise SmokeError("equiv: the server returned no usable prompt_logprobs",
                             expected=f"a list of {len(ids)} entries (the first null)",
                             found=str(raw)[:200], hint="vLLM answers prompt_logprobs on /v1/completions")
        out: list[Position] = []
        for i, entry in enumerate(raw[1:], start=1):
            if not isinstance(entry, dict) or not entry:
                raise SmokeError(f"equiv: prompt_logprobs entry {i} is empty", found=str(entry)[:200])
            entries = {int(t): (float(e["logprob"]), None if e.get("rank") is None else int(e["rank"]))
                       for t, e in entry.items()}
            if ids[i] not in entries:
                raise SmokeError(f"equiv: prompt_logprobs entry {i} lacks the prompt's own token {ids[i]}",
                                 found=str(sorted(entries))[:200])
            out.append(Position(int(ids[i]), MappingProxyType(entries)))
        return out


def _choice(data: Any, what: str) -> dict[str, Any]:
    try:
        choice = data["choices"][0]
    except (KeyError, IndexError, TypeError) as exc:
        raise SmokeError(f"equiv: the {what} response has no choice", found=str(data)[:200]) from exc
    if not isinstance(choice, dict):
        raise SmokeError(f"equiv: the {what} response has no choice", found=str(data)[:200])
    return choice


def _ids_of_tokens(tokens: Any) -> list[int]:
    """``["token_id:42", ...]`` (``return_tokens_as_token_ids``) -> ``[42, ...]``."""
    if not isinstance(tokens, list):
        return []
    out = []
    for token in tokens:
        if not isinstance(token, str) or not token.startswith("token_id:"):
            raise SmokeError("equiv: the server did not return token ids", found=repr(token)[:80],
                             hint="needs a vLLM that knows return_token_ids or return_tokens_as_token_ids")
        out.append(int(token.split(":", 1)[1]))
    return out


def collect_reference(url: str, prompts: Sequence[str | Sequence[int]], *, top_k: int, greedy_tokens: int,
                      transport: httpx.BaseTransport | None = None, model: str | None = None) -> Evidence:
    """The reference server's evidence; its sequences are prompt + its own greedy continuation.

    ``model``: the served name when the caller has read ``/v1/models`` already (else it is read here)."""
    with EquivClient(url, transport=transport) as client:
        model = model or client.model()
        out: list[PromptEvidence] = []
        for i, prompt in enumerate(prompts):
            text = prompt if isinstance(prompt, str) else None
            ids = client.tokenize(model, prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
            greedy = client.greedy(model, ids, greedy_tokens)
            sequence = ids + greedy
            if len(sequence) < 2:
                raise SmokeError(f"equiv: prompt {i} is one token long and has no continuation",
                                 hint="use a longer prompt or greedy_tokens >= 1")
            positions = client.prompt_logprobs(model, sequence, top_k)
            out.append(PromptEvidence(f"p{i}", tuple(ids), tuple(sequence), tuple(positions), tuple(greedy), text))
        return Evidence(url, model, top_k, tuple(out))


def collect_against(url: str, reference: Evidence, *, transport: httpx.BaseTransport | None = None) -> Evidence:
    """The candidate's evidence on the reference's exact sequences (and its own greedy continuations)."""
    with EquivClient(url, transport=transport) as client:
        model = client.model()
        out: list[PromptEvidence] = []
        for ref in reference.prompts:
            greedy = client.greedy(model, ref.prompt_ids, len(ref.greedy))
            positions = client.prompt_logprobs(model, ref.sequence, reference.top_k)
            out.append(PromptEvidence(ref.name, ref.prompt_ids, ref.sequence, tuple(positions), tuple(greedy),
                                      ref.text))
        return Evidence(url, model, reference.top_k, tuple(out))
