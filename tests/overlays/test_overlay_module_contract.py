"""What the build relies on when it copies the overlay modules into the image's vllm package."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

BI100 = Path(__file__).resolve().parents[2] / "overlays" / "bi100"
# module -> the vLLM function it replaces, which its docstring must name
MODULES = {
    "paged_attention_v2": "vllm._custom_ops.paged_attention_v2",
    "paged_attention_layout": "PagedAttention.forward_decode",
    "sorted_moe": "fused_experts",
    "prefix_attention": "PagedAttention.forward_prefix",
}
ALLOWED_IMPORTS = {"torch", *sys.stdlib_module_names}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_standalone_py310_documented(name: str) -> None:
    source = (BI100 / f"{name}.py").read_text()
    tree = ast.parse(source, feature_version=(3, 10))  # the image's python may be 3.10
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports: the file is copied alone"
            imported.add((node.module or "").split(".")[0])
    assert imported <= ALLOWED_IMPORTS, f"{name} imports {imported - ALLOWED_IMPORTS}"
    doc = ast.get_docstring(tree) or ""
    assert MODULES[name] in doc, f"{name}'s docstring must name the vLLM function it replaces"
    assert "layout" in doc.lower() or "[" in doc, f"{name}'s docstring must give the layouts it expects"
