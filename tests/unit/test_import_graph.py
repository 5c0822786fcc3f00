"""The import graph of src/imageforge, drawn from the code: no cycle, no module importing a higher stage.

Every import counts: top-of-file, inside functions and under ``if TYPE_CHECKING:`` (``ast.walk``
sees them all).  A module's stage is that of its longest name in STAGES (``base.identity`` is ``base``,
``serve.waits`` has its own); a module may import its own stage or lower ones, and within a stage the imports must
not cycle.
A new module must be given a stage here (and in CONTRIBUTING.md's list).
"""

from __future__ import annotations

import ast
import functools
import graphlib
import shutil
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "imageforge"

#: Lowest first. The pipeline reads upwards: manifest -> resolve -> plan -> build (its verify layer
#: inside) -> serve -> smoke/bench -> export, over the primitives at the bottom; app is the front door.
#: An entry is a top-level name (a module, or a package and all its modules) or a dotted name inside a
#: package: a package groups one concern, and a module of it that sits at another level is named on its own
#: (``serve.openai_wire``: the wire formats every client uses, far below the server runtime).
STAGES: tuple[tuple[str, ...], ...] = (
    ("errors", "labels", "settings"),  # one error root, every label, the tool's own options
    # pure helpers; run directories and locks; HTTP wire formats and the health wait; progress and output
    ("patches", "rundirs", "cli.output", "cli.progress", "serve.openai_wire", "serve.waits", "serve.ports",
     "workload",
     "wheelhouse",  # wheelhouse.join: the stdlib joiner beside the parts
     "inimage",  # the programs run inside an image (verify, the flag listing, the tree's step runtime), as text
     "vendor_api",  # the vendor API record: its format, the arity check, ELF facts, the probe
     "scripts.deadfiles"),  # which .py files of a script's folder its command runs or imports (verify, preflight)
    ("docker_engine",),  # the daemon: engine setup, SDK client, the one error translator, container files
    # the frozen model of build.yaml and YAML (problem words, loader, schemas); equiv tolerances; the one
    # precedence chain
    ("manifest",),
    ("serve.command",),  # the serving command made of the resolved values (argv, config file, CMD)
    ("plan", "flags"),  # content keys; serving flags: model, learnt from the vLLM, checked
    ("base", "scripts"),  # which image a target builds on (identity, discovery, probe), the cpu recipe; script steps
    # one class per step kind: fields, defaults, load, inputs, apply -> Changes, verify facts, Dockerfile emit;
    # manifest.load: build.yaml loaded and checked into the manifest (each step's keys by its kind's class)
    ("steps", "manifest.load"),
    ("verify", "blame", "lock", "clean"),  # the verify layer's checks; the step a traceback blames; build.lock; clean
    ("flags.evaluator",),  # serving values against the evaluator's functional checks (validate, plan, preflight)
    # the layers; dry runs of the steps, patch-from against an image; flags learnt from an image
    ("build", "patches.check", "patches.from_image", "flags.images"),
    ("inplace",),  # the steps applied to the machine itself through a journal; revert, status
    # the server runtime: the one Runtime (runtime), the container (spec, container), the server as a process
    ("serve",),
    ("smoke", "bench"),  # checks and load against a server (bench: the evaluator replay, its metrics, plots)
    ("equiv", "forensics"),  # teacher-forced comparison; bisect and ablate over the step chain
    ("export", "submission"),  # the deliverables: a saved image; the tree the platform builds
    ("preflight",),  # every check that needs no card, over the final tree, in one run
    ("app",),  # the front door: the commands call only this
    ("cli", "starter"),  # the `imageforge` command: its tasks, how a task is declared, launch; `init`'s project
)
STAGE = {name: level for level, names in enumerate(STAGES) for name in names}


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package under ``root`` (a src directory)."""
    out: dict[str, Path] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


@functools.cache
def import_nodes(text: str) -> tuple[ast.Import | ast.ImportFrom, ...]:
    """Every import statement of a file's text, anywhere in it (by text: the tests' copies of the package parse
    only the file they changed)."""
    return tuple(node for node in ast.walk(ast.parse(text)) if isinstance(node, (ast.Import, ast.ImportFrom)))


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``module`` imports, anywhere in its file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in import_nodes(path.read_text()):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            # `from pkg import name`: the submodule pkg.name when there is one, else pkg itself
            names = [f"{source}.{a.name}" if f"{source}.{a.name}" in known else source for a in node.names]
        for name in names:
            while name and name not in known:  # `import imageforge.base.identity` -> that module
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    files = module_files(root)
    known = set(files)
    return {module: imports_of(module, path, known) for module, path in files.items()}


def stage_name(module: str) -> str:
    """The STAGES entry a module falls under: its longest dotted prefix named there, else its top-level name."""
    parts = module.split(".")[1:]
    for n in range(len(parts), 1, -1):
        if ".".join(parts[:n]) in STAGE:
            return ".".join(parts[:n])
    return parts[0] if parts else ""


def problems(graph: dict[str, set[str]]) -> list[str]:
    """Every module without a stage, every import of a higher stage, and a cycle if there is one."""
    out: list[str] = []
    for module in sorted(graph):
        name = stage_name(module)
        if name and name not in STAGE:
            out.append(f"{module} has no stage: add {name!r} to STAGES (and CONTRIBUTING.md)")
    for module, targets in sorted(graph.items()):
        if stage_name(module) not in STAGE:
            continue
        here = STAGE[stage_name(module)]
        for target in sorted(targets):
            there = STAGE.get(stage_name(target), -1)
            if there > here:
                out.append(f"upward import: {module} (stage {here}) -> {target} (stage {there})")
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        out.append("cycle: " + " -> ".join(exc.args[1]))
    return out


def test_no_cycle_and_no_upward_import() -> None:
    graph = import_graph(SRC)
    assert len(graph) > 20 and f"{PACKAGE}.build" in graph
    assert problems(graph) == []


def test_function_local_and_type_checking_imports_count() -> None:
    graph = import_graph(SRC)
    # verify.py imports PackageInfo under TYPE_CHECKING only; app.py imports everything inside functions
    assert f"{PACKAGE}.base" in graph[f"{PACKAGE}.verify"]
    assert f"{PACKAGE}.build" in graph[f"{PACKAGE}.app"]


def _copy(tmp_path: Path) -> Path:
    # symlinks=True: the starter's links to the repository's images/ stay links (not modules of the package)
    shutil.copytree(SRC / PACKAGE, tmp_path / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"), symlinks=True)
    return tmp_path


def _append(root: Path, module: str, code: str) -> None:
    path = root / PACKAGE / f"{module}.py"
    path.write_text(path.read_text() + "\n\n" + code + "\n")


def test_a_planted_upward_import_inside_a_function_fails(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    _append(root, "errors", "def _planted() -> None:\n    from .app import settings\n")
    expected = f"upward import: {PACKAGE}.errors (stage 0) -> {PACKAGE}.app (stage {STAGE['app']})"
    assert expected in problems(import_graph(root))


def test_a_planted_cycle_under_type_checking_fails(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    # lock and verify share a stage: no upward import, but now a cycle
    guarded = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .{} import {}\n"
    _append(root, "verify", guarded.format("lock", "read_lock"))
    _append(root, "lock", guarded.format("verify", "VerifySpec"))
    found = problems(import_graph(root))
    assert len(found) == 1 and found[0].startswith("cycle: "), found
    assert f"{PACKAGE}.verify" in found[0] and f"{PACKAGE}.lock" in found[0]


def test_a_new_module_needs_a_stage(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    (root / PACKAGE / "newcomer.py").write_text("from .errors import ConfigError\n")
    assert problems(import_graph(root)) == [
        f"{PACKAGE}.newcomer has no stage: add 'newcomer' to STAGES (and CONTRIBUTING.md)"
    ]


def test_a_module_named_on_its_own_has_its_own_stage(tmp_path: Path) -> None:
    # serve.waits sits at stage 1, below the runtime of its package: importing serve.container from it is upward
    assert stage_name(f"{PACKAGE}.serve.waits") == "serve.waits"
    assert stage_name(f"{PACKAGE}.serve.container") == "serve"
    root = _copy(tmp_path)
    _append(root, "serve/waits", "def _planted() -> None:\n    from .container import serving\n")
    expected = (f"upward import: {PACKAGE}.serve.waits (stage {STAGE['serve.waits']}) -> "
                f"{PACKAGE}.serve.container (stage {STAGE['serve']})")
    assert expected in problems(import_graph(root))
