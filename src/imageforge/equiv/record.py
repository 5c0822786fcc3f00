"""equiv one server at a time: a reference's evidence kept in a file, compared later with a candidate.

``invoke equiv --record FILE`` serves the reference and writes :class:`Record` (what was served -- an image ID or
the in-place journal digest, or with ``--url URL`` a server already running: that URL and the model it names --,
its serving flags and env, the dtype, the settings, and the teacher-forced evidence: prompts, token ids, top-k
logprobs, greedy continuations); ``invoke equiv --against FILE`` serves only
the candidate, scores exactly the recorded sequences and gates the comparison in the record's dtype.  On the
card's machine one server at a time is all there is (a start costs minutes and the cards hold one model).

File format (JSON, one object; ``format`` is checked on load)::

    {"format": "imageforge-equiv-record/1", "recorded_at": "...Z", "label": "base image (serving config only)",
     "target": "cpu", "profile": "conservative", "served": "sha256:..." | "in place: / (journal sha256:...)"
     | "http://127.0.0.1:8000 serving MODEL (/v1/models)" (--url: flags are what /v1/models reports, profile ""),
     "dtype": "float32", "flags": {...serving args...}, "env": {...serving env...},
     "settings": {"top_k": 5, "greedy_tokens": 16, "prompts": [...]},
     "evidence": {...Evidence.to_json()...}}
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..manifest.tolerances import DTYPES, Dtype, EquivSettings
from .evidence import Evidence

FORMAT = "imageforge-equiv-record/1"


@dataclass(frozen=True)
class Record:
    """A reference server's evidence and what it was."""

    evidence: Evidence
    dtype: Dtype
    top_k: int
    greedy_tokens: int
    prompts: tuple[str, ...]
    served: str  # image ID, the in-place journal digest, or a running server's URL and model (--url)
    label: str
    target: str
    profile: str
    flags: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    recorded_at: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "recorded_at": self.recorded_at, "label": self.label, "target": self.target,
            "profile": self.profile, "served": self.served, "dtype": self.dtype, "flags": dict(self.flags),
            "env": dict(self.env),
            "settings": {"top_k": self.top_k, "greedy_tokens": self.greedy_tokens, "prompts": list(self.prompts)},
            "evidence": self.evidence.to_json(),
        }

    @staticmethod
    def from_json(data: Mapping[str, Any], *, where: str = "the record") -> Record:
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, Mapping) else type(data).__name__
            raise ConfigError(f"{where} is not an equiv record", expected=f"format {FORMAT!r}", found=repr(found),
                              hint="write one with `invoke equiv --record FILE`")
        dtype = data.get("dtype")
        if dtype not in DTYPES:
            raise ConfigError(f"{where}: unknown dtype", expected=" or ".join(DTYPES), found=repr(dtype))
        try:
            settings = data["settings"]
            return Record(
                evidence=Evidence.from_json(data["evidence"]), dtype=dtype, top_k=int(settings["top_k"]),
                greedy_tokens=int(settings["greedy_tokens"]), prompts=tuple(str(p) for p in settings["prompts"]),
                served=str(data["served"]), label=str(data.get("label", "")), target=str(data.get("target", "")),
                profile=str(data.get("profile", "")), flags=dict(data.get("flags") or {}),
                env={str(k): str(v) for k, v in (data.get("env") or {}).items()},
                recorded_at=str(data.get("recorded_at", "")))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{where} is incomplete", found=f"{type(exc).__name__}: {exc}",
                              hint="record it again with `invoke equiv --record FILE`") from None

    def settings(self, base: EquivSettings) -> EquivSettings:
        """``base`` (the target's block: its tolerances) with the recorded prompts, top-k and greedy length."""
        return dataclasses.replace(base, dtype=self.dtype, top_k=self.top_k, greedy_tokens=self.greedy_tokens,
                                   prompts=self.prompts)

    def describe(self) -> str:
        return f"record of {self.label or self.target} ({self.served}, {self.dtype}, recorded {self.recorded_at})"


def make_record(evidence: Evidence, settings: EquivSettings, dtype: Dtype, *, served: str, label: str,
                target: str, profile: str, flags: Mapping[str, Any], env: Mapping[str, str]) -> Record:
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return Record(evidence, dtype, settings.top_k, settings.greedy_tokens, tuple(str(p) for p in settings.prompts),
                  served, label, target, profile, dict(flags), dict(env), now)


def write_record(record: Record, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record.to_json()) + "\n")
    tmp.replace(path)
    return path


def load_record(path: Path) -> Record:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"equiv --against {path}: no such record", hint="write it with `invoke equiv --record "
                          f"{path}` first") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"equiv --against {path}: cannot read it as JSON", found=str(exc)) from None
    return Record.from_json(data, where=str(path))


def is_record_path(against: str) -> bool:
    """``--against`` names a record file (an existing file, or a ``.json`` name), not base/a profile/an image."""
    return against.endswith(".json") or (("/" in against or "." in against) and Path(against).is_file())


__all__ = ["FORMAT", "Record", "is_record_path", "load_record", "make_record", "write_record"]
