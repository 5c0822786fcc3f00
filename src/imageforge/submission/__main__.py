"""``python -m imageforge.submission --target T --profile P --out DIR [--check] [--git]``.

The library's own entry point, for CI until ``invoke submission`` exists (tasks.py is not touched here).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from ..errors import ImageforgeError
    from ..flagcheck import check_resolved
    from ..manifest import load_manifest, manifest_path
    from ..resolve import resolve
    from .tree import check_submission, write_submission

    parser = argparse.ArgumentParser(prog="python -m imageforge.submission", description=__doc__)
    parser.add_argument("--manifest")
    parser.add_argument("--target")
    parser.add_argument("--profile")
    parser.add_argument("--set", dest="sets", action="append", default=[])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--check", action="store_true", help="compare an existing tree with the manifest")
    parser.add_argument("--git", action="store_true", help="git init/commit the tree")
    args = parser.parse_args(argv)
    try:
        m = load_manifest(manifest_path(args.manifest))
        resolved = resolve(m, args.target, args.profile, environ=os.environ, sets=args.sets)
        note = check_resolved(resolved, os.environ)  # serving flags vs the image's vLLM (exit 2), issue 16
        if note:
            print(note, file=sys.stderr)
        if args.check:
            check_submission(resolved, args.out, environ=os.environ)
        else:
            write_submission(resolved, args.out, environ=os.environ, git=args.git)
    except ImageforgeError as exc:
        print(exc.render(), file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
