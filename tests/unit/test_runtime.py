"""One serving Runtime: made once from the command's options (``app.runtime``), two implementations
(``serve/container.py``, ``serve/process.py``), and nothing else asks which one it holds.

* ``in_place`` is a CLI option only: it appears in ``cli/options.py`` and ``cli/commands.py`` (turning ``--in-place``
  into the options the factory reads), nowhere else in the package;
* no ``isinstance``/``type()`` test on a runtime, and no use of the two implementation classes, outside their own
  modules and the factory in ``app.py``;
* the two implementations are the only subclasses of :class:`imageforge.serve.runtime.Runtime`, and each answers
  every abstract method.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from imageforge import app
from imageforge.serve.container import ContainerRuntime
from imageforge.serve.process import ProcessRuntime
from imageforge.serve.runtime import Runtime

SRC = Path(__file__).resolve().parents[2] / "src" / "imageforge"
IMPLEMENTATIONS = {"serve/container.py", "serve/process.py"}
CLASSES = {"ContainerRuntime", "ProcessRuntime"}


def in_place_outside_cli(src: Path) -> list[str]:
    return [f"{path.relative_to(src)}:{n}" for path in sorted(src.rglob("*.py"))
            if str(path.relative_to(src)) not in ("cli/options.py", "cli/commands.py")
            for n, line in enumerate(path.read_text().splitlines(), 1) if re.search(r"in_place", line)]


def kind_tests(source: str, filename: str, *, factory: bool = False) -> list[str]:
    """``file:line`` of every isinstance/type() test naming a runtime class, and every use of an implementation
    class (outside the factory ``def runtime`` when ``factory``)."""
    tree = ast.parse(source, filename)
    allowed: set[int] = set()
    if factory:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "runtime":
                allowed |= {n.lineno for n in ast.walk(node) if hasattr(n, "lineno")}
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("isinstance", "type"):
            named = {n.id for arg in node.args[1:] for n in ast.walk(arg) if isinstance(n, ast.Name)}
            if named & (CLASSES | {"Runtime"}) or (node.func.id == "type" and any(
                    "runtime" in ast.unparse(arg).lower() for arg in node.args)):
                out.append(f"{filename}:{node.lineno} {ast.unparse(node)}")
        elif isinstance(node, ast.Name) and node.id in CLASSES and node.lineno not in allowed:
            out.append(f"{filename}:{node.lineno} {node.id}")
        elif isinstance(node, ast.alias) and node.name in CLASSES and node.lineno not in allowed:
            out.append(f"{filename}:{node.lineno} import {node.name}")
    return sorted(set(out))


def test_in_place_is_a_cli_option_only() -> None:
    assert in_place_outside_cli(SRC) == []


def test_no_module_outside_the_two_runtimes_tests_which_runtime_it_holds() -> None:
    found = [hit for path in sorted(SRC.rglob("*.py")) if str(path.relative_to(SRC)) not in IMPLEMENTATIONS
             for hit in kind_tests(path.read_text(), str(path.relative_to(SRC)),
                                   factory=path.relative_to(SRC) == Path("app.py"))]
    assert found == [], "ask the Runtime (a method or a capability), not which one it is:\n" + "\n".join(found)


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    bad = ("from imageforge.serve.process import ProcessRuntime\n"
           "def f(runtime):\n    if isinstance(runtime, ProcessRuntime):\n        pass\n"
           "    return type(runtime).__name__ == 'ContainerRuntime'\n")
    assert kind_tests(bad, "x.py") == ["x.py:1 import ProcessRuntime", "x.py:3 ProcessRuntime",
                                       "x.py:3 isinstance(runtime, ProcessRuntime)", "x.py:5 type(runtime)"]
    factory = "def runtime(process):\n    from .p import ProcessRuntime\n    return ProcessRuntime()\n"
    assert kind_tests(factory, "app.py", factory=True) == []
    assert kind_tests(factory.replace("def runtime", "def other"), "app.py", factory=True) != []
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "options.py").write_text("in_place = True\n")
    (tmp_path / "x.py").write_text("def f(in_place): ...\n")
    assert in_place_outside_cli(tmp_path) == ["x.py:1"]


def test_exactly_two_implementations_each_complete() -> None:
    assert {c.__name__ for c in Runtime.__subclasses__()} == CLASSES
    for cls in (ContainerRuntime, ProcessRuntime):
        assert not getattr(cls, "__abstractmethods__", None), cls


def test_the_factory_makes_one_runtime_from_the_options(tmp_path: Path) -> None:
    s = app.settings(manifest=str(tmp_path / "build.yaml"))
    docker = app.runtime(s)
    assert docker == ContainerRuntime() and not docker.one_at_a_time and docker.where == "in Docker containers"
    here = app.runtime(s, process=True, root=str(tmp_path), python=sys.executable)
    assert here == ProcessRuntime(tmp_path, sys.executable) and here.one_at_a_time
    assert here.where == f"in place on {tmp_path}"
    assert app.runtime(s, process=True) == ProcessRuntime()  # --root / and python3 on PATH by default
    with pytest.raises(Exception, match="--root and --python go with --in-place"):
        app.runtime(s, python=sys.executable)


def test_the_process_runtime_refuses_an_image_and_each_names_a_failed_prepare(tmp_path: Path) -> None:
    """An image is a container's to serve; a failed prepare (a bisect cut) is named by what preparing does."""
    here = ProcessRuntime(tmp_path, sys.executable)
    with pytest.raises(Exception, match="image x:1 does not apply"):
        here.prepare(object(), image="x:1")  # type: ignore[arg-type]
    assert here.prepare_failed("after step 2") == "the files after step 2 did not apply in place"
    assert ContainerRuntime().prepare_failed("after step 2") == "the image after step 2 did not build"
