"""What a shared library says about itself, read from the ELF file (nothing is loaded or dlopen'ed): the probe's
view of :func:`imageforge.vendor_api.elfcheck.summarise`, the one ELF symbol reader (pyelftools)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import InfraError
from .elfcheck import NotElf, summarise


@dataclass(frozen=True)
class ElfFacts:
    soname: str | None
    needed: tuple[str, ...]
    exports: tuple[str, ...]  # defined, visible global/weak/unique dynamic symbols
    undefined: tuple[str, ...]  # dynamic symbols the library needs from others


def read_elf(path: Path) -> ElfFacts:
    """Soname, DT_NEEDED, exported and undefined dynamic symbols of the ELF file at ``path``."""
    try:
        summary = summarise(path.read_bytes())
    except (OSError, NotElf) as exc:
        raise InfraError(f"{path}: not a readable ELF file ({exc})") from exc
    return ElfFacts(summary.soname, summary.needed, tuple(sorted(summary.exports)),
                    tuple(sorted({u.name for u in summary.undefined})))
