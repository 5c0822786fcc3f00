"""The cpu target's tiny model: ``make_model.py`` writes a Qwen3-MoE-style directory (seeded safetensors weights)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from imageforge.errors import ConfigError
from imageforge.settings import cache_dir

from .recipe import Recipe, RecipeSource, as_recipe

Log = Callable[[str], None]


# --------------------------------------------------------------------------------------------
# tiny model
# --------------------------------------------------------------------------------------------

_MODEL_STAMP = ".imageforge-model"


def _load_make_model(script: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"imageforge_make_model_{script.stat().st_ino}", script)
    if spec is None or spec.loader is None:  # pragma: no cover
        raise ConfigError(f"cannot load {script}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def model_digest(recipe: RecipeSource) -> str:
    """Digest of what decides the model's bytes: the script (tokenizer corpus, config, weight seed, generator
    and init scale) and the versions of the libraries that write them (`tokenizers`: tokenizer.json; numpy's
    Philox stream and `safetensors`: model.safetensors)."""
    h = hashlib.sha256(as_recipe(recipe).model_script.read_bytes())
    for lib in ("tokenizers", "numpy", "safetensors"):
        try:
            version = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            version = "missing"
        h.update(f"\0{lib}={version}".encode())
    return h.hexdigest()


def default_model_dir(recipe: RecipeSource) -> Path:
    """Where the tiny model goes in the cache: named by the recipe's model name and :func:`model_digest`."""
    loaded = as_recipe(recipe)
    return _model_dir(loaded, model_digest(loaded))


def _model_dir(recipe: Recipe, digest: str) -> Path:
    return cache_dir() / "models" / f"{recipe.model['name']}-{digest[:12]}"


def ensure_model(recipe: RecipeSource, dest: Path | None = None, *, log: Log = print) -> Path:
    """Write the tiny model into ``dest`` (default: the cache, named by the script's digest) unless
    it is already there for this script version; return the directory."""
    loaded = as_recipe(recipe)
    digest = model_digest(loaded)
    dest = Path(dest) if dest is not None else _model_dir(loaded, digest)
    stamp = dest / _MODEL_STAMP
    if stamp.is_file() and stamp.read_text().strip() == digest:
        log(f"reuse tiny model {dest}")
        return dest
    t0 = time.monotonic()
    dest.parent.mkdir(parents=True, exist_ok=True)
    module = _load_make_model(loaded.model_script)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        module.write_model(tmp)
        (tmp / _MODEL_STAMP).write_text(digest + "\n")
        for p in [tmp, *tmp.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    log(f"made tiny model {dest} in {time.monotonic() - t0:.1f}s")
    return dest
