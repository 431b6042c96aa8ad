"""The request log: a row of scalars per ended request, read back as numpy columns."""

from __future__ import annotations

import numpy as np

from aisim.actors.engine.request import COMPLETED, Request
from aisim.simulator.metrics.collector import STATUS_COMPLETED, STATUS_INCOMPLETE, RequestLog


def _request(index: int, prompt: int, out: int, arrival: float) -> Request:
    r = Request(index=index, source=None, arrival_ms=arrival, prompt_len=prompt, max_output=out)
    r.num_generated = out
    r.first_token_ms = arrival + 10.0
    r.last_token_ms = r.terminal_ms = arrival + 50.0
    r.admissions.append((arrival, 64, "agg"))
    r.status = COMPLETED
    return r


def test_columns_come_back_as_int64_float64_and_int8_from_4_byte_counts():
    log = RequestLog()
    assert log.column("input_len").dtype == np.int64 and len(log.column("arrival")) == 0
    log.add(_request(7, 2_000_000_000, 3, 1.5))  # (a count near int32's limit)
    log.add(_request(2, 100, 1, 0.25), STATUS_INCOMPLETE)
    assert log.input_len.itemsize == 4 and log.index.itemsize == 4
    assert log.column("index").tolist() == [7, 2] and log.column("index").dtype == np.int64
    assert log.column("input_len").tolist() == [2_000_000_000, 100]
    assert log.column("reused").tolist() == [64, 64] and log.column("output_len").tolist() == [3, 1]
    assert log.column("status").tolist() == [STATUS_COMPLETED, STATUS_INCOMPLETE]
    assert log.column("arrival").tolist() == [1.5, 0.25] and log.column("first_token").dtype == np.float64


def test_rows_past_the_spill_limit_are_written_out_and_read_back_in_order(monkeypatch):
    from aisim.simulator.metrics import collector

    monkeypatch.setattr(collector, "SPILL_ROWS", 3)
    log = RequestLog()
    for i in range(8):  # (two blocks of 3 written out, 2 rows held)
        log.add(_request(i, 1000 + i, 1 + i % 2, 0.5 * i), STATUS_INCOMPLETE if i == 4 else None)
    assert len(log) == 8 and len(log.index) == 2
    assert log.column("index").tolist() == list(range(8)) and log.column("index").dtype == np.int64
    assert log.column("input_len").tolist() == [1000 + i for i in range(8)]
    assert log.column("arrival").tolist() == [0.5 * i for i in range(8)]
    assert log.column("status").tolist() == [STATUS_INCOMPLETE if i == 4 else STATUS_COMPLETED for i in range(8)]
    assert log.column("status").dtype == np.int8 and log.column("terminal").dtype == np.float64
    log.add(_request(8, 9, 1, 4.0))  # (a third block written out: nothing held)
    assert len(log) == 9 and len(log.index) == 0 and log.column("output_len").tolist()[-3:] == [1, 2, 1]
