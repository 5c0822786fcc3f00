"""Build hook: the top-level schema/ folder goes into the wheel as imageforge/schema/ (package data).

Everything else about the package is in pyproject.toml. schema/ is the one place the JSON Schemas live
(editors find them beside build.yaml); a wheel must carry them, so build_py copies them under the
package in the build tree. A source checkout (editable install, PYTHONPATH=src) reads schema/ itself:
see imageforge.manifest.yaml_schema.schema_text.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildPyWithSchemas(build_py):  # type: ignore[misc]
    """build_py that also copies schema/*.json to imageforge/schema/ in the build tree."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:  # the checkout's schema/ is read in place
            return
        dest = Path(self.build_lib) / "imageforge" / "schema"
        dest.mkdir(parents=True, exist_ok=True)
        sources = sorted((HERE / "schema").glob("*.json"))
        if not sources:
            raise SystemExit(f"no JSON Schemas in {HERE / 'schema'}")
        for source in sources:
            self.copy_file(str(source), str(dest / source.name))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        extra = [str(Path(self.build_lib) / "imageforge" / "schema" / p.name) for p in (HERE / "schema").glob("*.json")]
        return [*super().get_outputs(include_bytecode), *extra]


setup(cmdclass={"build_py": BuildPyWithSchemas})
