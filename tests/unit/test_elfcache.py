"""ELF summaries kept on disk by file identity (imageforge.vendor_api.elfcache): a kept summary spares the read, a
changed file is read again (even with its size and mtime kept), what cannot be identified is never kept.

The objects are test_elfcheck's (compiled here with the host's C compiler), written under a root as an in-place
check reads the machine (:class:`imageforge.inplace.localfs.LocalFS`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from imageforge.docker_engine import containers as dc
from imageforge.inplace.localfs import LocalFS
from imageforge.patches.check import Overlay
from imageforge.steps import ContainerFS, DictFS
from imageforge.vendor_api import elfcache
from imageforge.vendor_api.elfcache import SummaryStore, default_store
from imageforge.vendor_api.elfcheck import ElfSummary, Finding, Resolver, check_extension, identity_of, summarise
from tests.unit.test_elfcheck import CC, EXT, LIBDIR, SITE, compile_objects

pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler on this host")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    return compile_objects(tmp_path_factory.mktemp("elf"))

STDCXX = f"{LIBDIR}/libstdc++.so.6.0.30"


def root_of(tmp: Path, built: dict[str, bytes]) -> Path:
    """test_elfcheck's image as files under ``tmp/root`` (the interpreter and libstdc++ behind links)."""
    root = tmp / "root"
    for path, data in {"/usr/bin/python3.11": built["python"], STDCXX: built["stdcxx-old"],
                       f"{SITE}/torch/lib/libbefore.so": built["before"]}.items():
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / path.lstrip("/")).write_bytes(data)
    (root / "usr/bin/python3").symlink_to("python3.11")
    (root / LIBDIR.lstrip("/") / "libstdc++.so.6").symlink_to("libstdc++.so.6.0.30")
    return root


class Counting:
    """summarise, counting what it reads."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def __call__(self, data: bytes) -> ElfSummary:
        self.sizes.append(len(data))
        return summarise(data)


def check(data: bytes, files: Any, store: SummaryStore | None, read: Callable[[bytes], ElfSummary]) -> list[Finding]:
    return check_extension(EXT, data, files, interpreter="/usr/bin/python3",
                           loaded_before=[f"{SITE}/torch/lib/libbefore.so"],
                           resolver=Resolver(files, (), read, store=store))


def test_a_kept_summary_spares_the_read_and_gives_the_same_findings(tmp_path: Path, built: dict[str, bytes]) -> None:
    files = LocalFS(root_of(tmp_path, built))
    store = SummaryStore(tmp_path / "elf")
    first, second, uncached = Counting(), Counting(), Counting()
    found = check(built["too-new"], files, store, first)
    assert sorted(f.code for f in found) == ["undefined-symbol", "version-missing"]
    assert len(first.sizes) == 3  # the interpreter, libbefore, libstdc++
    assert check(built["too-new"], files, store, second) == found
    assert second.sizes == []  # a new resolver (the next command): nothing read
    assert check(built["too-new"], files, None, uncached) == found and len(uncached.sizes) == 3
    assert len(list((tmp_path / "elf").glob("*.json"))) == 3


def test_a_changed_file_is_read_again_even_with_its_size_and_mtime_kept(tmp_path: Path,
                                                                        built: dict[str, bytes]) -> None:
    root = root_of(tmp_path, built)
    files = LocalFS(root)
    store = SummaryStore(tmp_path / "elf")
    assert "version-missing" in [f.code for f in check(built["too-new"], files, store, Counting())]
    # the library rebuilt with GLIBCXX_3.4.32, written over the same inode with the old mtime put back
    lib = root / STDCXX.lstrip("/")
    before = os.stat(lib)
    newer = bytearray(built["newer-stdcxx"])
    with lib.open("r+b") as fh:
        fh.truncate(0)
        fh.write(newer)
    os.utime(lib, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(lib)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    again = Counting()
    assert check(built["too-new"], files, store, again) == []  # the new library defines GLIBCXX_3.4.32
    assert again.sizes == [len(newer)]  # only the changed file was read


def test_what_cannot_be_identified_is_read_every_time(tmp_path: Path, built: dict[str, bytes]) -> None:
    fs = DictFS(files={"/usr/bin/python3.11": built["python"], STDCXX: built["stdcxx-old"],
                       f"{SITE}/torch/lib/libbefore.so": built["before"]},
                links={"/usr/bin/python3": "python3.11", f"{LIBDIR}/libstdc++.so.6": "libstdc++.so.6.0.30"})
    store = SummaryStore(tmp_path / "elf")
    for _ in range(2):
        counting = Counting()
        check(built["good"], fs, store, counting)
        assert len(counting.sizes) == 3
    assert not (tmp_path / "elf").exists()
    # an earlier step's in-memory result over the image: never kept by the image's identity
    under = LocalFS(root_of(tmp_path, built))
    overlay = Overlay(under, files={STDCXX: built["stdcxx-old"]})
    assert identity_of(overlay, STDCXX) is None
    assert identity_of(overlay, "/usr/bin/python3.11") == identity_of(under, "/usr/bin/python3.11") is not None
    assert identity_of(under, "/usr/bin") is None and identity_of(under, "/nothing/here") is None


def test_an_entry_that_cannot_be_read_is_a_miss_and_is_made_again(tmp_path: Path, built: dict[str, bytes]) -> None:
    store = SummaryStore(tmp_path / "elf")
    identity = ("host", "/x/libstdc++.so.6", 1, 2, 3, 4, 5)
    made: list[int] = []

    def make() -> ElfSummary:
        made.append(1)
        return summarise(built["stdcxx-old"])

    summary = store.get_or_make(identity, make)
    assert store.get_or_make(identity, make) == summary == summarise(built["stdcxx-old"]) and made == [1]
    entry = next((tmp_path / "elf").glob("*.json"))
    assert json.loads(entry.read_text())["identity"] == list(identity)
    entry.write_text('{"format": "imageforge-elf-summary/1", "identity": [')
    assert store.get(identity) is None
    assert store.get_or_make(identity, make) == summary and made == [1, 1]
    assert store.get(("host", "/x/libstdc++.so.6", 1, 2, 3, 4, 6)) is None  # another ctime: another file
    assert default_store({"IMAGEFORGE_CACHE": str(tmp_path / "c")}).directory == tmp_path / "c" / "elf"
    assert elfcache.FORMAT in entry.read_text()


class _Container:
    def __init__(self) -> None:
        self.attrs = {"Image": "sha256:" + "ab" * 32}


def test_an_image_file_is_identified_by_the_image_only_in_a_pristine_container(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stats = {STDCXX: {"name": "libstdc++.so.6.0.30", "size": 2048, "mode": 0o644, "mtime": "2026-12-04T10:00:00.1Z"},
             LIBDIR: {"name": "x86_64-linux-gnu", "size": 4096, "mode": 0o755 | (1 << 31), "mtime": "x"}}
    monkeypatch.setattr(dc, "path_stat", lambda _c, path: stats.get(path))
    pristine = ContainerFS(_Container(), pristine=True)
    assert pristine.identity(STDCXX) == ("image", "sha256:" + "ab" * 32, STDCXX, 2048, "2026-12-04T10:00:00.1Z",
                                         0o644)
    assert pristine.identity(LIBDIR) is None and pristine.identity("/absent") is None
    assert ContainerFS(_Container()).identity(STDCXX) is None  # a step container: what a step wrote is not the image's
