"""The dead-file rule (imageforge.scripts.deadfiles): what a script's command runs or imports from its folder."""

from __future__ import annotations

from pathlib import Path

from imageforge.scripts.deadfiles import dead_files, live_files, live_in_image

PATCH_OPS = """\
#!/bin/bash
set -euo pipefail
[[ -f ./patch_ops.sh ]] || { echo "run me from my folder" >&2; exit 2; }
VLLM=/usr/local/corex/lib64/python3/dist-packages/vllm
cp paged_attn.py "$VLLM/attention/ops/paged_attn.py"   # copied, not run
python3 patch_model_runner.py "$VLLM"
PYTHONPATH=. python3 -u "$PWD/patch_xformers_sdpa_seq.py" && echo ok
if ! python3 - "$VLLM" <<'PY'
import discover_paths
PY
then
  exit 3
fi
python3 -m tool_parser_patch \\
    --into "$VLLM"
bash ./more.sh
"""


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "qwen3_6_scripts"
    (folder / "tool_parser_patch").mkdir(parents=True)
    files = {
        "patch_ops.sh": PATCH_OPS,
        "more.sh": "python3 patch_vllm_tool_parser.py\n",
        "paged_attn.py": "X = 1\n",
        "patch_model_runner.py": "from common import edit\nedit()\n",
        "common.py": "def edit():\n    pass\n",
        "patch_xformers_sdpa_seq.py": "print(1)\n",
        "discover_paths.py": "ROOT = '/'\n",
        "tool_parser_patch/__main__.py": "print(2)\n",
        "patch_vllm_tool_parser.py": "print(3)\n",
        "patch_paged_attention_v2.py": "def forward(:\n",  # the organisers' dead patcher: a syntax error
    }
    for rel, text in files.items():
        (folder / rel).write_text(text)
    return folder


def test_live_files_are_the_run_and_imported_ones(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    live = live_files(folder, ["bash", "patch_ops.sh"])
    assert live == {
        "common.py": "imported by patch_model_runner.py",
        "discover_paths.py": "imported by patch_ops.sh (inline python)",
        "patch_model_runner.py": "run by patch_ops.sh",
        "patch_vllm_tool_parser.py": "run by more.sh",
        "patch_xformers_sdpa_seq.py": "run by patch_ops.sh",
        "tool_parser_patch/__main__.py": "run by patch_ops.sh (-m)",
    }
    assert dead_files(folder, ["bash", "patch_ops.sh"]) == ("paged_attn.py", "patch_paged_attention_v2.py")


def test_a_command_that_runs_nothing_leaves_every_file_dead(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    assert live_files(folder, ["sh", "-c", "true"]) == {}
    assert "patch_model_runner.py" in dead_files(folder, ["true"])


def test_a_python_command_and_the_image_paths(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    live = live_in_image(folder, "/workspace/qwen3_6_scripts", ["python3", "patch_model_runner.py"],
                         "/workspace/qwen3_6_scripts")
    assert live == {"/workspace/qwen3_6_scripts/common.py": "imported by patch_model_runner.py",
                    "/workspace/qwen3_6_scripts/patch_model_runner.py": "run by the step's command"}


def test_an_absolute_cd_into_the_folder_keeps_its_files_live(tmp_path: Path) -> None:
    """`cd /workspace/qwen3_6_scripts` (the folder's own place when the command runs) before running its patchers
    leaves them live; a cd out of the folder leaves relative names unresolved, an absolute path into it resolves."""
    folder = _folder(tmp_path)
    (folder / "run.sh").write_text("set -e\ncd /workspace/qwen3_6_scripts\npython3 patch_model_runner.py\n"
                                   "cd /opt\npython3 patch_xformers_sdpa_seq.py\n"
                                   "python3 /workspace/qwen3_6_scripts/tool_parser_patch/__main__.py\n")
    live = live_in_image(folder, "/workspace/qwen3_6_scripts", ["bash", "run.sh"], "/workspace/qwen3_6_scripts")
    assert set(live) == {"/workspace/qwen3_6_scripts/" + rel for rel in
                         ("patch_model_runner.py", "common.py", "tool_parser_patch/__main__.py")}
    # in place the folder runs where it is: an absolute cd to that place is the folder too
    (folder / "here.sh").write_text(f"cd {folder}\npython3 patch_model_runner.py\n")
    assert "patch_model_runner.py" in live_files(folder, ["bash", "here.sh"])
