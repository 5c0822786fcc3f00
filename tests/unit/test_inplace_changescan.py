"""The undeclared-change scan of a script step (imageforge.inplace.changescan): one names-only listing before,
one lstat scan after, a ctime marker, and the clock watched by the kernel's timerfd."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from imageforge.inplace.changescan import ChangeScan, KernelClock, granularity_ns


class FakeClock:
    """A clock source the test decides: armed or not, set or not, and the offset it reports."""

    def __init__(self, *, can_arm: bool = True, set_back_s: float | None = None) -> None:
        self.can_arm = can_arm
        self.set_back_s = set_back_s
        self.checked = False

    def arm(self) -> bool:
        return self.can_arm

    def was_set(self) -> bool:
        self.checked = True
        return self.set_back_s is not None

    def offset_ns(self) -> int:
        return 0 if not self.checked or self.set_back_s is None else -int(self.set_back_s * 1e9)

    def close(self) -> None:
        return None


def tree(tmp_path: Path) -> Path:
    top = tmp_path / "site"
    (top / "pkg/sub").mkdir(parents=True)
    (top / "pkg/sub/a.py").write_text("A = 1\n")
    (top / "pkg/b.py").write_text("B = 1\n")
    (top / "declared").mkdir()
    (top / "declared/x").write_text("x")
    (top / "link").symlink_to("pkg")
    past = time.time_ns() - 10**11
    for path in [top, *top.rglob("*")]:
        os.utime(path, ns=(past, past), follow_symlinks=False)
    (tmp_path / "journal").mkdir()
    return top


def scan(top: Path, clock: object | None = None, **kwargs: object) -> ChangeScan:
    s = ChangeScan([top], [top / "declared"], [True], top.parent / "journal",
                   clock=clock or KernelClock(), **kwargs)  # type: ignore[arg-type]
    s.before()
    return s


def rel(top: Path, paths: list[str]) -> list[str]:
    return [str(Path(p).relative_to(top)) for p in paths]


def test_nothing_changed_is_nothing_and_the_declared_trees_and_the_top_are_not_listed(tmp_path: Path) -> None:
    top = tree(tmp_path)
    s = scan(top)
    assert set(s.names) == {str(top / p) for p in ("pkg", "pkg/sub", "pkg/sub/a.py", "pkg/b.py", "link")}
    (top / "declared/x").write_text("changed")  # declared: not looked at
    (top / "declared/new").write_text("new")
    assert s.changes() == ([], [], "")
    assert not list((tmp_path / "journal").iterdir())  # the marker is gone


def test_a_non_recursive_top_lists_only_its_entries(tmp_path: Path) -> None:
    top = tree(tmp_path)
    s = ChangeScan([top], [], [False], tmp_path / "journal")
    s.before()
    assert set(s.names) == {str(top / p) for p in ("pkg", "declared", "link")}
    (top / "pkg/sub/a.py").write_text("A = 3\n")  # below an entry: not scanned
    assert s.changes() == ([], [], "")


def test_a_same_size_rewrite_is_seen_with_its_mtime_put_back_too(tmp_path: Path) -> None:
    top = tree(tmp_path)
    s = scan(top)
    old = (top / "pkg/sub/a.py").stat()
    (top / "pkg/sub/a.py").write_text("A = 2\n")  # same size
    os.utime(top / "pkg/sub/a.py", ns=(old.st_atime_ns, old.st_mtime_ns))  # the mtime put back
    assert (top / "pkg/sub/a.py").stat().st_mtime_ns == old.st_mtime_ns
    assert s.changes() == ([str(top / "pkg/sub/a.py")], [], "")


def test_a_mode_change_and_a_touch_are_seen(tmp_path: Path) -> None:
    top = tree(tmp_path)
    s = scan(top)
    (top / "pkg/b.py").chmod(0o600)
    os.utime(top / "pkg/sub/a.py")
    assert rel(top, s.changes()[0]) == ["pkg/b.py", "pkg/sub/a.py"]


def test_an_added_a_removed_and_a_renamed_entry_are_seen(tmp_path: Path) -> None:
    top = tree(tmp_path)
    s = scan(top)
    (top / "pkg/new.py").write_text("")
    (top / "pkg/b.py").unlink()
    (top / "pkg/sub/a.py").rename(top / "pkg/sub/c.py")
    changed, added, why = s.changes()
    # the folders whose names changed, and the names gone
    assert rel(top, changed) == ["pkg", "pkg/b.py", "pkg/sub", "pkg/sub/a.py"]
    assert rel(top, added) == ["pkg/new.py", "pkg/sub/c.py"]
    assert why == ""


def test_a_rename_over_an_entry_is_seen_by_its_inode_and_its_folder(tmp_path: Path) -> None:
    top = tree(tmp_path)
    (top / "spare").write_text("B = 2\n")  # made before the scan, its ctime old for this test's purpose
    past = time.time_ns() - 10**11
    os.utime(top, ns=(past, past))
    s = scan(top)
    os.rename(top / "spare", top / "pkg/b.py")
    changed, added, _ = s.changes()
    assert rel(top, changed) == ["pkg", "pkg/b.py", "spare"] and added == []


def test_the_exact_and_the_loose_paths(tmp_path: Path) -> None:
    """Exact (what the apply already wrote): field by field, ctime and inode included; loose (folders on the way
    to a declared path): type, size, mode, mtime only, so a ctime-only move there is not a change."""
    top = tree(tmp_path)
    (top / "pkg/b.py").write_text("B = 1\n")  # written "by an earlier step", just before the marker
    s = scan(top, exact=[top / "pkg/b.py"], loose=[top / "pkg/sub"])
    os.utime(top / "pkg/sub", ns=(os.stat(top / "pkg/sub").st_atime_ns, os.stat(top / "pkg/sub").st_mtime_ns))
    assert s.changes() == ([], [], "")  # pkg/sub's ctime moved, its mtime did not
    s = scan(top, exact=[top / "pkg/b.py"], loose=[top / "pkg/sub"])
    old = (top / "pkg/b.py").stat()
    (top / "pkg/b.py").write_text("B = 2\n")
    os.utime(top / "pkg/b.py", ns=(old.st_atime_ns, old.st_mtime_ns))
    (top / "pkg/sub/a.py").unlink()  # pkg/sub's mtime moves
    assert rel(top, s.changes()[0]) == ["pkg/b.py", "pkg/sub", "pkg/sub/a.py"]


def test_a_clock_set_while_the_script_ran_names_every_path_and_says_why(tmp_path: Path) -> None:
    top = tree(tmp_path)
    s = scan(top, clock=FakeClock(set_back_s=30.0))
    (top / "pkg/new.py").write_text("")
    changed, added, why = s.changes()
    assert rel(top, added) == ["pkg/new.py"]
    assert rel(top, changed) == ["link", "pkg", "pkg/b.py", "pkg/sub", "pkg/sub/a.py"]
    assert "clock" in why and "-30.000 s" in why


def test_without_a_clock_watch_the_full_states_are_compared(tmp_path: Path) -> None:
    """No timerfd (not Linux): the listing keeps every entry's lstat state (two scans): still exact."""
    top = tree(tmp_path)
    s = scan(top, clock=FakeClock(can_arm=False))
    assert set(s.states) == set(s.names)
    assert s.changes() == ([], [], "")
    s = scan(top, clock=FakeClock(can_arm=False))
    old = (top / "pkg/sub/a.py").stat()
    (top / "pkg/sub/a.py").write_text("A = 2\n")
    os.utime(top / "pkg/sub/a.py", ns=(old.st_atime_ns, old.st_mtime_ns))
    assert s.changes() == ([str(top / "pkg/sub/a.py")], [], "")


def test_the_kernel_clock_arms_here_and_was_not_set() -> None:
    clock = KernelClock()
    assert clock.arm()  # Linux: the in-place machine
    assert clock.was_set() is False
    assert abs(clock.offset_ns() - (time.time_ns() - time.clock_gettime_ns(time.CLOCK_BOOTTIME))) < 10**8
    clock.close()


@pytest.mark.parametrize(("ctime", "bound"), [(1_700_000_000_123_456_789, 1), (1_700_000_000_100_000_000, 10**8),
                                              (1_700_000_000_000_000_000, 2 * 10**9)])
def test_the_granularity_bound(ctime: int, bound: int) -> None:
    assert granularity_ns(ctime) == bound
