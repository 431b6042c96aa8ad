"""A capacity search locks its output directory as predict does: a second search into it exits 2 at
once naming the first (real child processes), and the first finishes whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from tests.conftest import ROOT

ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def _start(cmd, cwd):
    return subprocess.Popen(cmd, env=ENV, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def test_a_second_capacity_search_into_a_live_directory_exits_2_naming_the_first(tmp_path):
    cmd = [sys.executable, "-m", "aisim", "capacity", "-c", str(ROOT / "configs" / "capacity-search.yaml"),
           "--output-dir", str(tmp_path / "out"), "--no-cache"]
    first = _start(cmd, tmp_path)
    lock = tmp_path / ".out.aisim-lock"  # the output directory's lock, held while the first runs
    deadline = time.monotonic() + 120
    while first.poll() is None and time.monotonic() < deadline and not lock.exists():
        time.sleep(0.05)
    second = subprocess.run(cmd, env=ENV, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    still_running = first.poll() is None
    out, err = first.communicate(timeout=300)
    assert still_running, "the first search ended before the second started"
    assert second.returncode == 2 and second.stderr == (
        f"aisim capacity: error: --output-dir: {tmp_path / 'out'} is in use by another aisim process "
        f"(pid {first.pid}); wait for it to finish or choose another directory\n")
    assert first.returncode == 0, err
    assert json.loads((tmp_path / "out" / "capacity_search_results.json").read_text())["jobs"]
