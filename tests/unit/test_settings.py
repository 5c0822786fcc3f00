"""The tool's own options: command line > environment > default, written once (imageforge.settings)."""

from __future__ import annotations

from pathlib import Path

from imageforge.settings import Settings, cache_dir, host_address, manifest_path, traceback_wanted


def test_command_line_wins_over_environment_over_default() -> None:
    env = {"IMAGEFORGE_HOST_ADDRESS": "192.0.2.7", "IMAGEFORGE_MANIFEST": "/m/env.yaml"}
    s = Settings.from_cli(manifest="/m/cli.yaml", host_address="198.51.100.1", environ=env)
    assert (s.manifest, s.host_address) == (Path("/m/cli.yaml"), "198.51.100.1")
    assert s.sources["manifest"] == "cli" and s.sources["host_address"] == "cli"
    s = Settings.from_cli(environ=env)
    assert (s.manifest, s.host_address) == (Path("/m/env.yaml"), "192.0.2.7")
    assert s.sources["manifest"] == "env:IMAGEFORGE_MANIFEST"
    assert s.sources["host_address"] == "env:IMAGEFORGE_HOST_ADDRESS"
    s = Settings.from_cli(environ={})
    assert (s.manifest, s.host_address, s.traceback) == (Path("build.yaml"), "127.0.0.1", False)
    assert set(s.sources.values()) == {"default"}


def test_blank_values_count_as_not_given() -> None:
    env = {"IMAGEFORGE_HOST_ADDRESS": "  ", "IMAGEFORGE_MANIFEST": ""}
    assert host_address("", env) == "127.0.0.1"
    assert host_address(None, {"IMAGEFORGE_HOST_ADDRESS": " 192.0.2.9 "}) == "192.0.2.9"
    assert manifest_path(None, env) == Path("build.yaml")


def test_traceback_flag_or_environment() -> None:
    assert traceback_wanted(True, {}) is True
    assert traceback_wanted(False, {"IMAGEFORGE_TRACEBACK": "1"}) is True
    assert traceback_wanted(False, {"IMAGEFORGE_TRACEBACK": "0"}) is False
    assert traceback_wanted(False, {"IMAGEFORGE_TRACEBACK": "no"}) is False
    assert Settings.from_cli(environ={"IMAGEFORGE_TRACEBACK": "yes"}).sources["traceback"] == "env:IMAGEFORGE_TRACEBACK"


def test_cache_dir_and_frozen_environment() -> None:
    assert cache_dir({"IMAGEFORGE_CACHE": "/srv/cache"}) == Path("/srv/cache")
    assert cache_dir({}) == Path.home() / ".cache" / "imageforge"
    env = {"IMAGEFORGE_SET": "max-num-seqs=4"}
    s = Settings.from_cli(environ=env)
    env["IMAGEFORGE_SET"] = "max-num-seqs=8"  # the settings hold a copy, taken once
    assert s.environ["IMAGEFORGE_SET"] == "max-num-seqs=4"


def test_reuse_servers_flag_or_environment_reaches_every_start_through_the_environment() -> None:
    from imageforge.settings import ENV_REUSE_SERVERS, reuse_servers_wanted

    assert reuse_servers_wanted(False, {}) is False
    assert reuse_servers_wanted(False, {ENV_REUSE_SERVERS: "1"}) is True
    assert reuse_servers_wanted(False, {ENV_REUSE_SERVERS: "no"}) is False
    s = Settings.from_cli(reuse_servers=True, environ={})
    assert s.reuse_servers and s.sources["reuse_servers"] == "cli"
    assert s.environ[ENV_REUSE_SERVERS] == "1"  # serve.container reads it from the environment it is given
    s = Settings.from_cli(environ={ENV_REUSE_SERVERS: "true"})
    assert s.reuse_servers and s.sources["reuse_servers"] == f"env:{ENV_REUSE_SERVERS}"
    s = Settings.from_cli(environ={})
    assert not s.reuse_servers and s.sources["reuse_servers"] == "default" and ENV_REUSE_SERVERS not in s.environ
