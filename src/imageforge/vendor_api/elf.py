"""What a shared library says about itself, read from the ELF file (pyelftools; nothing is loaded or dlopen'ed)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import InfraError


@dataclass(frozen=True)
class ElfFacts:
    soname: str | None
    needed: tuple[str, ...]
    exports: tuple[str, ...]  # defined global/weak dynamic symbols
    undefined: tuple[str, ...]  # dynamic symbols the library needs from others


def read_elf(path: Path) -> ElfFacts:
    """Soname, DT_NEEDED, exported and undefined dynamic symbols of the ELF file at ``path``."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    try:
        with path.open("rb") as fh:
            elf = ELFFile(fh)
            soname: str | None = None
            needed: list[str] = []
            exports: set[str] = set()
            undefined: set[str] = set()
            for section in elf.iter_sections():
                if isinstance(section, DynamicSection):
                    for tag in section.iter_tags():
                        if tag.entry.d_tag == "DT_SONAME":
                            soname = str(tag.soname)  # type: ignore[attr-defined]
                        elif tag.entry.d_tag == "DT_NEEDED":
                            needed.append(str(tag.needed))  # type: ignore[attr-defined]
            dynsym = elf.get_section_by_name(".dynsym")
            if dynsym is not None:
                for sym in dynsym.iter_symbols():  # type: ignore[attr-defined]
                    if not sym.name or sym["st_info"]["bind"] not in ("STB_GLOBAL", "STB_WEAK"):
                        continue
                    (undefined if sym["st_shndx"] == "SHN_UNDEF" else exports).add(str(sym.name))
    except (OSError, ELFError) as exc:
        raise InfraError(f"{path}: not a readable ELF file ({exc})") from exc
    return ElfFacts(soname, tuple(needed), tuple(sorted(exports)), tuple(sorted(undefined)))
