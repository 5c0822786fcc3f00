"""`patch-from` against the target's base image: the anchored steps that turn a file of it into an edited copy.

:func:`patch_from` reads the file as the target's existing steps leave it (dry-run in memory, as
`check-patches` does: :func:`imageforge.patches.check.check_steps`) or as the base image has it, and derives
the steps with :func:`imageforge.patches.from_text.derive_patch_steps` (the pure part).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..docker_engine import daemon_errors
from ..errors import BuildError, ConfigError
from ..manifest.model import Manifest, resolve_image_path
from ..steps.core import text_of
from .check import Log, Overlay, check_steps, image_session, script_sandbox, to_stderr
from .from_text import apply_steps, derive_patch_steps, render_steps_yaml


@dataclass(frozen=True)
class PatchFromResult:
    file: str
    path: str
    steps: tuple[dict[str, Any], ...]
    yaml: str
    against: str


def package_file(path: str, site: str) -> str:
    """The manifest's spelling of an image path: relative to the site directory when inside it."""
    if path.startswith("/"):
        norm = posixpath.normpath(path)
        site = site.rstrip("/")
        return norm[len(site) + 1:] if norm.startswith(site + "/") else norm
    return posixpath.normpath(path)


def patch_from(manifest: Manifest, target: str | None, file: str, edited: str, *, environ: Mapping[str, str],
               against_base: bool = False, id_prefix: str = "", log: Log = to_stderr) -> PatchFromResult:
    """`invoke patch-from`: steps that turn the image's file into ``edited``.

    The original is the file as the target's existing steps leave it (they are applied in
    memory first), so the printed steps go at the end of ``targets.<T>.steps``; with
    ``against_base`` it is the file in the base image as is.
    """
    edited_path = Path(edited)
    try:
        edited_text = edited_path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the edited file {edited}", found=str(exc)) from None
    except UnicodeDecodeError:
        raise ConfigError(f"{edited} is not UTF-8 text; patch steps hold text") from None
    with image_session(manifest, target, None, environ=environ, log=log) as s, \
            daemon_errors("reading files of the base image"), script_sandbox(s.base_id, s.target, environ) as sandbox:
        rel = package_file(file, s.site)
        path = resolve_image_path(rel, s.site)
        state = Overlay(s.fs)
        against = "the base image"
        if not against_base:
            rows, state = check_steps(s.shared, {}, s.fs, s.site, run_script=sandbox)
            touching = [r for r in rows if r.path == path]
            for r in touching:
                if not r.ok:
                    log(f"warning: existing step {r.step} does not apply ({r.status}); ignored")
            before = [r.step for r in rows if r in touching or r.status in ("ran", "script failed")]
            if before:
                against = "the base image after step(s) " + ", ".join(before)
        try:
            data = state.read(path)
        except BuildError as exc:
            raise BuildError(f"cannot read {path} from the base image: {exc.message}") from None
        if data is None:
            raise BuildError(f"{path} is not in the base image of target {s.target.name!r}",
                             hint="give a path relative to the site directory (vllm/...) or an absolute one")
        original = text_of(data)
        if original is None:
            raise BuildError(f"{path} is not UTF-8 text in the image; use an overlay step instead")
        taken = [st.id for st in s.shared] + [st.id for p in s.target.profiles.values() for st in p.steps]
        prefix = id_prefix or posixpath.splitext(posixpath.basename(path))[0].replace("_", "-")
        steps = derive_patch_steps(original, edited_text, file=rel, id_prefix=prefix, taken=taken)
        check = apply_steps(original, steps)
        if check != edited_text:  # pragma: no cover - derive_patch_steps guarantees this
            raise BuildError("internal error: the derived steps do not reproduce the edited file")
        if steps:
            header = [f"patch-from: {len(steps)} step(s) turning {path}", f"({against}) into {edited}.",
                      f"Paste at the end of targets.{s.target.name}.steps."]
            text = render_steps_yaml(steps, header=header)
        else:
            text = f"# patch-from: {edited} equals {path} ({against}): nothing to patch\n"
        return PatchFromResult(rel, path, tuple(steps), text, against)
