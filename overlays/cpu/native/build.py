"""Build imageforge_moe_group with the running interpreter's torch: one g++ call, no setuptools, no ninja.

Run by `imageforge native build` in this folder (the step's `build:`), on the machine whose interpreter and
torch the image serves with; writes imageforge_moe_group<EXT_SUFFIX> here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from torch.utils import cpp_extension

HERE = Path(__file__).resolve().parent
NAME = "imageforge_moe_group"


def main() -> int:
    out = HERE / f"{NAME}{sysconfig.get_config_var('EXT_SUFFIX')}"
    abi = int(bool(__import__("torch")._C._GLIBCXX_USE_CXX11_ABI))
    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    libdirs = cpp_extension.library_paths()
    cmd = [os.environ.get("CXX", "g++"), "-O2", "-std=c++20", "-shared", "-fPIC", "-fvisibility=hidden",
           f"-ffile-prefix-map={HERE}=.",  # __FILE__ in TORCH_CHECK: the same bytes from any checkout
           f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-DTORCH_EXTENSION_NAME=" + NAME, "-DTORCH_API_INCLUDE_EXTENSION_H",
           *(f"-I{d}" for d in includes), str(HERE / "moe_group.cpp"), "-o", str(out),
           *(f"-L{d}" for d in libdirs), "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python",
           "-Wl,-s"]  # stripped: the dynamic symbol table stays (what the checks and the loader read)
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
