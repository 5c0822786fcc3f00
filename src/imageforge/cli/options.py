"""How a task of the `imageforge` command is declared: the one flag table, the options every task shares.

:func:`command` makes a task from a body ``body(c, out, ...own options)``: it adds the shared options (``--manifest``,
``--traceback``, ``--quiet``, ``--json``, ``--host-address``, ``--reuse-servers``, in-place mode's, the workload
options from :class:`imageforge.bench.Workload`) and runs the body with the command's Settings, stdout kept for
results. :class:`ForgeTask` gives every task the one flag table (:data:`SHORT_FLAGS`, :data:`LONG_ALIASES`).
The tasks themselves are in :mod:`imageforge.cli.commands`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from invoke.context import Context
from invoke.parser.context import ParserContext
from invoke.tasks import Task
from invoke.tasks import task as _invoke_task

from .. import app
from ..errors import ConfigError
from ..workload import Workload
from .output import command_io

if TYPE_CHECKING:
    pass


#: The one flag table: these options have these short flags in every task that has them; every other option is
#: long-only, and ``-h`` is always help.
SHORT_FLAGS: Mapping[str, str] = MappingProxyType({
    "target": "t", "profile": "p", "manifest": "m", "set_": "s", "json": "j", "verbose": "v", "quiet": "q"})
#: Other long names an option answers to (``vllm bench serve``'s, where they mean the same).
LONG_ALIASES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "requests": ("num-prompts",), "concurrency": ("max-concurrency",), "prompt_tokens": ("random-input-len",),
    "output_tokens": ("random-output-len",)})


class ForgeTask(Task[Any]):
    """invoke's Task with the one flag table: no automatic short flags, :data:`SHORT_FLAGS` and
    :data:`LONG_ALIASES` only."""

    def __init__(self, body: Callable[..., Any], **kwargs: Any) -> None:
        kwargs["auto_shortflags"] = False
        super().__init__(body, **kwargs)

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict[str, Any]:
        opts: dict[str, Any] = super().arg_opts(name, default, taken_names)
        names = [opts["names"][0], *LONG_ALIASES.get(name, ())]
        if name in SHORT_FLAGS:
            names.append(SHORT_FLAGS[name])
        opts["names"] = names
        return opts


_invoke_help_for = ParserContext.help_for


def _help_for(self: ParserContext, flag: str) -> tuple[str, str]:
    """invoke's option help line, with a value placeholder for float options too (``--duration=FLOAT``): invoke
    knows only STRING and INT. Set on invoke's ParserContext, so `invoke TASK --help` in the repository shows it."""
    namestr, helpstr = _invoke_help_for(self, flag)
    if self.flags[flag].kind is float:
        names = [f"{n}=FLOAT" if n.startswith("--") else f"{n} FLOAT" for n in self.names_for(flag)]
        namestr = ", ".join(sorted(names, key=len))
    return namestr, helpstr


ParserContext.help_for = _help_for  # type: ignore[method-assign]


def task(**kwargs: Any) -> Callable[[Callable[..., Any]], ForgeTask]:
    """``invoke.task(...)`` making :class:`ForgeTask` objects."""
    decorator: Callable[[Callable[..., Any]], ForgeTask] = _invoke_task(klass=ForgeTask, **kwargs)
    return decorator


SHARED_HELP = {
    "manifest": "Manifest file (default: $IMAGEFORGE_MANIFEST or ./build.yaml)",
    "traceback": "Show Python tracebacks (also IMAGEFORGE_TRACEBACK=1)",
    "json": "Print the result as one JSON document on stdout (logs and progress stay on stderr)",
    "quiet": "No progress or log lines on stderr (errors still go there)",
    "host_address": "Address of the Docker host where ports are published and reached "
                    "(default 127.0.0.1; also IMAGEFORGE_HOST_ADDRESS)",
    "reuse_servers": "Use a running imageforge server of the same image and run options instead of starting one, "
                     "and leave it running (its caches are warm: not for final figures; also "
                     "IMAGEFORGE_REUSE_SERVERS=1)",
    # in-place mode: the target's files under --root, served as a process (no Docker)
    "in_place": "On this machine, no Docker: the target's files under --root, served as a process",
    "root": "In place: the root the target's files live under (default /)",
    "python": "In place: the target's interpreter (default python3 on PATH)",
}


def _option(name: str, default: object) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)


def _workload_fields() -> dict[str, object]:
    """The workload options and their defaults, from the Workload dataclass (``model``: "" = discover it)."""
    return {f.name: ("" if f.default is None else f.default) for f in dataclasses.fields(Workload)}


def command(*, json: bool = False, manifest: bool = True, host: bool = False, workload: str = "",
            in_place: bool = False, help: Mapping[str, str] | None = None,
            **kwargs: Any) -> Callable[[Callable[..., None]], ForgeTask]:
    """A task of the `imageforge` command. The body is ``body(c, out, ...own options)``; this adds the shared
    options -- ``--manifest`` (unless ``manifest=False``), ``--traceback``, ``--quiet``, ``--json`` (``json=True``),
    ``--host-address`` and ``--reuse-servers`` (``host=True``) and, with ``workload="bench"|"sweep"|"ablate"``, the
    workload options (defaults from :class:`imageforge.bench.Workload`; the body gets ``workload=Workload(...)``) --
    and runs the body with the command's Settings in ``cmd.settings``, stdout kept for results (``cmd.result``),
    every other line on stderr, errors rendered with their exit code and a closed stdout ending quietly
    (:func:`output.command_io`).
    """
    def decorate(body: Callable[..., None]) -> ForgeTask:
        shared: dict[str, object] = {}
        if manifest:
            shared["manifest"] = ""
        if json:
            shared["json"] = False
        if host:
            shared["host_address"] = ""
            shared["reuse_servers"] = False
        if in_place:  # the body reads cmd.runtime (app.runtime made of --in-place, --root and --python)
            shared.update(in_place=False, root="", python="")
        shared["quiet"] = False
        shared["traceback"] = False
        load: dict[str, object] = {}
        if workload:
            load = _workload_fields()
            if workload == "sweep":
                load.update(requests=0, concurrency=0)  # 0: from the swept max-num-seqs
            if workload == "ablate":
                del load["repeat"]  # ablate's own --repeat: ABAB rounds
        own = list(inspect.signature(body).parameters.values())
        params = [own[0], *own[2:], *(_option(k, v) for k, v in load.items()),
                  *(_option(k, v) for k, v in shared.items())]

        @functools.wraps(body)
        def run(c: Context, **options: Any) -> None:
            given = {k: options.pop(k) for k in shared}
            w = {k: options.pop(k) for k in load}
            s = app.settings(manifest=str(given.get("manifest", "")), traceback=bool(given["traceback"]),
                             host_address=str(given.get("host_address", "")),
                             reuse_servers=bool(given.get("reuse_servers", False)))
            with command_io(s.traceback, as_json=bool(given.get("json", False)), quiet=bool(given["quiet"]),
                            settings=s) as out:
                if in_place:
                    if given["in_place"] and options.get("base"):
                        raise ConfigError("--in-place serves the files under --root: --base does not apply",
                                          hint="`invoke revert` puts the root back as installed; then --in-place")
                    out.runtime = app.runtime(s, process=bool(given["in_place"]), root=str(given["root"]),
                                              python=str(given["python"]))
                if workload:
                    options["workload"] = Workload(**{**w, "model": w["model"] or None})
                body(c, out, **options)

        run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        texts = dict(help or {})
        for name in [*load, *shared]:
            texts.setdefault(name, SHARED_HELP.get(name) or WORKLOAD_HELP[name])
        made: ForgeTask = task(help=texts, **kwargs)(run)
        return made

    return decorate


TARGET_HELP = "Target name (default: the manifest's default_target)"
PROFILE_HELP = "Profile name (default: the target's default_profile)"
SET_HELP = "Override a value: KEY=VALUE (serving flag, env.NAME, run.port); repeatable"
#: The options that pick what is resolved, shared by plan and build.
RESOLVE_HELP = {"target": TARGET_HELP, "profile": PROFILE_HELP, "set_": SET_HELP}


WORKLOAD_HELP = {
    "requests": "Requests to send (default 32; sweep: 4 x concurrency)",
    "concurrency": "Requests in flight at once (default 8; sweep: the largest max-num-seqs swept)",
    "prompt_tokens": "Prompt length in tokens (default 256)",
    "output_tokens": "Generated tokens per request: max_tokens with ignore_eos (default 64)",
    "shared_prefix": "Fraction of each prompt shared by all requests, for the prefix cache (default 0.5)",
    "seed": "Seed of the prompts (default 0; the same seed sends the same prompts)",
    "api": "completions (token-ID prompts, exact lengths) or chat (default completions)",
    "model": "Model name (default: the first of /v1/models)",
    "duration": "Stop the bench (all repeats) after this many seconds even if requests remain (default 300)",
    "timeout": "Seconds per request (default 120)",
    "warmup": "Unmeasured warm-up requests first (default 1)",
    "max_error_rate": "Fail (exit 4) above this fraction of failed requests (default 0)",
    "repeat": "Runs on the same server (seeds seed, seed+1 ...); the median by score is reported (default 1)",
    "request_rate": "Requests per second arriving as a Poisson process (seeded by --seed), still gated by "
                    "--concurrency (default 0: all at once, as vllm bench serve's inf)",
}
