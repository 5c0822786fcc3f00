"""The vendor's API, recorded once on the card and checked offline.

* :mod:`.record` -- the fixed JSON format (``{"format": 1, "python", "versions", "modules", "libraries",
  "distributions"}``): :func:`load_record` reads and checks a file, :class:`VendorApi` answers "does module M have
  name N" (present / absent / unknown);
* :mod:`.calls` -- :func:`check_call`: do a call's arguments fit a recorded signature (the one arity check);
* :mod:`.elf` -- soname, needed libraries and exported dynamic symbols of a shared library (pyelftools, read in
  imageforge's own process: nothing is loaded);
* :mod:`.probe` -- ``imageforge probe``: runs :mod:`imageforge.inimage.probe_api` with the target interpreter and
  adds the ELF facts of the libraries it names.
"""

from __future__ import annotations

from .calls import check_call, parse_signature
from .record import FORMAT, Lookup, VendorApi, load_record, record_from_json

__all__ = ["FORMAT", "Lookup", "VendorApi", "check_call", "load_record", "parse_signature", "record_from_json"]
