"""The native checks without the device (imageforge.vendor_api.elfcheck), each defect planted in a real ELF file.

The fixtures are compiled here with the host's C compiler (``-nostdlib``: each object needs exactly the libraries
the test gives it) and put into an in-memory image (DictFS) as a base image would hold them: a versioned
``libstdc++.so.6`` stand-in in /usr/lib/x86_64-linux-gnu, an interpreter at /usr/bin/python3.11 exporting
``PyLong_FromLong``, a library loaded before the extension in the package (torch's place).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from imageforge.steps import DictFS
from imageforge.vendor_api import elfcheck
from imageforge.vendor_api.elfcheck import Resolver, check_extension, parse_ld_so_cache, summarise

CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler on this host")

SITE = "/opt/venv/lib/python3.11/site-packages"
EXT = f"{SITE}/pkg/good.cpython-311-x86_64-linux-gnu.so"
LIBDIR = "/usr/lib/x86_64-linux-gnu"


def cc(tmp: Path, name: str, source: str, *args: str, version_script: str | None = None) -> bytes:
    src = tmp / f"{name}.c"
    src.write_text(source)
    out = tmp / name
    cmd = [str(CC), "-shared", "-fPIC", "-nostdlib", "-o", str(out), str(src), *args]
    if version_script is not None:
        vs = tmp / f"{name}.map"
        vs.write_text(version_script)
        cmd.append(f"-Wl,--version-script={vs}")
    subprocess.run(cmd, check=True, capture_output=True)
    return out.read_bytes()


#: the extension: PyInit_good, a call into the interpreter, into libstdc++ (a versioned symbol), into a library
#: loaded before it, a weak reference nothing defines
EXT_C = """
extern long PyLong_FromLong(long);
extern int cxx_fn(void);
extern int before_fn(void);
extern int maybe_fn(void) __attribute__((weak));
int PyInit_good(void) { return (int)PyLong_FromLong(1) + cxx_fn() + before_fn() + (maybe_fn ? maybe_fn() : 0); }
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    return compile_objects(tmp_path_factory.mktemp("elf"))


def compile_objects(tmp: Path) -> dict[str, bytes]:
    """The libraries, the interpreter and the extensions (good and each defect), by name."""
    out: dict[str, bytes] = {}
    # libstdc++ as the image has it (up to GLIBCXX_3.4.30) and as a newer build machine had it (3.4.32)
    old_map = "GLIBCXX_3.4.29 { global: cxx_fn; local: *; };\nGLIBCXX_3.4.30 { global: cxx_new; } GLIBCXX_3.4.29;\n"
    new_map = old_map + "GLIBCXX_3.4.32 { global: cxx_newer; } GLIBCXX_3.4.30;\n"
    body = "int cxx_fn(void) { return 1; }\nint cxx_new(void) { return 2; }\nint cxx_newer(void) { return 3; }\n"
    out["stdcxx-old"] = cc(tmp, "libstdc++.so.6", body, "-Wl,-soname,libstdc++.so.6", version_script=old_map)
    out["python"] = cc(tmp, "python3.11", "long PyLong_FromLong(long v) { return v; }\n")
    out["before"] = cc(tmp, "libbefore.so", "int before_fn(void) { return 4; }\n", "-Wl,-soname,libbefore.so")
    stdcxx_dir = tmp / "link"
    stdcxx_dir.mkdir()
    (stdcxx_dir / "libstdc++.so.6").write_bytes(out["stdcxx-old"])
    (stdcxx_dir / "libstdc++.so").symlink_to("libstdc++.so.6")
    (stdcxx_dir / "libbefore.so").write_bytes(out["before"])
    link = [f"-L{stdcxx_dir}", "-lstdc++", "-lbefore"]
    out["good"] = cc(tmp, "good.so", EXT_C, *link)
    out["no-pyinit"] = cc(tmp, "bad.so", EXT_C.replace("PyInit_good", "PyInit_other"), *link)
    out["undefined"] = cc(tmp, "undef.so", EXT_C.replace(
        "int PyInit_good(void) {", "extern void _ZN8ixformer5inferEv(void);\nint PyInit_good(void) {"
        " _ZN8ixformer5inferEv();"), *link)
    # built against the newer libstdc++: needs GLIBCXX_3.4.32, which the image's does not define
    out["newer-stdcxx"] = cc(tmp, "newstdcxx.so", body, "-Wl,-soname,libstdc++.so.6", version_script=new_map)
    (stdcxx_dir / "libstdc++.so.6").write_bytes(out["newer-stdcxx"])
    out["too-new"] = cc(tmp, "new.so", EXT_C.replace("cxx_fn()", "cxx_newer()").replace(
        "extern int cxx_fn(void);", "extern int cxx_newer(void);"), *link)
    # an ORIGIN-relative library beside the extension, found by RUNPATH
    (stdcxx_dir / "libside.so").write_bytes(cc(tmp, "libside.so", "int side_fn(void) { return 5; }\n",
                                               "-Wl,-soname,libside.so"))
    out["side"] = (stdcxx_dir / "libside.so").read_bytes()
    out["origin"] = cc(tmp, "origin.so", EXT_C.replace("int PyInit_good(void) {", "extern int side_fn(void);\n"
                                                       "int PyInit_good(void) { side_fn();"),
                       *link, "-lside", "-Wl,--enable-new-dtags,-rpath,$ORIGIN/libs")
    return out


def image(built: dict[str, bytes], **extra: bytes) -> DictFS:
    """The base image's files: the interpreter behind a link, libstdc++ behind /lib (merged /usr), torch's place."""
    fs = DictFS(files={"/usr/bin/python3.11": built["python"], f"{LIBDIR}/libstdc++.so.6.0.30": built["stdcxx-old"],
                       f"{SITE}/torch/lib/libbefore.so": built["before"], **extra},
                links={"/usr/bin/python3": "python3.11", f"{LIBDIR}/libstdc++.so.6": "libstdc++.so.6.0.30",
                       "/lib": "usr/lib"})
    return fs


def check(data: bytes, fs: DictFS, path: str = EXT) -> list[elfcheck.Finding]:
    return check_extension(path, data, fs, interpreter="/usr/bin/python3",
                           loaded_before=[f"{SITE}/torch/lib/libbefore.so"], resolver=Resolver(fs, (), summarise))


def codes(findings: list[elfcheck.Finding]) -> list[str]:
    return [f.code for f in findings]


def test_a_good_extension_has_no_finding_and_its_summary_is_read(built: dict[str, bytes]) -> None:
    s = summarise(built["good"])
    assert (s.elfclass, s.machine, s.type) == (64, "EM_X86_64", "ET_DYN")
    assert s.needed == ("libstdc++.so.6", "libbefore.so") and "PyInit_good" in s.exports
    assert {u.name: u.weak for u in s.undefined} == {"PyLong_FromLong": False, "cxx_fn": False,
                                                     "before_fn": False, "maybe_fn": True}
    assert s.version_needs == {"libstdc++.so.6": ("GLIBCXX_3.4.29",)}
    assert summarise(built["stdcxx-old"]).version_defs == {"GLIBCXX_3.4.29", "GLIBCXX_3.4.30"}
    assert check(built["good"], image(built)) == []  # the weak maybe_fn is no finding


def test_non_elf_file() -> None:
    assert [f.line() for f in check(b"#!/bin/sh\necho not a library\n", DictFS())] == [
        f"not-elf: {EXT}: no ELF magic (\\x7fELF) at the start of the file"]


def test_wrong_arch(built: dict[str, bytes]) -> None:
    data = bytearray(built["good"])
    data[18:20] = (183).to_bytes(2, "little")  # e_machine: EM_AARCH64
    assert codes(check(bytes(data), image(built))) == ["wrong-arch"]
    assert "EM_AARCH64, expected EM_X86_64" in check(bytes(data), image(built))[0].message


def test_32_bit_and_not_a_shared_object(built: dict[str, bytes]) -> None:
    data = bytearray(built["good"])
    data[16:18] = (2).to_bytes(2, "little")  # e_type: ET_EXEC
    assert codes(check(bytes(data), image(built))) == ["not-shared-object"]


def test_missing_pyinit(built: dict[str, bytes]) -> None:
    found = check(built["no-pyinit"], image(built))
    assert codes(found) == ["no-pyinit"]
    assert found[0].message == "does not export PyInit_good (the file name's module); it exports PyInit_other"


def test_undefined_symbol_named_demangled(built: dict[str, bytes]) -> None:
    found = check(built["undefined"], image(built))
    assert codes(found) == ["undefined-symbol"]
    assert found[0].message.startswith("undefined symbol ixformer::infer() (_ZN8ixformer5inferEv) is defined by no")


def test_symbols_of_the_interpreter_and_of_what_is_loaded_before_count(built: dict[str, bytes]) -> None:
    fs = image(built)
    del fs.files[f"{SITE}/torch/lib/libbefore.so"]
    found = check(built["good"], fs)
    assert sorted(codes(found)) == ["needed-missing", "needed-missing", "undefined-symbol"]
    assert any("undefined symbol before_fn " in f.message for f in found)
    no_python = check_extension(EXT, built["good"], image(built), loaded_before=[f"{SITE}/torch/lib/libbefore.so"],
                                resolver=Resolver(image(built), (), summarise))
    assert [f.message.split(" is ")[0] for f in no_python] == ["undefined symbol PyLong_FromLong"]


def test_glibcxx_version_too_new(built: dict[str, bytes]) -> None:
    found = check(built["too-new"], image(built))
    assert codes(found) == ["version-missing", "undefined-symbol"] or codes(found) == ["undefined-symbol",
                                                                                         "version-missing"]
    version = next(f for f in found if f.code == "version-missing")
    assert version.message == (f"needs GLIBCXX_3.4.32 of libstdc++.so.6, which {LIBDIR}/libstdc++.so.6.0.30 does "
                               "not define (newest GLIBCXX_3.4.30)")


def test_runpath_origin_library_path_and_the_ld_so_cache(built: dict[str, bytes]) -> None:
    fs = image(built, **{f"{SITE}/pkg/libs/libside.so": built["side"]})
    assert check(built["origin"], fs) == []  # RUNPATH $ORIGIN/libs, from the extension's own directory
    elsewhere = check(built["origin"], fs, path=f"{SITE}/other/good.cpython-311-x86_64-linux-gnu.so")
    assert codes(elsewhere) == ["needed-missing", "undefined-symbol"]
    moved = image(built, **{"/opt/side/libside.so": built["side"]})
    found = check_extension(EXT, built["origin"], moved, interpreter="/usr/bin/python3",
                            loaded_before=[f"{SITE}/torch/lib/libbefore.so"], library_path=["/opt/side"],
                            resolver=Resolver(moved, ("/opt/side",), summarise))
    assert found == []  # LD_LIBRARY_PATH
    host_cache = Path("/etc/ld.so.cache")
    if host_cache.is_file():
        entries = parse_ld_so_cache(host_cache.read_bytes())
        assert entries["libc.so.6"].endswith("/libc.so.6") and Path(entries["libc.so.6"]).exists()
