"""The programs imageforge runs inside an image, as real modules shipped as text.

Each runs standalone with the image's own ``python`` (standard library only, Python 3.10 syntax) and is linted
and type-checked like the rest of the package; :func:`program` reads one back as text (``importlib.resources``:
the wheel ships them as the package's modules), to be sent with ``python -c`` or written into the submission tree:

* :mod:`.verify_image` -- the verify layer's checks (:mod:`imageforge.verify`; the tree's ``verify.py``);
* :mod:`.list_flags` -- the vLLM serving flags the image's parser knows (:mod:`imageforge.flags.learn`);
* :mod:`.apply_step` -- the submission tree's runtime that applies one step op (the tail of ``apply.py``).
* :mod:`.probe_api` -- the vendor API record's names, kinds and signatures (:mod:`imageforge.vendor_api.probe`).
* :mod:`.import_native` -- `native build`'s import of each built extension, listing its functions.
* :mod:`.compile_files` -- preflight's compile of every checked ``.py`` with the base's own interpreter.
"""

from __future__ import annotations

from importlib.resources import files

#: The programs, by module name.
PROGRAMS = ("verify_image", "list_flags", "apply_step", "probe_api", "import_native", "compile_files")


def program(name: str) -> str:
    """The source text of the in-image program ``name`` (one of :data:`PROGRAMS`)."""
    if name not in PROGRAMS:
        raise ValueError(f"no in-image program {name!r} (known: {', '.join(PROGRAMS)})")
    return files(__name__).joinpath(f"{name}.py").read_text(encoding="utf-8")
