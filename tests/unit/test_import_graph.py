"""The import graph of src/imageforge, drawn from the code: no cycle, no module importing a higher stage.

Every import counts: top-of-file, inside functions and under ``if TYPE_CHECKING:`` (``ast.walk``
sees them all).  A module's stage is that of its top-level name (``base.identity`` is ``base``);
a module may import its own stage or lower ones, and within a stage the imports must not cycle.
A new module must be given a stage here (and in CONTRIBUTING.md's list).
"""

from __future__ import annotations

import ast
import graphlib
import shutil
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "imageforge"

#: Lowest first. The pipeline reads upwards: manifest -> resolve -> plan -> build (its verify layer
#: inside) -> serve -> smoke/bench -> export, over the primitives at the bottom; app is the front door.
STAGES: tuple[tuple[str, ...], ...] = (
    ("errors", "labels", "settings"),  # one error root, every label, the tool's own options
    # pure helpers; run directories and locks; HTTP wire formats and the health wait; equiv tolerances
    ("yaml_messages", "yamldoc", "yaml_schema",  # YAML: the problems' words, the loader, the schemas and their check
     "patching", "pycheck", "patchfrom", "rundirs", "cli", "serving_client", "waits", "tolerances", "starter",
     "progress", "workload", "wheelhouse_join", "wheelhouse",  # wheelhouse_join: the stdlib joiner beside the parts
     "inimage",  # the programs run inside an image (verify, the flag listing, the tree's step runtime), as text
     "elfcheck"),  # the native checks without the device (pyelftools)
    ("docker_engine",),  # the daemon: engine setup, SDK client, the one error translator, container files
    ("manifest",),  # the frozen model of build.yaml
    ("resolve", "serving"),  # the one precedence chain; the serving command made of it (argv, config file, CMD)
    ("plan", "flags", "flags_read", "flags_check"),  # content keys; serving flags: model, learnt from the vLLM, checked
    ("base", "scripts"),  # which image a target builds on (identity, discovery, probe), the cpu recipe; script steps
    # one class per step kind: fields, defaults, load, inputs, apply -> Changes, verify facts, Dockerfile emit;
    # manifest_load: build.yaml loaded and checked into the manifest (each step's keys by its kind's class)
    ("steps", "manifest_load"),
    ("verify", "blame", "housekeeping"),  # the verify layer's checks; the step a traceback blames; build.lock, clean
    ("build", "checkpatches", "patchfrom_image", "flagcheck"),  # the layers; dry runs of the steps, patch-from; flags
    ("inplace",),  # the steps applied to the machine itself through a journal; revert, status
    ("serve",),  # the server runtime: the container (spec, container), the server as a process (in place)
    ("smoke", "bench"),  # checks and load against a server (bench: the evaluator replay, its metrics, plots)
    ("equiv", "forensics"),  # teacher-forced comparison; bisect and ablate over the step chain
    ("export", "submission"),  # the deliverables: a saved image; the tree the platform builds
    ("app",),  # the front door: the commands call only this
    ("commands", "command_options", "launch"),  # the `imageforge` command: its tasks, how a task is declared; launch
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


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``module`` imports, anywhere in its file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            # `from pkg import name`: the submodule pkg.name when there is one, else pkg itself
            names = [f"{source}.{a.name}" if f"{source}.{a.name}" in known else source for a in node.names]
        else:
            continue
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
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


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
    # housekeeping and verify share a stage: no upward import, but now a cycle
    guarded = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .{} import {}\n"
    _append(root, "verify", guarded.format("housekeeping", "Removal"))
    _append(root, "housekeeping", guarded.format("verify", "VerifySpec"))
    found = problems(import_graph(root))
    assert len(found) == 1 and found[0].startswith("cycle: "), found
    assert f"{PACKAGE}.verify" in found[0] and f"{PACKAGE}.housekeeping" in found[0]


def test_a_new_module_needs_a_stage(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    (root / PACKAGE / "newcomer.py").write_text("from .errors import ConfigError\n")
    assert problems(import_graph(root)) == [
        f"{PACKAGE}.newcomer has no stage: add 'newcomer' to STAGES (and CONTRIBUTING.md)"
    ]
