#!/bin/sh
# Refresh the dynamic loader cache for the directories given (default /usr/local/lib) and prove that
# the libraries linked there resolve and are known to the loader: the corex Triton fix needs exactly this.
set -eu
dirs="${*:-/usr/local/lib}"
ldconfig
# aux-cache records each library's inode and ctime: two builds of the same step would differ in it (the
# submission's `docker build` vs imageforge's layer). ldconfig only reads it to skip work on its next run.
rm -f /var/cache/ldconfig/aux-cache
for d in $dirs; do
  links=0
  for lib in "$d"/lib*.so*; do
    [ -L "$lib" ] || continue
    links=$((links + 1))
    if [ ! -e "$lib" ]; then
      echo "ldconfig.sh: $lib -> $(readlink "$lib") does not resolve" >&2
      exit 1
    fi
  done
  cached=$(ldconfig -p | grep -c "=> $d/" || true)
  if [ "$links" -gt 0 ] && [ "$cached" -eq 0 ]; then
    echo "ldconfig.sh: $links libraries linked in $d but none is in the loader cache" >&2
    exit 1
  fi
  echo "ldconfig.sh: $d: $links linked libraries, $cached loader cache entries"
done
