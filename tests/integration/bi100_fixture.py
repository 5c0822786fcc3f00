"""The vendor-layout fixture for the ``bi100`` target (issue 12), written from the facts note.

* :func:`vendor_image` -- the project's OS image (the ``imageforge/os:*`` that ``invoke base --target
  cpu`` imports) plus ``tests/fixtures/bi100-vendor/`` (the vendor's vLLM tree reduced to the lines the
  steps touch, at ``/usr/local/corex/lib64/python3/dist-packages``), ``/usr/local/corex/lib -> lib64``
  and the vendor's ``PYTHONPATH`` / ``LD_LIBRARY_PATH``. ``overrides`` replaces files (path relative
  to the fixture root -> text) to make a variant; variants get their own tag.
* :data:`BASELINE` -- the fake organisers' ``qwen3_6_scripts/`` whose ``patch_ops.sh`` deploys the
  baseline ``paged_attn.py`` / ``qwen3_5.py`` / ``serving_chat.py`` / ``protocol.py`` / ``cli_args.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import docker

from tests.integration import helpers

REPO = Path(__file__).resolve().parents[2]
VENDOR_ROOT = REPO / "tests" / "fixtures" / "bi100-vendor"
BASELINE = REPO / "tests" / "fixtures" / "bi100-baseline" / "qwen3_6_scripts"
PARSER_ROOT = REPO / "tests" / "fixtures" / "vllm-0.6.3-parser" / "vendor"
SITE = "/usr/local/corex/lib64/python3/dist-packages"
VENDOR_ENV = {"PYTHONPATH": SITE, "LD_LIBRARY_PATH": "/usr/local/corex/lib64:/usr/local/openmpi/lib"}
REPOSITORY = "imageforge-test/bi100-vendor"


def vendor_files(overrides: Mapping[str, str] | None = None) -> dict[str, bytes]:
    """Fixture path (relative to the root, e.g. ``usr/local/...``) -> bytes; the parser files (arg_utils.py,
    the vendor's cli_args.py without --reasoning-parser) come from tests/fixtures/vllm-0.6.3-parser/vendor/."""
    files = {p.relative_to(VENDOR_ROOT).as_posix(): p.read_bytes()
             for p in sorted(VENDOR_ROOT.rglob("*")) if p.is_file()}
    files.update({site_file(p.relative_to(PARSER_ROOT).as_posix()): p.read_bytes()
                  for p in sorted(PARSER_ROOT.rglob("*.py"))})
    for rel, text in (overrides or {}).items():
        assert rel in files, f"{rel} is not a fixture file"
        files[rel] = text.encode()
    return files


def site_file(rel: str) -> str:
    """Fixture path of a file under the vendor's site directory (``vllm/...``)."""
    return f"{SITE.lstrip('/')}/{rel}"


def os_image(c: docker.DockerClient) -> Any:
    """The cpu recipe's OS image by its computed tag (an image built FROM it inherits its kind label)."""
    return helpers.os_image(c)


def _tar(files: Mapping[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, data in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = 0o644
            info.mtime = 1577836800
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("usr/local/corex/lib")
        link.type = tarfile.SYMTYPE
        link.linkname = "lib64"
        tar.addfile(link)
    return buf.getvalue()


def vendor_image(c: docker.DockerClient | None = None, *, overrides: Mapping[str, str] | None = None) -> str:
    """Reference of the fixture image (made when missing)."""
    c = c or docker.DockerClient(base_url="unix:///var/run/docker.sock", timeout=600)
    files = vendor_files(overrides)
    base = os_image(c)
    digest = hashlib.sha256(json.dumps({k: hashlib.sha256(v).hexdigest() for k, v in files.items()},
                                       sort_keys=True).encode() + base.id.encode()).hexdigest()[:12]
    ref = f"{REPOSITORY}:{digest}"
    with contextlib.suppress(docker.errors.ImageNotFound):
        c.images.get(ref)
        return ref
    env = [e for e in (base.attrs["Config"].get("Env") or []) if e.split("=", 1)[0] not in VENDOR_ENV]
    env += [f"{k}={v}" for k, v in VENDOR_ENV.items()]
    container = c.containers.create(base.id, command=["true"])
    try:
        container.put_archive("/", _tar(files))
        container.commit(repository=REPOSITORY, tag=digest, conf={
            "Cmd": ["/bin/bash"], "Env": env,
            "Labels": {"org.imageforge.tool": "imageforge-test", "org.imageforge.test": "bi100-vendor",
                       "org.imageforge.kind": "test-base"}})
    finally:
        container.remove(force=True)
    return ref
