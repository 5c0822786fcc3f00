"""What a serving container is: the docker SDK's ``containers.create`` arguments for a resolved target.

:func:`container_spec` is pure (unit-tested without a daemon) apart from checking that volume
sources exist.  The image is the built ``<image>:<profile>`` (its CMD already serves the rendered
config), or with ``base=True`` the base image with the serving arguments as
``vllm serve MODEL --flag value`` (:func:`imageforge.serve.command.base_command`: fitted to its ENTRYPOINT
exactly as a build fits its CMD).  The container port is published on ``host_address`` only.
:func:`run_spec_digest` names what makes two such containers interchangeable (``--reuse-servers``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import settings
from ..errors import InfraError
from ..labels import L_KIND, L_PROFILE, L_RUN, L_TARGET, L_TOOL, TOOL
from ..manifest.resolve import Resolved
from .command import base_command

KIND_SERVER = "server"
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_vars(text: str, environ: Mapping[str, str], *, what: str) -> str:
    """Replace ``${VAR}`` from ``environ``; InfraError naming the variable when it is unset."""

    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        value = environ.get(name, "")
        if not value:
            raise InfraError(
                f"{what} uses ${{{name}}}, which is not set",
                found=text,
                hint=f"export {name}=<path> before running",
            )
        return value

    return _ENV_REF.sub(sub, text)


def volume_binds(resolved: Resolved, environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """``{host_path or volume name: {"bind": target, "mode": ro|rw}}``; relative sources are under the manifest
    root; a named volume (``type: volume``) is the daemon's to make and keep."""
    binds: dict[str, dict[str, str]] = {}
    for i, volume in enumerate(resolved.run.volumes):
        mode = "ro" if volume.read_only else "rw"
        if volume.named:
            binds[volume.source] = {"bind": volume.target, "mode": mode}
            continue
        where = f"targets.{resolved.target.name}.run.volumes[{i}].source"
        source = Path(expand_vars(volume.source, environ, what=where))
        if not source.is_absolute():
            source = resolved.manifest.root / source
        if not source.exists():
            hint = "export the variable with an existing path" if "${" in volume.source else (
                f"run `invoke base --target {resolved.target.name}` (it writes the model directory)"
                if resolved.target.base.recipe is not None else "create it, or fix the manifest"
            )
            raise InfraError(
                f"volume source {source} does not exist",
                key_path=where,
                expected=f"a file or directory to mount at {volume.target}",
                found="nothing there",
                hint=hint,
            )
        binds[str(source.resolve())] = {"bind": volume.target, "mode": mode}
    return binds


def device_requests(gpus: str | int | None) -> list[Any]:
    """``docker run --gpus`` as DeviceRequests: ``all``, a count, or ``device=0,1`` / ``0,1``."""
    if gpus is None or gpus == "":
        return []
    from docker.types import DeviceRequest

    caps = [["gpu"]]
    if isinstance(gpus, int) and not isinstance(gpus, bool):
        return [DeviceRequest(count=gpus, capabilities=caps)]
    text = str(gpus).strip()
    if text == "all":
        return [DeviceRequest(count=-1, capabilities=caps)]
    if text.isdigit():
        return [DeviceRequest(count=int(text), capabilities=caps)]
    ids = text.split("=", 1)[1] if text.startswith("device=") else text
    return [DeviceRequest(device_ids=[d.strip() for d in ids.split(",") if d.strip()], capabilities=caps)]


def ulimits(resolved: Resolved) -> list[Any]:
    from docker.types import Ulimit

    return [Ulimit(name=name, soft=int(soft), hard=int(hard)) for name, (soft, hard) in resolved.run.ulimits.items()]


def container_port(resolved: Resolved) -> int:
    """The port vLLM listens on inside the container (serving ``port``, else ``run.port``)."""
    port = resolved.serving_args().get("port")
    if isinstance(port, int) and not isinstance(port, bool):
        return port
    return resolved.run.port


def server_labels(resolved: Resolved, run_id: str, *, base: bool) -> dict[str, str]:
    return {
        L_TOOL: TOOL,
        L_KIND: KIND_SERVER,
        L_RUN: run_id,
        L_TARGET: resolved.target.name,
        L_PROFILE: "base" if base else resolved.profile_name,
    }


def container_spec(
    resolved: Resolved,
    image: str,
    *,
    host_port: int | None,
    run_id: str,
    environ: Mapping[str, str],
    base: bool = False,
    entrypoint: Sequence[str] | None = None,
    host_address: str = settings.DEFAULT_HOST_ADDRESS,
) -> dict[str, Any]:
    """Keyword arguments for ``client.containers.create`` (pure apart from the volume checks)."""
    run = resolved.run
    env: dict[str, str] = {}
    if base:
        env.update(resolved.serving_env())  # a built image carries them in its config already
    env.update({k: str(v) for k, v in run.env.items()})
    cport = container_port(resolved)
    kwargs: dict[str, Any] = {
        "image": image,
        "name": f"imageforge-{resolved.target.name}-{run_id}",
        "labels": server_labels(resolved, run_id, base=base),
        "environment": env,
        # host_port None: the daemon picks a free port on host_address (read back after start).
        "ports": {f"{cport}/tcp": (host_address, host_port)},
        "volumes": volume_binds(resolved, environ),
        "privileged": bool(run.privileged),
        "detach": True,
    }
    if base:
        kwargs["command"] = base_command(resolved, entrypoint)
    if run.shm_size:
        kwargs["shm_size"] = run.shm_size
    if run.ipc:
        kwargs["ipc_mode"] = run.ipc
    if run.devices:
        kwargs["devices"] = list(run.devices)
    requests = device_requests(run.gpus)
    if requests:
        kwargs["device_requests"] = requests
    limits = ulimits(resolved)
    if limits:
        kwargs["ulimits"] = limits
    return kwargs


#: container_spec's keys that name or address one container, not what it serves
_PER_CONTAINER = ("image", "name", "labels", "ports", "detach")


def run_spec_digest(image_id: str, spec: Mapping[str, Any]) -> str:
    """The digest of what a server serves and how: the image ID and :func:`container_spec`'s run options (command,
    environment, volumes, devices, limits, the container ports and the address they are published on), not its
    name, labels or host port. Two servers with one digest answer alike: ``--reuse-servers`` uses one for the
    other (labelled :data:`imageforge.labels.L_RUN_SPEC` on every server)."""
    ports = {str(cport): list(binding)[:1] for cport, binding in (spec.get("ports") or {}).items()}
    options = {key: value for key, value in spec.items() if key not in _PER_CONTAINER}
    text = json.dumps({"image": image_id, "ports": ports, **options}, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:32]
