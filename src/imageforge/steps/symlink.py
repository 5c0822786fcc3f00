"""``symlink``: one link (``link`` -> ``target``), or one link in ``into`` per file matching ``glob``.

The glob is matched in the image, when the step is applied (the build, check-patches and the
emitted Dockerfile alike). An existing link to the same target is left; anything else in the way
needs ``replace`` (a file or another link) or ``replace_directory`` (a non-empty directory).
"""

from __future__ import annotations

import fnmatch
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import BuildError, ConfigError
from ..manifest.model import Step, StepSpec, normalise_image_path
from .core import ApplyContext, Changes, Facts, LinkChange, LoadedSpec, SpecChecks, StepKind, StepProblem, register
from .dockerfile import EmitContext, Emitted, applier_group, header
from .fs import ImageFS


@dataclass(frozen=True)
class SymlinkSpec(StepSpec):
    """A symlink step's fields: ``link`` -> ``target``, or one link in ``into`` per file matching ``glob``."""

    link: str | None = None
    target: str | None = None
    glob: str | None = None
    into: str | None = None
    replace: bool = False
    replace_directory: bool = False

    @property
    def globbed(self) -> bool:
        return self.glob is not None

    def ends(self) -> tuple[str, str]:
        """(glob, into) in the glob form, (link, target) for one link (the schema's oneOf: exactly one form)."""
        first, second = (self.glob, self.into) if self.globbed else (self.link, self.target)
        if first is None or second is None:
            raise ConfigError(f"a symlink step needs link + target or glob + into, found {self.definition()}")
        return first, second


def glob_parts(step: Step) -> tuple[str, str, str]:
    """(normalised pattern, its directory, the name pattern); ConfigError for wildcards above the last component."""
    pattern = posixpath.normpath(SymlinkSpec.of(step).ends()[0])
    directory, name_glob = posixpath.split(pattern)
    if any(ch in directory for ch in "*?["):
        raise ConfigError("only the last component of a symlink glob may hold wildcards",
                          location=step.location, key_path=f"{step.key_path}.glob", found=pattern)
    return pattern, directory, name_glob


@register
class Symlink(StepKind):
    name = "symlink"
    spec_type = SymlinkSpec
    schema: ClassVar[Mapping[str, Any]] = {
        "required": [],
        "properties": {
            "link": {"type": "string", "pattern": "^/",
                     "description": "Absolute path of the link to create (single-link form)."},
            "target": {"type": "string", "minLength": 1,
                       "description": "What the link points to (single-link form)."},
            "glob": {"type": "string", "pattern": "^/",
                     "description": "Absolute glob; one link per matching file (glob form)."},
            "into": {"type": "string", "pattern": "^/", "description": "Directory receiving the links (glob form)."},
            "replace": {"type": "boolean", "description": "Replace existing files at link paths (never a "
                                                         "non-empty directory unless replace_directory)."},
            "replace_directory": {"type": "boolean",
                                  "description": "Allow replacing a non-empty directory with a link. Dangerous."},
        },
        "oneOf": [
            {"required": ["link", "target"], "description": "one link: {link: /abs/path, target: WHAT}"},
            {"required": ["glob", "into"], "description": "one link per file: {glob: /abs/glob*, into: /abs/dir}"},
        ],
    }

    def load(self, raw: Mapping[str, Any], spec: dict[str, Any], checks: SpecChecks) -> LoadedSpec:
        for key in ("link", "glob", "into"):
            if key in raw and normalise_image_path(raw[key]) is None:
                checks.problem(key, "path escapes its root", expected="an absolute path without '..'",
                               found=repr(raw[key]))
        return super().load(raw, spec, checks)

    def row_path(self, step: Step, site: str) -> str:
        spec = SymlinkSpec.of(step)
        return spec.glob or spec.link or ""

    def describe(self, step: Step) -> list[str]:
        spec = SymlinkSpec.of(step)
        return [f"links {spec.glob} into {spec.into}"]

    def touches(self, step: Step, site: str) -> tuple[str, ...]:
        spec = SymlinkSpec.of(step)
        return tuple(posixpath.normpath(p) for p in (spec.link, spec.into) if p is not None)

    def apply(self, step: Step, fs: ImageFS, ctx: ApplyContext) -> Changes:
        spec = SymlinkSpec.of(step)
        first, second = spec.ends()
        if spec.globbed:
            try:
                pattern, directory, name_glob = glob_parts(step)
            except ConfigError as exc:
                raise StepProblem("conflict", first, exc.message, exc) from None
            nothing = BuildError(f"symlink glob {pattern} matches nothing in the image",
                                 location=step.location, key_path=f"{step.key_path}.glob",
                                 hint="check the directory with `docker run --rm IMAGE ls DIR`")
            if ctx.checking and fs.stat(directory) is None:
                raise StepProblem("destination missing", pattern, f"directory {directory} is not in the image",
                                  nothing, blame="glob")
            names = sorted(n for n, e in fs.list_dir(directory)
                           if fnmatch.fnmatchcase(n, name_glob) and e.kind != "dir")
            if not names:
                raise StepProblem("destination missing", pattern, "the glob matches nothing", nothing, blame="glob")
            into = posixpath.normpath(second)
            pairs = [(f"{into}/{n}", f"{directory}/{n}") for n in names]
            shown = pattern + " -> " + into
        else:
            link, target = posixpath.normpath(first), second
            resolved = target if target.startswith("/") else posixpath.normpath(
                posixpath.join(posixpath.dirname(link), target))
            if ctx.checking and fs.stat(resolved) is None:  # verification would fail; the build finds out there
                raise StepProblem("destination missing", link,
                                  f"link target {target} is not in the image (verification would fail)",
                                  BuildError(f"link target {target} of {link} is not in the image"), blame="glob")
            pairs = [(link, target)]
            shown = link
        made: list[LinkChange] = []
        skipped = 0
        for link, target in pairs:
            entry = fs.stat(link)
            if entry is not None:
                if entry.kind == "link" and entry.link_target == target:
                    skipped += 1
                    continue
                if entry.kind == "dir":
                    if fs.list_dir(link) and not spec.replace_directory:
                        raise StepProblem(
                            "conflict", shown, f"{link} is a non-empty directory (replace_directory: true forces it)",
                            BuildError(
                                f"{link} is a non-empty directory in the image; refusing to replace it with a link",
                                location=step.location, key_path=step.key_path,
                                hint="link the files inside it (glob + into) instead; replace_directory: true "
                                "forces it"))
                elif not spec.replace:
                    raise StepProblem("conflict", shown, f"{link} already exists (replace: true replaces it)",
                                      BuildError(f"{link} already exists in the image",
                                                 location=step.location, key_path=step.key_path,
                                                 hint="set replace: true to replace existing files with links"))
            made.append(LinkChange(link, target))
        summary = f"{len(made)} link(s) made, {skipped} already in place"
        if not made:
            return Changes("already applied", shown, f"{skipped} link(s) already in place", summary)
        return Changes("applies", shown, f"{len(made)} link(s) to make, {skipped} in place", summary,
                       links=tuple(made))

    def facts(self, step: Step, inputs: Mapping[str, str], site: str) -> Facts:
        spec = SymlinkSpec.of(step)
        first, second = spec.ends()
        if spec.globbed:
            return Facts(link_globs=({"glob": posixpath.normpath(first), "into": posixpath.normpath(second)},))
        return Facts(links=(posixpath.normpath(first),))

    def emit(self, step: Step, ctx: EmitContext) -> Emitted:
        """One link, or one link per glob match (matched at build time, in the image, as the engine does)."""
        s = SymlinkSpec.of(step)
        first, second = s.ends()
        spec: dict[str, Any] = {"op": "link", "step": step.id, "replace": s.replace,
                                "replace_directory": s.replace_directory}
        if s.globbed:
            pattern, _, _ = glob_parts(step)
            spec.update(glob=pattern, into=posixpath.normpath(second))
        else:
            spec.update(link=posixpath.normpath(first), target=second)
        instructions, files = applier_group(ctx, spec)
        return Emitted((header(ctx, step.id, step.kind, step.why), *instructions), files)
