"""One definition per step kind: ``steps/<kind>.py`` holds its typed spec, schema fragment, inputs, ``apply``,
facts and ``emit``.

Build, check-patches, verify and the submission tree dispatch through :func:`kind` (kind -> class); every module
of this package is imported here, so a kind's module registers itself: adding a kind is that one module (the
schema's kind parts are made from the registry: :mod:`.schema`). See :mod:`.core`.
"""

import importlib
import pkgutil

from .core import (
    KINDS,
    ApplyContext,
    Changes,
    Facts,
    FileChange,
    LinkChange,
    StepKind,
    StepProblem,
    StepResult,
    kind,
    one_file,
)
from .fs import ContainerFS, DictFS, Entry, FileMeta, ImageFS
from .overlay import OverlaySpec
from .patch import PatchSpec
from .script import ScriptSpec
from .serving import SERVING_CONFIG, ServingConfig
from .symlink import SymlinkSpec

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")  # a kind's module registers its class

__all__ = ["KINDS", "SERVING_CONFIG", "ApplyContext", "Changes", "ContainerFS", "DictFS", "Entry", "Facts",
           "FileChange", "FileMeta", "ImageFS", "LinkChange", "OverlaySpec", "PatchSpec", "ScriptSpec",
           "ServingConfig", "StepKind", "StepProblem", "StepResult", "SymlinkSpec", "kind", "one_file"]
