"""One emitter per step kind (and per engine stage); importing this package registers them all."""

from ...errors import ConfigError
from ..emit import EMITTERS, Emitter
from . import overlay, patch, script, serving, symlink, verify

__all__ = ["emitter", "overlay", "patch", "script", "serving", "symlink", "verify"]


def emitter(kind: str) -> Emitter:
    """The registered emitter of a step kind or engine stage (every module above has registered by now)."""
    try:
        return EMITTERS[kind]
    except KeyError:
        raise ConfigError(f"step kind {kind!r} has no Dockerfile emitter",
                          hint="add one in src/imageforge/submission/kinds/") from None
