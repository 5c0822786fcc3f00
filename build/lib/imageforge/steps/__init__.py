"""One definition per step kind: ``steps/<kind>.py`` holds its fields, inputs, ``apply``, facts and ``emit``.

Build, check-patches, verify and the submission tree dispatch through :func:`kind` (kind -> class);
adding a kind is one module here (imported below) plus its schema entry. See :mod:`.core`.
"""

from . import overlay, patch, script, symlink
from .core import KINDS, ApplyContext, Changes, Facts, FileChange, LinkChange, StepKind, StepProblem, kind
from .fs import ContainerFS, DictFS, Entry, FileMeta, ImageFS
from .serving import SERVING_CONFIG, ServingConfig

__all__ = ["KINDS", "SERVING_CONFIG", "ApplyContext", "Changes", "ContainerFS", "DictFS", "Entry", "Facts",
           "FileChange", "FileMeta", "ImageFS", "LinkChange", "ServingConfig", "StepKind", "StepProblem", "kind",
           "overlay", "patch", "script", "symlink"]
