"""bootstrap.sh installs with uv, resolved as pip would: scripts/uv_args.py turns pip's configuration into uv flags."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def uv_args(env: dict[str, str]) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "uv_args.py")], capture_output=True, text=True,
                          check=True, env={**clean, **env})
    return proc.stdout.splitlines()


def test_pip_variables_win_over_its_files_and_each_value_is_one_flag() -> None:
    args = uv_args({"PIP_EXTRA_INDEX_URL": "file:///a/simple  file:///b/simple", "PIP_FIND_LINKS": "/x/wheels",
                    "PIP_CONSTRAINT": "/c/constraints.txt"})
    pairs = list(zip(args[::2], args[1::2], strict=True))
    assert [v for f, v in pairs if f == "--extra-index-url"] == ["file:///a/simple", "file:///b/simple"]
    assert [v for f, v in pairs if f == "--find-links"] == ["/x/wheels"]
    assert [v for f, v in pairs if f == "--constraint"] == ["/c/constraints.txt"]
    assert {f for f, _ in pairs} <= {"--index-url", "--extra-index-url", "--find-links", "--constraint"}


def test_without_configuration_no_flag(tmp_path: Path) -> None:
    assert uv_args({"PIP_CONFIG_FILE": os.devnull}) == []


def test_bootstrap_installs_with_uv_and_falls_back_to_pip() -> None:
    text = (REPO / "bootstrap.sh").read_text()
    assert "scripts/uv_args.py" in text and "--index-strategy unsafe-best-match" in text
    assert 'if ! with_uv; then' in text and '-m pip install -q -e "$extras"' in text
