"""What ``/proc`` says about processes: a pid's state, process group and start time; who listens on a port.

A recorded server is recognised by pid *and* start time (field 22 of ``/proc/<pid>/stat``), so a recycled pid is
never taken for it. Every function takes the ``/proc`` folder (``proc=``) so tests can hand it a fake one.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str
    pgrp: int
    starttime: int  # clock ticks after boot (field 22 of /proc/<pid>/stat)


def parse_stat(text: str) -> ProcStat:
    """Parse ``/proc/<pid>/stat`` (the command name may hold spaces and parentheses: split after the last ``)``)."""
    head, _, rest = text.rpartition(")")
    pid = int(head.split("(", 1)[0])
    fields = rest.split()
    return ProcStat(pid, fields[0], int(fields[2]), int(fields[19]))


def proc_stat(pid: int, proc: Path = Path("/proc")) -> ProcStat | None:
    try:
        return parse_stat((proc / str(pid) / "stat").read_text())
    except (OSError, ValueError, IndexError):
        return None


def alive(pid: int, starttime: int, proc: Path = Path("/proc")) -> bool:
    """The recorded process still runs: same pid, same start time, not a zombie."""
    stat = proc_stat(pid, proc)
    return stat is not None and stat.starttime == starttime and stat.state not in ("Z", "X")


def group_members(pgrp: int, proc: Path = Path("/proc")) -> list[int]:
    """Live processes of process group ``pgrp``."""
    out = []
    for entry in proc.iterdir() if proc.is_dir() else ():
        if entry.name.isdigit():
            stat = proc_stat(int(entry.name), proc)
            if stat is not None and stat.pgrp == pgrp and stat.state not in ("Z", "X"):
                out.append(stat.pid)
    return out


def listening_inodes(port: int, proc: Path = Path("/proc")) -> set[str]:
    """Socket inodes listening on ``port`` (any address, IPv4 and IPv6) from ``/proc/net/tcp*``."""
    inodes: set[str] = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    return inodes


def port_holder(port: int, proc: Path = Path("/proc")) -> int | None:
    """The pid of a process listening on ``port`` (None when not found or not visible)."""
    inodes = {f"socket:[{i}]" for i in listening_inodes(port, proc)}
    if not inodes:
        return None
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        return int(entry.name)
    return None
