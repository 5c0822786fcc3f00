"""The cpu recipe's ``requirements.lock`` (pip's hash-pinned format) and the wheelhouse it fills."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imageforge import docker_engine as de
from imageforge.cli.progress import progress, watch_size
from imageforge.errors import BuildError, ConfigError
from imageforge.plan import sha256_file

Log = Callable[[str], None]


# --------------------------------------------------------------------------------------------
# the lock: pip's `name==version --hash=sha256:...` format
# --------------------------------------------------------------------------------------------

_NAME_RE = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_REQ_RE = re.compile(rf"^(?P<name>{_NAME_RE})==(?P<version>[^\s;\\]+)(?P<rest>.*)$")
_HASH_RE = re.compile(r"^--hash=sha256:(?P<hex>[0-9a-f]{64})$")
_FILE_RE = re.compile(r"^#\s*file:\s*(?P<file>\S+\.whl)(?:\s+\((?P<size>\d+) bytes\))?\s*$")


@dataclass(frozen=True)
class LockEntry:
    """One pinned wheel: ``name==version`` with its sha256 (and, when known, file name and size)."""

    name: str
    version: str
    hashes: tuple[str, ...]
    filename: str | None = None
    size: int | None = None

    @property
    def key(self) -> str:
        return normalize_name(self.name)

    def requirement_line(self) -> str:
        return f"{self.name}=={self.version} " + " ".join(f"--hash=sha256:{h}" for h in self.hashes)


def normalize_name(name: str) -> str:
    """PEP 503 normalised distribution name: ``Foo_Bar.baz`` -> ``foo-bar-baz``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_wheel_filename(filename: str) -> tuple[str, str]:
    """``torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl`` -> (``torch``, ``2.13.0+cpu``)."""
    if not filename.endswith(".whl"):
        raise ValueError(f"not a wheel file name: {filename}")
    parts = filename[:-4].split("-")
    if len(parts) not in (5, 6):
        raise ValueError(f"not a wheel file name: {filename}")
    return normalize_name(parts[0]), parts[1]


def parse_lock(text: str, *, source: str = "requirements.lock") -> list[LockEntry]:
    """Entries of a hash-pinned requirements file; ConfigError (with the line) for anything else."""
    entries: list[LockEntry] = []
    seen: dict[str, int] = {}
    pending_file: tuple[str, int | None] | None = None
    logical = ""
    start = 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not logical:
            start = lineno
            if not stripped:
                continue
            if stripped.startswith("#"):
                m = _FILE_RE.match(stripped)
                if m:
                    pending_file = (m["file"], int(m["size"]) if m["size"] else None)
                continue
        if stripped.endswith("\\"):
            logical += stripped[:-1] + " "
            continue
        logical += stripped
        line, logical = logical.split(" #", 1)[0].strip(), ""
        m = _REQ_RE.match(line)
        where = f"{source}:{start}"
        if not m:
            raise ConfigError(
                f"{where}: not a pinned requirement: {line!r}",
                expected="name==version --hash=sha256:<64 hex digits>",
                hint="regenerate the lock: python images/cpu/lock.py",
            )
        hashes: list[str] = []
        for opt in m["rest"].split():
            hm = _HASH_RE.match(opt)
            if not hm:
                raise ConfigError(
                    f"{where}: unexpected option {opt!r} for {m['name']}",
                    expected="--hash=sha256:<64 lowercase hex digits>",
                )
            hashes.append(hm["hex"])
        if not hashes:
            raise ConfigError(f"{where}: {m['name']}=={m['version']} has no --hash", hint="every entry needs one")
        key = normalize_name(m["name"])
        if key in seen:
            raise ConfigError(f"{where}: {m['name']} is pinned twice (first at line {seen[key]})")
        seen[key] = start
        fname, size = pending_file if pending_file else (None, None)
        if fname is not None and parse_wheel_filename(fname) != (key, m["version"]):
            fname, size = None, None  # a stray comment: don't trust it
        entries.append(LockEntry(m["name"], m["version"], tuple(hashes), fname, size))
        pending_file = None
    if logical:
        raise ConfigError(f"{source}:{start}: the file ends inside a continued line")
    return entries


def render_lock(entries: Iterable[LockEntry], header: Sequence[str] = ()) -> str:
    """The lock text (sorted by name; file name and size as a comment above each entry)."""
    out = [f"# {h}".rstrip() for h in header]
    for e in sorted(entries, key=lambda e: e.key):
        if e.filename:
            out.append(f"# file: {e.filename}" + (f" ({e.size} bytes)" if e.size is not None else ""))
        hashes = " \\\n".join(f"    --hash=sha256:{h}" for h in e.hashes)
        out.append(f"{e.name}=={e.version} \\\n{hashes}")
    return "\n".join(out) + "\n"


def lock_digest(entries: Iterable[LockEntry]) -> str:
    """sha256 over the sorted (name, version, hashes): comments and order don't count."""
    rows = sorted((e.key, e.version, sorted(e.hashes)) for e in entries)
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()


# --------------------------------------------------------------------------------------------
# wheelhouse
# --------------------------------------------------------------------------------------------

_HASH_CACHE = ".imageforge-sha256.json"


@dataclass
class _HashCache:
    dir: Path
    data: dict[str, list[Any]] = field(default_factory=dict)

    @classmethod
    def load(cls, d: Path) -> _HashCache:
        try:
            data = json.loads((d / _HASH_CACHE).read_text())
        except (OSError, ValueError):
            data = {}
        return cls(d, data if isinstance(data, dict) else {})

    def sha256(self, path: Path) -> str:
        st = path.stat()
        hit = self.data.get(path.name)
        if hit and hit[0] == st.st_size and hit[1] == st.st_mtime_ns:
            return str(hit[2])
        digest = sha256_file(path)
        self.data[path.name] = [st.st_size, st.st_mtime_ns, digest]
        return digest

    def save(self) -> None:
        with contextlib.suppress(OSError):
            tmp = self.dir / (_HASH_CACHE + ".tmp")
            tmp.write_text(json.dumps(self.data, sort_keys=True))
            tmp.replace(self.dir / _HASH_CACHE)


def _candidates(entry: LockEntry, d: Path) -> list[Path]:
    if entry.filename and (d / entry.filename).is_file():
        return [d / entry.filename]
    out = []
    for p in sorted(d.glob("*.whl")):
        with contextlib.suppress(ValueError):
            if parse_wheel_filename(p.name) == (entry.key, entry.version):
                out.append(p)
    return out


def missing_wheels(entries: Sequence[LockEntry], d: Path, *, verify: bool = True) -> list[LockEntry]:
    """Entries without a matching wheel in ``d``.  With ``verify`` the sha256 must match too: a
    file that does not match counts as missing (a fresh download replaces it only when the
    download matches the lock, so a wrong lock never destroys a good cached wheel)."""
    if not d.is_dir():
        return list(entries)
    cache = _HashCache.load(d) if verify else None
    missing = []
    for e in entries:
        if not any(cache is None or cache.sha256(p) in e.hashes for p in _candidates(e, d)):
            missing.append(e)
    if cache is not None:
        cache.save()
    return missing


def fill_wheelhouse(entries: Sequence[LockEntry], d: Path, *, log: Log = print) -> int:
    """Download the missing wheels of ``entries`` into ``d`` (hash-checked); return how many."""
    d.mkdir(parents=True, exist_ok=True)
    missing = missing_wheels(entries, d)
    if not missing:
        return 0
    need = sum(e.size or 200 * de.MiB for e in missing)
    de.check_disk([de.DiskNeed("the wheelhouse downloads", d, need + 256 * de.MiB)])
    log(f"downloading {len(missing)} wheel(s) (~{de.human_bytes(need)}) into {d}")
    with tempfile.TemporaryDirectory(prefix=".partial-", dir=d) as tmp_s:
        tmp = Path(tmp_s)
        req = tmp / "missing.lock"
        req.write_text("".join(e.requirement_line() + "\n" for e in missing))
        dest = tmp / "dl"
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes",
            "--only-binary=:all:", "--disable-pip-version-check", "--progress-bar", "off",
            "--dest", str(dest), "-r", str(req),
        ]  # fmt: skip
        with progress("wheelhouse download", total=need, unit="bytes") as bar, watch_size(dest, bar):
            de.run_logged(
                cmd,
                what="pip download",
                hint="a hash mismatch means the lock and the index disagree: regenerate the lock "
                "(python images/cpu/lock.py) or restore it from git; otherwise check that PyPI is reachable",
            )
        for f in dest.glob("*.whl"):
            f.replace(d / f.name)
    still = missing_wheels(entries, d)
    if still:
        raise BuildError(
            f"{len(still)} wheel(s) still missing or not matching the lock after pip download",
            found=", ".join(f"{e.name}=={e.version}" for e in still[:8]),
            hint="the lock's sha256 do not match the downloaded files: regenerate the lock",
        )
    return len(missing)
