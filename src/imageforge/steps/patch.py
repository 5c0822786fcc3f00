"""``patch``: an anchored text replacement in one file of the image (``file``, ``old``, ``new``, ``count``)."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import BuildError
from ..manifest.model import Step, StepSpec
from ..patches.anchored import apply_patch, describe, reapplies, unified_diff
from .core import (
    ApplyContext,
    Changes,
    Facts,
    FileChange,
    LoadedSpec,
    OneFileKind,
    SpecChecks,
    StepProblem,
    guard_links,
    python_problem,
    register,
    text_of,
)
from .dockerfile import EmitContext, Emitted, applier_group, header
from .fs import ImageFS


@dataclass(frozen=True)
class PatchSpec(StepSpec):
    """A patch step's fields: ``old`` replaced by ``new`` in ``file`` (normalised), found ``count`` times."""

    file: str
    old: str
    new: str
    count: int = 1
    verified: bool = True


@register
class Patch(OneFileKind):
    name = "patch"
    spec_type = PatchSpec
    schema: ClassVar[Mapping[str, Any]] = {
        "required": ["file", "old", "new"],
        "properties": {
            "file": {"type": "string", "minLength": 1,
                     "description": "File in the image: relative to the package's site directory, or absolute."},
            "old": {"type": "string", "minLength": 1,
                    "description": "Anchor text that must occur exactly `count` times. When `old` or `new` holds a "
                                   "newline, a match counts only where it begins at a line start (its leading "
                                   "spaces are the whole indentation); an `old` beginning with a newline begins at "
                                   "a line end."},
            "new": {"type": "string",
                    "description": "Replacement text. Must not contain `old` where the rule would match it again "
                                   "(the patch must apply once)."},
            "count": {"type": "integer", "minimum": 1, "description": "Expected number of occurrences (default 1)."},
            "verified": {"type": "boolean", "description": "false: the anchor comes from notes and was never "
                                                           "checked against the real image."},
        },
    }

    def path(self, step: Step) -> str:
        return PatchSpec.of(step).file

    def describe(self, step: Step) -> list[str]:
        spec = PatchSpec.of(step)
        diff = difflib.unified_diff(spec.old.splitlines(), spec.new.splitlines(), f"a/{spec.file}", f"b/{spec.file}",
                                    lineterm="", n=0)
        return [f"{spec.file} (patched x{spec.count})", *(f"    {line}" for line in diff)]

    def wrote_line(self, step: Step, code: str) -> bool:
        return bool(code) and code in PatchSpec.of(step).new

    def load(self, raw: Mapping[str, Any], spec: dict[str, Any], checks: SpecChecks) -> LoadedSpec:
        spec["file"] = checks.dest("file", raw["file"])
        loaded = super().load(raw, spec, checks)
        if raw["old"] == raw["new"]:
            checks.problem(
                "new",
                "patch does not change anything",
                expected="'new' different from 'old'",
                found="identical text",
            )
        elif reapplies(raw["old"], raw["new"]):
            checks.problem(
                "new",
                "patch would apply again: 'new' still contains 'old' where the matching rule finds it",
                expected="'new' without a copy of 'old' at a line start (a re-run must say 'already applied')",
                found=f"{reapplies(raw['old'], raw['new'])} copy(ies) of 'old' in 'new'",
                hint="change the kept line of 'new' (e.g. end it with a `# imageforge: ...` comment) or make "
                     "'old' include a line that 'new' changes; `invoke patch-from` writes such steps",
            )
        return loaded

    def apply(self, step: Step, fs: ImageFS, ctx: ApplyContext) -> Changes:
        path = self.row_path(step, ctx.site)
        guard_links(step, fs, path, ctx.site, "path")
        try:
            found = fs.read_file(path)
        except BuildError as exc:
            raise StepProblem("conflict", path, exc.message, exc) from None
        if found is None:
            parent = path.rpartition("/")[0] or "/"
            where = "its directory exists" if fs.stat(parent) is not None else f"{parent} is missing too"
            raise StepProblem("destination missing", path, f"file not in the image ({where})", BuildError(
                f"patch target {path} does not exist in the image",
                location=step.where("file"), key_path=f"{step.key_path}.file",
                hint="check the path with `invoke check-patches`"), blame="file")
        data, meta = found
        text = text_of(data)
        if text is None:
            raise StepProblem("conflict", path, "file is not UTF-8 text", BuildError(
                f"patch target {path} is not UTF-8 text", location=step.where("file"),
                key_path=f"{step.key_path}.file", hint="use an overlay step for a binary file"))
        spec = PatchSpec.of(step)
        outcome = apply_patch(text, spec.old, spec.new, spec.count)
        lines = ", ".join(map(str, outcome.lines))
        if outcome.status == "already-applied":
            return Changes("already applied", path, f"new text at line {lines}, anchor absent",
                           "already applied: skipped")
        if outcome.result is None:
            error = BuildError(
                f"patch {step.id!r} does not apply to {path}: {describe(outcome)}",
                location=step.where("old"), key_path=f"{step.key_path}.old",
                expected=f"the anchor exactly {outcome.expected} time(s)", found=f"{outcome.found} time(s)",
                hint="`invoke check-patches --diff` shows every patch; `invoke patch-from` writes new anchors")
            if outcome.status == "inside-line":
                raise StepProblem("inside line", path, describe(outcome), error, blame="old", near=outcome.near)
            if outcome.status == "crlf":
                raise StepProblem("crlf", path, describe(outcome), error, blame="file")
            if outcome.status == "ambiguous":
                raise StepProblem("ambiguous", path, f"anchor found {outcome.found} times (lines {lines}), "
                                  f"expected {outcome.expected}", error, blame="old")
            raise StepProblem("anchor missing", path,
                              "anchor not found" + (f"; {outcome.hint}" if outcome.hint else "")
                              + ("" if outcome.near else "; no similar line"), error,
                              blame="old", near=outcome.near)
        python_problem(step, path, outcome.result, ctx.python_version, outcome.new_lines, "new")
        # Keep the file's mode, owner and mtime: a same-size edit then looks unchanged to
        # timestamp-based .pyc files, which is exactly what verification must defeat.
        new = FileChange(path, outcome.result.encode("utf-8"), meta.mode, meta.uid, meta.gid, meta.mtime)
        return Changes("applies", path, f"anchor at line {lines}", f"patched {path} at line {lines}", files=(new,),
                       diff=unified_diff(path, text, outcome.result) if ctx.with_diff else "")

    def facts(self, step: Step, inputs: Mapping[str, str], site: str) -> Facts:
        path = self.row_path(step, site)
        return Facts(python_files=(path,) if path.endswith(".py") else ())

    def emit(self, step: Step, ctx: EmitContext) -> Emitted:
        path = self.row_path(step, ctx.base.site)
        patch = PatchSpec.of(step)
        spec = {"op": "edit", "step": step.id, "path": path, "site": ctx.base.site, "old": patch.old,
                "new": patch.new, "count": patch.count, "python_version": ctx.base.python_version}
        instructions, files = applier_group(ctx, spec)
        return Emitted((header(ctx, step.id, step.kind, step.why), *instructions), files)
