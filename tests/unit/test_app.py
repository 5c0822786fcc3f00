"""The front door: one Settings object in, the manifest loaded once, values from Settings.environ only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from imageforge import app
from imageforge.errors import ConfigError
from imageforge.settings import Settings


def test_plan_reads_the_environment_of_its_settings_not_the_process(write_manifest: Callable[..., Path],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_manifest()
    monkeypatch.setenv("IMAGEFORGE_SET", "max-num-seqs=99")  # the process environment: must not count
    s = Settings.from_cli(manifest=str(path), environ={"IMAGEFORGE_SET": "max-num-seqs=5"})
    values = {v.key: (v.value, v.source) for v in app.plan(s, None, None, ["enforce-eager=false"],
                                                           use_daemon=False).plan.resolved.serving}
    assert values["max-num-seqs"] == (5, "env:IMAGEFORGE_SET")
    assert values["enforce-eager"] == (False, "cli:--set")


def test_validate_and_a_missing_manifest(write_manifest: Callable[..., Path], tmp_path: Path) -> None:
    summary = app.validate(app.settings(manifest=str(write_manifest())))
    assert [name for name in summary.manifest.targets] == ["t"]
    with pytest.raises(ConfigError) as info:
        app.validate(Settings.from_cli(environ={"IMAGEFORGE_MANIFEST": str(tmp_path / "absent.yaml")}))
    assert info.value.exit_code == 2 and "absent.yaml" in info.value.render()
