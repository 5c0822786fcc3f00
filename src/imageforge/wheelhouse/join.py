#!/usr/bin/env python3
"""Check and join an imageforge wheelhouse sent in parts; unpack it.  Standard library only.

``invoke wheels`` writes, beside this script, ``NAME.tar.000``, ``NAME.tar.001``, ... (each at most
4 MB, small enough for a flaky SSH copy), and ``SHA256SUMS`` (``sha256sum`` format: one line per
part, then the whole archive). On the target machine, in the folder holding them::

    python3 wheelhouse_join.py [--out DIR]      # default DIR: ./wheelhouse

checks every part's sha256 (a missing or corrupted part is named, exit 1, nothing written), joins
them, checks the archive's sha256 and unpacks it into DIR (wheels + requirements.txt), then::

    python3 -m pip install --no-index --find-links DIR --require-hashes -r DIR/requirements.txt

Runs on any Python 3.8+ (the card's machine has 3.10); imports nothing of imageforge.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tarfile
from pathlib import Path, PurePosixPath

SUMS = "SHA256SUMS"
CHUNK = 1 << 20


class JoinError(Exception):
    """A part is missing or corrupted, or the archive holds something unsafe."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def read_sums(folder: Path) -> list[tuple[str, str]]:
    """(sha256, file name) per line of SHA256SUMS, in file order."""
    path = folder / SUMS
    if not path.is_file():
        raise JoinError(f"{path}: missing")
    out: list[tuple[str, str]] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        digest, sep, name = line.partition("  ")
        name = name.lstrip("*")
        if not sep or len(digest) != 64 or not name or "/" in name or name.startswith("."):
            raise JoinError(f"{path}:{number}: not a 'SHA256  NAME' line: {line!r}")
        out.append((digest.lower(), name))
    return out


def split_sums(entries: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], tuple[str, str]]:
    """The parts (NAME.tar.NNN, in order) and the whole archive (NAME.tar) named in SHA256SUMS."""
    archives = [e for e in entries if e[1].endswith(".tar")]
    if len(archives) != 1:
        raise JoinError(f"{SUMS}: expected exactly one *.tar line (the joined archive), found {len(archives)}")
    archive = archives[0]
    parts = [e for e in entries if e[1].startswith(archive[1] + ".")]
    suffixes = [name[len(archive[1]) + 1:] for _, name in parts]
    if not parts or suffixes != [f"{i:03d}" for i in range(len(parts))]:
        raise JoinError(f"{SUMS}: the parts of {archive[1]} must be numbered .000, .001, ... in order; "
                        f"found {suffixes}")
    return parts, archive


def check_parts(folder: Path) -> tuple[list[Path], tuple[str, str]]:
    """Every part present with its sha256; else JoinError naming each bad part."""
    parts, archive = split_sums(read_sums(folder))
    bad: list[str] = []
    for digest, name in parts:
        path = folder / name
        if not path.is_file():
            bad.append(f"{name}: missing")
            continue
        found = sha256_file(path)
        if found != digest:
            bad.append(f"{name}: sha256 {found}, expected {digest} (copy it again)")
    if bad:
        raise JoinError("; ".join(bad))
    return [folder / name for _, name in parts], archive


def join(folder: Path, archive_path: Path) -> Path:
    """Check the parts in ``folder``, write the joined archive to ``archive_path``, check its sha256."""
    parts, (digest, _name) = check_parts(folder)
    whole = hashlib.sha256()
    tmp = archive_path.with_name(archive_path.name + ".partial")
    with open(tmp, "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                while block := f.read(CHUNK):
                    whole.update(block)
                    out.write(block)
    if whole.hexdigest() != digest:
        tmp.unlink()
        raise JoinError(f"joined archive: sha256 {whole.hexdigest()}, expected {digest}")
    os.replace(tmp, archive_path)
    return archive_path


def unpack(archive_path: Path, dest: Path) -> list[str]:
    """Extract regular files only, each under ``dest`` (no absolute paths, no '..', no links)."""
    dest.mkdir(parents=True, exist_ok=True)
    names: list[str] = []
    with tarfile.open(archive_path, "r:") as tar:
        members = tar.getmembers()
        for member in members:
            parts = PurePosixPath(member.name).parts
            if member.isdir():
                continue
            if not member.isfile() or not parts or PurePosixPath(member.name).is_absolute() or ".." in parts:
                raise JoinError(f"{archive_path}: refusing member {member.name!r} (only plain relative files)")
        for member in members:
            if member.isdir():
                continue
            target = dest.joinpath(*PurePosixPath(member.name).parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None
            with source, open(target, "wb") as out:
                shutil.copyfileobj(source, out, CHUNK)
            names.append(member.name)
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--parts", default=str(Path(__file__).resolve().parent),
                        help="folder holding the parts and SHA256SUMS (default: this script's folder)")
    parser.add_argument("--out", default="wheelhouse", help="folder to unpack into (default: ./wheelhouse)")
    args = parser.parse_args(argv)
    folder = Path(args.parts)
    dest = Path(args.out)
    try:
        _parts, (_digest, name) = check_parts(folder)
        dest.mkdir(parents=True, exist_ok=True)
        archive = join(folder, dest / name)
        names = unpack(archive, dest)
        archive.unlink()
    except (JoinError, OSError, tarfile.TarError) as exc:
        print(f"wheelhouse_join: {exc}", file=sys.stderr)
        return 1
    wheels = sum(1 for n in names if n.endswith(".whl"))
    print(f"ok: {len(names)} files ({wheels} wheels) in {dest}")
    print(f"install: python3 -m pip install --no-index --find-links {dest} --require-hashes "
          f"-r {dest / 'requirements.txt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
