"""request_metrics.csv from per-request records: exact text, the metric definitions, empty cells,
streaming, atomic writes."""

from __future__ import annotations

import math

from aisim.simulator.metrics.csv_out import (
    REQUEST_CSV_COLUMNS,
    request_row,
    write_csv_outputs,
    write_request_csv,
)
from aisim.simulator.metrics.output import KNOWN_OUTPUTS, csv_lines
from aisim.simulator.metrics.timeline import CSV_COLUMNS, WorkerTimeline

HEADER = ("request_id,status,worker_id,arrival_time_s,first_admit_time_s,first_token_time_s,last_token_time_s,"
          "input_tokens,output_tokens,reused_input_tokens,request_scheduling_delay,ttft_ms,tpot_ms,itl_ms,"
          "e2e_latency_ms")


def record(uuid, status, arrival, admit, first, last, n_in, n_out, reused, worker, itl):
    """The requests.jsonl keys request_metrics.csv reads (plus one it ignores)."""
    return {"uuid": uuid, "terminal_status": status, "arrival_time_ms": arrival, "first_admit_ms": admit,
            "first_token_ms": first, "last_token_ms": last, "input_length": n_in, "output_length": n_out,
            "reused_input_tokens": reused, "decode_worker_idx": worker, "itl_ms": itl,
            "ttft_ms": None if first is None else first - arrival, "admission_history": []}


RECORDS = [
    # 5 tokens: admitted 0.5 s after arrival, first token 750 ms after it, 4 gaps of 250 ms
    record("req-a", "completed", 1000.0, 1500.0, 1750.0, 2750.0, 100, 5, 64, 1, 250.0),
    # a single token: no gap, so no TPOT/ITL
    record("req-b", "completed", 2000.0, 2000.0, 2100.0, 2100.0, 30, 1, 0, 0, None),
    # rejected before any worker took it
    record("req-c", "rejected", 3000.0, None, None, None, 200, 0, 0, None, None),
    # incomplete when the replay stopped: its times are recorded, its latencies are not metrics
    record("req-d", "incomplete", 0.0, 250.0, 500.0, 1000.0, 40, 3, 0, 0, 250.0),
]

EXPECTED = "\n".join([
    HEADER,
    "req-a,completed,1,1.0,1.5,1.75,2.75,100,5,64,0.5,750.0,250.0,250.0,1750.0",
    "req-b,completed,0,2.0,2.0,2.1,2.1,30,1,0,0.0,100.0,,,100.0",
    "req-c,rejected,,3.0,,,,200,0,0,,,,,",
    "req-d,incomplete,0,0.0,0.25,0.5,1.0,40,3,0,,,,,",
]) + "\n"


def test_columns_in_order():
    assert ",".join(REQUEST_CSV_COLUMNS) == HEADER
    assert "request_metrics.csv" in KNOWN_OUTPUTS and "worker_timeline.csv" in KNOWN_OUTPUTS


def test_hand_made_records_give_the_exact_text(tmp_path):
    path = tmp_path / "request_metrics.csv"
    write_request_csv(path, RECORDS)
    assert path.read_text() == EXPECTED
    assert [p.name for p in tmp_path.iterdir()] == ["request_metrics.csv"]  # no temporary file left


def test_request_scheduling_delay_is_first_admission_minus_arrival_in_seconds():
    row = dict(zip(REQUEST_CSV_COLUMNS, request_row(
        record("x", "completed", 1234.0, 4567.0, 5000.0, 5000.0, 1, 1, 0, 0, None))))
    assert row["request_scheduling_delay"] == (4567.0 - 1234.0) / 1000
    assert row["ttft_ms"] == 5000.0 - 1234.0 and row["e2e_latency_ms"] == 5000.0 - 1234.0


def test_tpot_is_the_mean_gap_and_itl_comes_from_the_record():
    row = dict(zip(REQUEST_CSV_COLUMNS, request_row(
        record("x", "completed", 0.0, 0.0, 100.0, 400.0, 1, 4, 0, 0, 100.0))))
    assert row["tpot_ms"] == 100.0 and row["itl_ms"] == 100.0
    no_itl = record("y", "completed", 0.0, 0.0, 100.0, 400.0, 1, 4, 0, 0, None)
    assert dict(zip(REQUEST_CSV_COLUMNS, request_row(no_itl)))["itl_ms"] == 100.0  # falls back to the mean gap


def test_rejected_and_incomplete_requests_have_empty_metric_cells():
    metrics = ("request_scheduling_delay", "ttft_ms", "tpot_ms", "itl_ms", "e2e_latency_ms")
    for rec in RECORDS[2:]:
        row = dict(zip(REQUEST_CSV_COLUMNS, request_row(rec)))
        assert [row[k] for k in metrics] == [""] * 5, rec["uuid"]


def test_missing_and_non_finite_values_are_empty_cells():
    rec = record("z", "completed", 0.0, math.nan, None, None, 7, 0, 0, None, math.inf)
    row = dict(zip(REQUEST_CSV_COLUMNS, request_row(rec)))
    assert row["first_admit_time_s"] == row["request_scheduling_delay"] == row["itl_ms"] == ""
    assert row["ttft_ms"] == row["tpot_ms"] == row["e2e_latency_ms"] == row["worker_id"] == ""
    assert row["arrival_time_s"] == 0.0 and row["input_tokens"] == 7


def test_rows_are_formatted_as_they_are_consumed(monkeypatch):
    import aisim.simulator.metrics.output as output

    monkeypatch.setattr(output, "_CSV_BATCH_ROWS", 2)  # header + one row per chunk
    consumed = []

    def records():
        for r in RECORDS:
            consumed.append(r["uuid"])
            yield r

    lines = csv_lines(REQUEST_CSV_COLUMNS, (request_row(r) for r in records()))
    assert consumed == []  # nothing formatted before the first chunk is asked for
    assert next(lines) == HEADER + "\n" + EXPECTED.splitlines()[1] + "\n" and consumed == ["req-a"]
    assert "".join(lines) == "".join(EXPECTED.splitlines(keepends=True)[2:])


def test_quoting_follows_the_csv_module(tmp_path):
    path = tmp_path / "r.csv"
    write_request_csv(path, [record('a,"b"', "completed", 0.0, 0.0, 1.0, 1.0, 1, 1, 0, 0, None)])
    assert path.read_text().splitlines()[1].startswith('"a,""b""",completed,0,')


def test_both_files_from_records_and_timelines(tmp_path):
    tl = WorkerTimeline(0, "aggregated", [0.0, 1500.0], [2, 0], [1, 3], [5, 8], 10, end_ms=2000.0)
    write_csv_outputs(tmp_path, RECORDS, [tl])
    assert (tmp_path / "request_metrics.csv").read_text() == EXPECTED
    assert (tmp_path / "worker_timeline.csv").read_text() == "\n".join([
        ",".join(CSV_COLUMNS),
        "0,aggregated,0.0,1.5,2,1,5,0.5",
        "0,aggregated,1.5,0.5,0,3,8,0.8",
    ]) + "\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["request_metrics.csv", "worker_timeline.csv"]


def _csv_module_text(rows) -> str:
    import csv
    import io

    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue()


def test_plain_batches_are_formatted_by_columns_as_the_csv_module_would():
    import random
    import struct

    from aisim.simulator.metrics.output import _csv_columns

    # every float form where orjson and repr spell a number differently, and the ones around them
    edge = [1e-05, -1e-05, 4.173028964621065e-05, 0.0001, 0.00012, 1e-07, 1e15, 1e16, -1.5e16, 9999999999999998.0,
            5e-324, 1.7976931348623157e308, 0.0, -0.0, 100.0, math.nan, math.inf, -math.inf, 0.1 + 0.2, 10.00001]
    rows = [(f"req-{i}", "completed", i, x, "" if i % 3 else x, 2**40 + i) for i, x in enumerate(edge)]
    assert _csv_columns(rows) == _csv_module_text(rows)
    assert "\nreq-1,completed,1,-1e-05,,1099511627777\n" in _csv_columns(rows) and ",nan,nan," in _csv_columns(rows)
    rng = random.Random(7)
    floats = [struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0] for _ in range(20000)]
    floats += [rng.random() * 10 ** rng.randint(-9, 18) for _ in range(20000)]
    rows = [(x, -x, "", i) if i % 7 == 0 else (x, -x, x * 3, i) for i, x in enumerate(floats)]
    assert _csv_columns(rows) == _csv_module_text(rows)
    # anything else goes to the csv module (None here): a string needing quotes, a non-empty
    # string among numbers, a bool, None, an int beyond 64 bits, rows of unequal length, one column
    for odd in ([("a,b", 1.0)], [('say "x"', 1.0)], [("a\nb", 1.0)], [(1.5, 1.0), ("x", 2.0)], [(True, 1.0)], [(None, 1.0)],
                [(2**70, 1.0)], [(1, 2.0), (1, 2.0, 3)], [(1.0,)]):
        assert _csv_columns(odd) is None, odd
    lines = "".join(csv_lines(("a", "b"), [("x,y", 1.0), ("z", 2.5)]))
    assert lines == 'a,b\n"x,y",1.0\nz,2.5\n'
