"""The serving environment the platform starts the server with (the target's ``serving.env`` and profiles' ``env``,
which the submission writes into ``computility-run.yaml``, and a run file a team keeps beside its Dockerfile):
a variable that only adds logging, tracing or debugging is a warning (``run-env-diagnostic``).

Such variables cost speed on the evaluator's clock (``CUDA_LAUNCH_BLOCKING=1`` serialises every kernel launch;
``NCCL_DEBUG=INFO`` and ``VLLM_LOGGING_LEVEL=DEBUG`` log per step) and change nothing the evaluator checks. Which
ones, and at which values, is data (:data:`DIAGNOSTIC_ENV`). The run file is read with PyYAML's composer, so each
finding names its line.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..manifest.model import Manifest, Target
from ..manifest.resolve import Resolved
from .findings import Finding

RUN_FILE = "computility-run.yaml"
#: Values that switch a boolean diagnostic off: no finding.
OFF_VALUES = frozenset({"", "0", "false", "off", "no", "none"})


@dataclass(frozen=True)
class Diagnostic:
    """A diagnostic-only variable: ``values`` the (upper-cased) values that turn the diagnostic on (None: any value
    not in :data:`OFF_VALUES`); ``why`` what it costs."""

    name: str
    why: str
    values: frozenset[str] | None = None


#: Variables that only add logging, tracing or debug output (by name).
DIAGNOSTIC_ENV: dict[str, Diagnostic] = {d.name: d for d in (
    Diagnostic("CUDA_LAUNCH_BLOCKING", "every kernel launch waits for the kernel: serving runs synchronously"),
    Diagnostic("NCCL_DEBUG", "NCCL logs every communicator and collective", frozenset({"INFO", "TRACE"})),
    Diagnostic("NCCL_DEBUG_SUBSYS", "NCCL debug subsystems: only read for NCCL_DEBUG output"),
    Diagnostic("TORCH_SHOW_CPP_STACKTRACES", "C++ stack traces on every torch error: debugging only"),
    Diagnostic("TORCH_DISTRIBUTED_DEBUG", "extra collective checks and logs", frozenset({"INFO", "DETAIL"})),
    Diagnostic("TORCH_CPP_LOG_LEVEL", "torch's C++ logs at info level", frozenset({"INFO", "0"})),
    Diagnostic("TORCH_USE_CUDA_DSA", "device-side assertions: slower kernels"),
    Diagnostic("VLLM_LOGGING_LEVEL", "vLLM logs at debug level", frozenset({"DEBUG"})),
    Diagnostic("VLLM_TRACE_FUNCTION", "vLLM traces every Python function call"),
    Diagnostic("PYTHONFAULTHANDLER", "Python's fault handler: tracebacks on a crash, debugging only"),
    Diagnostic("PYTHONDEVMODE", "Python's development mode: extra runtime checks"),
    Diagnostic("PYTHONTRACEMALLOC", "every allocation traced: slower and more memory"),
    Diagnostic("CUDA_DEVICE_DEBUG", "device debugging"),
)}


def diagnostic(name: str, value: str) -> Diagnostic | None:
    """The diagnostic ``name=value`` turns on, or None."""
    d = DIAGNOSTIC_ENV.get(name)
    if d is None:
        return None
    shown = value.strip().upper()
    if d.values is None:
        return None if shown.lower() in OFF_VALUES else d
    return d if shown in d.values else None


def _finding(name: str, value: str, d: Diagnostic, path: str, line: int | None, column: int | None,
             where: str) -> Finding:
    return Finding("run-env-diagnostic", f"{name}={value} in {where} only adds diagnostics: {d.why}", path, line,
                   column, expected=f"no {name} (or a value that turns it off)", found=f"{name}={value}",
                   hint="drop it from the serving env (keep it in a debug profile that is never submitted)")


def manifest_env_findings(manifest: Manifest, target: Target, resolved: Resolved) -> list[Finding]:
    """The resolved serving env (what the submission's run file gets), at the manifest key that set each value."""
    out: list[Finding] = []
    for v in resolved.env:
        d = diagnostic(v.key, str(v.value))
        if d is None:
            continue
        if v.source.startswith("profile:"):
            key: tuple[str | int, ...] = ("targets", target.name, "profiles", v.source.split(":", 1)[1], "env", v.key)
        else:
            key = ("targets", target.name, "serving", "env", v.key)
        loc = manifest.document.location(key)
        shown = v.source if v.source.startswith(("env:", "cli:")) else ".".join(str(k) for k in key)
        out.append(_finding(v.key, str(v.value), d, loc.file, loc.line, loc.column, shown))
    return out


def run_file_env(path: Path) -> list[tuple[str, str, int]]:
    """(name, value, line) of each ``env`` entry of a run file (``- {name: X, value: Y}`` or a mapping)."""
    try:
        node = yaml.compose(path.read_text(encoding="utf-8", errors="replace"), Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return []  # a run file that does not parse is init --from's (and the platform's) error, not this check's
    if not isinstance(node, yaml.MappingNode):
        return []
    env = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == "env"), None)
    out: list[tuple[str, str, int]] = []
    if isinstance(env, yaml.SequenceNode):
        for item in env.value:
            if not isinstance(item, yaml.MappingNode):
                continue
            fields = {k.value: v for k, v in item.value if isinstance(k, yaml.ScalarNode)}
            name, value = fields.get("name"), fields.get("value")
            if isinstance(name, yaml.ScalarNode):
                text = value.value if isinstance(value, yaml.ScalarNode) else ""
                out.append((str(name.value), str(text), item.start_mark.line + 1))
    elif isinstance(env, yaml.MappingNode):
        for k, v in env.value:
            if isinstance(k, yaml.ScalarNode) and isinstance(v, yaml.ScalarNode):
                out.append((str(k.value), str(v.value), k.start_mark.line + 1))
    return out


def run_file_findings(paths: Iterable[Path]) -> list[Finding]:
    """The diagnostic variables of each run file that exists among ``paths``."""
    out: list[Finding] = []
    for path in sorted(set(paths)):
        if not path.is_file():
            continue
        for name, value, line in run_file_env(path):
            d = diagnostic(name, value)
            if d is not None:
                out.append(_finding(name, value, d, str(path), line, None, f"{path.name}'s env"))
    return out

