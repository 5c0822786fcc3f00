"""The vendor API record: one fixed JSON format, its loader and its checks.

The format (``format: 1``), written by ``imageforge probe`` or by hand::

    {"format": 1,
     "python": "3.10.12",
     "versions": {"torch": "2.1.0+corex.3.2.3", "vllm": "0.6.3+corex.3.2.3", ...},
     "modules": {"ixformer.functions": {"vllm_copy_cache": {"kind": "function",
                                                            "signature": "(src, dst, block_mapping)"}, ...},
                 ...},
     "libraries": {"/usr/local/corex/lib64/libixformer.so": {"soname": "libixformer.so", "needed": [...],
                                                             "exports": [...]}},
     "distributions": {"transformers": {"version": "4.46.3", "top_level": ["transformers"]}, ...}}

``kind`` is one of function, class, module, other; ``signature`` is null where unknown; extra keys are allowed
everywhere; a module may say ``"complete": false`` and a name missing from it is then "unknown", not "absent".
``imageforge native build`` writes its extensions' modules into the record (:func:`record_functions`: each
module's entry replaced, the rest of the file kept as it is).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..errors import ConfigError, Location, Problem

FORMAT = 1
KINDS = ("function", "class", "module", "other")
#: Keys of a module's entry that are not names of the module.
MODULE_META = ("complete",)

Lookup = Literal["present", "absent", "unknown"]


@dataclass(frozen=True)
class Member:
    kind: str
    signature: str | None


@dataclass(frozen=True)
class Library:
    soname: str | None
    needed: tuple[str, ...]
    exports: frozenset[str]


@dataclass(frozen=True)
class Distribution:
    version: str
    top_level: tuple[str, ...]


@dataclass(frozen=True)
class VendorApi:
    """A loaded record; ``source`` names the file it came from (for findings)."""

    python: str
    versions: Mapping[str, str]
    modules: Mapping[str, Mapping[str, Member]]
    complete: Mapping[str, bool]
    libraries: Mapping[str, Library] = field(default_factory=dict)
    distributions: Mapping[str, Distribution] = field(default_factory=dict)
    source: str = "vendor-api.json"

    def has_module(self, module: str) -> bool:
        return module in self.modules

    def lookup(self, module: str, name: str) -> Lookup:
        """Whether ``module.name`` exists: a recorded name, a recorded submodule, or unknown (incomplete module)."""
        members = self.modules.get(module)
        if members is None:
            return "unknown"
        if name in members or f"{module}.{name}" in self.modules:
            return "present"
        return "absent" if self.complete.get(module, True) else "unknown"

    def member(self, module: str, name: str) -> Member | None:
        return self.modules.get(module, {}).get(name)

    def top_levels(self) -> frozenset[str]:
        """Top-level import names of every recorded distribution and module."""
        names = {t for d in self.distributions.values() for t in d.top_level}
        names.update(m.split(".", 1)[0] for m in self.modules)
        return frozenset(names)

    def close_names(self, module: str, name: str, n: int = 3) -> list[str]:
        """The recorded names of ``module`` nearest to ``name`` (for a hint)."""
        import difflib

        members = self.modules.get(module, {})
        near = difflib.get_close_matches(name, list(members), n=n, cutoff=0.5)
        words = set(name.lower().split("_")) - {""}
        near += [m for m in members if m not in near and words & set(m.lower().split("_")) and len(near) < n + 3]
        return near[: n + 2]


class _Checker:
    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[Problem] = []

    def problem(self, key: str, message: str, *, expected: str, found: Any) -> None:
        self.problems.append(Problem(message, location=Location(self.source), key_path=key, expected=expected,
                                     found=repr(found)[:200]))

    def mapping(self, key: str, value: Any) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            self.problem(key, "not an object", expected="a JSON object", found=value)
            return {}
        return value

    def strings(self, key: str, value: Any) -> tuple[str, ...]:
        if not isinstance(value, Sequence) or isinstance(value, str) or not all(isinstance(v, str) for v in value):
            self.problem(key, "not a list of strings", expected="a JSON array of strings", found=value)
            return ()
        return tuple(value)


def record_from_json(data: Any, source: str = "vendor-api.json") -> VendorApi:
    """Check ``data`` against the format (every problem at once, ConfigError exit 2) and build the record."""
    c = _Checker(source)
    top = c.mapping("", data)
    if top.get("format") != FORMAT:
        c.problem("format", "unknown record format", expected=str(FORMAT), found=top.get("format"))
    python = top.get("python")
    if not isinstance(python, str) or not python[:1].isdigit():
        c.problem("python", "the interpreter's version is missing", expected='a version such as "3.10.12"',
                  found=python)
        python = ""
    versions = {str(k): str(v) for k, v in c.mapping("versions", top.get("versions", {})).items()}
    modules: dict[str, dict[str, Member]] = {}
    complete: dict[str, bool] = {}
    for mod, entries in c.mapping("modules", top.get("modules", {})).items():
        members: dict[str, Member] = {}
        entries = c.mapping(f"modules.{mod}", entries)
        flag = entries.get("complete", True)
        if not isinstance(flag, bool):
            c.problem(f"modules.{mod}.complete", "not a boolean", expected="true or false", found=flag)
        complete[mod] = bool(flag)
        for name, entry in entries.items():
            if name in MODULE_META:
                continue
            kp = f"modules.{mod}.{name}"
            entry = c.mapping(kp, entry)
            kind = entry.get("kind")
            if kind not in KINDS:
                c.problem(f"{kp}.kind", "unknown kind", expected=" | ".join(KINDS), found=kind)
            signature = entry.get("signature")
            if signature is not None and not isinstance(signature, str):
                c.problem(f"{kp}.signature", "not a string", expected='"(a, b=1)" or null', found=signature)
                signature = None
            members[str(name)] = Member(str(kind), signature)
        modules[str(mod)] = members
    libraries: dict[str, Library] = {}
    for path, entry in c.mapping("libraries", top.get("libraries", {})).items():
        entry = c.mapping(f"libraries.{path}", entry)
        soname = entry.get("soname")
        libraries[str(path)] = Library(soname if isinstance(soname, str) else None,
                                       c.strings(f"libraries.{path}.needed", entry.get("needed", [])),
                                       frozenset(c.strings(f"libraries.{path}.exports", entry.get("exports", []))))
    distributions: dict[str, Distribution] = {}
    for name, entry in c.mapping("distributions", top.get("distributions", {})).items():
        entry = c.mapping(f"distributions.{name}", entry)
        distributions[str(name)] = Distribution(str(entry.get("version", "")),
                                                c.strings(f"distributions.{name}.top_level",
                                                          entry.get("top_level", [])))
    if c.problems:
        if len(c.problems) == 1:
            p = c.problems[0]
            raise ConfigError(p.message, location=p.location, key_path=p.key_path, expected=p.expected, found=p.found)
        raise ConfigError(f"{source} is not a vendor API record of format {FORMAT} ({len(c.problems)} problems)",
                          problems=c.problems)
    return VendorApi(python, versions, modules, complete, libraries, distributions, source)


def load_record(path: Path) -> VendorApi:
    """Read and check a record file (ConfigError, exit 2, naming the file and the key)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read the vendor API record: {exc.strerror}", location=Location(str(path)),
                          hint="take it on the card: imageforge probe --in-place --out vendor-api.json") from exc
    except ValueError as exc:
        raise ConfigError(f"the vendor API record is not JSON: {exc}", location=Location(str(path))) from exc
    return record_from_json(data, str(path))


def record_to_json(api: VendorApi) -> dict[str, Any]:
    """The record as its JSON object (sorted, so that its diff reads well in review)."""
    modules: dict[str, Any] = {}
    for mod, members in sorted(api.modules.items()):
        entry: dict[str, Any] = {n: {"kind": m.kind, "signature": m.signature} for n, m in sorted(members.items())}
        if not api.complete.get(mod, True):
            entry["complete"] = False
        modules[mod] = entry
    return {"format": FORMAT, "python": api.python, "versions": dict(sorted(api.versions.items())),
            "modules": modules,
            "libraries": {p: {"soname": lib.soname, "needed": list(lib.needed), "exports": sorted(lib.exports)}
                          for p, lib in sorted(api.libraries.items())},
            "distributions": {n: {"version": d.version, "top_level": list(d.top_level)}
                              for n, d in sorted(api.distributions.items())}}


def signature_from_doc(name: str, line: str) -> str | None:
    """The signature text of a docstring's first line ``name(a, b) -> T`` (pybind11's, a C function's), or None."""
    line = line.strip()
    return line[len(name):] if line.startswith(name + "(") else None


def record_functions(path: Path, python: str, functions: Mapping[str, Mapping[str, str | None]]) -> bool:
    """Write ``functions`` (module -> function name -> signature text or None) into the record at ``path``
    (made when missing, for interpreter version ``python``): each module's entry replaced, marked incomplete
    (an extension's other attributes are not listed), every other key of the file kept. Checked against the
    format before it is written; False when the file already says the same."""
    if path.is_file():
        load_record(path)  # a record that does not load is not overwritten (ConfigError naming its key)
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    else:
        data = {"format": FORMAT, "python": python, "versions": {}, "modules": {}}
    modules = data.setdefault("modules", {})
    changed = False
    for module, members in sorted(functions.items()):
        entry: dict[str, Any] = {"complete": False, **{name: {"kind": "function", "signature": sig}
                                                       for name, sig in sorted(members.items())}}
        if modules.get(module) != entry:
            modules[module] = entry
            changed = True
    if not changed:
        return False
    record_from_json(data, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return True
