"""The tool's own options (not serving values): one frozen object, one precedence rule.

Each option is taken, highest precedence first, from

1. the command line (``--manifest``, ``--traceback``, ``--host-address``, ``--reuse-servers``);
2. the environment (``IMAGEFORGE_MANIFEST``, ``IMAGEFORGE_TRACEBACK``, ``IMAGEFORGE_HOST_ADDRESS``,
   ``IMAGEFORGE_REUSE_SERVERS``, ``IMAGEFORGE_CACHE``);
3. the default.

The rule is written once (:func:`pick`); every reader of these variables goes through it, and
:class:`Settings` remembers where each value came from, the way :mod:`imageforge.manifest.resolve` does for
serving values.  Serving values themselves (``IMAGEFORGE_SET``, ``--set``) stay in ``resolve``.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

ENV_MANIFEST = "IMAGEFORGE_MANIFEST"
ENV_TRACEBACK = "IMAGEFORGE_TRACEBACK"
ENV_HOST_ADDRESS = "IMAGEFORGE_HOST_ADDRESS"
ENV_CACHE = "IMAGEFORGE_CACHE"
ENV_REUSE_SERVERS = "IMAGEFORGE_REUSE_SERVERS"

DEFAULT_MANIFEST = "build.yaml"
DEFAULT_HOST_ADDRESS = "127.0.0.1"
DEFAULT_CACHE = "~/.cache/imageforge"
_FALSE = ("", "0", "false", "no")


#: The caller's ``PYTHONPATH``, kept by the console command when it runs itself without it (the card's corex
#: ``PYTHONPATH`` would shadow imageforge's own venv); Settings.environ gives it back as ``PYTHONPATH``.
ENV_CALLER_PYTHONPATH = "IMAGEFORGE_CALLER_PYTHONPATH"


def pick(flag: str | None, environ: Mapping[str, str], variable: str, default: str) -> tuple[str, str]:
    """(value, source): the command-line value, else the environment's, else ``default``.

    Empty or blank values count as not given.  ``source`` is ``cli``, ``env:VARIABLE`` or ``default``.
    """
    if flag is not None and str(flag).strip():
        return str(flag).strip(), "cli"
    value = environ.get(variable, "").strip()
    if value:
        return value, f"env:{variable}"
    return default, "default"


def manifest_path(flag: str | None, environ: Mapping[str, str]) -> Path:
    """``--manifest``, ``$IMAGEFORGE_MANIFEST`` or ./build.yaml."""
    return Path(pick(flag, environ, ENV_MANIFEST, DEFAULT_MANIFEST)[0])


def traceback_wanted(flag: bool, environ: Mapping[str, str]) -> bool:
    """``--traceback``, else ``IMAGEFORGE_TRACEBACK`` set to anything but 0/false/no."""
    return flag or environ.get(ENV_TRACEBACK, "") not in _FALSE


def reuse_servers_wanted(flag: bool, environ: Mapping[str, str]) -> bool:
    """``--reuse-servers``, else ``IMAGEFORGE_REUSE_SERVERS`` set to anything but 0/false/no: a command that would
    start a server uses a running one of the same image and run spec instead (:mod:`imageforge.serve.container`)."""
    return flag or environ.get(ENV_REUSE_SERVERS, "") not in _FALSE


def host_address(flag: str | None, environ: Mapping[str, str]) -> str:
    """Where servers are published and reached: ``--host-address``, ``$IMAGEFORGE_HOST_ADDRESS``, 127.0.0.1."""
    return pick(flag, environ, ENV_HOST_ADDRESS, DEFAULT_HOST_ADDRESS)[0]


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The host cache (wheelhouse, discovery, models, locks, ELF summaries): ``$IMAGEFORGE_CACHE`` or
    ~/.cache/imageforge."""
    value = pick(None, os.environ if environ is None else environ, ENV_CACHE, DEFAULT_CACHE)[0]
    return Path(value).expanduser()


def keep_json(path: Path, doc: Any) -> None:
    """Keep ``doc`` as a host-cache entry at ``path``: written to a temporary file beside it and renamed into place,
    so a reader never sees half of one. A cache that cannot be written is no cache: an OSError is swallowed."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(doc, fh, separators=(",", ":"))
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


@dataclass(frozen=True)
class Settings:
    """The options of one command, resolved once at the front door (:mod:`imageforge.app`)."""

    manifest: Path
    traceback: bool
    host_address: str
    reuse_servers: bool
    cache_dir: Path
    environ: Mapping[str, str]  # a frozen copy: ${VAR} bases and volumes, IMAGEFORGE_SET
    sources: Mapping[str, str]  # option -> cli | env:VARIABLE | default

    @classmethod
    def from_cli(cls, *, manifest: str | None = None, traceback: bool = False, host_address: str | None = None,
                 reuse_servers: bool = False, environ: Mapping[str, str] | None = None) -> Settings:
        given = dict(os.environ if environ is None else environ)
        if ENV_CALLER_PYTHONPATH in given:  # the console command dropped it for itself: the caller's, for the target
            given["PYTHONPATH"] = given.pop(ENV_CALLER_PYTHONPATH)
        reuse = reuse_servers_wanted(reuse_servers, given)
        reuse_source = "cli" if reuse_servers else (f"env:{ENV_REUSE_SERVERS}" if reuse else "default")
        if reuse_servers:  # the flag reaches every server start through the environment, as the variable does
            given[ENV_REUSE_SERVERS] = "1"
        env = MappingProxyType(given)
        manifest_value, manifest_source = pick(manifest, env, ENV_MANIFEST, DEFAULT_MANIFEST)
        address, address_source = pick(host_address, env, ENV_HOST_ADDRESS, DEFAULT_HOST_ADDRESS)
        cache_source = pick(None, env, ENV_CACHE, DEFAULT_CACHE)[1]
        wanted = traceback_wanted(traceback, env)
        sources = {"manifest": manifest_source, "host_address": address_source, "cache_dir": cache_source,
                   "traceback": "cli" if traceback else (f"env:{ENV_TRACEBACK}" if wanted else "default"),
                   "reuse_servers": reuse_source}
        return cls(manifest=Path(manifest_value), traceback=wanted, host_address=address, reuse_servers=reuse,
                   cache_dir=cache_dir(env), environ=env, sources=MappingProxyType(sources))
