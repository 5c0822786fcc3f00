"""Checks of a prebuilt native extension without the device: what the dynamic loader would say, read statically.

An extension (``.so``) is read with pyelftools (:func:`summarise`): its class, machine and type, the
``PyInit_<name>`` it exports, its undefined dynamic symbols (weak ones apart), its ``DT_NEEDED`` libraries with
``RPATH``/``RUNPATH``, and the symbol versions it needs per library (``GLIBC_2.34``, ``GLIBCXX_3.4.30``, ...).
:func:`check_extension` then resolves the ``DT_NEEDED`` closure as ``ld.so`` does, in the *image's* files (any
:class:`Files`: the build's container, check-patches' base image, the box's root in place):

1. a library already loaded, by its soname: the interpreter and its closure, and the libraries loaded before the
   extension (torch's ``libc10``, ``libtorch_cpu``, ``libtorch_python``: ``import torch`` comes first);
2. ``DT_RPATH`` (only when there is no ``DT_RUNPATH``), ``LD_LIBRARY_PATH``, ``DT_RUNPATH`` (``$ORIGIN`` is the
   directory of the object that needs the library), ``/etc/ld.so.cache``, the default directories;
3. when the image lacks it: a library of the vendor API record (:func:`recorded_libraries`: its soname and exports,
   read on the card by the probe; its own needs and symbol versions are taken as met there);

and reports, as :class:`Finding` rows, every undefined non-weak symbol no object of the closure (or loaded
before) defines, every symbol version a library does not define, a needed library not found. C++ names are
demangled in the messages (``cxxfilt``: libstdc++'s ``abi::__cxa_demangle``).

libtorch_cpu.so (415 MB, 74k exports, 110k dynamic symbols) is summarised in 0.6 s once its bytes are in memory, the
dynamic symbol table read in one ``struct.iter_unpack``; getting the bytes is what costs (reading 415 MB: seconds on
a busy machine, 12-15 s through a container's archive).  So a :class:`Resolver` given a ``store``
(:class:`imageforge.vendor_api.elfcache.SummaryStore`) asks the files for the identity of an object before reading it
(``identity(path)``: what :class:`Files` may offer, e.g. inode, size, mtime and ctime of a host file, or the image ID
of a pristine container) and reads it only when no summary is kept for that identity.
"""

from __future__ import annotations

import io
import posixpath
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection
from elftools.elf.sections import SymbolTableSection

from .record import Library

#: What a finding is about (the checks' names, as check-patches, build and preflight show them).
FindingCode = Literal[
    "not-elf", "not-64-bit", "wrong-arch", "not-shared-object", "no-pyinit", "needed-missing", "undefined-symbol",
    "version-missing", "pin-mismatch", "unpinned", "file-missing", "import-failed",
]

#: The default directories of x86-64 Debian/Ubuntu's loader, after ld.so.cache.
DEFAULT_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib")
LD_SO_CACHE = "/etc/ld.so.cache"
_MAX_LINKS = 40


@dataclass(frozen=True)
class Finding:
    """One check that does not hold: ``code`` (what), ``path`` (which file), ``message`` (said in full)."""

    code: FindingCode
    path: str
    message: str

    def line(self) -> str:
        return f"{self.code}: {self.path}: {self.message}"


class NotElf(Exception):
    """The bytes are not an ELF file pyelftools can read."""


@dataclass(frozen=True)
class Undefined:
    name: str
    weak: bool


@dataclass(frozen=True)
class ElfSummary:
    """What the checks need of one ELF object."""

    elfclass: int
    machine: str
    type: str
    soname: str | None
    needed: tuple[str, ...]
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]
    exports: frozenset[str]
    undefined: tuple[Undefined, ...]
    version_needs: Mapping[str, tuple[str, ...]]  # library file name -> version names
    version_defs: frozenset[str]


def _split_path(value: str) -> tuple[str, ...]:
    return tuple(p for p in value.split(":") if p)


def summarise(data: bytes) -> ElfSummary:
    """The ELF summary of ``data`` (NotElf when it is not an ELF file)."""
    if data[:4] != b"\x7fELF":
        raise NotElf("no ELF magic (\\x7fELF) at the start of the file")
    try:
        elf = ELFFile(io.BytesIO(data))
        needed: list[str] = []
        rpath: tuple[str, ...] = ()
        runpath: tuple[str, ...] = ()
        soname: str | None = None
        exports: set[str] = set()
        undefined: list[Undefined] = []
        version_needs: dict[str, tuple[str, ...]] = {}
        version_defs: set[str] = set()
        for section in elf.iter_sections():
            if isinstance(section, DynamicSection):
                for tag in section.iter_tags():
                    kind = tag.entry.d_tag
                    if kind == "DT_NEEDED":
                        needed.append(str(tag.needed))  # type: ignore[attr-defined]
                    elif kind == "DT_RPATH":
                        rpath = _split_path(str(tag.rpath))  # type: ignore[attr-defined]
                    elif kind == "DT_RUNPATH":
                        runpath = _split_path(str(tag.runpath))  # type: ignore[attr-defined]
                    elif kind == "DT_SONAME":
                        soname = str(tag.soname)  # type: ignore[attr-defined]
            elif isinstance(section, SymbolTableSection) and section["sh_type"] == "SHT_DYNSYM":
                _dynamic_symbols(elf, section, exports, undefined)
            elif isinstance(section, GNUVerNeedSection):
                for verneed, auxes in section.iter_versions():
                    version_needs[str(verneed.name)] = tuple(str(aux.name) for aux in auxes)
            elif isinstance(section, GNUVerDefSection):
                for verdef, auxes in section.iter_versions():
                    if verdef["vd_flags"] & 1:  # VER_FLG_BASE: the file's own name, not a version
                        continue
                    version_defs.update(str(aux.name) for aux in auxes)
        return ElfSummary(elf.elfclass, str(elf["e_machine"]), str(elf["e_type"]), soname, tuple(needed), rpath,
                          runpath, frozenset(exports), tuple(undefined), version_needs, frozenset(version_defs))
    except (ELFError, struct.error, ValueError, KeyError) as exc:
        raise NotElf(f"not a readable ELF file: {exc}") from None


_BIND_GLOBAL, _BIND_WEAK, _BIND_GNU_UNIQUE = 1, 2, 10
_VIS_DEFAULT, _VIS_PROTECTED = 0, 3


def _dynamic_symbols(elf: ELFFile, section: SymbolTableSection, exports: set[str], undefined: list[Undefined]) -> None:
    """The dynamic symbols: defined and visible ones into ``exports``, undefined ones into ``undefined``.

    A 64-bit little-endian table is read in one ``struct.iter_unpack`` over the section's bytes (libtorch_cpu.so's
    ~110k entries: 0.1 s instead of ~7 s through pyelftools' per-symbol objects); any other through pyelftools.
    """
    if elf.elfclass == 64 and elf.little_endian and section["sh_entsize"] == 24:
        strtab = elf.get_section(section["sh_link"]).data()
        for st_name, st_info, st_other, st_shndx, _value, _size in struct.iter_unpack("<IBBHQQ", section.data()):
            if not st_name:
                continue
            name = strtab[st_name:strtab.index(b"\0", st_name)].decode("utf-8", "replace")
            bind = st_info >> 4
            if st_shndx == 0:  # SHN_UNDEF
                undefined.append(Undefined(name, bind == _BIND_WEAK))
            elif bind in (_BIND_GLOBAL, _BIND_WEAK, _BIND_GNU_UNIQUE) and st_other & 3 in (_VIS_DEFAULT,
                                                                                              _VIS_PROTECTED):
                exports.add(name)
        return
    for sym in section.iter_symbols():  # pragma: no cover - 32-bit or big-endian: read to name the finding
        if not sym.name:
            continue
        bind_name = sym["st_info"]["bind"]
        if sym["st_shndx"] == "SHN_UNDEF":
            undefined.append(Undefined(sym.name, bind_name == "STB_WEAK"))
        elif bind_name in ("STB_GLOBAL", "STB_WEAK", "STB_GNU_UNIQUE") and sym["st_other"]["visibility"] in (
                "STV_DEFAULT", "STV_PROTECTED"):
            exports.add(sym.name)


def demangle(name: str) -> str:
    """``name`` demangled when it is a C++ name (``_Z...``), else as is."""
    if not name.startswith("_Z"):
        return name
    import cxxfilt

    try:
        return str(cxxfilt.demangle(name))
    except (cxxfilt.InvalidName, cxxfilt.Error):  # pragma: no cover - a mangled name libstdc++ cannot read
        return name


# --------------------------------------------------------------------------------------------
# the image's files
# --------------------------------------------------------------------------------------------


class Files(Protocol):
    """Read access to an image's (or a root's) files: what the resolution needs of an ImageFS."""

    def stat(self, path: str) -> object | None:
        """None when nothing is at ``path``; else an entry with ``kind`` and ``link_target``."""

    def read(self, path: str) -> bytes | None: ...


class SummaryStore(Protocol):
    """Summaries kept by the identity of the file they were read from (:mod:`.elfcache`)."""

    def get_or_make(self, identity: tuple[str | int, ...], make: Callable[[], ElfSummary]) -> ElfSummary: ...


def identity_of(files: Files, path: str) -> tuple[str | int, ...] | None:
    """What ``files`` says identifies the bytes at ``path`` (its optional ``identity`` method); None: unknown."""
    method = getattr(files, "identity", None)
    if method is None:
        return None
    found = method(path)
    return None if found is None else tuple(found)


def realpath(files: Files, path: str) -> str | None:
    """``path`` with every symbolic link on the way followed (in ``files``, not the host); None when absent."""
    parts = [p for p in posixpath.normpath(path).split("/") if p]
    current = "/"
    hops = 0
    while parts:
        part = parts.pop(0)
        candidate = posixpath.join(current, part)
        entry = files.stat(candidate)
        if entry is None:
            return None
        if getattr(entry, "kind", None) == "link":
            hops += 1
            if hops > _MAX_LINKS:
                return None
            target = str(getattr(entry, "link_target", "") or "")
            parts = [p for p in target.split("/") if p] + parts
            current = "/" if target.startswith("/") else current
            continue
        current = candidate
    return posixpath.normpath(current)


def parse_ld_so_cache(data: bytes) -> dict[str, str]:
    """soname -> path of the x86-64 libc6 entries of an ``/etc/ld.so.cache`` (glibc's new format, with or without
    the old one in front)."""
    new_magic = b"glibc-ld.so.cache1.1"
    start = 0
    if data.startswith(b"ld.so-1.7.0"):
        (count,) = struct.unpack_from("<I", data, 12)
        start = 16 + count * 12
        start = (start + 7) & ~7
    if data[start:start + len(new_magic)] != new_magic:
        return {}
    count, _strings_len = struct.unpack_from("<II", data, start + 20)
    out: dict[str, str] = {}
    entry = start + 48
    for i in range(count):
        flags, key, value = struct.unpack_from("<iII", data, entry + i * 24)
        if flags & 0xFF00 != 0x0300 or flags & 0xFF != 0x03:  # FLAG_X8664_LIB64 | FLAG_ELF_LIBC6
            continue
        name = _cstring(data, start + key)
        out.setdefault(name, _cstring(data, start + value))
    return out


def _cstring(data: bytes, offset: int) -> str:
    end = data.find(b"\0", offset)
    return data[offset:end if end >= 0 else len(data)].decode("utf-8", "replace")


# --------------------------------------------------------------------------------------------
# the checks
# --------------------------------------------------------------------------------------------


class _Absent(Exception):
    """Nothing to read at the path (a summary of nothing is not kept)."""


@dataclass
class _Loaded:
    path: str
    summary: ElfSummary
    recorded: bool = False  # from the vendor API record (taken on the card), not a file of this image


def recorded_libraries(libraries: Mapping[str, Library]) -> dict[str, tuple[str, ElfSummary]]:
    """The vendor API record's libraries (path -> soname, needed, exports), by soname and file name, as summaries
    the loader's search falls back to when the image lacks them (the card's libraries, read there by the probe)."""
    out: dict[str, tuple[str, ElfSummary]] = {}
    for path, lib in sorted(libraries.items()):
        summary = ElfSummary(64, "EM_X86_64", "ET_DYN", lib.soname, tuple(lib.needed), (), (),
                             frozenset(lib.exports), (), {}, frozenset())
        for name in (lib.soname, posixpath.basename(path)):
            if name:
                out.setdefault(name, (path, summary))
    return out


@dataclass
class Resolver:
    """The loader's search, over ``files``: objects read once, ``ld.so.cache`` parsed once; with a ``store``, an
    object whose identity the files give is read only when the store keeps no summary for it."""

    files: Files
    library_path: Sequence[str] = ()
    summarise: Callable[[bytes], ElfSummary] = summarise
    recorded: Mapping[str, tuple[str, ElfSummary]] = field(default_factory=dict)  # recorded_libraries(...)
    store: SummaryStore | None = None
    _objects: dict[str, _Loaded | None] = field(default_factory=dict)
    _cache: dict[str, str] | None = None

    def load(self, path: str) -> _Loaded | None:
        """The object at ``path`` (links followed); None when absent or not ELF."""
        real = realpath(self.files, path)
        if real is None:
            return None
        if real not in self._objects:
            identity = identity_of(self.files, real) if self.store is not None else None
            loaded: _Loaded | None = None
            try:
                if identity is not None and self.store is not None:
                    loaded = _Loaded(real, self.store.get_or_make(identity, lambda: self._read(real)))
                else:
                    loaded = _Loaded(real, self._read(real))
            except (NotElf, _Absent):
                loaded = None
            self._objects[real] = loaded
        return self._objects[real]

    def _read(self, path: str) -> ElfSummary:
        data = self.files.read(path)
        if data is None:
            raise _Absent(path)
        return self.summarise(data)

    def ld_cache(self) -> dict[str, str]:
        if self._cache is None:
            real = realpath(self.files, LD_SO_CACHE)
            data = self.files.read(real) if real else None
            self._cache = parse_ld_so_cache(data) if data else {}
        return self._cache

    def find(self, name: str, needer: _Loaded, loaded: Mapping[str, _Loaded]) -> _Loaded | None:
        """Where ``ld.so`` finds DT_NEEDED ``name`` of ``needer``: loaded by soname, RPATH, LD_LIBRARY_PATH,
        RUNPATH, ld.so.cache, the default directories."""
        if "/" in name:
            return self.load(name)
        if name in loaded:
            return loaded[name]
        origin = posixpath.dirname(needer.path)

        def expand(dirs: Iterable[str]) -> list[str]:
            return [d.replace("${ORIGIN}", origin).replace("$ORIGIN", origin) for d in dirs]

        s = needer.summary
        dirs = [*(expand(s.rpath) if not s.runpath else []), *self.library_path, *expand(s.runpath)]
        for d in dirs:
            found = self.load(posixpath.join(d, name))
            if found is not None and found.summary.machine == "EM_X86_64":
                return found
        cached = self.ld_cache().get(name)
        if cached is not None:
            found = self.load(cached)
            if found is not None:
                return found
        for d in DEFAULT_DIRS:
            found = self.load(posixpath.join(d, name))
            if found is not None and found.summary.machine == "EM_X86_64":
                return found
        if name in self.recorded:
            path, summary = self.recorded[name]
            return _Loaded(path, summary, recorded=True)
        return None

    def closure(self, roots: Sequence[_Loaded], loaded: dict[str, _Loaded],
                missing: list[tuple[str, str]] | None = None) -> list[_Loaded]:
        """Breadth first over DT_NEEDED from ``roots``; ``loaded`` (soname -> object) grows with what is found."""
        order: list[_Loaded] = []
        queue = list(roots)
        seen: set[str] = set()
        while queue:
            obj = queue.pop(0)
            if obj.path in seen:
                continue
            seen.add(obj.path)
            order.append(obj)
            loaded.setdefault(obj.summary.soname or posixpath.basename(obj.path), obj)
            for name in obj.summary.needed:
                found = self.find(name, obj, loaded)
                if found is None:
                    if missing is not None and not obj.recorded:  # the card loaded it: its needs were met there
                        missing.append((obj.path, name))
                    continue
                loaded.setdefault(name, found)
                queue.append(found)
        return order


def check_header(path: str, summary: ElfSummary) -> list[Finding]:
    """ELF 64-bit x86-64 shared object."""
    out: list[Finding] = []
    if summary.elfclass != 64:
        out.append(Finding("not-64-bit", path, f"ELF {summary.elfclass}-bit, expected 64-bit"))
    if summary.machine != "EM_X86_64":
        out.append(Finding("wrong-arch", path, f"machine {summary.machine}, expected EM_X86_64 (x86-64)"))
    if summary.type != "ET_DYN":
        out.append(Finding("not-shared-object", path, f"type {summary.type}, expected ET_DYN (a shared object)"))
    return out


def module_name(path: str) -> str:
    """The Python module a file name gives (``foo.cpython-311-x86_64-linux-gnu.so`` -> ``foo``)."""
    return posixpath.basename(path).split(".", 1)[0]


def check_extension(path: str, data: bytes, files: Files, *, python_extension: bool = True,
                    interpreter: str | None = None, loaded_before: Sequence[str] = (),
                    library_path: Sequence[str] = (), resolver: Resolver | None = None) -> list[Finding]:
    """Every check of one extension ``data`` that goes to ``path`` in the image of ``files``.

    ``interpreter``: the image's Python (its exports and closure are loaded first); ``loaded_before``: image paths of
    the libraries loaded before the extension (torch's); ``library_path``: LD_LIBRARY_PATH of the serving process.
    """
    try:
        summary = summarise(data)
    except NotElf as exc:
        return [Finding("not-elf", path, str(exc))]
    findings = check_header(path, summary)
    if findings:
        return findings  # a foreign object's symbols say nothing about this loader
    if python_extension:
        want = f"PyInit_{module_name(path)}"
        if want not in summary.exports:
            others = sorted(n for n in summary.exports if n.startswith("PyInit_"))
            findings.append(Finding("no-pyinit", path, f"does not export {want} (the file name's module)"
                                    + (f"; it exports {', '.join(others)}" if others else "")))
    resolver = resolver or Resolver(files, tuple(library_path))
    loaded: dict[str, _Loaded] = {}
    before: list[_Loaded] = []
    for p in ([interpreter] if interpreter else []) + list(loaded_before):
        obj = resolver.load(p)
        if obj is None:
            findings.append(Finding("needed-missing", path, f"{p} (loaded before the extension) is not in the image"))
        else:
            before.append(obj)
    universe = resolver.closure(before, loaded)
    me = _Loaded(path, summary)
    missing: list[tuple[str, str]] = []
    mine = resolver.closure([me], loaded, missing)
    for needer, name in missing:
        findings.append(Finding("needed-missing", path,
                                f"DT_NEEDED {name} (of {needer}) is found neither loaded nor by RPATH/"
                                "LD_LIBRARY_PATH/RUNPATH/ld.so.cache/default directories"))
    provided: set[str] = set()
    for obj in [*universe, *mine[1:]]:
        provided |= obj.summary.exports
    for u in summary.undefined:
        if u.weak or u.name in provided:
            continue
        shown = demangle(u.name)
        findings.append(Finding("undefined-symbol", path, f"undefined symbol {shown}"
                                + (f" ({u.name})" if shown != u.name else "")
                                + " is defined by no library of the DT_NEEDED closure nor one loaded before"))
    by_name: dict[str, _Loaded] = dict(loaded)
    for lib, versions in summary.version_needs.items():
        obj = by_name.get(lib)
        if obj is None or obj.recorded:
            continue  # said as needed-missing; a recorded library's version definitions are not recorded
        for version in versions:
            if version not in obj.summary.version_defs:
                newest = _newest(obj.summary.version_defs, version)
                findings.append(Finding("version-missing", path,
                                        f"needs {version} of {lib}, which {obj.path} does not define"
                                        + (f" (newest {newest})" if newest else "")))
    return findings


def _newest(defs: Iterable[str], like: str) -> str | None:
    prefix = like.rsplit("_", 1)[0] + "_"

    def key(v: str) -> tuple[int, ...]:
        try:
            return tuple(int(x) for x in v[len(prefix):].split("."))
        except ValueError:
            return ()

    same = [d for d in defs if d.startswith(prefix) and key(d)]
    return max(same, key=key) if same else None
