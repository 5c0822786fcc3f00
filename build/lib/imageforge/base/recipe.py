"""The cpu base's recipe (``images/cpu/base.yaml``), its content keys and the host cache it uses."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from imageforge.errors import ConfigError
from imageforge.plan import canonical, sha256_bytes, sha256_file
from imageforge.settings import cache_dir

from .requirements import LockEntry, lock_digest

#: Bump when the way images are made changes (commands, config) without the recipe changing.
BUILDER_VERSION = "1"
# Bumped when build_vllm_image makes a different image from the same inputs (2: no VOLUME entries).
VLLM_BUILDER_VERSION = "2"
RECIPE_FILE = "base.yaml"
KEY_LEN = 16


def wheelhouse_dir() -> Path:
    return cache_dir() / "wheelhouse"


# --------------------------------------------------------------------------------------------
# the recipe and its content keys
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recipe:
    dir: Path
    os: Mapping[str, Any]
    vllm: Mapping[str, Any]
    model: Mapping[str, Any]

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
        data = yaml.safe_load(path.read_text())
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
    return recipe


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
