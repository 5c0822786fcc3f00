"""The Dockerfile emitter of a step kind (its class's ``emit``, :mod:`imageforge.steps`) or of an engine stage."""

from ...errors import ConfigError
from ...steps import KINDS, SERVING_CONFIG
from ...steps.dockerfile import EMITTERS, Emitter
from . import verify

__all__ = ["emitter", "verify"]


def emitter(kind: str) -> Emitter:
    """The emitter of a step kind, the serving config or the verify stage."""
    if kind in KINDS:
        return KINDS[kind].emit
    if kind == SERVING_CONFIG.name:
        return SERVING_CONFIG.emit
    try:
        return EMITTERS[kind]
    except KeyError:
        raise ConfigError(f"step kind {kind!r} has no Dockerfile emitter",
                          hint="give its class in src/imageforge/steps/ an emit") from None
