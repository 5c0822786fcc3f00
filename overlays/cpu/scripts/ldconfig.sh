#!/bin/sh
# Refresh the dynamic loader cache for the directories given (default /usr/local/lib), then prove
# that every library linked there resolves by its soname: the corex Triton fix needs exactly this.
set -eu
dirs="${*:-/usr/local/lib}"
ldconfig
for d in $dirs; do
  found=0
  for lib in "$d"/lib*.so*; do
    [ -e "$lib" ] || continue
    found=1
    name=$(basename "$lib")
    if ! ldconfig -p | grep -q " $name "; then
      case "$name" in
        *.so) ;;  # unversioned development names are not in the cache by design
        *) echo "ldconfig.sh: $name is linked in $d but not in the loader cache" >&2; exit 1 ;;
      esac
    fi
  done
  [ "$found" = 1 ] || { echo "ldconfig.sh: no libraries in $d" >&2; exit 1; }
done
echo "ldconfig.sh: loader cache refreshed for $dirs"
