"""The flag introspection runs for real in the cpu base image: vLLM 0.32's own parser, network off.

One container from the base image's ID (made or reused by ``imageforge.base.ensure_cpu_base``), created
with the docker SDK directly, removed afterwards. Building vLLM's parser takes ~6.5 s on a quiet machine
(far longer under load), so the listing is taken once per module.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from imageforge.flags.check import ServingArg, check_serving_args, serving_args_of_target
from imageforge.flags.learn import INTROSPECT_COMMAND, introspection_source, parse_introspection
from imageforge.flags.model import FlagTable, Range

REPO = Path(__file__).resolve().parents[2]
LABEL = "org.imageforge.test"

pytestmark = pytest.mark.integration


def run_in_base(command: list[str], *, entrypoint: list[str], volumes: dict[str, dict[str, str]] | None = None) -> str:
    """Run ``command`` in a container of the cpu base image (network off, removed again); its output (exit 0)."""
    import docker

    from imageforge.base import ensure_cpu_base

    base = ensure_cpu_base(REPO / "images" / "cpu", log=print)
    client = docker.from_env(timeout=900)
    container = client.containers.create(
        base.image_id,
        command=command,
        entrypoint=entrypoint,
        network_disabled=True,
        volumes=volumes or {},
        labels={LABEL: "flags-introspection", "org.imageforge.tool": "imageforge"},
        environment={"VLLM_TARGET_DEVICE": "cpu", "HOME": "/tmp"},
    )
    try:
        container.start()
        result = container.wait(timeout=900)
        output: str = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
    finally:
        container.remove(force=True)
        client.close()
    assert result["StatusCode"] == 0, output[-3000:]
    return output


@pytest.fixture(scope="module")
def listing(docker_ready: None) -> str:
    return run_in_base([*INTROSPECT_COMMAND, introspection_source()], entrypoint=[])


@pytest.fixture(scope="module")
def table(listing: str) -> FlagTable:
    return parse_introspection(listing)


def test_known_facts_of_vllm_032(table: FlagTable) -> None:
    assert table.source.startswith("vLLM 0.32.0's parser (")
    assert len(table) >= 317 - 1  # 317 option actions counted with --help; the listing leaves --help out
    seqs = table.get("max-num-seqs")
    assert seqs is not None and seqs.type == "int"
    assert seqs.range == Range(minimum=1)  # pydantic Ge(1) on SchedulerConfig.max_num_seqs
    gmu = table.get("gpu-memory-utilization")
    assert gmu is not None and gmu.type == "float"
    assert gmu.range == Range(0, 1, min_exclusive=True)  # Gt(0), Le(1)
    assert "--device-memory-utilization" in gmu.aliases
    tp = table.get("tensor-parallel-size")
    assert tp is not None and "-tp" in tp.aliases
    assert "disable-log-requests" not in table
    assert "max-seq-len-to-capture" not in table


def test_traps_are_unwrapped(table: FlagTable) -> None:
    caching = table.get("enable-prefix-caching")
    assert caching is not None and caching.type == "bool" and caching.negatable  # BooleanOptionalAction
    headless = table.get("headless")
    assert headless is not None and headless.type == "bool" and not headless.negatable and not headless.takes_value
    name = table.get("served-model-name")
    assert name is not None and name.type == "str" and name.multiple and name.nullable  # _optional_type(str)
    dtype = table.get("dtype")
    assert dtype is not None and dtype.type == "choice" and "bfloat16" in dtype.choices
    mml = table.get("max-model-len")
    assert mml is not None and mml.type == "int" and mml.also == ("auto",)
    port = table.get("port")
    assert port is not None and port.type == "int"
    assert table.get("structured-outputs-config") is not None
    assert table.get("structured-outputs-config").type == "json"  # type: ignore[union-attr]


def test_the_repository_cpu_target_passes_against_its_own_vllm(table: FlagTable) -> None:
    from imageforge.manifest.load import load_manifest

    manifest = load_manifest(REPO / "build.yaml")
    assert check_serving_args(serving_args_of_target(manifest, "cpu"), table) == []


def test_the_issue_mistakes_against_the_real_parser(table: FlagTable) -> None:
    args = [ServingArg("max-num-seq", 8), ServingArg("max_num_seqs", 8), ServingArg("gpu-memory-utilization", 1.5),
            ServingArg("max-num-seqs", "8"), ServingArg("enable-prefix-caching", False)]
    messages = [p.message for p in check_serving_args(args, table)]
    assert messages == [
        "unknown serving flag 'max-num-seq'",
        "serving flag 'max_num_seqs' is written with underscores",
        "gpu-memory-utilization is out of range",
        "max-num-seqs takes an integer >= 1",
    ]  # enable-prefix-caching: false is fine here: --no-enable-prefix-caching exists in 0.32


def test_no_container_is_left(listing: str) -> None:
    from tests.integration.helpers import labelled

    assert labelled({LABEL: "flags-introspection"}) == []



PARSE_SERVE = """\
import sys
import vllm.entrypoints.cli.serve as serve

def show(args):
    print("PARSED", args.enable_prefix_caching, args.max_num_seqs, flush=True)

serve.ServeSubcommand.cmd = staticmethod(show)  # parse like `vllm serve`, start nothing
from vllm.entrypoints.cli.main import main
for config in sys.argv[1:]:  # one import of vLLM (~10 s of CPU here) for every file
    sys.argv = ["vllm", "serve", "--config", config]
    main()
"""


def test_a_false_boolean_in_the_rendered_config_reaches_vllm_serve(docker_ready: None, tmp_path: Path) -> None:
    """`vllm serve --config FILE` (0.32) drops `enable-prefix-caching: false` and serves with the cache on; the file
    imageforge renders says `no-enable-prefix-caching: true`, which vLLM's own CLI parses as off."""
    from imageforge.manifest.load import load_manifest
    from imageforge.manifest.resolve import resolve
    from imageforge.plan import make_plan

    resolved = resolve(load_manifest(REPO / "build.yaml"), "cpu", "conservative", environ={},
                       sets=["enable-prefix-caching=false", "max-num-seqs=3"])
    (tmp_path / "rendered.yaml").write_bytes(make_plan(resolved, environ={}, probe=None).serving_config)
    (tmp_path / "plain.yaml").write_text("model: /m\nenable-prefix-caching: false\nmax-num-seqs: 3\n")
    (tmp_path / "parse.py").write_text(PARSE_SERVE)
    tmp_path.chmod(0o755)
    output = run_in_base(["python3 /cfg/parse.py /cfg/rendered.yaml /cfg/plain.yaml"],
                         entrypoint=["sh", "-c"], volumes={str(tmp_path): {"bind": "/cfg", "mode": "ro"}})
    parsed = [line for line in output.splitlines() if line.startswith("PARSED")]
    assert parsed == ["PARSED False 3",  # imageforge's file: off, as the manifest says
                      "PARSED None 3"]  # `FLAG: false` as written by hand: dropped, vLLM's default (on) stays
