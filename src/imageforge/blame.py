"""Which step of a plan wrote the file a Python traceback goes through.

A build imports ``verify.imports`` only with ``--verify-imports``; otherwise the first server start proves them. Both
name the step that broke an import the same way, from the traceback:

* :func:`tracebacks` finds every traceback in a log, whatever prefix vLLM's logger or its engine process put before
  each line (``(EngineCore pid=26) ERROR 12-03 10:00:00 [core.py:708]``: the ``Traceback`` line's prefix is taken
  off the lines that follow it), with its frames (and the source line under each) and its closing exception line;
* :func:`writers` says which steps write a file: a patch's ``file``, an overlay's ``dest``, a symlink's link, what a
  script declares it ``touches:`` -- each kind's own ``touches``, read without the image's site directory (a step
  path relative to the site matches a frame path ending in it);
* :func:`diagnose` picks the innermost frame that a step wrote (of several patches to one file, the one whose new
  text holds the failing line), in the first such traceback, else the first traceback's innermost frame inside the
  package: a :class:`Blame` (``NameError in vllm/x.py line 12, written by step 'ID' (patch)``).

Used by :mod:`imageforge.verify` (a failed import of ``--verify-imports``) and :mod:`imageforge.serve.startfail` (a
server that died before ``/health``). Pure: no Docker, no process.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .manifest.model import Step
from .steps import kind

TRACEBACK = "Traceback (most recent call last):"
FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+)(?:, in (?P<function>.+))?\s*$')
EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::(?P<message>.*))?$")
SITE = "/{site}"  # stands for the image's site directory in a step's paths (unknown here, and not needed)
INSTALL_SCHEMES = ("{purelib}/", "{platlib}/")  # a script's ``touches:`` under the interpreter's install scheme
SITE_DIRS = ("/site-packages/", "/dist-packages/")


@dataclass(frozen=True)
class Frame:
    path: str
    line: int
    function: str = ""
    code: str = ""  # the source line the traceback shows under it (stripped), if any

    @property
    def relative(self) -> str:
        """The path below its site directory (``vllm/x.py``), else as written."""
        for marker in SITE_DIRS:
            if marker in self.path:
                return self.path.rsplit(marker, 1)[1]
        return self.path


@dataclass(frozen=True)
class Trace:
    """One traceback: its frames (outermost first) and its closing line (``NameError: name 'x' is not defined``)."""

    frames: tuple[Frame, ...]
    exception: str

    @property
    def type(self) -> str:
        m = EXCEPTION.match(self.exception)
        return m.group("type").rsplit(".", 1)[-1] if m else "an error"


def tracebacks(lines: Sequence[str]) -> list[Trace]:
    """Every traceback in ``lines``, in log order (chained ones each count)."""
    out: list[Trace] = []
    i = 0
    while i < len(lines):
        at = lines[i].find(TRACEBACK)
        if at < 0:
            i += 1
            continue
        prefix = lines[i][:at]
        frames: list[Frame] = []
        exception = ""
        i += 1
        while i < len(lines) and lines[i].startswith(prefix):
            body = lines[i][len(prefix):]
            if TRACEBACK in body:
                break
            frame = FRAME.match(body)
            if frame:
                frames.append(Frame(frame.group("path"), int(frame.group("line")), frame.group("function") or ""))
            elif frames and not frames[-1].code and body.strip() and body[:1].isspace() and body.strip()[0] not in "^~":
                frames[-1] = replace(frames[-1], code=body.strip())
            elif body.strip() and not body[:1].isspace():
                exception = body.strip()
                i += 1
                break
            i += 1
        if frames:
            out.append(Trace(tuple(frames), exception))
    return out


def _matches(touched: str, path: str) -> bool:
    if touched.startswith(SITE + "/"):
        rel = touched[len(SITE) + 1:]
        for scheme in INSTALL_SCHEMES:
            rel = rel.removeprefix(scheme)
        return path == rel or path.endswith("/" + rel) or f"/{rel}/" in path
    return path == touched or path.startswith(touched.rstrip("/") + "/")


def writers(steps: Sequence[Step], path: str) -> list[Step]:
    """The steps that write ``path`` (an absolute path in the image or on the in-place root), last writer last."""
    return [step for step in steps if any(_matches(t, path) for t in kind(step.kind).touches(step, SITE))]


def _blamed_last(written: Sequence[Step], frame: Frame) -> tuple[Step, ...]:
    """``written`` with the step to blame last: of several patches to one file, the last whose new text holds the
    failing line (the traceback shows it), else the last writer."""
    holding = [s for s in written if kind(s.kind).wrote_line(s, frame.code)]
    if not holding or holding[-1] is written[-1]:
        return tuple(written)
    blamed = holding[-1]
    return (*[s for s in written if s is not blamed], blamed)


@dataclass(frozen=True)
class Blame:
    """What stopped a start: the traceback, its frame to blame, and the steps that wrote that frame's file."""

    trace: Trace
    frame: Frame
    steps: tuple[Step, ...]

    @property
    def step(self) -> Step | None:
        """The step to blame: the patch whose new text holds the failing line, else the last one that wrote the
        file (what the server ran)."""
        return self.steps[-1] if self.steps else None

    def where(self) -> str:
        """``NameError in vllm/x.py line 12, written by step 'ID' (patch)`` (no step: up to the line)."""
        where = f"{self.trace.type} in {self.frame.relative} line {self.frame.line}"
        step = self.step
        return where if step is None else f"{where}, written by step {step.id!r} ({step.kind})"

    def headline(self, package: str) -> str:
        """``vLLM did not start: `` + :meth:`where`."""
        return f"{'vLLM' if package == 'vllm' else package} did not start: {self.where()}"

    def step_hint(self) -> str:
        """``the traceback goes through F line N, which step 'id' (kind, file:line) writes: ...``."""
        step = self.step
        if step is None:
            return ""
        others = "".join(f"; step {s.id!r} ({s.kind}, {s.location}) writes it too" for s in self.steps[:-1])
        return (f"the traceback goes through {self.frame.relative} line {self.frame.line}, which step {step.id!r} "
                f"({step.kind}, {step.location}) writes{others}: fix that step")


def diagnose(lines: Sequence[str], steps: Sequence[Step]) -> Blame | None:
    """The frame to blame in a failed start's log: one a step wrote, else the package's innermost (None: no
    traceback)."""
    traces = [t for t in tracebacks(lines) if t.frames]
    for trace in traces:
        for frame in reversed(trace.frames):
            written = writers(steps, frame.path)
            if written:
                return Blame(trace, frame, _blamed_last(written, frame))
    if not traces:
        return None
    trace = traces[0]
    inside = [f for f in trace.frames if any(m in f.path for m in SITE_DIRS)]
    return Blame(trace, (inside or list(trace.frames))[-1], ())


def trace_tail(lines: Sequence[str]) -> list[str]:
    """The last lines of a traceback (``traceback.format_exc()[-N:]``, as verify's in-image program keeps them) with
    their header put back when it was cut off."""
    return list(lines) if any(TRACEBACK in line for line in lines) else [TRACEBACK, *lines]


__all__ = ["Blame", "Frame", "Trace", "diagnose", "trace_tail", "tracebacks", "writers"]
