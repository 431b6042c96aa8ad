"""``aisim predict --output-dir D --csv``: request_metrics.csv and worker_timeline.csv for any run,
prediction.json unchanged by the flag, the same files from the Python functions."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from aisim.simulator.metrics.csv_out import REQUEST_CSV_COLUMNS, request_row
from aisim.simulator.metrics.timeline import CSV_COLUMNS
from tests.conftest import ROOT

ENV = dict(os.environ, PYTHONPATH=str(ROOT))
# a small KV cache and a 30 s stop: some requests rejected, some incomplete, a few completed
SOME_NOT_COMPLETED = ["--set", "engine.workers.aggregated.kv_cache.capacity.blocks=200",
                      "--set", "traffic.stop={max_virtual_time_seconds: 30}"]
# wall-clock fields (the host's speed, not the prediction)
WALL = ("wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s")


def aisim(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "aisim", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=ENV, timeout=300)


def read_csv(path):
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    return rows[0], rows[1:]


def without_wall_time(path):
    doc = json.loads(path.read_text())
    for k in WALL:
        doc["summary"].pop(k)
    return doc


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    """The bundled quickstart (1,000 requests) run with --csv from an empty working directory, and
    without it."""
    cwd = tmp_path_factory.mktemp("cwd")
    p = aisim("predict", "--output-dir", "with", "--csv", "--format", "json", cwd=cwd)
    assert p.returncode == 0, p.stderr
    q = aisim("predict", "--output-dir", "without", "--format", "json", cwd=cwd)
    assert q.returncode == 0, q.stderr
    return cwd / "with", cwd / "without", json.loads(p.stdout)


def test_quickstart_writes_both_files(quickstart):
    out, _, summary = quickstart
    assert sorted(p.name for p in out.iterdir()) == ["prediction.json", "request_metrics.csv",
                                                     "resource-runtime.json", "worker_timeline.csv"]
    header, rows = read_csv(out / "request_metrics.csv")
    assert tuple(header) == REQUEST_CSV_COLUMNS
    assert len(rows) == 1000 and {r[1] for r in rows} == {"completed"}
    assert len({r[0] for r in rows}) == 1000
    assert [(float(r[3]), r[0]) for r in rows] == sorted((float(r[3]), r[0]) for r in rows)  # by arrival, uuid
    col = {k: i for i, k in enumerate(REQUEST_CSV_COLUMNS)}
    for r in rows:
        assert float(r[col["request_scheduling_delay"]]) == pytest.approx(
            float(r[col["first_admit_time_s"]]) - float(r[col["arrival_time_s"]]), abs=1e-9)
        assert r[col["worker_id"]] in ("0", "1")
    mean_ttft = sum(float(r[col["ttft_ms"]]) for r in rows) / len(rows)
    assert mean_ttft == pytest.approx(summary["mean_ttft_ms"], rel=1e-9)
    assert sum(int(r[col["output_tokens"]]) for r in rows) == summary["total_output_tokens"]

    header, rows = read_csv(out / "worker_timeline.csv")
    assert tuple(header) == CSV_COLUMNS == ("worker_id", "role", "start_s", "duration_s", "queue_depth_waiting",
                                            "queue_depth_running", "kv_blocks_used", "kv_usage")
    assert {r[0] for r in rows} == {"0", "1"} and {r[1] for r in rows} == {"aggregated"}
    for wid in ("0", "1"):
        mine = [r for r in rows if r[0] == wid]
        assert float(mine[0][2]) == 0.0
        for a, b in zip(mine, mine[1:]):  # the intervals tile the worker's time
            assert float(a[2]) + float(a[3]) == pytest.approx(float(b[2]), abs=1e-9)
        # the timeline runs to the replay's last event (the last completion), not to the last arrival
        assert float(mine[-1][2]) + float(mine[-1][3]) <= summary["duration_ms"] / 1000 + 1e-9
    end = max(float(r[2]) + float(r[3]) for r in rows)
    assert end == pytest.approx(summary["duration_ms"] / 1000, abs=1e-9)
    assert max(int(r[4]) for r in rows) > 0 and max(float(r[7]) for r in rows) > 0


def test_prediction_json_does_not_change_with_csv(quickstart):
    with_csv, without, _ = quickstart
    assert without_wall_time(with_csv / "prediction.json") == without_wall_time(without / "prediction.json")
    doc = json.loads((with_csv / "prediction.json").read_text())
    assert doc["per_request"] is None and doc["coverage"]["capture_per_request"] is False
    assert doc["coverage"]["per_request_records"] == 0
    assert sorted(p.name for p in without.iterdir()) == ["prediction.json", "resource-runtime.json"]


def test_rows_follow_the_records_and_unfinished_requests_have_empty_latencies(tmp_path):
    out = tmp_path / "out"
    p = aisim("predict", "--output-dir", out, "--csv", "--capture-per-request", *SOME_NOT_COMPLETED)
    assert p.returncode == 0, p.stderr
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    doc = json.loads((out / "prediction.json").read_text())
    assert doc["per_request"] == {"path": "requests.jsonl", "records": len(records)}  # as --capture-per-request alone
    header, rows = read_csv(out / "request_metrics.csv")
    assert [r[0] for r in rows] == [r["uuid"] for r in records]
    statuses = {r[1] for r in rows}
    assert statuses == {"completed", "rejected", "incomplete"}
    col = {k: i for i, k in enumerate(REQUEST_CSV_COLUMNS)}
    metrics = [col[k] for k in ("request_scheduling_delay", "ttft_ms", "tpot_ms", "itl_ms", "e2e_latency_ms")]
    for row, rec in zip(rows, records):
        assert row == ["" if v == "" else str(v) for v in request_row(rec)]
        if rec["terminal_status"] == "completed":
            delay = (rec["first_admit_ms"] - rec["arrival_time_ms"]) / 1000
            assert float(row[col["request_scheduling_delay"]]) == delay
            assert float(row[col["ttft_ms"]]) == rec["ttft_ms"]
            assert float(row[col["e2e_latency_ms"]]) == rec["e2e_latency_ms"]
            if rec["output_length"] >= 2:
                assert float(row[col["itl_ms"]]) == rec["itl_ms"]
                assert float(row[col["tpot_ms"]]) == pytest.approx(rec["itl_ms"], rel=1e-12)
        else:
            assert [row[i] for i in metrics] == [""] * 5
        if rec["terminal_status"] == "rejected":
            assert row[col["first_admit_time_s"]] == row[col["first_token_time_s"]] == ""
        assert float(row[col["arrival_time_s"]]) == rec["arrival_time_ms"] / 1000
        assert int(row[col["input_tokens"]]) == rec["input_length"]
        assert int(row[col["output_tokens"]]) == rec["output_length"]
        assert int(row[col["reused_input_tokens"]]) == rec["reused_input_tokens"]


def test_the_python_functions_write_the_same_files(tmp_path):
    """A capacity search writes the two files from a ReplayReport with the same functions."""
    from aisim import plan_from_config, run_plan
    from aisim.cli import QUICKSTART
    from aisim.simulator.config.loading import load_config
    from aisim.simulator.metrics.csv_out import write_request_csv
    from aisim.simulator.metrics.timeline import write_csv

    sets = [s for s in SOME_NOT_COMPLETED if s != "--set"]
    out = tmp_path / "cli"
    p = aisim("predict", "--output-dir", out, "--csv", *SOME_NOT_COMPLETED)
    assert p.returncode == 0, p.stderr
    cfg, config_dir = load_config(None, sets, default_path=QUICKSTART)
    report = run_plan(plan_from_config(cfg, config_dir, capture_per_request=True, capture_worker_timeline=True))
    write_request_csv(tmp_path / "request_metrics.csv", report.per_request)
    write_csv(tmp_path / "worker_timeline.csv", report.timelines)
    for name in ("request_metrics.csv", "worker_timeline.csv"):
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes(), name


def test_csv_needs_an_output_dir(tmp_path):
    p = aisim("predict", "--csv", cwd=tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "--csv" in p.stderr and "--output-dir" in p.stderr
    assert list(tmp_path.iterdir()) == []


def test_overwrite_replaces_request_metrics_csv(tmp_path):
    out = tmp_path / "out"
    assert aisim("predict", "--output-dir", out, "--csv", *SOME_NOT_COMPLETED).returncode == 0
    (out / "mine.txt").write_text("kept")
    p = aisim("predict", "--output-dir", out, "--overwrite", *SOME_NOT_COMPLETED)
    assert p.returncode == 0, p.stderr
    assert sorted(f.name for f in out.iterdir()) == ["mine.txt", "prediction.json", "resource-runtime.json"]
