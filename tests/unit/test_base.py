"""imageforge.base without a daemon: the lock, content keys, recipe, apt sources, wheelhouse, model."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from imageforge import base
from imageforge import docker_engine as de
from imageforge.errors import BuildError, ConfigError, InfraError

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "images" / "cpu"
H1, H2 = "a" * 64, "b" * 64


@pytest.fixture
def recipe_copy(tmp_path: Path) -> Path:
    d = tmp_path / "cpu"
    shutil.copytree(RECIPE, d, ignore=shutil.ignore_patterns("__pycache__"))
    return d


# ---------------------------------------------------------------------------- lock


def test_committed_lock() -> None:
    entries = base.parse_lock((RECIPE / "requirements.lock").read_text())
    by = {e.key: e for e in entries}
    assert by["vllm-cpu"].version == "0.32.0"
    assert by["torch"].version.endswith("+cpu")
    for left_out in ("torchvision", "torchaudio", "torchcodec", "triton"):
        assert left_out not in by
    assert all(e.filename and e.size for e in entries)
    assert all(len(e.hashes) == 1 and len(e.hashes[0]) == 64 for e in entries)
    assert len(entries) > 100


def test_parse_lock_formats() -> None:
    text = (
        "# header\n\n"
        "# file: foo_bar-1.0-py3-none-any.whl (123 bytes)\n"
        f"Foo_Bar==1.0 \\\n    --hash=sha256:{H1} \\\n    --hash=sha256:{H2}\n"
        f"baz==2.0+cpu --hash=sha256:{H1}  # trailing comment\n"
    )
    foo, baz = base.parse_lock(text)
    assert (foo.name, foo.version, foo.hashes, foo.filename, foo.size) == (
        "Foo_Bar", "1.0", (H1, H2), "foo_bar-1.0-py3-none-any.whl", 123,
    )  # fmt: skip
    assert foo.key == "foo-bar"
    assert (baz.version, baz.hashes, baz.filename) == ("2.0+cpu", (H1,), None)


def test_parse_lock_round_trip_and_digest_ignores_comments() -> None:
    entries = [
        base.LockEntry("zeta", "1", (H2,), "zeta-1-py3-none-any.whl", 5),
        base.LockEntry("alpha", "2", (H1,)),
    ]
    text = base.render_lock(entries, ["generated"])
    again = base.parse_lock(text)
    assert [e.key for e in again] == ["alpha", "zeta"]
    assert again[1].filename == "zeta-1-py3-none-any.whl" and again[1].size == 5
    assert base.lock_digest(again) == base.lock_digest(entries)
    assert base.lock_digest(base.parse_lock("# other comment\n" + text)) == base.lock_digest(entries)
    changed = [base.LockEntry("zeta", "1", (H1,)), base.LockEntry("alpha", "2", (H1,))]
    assert base.lock_digest(changed) != base.lock_digest(entries)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("foo>=1.0 --hash=sha256:" + H1, "not a pinned requirement"),
        ("foo==1.0", "has no --hash"),
        ("foo==1.0 --hash=md5:abc", "unexpected option"),
        ("foo==1.0 --hash=sha256:abc", "unexpected option"),
        (f"foo==1.0 --hash=sha256:{H1}\nFOO==1.0 --hash=sha256:{H1}", "pinned twice"),
        (f"foo==1.0 \\\n --hash=sha256:{H1} \\", "ends inside a continued line"),
    ],
)
def test_parse_lock_errors(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as ei:
        base.parse_lock(text, source="x.lock")
    assert needle in ei.value.message and "x.lock:" in ei.value.message


def test_parse_wheel_filename() -> None:
    assert base.parse_wheel_filename("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl") == (
        "torch",
        "2.13.0+cpu",
    )
    assert base.parse_wheel_filename("Foo_Bar-1.0-1-py3-none-any.whl") == ("foo-bar", "1.0")
    with pytest.raises(ValueError):
        base.parse_wheel_filename("foo-1.0.tar.gz")


# ---------------------------------------------------------------------------- recipe and keys


def test_recipe_loads_and_names_no_mirror() -> None:
    recipe = base.load_recipe(RECIPE)
    assert "libnuma1" in recipe.os["packages"] and "python3-venv" in recipe.os["packages"]
    assert recipe.vllm["env"]["PATH"].startswith(recipe.vllm["venv"] + "/bin:")
    for f in ("base.yaml", "install.sh", "requirements.lock", "lock.py", "make_model.py"):
        assert "://" not in (RECIPE / f).read_text(), f"{f} names a URL"


def test_recipe_errors(recipe_copy: Path) -> None:
    with pytest.raises(ConfigError, match="no base image recipe"):
        base.load_recipe(recipe_copy / "nope")
    (recipe_copy / "base.yaml").write_text("os: {}\n")
    with pytest.raises(ConfigError) as ei:
        base.load_recipe(recipe_copy)
    assert ei.value.key_path in {"os.repository", "vllm"}
    (recipe_copy / "base.yaml").write_text("os: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        base.load_recipe(recipe_copy)


def test_keys_are_stable_and_cover_their_inputs(recipe_copy: Path) -> None:
    r = base.load_recipe(recipe_copy)
    entries = base.parse_lock(r.lock_path.read_text())
    okey, vkey = base.os_key(r), base.vllm_key(r, entries)
    assert okey == base.os_key(base.load_recipe(RECIPE)) and len(okey) == 64
    assert vkey == base.vllm_key(base.load_recipe(RECIPE), entries)
    assert base.image_ref("imageforge/os", okey) == f"imageforge/os:{okey[:16]}"

    # the install script is part of the vLLM key only
    (recipe_copy / "install.sh").write_text((recipe_copy / "install.sh").read_text() + "\n# changed\n")
    r2 = base.load_recipe(recipe_copy)
    assert base.os_key(r2) == okey and base.vllm_key(r2, entries) != vkey
    # the lock too
    assert base.vllm_key(r, entries[1:]) != vkey
    # the OS section changes both
    text = (recipe_copy / "base.yaml").read_text().replace("- libnuma1", "- libnuma1\n    - procps")
    (recipe_copy / "base.yaml").write_text(text)
    r3 = base.load_recipe(recipe_copy)
    assert base.os_key(r3) != okey and base.vllm_key(r3, entries) != base.vllm_key(r2, entries)


# ---------------------------------------------------------------------------- OS image pieces


def test_filter_apt_sources_one_line() -> None:
    text = (
        "deb http://example.invalid/debian bookworm main\n"
        "# deb http://example.invalid/debian bookworm contrib\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://example.invalid/debian-security bookworm-security main\n"
        "deb-src http://example.invalid/debian bookworm main\n"
        "deb http://example.invalid/other cloud-sdk-bookworm main\n"
        "deb http://example.invalid/debian trixie main\n"
    )
    out = base.filter_apt_sources(text, "bookworm", deb822=False).splitlines()
    assert out == [
        "deb http://example.invalid/debian bookworm main",
        "deb [arch=amd64 signed-by=/k.gpg] http://example.invalid/debian-security bookworm-security main",
    ]


def test_filter_apt_sources_deb822() -> None:
    text = (
        "Types: deb deb-src\n# comment\nURIs: http://example.invalid/debian\n"
        "Suites: bookworm bookworm-updates trixie\nComponents: main\n\n"
        "Types: deb\nURIs: http://example.invalid/node\nSuites: nodistro\nComponents: main\n\n"
        "Types: deb\nURIs: http://example.invalid/debian\nSuites: bookworm\nEnabled: no\n"
    )
    out = base.filter_apt_sources(text, "bookworm", deb822=True)
    assert out == (
        "Types: deb\nURIs: http://example.invalid/debian\nSuites: bookworm bookworm-updates\nComponents: main\n"
    )
    assert base.filter_apt_sources("", "bookworm", deb822=True) == ""


def test_host_sources_files(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    (etc / "sources.list.d").mkdir(parents=True)
    (etc / "sources.list").write_text("")
    (etc / "sources.list.d" / "a.sources").write_text(
        "Types: deb\nURIs: http://example.invalid/debian\nSuites: bookworm\nComponents: main\n"
    )
    (etc / "sources.list.d" / "b.list.disabled").write_text("deb http://x.invalid/ bookworm main\n")
    out = tmp_path / "out"
    out.mkdir()
    files = base.images._host_sources_files("bookworm", out, etc)
    assert files == [str(out / "host.sources")]
    assert "Suites: bookworm" in Path(files[0]).read_text()


def test_mmdebstrap_command() -> None:
    recipe = base.load_recipe(RECIPE)
    cmd = base.mmdebstrap_command(recipe.os, Path("/t/rootfs.tar"), ["/t/host.sources"])
    assert cmd[0] == "mmdebstrap" and "--variant=minbase" in cmd
    assert "--include=python3,python3-venv,ca-certificates,libnuma1,g++,python3-dev" in cmd  # + the toolchain
    assert "--dpkgopt=path-exclude=/usr/share/doc/*" in cmd
    assert "--dpkgopt=path-include=/usr/share/doc/*/copyright" in cmd
    assert any("etc/apt/sources.list" in c for c in cmd if c.startswith("--customize-hook="))
    assert cmd[-3:] == ["bookworm", "/t/rootfs.tar", "/t/host.sources"]
    assert not any("://" in c for c in cmd)


def test_import_changes() -> None:
    changes = base.import_changes(
        {"env": {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, "cmd": ["/bin/bash"]},
        de.tool_labels("os-base", "k"),
    )
    assert changes[:3] == ["ENV PATH=/usr/bin:/bin", "ENV LANG=C.UTF-8", 'CMD ["/bin/bash"]']
    assert changes[3] == (
        'LABEL org.imageforge.tool="imageforge" org.imageforge.kind="os-base" org.imageforge.recipe-key="k"'
    )


# ---------------------------------------------------------------------------- wheelhouse


def _wheel(d: Path, name: str, content: bytes) -> base.LockEntry:
    fn = f"{name}-1.0-py3-none-any.whl"
    (d / fn).write_bytes(content)
    return base.LockEntry(name, "1.0", (hashlib.sha256(content).hexdigest(),), fn, len(content))


def test_missing_wheels(tmp_path: Path) -> None:
    good = _wheel(tmp_path, "good", b"good")
    bad = _wheel(tmp_path, "bad", b"bad")
    bad = base.LockEntry("bad", "1.0", (H1,), bad.filename)  # the lock says another hash
    nameless = base.LockEntry("good", "1.0", good.hashes)  # found by parsing file names
    absent = base.LockEntry("absent", "1.0", (H1,))
    assert base.missing_wheels([good, bad, nameless, absent], tmp_path) == [bad, absent]
    assert (tmp_path / "bad-1.0-py3-none-any.whl").exists()  # never deleted: the lock may be the wrong one
    assert base.missing_wheels([bad], tmp_path, verify=False) == []
    assert base.missing_wheels([good], tmp_path / "none") == [good]
    # hash cache: a changed file is hashed again
    (tmp_path / good.filename).write_bytes(b"changed!")  # type: ignore[operator]
    assert base.missing_wheels([good], tmp_path) == [good]


def test_fill_wheelhouse_nothing_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    e = _wheel(tmp_path, "good", b"good")
    monkeypatch.setattr(de, "run_logged", lambda *a, **k: pytest.fail("no download expected"))
    assert base.fill_wheelhouse([e], tmp_path) == 0


def test_fill_wheelhouse_downloads_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    content = b"fresh wheel"
    entry = base.LockEntry("new", "1.0", (hashlib.sha256(content).hexdigest(),), "new-1.0-py3-none-any.whl", 11)
    calls: list[list[str]] = []

    def fake_pip(cmd: list[str], **kw: object) -> str:
        calls.append(cmd)
        assert "--require-hashes" in cmd and "--no-deps" in cmd
        dest = Path(cmd[cmd.index("--dest") + 1])
        assert "new==1.0 --hash=sha256:" in Path(cmd[cmd.index("-r") + 1]).read_text()
        dest.mkdir()
        (dest / "new-1.0-py3-none-any.whl").write_bytes(content)
        return ""

    monkeypatch.setattr(de, "run_logged", fake_pip)
    monkeypatch.setattr(de, "free_bytes", lambda p: 100 * de.GiB)
    wh = tmp_path / "wh"
    assert base.fill_wheelhouse([entry], wh, log=lambda s: None) == 1
    assert (wh / entry.filename).read_bytes() == content  # type: ignore[operator]
    assert not list(wh.glob(".partial-*"))
    assert base.fill_wheelhouse([entry], wh, log=lambda s: None) == 0 and len(calls) == 1


def test_fill_wheelhouse_hash_mismatch_fails_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = base.LockEntry("new", "1.0", (H1,), "new-1.0-py3-none-any.whl", 5)

    def pip_downloads_other_bytes(cmd: list[str], **kw: object) -> str:
        dest = Path(cmd[cmd.index("--dest") + 1])
        dest.mkdir()
        (dest / "new-1.0-py3-none-any.whl").write_bytes(b"other")
        return ""

    monkeypatch.setattr(de, "run_logged", pip_downloads_other_bytes)
    monkeypatch.setattr(de, "free_bytes", lambda p: 100 * de.GiB)
    with pytest.raises(BuildError) as ei:
        base.fill_wheelhouse([entry], tmp_path / "wh", log=lambda s: None)
    assert "not matching the lock" in ei.value.message and "new==1.0" in (ei.value.found or "")


def test_fill_wheelhouse_checks_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = base.LockEntry("big", "1.0", (H1,), "big-1.0-py3-none-any.whl", 900 * de.MiB)
    monkeypatch.setattr(de, "free_bytes", lambda p: 100 * de.MiB)
    monkeypatch.setattr(de, "run_logged", lambda *a, **k: pytest.fail("no download expected"))
    with pytest.raises(InfraError, match="not enough free disk space"):
        base.fill_wheelhouse([entry], tmp_path / "wh", log=lambda s: None)


# ---------------------------------------------------------------------------- status and model


def test_base_image_status_without_daemon(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("IMAGEFORGE_CACHE", str(tmp_path))
    monkeypatch.setattr(de, "_ping", lambda timeout=5: "no daemon")
    st = base.base_image_status(RECIPE)
    assert st.vllm_present is None and st.os_present is None
    assert st.ref.startswith("imageforge/vllm-cpu-base:") and st.os_ref.startswith("imageforge/os:")
    assert st.wheels_missing == st.wheels > 100
    assert st.to_make == ("os", "wheelhouse", "vllm")
    text = "\n".join(st.lines())
    assert "unknown (no Docker daemon answers)" in text and "to download" in text
    present = base.BaseStatus(**{**st.__dict__, "vllm_present": True})
    assert present.to_make == () and "wheelhouse" in present.lines()[2] and "not needed" in present.lines()[2]


def test_ensure_model_reuses_and_rewrites(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    monkeypatch.setenv("IMAGEFORGE_CACHE", str(tmp_path / "cache"))
    logs: list[str] = []
    d = base.ensure_model(RECIPE, log=logs.append)
    assert d.parent == tmp_path / "cache" / "models" and d.name.startswith("tiny-qwen3-moe-")
    assert (d / "config.json").is_file() and logs[-1].startswith("made tiny model")
    assert oct((d / "config.json").stat().st_mode & 0o777) == "0o644"
    assert base.ensure_model(RECIPE, log=logs.append) == d and logs[-1].startswith("reuse tiny model")
    # an explicit destination, and a stale stamp is rewritten
    dest = tmp_path / "explicit"
    assert base.ensure_model(RECIPE, dest, log=logs.append) == dest
    (dest / ".imageforge-model").write_text("old\n")
    (dest / "config.json").write_text("{}")
    base.ensure_model(RECIPE, dest, log=logs.append)
    assert logs[-1].startswith("made tiny model")
    assert (dest / "config.json").read_bytes() == (d / "config.json").read_bytes()
    assert not list(tmp_path.glob(".explicit-*"))


# ---------------------------------------------------------------------------- the recipe read once


def test_the_recipe_is_read_once_and_passed_as_data(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    reads: list[Path] = []
    real = base.recipe.load_recipe

    def counting(recipe_dir: Path) -> base.Recipe:
        reads.append(recipe_dir)
        return real(recipe_dir)

    monkeypatch.setattr(base.recipe, "load_recipe", counting)  # the one reader of base.yaml
    monkeypatch.setenv("IMAGEFORGE_CACHE", str(tmp_path))
    monkeypatch.setattr(de, "_ping", lambda timeout=5: "no daemon")
    recipe = base.as_recipe(RECIPE)
    assert len(reads) == 1
    assert recipe.lock == tuple(base.parse_lock(recipe.lock_path.read_text())) and len(recipe.lock) > 100
    refs = base.recipe_refs(recipe)
    assert refs.os_key == base.os_key(recipe) and refs.vllm_key == base.vllm_key(recipe, recipe.lock)
    assert refs.lock_digest == base.lock_digest(recipe.lock) and refs.ref.startswith("imageforge/vllm-cpu-base:")
    # handed the loaded recipe, nothing reads base.yaml again; handed the directory, once per call
    status = base.base_image_status(recipe)
    assert base.default_model_dir(recipe) == status.model_dir and base.model_digest(recipe)
    assert len(reads) == 1
    assert base.base_image_status(RECIPE) == status and len(reads) == 2
    dest = tmp_path / "model"
    dest.mkdir()
    (dest / ".imageforge-model").write_text(base.model_digest(recipe) + "\n")
    logs: list[str] = []
    assert base.ensure_model(RECIPE, dest, log=logs.append) == dest and logs == [f"reuse tiny model {dest}"]
    assert len(reads) == 3  # ensure_model read base.yaml once (it used to read it 4 times)
    assert base.as_recipe(recipe) is recipe


def test_a_broken_lock_fails_when_the_recipe_is_loaded(recipe_copy: Path) -> None:
    (recipe_copy / "requirements.lock").write_text("torch>=2\n")
    with pytest.raises(ConfigError, match="not a pinned requirement"):
        base.load_recipe(recipe_copy)
