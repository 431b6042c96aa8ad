"""Progress on a terminal: shown under a pseudo-terminal, absent without one and with --format json,
and it never changes a result."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios

import pytest

from aisim import plan_from_config, run_plan
from aisim.simulator.config.loading import load_config
from aisim.simulator.metrics.output import canonical_json
from aisim.simulator.plan import ExecutionPlan
from tests.conftest import ROOT
from tests.simulator.test_coordinator import CASES, CONFIGS, without_wall

ENV = dict(os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1")


def run_in_pty(args: list[str], cols: int = 100) -> tuple[int, str]:
    """``aisim ARGS`` with stdout and stderr on a pseudo-terminal of ``cols`` columns."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, cols, 0, 0))
    p = subprocess.Popen([sys.executable, "-m", "aisim", *args], stdin=subprocess.DEVNULL, stdout=slave,
                         stderr=slave, env=ENV, close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif p.poll() is not None:
            break
    p.wait(timeout=120)
    os.close(master)
    return p.returncode, b"".join(chunks).decode("utf-8", "replace")


def test_a_terminal_sees_replay_progress_and_the_compact_table():
    code, out = run_in_pty(["predict"], cols=80)
    assert code == 0, out
    assert "replay" in out and "simulated s" in out and "/ 1,000 requests" in out
    assert "┃ Metric     ┃   avg ┃   p50 ┃" in out  # the compact layout of an 80-column terminal
    assert "Requests: 1,000 completed, 0 rejected, 0 incomplete" in out


def test_no_progress_with_json_or_without_a_terminal():
    code, out = run_in_pty(["predict", "--format", "json"])
    assert code == 0 and "simulated s" not in out and out.lstrip().startswith("{")
    p = subprocess.run([sys.executable, "-m", "aisim", "predict"], capture_output=True, text=True, env=ENV, timeout=120)
    assert p.returncode == 0 and p.stderr == ""
    assert "Time to First Token (ms)" in p.stdout  # not a terminal: the full layout


@pytest.mark.parametrize("name", ["round_robin", "closed_loop", "planner_aggregated", "disaggregated_2p2d"])
def test_the_progress_edges_change_no_result(name):
    cfg_file, sets = CASES[name]
    cfg, cdir = load_config(CONFIGS / cfg_file, sets)
    plan = dataclasses.replace(plan_from_config(cfg, cdir, capture_per_request=True), execution=ExecutionPlan())
    calls = []
    quiet = run_plan(plan).to_dict()
    shown = run_plan(plan, on_progress=lambda *a: calls.append(a)).to_dict()
    assert len(calls) > 50  # the progress edges did happen
    assert [c[2] for c in calls] == sorted(c[2] for c in calls)  # requests ended only grows
    assert canonical_json(without_wall(quiet)) == canonical_json(without_wall(shown))


def _plain(text: str) -> str:
    """The terminal's text without the live display's control codes (each redraw its own line)."""
    import re

    return "\n".join(re.split(r"[\r\n]+", re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)))


def test_searches_show_their_trials_through_the_same_display(tmp_path):
    import yaml

    from tests.search.capacity.test_runner import example
    from tests.search.spica.test_loop import _search_yaml

    cfg = example()
    cfg["jobs"] = [{"name": "only", "qps_list": [1, 2]}]
    path = tmp_path / "cap.yaml"
    path.write_text(yaml.safe_dump(cfg))
    code, out = run_in_pty(["capacity", "-c", str(path), "--output-dir", str(tmp_path / "cap"), "--no-cache",
                            "--max-parallel", "1"], cols=120)
    assert code == 0, out
    assert "capacity" in _plain(out) and "2 trials; last: only @ " in _plain(out)
    code, out = run_in_pty(["recommend", "-c", _search_yaml(tmp_path, max_trials=3), "--output-dir",
                            str(tmp_path / "rec"), "--parallelism", "1"], cols=120)
    assert code == 0, out
    assert "3 / 3 trials," in _plain(out) and "trials/s" in _plain(out)
    assert "pruned" not in _plain(out)  # (a search without a pruner does not count them)
    code, out = run_in_pty(["recommend", "-c", _search_yaml(tmp_path, max_trials=3, pruner="median"),
                            "--output-dir", str(tmp_path / "pruned"), "--parallelism", "1"], cols=120)
    assert code == 0, out
    assert "3 / 3 trials, 3 feasible, 0 pruned, best " in _plain(out)


def test_the_replay_line_keeps_count_and_eta_when_narrow_and_never_passes_the_span():
    from aisim.progress import replay_line

    assert replay_line(900_000, 3_600_000, 3000, 12000, 10.0) == (
        "replay", 0.25, 1.0, "900 / 3,600 simulated s, 3,000 / 12,000 requests, ETA 30 s, 90x real time")
    narrow = replay_line(900_000, 3_600_000, 3000, 12000, 10.0, narrow=True)[3]
    assert narrow == "900 / 3,600 simulated s, 3,000 / 12,000 requests, ETA 30 s" and len("replay " + narrow) < 80
    # past the last arrival the replay drains: never more simulated seconds than the span
    assert replay_line(3_700_000, 3_600_000, 11990, 12000, 40.0, narrow=True) == (
        "replay", 1.0, 1.0, "draining after 3,600 simulated s, 11,990 / 12,000 requests")


def test_an_80_column_terminal_gets_no_bar():
    import io

    from rich.console import Console

    from aisim.progress import Progress

    for width, narrow in ((80, True), (160, False)):
        buf = io.StringIO()
        with Progress(True, console=Console(file=buf, width=width, force_terminal=True)) as p:
            p.steps("recommend", 3, 32, "trials, 2 feasible")
            assert p.narrow is narrow
            columns = [type(c).__name__ for c in p._live.columns]
        assert ("BarColumn" in columns) is not narrow


def test_a_terminal_sees_the_rows_of_a_trace_as_it_loads(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    rows = (ROOT / "configs" / "data" / "conversation_slice.jsonl").read_text().splitlines(keepends=True)
    (shards / "a.jsonl").write_text("".join(rows[:600]))
    (shards / "b.jsonl").write_text("".join(rows[600:]))
    code, out = run_in_pty(["predict", "--set", f"traffic.source.paths=[{shards}]"], cols=80)
    assert code == 0, out
    assert "loading the trace: 600 rows read (last: a.jsonl)" in out
    assert "loading the trace: 1,000 rows read in 2 files (last: b.jsonl)" in out
    code, quiet = run_in_pty(["predict", "--format", "json"], cols=80)
    assert code == 0 and "loading" not in quiet


def test_the_chunks_of_one_trace_file_count_as_one_file():
    import io
    from pathlib import Path

    from rich.console import Console

    from aisim.progress import Progress

    buf = io.StringIO()
    with Progress(True, console=Console(file=buf, width=160, force_terminal=True)) as p:
        p.loading(None, None)
        for path, rows in ((Path("a.jsonl"), 16384), (Path("a.jsonl"), 100), (Path("b.jsonl"), 5)):
            p.loading(path, rows)
        assert (p._files, p._rows) == (2, 16489)
