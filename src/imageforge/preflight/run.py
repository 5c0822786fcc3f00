"""``imageforge preflight``: every check that needs no card, in one run, over the tree as far as it was built.

Order: validate (its problems are findings; a manifest that does not load ends the run there) -> the steps on
the base (check-patches' machinery: file steps on an overlay, script steps for real in a throwaway container,
network off; a failed script's container is kept, so the checks go on over the files as it left them: what a
Dockerfile RUN that discards the exit code builds) -> the final tree (the change scan of the scripts, the file
steps' results, a listing of the import roots) -> the Python, vendor API, shell, pin, CRLF, Dockerfile checks ->
a function replaced at run time against every call of it in the package (the files naming it, found by grep
in the sandbox) -> the serving flags against the parser as the steps leave it -> the submission tree rendered
from the manifest -> what git would ship.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import posixpath
import shlex
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..docker_engine import client, daemon_errors
from ..errors import ConfigError, ImageforgeError, Problem
from ..inimage.compile_files import MARKER as COMPILE_MARKER
from ..manifest.model import Manifest, Step, resolve_image_path
from ..manifest.resolve import resolve
from ..patches.check import (
    Overlay,
    ScriptOutcome,
    ScriptSandbox,
    check_steps,
    final_state,
    image_session,
    script_sandbox,
)
from ..patches.compiled import Compiled
from ..scripts.deadfiles import live_files
from ..steps import ContainerFS, kind, one_file
from ..vendor_api import VendorApi, load_record
from .binaries import shared_objects, shipped_so_findings
from .findings import Finding, PhaseClock, PreflightReport
from .gitstate import git_findings
from .python import PyFile, PythonChecks, dead_files
from .runfile import RUN_FILE, manifest_env_findings, run_file_findings
from .shell import (
    Script,
    bash_n,
    build_device_imports,
    cp_sources,
    crlf,
    names_from,
    names_program,
    pins,
    python_heredocs,
    python_runs,
    run_exit_codes,
    shell_scripts,
    shellcheck,
)
from .tree import FinalTree, ShippedFolder, TreeFile, listing_from

Log = Callable[[str], None]


def problem_findings(exc: ImageforgeError, check: str) -> list[Finding]:
    problems: Sequence[Problem] = exc.problems or (Problem(exc.message, exc.location, exc.key_path, exc.expected,
                                                           exc.found, exc.hint),)
    out = []
    for p in problems:
        loc = p.location
        out.append(Finding(check, (f"{p.key_path}: " if p.key_path else "") + p.message,
                           loc.file if loc else "", loc.line if loc else None, loc.column if loc else None,
                           expected=p.expected, found=p.found, hint=p.hint))
    return out


@dataclass
class _Runner:
    """The sandbox as check-patches' ScriptRunner, remembering which step changed which file and the files a
    failed script left (``partial``)."""

    sandbox: ScriptSandbox
    producer: dict[str, str] = field(default_factory=dict)
    partial: ContainerFS | None = None
    failed_step: str | None = None

    def __call__(self, step: Step, state: Overlay) -> ScriptOutcome:
        outcome = self.sandbox(step, state)
        for path in self.sandbox.changed:
            self.producer.setdefault(path, step.id)
        if outcome.exit_code != 0 and outcome.fs is not None:
            self.partial = outcome.fs  # type: ignore[assignment]
            self.failed_step = step.id
        return outcome


def _roots_and_listing(sandbox: ScriptSandbox, python: str, dests: Sequence[str]) -> tuple[tuple[str, ...],
                                                                                          frozenset[str]]:
    """The interpreter's sys.path (site dirs, PYTHONPATH) and every directory, .py and .so under it, from one
    throwaway container of the tree as the scripts left it (network off)."""
    find = ("find \"$@\" -maxdepth 12 \\( -type d -o -name '*.py' -o -name '*.so' -o -name '*.pyi' \\) "
            "2>/dev/null; true")
    script = (f"{shlex.quote(python)} -c 'import sys; print(\"\\n\".join(p for p in sys.path if p.startswith(\"/\")))'"
              " > /tmp/.imageforge-roots; echo '--'; cat /tmp/.imageforge-roots; echo '--'; "
              f"set -- $(cat /tmp/.imageforge-roots) {' '.join(shlex.quote(d) for d in dests)}; {find}")
    container = sandbox.scope.create(sandbox.image, entrypoint=[], command=["sh", "-c", script],
                                     network_disabled=True)
    try:
        container.start()
        container.wait(timeout=300)
        output = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
    finally:
        sandbox.scope.remove(container)
    _, roots_text, rest = ([*output.split("--\n", 2), "", ""])[:3]
    roots = tuple(r for r in roots_text.splitlines() if r and not r.endswith(".zip"))
    return roots, frozenset(line for line in rest.splitlines() if line.startswith("/"))


COMPILE_DIR = "/tmp/.imageforge-compile"
LISTED = "--imageforge-listed--"


def _in_image(sandbox: ScriptSandbox, python: str, files: Sequence[tuple[str, str]],
              greps: Sequence[Sequence[str]]) -> tuple[Compiled | None, list[list[str]], dict[str, bytes]]:
    """One throwaway container of the tree as the scripts left it (network off): ``inimage/compile_files.py`` run
    by the base's interpreter over every file, then each grep argv of ``greps`` (an empty one: none), the files it
    lists put in one tar there (read back with one archive call, not one per file). What the compile said (None
    when that interpreter could not run it), the .py files each grep listed, and their bytes (what the tar held)."""
    import docker.errors

    from ..docker_engine import containers as dc
    from ..inimage import program

    written = {f"{COMPILE_DIR}/compile_files.py": program("compile_files").encode(),
               f"{COMPILE_DIR}/files.json": json.dumps([{"path": p, "text": t} for p, t in files]).encode()}
    entries = [dc.file_entry(path, data, mode=0o644) for path, data in written.items()]
    script = f"{shlex.quote(python)} {COMPILE_DIR}/compile_files.py {COMPILE_DIR}/files.json"
    for i, argv in enumerate(greps):
        script += f"; echo {LISTED}"
        if argv:
            listing = f"{COMPILE_DIR}/listed-{i}"
            script += f"; {shlex.join(argv)} > {listing}; cat {listing}; tar -cf {listing}.tar -T {listing} 2>/dev/null"
    container = sandbox.scope.create(sandbox.image, entrypoint=[], network_disabled=True,
                                     command=["sh", "-c", script + "; true"])
    output = ""
    contents: dict[str, bytes] = {}
    try:
        payloads = {e.name: data for e, data in zip(entries, written.values(), strict=True)}
        if container.put_archive("/", dc.tar_of(entries, payloads)):
            container.start()
            container.wait(timeout=300)
            output = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
            for i, argv in enumerate(greps):
                tar = dc.read_file(container, f"{COMPILE_DIR}/listed-{i}.tar") if argv else None
                if tar is not None:  # an image without tar: the files are read one by one later
                    contents.update(_tar_files(tar[0]))
    except (docker.errors.DockerException, OSError, ImageforgeError):
        output = output or ""
    finally:
        sandbox.scope.remove(container)
    said, *lists = output.split(LISTED + "\n")
    lists += [""] * (len(greps) - len(lists))
    listed = [[x for x in text.splitlines() if x.startswith("/") and x.endswith(".py")] for text in lists]
    return Compiled.from_output(said, COMPILE_MARKER), listed, contents


def _tar_files(data: bytes) -> dict[str, bytes]:
    """Absolute path -> bytes of each regular file of a tar (written by ``tar -c`` with absolute names)."""
    import io
    import tarfile

    out: dict[str, bytes] = {}
    with contextlib.suppress(tarfile.TarError), tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar:
            handle = tar.extractfile(member) if member.isfile() else None
            if handle is not None:
                out["/" + member.name.lstrip("/")] = handle.read()
    return out


def _folder_snapshot(folders: Sequence[ShippedFolder]) -> dict[str, str]:
    return {f"{f.step}/{rel}": hashlib.sha256(p.read_bytes()).hexdigest() for f in folders
            for rel, p in f.files().items()}


def file_step_producers(steps: Sequence[Step], site: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for step in steps:
        written = one_file(step)
        if written is not None:
            out[resolve_image_path(written, site)] = step.id
    return out


def host_inputs(manifest: Manifest, steps: Sequence[Step], environ: Mapping[str, str],
                 vendor_api: Path | None) -> list[tuple[Path, str | None]]:
    files: list[tuple[Path, str | None]] = [(manifest.path, None)]
    if vendor_api is not None:
        files.append((vendor_api, None))
    for step in steps:
        if step.source_path is not None:
            files.append((step.source_path, step.id))
        folder = kind(step.kind).context_folder(step, environ)
        if folder is not None and folder.is_dir():
            files += [(p, step.id) for p in sorted(folder.rglob("*")) if p.is_file() and ".git" not in p.parts]
    return files


def run_preflight(load: Callable[[], Manifest], validate: Callable[[Manifest], Any], target_name: str | None,
                  profile_name: str | None, *, environ: Mapping[str, str], strict: bool = False,
                  allow_dirty: bool = False, log: Log) -> PreflightReport:
    """The report (the caller prints it and fails with exit 3 when it is not ok)."""
    clock = PhaseClock()
    mark = clock.mark
    findings: list[Finding] = []
    notes: list[str] = []
    try:
        manifest = load()
    except ConfigError as exc:
        return PreflightReport(target_name or "?", profile_name, tuple(problem_findings(exc, "validate")), strict,
                               ("validate",), seconds=clock.elapsed())
    try:
        validate(manifest)
    except ConfigError as exc:
        findings += problem_findings(exc, "validate")
    mark("validate")
    target = manifest.target(target_name)
    profile = profile_name or target.default_profile
    api: VendorApi | None = None
    if target.vendor_api is not None and target.vendor_api.is_file():
        with contextlib.suppress(ConfigError):  # its format problems are validate's findings already
            api = load_record(target.vendor_api)
    stats: dict[str, int] = {}
    with image_session(manifest, target.name, profile, environ=environ, log=log) as s, \
            daemon_errors("preflight: reading the base image"), \
            script_sandbox(s.base_id, s.target, environ, keep_failed=True) as sandbox:
        steps = [*s.shared, *(s.profiles.get(profile, ()) if profile else ())]
        folders = shipped_folders(steps, environ)
        snapshot = _folder_snapshot(folders)
        runner = _Runner(sandbox)
        finals: dict[str, Overlay] = {}
        rows, state = check_steps(s.shared, s.profiles, s.fs, s.site, run_script=runner,
                                  python_version=s.python_version, finals=finals)
        mark("steps")
        for row in rows:
            if row.ok:
                continue
            loc = row.location
            check = "script-failed" if row.status == "script failed" else "step"
            findings.append(Finding(
                check, f"step {row.step}: {row.status}: {row.detail}", loc.file if loc else "",
                loc.line if loc else None, step=row.step, found=" | ".join(row.log_tail[-6:]) or None,
                hint=("the checks below run over the files as the script left them (what a RUN that discards "
                      "the exit code builds)" if check == "script-failed" else
                      f"imageforge check-patches --target {target.name} --diff")))
        if s.version_problem:
            findings.append(Finding("package-version", s.version_problem, str(manifest.path)))
        final = finals.get(profile or "", state) if profile else state
        if runner.partial is not None:
            final = Overlay(runner.partial)
            notes.append(f"script step {runner.failed_step} failed: the tree is checked as it left it")
        site_prefix = s.site.rstrip("/") + "/"
        changed_py = [p for p in sandbox.changed if p.startswith(site_prefix)]
        ran_steps = steps[: next(i for i, st in enumerate(steps) if st.id == runner.failed_step) + 1] \
            if runner.failed_step else steps  # the steps after a failed script never applied
        fs_state = final_state(ran_steps, final, s.site, environ=environ, python_version=s.python_version,
                               script_changed=changed_py)
        mark("final-state")
        roots, listing = _roots_and_listing(sandbox, s.python, [f.dest for f in folders])
        roots = tuple(dict.fromkeys([*roots, s.site]))
        producers = {**runner.producer, **file_step_producers(steps, s.site)}
        tree = FinalTree(site=s.site, python_version=_grammar(s.python_version, api),
                         package=target.package.import_name, roots=roots,
                         listing=listing | listing_from(final.files), reader=final.read, folders=tuple(folders))
        for path in [*sandbox.changed, *final.files]:
            if not path.endswith(".py") or not any(path.startswith(r.rstrip("/") + "/") for r in roots):
                continue
            if any(path.startswith(f.dest.rstrip("/") + "/") for f in folders):
                continue  # the shipped folder's own files are checked from the host
            data = final.read(path)
            if data is not None:
                added = path in sandbox.added or (path in final.files and s.fs.stat(path) is None)
                tree.files[path] = TreeFile(path, data, producers.get(path, "?"), added)
        stats["changed .py"] = len(tree.files)
        checks = PythonChecks(tree, api)
        scripts = shell_scripts(folders)
        run_texts = [sc.path.read_text(encoding="utf-8", errors="replace") for sc in scripts]
        run_texts += [" ".join(f.command) for f in folders]
        run_py = {rel for sc in scripts for rel in python_runs(sc)}
        for f in tree.files.values():
            checks.check(PyFile(f.path, f.data.decode("utf-8", "replace"), f.step, roots))
        deployed = {hashlib.sha256(f.data).digest() for f in tree.files.values()}
        # the dead-file rule (as verify's): a folder's .py that its command neither runs nor imports is listed as
        # dead by dead_files below, never compiled (the organisers' dead patcher with a syntax error builds fine)
        live = {f"{folder.dest.rstrip('/')}/{rel}" for folder in folders
                for rel in live_files(folder.host, folder.command, dest=folder.dest)}
        for folder in folders:
            for rel, host in folder.files().items():
                if f"{folder.dest.rstrip('/')}/{rel}" not in live:
                    continue
                if rel.endswith(".py") and hashlib.sha256(host.read_bytes()).digest() not in deployed:
                    # a file the script copied into the package is checked there, where its imports resolve; after
                    # a failed script, the imports of a file it never deployed only when a script runs it
                    run = rel in run_py
                    checks.check(PyFile(f"{folder.dest.rstrip('/')}/{rel}",
                                        host.read_text(encoding="utf-8", errors="replace"), folder.step,
                                        (folder.dest, *roots), imports=run or runner.partial is None))
        for sc in scripts:
            for _, text in python_heredocs(sc):  # a `python3 - <<EOF` body: checked at the script's lines
                checks.check(PyFile(sc.image_path, text, sc.folder.step, (sc.folder.dest, *roots)))
        # one throwaway container of the final tree: every checked .py compiled by the base's interpreter; the
        # package's files that name a replaced function (their calls are matched) and, with a record, those that
        # name one of its modules (the vendor's latent references), each listed by grep
        callers_argv = checks.replacements.callers_command() if checks.replacements.found else []
        sources = [(f.path, f.text) for f in checks.compiled_files]
        compiled, (callers, named), contents = _in_image(sandbox, s.python, sources,
                                                         (callers_argv, checks.package_words()))
        tree.cache.update(contents)  # the listed files' bytes in the final image: read once, not one call each
        stats["listed .py read at once"] = len(contents)
        if checks.replacements.found:
            if not callers:  # the replaced module's own file names the function: none at all means no search ran
                notes.append("the search for the callers of a replaced function listed no file (no grep in the "
                             "image?): only the checked files' calls were matched")
            stats["replacement callers"] = checks.replacements.add_callers(callers)
        findings += checks.replacements.findings()
        notes.append(checks.compiled(compiled))
        if api is not None:  # the vendor's latent references: the modules read and every package file naming one
            stats["vendor-scanned .py"] = checks.latent_in([*list(checks._asts), *named])
        syntax_paths = {f.path for f in checks.scan.findings if f.check == "py-syntax"}
        for problem in fs_state.problems:
            if not any(problem.startswith(p) for p in syntax_paths):
                head, _, context = problem.partition("\n")
                path, _, message = head.partition(": ")
                findings.append(Finding("final-state", message or head, path if message else "",
                                        step=producers.get(path), found=context.strip() or None))
        findings += checks.scan.findings
        stats["python files"] = checks.scan.parsed
        findings += dead_files(tree, checks.scan.imported, run_texts, live)
        mark("python")
        if api is not None:
            findings += version_findings(api, s.version, s.python_version, target.package.distribution)
            mark("vendor-api")
        image_env = _image_env(sandbox.image)
        names_set = _NamesSet(sandbox, image_env, {st.id: st for st in steps})
        for sc in scripts:
            findings += bash_n(sc) + shellcheck(sc, names_set) + cp_sources(sc) + build_device_imports(sc)
        for folder in folders:
            findings += pins(folder)
        library_path = [d for d in _serving_env(manifest, target.name, profile, environ).get(
            "LD_LIBRARY_PATH", image_env.get("LD_LIBRARY_PATH", "")).split(":") if d.startswith("/")]
        findings += shipped_so_findings(folders, final, site=s.site, deployed=_deployed(folders, sandbox, final),
                                        interpreter=s.python, library_path=library_path, api=api)
        overlays = [(st.source_path, resolve_image_path(one_file(st) or "", s.site), st.id) for st in steps
                    if st.source_path is not None and one_file(st)]
        findings += crlf(folders, [(p, shown, sid) for p, shown, sid in overlays if p is not None])
        dockerfiles = {manifest.root / "Dockerfile", *(f.host.parent / "Dockerfile" for f in folders)}
        for dockerfile in sorted(d for d in dockerfiles if d.is_file()):
            findings += run_exit_codes(dockerfile)
        stats["scripts"] = len(scripts)
        mark("scripts")
        findings += _flag_findings(manifest, target.name, s, steps, sandbox, final,
                                   environ=environ, partial=runner.partial is not None, log=log)
        mark("flags")
        with contextlib.suppress(ConfigError):  # a manifest that does not resolve is validate's finding
            findings += manifest_env_findings(manifest, target, resolve(manifest, target.name, profile,
                                                                        environ=environ))
        findings += run_file_findings([manifest.root / RUN_FILE, *(f.host.parent / RUN_FILE for f in folders)])
        mark("run-env")
        findings += _submission_findings(manifest, target.name, profile, s, environ, folders, snapshot)
        mark("submission")
    findings += git_findings(host_inputs(manifest, steps, environ, target.vendor_api), allow_dirty=allow_dirty)
    mark("git")
    return PreflightReport(target.name, profile, tuple(findings), strict, tuple(clock.ran), tuple(notes),
                           clock.elapsed(), stats, clock.phases)


def _image_env(image: str) -> dict[str, str]:
    """The image's ENV (its config), name -> value."""
    config = client().images.get(image).attrs.get("Config") or {}
    return dict(str(e).partition("=")[::2] for e in config.get("Env") or ())


def _serving_env(manifest: Manifest, name: str, profile: str | None, environ: Mapping[str, str]) -> dict[str, str]:
    try:
        return resolve(manifest, name, profile, environ=environ).serving_env()
    except ConfigError:
        return {}


def _deployed(folders: Sequence[ShippedFolder], sandbox: ScriptSandbox, final: Overlay) -> dict[str, str]:
    """sha256 -> image path of each shared object a script put outside its folder (by a shipped object's name)."""
    names = {posixpath.basename(rel) for f in folders for rel in shared_objects(f)}
    out: dict[str, str] = {}
    for path in sandbox.changed:
        if posixpath.basename(path) in names and not any(path.startswith(f.dest.rstrip("/") + "/") for f in folders):
            data = final.read(path)
            if data is not None:
                out.setdefault(hashlib.sha256(data).hexdigest(), path)
    return out


@dataclass
class _NamesSet:
    """The variable names a script runs with, as the sandbox shows them: the image's ENV, the step's env, and what
    its ``source``d files and assignments set (:func:`.shell.names_program`, run once per script in a throwaway
    container of the final tree, network off)."""

    sandbox: ScriptSandbox
    image_env: Mapping[str, str]
    steps: Mapping[str, Step]

    def __call__(self, script: Script) -> frozenset[str]:
        from ..steps.script import ScriptSpec

        step = self.steps.get(script.folder.step)
        env = dict(step.spec.env) if step is not None and isinstance(step.spec, ScriptSpec) else {}
        names = {*self.image_env, *env}
        program = names_program(script)
        if program is None:
            return frozenset(names)
        import docker.errors

        container = self.sandbox.scope.create(self.sandbox.image, entrypoint=[], network_disabled=True,
                                              command=["bash", "-c", program, script.image_path], environment=env)
        output = ""
        try:  # an image without bash, or a sourced file that hangs: nothing more is known set, the finding stays
            container.start()
            container.wait(timeout=120)
            output = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
        except (docker.errors.DockerException, OSError):
            output = ""
        finally:
            self.sandbox.scope.remove(container)
        return frozenset(names | names_from(output))


def _grammar(base: str, api: VendorApi | None) -> str:
    """The Python version files are parsed for: the base's, or the record's (the card's) when that is older."""
    from ..patches.pycheck import parse_version

    if api is None or parse_version(api.python) is None:
        return base
    ours, card = parse_version(base), parse_version(api.python)
    return api.python if ours is None or (card is not None and card < ours) else base


def shipped_folders(steps: Sequence[Step], environ: Mapping[str, str]) -> list[ShippedFolder]:
    from ..steps.script import ScriptSpec

    out: list[ShippedFolder] = []
    for step in steps:
        spec = step.spec
        if not isinstance(spec, ScriptSpec):
            continue
        host = step.directory(environ)
        if spec.directory is not None and spec.dest and spec.command and host is not None and host.is_dir():
            out.append(ShippedFolder(step.id, host, spec.dest, spec.command))
    return out


def version_findings(api: VendorApi, version: str, python: str, distribution: str,
                     where: str = "the base's") -> list[Finding]:
    """The record's package and Python versions against those ``where`` has (the base's, or the target
    interpreter's in place)."""
    out: list[Finding] = []
    recorded = api.versions.get(distribution)
    if recorded and recorded != version:
        out.append(Finding("vendor-versions", f"{where} {distribution} is {version}, the record was taken on "
                           f"{recorded}", api.source, expected=recorded, found=version,
                           hint="take the record again on the card: imageforge probe --in-place"))
    if python and api.python and python.split(".")[:2] != api.python.split(".")[:2]:
        out.append(Finding("vendor-versions", f"{where} Python is {python}, the record's {api.python}",
                           api.source, expected=api.python, found=python))
    return out


def _flag_findings(manifest: Manifest, name: str, s: Any, steps: Sequence[Step], sandbox: ScriptSandbox,
                   final: Overlay, *, environ: Mapping[str, str], partial: bool, log: Log) -> list[Finding]:
    from ..flags.images import flags_of_state, target_problems

    try:
        table = flags_of_state(manifest.target(name), base_id=s.base_id, version=s.version, site=s.site,
                               steps=steps, sandbox=sandbox, state=final, environ=environ, store=not partial,
                               log=log)
    except ImageforgeError as exc:
        return [Finding("flags", f"the serving flags could not be learnt: {exc.message}", severity="warning",
                        hint=exc.hint)]
    if table is None:
        return []
    out = []
    for p in target_problems(manifest, name, table, environ):
        loc = p.location
        out.append(Finding("flags", (f"{p.key_path}: " if p.key_path else "") + p.message
                           + (" (the parser as the failed script left it)" if partial else ""),
                           loc.file if loc else "", loc.line if loc else None, loc.column if loc else None,
                           expected=p.expected, found=p.found, hint=p.hint))
    return out


def _submission_findings(manifest: Manifest, name: str, profile: str | None, s: Any, environ: Mapping[str, str],
                         folders: Sequence[ShippedFolder], snapshot: Mapping[str, str]) -> list[Finding]:
    """The tree the platform builds, rendered from the manifest: it can be made, its Dockerfile keeps every exit
    code, and the folders it carries are the bytes the checks ran (a file edited during the run is a finding)."""
    from ..plan import make_plan
    from ..submission import BaseFacts, render_tree

    try:
        resolved = resolve(manifest, name, profile, environ=environ)
        plan = make_plan(resolved, environ=environ, probe=None)
        files = render_tree(plan, environ=environ, base_ref=s.base_ref,
                            base=BaseFacts(s.site, s.python, (), s.python_version))
    except ImageforgeError as exc:
        return problem_findings(exc, "submission")
    out: list[Finding] = []
    with tempfile.TemporaryDirectory(prefix="imageforge-preflight-") as tmp:
        dockerfile = Path(tmp) / "Dockerfile"
        dockerfile.write_bytes(files["Dockerfile"].data)
        for f in run_exit_codes(dockerfile, shown="<submission>/Dockerfile"):
            out.append(f)
    now = _folder_snapshot(folders)
    for key in sorted(set(snapshot) | set(now)):
        if snapshot.get(key) != now.get(key):
            step, _, rel = key.partition("/")
            out.append(Finding("submission", f"{rel} changed while preflight ran: the tree would ship other bytes",
                               posixpath.join(next(f.dest for f in folders if f.step == step), rel), step=step,
                               expected=snapshot.get(key, "absent"), found=now.get(key, "absent"),
                               hint="run preflight again"))
    return out
