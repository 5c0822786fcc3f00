"""imageforge.cli.progress: plain lines off a terminal, a rich bar on one, nothing under --quiet; watch_size."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from imageforge.cli import progress as pg
from imageforge.cli.output import command_io


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_plain_lines_with_done_total_and_eta(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    out = io.StringIO()
    tracker = pg.Tracker("bench requests", 32, "requests", out, clock=clock)
    tracker.update()  # the first line at once
    clock.now += 5
    tracker.advance(8)  # 5 s < PLAIN_EVERY_S after the first line: nothing
    clock.now += 10
    tracker.advance(8)  # 16/32 after 15 s: 15 s more
    tracker.finish()
    assert out.getvalue().splitlines() == [
        "bench requests: 0/32 requests (0%)",
        "bench requests: 16/32 requests (50%), ETA 15s",
        "bench requests: 16/32 requests (50%), ETA 15s",
    ]
    script_out = io.StringIO()
    script = pg.Tracker("check-patches: script step s", None, "", script_out, clock=clock)
    script.update()
    clock.now += 3
    script.finish()
    assert script_out.getvalue().splitlines() == ["check-patches: script step s: running (0s)",
                                                     "check-patches: script step s: done (3s)"]
    size = pg.Tracker("docker save x", 4 * 1024 ** 3, "bytes", out, clock=clock)
    size.update(completed=1024 ** 3)
    assert size.line().startswith("docker save x: 1.0 GiB/4.0 GiB (25%)")


def test_a_stream_that_is_not_a_terminal_gets_lines_and_quiet_gets_nothing() -> None:
    out = io.StringIO()
    with pg.progress("replay requests", total=2, unit="requests", stream=out) as bar:
        bar.advance()
        bar.advance()
    assert out.getvalue().splitlines()[0] == "replay requests: 0/2 requests (0%)"
    assert out.getvalue().splitlines()[-1] == "replay requests: 2/2 requests (100%)"
    silent = io.StringIO()
    with pg.quiet(), pg.progress("x", total=3, stream=silent) as bar:
        bar.advance(3)
        assert bar.completed == 3
    assert silent.getvalue() == ""


def test_a_terminal_gets_a_rich_bar() -> None:
    out = io.StringIO()
    with pg.progress("wheelhouse download", total=2048, unit="bytes", stream=out, live=True) as bar:
        bar.advance(1024)
        bar.advance(1024)
    text = out.getvalue()
    assert "wheelhouse download" in text and "2.0/2.0 kB" in text


def test_quiet_command_has_no_progress_and_logs(capsys: pytest.CaptureFixture[str]) -> None:
    with command_io(quiet=True) as out:
        print("a log line")
        with pg.progress("bench requests", total=1) as bar:
            bar.advance()
        out.result("the result")
    captured = capsys.readouterr()
    assert captured.out == "the result\n" and captured.err == ""
    with command_io() as out:
        print("a log line")
        out.result("the result")
    captured = capsys.readouterr()
    assert captured.out == "the result\n" and captured.err == "a log line\n"


def test_watch_size_follows_a_folder(tmp_path: Path) -> None:
    tracker = pg.Tracker("wheelhouse download", 300, "bytes", io.StringIO())
    with pg.watch_size(tmp_path, tracker, every=0.01):
        (tmp_path / "a.whl").write_bytes(b"x" * 100)
        (tmp_path / "sub").mkdir()
        (tmp_path / "sub" / "b.whl").write_bytes(b"x" * 200)
    assert tracker.completed == 300


def test_a_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import importlib.util

    from imageforge.bench.plots import plot_sweep
    from imageforge.errors import InfraError, require_extra

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(InfraError, match="needs the Python package 'matplotlib'") as caught:
        plot_sweep([{"value": 1, "weighted_tps": 1.0, "output_tps_p10": 1.0, "ttft_p90_s": 0.1}], tmp_path / "s.png",
                   param="max-num-seqs")
    assert caught.value.hint == "pip install 'imageforge[plots]' (the 'plots' extra)"
    assert caught.value.exit_code == 5
    require_extra("json", "none", "the standard library")  # installed: nothing raised
