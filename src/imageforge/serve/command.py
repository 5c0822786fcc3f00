"""The serving command: where a target's serving config becomes argv and the rendered config file.

The one home of how serving flags are spelled and of every command made of them. Plan renders the config
file (its bytes are in the plan and its key), the serving-config step sets the image's CMD, ``run --base``
gives the base image its command, the submission writes ``computility-run.yaml`` (and diffs it in
``--check``), in-place mode runs the same command as a process: all of them take it from here.

* :func:`flag_argv`: serving arguments as command-line words (the one place a value becomes argv);
  :func:`flag_pairs` reads such words back (flag -> value) for a diff;
* :func:`serving_argv`: ``command`` + every flag, with the target's ``flag_names`` and ``negatable``
  (style ``argv``); :func:`cli_args`: ``MODEL --flag value`` (``vllm serve`` on a base image);
* :func:`config_file_args`, :func:`render_serving_config`: the file at ``serving.config_path``;
* :func:`serving_command`: the command a server runs, before it meets an ENTRYPOINT (style ``config``:
  ``command --config FILE``); :func:`fit_command` / :func:`fit_argv`: fitted to an image's ENTRYPOINT;
  :func:`image_command`: the CMD of a built image; :func:`base_command`: the command of the bare base image.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import yaml

from ..manifest.resolve import Resolved

# --------------------------------------------------------------------------- flags as argv


def flag_argv(args: Mapping[str, Any], *, flag_names: Mapping[str, str] | None = None,
              negatable: Callable[[str], bool] = lambda _key: True) -> list[str]:
    """Serving arguments as command-line words: the one place a value becomes argv.

    ``True`` -> the bare flag; ``False`` -> ``--no-FLAG`` when ``negatable(key)``, else left out; lists -> the
    flag then each item; mappings -> compact JSON; anything else -> ``str(value)``; ``None`` -> left out (as
    in the config file).  ``flag_names`` respells a flag (default ``--key``).
    """
    out: list[str] = []
    for key, value in args.items():
        flag = (flag_names or {}).get(key, f"--{key}")
        if value is None:
            continue
        if isinstance(value, bool):
            if value:
                out.append(flag)
            elif negatable(key):
                out.append(f"--no-{key}")
        elif isinstance(value, list | tuple):
            out.append(flag)
            out.extend(_argv_scalar(v) for v in value)
        else:
            out.extend([flag, _argv_scalar(value)])
    return out


def _argv_scalar(value: Any) -> str:
    if isinstance(value, Mapping):
        return json.dumps(dict(value), separators=(",", ":"))
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def flag_pairs(argv: Sequence[str]) -> list[tuple[str, str | None]]:
    """Each flag of ``argv`` with the word after it when that is not a flag too (``None``: a bare flag)."""
    out: list[tuple[str, str | None]] = []
    for i, item in enumerate(argv):
        if item.startswith("-"):
            value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("-") else None
            out.append((item, value))
    return out


def serving_argv(resolved: Resolved) -> list[str]:
    """``command`` + every serving flag, each flag and each value its own string (style ``argv``).

    ``False`` -> ``--no-FLAG`` when the flag is in ``serving.negatable``, else left out (0.6.3's
    ``store_true`` flags have no negative form); ``serving.flag_names`` respells a flag
    (``tensor-parallel-size: -tp``); the rest as :func:`flag_argv`.
    """
    serving = resolved.target.serving
    return [*serving.command, *flag_argv(resolved.serving_args(), flag_names=serving.flag_names,
                                         negatable=lambda key: key in serving.negatable)]


def cli_args(args: Mapping[str, Any]) -> list[str]:
    """Serving arguments as ``vllm serve`` flags: ``model`` positional first, then :func:`flag_argv`
    (``False`` -> ``--no-key``)."""
    model = args.get("model")
    rest = {k: v for k, v in args.items() if k != "model"}
    return [*([str(model)] if model is not None else []), *flag_argv(rest)]


# --------------------------------------------------------------------------- the config file


def render_serving_config(resolved: Resolved) -> bytes:
    """The rendered file at ``serving.config_path``.

    Style ``config``: what ``vllm serve --config FILE`` reads (long flag names without dashes).
    Style ``argv``: the image's CMD as ``command`` and the serving ``env`` as ``{name, value}`` items,
    the shape of ``computility-run.yaml``.
    """
    if resolved.target.serving.style == "argv":
        header = (
            f"# Rendered by imageforge: target {resolved.target.name}, profile {resolved.profile_name}.\n"
            "# The image's CMD (each flag and value its own item) and serving env; edit build.yaml, not this file.\n"
        )
        doc = {"command": serving_argv(resolved),
               "env": [{"name": k, "value": v} for k, v in resolved.serving_env().items()]}
        return (header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)).encode()
    header = (
        f"# Rendered by imageforge: target {resolved.target.name}, profile {resolved.profile_name}.\n"
        "# Keys are `vllm serve` flag names; edit build.yaml, not this file.\n"
        "# A false boolean is written `no-FLAG: true`: vLLM's config loader drops `FLAG: false` (the default stays).\n"
    )
    body = yaml.safe_dump(config_file_args(resolved.serving_args()), sort_keys=False, default_flow_style=False)
    return (header + body).encode()


def config_file_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """The serving flags as ``vllm serve --config FILE`` must read them: ``FLAG: false`` becomes ``no-FLAG: true``.

    vLLM's ``load_config_file`` turns ``FLAG: false`` into ``--no-FLAG`` only when that option is found on the
    parser it runs on, which for ``vllm serve`` (0.32) is the top-level parser without the serve flags: the key is
    dropped and the default (``enable-prefix-caching``: on) silently stays.  ``no-FLAG: true`` is passed as the
    bare ``--no-FLAG`` whatever parser reads it.  Validation has already refused ``false`` for a flag without a
    ``--no-`` form (``flags.check_serving_args``).
    """
    return {(f"no-{key}" if value is False else key): (True if value is False else value)
            for key, value in args.items()}


# --------------------------------------------------------------------------- the command, fitted to an image


def serving_command(resolved: Resolved, config_path: str | None = None) -> list[str]:
    """The command a server of ``resolved`` runs, before it meets an ENTRYPOINT.

    Style ``argv``: :func:`serving_argv`; style ``config``: ``command --config FILE`` (``config_path``, default
    ``serving.config_path``: where the image has the rendered file).
    """
    serving = resolved.target.serving
    if serving.style == "argv":
        return serving_argv(resolved)
    return [*serving.command, "--config", serving.config_path if config_path is None else config_path]


def fit_command(entrypoint: Sequence[str] | None, command: Sequence[str], config_path: str | None = None) -> list[str]:
    """The CMD that runs ``command`` (``command --config FILE`` with ``config_path``) under an ENTRYPOINT.

    The one fitter: a build's final CMD and ``run --base``'s command both come from here.

    * no ENTRYPOINT: the full argv;
    * ENTRYPOINT already is the program (``["vllm"]``): only the arguments;
    * a shell ENTRYPOINT ending in ``-c``: one command string;
    * any other ENTRYPOINT (a wrapper that execs "$@"): the full argv.
    """
    argv = [*command, "--config", config_path] if config_path is not None else list(command)
    return fit_argv(entrypoint, argv)


def fit_argv(entrypoint: Sequence[str] | None, argv: Sequence[str]) -> list[str]:
    """CMD that runs ``argv`` under the base image's ENTRYPOINT (the rules of :func:`fit_command`)."""
    full = list(argv)
    ep = list(entrypoint or [])
    if not ep:
        return full
    if ep[-1] == "-c" and ep[0].rsplit("/", 1)[-1] in ("sh", "bash", "dash"):
        return [shlex.join(full)]
    if ep[-1].rsplit("/", 1)[-1] == full[0].rsplit("/", 1)[-1]:
        return full[1:]
    return full


def image_command(resolved: Resolved, entrypoint: Sequence[str]) -> list[str]:
    """The CMD imageforge's config layer sets (:func:`serving_command` fitted to the base's ENTRYPOINT)."""
    return fit_argv(list(entrypoint) or None, serving_command(resolved))


def base_command(resolved: Resolved, entrypoint: Sequence[str] | None) -> list[str]:
    """``vllm serve MODEL --flag value ...`` for a base image (fitted to its ENTRYPOINT, as a build's CMD is).

    Serving style ``argv``: the image's own CMD list (``command`` + every flag, see :func:`serving_argv`).
    """
    if resolved.target.serving.style == "argv":
        return fit_command(entrypoint, serving_argv(resolved))
    return fit_command(entrypoint, [*resolved.target.serving.command, *cli_args(resolved.serving_args())])
