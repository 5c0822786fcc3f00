"""The house rules a reader sees before running anything: how many modules sit at the top of src/imageforge, how
long one module may grow, no module that only re-exports another's names, CONTRIBUTING.md's map of homes true to the
code, bench/RESULTS.md as current figures, and no label of how the work was organised.

* at most :data:`MAX_TOP` ``.py`` files directly under ``src/imageforge`` (``__init__.py`` included): a new concern
  goes into the package of its stage;
* no module over :data:`MAX_LINES` lines: a longer one holds more than one concern;
* no shim: a module (other than a package's ``__init__.py``) whose body is only imports, ``__all__`` and a
  docstring is a second name for code that lives elsewhere, and so is ``from .x import name as name`` (the explicit
  re-export) outside an ``__init__.py``;
* CONTRIBUTING.md's map of homes (its table "The map of homes, by concern") names only homes that exist (a
  ``pkg/`` with the modules in its brackets, a ``module.py``), and every top-level module and package has a row;
* bench/RESULTS.md holds current figures: at most :data:`MAX_RESULTS_LINES` lines, every section with its What,
  Reproduce, Latest and Goal (history is git's);
* no file of the repository names how its work was organised (a numbered work session or stop): such a label
  means nothing to a reader.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "imageforge"
MAP_HEADING = "The map of homes, by concern:"
MAX_TOP = 15
MAX_LINES = 600
MAX_RESULTS_LINES = 700
SECTION_PARTS = ("- **What.**", "- **Reproduce.**", "**Latest.**", "**Goal.**")
LABEL = re.compile(r"\b(?:session|stop)s? \d+\b", re.IGNORECASE)


def _is_shim(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue  # the docstring
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if all(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                continue
        return False
    return any(isinstance(node, ast.ImportFrom) for node in tree.body)


def house_findings(package: Path) -> list[str]:
    """One line per breach of the rules (see the module), sorted; empty when the package keeps them."""
    found: list[str] = []
    top = sorted(p.name for p in package.glob("*.py"))
    if len(top) > MAX_TOP:
        found.append(f"{len(top)} modules directly under {package.name}/ (at most {MAX_TOP}): {', '.join(top)}")
    for path in sorted(package.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        name = path.relative_to(package.parent).as_posix()
        text = path.read_text()
        lines = text.count("\n")
        if lines > MAX_LINES:
            found.append(f"{name}: {lines} lines (at most {MAX_LINES}): split it by concern")
        if path.name == "__init__.py":
            continue
        tree = ast.parse(text, name)
        if _is_shim(tree):
            found.append(f"{name}: only re-exports (a shim): import from where the code lives")
        imports = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
        found += [f"{name}:{node.lineno}: re-exports {alias.name} (`as {alias.asname}`): import it from "
                  f"{'.' * node.level}{node.module or ''}" for node in imports for alias in node.names
                  if alias.asname == alias.name]
    return found


def test_the_package_keeps_the_house_rules() -> None:
    assert len(list(SRC.glob("*.py"))) > 5  # the real package, not an empty folder
    assert house_findings(SRC) == []


def test_each_rule_finds_its_planted_breach(tmp_path: Path) -> None:
    package = tmp_path / "imageforge"
    shutil.copytree(SRC, package, ignore=shutil.ignore_patterns("__pycache__"), symlinks=True)
    assert house_findings(package) == []
    spare = MAX_TOP - len(list(package.glob("*.py")))
    for n in range(spare + 1):
        (package / f"extra_{n}.py").write_text("X = 1\n")
    (package / "serve" / "long.py").write_text("X = 1\n" * (MAX_LINES + 1))
    (package / "serve" / "again.py").write_text('"""The ports, again."""\nfrom .ports import free_port\n\n'
                                                '__all__ = ["free_port"]\n')
    build = package / "build.py"
    build.write_text(build.read_text() + "\nfrom .rundirs import new_run_id as new_run_id\n")
    found = house_findings(package)
    assert len(found) == 4, found
    assert found[0].startswith(f"{MAX_TOP + 1} modules directly under imageforge/ (at most {MAX_TOP}): ")
    assert re.fullmatch(r"imageforge/build\.py:\d+: re-exports new_run_id \(`as new_run_id`\): import it from "
                        r"\.rundirs", found[1]), found[1]
    assert found[2] == "imageforge/serve/again.py: only re-exports (a shim): import from where the code lives"
    assert found[3] == f"imageforge/serve/long.py: {MAX_LINES + 1} lines (at most {MAX_LINES}): split it by concern"


def map_homes(contributing: str) -> list[str]:
    """The homes the map names, as paths under the package: ``pkg/``, ``pkg/module`` (from the brackets after a
    package) and ``module.py``."""
    lines = contributing.split(MAP_HEADING, 1)[1].strip().splitlines()
    rows = [line for line in lines[2:] if line.startswith("|")][: next(
        (i for i, line in enumerate(lines[2:]) if not line.startswith("|")), len(lines))]
    homes: list[str] = []
    for row in rows:
        cell = row.strip("|").split("|")[-1]
        for match in re.finditer(r"`([\w./]+)`(?:\s*\(([^)]*)\))?", cell):
            home, inside = match.group(1), match.group(2) or ""
            homes.append(home)
            if home.endswith("/"):
                homes += [home + name for name in re.findall(r"`(\w+)`", inside)]
    return homes


def map_findings(contributing: str, package: Path) -> list[str]:
    """One line per home the map names that is not in ``package``, and per top-level module or package it misses."""
    homes = map_homes(contributing)
    found = []
    for home in homes:
        path = package / home
        exists = (path / "__init__.py").is_file() if home.endswith("/") else (
            path.is_file() if home.endswith(".py") else path.with_suffix(".py").is_file() or path.is_dir())
        if not exists:
            found.append(f"CONTRIBUTING.md names `{home}`: not in {package.name}/")
    tops = [p.name for p in package.glob("*.py") if p.name != "__init__.py"]
    tops += [p.name + "/" for p in package.iterdir() if (p / "__init__.py").is_file()]
    found += [f"{package.name}/{top} has no row in CONTRIBUTING.md's map of homes" for top in sorted(tops)
              if top not in homes]
    return found


def test_the_map_of_homes_matches_the_code() -> None:
    text = (REPO / "CONTRIBUTING.md").read_text()
    homes = map_homes(text)
    assert "app.py" in homes and "serve/" in homes and "serve/runtime" in homes
    assert map_findings(text, SRC) == []


def test_a_home_that_moved_and_a_package_without_a_row_are_found(tmp_path: Path) -> None:
    package = tmp_path / "imageforge"
    shutil.copytree(SRC, package, ignore=shutil.ignore_patterns("__pycache__"), symlinks=True)
    text = (REPO / "CONTRIBUTING.md").read_text()
    (package / "serve" / "ports.py").rename(package / "serve" / "sockets.py")
    (package / "newstage").mkdir()
    (package / "newstage" / "__init__.py").write_text("")
    assert map_findings(text, package) == ["CONTRIBUTING.md names `serve/ports`: not in imageforge/",
                                           "imageforge/newstage/ has no row in CONTRIBUTING.md's map of homes"]


def results_findings(text: str) -> list[str]:
    """What keeps bench/RESULTS.md from being current figures (see the module)."""
    lines = text.count("\n")
    found = [f"bench/RESULTS.md: {lines} lines (at most {MAX_RESULTS_LINES}): history is git's"] \
        if lines > MAX_RESULTS_LINES else []
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        title = section.splitlines()[0]
        found += [f"bench/RESULTS.md: section {title!r} has no {part}" for part in SECTION_PARTS if part not in section]
    return found


def label_findings(paths: list[Path], root: Path) -> list[str]:
    """``file:line`` of every label of how the work was organised in the text files ``paths``."""
    found = []
    for path in paths:
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue  # binary (a .so, a .png) or a link to nothing
        found += [f"{path.relative_to(root)}:{n}: {m.group(0)!r}" for n, line in enumerate(text.splitlines(), 1)
                  for m in LABEL.finditer(line)]
    return found


def test_results_md_is_current_figures() -> None:
    text = (REPO / "bench" / "RESULTS.md").read_text()
    assert text.count("\n## ") >= 10
    assert results_findings(text) == []


def test_a_long_results_md_and_a_section_without_its_goal_are_found() -> None:
    text = (REPO / "bench" / "RESULTS.md").read_text()
    longer = text + "\n" * (MAX_RESULTS_LINES + 1 - text.count("\n"))
    assert results_findings(longer) == [f"bench/RESULTS.md: {MAX_RESULTS_LINES + 1} lines (at most "
                                        f"{MAX_RESULTS_LINES}): history is git's"]
    first = re.search(r"^## (.+)$", text, re.M)
    assert first is not None
    cut = text.replace("**Goal.**", "**Aim.**", 1)  # the first section's
    assert results_findings(cut) == [f"bench/RESULTS.md: section {first.group(1)!r} has no **Goal.**"]


def test_no_file_names_how_the_work_was_organised(tmp_path: Path) -> None:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=False)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    paths = [REPO / name for name in listed.stdout.decode().split("\0") if name]
    assert len(paths) > 100
    assert label_findings(paths, REPO) == []
    planted = tmp_path / "NOTES.md"
    session, stop = "session " + "29", "Stop " + "28"  # not written whole: this file is scanned too
    planted.write_text(f"Measured in {session}.\nOne pytest session per run; {stop} landed.\n")
    assert label_findings([planted], tmp_path) == [f"NOTES.md:1: {session!r}", f"NOTES.md:2: {stop!r}"]
