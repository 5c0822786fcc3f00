"""Directory listings of a created container: ``docker_engine.containers.list_dir`` reads the directory's streamed
archive (any chunking) for its direct entries; ContainerFS keeps a pristine container's (an image's files, never
written) on disk by image ID and directory, so the ~450 MB archive of torch/lib is streamed once per image, not on
every check-patches, preflight and build."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from imageforge.docker_engine import containers as dc
from imageforge.steps import ContainerFS
from imageforge.steps.fs import Entry

IMAGE = "sha256:" + "cd" * 32


class _Archived:
    """A created container whose get_archive streams a tar made here; it counts the archives asked for."""

    def __init__(self, image: str = IMAGE, *, chunk: int = 4096, big: bytes = b"\x7fELF" * 1000) -> None:
        self.attrs = {"Image": image}
        self.asked: list[str] = []
        self.chunk = chunk
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, data in (("./libtorch.so", big), ("./sub/x.so", b"x")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            link = tarfile.TarInfo("./libc10.so.1")
            link.type, link.linkname = tarfile.SYMTYPE, "libc10.so"
            tar.addfile(link)
            folder = tarfile.TarInfo("./sub")
            folder.type = tarfile.DIRTYPE
            tar.addfile(folder)
        self.data = buf.getvalue()

    def get_archive(self, path: str) -> tuple[Iterator[bytes], dict[str, Any]]:
        self.asked.append(path)  # list_dir asks for the folder's content: PATH/.
        return iter([self.data[i:i + self.chunk] for i in range(0, len(self.data), self.chunk)]), {}


LISTED = [("libtorch.so", Entry("file")), ("libc10.so.1", Entry("link", "libc10.so")), ("sub", Entry("dir"))]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("IMAGEFORGE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "listings"


def test_a_pristine_listing_is_read_once_per_image_and_directory(cache: Path) -> None:
    first = _Archived()
    assert ContainerFS(first, pristine=True).list_dir("/site/torch/lib") == LISTED
    again = _Archived()  # another container of the same image: the kept listing, no archive
    assert ContainerFS(again, pristine=True).list_dir("/site/torch/lib/") == LISTED and again.asked == []
    other = _Archived("sha256:" + "ef" * 32)  # another image: read
    assert ContainerFS(other, pristine=True).list_dir("/site/torch/lib") == LISTED and len(other.asked) == 1
    assert len(list(cache.glob("*.json"))) == 2


def test_a_step_container_is_read_every_time_and_a_bad_entry_is_read_again(cache: Path) -> None:
    step = _Archived()  # not pristine: what a step wrote there is not the image's
    fs = ContainerFS(step)
    assert fs.list_dir("/site/torch/lib") == LISTED and fs.list_dir("/site/torch/lib") == LISTED
    assert len(step.asked) == 2 and not cache.exists()
    ContainerFS(_Archived(), pristine=True).list_dir("/site/torch/lib")
    [entry] = cache.glob("*.json")
    entry.write_text("[[\"libtorch.so\"")  # cut short: a miss, read and written again
    reread = _Archived()
    assert ContainerFS(reread, pristine=True).list_dir("/site/torch/lib") == LISTED and len(reread.asked) == 1
    assert ContainerFS(_Archived(), pristine=True).list_dir("/site/torch/lib") == LISTED


def test_list_dir_reads_a_streamed_archive_in_any_chunking() -> None:
    """The direct entries (a subfolder's content left out) and their headers, whatever the chunks' size against
    tarfile's 10 KiB records; a member larger than a chunk is skipped, not returned."""
    big = os.urandom(3 * (1 << 20) + 12345)
    for chunk in (511, 10240, 2 << 20, 8 << 20):
        container = _Archived(chunk=chunk, big=big)
        entries = dc.list_dir(container, "/site/torch/lib/")
        assert [(n, i.size, i.issym(), i.isdir()) for n, i in entries] == [
            ("libtorch.so", len(big), False, False), ("libc10.so.1", 0, True, False), ("sub", 0, False, True)], chunk
        assert container.asked == ["/site/torch/lib/."]


def test_a_pristine_container_is_asked_for_a_path_s_stat_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ELF resolution follows every component of every candidate path; a pristine container's answers do not
    change, a step container's may (what the step writes)."""
    asked: list[str] = []

    def path_stat(container: Any, path: str) -> dict[str, Any] | None:
        asked.append(path)
        return None if path.endswith("missing") else {"mode": 0o644, "size": 3, "mtime": "2026-12-05T00:00:00Z"}

    monkeypatch.setattr(dc, "path_stat", path_stat)
    pristine = ContainerFS(_Archived(), pristine=True)
    for _ in range(3):
        assert pristine.stat("/usr/lib/x.so") == Entry("file") and pristine.stat("/usr/missing") is None
    assert pristine.identity("/usr/lib/x.so") == ("image", IMAGE, "/usr/lib/x.so", 3, "2026-12-05T00:00:00Z", 0o644)
    assert asked == ["/usr/lib/x.so", "/usr/missing"]
    asked.clear()
    step = ContainerFS(_Archived())
    assert step.stat("/usr/lib/x.so") == step.stat("/usr/lib/x.so") == Entry("file") and step.identity("/x") is None
    assert asked == ["/usr/lib/x.so", "/usr/lib/x.so"]
