"""The offline wheelhouse's pure parts: pip's target options, the hashed requirements, parts + SHA256SUMS + joiner.

The real download and the offline install into a fresh venv are in tests/integration/test_wheelhouse.py.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from imageforge.errors import ConfigError
from imageforge.wheelhouse import join as wheelhouse_join
from imageforge.wheelhouse import make as wheelhouse


def _fake_wheel(folder: Path, filename: str, payload: bytes) -> Path:
    path = folder / filename
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("payload.bin", payload)
    return path


def _random(n: int, seed: int) -> bytes:
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(f"{seed}:{counter}".encode()).digest()
        counter += 1
    return bytes(out[:n])


def test_pip_target_args_name_every_manylinux_tag_from_2014_up_to_2_31() -> None:
    args = wheelhouse.pip_target_args("3.10")
    assert args[:7] == ["--only-binary=:all:", "--python-version", "3.10", "--implementation", "cp", "--abi", "cp310"]
    platforms = [args[i + 1] for i, a in enumerate(args) if a == "--platform"]
    assert platforms[0] == "manylinux2014_x86_64"
    assert platforms[1:] == [f"manylinux_2_{m}_x86_64" for m in range(17, 32)]
    assert "cp311" in wheelhouse.pip_target_args("3.11")


@pytest.mark.parametrize("bad", ["3", "310", "cp310", "2.7", "3.10.1", ""])
def test_python_version_must_be_3_n(bad: str) -> None:
    with pytest.raises(ConfigError):
        wheelhouse.python_tag(bad)


def test_requirements_pin_every_wheel_with_its_sha256(tmp_path: Path) -> None:
    a = _fake_wheel(tmp_path, "PyYAML-6.0.2-cp310-cp310-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", b"a")
    b = _fake_wheel(tmp_path, "typing_extensions-4.12.2-py3-none-any.whl", b"b")
    text = wheelhouse.requirements_text([b, a], python="3.10")
    assert text.startswith(wheelhouse.HEADER)
    pins = [line for line in text.splitlines() if not line.startswith("#")]
    assert pins == [
        f"pyyaml==6.0.2 --hash=sha256:{hashlib.sha256(a.read_bytes()).hexdigest()}",
        f"typing-extensions==4.12.2 --hash=sha256:{hashlib.sha256(b.read_bytes()).hexdigest()}",
    ]


def test_parts_are_at_most_part_size_and_join_back_byte_identical(tmp_path: Path) -> None:
    src = tmp_path / "house"
    src.mkdir()
    files = [_fake_wheel(src, "big-1.0-py3-none-any.whl", _random(250_000, 1)),
             _fake_wheel(src, "small-2.0-py3-none-any.whl", _random(1_000, 2))]
    (src / "requirements.txt").write_text(wheelhouse.requirements_text(files, python="3.11"))
    files.append(src / "requirements.txt")
    parts_dir = tmp_path / "parts"
    parts = wheelhouse.write_parts(files, parts_dir, "wheelhouse-cp311", part_size=100_000)
    assert [p.name for p in parts] == [f"wheelhouse-cp311.tar.{i:03d}" for i in range(len(parts))]
    assert len(parts) >= 3 and all(p.stat().st_size <= 100_000 for p in parts)
    assert not (parts_dir / "wheelhouse-cp311.tar").exists()  # only the parts travel
    sums = (parts_dir / "SHA256SUMS").read_text().splitlines()
    assert [line.split("  ")[1] for line in sums] == [p.name for p in parts] + ["wheelhouse-cp311.tar"]
    for line, part in zip(sums[:-1], parts, strict=True):
        assert line.split("  ")[0] == hashlib.sha256(part.read_bytes()).hexdigest()
    # the copied script is the package's own module, and runs with nothing of imageforge importable
    script = parts_dir / "wheelhouse_join.py"
    assert script.read_bytes() == Path(wheelhouse_join.__file__).read_bytes()
    dest = tmp_path / "joined"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-I", str(script), "--out", str(dest)], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "ok: 3 files (2 wheels)" in proc.stdout
    for f in files:
        assert (dest / f.name).read_bytes() == f.read_bytes()
    assert sorted(p.name for p in dest.iterdir()) == sorted(f.name for f in files)  # the joined .tar removed


def test_the_same_files_give_the_same_parts(tmp_path: Path) -> None:
    src = tmp_path / "house"
    src.mkdir()
    files = [_fake_wheel(src, "x-1.0-py3-none-any.whl", _random(5_000, 3))]
    one = wheelhouse.write_parts(files, tmp_path / "one", "w", part_size=2_000)
    os.utime(files[0], (1, 1))
    two = wheelhouse.write_parts(files, tmp_path / "two", "w", part_size=2_000)
    assert [p.read_bytes() for p in one] == [p.read_bytes() for p in two]


def test_a_part_of_exactly_part_size_is_not_followed_by_an_empty_one(tmp_path: Path) -> None:
    blob = tmp_path / "blob"
    blob.write_bytes(b"x" * 3_000)
    parts = wheelhouse.split_file(blob, tmp_path, part_size=1_000)
    assert [p.stat().st_size for p in parts] == [1_000, 1_000, 1_000]
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert [p.stat().st_size for p in wheelhouse.split_file(empty, tmp_path, part_size=1_000)] == [0]


def _parts(tmp_path: Path) -> tuple[Path, list[Path]]:
    src = tmp_path / "house"
    src.mkdir(parents=True)
    files = [_fake_wheel(src, "x-1.0-py3-none-any.whl", _random(30_000, 4))]
    folder = tmp_path / "parts"
    return folder, wheelhouse.write_parts(files, folder, "wheelhouse-cp310", part_size=10_000)


def test_a_corrupted_part_is_refused_and_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder, parts = _parts(tmp_path)
    data = bytearray(parts[1].read_bytes())
    data[100] ^= 0xFF  # same size, one byte flipped
    parts[1].write_bytes(bytes(data))
    with pytest.raises(wheelhouse_join.JoinError, match=r"wheelhouse-cp310\.tar\.001: sha256 [0-9a-f]{64}, expected"):
        wheelhouse_join.check_parts(folder)
    dest = tmp_path / "out"
    assert wheelhouse_join.main(["--parts", str(folder), "--out", str(dest)]) == 1
    assert "wheelhouse-cp310.tar.001" in capsys.readouterr().err
    assert not dest.exists()  # nothing written


def test_a_missing_part_and_a_lost_last_part_are_refused(tmp_path: Path) -> None:
    folder, parts = _parts(tmp_path)
    parts[0].unlink()
    with pytest.raises(wheelhouse_join.JoinError, match=r"\.000: missing"):
        wheelhouse_join.check_parts(folder)
    folder2, _ = _parts(tmp_path / "b")
    sums = folder2 / "SHA256SUMS"
    lines = sums.read_text().splitlines()
    sums.write_text("\n".join([*lines[:1], *lines[2:]]) + "\n")  # .001 dropped from the list
    with pytest.raises(wheelhouse_join.JoinError, match="numbered"):
        wheelhouse_join.check_parts(folder2)


def test_the_joined_archive_is_checked_too(tmp_path: Path) -> None:
    folder, _ = _parts(tmp_path)
    sums = folder / "SHA256SUMS"
    lines = sums.read_text().splitlines()
    lines[-1] = "0" * 64 + "  wheelhouse-cp310.tar"
    sums.write_text("\n".join(lines) + "\n")
    with pytest.raises(wheelhouse_join.JoinError, match="joined archive"):
        wheelhouse_join.join(folder, tmp_path / "w.tar")
    assert not (tmp_path / "w.tar").exists()


def test_unpack_refuses_paths_leaving_the_folder(tmp_path: Path) -> None:
    import io
    import tarfile

    archive = tmp_path / "evil.tar"
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    with pytest.raises(wheelhouse_join.JoinError, match="refusing"):
        wheelhouse_join.unpack(archive, tmp_path / "dest")
    assert not (tmp_path / "escape.txt").exists()


def test_out_folder_must_be_empty_or_an_earlier_wheelhouse(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not a wheelhouse"):
        wheelhouse._clear(tmp_path)
    assert (tmp_path / "notes.txt").exists()
    earlier = tmp_path / "earlier"
    (earlier / "parts").mkdir(parents=True)
    (earlier / "requirements.txt").write_text(wheelhouse.HEADER + " for ...\n")
    _fake_wheel(earlier, "x-1.0-py3-none-any.whl", b"x")
    wheelhouse._clear(earlier)
    assert list(earlier.iterdir()) == []


def test_project_root_is_the_checkout_of_this_package() -> None:
    root = wheelhouse.project_root()
    assert (root / "pyproject.toml").is_file() and (root / "src" / "imageforge" / "wheelhouse" / "make.py").is_file()
    with pytest.raises(ConfigError, match="source checkout"):
        wheelhouse.project_root(Path("/usr/lib/x.py"))
