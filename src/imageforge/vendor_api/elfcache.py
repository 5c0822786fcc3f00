"""ELF summaries kept on disk between commands, keyed by the identity of the file they were read from.

The native step's checks read the ``DT_NEEDED`` closure of its extension on every apply, check-patches, build and
preflight; that closure includes torch's libtorch_cpu.so (415 MB): ~6 s read on the host, 12-15 s through a
container's archive.  A summary (:class:`~imageforge.vendor_api.elfcheck.ElfSummary`) is kept here under the host
cache (``settings.cache_dir()``/``elf``), one JSON file per identity:

* a file on this machine (in place): ``(path, device, inode, size, mtime_ns, ctime_ns)`` -- a changed file has a new
  ``ctime`` even when its writer kept its size and restored its ``mtime``, so it is read again;
* a file of an image (a container created from it and never written at that path): ``(image ID, path, size,
  mtime, mode)`` -- the image ID names its content.

A file whose identity cannot be known (an in-memory result of an earlier step, a path a running container wrote) is
read every time.  Concurrent readers of one identity wait on one ``filelock`` lock (the second finds the first's
summary); each entry is written to a temporary file and renamed into place, so a reader never sees half of one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..settings import cache_dir, keep_json
from .elfcheck import ElfSummary, Undefined

#: The entry format; a new one makes every older entry a miss.
FORMAT = "imageforge-elf-summary/1"

#: A file's identity: the strings and integers that change when its bytes may have changed.
Identity = tuple[str | int, ...]


def _to_json(summary: ElfSummary) -> dict[str, Any]:
    return {"elfclass": summary.elfclass, "machine": summary.machine, "type": summary.type, "soname": summary.soname,
            "needed": list(summary.needed), "rpath": list(summary.rpath), "runpath": list(summary.runpath),
            "exports": sorted(summary.exports), "undefined": [[u.name, u.weak] for u in summary.undefined],
            "version_needs": {k: list(v) for k, v in summary.version_needs.items()},
            "version_defs": sorted(summary.version_defs)}


def _from_json(doc: Mapping[str, Any]) -> ElfSummary:
    return ElfSummary(int(doc["elfclass"]), str(doc["machine"]), str(doc["type"]),
                      None if doc["soname"] is None else str(doc["soname"]), tuple(doc["needed"]),
                      tuple(doc["rpath"]), tuple(doc["runpath"]), frozenset(doc["exports"]),
                      tuple(Undefined(str(n), bool(w)) for n, w in doc["undefined"]),
                      {str(k): tuple(v) for k, v in doc["version_needs"].items()}, frozenset(doc["version_defs"]))


class SummaryStore:
    """The summaries under ``directory`` (created on first write), one file per identity."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, identity: Identity) -> Path:
        digest = hashlib.sha256(json.dumps([FORMAT, *identity]).encode()).hexdigest()
        return self.directory / f"{digest[:32]}.json"

    def get(self, identity: Identity) -> ElfSummary | None:
        """The summary kept for ``identity``; None when none is (or the entry cannot be read)."""
        try:
            doc = json.loads(self._path(identity).read_text())
            if doc.get("format") != FORMAT or doc.get("identity") != json.loads(json.dumps(list(identity))):
                return None
            return _from_json(doc["summary"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, identity: Identity, summary: ElfSummary) -> None:
        """Keep ``summary`` for ``identity`` (a cache that cannot be written is no cache: nothing is raised)."""
        path = self._path(identity)
        doc = {"format": FORMAT, "identity": list(identity), "summary": _to_json(summary)}
        keep_json(path, doc)

    def get_or_make(self, identity: Identity, make: Callable[[], ElfSummary]) -> ElfSummary:
        """The kept summary, else ``make()`` kept; one maker at a time per identity (the others then read it)."""
        found = self.get(identity)
        if found is not None:
            return found
        import filelock

        lock_path = self._path(identity).with_suffix(".lock")
        try:
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            lock: contextlib.AbstractContextManager[Any] = filelock.FileLock(str(lock_path))
        except OSError:
            lock = contextlib.nullcontext()
        with lock:
            found = self.get(identity)
            if found is not None:
                return found
            summary = make()
            self.put(identity, summary)
            return summary


def default_store(environ: Mapping[str, str] | None = None) -> SummaryStore:
    """The store under the host cache (``$IMAGEFORGE_CACHE`` or ~/.cache/imageforge)."""
    return SummaryStore(cache_dir(environ) / "elf")
