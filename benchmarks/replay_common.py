"""What the replay benchmarks share (replay_agreement.py, replay_client_overhead.py): the options naming one
running server and a generated workload, the workload itself, and the JSON result printed and kept.

    parser = argparse.ArgumentParser(...)
    add_server_options(parser, requests=12, seed=4)
    args = parser.parse_args(argv)
    model, requests, workload = server_workload(args.url, args.requests, args.seed)
    ...
    emit(result, args.out)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

from imageforge.bench.replay import ReplayOptions, discover_model, replay_workload  # noqa: E402
from imageforge.bench.replay_workload import ReplayRequest  # noqa: E402


def add_server_options(parser: argparse.ArgumentParser, *, requests: int, seed: int, url_required: bool = True) -> None:
    """``--url`` (one running OpenAI-compatible server), ``--requests`` / ``--seed`` (the generated replay) and
    ``--out`` (where the JSON result is kept)."""
    parser.add_argument("--url", required=url_required, help="a running server, e.g. from `invoke run --target cpu`")
    parser.add_argument("--requests", type=int, default=requests)
    parser.add_argument("--seed", type=int, default=seed)
    parser.add_argument("--out", type=Path)


def server_workload(url: str, requests: int, seed: int) -> tuple[str, list[ReplayRequest], dict[str, Any]]:
    """The served model, and imageforge's generated replay of ``requests`` from ``seed`` scaled to the server's
    max-model-len and counted in its tokens (the JSONL goes to a temporary directory): (model, requests,
    the workload's description as ``bench --replay`` writes it)."""
    model, server_len = discover_model(url)
    with tempfile.TemporaryDirectory() as tmp:
        generated, workload = replay_workload(ReplayOptions(requests=requests, seed=seed), url, model, server_len,
                                              Path(tmp))
    return model, generated, workload


def emit(result: dict[str, Any], out: Path | None) -> None:
    """Print the result as JSON, and keep it in ``out`` when given."""
    text = json.dumps(result, indent=2)
    print(text)
    if out is not None:
        out.write_text(text + "\n")
