"""The cpu base's recipe (``images/cpu/base.yaml``), its content keys and the host cache it uses.

The recipe is read once (:func:`load_recipe`: base.yaml checked, the lock parsed) into a frozen
:class:`Recipe` that the rest of :mod:`imageforge.base` is handed; :func:`recipe_refs` computes its
content keys and image references once.  The public entry points (``ensure_cpu_base``,
``base_image_status``, ``ensure_model``, ...) take a :class:`Recipe` or a recipe directory
(:data:`RecipeSource`, read with :func:`as_recipe`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from imageforge.errors import ConfigError
from imageforge.plan import canonical, sha256_bytes, sha256_file
from imageforge.settings import cache_dir

from .requirements import LockEntry, lock_digest, parse_lock

#: Bump when the way images are made changes (commands, config) without the recipe changing.
BUILDER_VERSION = "1"
# Bumped when build_vllm_image makes a different image from the same inputs (2: no VOLUME entries).
VLLM_BUILDER_VERSION = "2"
RECIPE_FILE = "base.yaml"
#: libyaml's safe loader where PyYAML has it (every build reads the recipe: ~4x the Python parser).
_SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
KEY_LEN = 16


def wheelhouse_dir() -> Path:
    return cache_dir() / "wheelhouse"


# --------------------------------------------------------------------------------------------
# the recipe and its content keys
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recipe:
    """``base.yaml``'s three sections, the directory they are relative to, and the parsed lock."""

    dir: Path
    os: Mapping[str, Any]
    vllm: Mapping[str, Any]
    model: Mapping[str, Any]
    lock: tuple[LockEntry, ...] = ()

    @property
    def lock_path(self) -> Path:
        return self.dir / str(self.vllm.get("lock", "requirements.lock"))

    @property
    def install_script(self) -> Path:
        return self.dir / str(self.vllm.get("install_script", "install.sh"))

    @property
    def model_script(self) -> Path:
        return self.dir / str(self.model.get("script", "make_model.py"))


_REQUIRED = {
    "os": ("repository", "suite", "variant", "packages"),
    "vllm": ("repository", "lock", "install_script", "venv", "alias_dist", "env", "cmd"),
    "model": ("script", "name"),
}


def load_recipe(recipe_dir: Path) -> Recipe:
    """Read and check ``recipe_dir/base.yaml``; ConfigError (exit 2) when it is unusable."""
    recipe_dir = Path(recipe_dir).resolve()
    path = recipe_dir / RECIPE_FILE
    try:
        data = yaml.load(path.read_text(), Loader=_SAFE_LOADER)
    except FileNotFoundError:
        raise ConfigError(f"no base image recipe at {path}", hint="the cpu target's recipe is images/cpu/") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with os, vllm and model sections")
    for section, keys in _REQUIRED.items():
        sec = data.get(section)
        if not isinstance(sec, dict):
            raise ConfigError(f"{path}: missing section {section!r}", key_path=section)
        for k in keys:
            if k not in sec:
                raise ConfigError(f"{path}: missing key", key_path=f"{section}.{k}")
    recipe = Recipe(recipe_dir, data["os"], data["vllm"], data["model"])
    for p in (recipe.lock_path, recipe.install_script):
        if not p.is_file():
            raise ConfigError(f"{path}: {p.name} is missing from {recipe_dir}")
    entries = parse_lock(recipe.lock_path.read_text(), source=str(recipe.lock_path))
    return dataclasses.replace(recipe, lock=tuple(entries))


#: What the public functions of :mod:`imageforge.base` accept: a loaded recipe, or its directory.
RecipeSource = Recipe | Path


def as_recipe(source: RecipeSource) -> Recipe:
    """``source`` itself when it is loaded already, else :func:`load_recipe` of the directory."""
    return source if isinstance(source, Recipe) else load_recipe(source)


def os_key(recipe: Recipe) -> str:
    """Content key of the OS image: the ``os`` section and the builder version."""
    return sha256_bytes(canonical({"builder": BUILDER_VERSION, "os": recipe.os}).encode())


def vllm_key(recipe: Recipe, entries: Sequence[LockEntry], os_image_key: str | None = None) -> str:
    """Content key of the vLLM image: OS key + ``vllm`` section + lock entries + install script."""
    payload = {
        "builder": BUILDER_VERSION,
        "vllm_builder": VLLM_BUILDER_VERSION,
        "os": os_image_key or os_key(recipe),
        "vllm": recipe.vllm,
        "lock": lock_digest(entries),
        "install": sha256_file(recipe.install_script),
    }
    return sha256_bytes(canonical(payload).encode())


def image_ref(repository: str, key: str) -> str:
    return f"{repository}:{key[:KEY_LEN]}"


@dataclass(frozen=True)
class RecipeRefs:
    """The recipe's content keys and the image references they give (the OS image, the vLLM base)."""

    os_key: str
    vllm_key: str
    os_ref: str
    ref: str
    lock_digest: str


def recipe_refs(recipe: Recipe) -> RecipeRefs:
    """Keys and references of ``recipe``'s images (no daemon asked)."""
    okey = os_key(recipe)
    vkey = vllm_key(recipe, recipe.lock, okey)
    return RecipeRefs(os_key=okey, vllm_key=vkey, os_ref=image_ref(str(recipe.os["repository"]), okey),
                      ref=image_ref(str(recipe.vllm["repository"]), vkey), lock_digest=lock_digest(recipe.lock))
