"""Every label imageforge puts on what it creates (images, containers), in one place."""

from __future__ import annotations

TOOL = "imageforge"
LABEL = "org.imageforge"

L_TOOL = f"{LABEL}.tool"  # always "imageforge": what `clean` and the tests look for
L_KIND = f"{LABEL}.kind"  # step, profile-step, verify, config, server, os-base, vllm-base, ...
L_KEY = f"{LABEL}.cache-key"  # the chained content key of a layer (plan.chain_key)
L_TARGET = f"{LABEL}.target"
L_PROFILE = f"{LABEL}.profile"
L_MANIFEST = f"{LABEL}.manifest-digest"
L_RUN = f"{LABEL}.run-id"
L_BASE = f"{LABEL}.base-id"
L_REVISION = f"{LABEL}.revision"  # git revision of the manifest's checkout (not in any key)
L_CREATED = f"{LABEL}.created"  # when the layer was made (not in any key)
L_STEP = f"{LABEL}.step"  # prefix: <prefix>.<step id>.key and .sha256.<input>
L_VERIFIED = f"{LABEL}.verified"
L_FINAL = f"{LABEL}.final"
L_RECIPE_KEY = f"{LABEL}.recipe-key"
L_STARTED_BY = f"{LABEL}.started-by"
L_RUN_SPEC = f"{LABEL}.run-spec"  # a server's image ID and run options, digested: what --reuse-servers matches
