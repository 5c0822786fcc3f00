"""``init --from``'s ``touches:``: the adopted steps run in throwaway containers of the base (network off), as
check-patches and preflight run script steps (:class:`imageforge.patches.check.ScriptSandbox`), each one's
docker diff kept. A destination such as ``${VLLM_ROOT}/...`` is known only when the script runs: this is where
it is learnt. A base that is not on the daemon (its registry out of reach, ``--base`` not loaded) is said, not
failed."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from ..docker_engine import daemon_errors
from ..errors import ImageforgeError
from ..manifest.adopt import Touches
from ..manifest.load import load_manifest
from ..manifest.model import Step
from ..patches.check import Overlay, ScriptOutcome, check_steps, image_session, script_sandbox

Log = Callable[[str], None]


def scan_touches(manifest_path: Path, *, environ: Mapping[str, str], log: Log) -> Touches:
    """Each script step of the manifest's default target run on its base in order; what each changed."""
    changed: dict[str, list[tuple[str, int]]] = {}
    failed: dict[str, str] = {}
    try:
        manifest = load_manifest(manifest_path)
        with image_session(manifest, None, None, environ=environ, log=log) as s, \
                daemon_errors("init --from: running the adopted steps on the base"), \
                script_sandbox(s.base_id, s.target, environ, keep_failed=True) as sandbox:

            def run(step: Step, state: Overlay) -> ScriptOutcome:
                outcome = sandbox(step, state)
                written = {*state.files, *state.links}  # file steps' results put in before the script
                changed[step.id] = [(p, k) for p, k in sandbox.last_diff if p not in written]
                if outcome.exit_code != 0:
                    failed[step.id] = outcome.detail.splitlines()[0] if outcome.detail else "failed"
                return outcome

            check_steps(s.shared, s.profiles, s.fs, s.site, run_script=run, python_version=s.python_version)
            site = s.site
    except ImageforgeError as exc:
        return Touches(skipped=exc.message + (f"; {exc.hint}" if exc.hint else ""))
    return Touches(changed, site, failed)


__all__ = ["scan_touches"]
