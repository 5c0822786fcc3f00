"""The vendor-layout fixture for the ``bi100`` target, written from the facts note.

* :func:`vendor_image` -- the project's OS image (the ``imageforge/os:*`` that ``invoke base --target
  cpu`` imports) plus ``tests/fixtures/bi100-vendor/`` (the vendor's vLLM tree reduced to the lines the
  steps touch, at ``/usr/local/corex/lib64/python3/dist-packages``), ``/usr/local/corex/lib -> lib64``
  and the vendor's ``PYTHONPATH`` / ``LD_LIBRARY_PATH``. ``overrides`` replaces files (path relative
  to the fixture root -> text) to make a variant; variants get their own tag.
  ``site_packages=True``: the image's Python also gets pip (from the bundled wheel Debian ships for venv,
  no network) and a stand-in ``transformers`` :data:`VENDOR_TRANSFORMERS` in its own purelib
  (``/usr/local/lib/python3.11/dist-packages``; on the card ``/usr/local/lib/python3.10/site-packages``),
  its ``EXTERNALLY-MANAGED`` marker removed (the vendor's Python has none: a plain ``pip install`` works).
* :data:`BASELINE` -- the fake organisers' ``qwen3_6_scripts/`` whose ``patch_ops.sh`` deploys the
  baseline ``paged_attn.py`` / ``qwen3_5.py`` / ``serving_chat.py`` / ``protocol.py`` / ``cli_args.py``;
  :func:`baseline_folder` is a copy of it with ``wheels/`` holding the stand-in transformers
  :data:`BASELINE_TRANSFORMERS`, which that ``patch_ops.sh`` then pip-installs (offline) as the real one
  installs transformers 4.55.3.
* :func:`transformers_wheel` -- the stand-in: a tiny pure-Python wheel named ``transformers`` (package,
  a ``transformers-cli`` console script, METADATA, WHEEL, RECORD with sha256s), written with zipfile.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import shutil
import tarfile
import tempfile
import zipfile
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
VENDOR_TRANSFORMERS = "4.46.3"  # the stand-in the fixture image's Python has before the baseline
BASELINE_TRANSFORMERS = "4.55.3"  # what the organisers' patch_ops.sh installs (facts note)
PURELIB = "/usr/local/lib/python3.11/dist-packages"  # the fixture image's Python (Debian's) install scheme
SCRIPTS = "/usr/local/bin"
_EPOCH = (2020, 1, 1, 0, 0, 0)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def transformers_wheel(version: str, directory: Path) -> Path:
    """A stand-in ``transformers-VERSION-py3-none-any.whl`` in ``directory`` (same bytes every time)."""
    dist_info = f"transformers-{version}.dist-info"
    files = {
        "transformers/__init__.py": '"""imageforge test stand-in for transformers (no model code)."""\n'
                                    f'__version__ = "{version}"\n',
        "transformers/utils/__init__.py": "",
        "transformers/utils/versions.py": f'def require_version(requirement):\n    return "{version}"\n',
        "transformers/commands/__init__.py": "",
        "transformers/commands/transformers_cli.py": "def main():\n    import transformers\n"
                                                     "    print(transformers.__version__)\n",
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: transformers\nVersion: {version}\n"
                                 "Summary: imageforge test stand-in\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: imageforge-tests\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n",
        f"{dist_info}/entry_points.txt": "[console_scripts]\ntransformers-cli = "
                                         "transformers.commands.transformers_cli:main\n",
        f"{dist_info}/top_level.txt": "transformers\n",
    }
    data = {name: text.encode() for name, text in files.items()}
    record = [f"{name},{_record_hash(raw)},{len(raw)}" for name, raw in data.items()]
    data[f"{dist_info}/RECORD"] = ("\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n").encode()
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / f"transformers-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, raw in data.items():
            info = zipfile.ZipInfo(name, _EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, raw)
    return wheel


def baseline_folder(dest: Path) -> Path:
    """A copy of :data:`BASELINE` at ``dest`` with ``wheels/`` holding the baseline's transformers stand-in."""
    shutil.copytree(BASELINE, dest)
    transformers_wheel(BASELINE_TRANSFORMERS, dest / "wheels")
    return dest


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


#: Run in the fixture container for ``site_packages=True``: pip from Debian's bundled wheel (a wheel runs as
#: ``python3 WHEEL/pip``), the vendor-side transformers stand-in, and no EXTERNALLY-MANAGED marker.
SITE_PACKAGES = (
    "set -e; pip_wheel=$(ls /usr/share/python-wheels/pip-*.whl); "
    "python3 \"$pip_wheel/pip\" install -q --no-index --no-cache-dir --disable-pip-version-check "
    "--break-system-packages \"$pip_wheel\" /tmp/vendor-wheels/*.whl; "
    "rm -rf /tmp/vendor-wheels /root/.cache; rm -f /usr/lib/python3*/EXTERNALLY-MANAGED; "
    "python3 -m pip --version; python3 -c 'import transformers; print(transformers.__version__)'"
)


def _wheel_tar(wheel: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(wheel), arcname=f"tmp/vendor-wheels/{wheel.name}")
    return buf.getvalue()


def vendor_image(c: docker.DockerClient | None = None, *, overrides: Mapping[str, str] | None = None,
                 site_packages: bool = False) -> str:
    """Reference of the fixture image (made when missing); ``site_packages``: pip + transformers (module)."""
    c = c or docker.DockerClient(base_url="unix:///var/run/docker.sock", timeout=600)
    files = vendor_files(overrides)
    base = os_image(c)
    with tempfile.TemporaryDirectory(prefix="imageforge-vendor-wheels-") as tmp:
        wheel = transformers_wheel(VENDOR_TRANSFORMERS, Path(tmp)) if site_packages else None
        extra = (SITE_PACKAGES + hashlib.sha256(wheel.read_bytes()).hexdigest()).encode() if wheel else b""
        digest = hashlib.sha256(json.dumps({k: hashlib.sha256(v).hexdigest() for k, v in files.items()},
                                           sort_keys=True).encode() + base.id.encode() + extra).hexdigest()[:12]
        return _make(c, base, files, digest, wheel)


def _make(c: docker.DockerClient, base: Any, files: Mapping[str, bytes], digest: str, wheel: Path | None) -> str:
    with helpers.one_maker(f"bi100-fixture-{digest}"):
        return _make_unlocked(c, base, files, digest, wheel)


def _make_unlocked(c: docker.DockerClient, base: Any, files: Mapping[str, bytes], digest: str,
                   wheel: Path | None) -> str:
    ref = f"{REPOSITORY}:{digest}"
    with contextlib.suppress(docker.errors.ImageNotFound):
        c.images.get(ref)
        return ref
    env = [e for e in (base.attrs["Config"].get("Env") or []) if e.split("=", 1)[0] not in VENDOR_ENV]
    env += [f"{k}={v}" for k, v in VENDOR_ENV.items()]
    container = c.containers.create(base.id, command=["sleep", "infinity"], network_disabled=True)
    try:
        container.put_archive("/", _tar(files))
        if wheel is not None:
            container.put_archive("/", _wheel_tar(wheel))
            container.start()
            code, out = container.exec_run(["bash", "-c", SITE_PACKAGES])
            assert code == 0, out.decode(errors="replace")
        container.commit(repository=REPOSITORY, tag=digest, conf={
            "Cmd": ["/bin/bash"], "Env": env,
            "Labels": {"org.imageforge.tool": "imageforge-test", "org.imageforge.test": "bi100-vendor",
                       "org.imageforge.kind": "test-base"}})
    finally:
        container.remove(force=True)
    return ref
