"""What every step kind is made of: its result (:class:`Changes`), its failure (:class:`StepProblem`), the
context it runs in (:class:`ApplyContext`) and the base class with the registry (kind -> class).

One class per kind (``steps/<kind>.py``) holds, in one place:

* ``inputs``: the sha256 of the host files the step reads (they join its cache key with its definition);
* ``apply(fs, ctx) -> Changes``: what the step does to an image's files, *returned* (files with
  mode/owner/mtime and bytes, links) rather than written: the build writes the Changes into its step
  container and commits; check-patches records them in its in-memory overlay and reports a row;
* ``facts``: what it leaves for the verify layer (changed ``.py`` files, overlay sha256, links);
* ``emit``: the Dockerfile instructions that do the same with plain ``docker build``;
* ``spec_type``, ``schema`` and ``load``: the kind's typed frozen spec (its fields and their defaults, a
  :class:`imageforge.manifest.model.StepSpec`), its manifest keys as a JSON Schema fragment (build.schema.json's
  ``$defs.<kind>_step`` is made from it: :mod:`.schema`), and their normalisation and checks when build.yaml is
  loaded (:mod:`imageforge.manifest.load` asks the kind).

A failure is a :class:`StepProblem`: the row check-patches shows (status, detail) and the error the
build raises (:attr:`StepProblem.error`), from the same test in the same code.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

from ..errors import BuildError, ConfigError, ImageforgeError
from ..manifest.model import Step, StepSpec, resolve_image_path
from ..patches.anchored import NearMatch
from ..patches.pycheck import check_python
from ..plan import step_inputs
from .dockerfile import EmitContext, Emitted
from .fs import ImageFS

Log = Callable[[str], None]

#: The status of a check-patches row (and of a step's apply: the first three are what apply returns).
RowStatus = Literal[
    "applies", "already applied", "ran", "anchor missing", "ambiguous", "destination missing", "conflict",
    "not checked", "script failed", "inside line", "crlf", "breaks the file", "fails its checks",
]


@dataclass(frozen=True)
class StepResult:
    """What one step did where it was applied: a layer of an image (the build) or the files in place.

    ``status``: in an image HIT, BUILT, SKIPPED (already applied), REUSED (verify: the imports passed on this content
    before); in place applied, already applied, undone, ran, verified. ``stage``, ``key`` and ``image_id`` are the
    layer's (in an image); ``paths`` is how many paths the journal holds for the step (in place).
    """

    id: str
    kind: str
    status: str
    detail: str = ""
    seconds: float = 0.0
    stage: str = ""
    key: str = ""
    image_id: str = ""
    paths: int = 0


@dataclass(frozen=True)
class FileChange:
    """A regular file the step writes: bytes, mode, owner and mtime (None: the fixed mtime of written layers)."""

    path: str
    data: bytes
    mode: int
    uid: int = 0
    gid: int = 0
    mtime: int | None = None


@dataclass(frozen=True)
class LinkChange:
    """A symbolic link the step makes (replacing whatever is at ``path``)."""

    path: str
    target: str


@dataclass(frozen=True)
class Changes:
    """What a step did (or would do) to the image: a layer's worth of files and links, plus what to report.

    ``status``/``detail``/``diff`` make check-patches' row, ``summary`` the build log's detail; ``path``
    is the row's file. A process kind (script) changes the container it ran in: ``files``/``links`` are
    empty (the container is committed as is).
    """

    status: Literal["applies", "already applied", "ran"]
    path: str
    detail: str
    summary: str
    files: tuple[FileChange, ...] = ()
    links: tuple[LinkChange, ...] = ()
    diff: str = ""

    @property
    def empty(self) -> bool:
        return not self.files and not self.links


class StepProblem(BuildError):
    """A step that does not apply: check-patches' row (status, path, detail) and the build's error.

    ``error`` is what the build raises (a BuildError with the build's wording, or a ConfigError for a
    malformed step); the row points at the manifest key ``blame`` (the step itself when None).
    """

    def __init__(self, status: RowStatus, path: str, detail: str, error: ImageforgeError, *,
                 blame: str | None = None, near: tuple[NearMatch, ...] = (), log_tail: tuple[str, ...] = (),
                 exit_code: int | None = None) -> None:
        super().__init__(error.message, location=error.location, key_path=error.key_path, expected=error.expected,
                         found=error.found, hint=error.hint, log_tail=log_tail or error.log_tail)
        self.status: RowStatus = status
        self.path = path
        self.detail = detail
        self.error = error
        self.blame = blame
        self.near = near
        self.script_exit_code = exit_code  # a process kind's exit status


@dataclass(frozen=True)
class ApplyContext:
    """Where a step is applied.

    ``site``: the package's site directory (relative step paths live there). ``checking``: the
    check-patches face (diffs when ``with_diff``; the checks that only verification would catch later
    fail the row now). ``container``: the running container a process kind (script) runs in (or ``runner``: a
    local process, in place); ``echo``
    gets its output lines as they come; ``image``: the image it runs on (named in a failure's hint).
    ``python_version``: the base's Python (``3.10.12``): a changed ``.py`` must parse as that version.
    """

    site: str
    environ: Mapping[str, str] = field(default_factory=dict)
    checking: bool = False
    with_diff: bool = False
    container: Any = None
    echo: Log | None = None
    image: str = ""
    #: runs a process kind's step (``run_step(step, environ, echo=) -> (exit code, lines)``): a local process for
    #: ``apply --in-place`` (:class:`imageforge.inplace.runner.LocalRunner`); None: exec in ``container``
    runner: Any = None
    python_version: str = ""


@dataclass(frozen=True)
class Facts:
    """What a step leaves for the verify layer (see :func:`imageforge.verify.verify_spec`)."""

    python_files: tuple[str, ...] = ()
    overlays: Mapping[str, str] = field(default_factory=dict)  # image path -> sha256 of the source
    links: tuple[str, ...] = ()
    link_globs: tuple[Mapping[str, str], ...] = ()


class SpecChecks(Protocol):
    """The manifest loader's checks for one step, offered to :meth:`StepKind.load` (keys are the step's own)."""

    def problem(self, key: str, message: str, **kw: str | None) -> None:
        """Report a problem at the step's key ``key`` (the load goes on: every problem is reported)."""

    def dest(self, key: str, dest: str, source: str | None = None) -> str:
        """An image file path: normalised, inside the package when relative (else a problem; ``dest`` back)."""

    def directory(self, key: str, directory: str) -> tuple[str | None, Path | None]:
        """(variable name, None) for a whole ``${VAR}``; (None, absolute path) for a checked host directory."""

    def env(self, key: str, raw: Mapping[str, Any] | None) -> Mapping[str, str]:
        """An environment mapping as the file writes its values (``0644`` stays ``"0644"``)."""


@dataclass(frozen=True)
class LoadedSpec:
    """What :meth:`StepKind.load` makes of a step's manifest keys: its spec, and a directory step's host folder."""

    spec: StepSpec
    directory_env: str | None = None
    directory_path: Path | None = None


class StepKind:
    """One step kind. Subclasses set ``name``, ``spec_type`` and ``schema`` and are registered with :func:`register`."""

    name: ClassVar[str]
    #: the kind's typed frozen spec: its fields, their defaults (``Step.spec`` is one of these)
    spec_type: ClassVar[type[StepSpec]]
    #: the kind's manifest keys (beyond id, kind, why, requires, required) as JSON Schema: ``properties``,
    #: ``required`` and any other keyword of the object (``oneOf``); build.schema.json's ``$defs.NAME_step``
    schema: ClassVar[Mapping[str, Any]]
    #: a process kind runs in a started container (the build's step container, check-patches' sandbox)
    runs_process: ClassVar[bool] = False

    @property
    def fields(self) -> tuple[str, ...]:
        """The kind's manifest keys (its schema's properties)."""
        return tuple(self.schema["properties"])

    def load(self, raw: Mapping[str, Any], spec: dict[str, Any], checks: SpecChecks) -> LoadedSpec:
        """The step's spec from its manifest keys ``raw``: normalised and checked, the defaults filled in.

        ``spec`` is ``raw`` less the keys every step has (id, kind, why, requires, required), with a ``source``
        already checked and normalised, and less what ``load`` took out; what comes back is the step's definition
        (its cache key).
        """
        return LoadedSpec(self.spec_type(**spec))

    def inputs(self, step: Step, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """sha256 of every host file the step reads (its ``source``, a script's ``directory``)."""
        return step_inputs(step, environ)

    def preflight(self, step: Step, environ: Mapping[str, str]) -> None:
        """Refuse, before Docker is touched, what the build cannot start with (exit 5: a missing host folder)."""

    def context_folder(self, step: Step, environ: Mapping[str, str]) -> Path | None:
        """A host folder the step copies whole (a root folder of the submission tree), if any."""
        return None

    def live_files(self, step: Step, environ: Mapping[str, str]) -> Mapping[str, str]:
        """The ``.py`` files (image paths -> why) the step puts outside the import roots and runs or imports: the
        dead-file rule (:mod:`imageforge.scripts.deadfiles`); verify compiles these and lists the other changed ones."""
        return {}

    def apply(self, step: Step, fs: ImageFS, ctx: ApplyContext) -> Changes:
        raise NotImplementedError

    def facts(self, step: Step, inputs: Mapping[str, str], site: str) -> Facts:
        return Facts()

    def emit(self, step: Step, ctx: EmitContext) -> Emitted:
        raise NotImplementedError

    def row_path(self, step: Step, site: str) -> str:
        """The file check-patches shows for the step (also when it was not checked)."""
        raise NotImplementedError

    def touches(self, step: Step, site: str) -> tuple[str, ...]:
        """Image paths the step writes at or under (the build's directory-listing cache keys off them)."""
        return ()

    def describe(self, step: Step) -> list[str]:
        """What the step changes, from its definition, as report lines (bisect names the first bad step with them;
        package-relative paths are under the site directory)."""
        return [f"{step.kind} step: its changes are not listed here"]

    def provides(self, step: Step) -> tuple[str, ...]:
        """The package-relative files the step puts into the image whole (modules verify may import: ``.py`` files,
        extension modules): a subset image without the step leaves those modules out of its verify imports."""
        return ()

    def wrote_line(self, step: Step, code: str) -> bool:
        """Whether the step's own text holds the source line ``code`` (a traceback's line): of several steps
        writing one file, blame names the last that does."""
        return False


class OneFileKind(StepKind):
    """A kind that writes one image file (:meth:`path`, relative to the package's site or absolute)."""

    def path(self, step: Step) -> str:
        """The file the step writes, as its spec says."""
        raise NotImplementedError

    def row_path(self, step: Step, site: str) -> str:
        return resolve_image_path(self.path(step), site)

    def touches(self, step: Step, site: str) -> tuple[str, ...]:
        return (self.row_path(step, site),)


def one_file(step: Step) -> str | None:
    """The file a one-file kind's step writes, as its spec says (site-relative or absolute); None for other kinds."""
    of = kind(step.kind)
    return of.path(step) if isinstance(of, OneFileKind) else None


KINDS: dict[str, StepKind] = {}


def register(cls: type[StepKind]) -> type[StepKind]:
    KINDS[cls.name] = cls()
    return cls


def kind(name: str) -> StepKind:
    """The class of a step kind (every module of the package has registered by the time it is imported)."""
    try:
        return KINDS[name]
    except KeyError:
        raise ConfigError(f"step kind {name!r} has no definition",
                          hint="add its module in src/imageforge/steps/ (CONTRIBUTING.md: Adding a step kind)"
                          ) from None


# --------------------------------------------------------------------------- shared by the file kinds


def through_link(fs: ImageFS, path: str, site: str) -> str | None:
    """A symbolic link inside the site directory on the way to ``path`` (``LINK -> TARGET``), which is refused."""
    site = site.rstrip("/")
    if not path.startswith(site + "/"):
        return None
    current = site
    for part in path[len(site) + 1:].split("/")[:-1]:
        current = f"{current}/{part}"
        entry = fs.stat(current)
        if entry is None:
            return None
        if entry.kind == "link":
            return f"{current} -> {entry.link_target}"
    return None


def guard_links(step: Step, fs: ImageFS, path: str, site: str, what: str, blame: str | None = None) -> None:
    """StepProblem (conflict) when ``path`` goes through a symbolic link in the site directory."""
    link = through_link(fs, path, site)
    if link is not None:
        raise StepProblem("conflict", path, f"{what} goes through a symbolic link ({link})", BuildError(
            f"destination {path} goes through a symbolic link in the image ({link})",
            location=step.location, key_path=step.key_path, hint="write to the real path instead"), blame=blame)


def text_of(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def norm(path: str) -> str:
    return posixpath.normpath(path)


def python_problem(step: Step, path: str, text: str, python_version: str, lines: tuple[int, ...] | None,
                   blame: str) -> None:
    """StepProblem ("breaks the file", exit 3) when a changed ``.py`` no longer compiles or loads an unbound name.

    The one check (:func:`imageforge.patches.pycheck.check_python`) the submission's applier runs too.
    """
    if not path.endswith(".py"):
        return
    problem = check_python(text, path, python_version=python_version, lines=lines)
    if problem is None:
        return
    raise StepProblem("breaks the file", path, f"line {problem.line}: {problem.error}", BuildError(
        f"step {step.id!r} breaks {path}: line {problem.line}: {problem.error}",
        location=step.where(blame), key_path=f"{step.key_path}.{blame}", found=problem.context,
        hint="the file must compile and every name the step's lines use must be bound; "
             "`invoke check-patches --diff` shows the change"), blame=blame)
