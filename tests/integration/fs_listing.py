"""Run inside an image (test_submission.py): every path of the container's filesystem, as the image has it.

One entry per path: ``[type, mode, "uid:gid", digest]``, as a tar of ``/`` would describe it (mode: the permission
bits, ``st_mode & 0o7777``, in octal; digest: sha256 of a file's content or of a link's target, ``major:minor``
of a device, "" for a directory). Mount points the container runtime adds (``/proc``, ``/sys``, ``/dev``, the
``/etc/hosts`` files ...; /proc/self/mountinfo lists them) are left out with what is under them: they are not
the image's. Written as gzipped JSON to the file named by ``argv[1]`` (put it under an excluded directory).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import stat
import sys

CHUNK = 1 << 20


def mount_points() -> set[str]:
    """Every mount point but ``/`` (field 5 of mountinfo; octal escapes such as ``\\040`` decoded)."""
    out: set[str] = set()
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            point = line.split()[4].encode().decode("unicode_escape")
            if point != "/":
                out.add(point)
    return out


def digest_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def entry(path: str, st: os.stat_result) -> list[str]:
    mode, owner = f"{stat.S_IMODE(st.st_mode):o}", f"{st.st_uid}:{st.st_gid}"
    if stat.S_ISREG(st.st_mode):
        return ["file", mode, owner, digest_of(path)]
    if stat.S_ISLNK(st.st_mode):
        return ["symlink", mode, owner, hashlib.sha256(os.readlink(path).encode()).hexdigest()]
    if stat.S_ISDIR(st.st_mode):
        return ["dir", mode, owner, ""]
    kind = "fifo" if stat.S_ISFIFO(st.st_mode) else "socket" if stat.S_ISSOCK(st.st_mode) else "device"
    return [kind, mode, owner, f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"]


def listing(skip: set[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"/": entry("/", os.lstat("/"))}
    for top, dirs, files in os.walk("/", topdown=True, followlinks=False):
        for name in [*dirs, *files]:
            path = os.path.join(top, name)
            if path in skip:
                continue
            out[path] = entry(path, os.lstat(path))
        dirs[:] = [d for d in dirs if os.path.join(top, d) not in skip]
    return out


def main() -> None:
    dest = sys.argv[1]
    found = listing(mount_points() | {dest})
    with gzip.open(dest, "wt", encoding="utf-8") as fh:
        json.dump(found, fh)


if __name__ == "__main__":
    main()
