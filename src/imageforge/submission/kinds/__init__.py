"""One emitter per step kind (and per engine stage); importing this package registers them all."""

from . import overlay, patch, script, serving, symlink, verify

__all__ = ["overlay", "patch", "script", "serving", "symlink", "verify"]
