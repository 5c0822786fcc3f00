"""``symlink``: one link (``link`` -> ``target``), or one link in ``into`` per file matching ``glob``.

The glob is matched in the image, when the step is applied (the build, check-patches and the
emitted Dockerfile alike). An existing link to the same target is left; anything else in the way
needs ``replace`` (a file or another link) or ``replace_directory`` (a non-empty directory).
"""

from __future__ import annotations

import fnmatch
import posixpath
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from ..errors import BuildError, ConfigError
from ..manifest import Step, normalise_image_path
from .core import ApplyContext, Changes, Facts, LinkChange, LoadedSpec, SpecChecks, StepKind, StepProblem, register
from .dockerfile import EmitContext, Emitted, applier_group, header
from .fs import ImageFS


def glob_parts(step: Step) -> tuple[str, str, str]:
    """(normalised pattern, its directory, the name pattern); ConfigError for wildcards above the last component."""
    pattern = posixpath.normpath(step.spec["glob"])
    directory, name_glob = posixpath.split(pattern)
    if any(ch in directory for ch in "*?["):
        raise ConfigError("only the last component of a symlink glob may hold wildcards",
                          location=step.location, key_path=f"{step.key_path}.glob", found=pattern)
    return pattern, directory, name_glob


@register
class Symlink(StepKind):
    name = "symlink"
    fields = ("link", "target", "glob", "into", "replace", "replace_directory")
    defaults = MappingProxyType({"replace": False, "replace_directory": False})

    def load(self, raw: Mapping[str, Any], spec: dict[str, Any], checks: SpecChecks) -> LoadedSpec:
        for key in ("link", "glob", "into"):
            if key in raw and normalise_image_path(raw[key]) is None:
                checks.problem(key, "path escapes its root", expected="an absolute path without '..'",
                               found=repr(raw[key]))
        return super().load(raw, spec, checks)

    def row_path(self, step: Step, site: str) -> str:
        return str(step.spec.get("glob") or step.spec.get("link") or "")

    def touches(self, step: Step, site: str) -> tuple[str, ...]:
        return tuple(posixpath.normpath(step.spec[k]) for k in ("link", "into") if k in step.spec)

    def apply(self, step: Step, fs: ImageFS, ctx: ApplyContext) -> Changes:
        spec = step.spec
        if "glob" in spec:
            try:
                pattern, directory, name_glob = glob_parts(step)
            except ConfigError as exc:
                raise StepProblem("conflict", str(spec["glob"]), exc.message, exc) from None
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
            into = posixpath.normpath(spec["into"])
            pairs = [(f"{into}/{n}", f"{directory}/{n}") for n in names]
            shown = pattern + " -> " + into
        else:
            link, target = posixpath.normpath(spec["link"]), spec["target"]
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
                    if fs.list_dir(link) and not self.value(step, "replace_directory"):
                        raise StepProblem(
                            "conflict", shown, f"{link} is a non-empty directory (replace_directory: true forces it)",
                            BuildError(
                                f"{link} is a non-empty directory in the image; refusing to replace it with a link",
                                location=step.location, key_path=step.key_path,
                                hint="link the files inside it (glob + into) instead; replace_directory: true "
                                "forces it"))
                elif not self.value(step, "replace"):
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
        if "glob" in step.spec:
            return Facts(link_globs=({"glob": posixpath.normpath(step.spec["glob"]),
                                      "into": posixpath.normpath(step.spec["into"])},))
        return Facts(links=(posixpath.normpath(step.spec["link"]),))

    def emit(self, step: Step, ctx: EmitContext) -> Emitted:
        """One link, or one link per glob match (matched at build time, in the image, as the engine does)."""
        s = step.spec
        spec: dict[str, Any] = {"op": "symlink", "step": step.id, "replace": bool(s.get("replace", False)),
                                "replace_directory": bool(s.get("replace_directory", False))}
        if "glob" in s:
            pattern, _, _ = glob_parts(step)
            spec.update(glob=pattern, into=posixpath.normpath(s["into"]))
        else:
            spec.update(link=posixpath.normpath(s["link"]), target=s["target"])
        instructions, files = applier_group(ctx, spec)
        return Emitted((header(ctx, step.id, step.kind, step.why), *instructions), files)
