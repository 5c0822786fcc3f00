"""``invoke equiv``: serve the image under test and a reference at once, compare them teacher-forced.

The orchestration over the pure core (:mod:`.client`, :mod:`.compare`):

1. resolve the image under test (target + profile + ``--set``) and the reference (``--against``):

   * ``base`` (default): the target's base image, started with the same serving args as
     ``vllm serve`` flags (``invoke run --base`` style): nothing patched, the same config;
   * a PROFILE of the target: that profile's image (built or reused);
   * anything else is an IMAGE (tag or ID): started with the under-test serving args as flags,
     so only the image differs, never the config;

2. both sides get ``dtype`` = the ``equiv:`` block's dtype (``--dtype`` wins; default float32) as a
   serving value, so they compute in the same precision (the image under test gets a new
   serving-config layer only, tagged in ``<image>-equiv``: the target's own tags never move);
3. both servers start at once on distinct free ports (each started once), the reference's
   evidence is collected first, then the candidate scores exactly the same token ids;
4. the comparison is gated with the manifest's tolerance for that dtype; ``equiv.txt``,
   ``equiv.json`` and both evidences are written under ``.imageforge/runs/<run id>/``; a failed
   gate raises :class:`~imageforge.equiv.compare.EquivError` (exit 4).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from ..docker_engine import image_or_none
from ..errors import ConfigError
from ..manifest.resolve import Value, resolve
from ..manifest.tolerances import DTYPES, Dtype, EquivSettings, Tolerance
from ..rundirs import new_run_id
from .client import EquivClient, collect_against, collect_reference
from .compare import Verdict, compare, gate
from .evidence import Evidence
from .record import Record, is_record_path, load_record, make_record, write_record

if TYPE_CHECKING:
    from ..manifest.resolve import Resolved
    from ..serve.runtime import Prepared, Runtime

Log = Callable[[str], None]
EQUIV_SOURCE = "cli:equiv"  # provenance of the dtype both servers get (a variant: never the profile's tags)


# --------------------------------------------------------------------------- resolved values


def with_serving_value(resolved: Resolved, key: str, value: Any, *, source: str = EQUIV_SOURCE) -> Resolved:
    """``resolved`` with one serving argument replaced or added (any target, even one without ``key``)."""
    values = list(resolved.serving)
    for i, v in enumerate(values):
        if v.key == key:
            if v.value == value:
                return resolved
            values[i] = Value(key, value, source, v.default, v.reason)
            break
    else:
        values.append(Value(key, value, source, None, "equiv: both servers compute in the same dtype"))
    return dataclasses.replace(resolved, serving=tuple(values))


def renamed(resolved: Resolved, suffix: str) -> Resolved:
    """``resolved`` whose images are tagged in ``<image>-<suffix>`` (cache keys ignore the name)."""
    target = dataclasses.replace(resolved.target, image=f"{resolved.target.image}-{suffix}")
    return dataclasses.replace(resolved, target=target)


def check_dtype(dtype: str) -> Dtype:
    if dtype not in DTYPES:
        raise ConfigError(f"equiv: unknown dtype {dtype!r}", expected=" or ".join(DTYPES), found=repr(dtype),
                          hint="float32 (default) gates on the max; bfloat16 on mean, p95 and top-1")
    return dtype


def check_fits(resolved: Resolved, settings: EquivSettings, dtype: Dtype) -> None:
    """Refuse a dtype whose weights alone exceed the devices (``equiv.memory``), with the arithmetic."""
    why = settings.fits(dtype)
    if why is not None:
        other = next((d for d in DTYPES if d != dtype and settings.fits(d) is None), None)
        raise ConfigError(f"equiv: {resolved.target.name} cannot be served in {dtype} for the comparison",
                          found=why, key_path=f"targets.{resolved.target.name}.equiv.memory",
                          hint=f"compare in {other} (--dtype {other}; its gate is mean, p95 and top-1)" if other
                          else "no dtype fits: check equiv.memory")


def served_dtype(resolved: Resolved) -> Dtype | None:
    """The tolerance dtype the servers of ``resolved`` compute in, when it is one equiv has a gate for."""
    raw = str(resolved.serving_args().get("dtype", "")).lower()
    return {"float32": "float32", "float": "float32", "bfloat16": "bfloat16"}.get(raw)  # type: ignore[return-value]


# --------------------------------------------------------------------------- the two sides


@dataclass(frozen=True)
class Side:
    """How one server of the pair is started."""

    label: str  # "image under test", "base image", "profile NAME", "image REF"
    resolved: Resolved
    base: bool = False  # run the image with the serving args as `vllm serve` flags
    image: str | None = None  # an explicit image (None: build or reuse ``resolved``)


def sides(resolved: Resolved, against: str, *, dtype: Dtype, sets: Sequence[str] = (),
          environ: Mapping[str, str] | None = None) -> tuple[Side, Side]:
    """(candidate, reference) for ``against`` = ``base`` | a profile of the target | an image."""
    environ = os.environ if environ is None else environ
    cand = Side(f"{resolved.target.name}:{resolved.profile_name}",
                renamed(with_serving_value(resolved, "dtype", dtype), "equiv"))
    against = against or "base"
    if against == "base":
        return cand, Side("base image (serving config only)", cand.resolved, base=True)
    if against in resolved.target.profiles:
        other = resolve(resolved.manifest, resolved.target.name, against, environ=environ, sets=sets)
        if other.profile_name == resolved.profile_name:
            raise ConfigError(f"equiv: --against {against} is the profile under test",
                              hint="compare against base, another profile or an image")
        return cand, Side(f"profile {against}", renamed(with_serving_value(other, "dtype", dtype), "equiv"))
    if image_or_none(against) is None:
        raise ConfigError(
            f"equiv: --against {against!r} is neither 'base', a profile of {resolved.target.name!r} nor an image",
            expected="base, one of " + ", ".join(resolved.target.profiles) + ", or an image tag/ID on the daemon",
            found=repr(against),
        )
    return cand, Side(f"image {against}", cand.resolved, base=True, image=against)


# --------------------------------------------------------------------------- comparing two running servers


@dataclass(frozen=True)
class EquivRun:
    verdict: Verdict
    reference: Evidence
    candidate: Evidence
    run_dir: Path | None
    labels: tuple[str, str] = ("candidate", "reference")

    def text(self) -> str:
        return (f"candidate: {self.labels[0]} ({self.verdict.comparison.candidate})\n"
                f"reference: {self.labels[1]} ({self.verdict.comparison.reference})\n" + self.verdict.text())

    def to_json(self) -> dict[str, Any]:
        return {"candidate_label": self.labels[0], "reference_label": self.labels[1], **self.verdict.to_json(),
                "run_dir": None if self.run_dir is None else str(self.run_dir)}

    def write(self, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "equiv.txt").write_text(self.text() + "\n")
        (run_dir / "equiv.json").write_text(json.dumps(self.to_json(), indent=2) + "\n")
        (run_dir / "evidence-reference.json").write_text(json.dumps(self.reference.to_json()) + "\n")
        (run_dir / "evidence-candidate.json").write_text(json.dumps(self.candidate.to_json()) + "\n")


def compare_urls(reference_url: str, candidate_url: str, settings: EquivSettings, dtype: Dtype | None, *,
                 labels: tuple[str, str] = ("candidate", "reference"), run_dir: Path | None = None) -> EquivRun:
    """Collect both evidences (reference first), compare and gate (``dtype`` None: report only)."""
    ref = collect_reference(reference_url, settings.prompts, top_k=settings.top_k,
                            greedy_tokens=settings.greedy_tokens)
    cand = collect_against(candidate_url, ref)
    tolerance = settings.tolerance(dtype) if dtype is not None else Tolerance()
    verdict = gate(compare(ref, cand), tolerance, dtype or "unknown dtype (no gate)")
    result = EquivRun(verdict, ref, cand, run_dir, labels)
    if run_dir is not None:
        result.write(run_dir)
    return result


def equiv_target(resolved: Resolved, runtime: Runtime, *, against: str = "base", dtype: str | None = None,
                 settings: EquivSettings | None = None, sets: Sequence[str] = (),
                 environ: Mapping[str, str] | None = None, echo: Log = print,
                 startup_timeout: float | None = None, host_address: str | None = None) -> EquivRun:
    """Prepare what is needed (``runtime``: one that serves several servers at once), serve both sides at once,
    compare, write the reports; never raises on a gate."""
    environ = os.environ if environ is None else environ
    settings = settings or resolved.target.equiv
    chosen = check_dtype(dtype or settings.dtype)
    check_fits(resolved, settings, chosen)
    candidate, reference = sides(resolved, against, dtype=chosen, sets=sets, environ=environ)
    run_id = new_run_id()
    run_dir = resolved.manifest.root / ".imageforge" / "runs" / run_id
    echo(f"equiv {candidate.label} vs {reference.label}: {len(settings.prompts)} prompts, top-{settings.top_k}, "
         f"{settings.greedy_tokens} greedy tokens, both in {chosen}  run {run_id}")
    built = runtime.prepare(candidate.resolved, environ=environ, log=echo, pin=True)
    if reference.base or reference.image is not None:
        ref_prepared = runtime.prepare(reference.resolved, environ=environ, log=echo, base=reference.base,
                                       image=reference.image)
    else:
        ref_prepared = runtime.prepare(reference.resolved, environ=environ, log=echo, pin=True)
    with runtime.serving_together([(reference.resolved, ref_prepared, f"{run_id}-ref"),
                                   (candidate.resolved, built, f"{run_id}-cand")], environ=environ, log=echo,
                                  startup_timeout=startup_timeout, host_address=host_address) as (ref, cand):
        result = compare_urls(ref.url, cand.url, settings, chosen, labels=(candidate.label, reference.label),
                              run_dir=run_dir)
    echo(result.text())
    echo(f"reports: {run_dir / 'equiv.txt'}, {run_dir / 'equiv.json'}")
    return result


# --------------------------------------------------------------------------- one server at a time


def required_resolved(resolved: Resolved) -> Resolved:
    """``resolved`` with only its ``required: true`` steps and what they require (in-place equiv's reference)."""
    by_id = {s.id: s for s in resolved.steps}
    wanted: set[str] = set()
    todo = [s.id for s in resolved.steps if s.required]
    while todo:
        ident = todo.pop()
        if ident in wanted or ident not in by_id:
            continue
        wanted.add(ident)
        todo.extend(by_id[ident].requires)
    return dataclasses.replace(resolved, shared_steps=tuple(s for s in resolved.shared_steps if s.id in wanted),
                               profile_steps=tuple(s for s in resolved.profile_steps if s.id in wanted))


def _prepare_side(runtime: Runtime, side: Side, environ: Mapping[str, str], echo: Log) -> Prepared:
    """What ``side`` serves: its image as given, the base (serving config only), or its steps (built, or applied
    in place)."""
    return runtime.prepare(side.resolved, environ=environ, log=echo, base=side.base, image=side.image, pin=True)


def record_reference(resolved: Resolved, path: Path, runtime: Runtime, *, against: str = "base",
                     dtype: str | None = None, settings: EquivSettings | None = None, sets: Sequence[str] = (),
                     environ: Mapping[str, str] | None = None, echo: Log = print, startup_timeout: float | None = None,
                     host_address: str | None = None, reference: Side | None = None) -> Record:
    """``equiv --record FILE``: serve the reference alone, collect its evidence, write the record.

    The reference: ``reference``, else the one ``--against`` names (default the base with the serving config).
    """
    environ = os.environ if environ is None else environ
    settings = settings or resolved.target.equiv
    chosen = check_dtype(dtype or settings.dtype)
    check_fits(resolved, settings, chosen)
    if reference is None:
        reference = sides(resolved, against, dtype=chosen, sets=sets, environ=environ)[1]
    echo(f"equiv --record {path}: {reference.label}, {len(settings.prompts)} prompts, top-{settings.top_k}, "
         f"{settings.greedy_tokens} greedy tokens, in {chosen}")
    prepared = _prepare_side(runtime, reference, environ, echo)
    with runtime.serving(reference.resolved, prepared, environ=environ, log=echo, run_id=new_run_id() + "-ref",
                         startup_timeout=startup_timeout, host_address=host_address) as server:
        evidence = collect_reference(server.url, settings.prompts, top_k=settings.top_k,
                                     greedy_tokens=settings.greedy_tokens)
        served = runtime.identity(server, prepared)
    record = make_record(evidence, settings, chosen, served=served, label=reference.label,
                         target=resolved.target.name,
                         profile="base" if reference.base else reference.resolved.profile_name,
                         flags=reference.resolved.serving_args(), env=reference.resolved.serving_env())
    write_record(record, path)
    echo(f"recorded {len(evidence.prompts)} prompts of {served} to {path}")
    return record


#: What a running server says about itself at ``/v1/models`` (vLLM's entry keys), kept as the record's flags.
REPORTED_FLAGS = (("served-model-name", "id"), ("model", "root"), ("max-model-len", "max_model_len"))


def record_running(resolved: Resolved, path: Path, url: str, *, dtype: str | None = None,
                   settings: EquivSettings | None = None, echo: Log = print,
                   transport: httpx.BaseTransport | None = None) -> Record:
    """``equiv --record FILE --url URL``: record the reference from a server that is already running.

    Nothing is applied, started or stopped (on the card a start costs minutes). The record says what it read:
    ``served`` is the URL and the model the server names at ``/v1/models``; ``flags`` only what the server
    reports there (its model path, name and max-model-len); ``profile`` and ``env`` stay empty (unknown). Its
    dtype cannot be read over HTTP: the record is in ``dtype`` (``--dtype``, else the target's equiv.dtype) as
    stated, and ``--against FILE`` serves the candidate in it; a server computing in another dtype shows up as a
    failed gate, never as a pass.
    """
    settings = settings or resolved.target.equiv
    chosen = check_dtype(dtype or settings.dtype)
    check_fits(resolved, settings, chosen)
    echo(f"equiv --record {path}: the running server at {url} (nothing started or stopped), "
         f"{len(settings.prompts)} prompts, top-{settings.top_k}, {settings.greedy_tokens} greedy tokens, "
         f"recorded as {chosen}: its dtype is not visible over HTTP, it must compute in {chosen}")
    with EquivClient(url, transport=transport) as client:
        entry = client.model_entry()
    evidence = collect_reference(url, settings.prompts, top_k=settings.top_k, greedy_tokens=settings.greedy_tokens,
                                 transport=transport, model=str(entry["id"]))
    served = f"{url} serving {evidence.model} (/v1/models)"
    reported = {flag: entry[key] for flag, key in REPORTED_FLAGS if entry.get(key) is not None}
    record = make_record(evidence, settings, chosen, served=served,
                         label=f"running server (--url; not started by imageforge, {chosen} as stated)",
                         target=resolved.target.name, profile="", flags=reported, env={})
    write_record(record, path)
    echo(f"recorded {len(evidence.prompts)} prompts of {served} to {path}")
    return record


def against_record(resolved: Resolved, record: Record, runtime: Runtime, *, dtype: str | None = None,
                   environ: Mapping[str, str] | None = None, echo: Log = print, startup_timeout: float | None = None,
                   host_address: str | None = None, where: str = "") -> EquivRun:
    """``equiv --against FILE``: serve the candidate alone, score the recorded sequences, gate in the record's dtype."""
    environ = os.environ if environ is None else environ
    if dtype and dtype != record.dtype:
        raise ConfigError(f"equiv: the record was served in {record.dtype}, --dtype says {dtype}",
                          hint=f"drop --dtype (the candidate is served in {record.dtype}), or record again")
    if record.target and record.target != resolved.target.name:
        raise ConfigError(f"equiv: the record is of target {record.target!r}, not {resolved.target.name!r}",
                          found=record.describe())
    settings = record.settings(resolved.target.equiv)
    check_fits(resolved, settings, record.dtype)
    candidate = Side(f"{resolved.target.name}:{resolved.profile_name}",
                     renamed(with_serving_value(resolved, "dtype", record.dtype), "equiv"))
    run_id = new_run_id()
    run_dir = resolved.manifest.root / ".imageforge" / "runs" / run_id
    echo(f"equiv {candidate.label} vs {record.describe()}: {len(record.evidence.prompts)} prompts, "
         f"top-{record.top_k}, in {record.dtype}  run {run_id}")
    prepared = _prepare_side(runtime, candidate, environ, echo)
    with runtime.serving(candidate.resolved, prepared, environ=environ, log=echo, run_id=run_id,
                         startup_timeout=startup_timeout, host_address=host_address) as server:
        cand = collect_against(server.url, record.evidence)
    verdict = gate(compare(record.evidence, cand), settings.tolerance(record.dtype), record.dtype)
    result = EquivRun(verdict, record.evidence, cand, run_dir,
                      (candidate.label, f"{where or 'record'}: {record.describe()}"))
    result.write(run_dir)
    echo(result.text())
    echo(f"reports: {run_dir / 'equiv.txt'}, {run_dir / 'equiv.json'}")
    return result


def equiv_one_at_a_time(resolved: Resolved, runtime: Runtime, *, record: Path | None = None,
                        against: Path | None = None, dtype: str | None = None, settings: EquivSettings | None = None,
                        environ: Mapping[str, str] | None = None, echo: Log = print,
                        host_address: str | None = None) -> EquivRun | None:
    """``equiv --in-place``: one server at a time (``runtime``), what it prepared put back at the end.

    * ``record`` only: the reference (the ``required: true`` steps applied: bi100's organisers' baseline; none
      on cpu: the root as installed) served and recorded; None returned;
    * ``against`` only: the candidate (TARGET:PROFILE applied) compared with that record;
    * neither: both, the record kept in the run directory (two server starts).
    """
    environ = os.environ if environ is None else environ
    settings = settings or resolved.target.equiv
    chosen = check_dtype(dtype or settings.dtype)
    check_fits(resolved, settings, chosen)
    starts = (1 if against is None else 0) + (1 if record is None or against is None else 0)
    if record is not None and against is not None:
        raise ConfigError("equiv: --record FILE and --against FILE are two commands")
    echo(f"equiv {runtime.where}: {starts} server start(s), one at a time")
    with runtime.restoring(resolved.manifest, environ=environ, log=echo):
        if against is None:
            reference = required_resolved(resolved)
            names = ", ".join(s.id for s in reference.steps) or "none: the root as installed"
            path = record or resolved.manifest.root / ".imageforge" / "runs" / new_run_id() / "reference.json"
            kept = record_reference(
                resolved, path, runtime, dtype=chosen, settings=settings, environ=environ, echo=echo,
                host_address=host_address,
                reference=Side(f"required steps ({names})", with_serving_value(reference, "dtype", chosen)))
            if record is not None:
                return None
        else:
            kept = load_record(against)
        return against_record(resolved, kept, runtime, dtype=None if against is None else dtype, environ=environ,
                              echo=echo, host_address=host_address,
                              where=str(against) if against is not None else "reference")


def settings_from_cli(settings: EquivSettings, *, top_k: int = 0, greedy_tokens: int = 0,
                      prompts: int = 0) -> EquivSettings:
    """The target's settings with CLI overrides (0: keep); ``prompts`` N keeps the first N prompts."""
    if top_k < 0 or greedy_tokens < 0 or prompts < 0:
        raise ConfigError("equiv: --top-k, --greedy-tokens and --prompts must be >= 0")
    return dataclasses.replace(
        settings,
        top_k=top_k or settings.top_k,
        greedy_tokens=greedy_tokens or settings.greedy_tokens,
        prompts=settings.prompts[:prompts] if prompts else settings.prompts,
    )


def equiv_command(resolved: Resolved, runtime: Runtime | None, *, against: str = "base", dtype: str = "",
                  top_k: int = 0, greedy_tokens: int = 0, prompts: int = 0, record: str = "", url: str = "",
                  sets: Sequence[str] = (), environ: Mapping[str, str] | None = None, echo: Log = print,
                  host_address: str | None = None) -> EquivRun | None:
    """`equiv`'s choice of what to serve and compare, from its options (the front door's
    :func:`imageforge.app.equiv`): ``record`` FILE serves only the reference and writes its evidence (None), with
    ``url`` the server already running there (``runtime`` None: nothing applied, started or stopped); ``against``
    FILE compares with a record; a ``one_at_a_time`` runtime serves one server after the other
    (:func:`equiv_one_at_a_time`); else both sides at once (:func:`equiv_target`)."""
    chosen = settings_from_cli(resolved.target.equiv, top_k=top_k, greedy_tokens=greedy_tokens, prompts=prompts)
    file_against = bool(against) and is_record_path(against)
    if record and file_against:
        raise ConfigError("equiv: --record FILE writes a reference; --against FILE compares with one",
                          hint="record first, then compare with --against FILE")
    if file_against and (top_k or greedy_tokens or prompts):
        raise ConfigError("equiv --against FILE compares on the recorded prompts: --top-k, --greedy-tokens and "
                          "--prompts do not apply")
    if url or runtime is None:
        record_running(resolved, Path(record), url, dtype=dtype or None, settings=chosen, echo=echo)
        return None
    common: dict[str, Any] = {"dtype": dtype or None, "environ": environ, "echo": echo, "host_address": host_address}
    if runtime.one_at_a_time:
        if against not in ("", "base") and not file_against:
            raise ConfigError(f"equiv --in-place: the reference is the required steps applied, not {against!r}",
                              hint="--against FILE (a record) or leave --against out")
        return equiv_one_at_a_time(resolved, runtime, record=Path(record) if record else None,
                                   against=Path(against) if file_against else None, settings=chosen, **common)
    if record:
        record_reference(resolved, Path(record), runtime, against=against or "base", settings=chosen, sets=sets,
                         **common)
        return None
    if file_against:
        return against_record(resolved, load_record(Path(against)), runtime, where=against, **common)
    return equiv_target(resolved, runtime, against=against or "base", settings=chosen, sets=sets, **common)


__all__ = [
    "EquivRun",
    "Side",
    "against_record",
    "check_dtype",
    "check_fits",
    "compare_urls",
    "equiv_command",
    "equiv_one_at_a_time",
    "equiv_target",
    "load_record",
    "record_reference",
    "record_running",
    "renamed",
    "required_resolved",
    "served_dtype",
    "settings_from_cli",
    "sides",
    "with_serving_value",
]


def refuse_url_options(record: str, against: str, profile: str | None, sets: Sequence[str],
                       runtime: Runtime | None) -> None:
    """`equiv --url`: only with --record FILE, and nothing that would pick, apply or start what is served."""
    if not record:
        raise ConfigError("equiv --url reads a running server: only --record FILE takes it",
                          hint="equiv --record FILE --url URL, then equiv --against FILE (serves the candidate)")
    if runtime is not None and runtime.one_at_a_time:
        raise ConfigError("equiv --record --url records the server already running: --in-place would apply and "
                          "start one", hint="drop --in-place (nothing is applied, started or stopped with --url), "
                          "or drop --url to serve the reference in place")
    if against not in ("", "base"):
        raise ConfigError(f"equiv --record --url: the reference is the server at --url, not --against {against!r}",
                          hint="drop --against")
    if profile or sets:
        raise ConfigError("equiv --record --url records the server as it runs: --profile and --set pick what is "
                          "served", hint="drop them; --target names the prompts, top-k and dtype recorded")
