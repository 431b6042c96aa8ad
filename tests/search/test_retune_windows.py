"""Retune windows and decision times with exact expectations (reference §6.3)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from aisim.search.retune.windows import decision_tick_ms, window, window_requests, windows_launched_by
from aisim.simulator.traffic.traces import read_dynamo
from tests.conftest import ROOT


def test_window_k_covers_k_intervals_and_launches_after_the_grace():
    w = window(0, 600, 60)
    assert (w.start_ms, w.end_ms, w.launch_ms) == (0.0, 600_000.0, 660_000.0)
    w = window(2, 600, 60)
    assert (w.start_ms, w.end_ms, w.launch_ms) == (1_200_000.0, 1_800_000.0, 1_860_000.0)


@pytest.mark.parametrize("latency_s,expected_s", [(0, 665), (11, 675), (5, 665), (5.001, 670), (30, 690)])
def test_the_decision_falls_on_the_first_tick_after_the_launch_and_the_latency(latency_s, expected_s):
    # I = 600 s, grace 60 s, 5 s ticks: launch at 660 s
    assert decision_tick_ms(660_000.0, latency_s * 1000.0, 5_000.0) == expected_s * 1000.0


def test_a_launch_between_ticks_decides_at_the_next_one():
    assert decision_tick_ms(662_500.0, 0.0, 5_000.0) == 665_000.0


def test_the_windows_a_replay_reaches():
    # a 30-minute replay with 600 s windows and 60 s grace: launches at 660 and 1260 s fall inside,
    # 1860 s does not
    assert [w.index for w in windows_launched_by(1_800_000.0, 600, 60)] == [0, 1]
    assert [w.index for w in windows_launched_by(1_860_000.0, 600, 60)] == [0, 1, 2]
    assert windows_launched_by(600_000.0, 600, 60) == []


def test_a_request_belongs_to_its_window_only_if_it_completed_by_the_launch():
    w = window(0, 10, 2)  # [0, 10 s), launch at 12 s
    start = np.array([0.0, 5_000.0, 9_000.0, 9_000.0, 9_999.0, 10_000.0])
    total = np.array([1_000.0, 7_000.0, 3_000.0, 3_001.0, np.nan, 1.0])
    # 0: done at 1 s; 1: done exactly at the launch (12 s); 2: done at 12 s; 3: done after the
    # launch -> out; 4: no recorded total -> cannot be excluded; 5: starts in the next window
    assert window_requests(start, total, w).tolist() == [0, 1, 2, 4]
    assert window_requests(start, None, w).tolist() == [0, 1, 2, 3, 4]  # no totals recorded at all


def test_a_dynamo_trace_keeps_each_requests_recorded_total_time(tmp_path):
    rows = [
        {"schema": "dynamo.request.trace.v1", "event_type": "request_end", "event_time_unix_ms": 5000,
         "request": {"request_id": "a", "output_tokens": 4, "request_received_ms": 1000, "total_time_ms": 4000,
                     "replay": {"trace_block_size": 16, "input_length": 16, "input_sequence_hashes": [1]}}},
        {"schema": "dynamo.request.trace.v1", "event_type": "request_end", "event_time_unix_ms": 9000,
         "request": {"request_id": "b", "output_tokens": 4, "request_received_ms": 3000,
                     "replay": {"trace_block_size": 16, "input_length": 16, "input_sequence_hashes": [2]}}},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    w = read_dynamo([path])
    assert w.origin_ms == 1000.0 and w.timestamp_ms.tolist() == [0.0, 2000.0]
    assert w.recorded_total_ms[0] == 4000.0 and np.isnan(w.recorded_total_ms[1])


def test_the_bundled_converted_slice_records_no_total_times():
    w = read_dynamo([ROOT / "configs" / "data" / "conversation_slice_dynamo.jsonl"])
    assert w.num_requests == 1000 and np.isnan(w.recorded_total_ms).all()
