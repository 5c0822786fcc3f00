"""The submission tree: what the competition platform clones, builds with ``docker build`` and starts.

::

    Dockerfile               FROM the target's base; one instruction group per step, in order, each
                             preceded by a comment with the step id and its why
    computility-run.yaml     concurrency 1, the image's command as a list, the serving env
    imageforge-submission.json   manifest digest, imageforge version, base facts, sha256 of every file
    imageforge/apply.py      the generated stdlib-only applier (imageforge.patches.anchored's own code)
    imageforge/verify.py     the engine's verification script, without imports
    imageforge/steps/NN-ID/  each step's files (step.json, overlay/script sources)
    <folder>/                a directory script step's folder (e.g. qwen3_6_scripts/)
    .dockerignore, .gitattributes   keep .git out of the context; no line-ending conversion by git

Deterministic: the same manifest, profile, inputs and base give byte-identical files (no time, no
host path, LF only).  :func:`check_submission` regenerates the tree and reports every difference.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import __version__
from ..base import base_reference, discover_package
from ..docker_engine import client, daemon_errors, ensure_daemon
from ..docker_engine.containers import containers
from ..errors import BuildError, ConfigError, InfraError, Problem
from ..labels import L_KIND, L_TOOL, TOOL
from ..manifest.resolve import Resolved
from ..plan import Plan, make_plan
from ..serve.command import flag_pairs
from ..steps import kind
from ..steps.dockerfile import APPLIER, HELPER_DIR, BaseFacts, ContextFile, EmitContext, Emitted, env_value
from .applier import applier_source
from .kinds import emitter
from .runyaml import RUN_YAML, read_run_yaml, render_run_yaml

Log = Callable[[str], None]
RECORD = "imageforge-submission.json"
RESERVED = {"Dockerfile", RUN_YAML, RECORD, HELPER_DIR, ".dockerignore", ".gitattributes", ".git"}
LABEL_PREFIX = "org.imageforge.submission"


@dataclass(frozen=True)
class SubmissionResult:
    out_dir: Path
    files: tuple[str, ...]
    base_ref: str
    base: BaseFacts
    tree_sha256: str
    commit: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"out_dir": str(self.out_dir), "files": list(self.files), "base": self.base_ref,
                "base_facts": self.base.to_json(), "tree_sha256": self.tree_sha256, "commit": self.commit}


def discover_base(resolved: Resolved, environ: Mapping[str, str], log: Log) -> tuple[str, BaseFacts]:
    """The base reference and what the Dockerfile needs from the base image (read through the daemon)."""
    if resolved.target.base.recipe is None and resolved.target.base.reference(environ) is None:
        t = resolved.target
        raise InfraError(f"the base image of target {t.name!r} comes from ${t.base.image_env}, which is not set",
                         key_path=f"targets.{t.name}.base.image",
                         hint=t.base.load_hint or f"export {t.base.image_env}=<image reference>")
    ensure_daemon(log=log)
    with daemon_errors("reading the base image"):
        ref, image_id = base_reference(resolved, environ, log, make=False)
        config = client().images.get(image_id).attrs.get("Config") or {}
        with containers({L_TOOL: TOOL, L_KIND: "submission"}) as scope:
            info = discover_package(image_id, resolved.target, scope, log)
    return ref, BaseFacts(info.site, info.python, tuple(config.get("Entrypoint") or ()), info.python_version)


def _folder_names(plan: Plan, environ: Mapping[str, str]) -> dict[str, str]:
    """Step id -> root folder of the tree for directory script steps (the folder's own name when free)."""
    out: dict[str, str] = {}
    taken = set(RESERVED)
    for planned in plan.steps:
        step = planned.step
        if step is None:
            continue
        directory = kind(step.kind).context_folder(step, environ)
        name = directory.name if directory is not None else ""
        if name and name not in taken and not name.startswith("."):
            out[step.id] = name
            taken.add(name)
    return out


def render_tree(plan: Plan, *, environ: Mapping[str, str], base_ref: str, base: BaseFacts) -> dict[str, ContextFile]:
    """Every file of the tree (path -> bytes + mode), the record included."""
    r = plan.resolved
    digest = r.manifest.digest
    files: dict[str, ContextFile] = {APPLIER: ContextFile(applier_source().encode())}
    folders = _folder_names(plan, environ)
    total = len(plan.steps)
    groups: list[str] = []
    notes: list[str] = []
    for index, planned in enumerate(plan.steps, 1):
        ctx = EmitContext(base=base, environ=environ, step_dir=f"{HELPER_DIR}/steps/{index:02d}-{planned.id}",
                          index=index, total=total, folder_name=folders.get(planned.id))
        emitted: Emitted
        if planned.stage in ("verify", "config"):
            emitted = emitter(planned.stage)(plan, ctx)
        else:
            assert planned.step is not None
            emitted = emitter(planned.step.kind)(planned.step, ctx)
        for path, file in emitted.files.items():
            if path in files and files[path] != file:
                raise ConfigError(f"two steps write different files at {path} in the submission tree")
            files[path] = file
        groups.append("\n".join(emitted.instructions))
        notes.extend(emitted.not_replicated)
    head = [
        f"# Generated by imageforge {__version__} from the manifest (digest {digest}):",
        f"# target {r.target.name}, profile {r.profile_name}. Edit build.yaml and regenerate; do not edit this file.",
        "# Plain `docker build .` (Docker 20.10's classic builder: no COPY --chmod, heredocs or --mount).",
        f"# {r.target.package.distribution} {r.target.package.version} lives at {base.site} in the base image "
        f"(python {base.python}).",
        "# Build-time helpers (imageforge/apply.py, imageforge/verify.py) use the standard library only:",
        "# no step imports torch or vLLM. Not replicated from imageforge's build: its layer labels (cache keys,",
        "# run ids); " + ("; ".join(notes) if notes else "nothing else") + ".",
        f"FROM {base_ref}",
        f"LABEL {LABEL_PREFIX}.manifest-digest={env_value(digest)} {LABEL_PREFIX}.imageforge={env_value(__version__)} "
        f"{LABEL_PREFIX}.target={env_value(r.target.name)} {LABEL_PREFIX}.profile={env_value(r.profile_name)}",
    ]
    dockerfile = "\n".join(head) + "\n\n" + "\n\n".join(groups) + "\n"
    files["Dockerfile"] = ContextFile(dockerfile.encode())
    files[RUN_YAML] = ContextFile(render_run_yaml(plan, base.entrypoint, digest=digest, version=__version__))
    files[".dockerignore"] = ContextFile(b".git\n")
    files[".gitattributes"] = ContextFile(b"# byte-exact: no line-ending conversion on checkout\n* -text\n")
    for path, file in files.items():
        if b"\r" in file.data and not _binary(file.data):
            raise ConfigError(f"{path} would hold a CR line ending; the submission tree is LF-only",
                              hint="convert the source file to LF line endings")
    record = {
        "imageforge": __version__,
        "manifest_digest": digest,
        "target": r.target.name,
        "profile": r.profile_name,
        "base": base_ref,
        "base_facts": base.to_json(),
        "files": {p: {"sha256": hashlib.sha256(f.data).hexdigest(), "mode": f"{f.mode:o}"}
                  for p, f in sorted(files.items())},
    }
    files[RECORD] = ContextFile((json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
    return dict(sorted(files.items()))


def _binary(data: bytes) -> bool:
    return b"\0" in data[:8192]


def tree_sha256(files: Mapping[str, ContextFile]) -> str:
    h = hashlib.sha256()
    for path, file in sorted(files.items()):
        h.update(f"{path}\0{file.mode:o}\0{hashlib.sha256(file.data).hexdigest()}\n".encode())
    return h.hexdigest()


def _plan(resolved: Resolved, environ: Mapping[str, str]) -> Plan:
    return make_plan(resolved, environ=environ, probe=None)


def _existing(out_dir: Path) -> dict[str, ContextFile]:
    out: dict[str, ContextFile] = {}
    for path in sorted(out_dir.rglob("*")):
        rel = path.relative_to(out_dir).as_posix()
        if rel == ".git" or rel.startswith(".git/") or not path.is_file() or path.is_symlink():
            continue
        out[rel] = ContextFile(path.read_bytes(), 0o755 if os.access(path, os.X_OK) else 0o644)
    return out


def write_submission(resolved: Resolved, out_dir: Path, *, environ: Mapping[str, str], base_ref: str | None = None,
                     base: BaseFacts | None = None, git: bool = False, log: Log = print) -> SubmissionResult:
    """Write (or rewrite) the tree at ``out_dir``; files that are not part of it are removed (``.git`` stays).

    ``base_ref``/``base`` default to what the daemon says about the target's base image.
    """
    if base_ref is None or base is None:
        found_ref, found = discover_base(resolved, environ, log)
        base_ref, base = base_ref or found_ref, base or found
    plan = _plan(resolved, environ)
    files = render_tree(plan, environ=environ, base_ref=base_ref, base=base)
    out_dir = Path(out_dir)
    if out_dir.exists() and any(p.name != ".git" for p in out_dir.iterdir()) and not (out_dir / RECORD).exists():
        raise ConfigError(f"{out_dir} is not empty and holds no {RECORD}: refusing to overwrite it",
                          hint="give an empty or new directory, or a tree imageforge wrote before")
    out_dir.mkdir(parents=True, exist_ok=True)
    for rel in _existing(out_dir):
        if rel not in files:
            (out_dir / rel).unlink()
    for path in sorted(out_dir.rglob("*"), reverse=True):  # empty folders left by removed files
        if path.is_dir() and ".git" not in path.relative_to(out_dir).parts and not any(path.iterdir()):
            path.rmdir()
    for rel, file in files.items():
        dest = out_dir / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists() or dest.read_bytes() != file.data:
            dest.write_bytes(file.data)
        os.chmod(dest, file.mode)
    log(f"submission tree for {resolved.target.name}:{resolved.profile_name} -> {out_dir} ({len(files)} files, "
        f"FROM {base_ref})")
    commit = git_commit(out_dir, resolved, log) if git else None
    return SubmissionResult(out_dir, tuple(files), base_ref, base, tree_sha256(files), commit)


def git_commit(out_dir: Path, resolved: Resolved, log: Log) -> str:
    """``git init`` (once) + commit everything; returns the commit id (no new commit when nothing changed)."""
    def git(*args: str) -> str:
        proc = subprocess.run(["git", "-c", "user.name=imageforge", "-c", "user.email=imageforge@localhost",
                               "-c", "core.autocrlf=false", "-C", str(out_dir), *args],
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise InfraError(f"git {args[0]} failed in {out_dir}", found=(proc.stderr or proc.stdout).strip()[-400:])
        return proc.stdout.strip()

    if shutil.which("git") is None:
        raise InfraError("git is not installed", hint="apt-get install git")
    if not (out_dir / ".git").exists():
        git("init", "-q")
    git("add", "-A")
    if git("status", "--porcelain"):
        r = resolved
        git("commit", "-q", "-m", f"imageforge submission: target {r.target.name}, profile {r.profile_name} "
            f"(manifest {r.manifest.short_digest}, imageforge {__version__})")
    head = git("rev-parse", "HEAD")
    log(f"committed {out_dir} at {head[:12]}")
    return head


# --------------------------------------------------------------------------- --check


def _yaml_differences(expected: bytes, found: bytes) -> list[str]:
    try:
        got = read_run_yaml(found)
    except Exception as exc:  # any YAML error is a difference
        return [f"{RUN_YAML} is not valid YAML: {exc}"]
    want = read_run_yaml(expected)
    out: list[str] = []
    for key in ("concurrency",):
        if got.get(key) != want.get(key):
            out.append(f"{RUN_YAML} {key}: expected {want.get(key)!r}, found {got.get(key)!r}")
    want_cmd, got_cmd = list(want.get("command") or []), got.get("command")
    if not isinstance(got_cmd, list) or not all(isinstance(x, str) for x in got_cmd):
        out.append(f"{RUN_YAML} command: expected a list of strings, found {got_cmd!r}")
    elif got_cmd != want_cmd:
        w, g = dict(flag_pairs(want_cmd)), dict(flag_pairs(got_cmd))
        for flag in sorted(set(w) | set(g)):
            if flag not in g:
                out.append(f"{RUN_YAML} command: {flag} missing (expected {w[flag]!r})")
            elif flag not in w:
                out.append(f"{RUN_YAML} command: {flag} {g[flag]!r} is not in the manifest")
            elif w[flag] != g[flag]:
                out.append(f"{RUN_YAML} command: {flag} expected {w[flag]!r}, found {g[flag]!r}")
        if not out or (w == g):
            out.append(f"{RUN_YAML} command differs: expected {want_cmd}, found {got_cmd}")
    want_env = {e["name"]: e["value"] for e in want.get("env") or []}
    raw_env = got.get("env")
    if not isinstance(raw_env, list) or not all(isinstance(e, Mapping) and set(e) == {"name", "value"}
                                                  for e in raw_env):
        out.append(f"{RUN_YAML} env: expected a list of {{name, value}}, found {raw_env!r}")
    else:
        got_env = {str(e["name"]): e["value"] for e in raw_env}
        for name in sorted(set(want_env) | set(got_env)):
            if want_env.get(name) != got_env.get(name):
                out.append(f"{RUN_YAML} env {name}: expected {want_env.get(name)!r}, found {got_env.get(name)!r}")
    return out


def _bash_n(path: Path) -> str | None:
    bash = shutil.which("bash")
    if bash is None:
        return None
    proc = subprocess.run([bash, "-n", str(path)], capture_output=True, text=True, timeout=30)
    return None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["syntax error"])[-1]


def _is_shell(rel: str, data: bytes) -> bool:
    first = data.split(b"\n", 1)[0]
    if rel.endswith(".sh"):
        return True
    if not first.startswith(b"#!"):
        return False
    words = first[2:].split()
    names = [w.rsplit(b"/", 1)[-1] for w in words[:2]]
    return bool(names) and (names[0] in (b"sh", b"bash", b"dash") or (names[0] == b"env" and names[1:2] in
                                                                      ([b"sh"], [b"bash"], [b"dash"])))


def check_submission(resolved: Resolved, tree: Path, *, environ: Mapping[str, str], base_ref: str | None = None,
                     base: BaseFacts | None = None, log: Log = print) -> int:
    """Preflight of an existing tree against the manifest; ConfigError (exit 2) listing every difference.

    The base facts come from the tree's record unless given (so no daemon is needed); returns the
    number of files checked.
    """
    tree = Path(tree)
    found = _existing(tree) if tree.is_dir() else {}
    if not found:
        raise ConfigError(f"{tree} holds no submission tree", hint="write one first (write_submission)")
    if base_ref is None or base is None:
        try:
            record = json.loads(found[RECORD].data) if RECORD in found else None
        except ValueError:
            record = None
        if record is None:
            raise ConfigError(f"{tree}/{RECORD} is missing or not JSON: cannot tell which base the tree was made for",
                              hint="regenerate the tree")
        base_ref = base_ref or str(record["base"])
        base = base or BaseFacts.from_json(record["base_facts"])
    expected = render_tree(_plan(resolved, environ), environ=environ, base_ref=base_ref, base=base)
    problems: list[Problem] = []
    for rel in sorted(set(expected) - set(found)):
        problems.append(Problem(f"missing: {rel}"))
    for rel in sorted(set(found) - set(expected)):
        problems.append(Problem(f"not generated by the manifest: {rel}"))
    for rel in sorted(set(expected) & set(found)):
        want, got = expected[rel], found[rel]
        if rel == RUN_YAML:
            for line in _yaml_differences(want.data, got.data):
                problems.append(Problem(line))
        if want.data != got.data:
            detail = None
            if not _binary(want.data) and not _binary(got.data):
                diff = list(difflib.unified_diff(want.data.decode(errors="replace").splitlines(),
                                                 got.data.decode(errors="replace").splitlines(),
                                                 f"expected/{rel}", f"found/{rel}", lineterm="", n=1))
                detail = "\n".join(diff[:40]) + ("\n..." if len(diff) > 40 else "")
            problems.append(Problem(f"content differs: {rel} (sha256 {hashlib.sha256(got.data).hexdigest()[:16]}, "
                                    f"expected {hashlib.sha256(want.data).hexdigest()[:16]})", found=detail))
        if (want.mode & 0o111) != (got.mode & 0o111):
            problems.append(Problem(f"executable bit differs: {rel}", expected=f"{want.mode:o}", found=f"{got.mode:o}"))
    for rel, file in sorted(found.items()):
        if b"\r" in file.data and not _binary(file.data):
            problems.append(Problem(f"CR line ending in {rel}: the tree must be LF-only"))
        if _is_shell(rel, file.data):
            error = _bash_n(tree / rel)
            if error:
                problems.append(Problem(f"bash -n {rel}: {error}"))
    if problems:
        raise ConfigError(f"submission tree {tree} differs from the manifest (target {resolved.target.name}, "
                          f"profile {resolved.profile_name}): {len(problems)} problem(s)", problems=problems,
                          hint="regenerate it with write_submission (or `invoke submission`)")
    log(f"submission tree {tree} matches the manifest ({len(found)} files)")
    return len(found)


def docker_build(tree: Path, tag: str | None = None, *, log: Log = print) -> str:
    """Plain ``docker build`` of a tree through the docker SDK (legacy builder); BuildError with the log tail."""
    import docker.errors

    c = client()
    lines: list[str] = []
    try:
        image, stream = c.images.build(path=str(tree), tag=tag, rm=True, forcerm=True)
        for chunk in stream:
            if "stream" in chunk:
                lines.extend(chunk["stream"].rstrip("\n").splitlines())
        return str(image.id)
    except docker.errors.BuildError as exc:
        for chunk in exc.build_log:
            if isinstance(chunk, Mapping) and "stream" in chunk:
                lines.extend(str(chunk["stream"]).rstrip("\n").splitlines())
        raise BuildError(f"docker build of {tree} failed", found=str(exc.msg)[:400], log_tail=lines[-30:]) from None
