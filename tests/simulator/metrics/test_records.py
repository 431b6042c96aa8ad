"""Per-request records spooled as requests end: order, spilling, lines as serialised, pickling."""

from __future__ import annotations

import json
import math
import pickle

import pytest

from aisim.simulator.metrics import records as rec_mod
from aisim.simulator.metrics.output import canonical_json
from aisim.simulator.metrics.records import Records, RecordSpool, jsonl_chunks


def _uuid(index: int) -> str:
    return f"req-{index}"


def _spool(rows) -> RecordSpool:
    spool = RecordSpool(_uuid)
    for index, arrival in rows:
        spool.add(index, arrival, {"uuid": _uuid(index), "arrival_time_ms": arrival, "ttft_ms": math.nan,
                                   "routing_history": [(index, "agg")], "n": index})
    return spool


@pytest.mark.parametrize("spill", [1 << 22, 64])
def test_records_come_back_by_arrival_then_uuid_as_strings(monkeypatch, spill):
    monkeypatch.setattr(rec_mod, "SPILL_BYTES", spill)  # 64: nearly every record goes to the file
    # ended in this order; arrivals tie for 9, 10, 100 (uuid strings: req-10 < req-100 < req-9)
    spool = _spool([(9, 5.0), (3, 7.0), (10, 5.0), (100, 5.0), (1, 2.5), (2, 7.0)])
    assert (spool._file is not None) == (spill == 64)
    got = spool.records()
    assert [r["n"] for r in got] == [1, 10, 100, 9, 2, 3]
    assert len(got) == 6 and got[1]["uuid"] == "req-10" and [r["n"] for r in got[4:]] == [2, 3]
    # as the JSON line gives them: NaN as None, tuples as lists
    assert got[0] == {"uuid": "req-1", "arrival_time_ms": 2.5, "ttft_ms": None, "routing_history": [[1, "agg"]], "n": 1}
    assert got == list(got) and got != list(got)[::-1]


def test_requests_jsonl_text_is_each_record_as_serialised(monkeypatch):
    monkeypatch.setattr(rec_mod, "LINES_PER_CHUNK", 2)  # (several chunks)
    monkeypatch.setattr(rec_mod, "SPILL_BYTES", 100)
    spool = _spool([(i, float(10 - i)) for i in range(5)])
    got = spool.records()
    text = "".join(jsonl_chunks(got))
    assert text == "".join(canonical_json(r, indent=None) + "\n" for r in got)
    assert [json.loads(line)["n"] for line in text.splitlines()] == [4, 3, 2, 1, 0]
    assert "".join(jsonl_chunks(list(got))) == text  # (a plain list of records: serialised now, alike)


def test_records_pickle_as_a_plain_list():
    got = _spool([(1, 1.0), (2, 0.5)]).records()
    back = pickle.loads(pickle.dumps(got))
    assert type(back) is list and back == got and [r["n"] for r in back] == [2, 1]


def test_no_records():
    got = RecordSpool(_uuid).records()
    assert isinstance(got, Records) and len(got) == 0 and list(got) == [] and not got
    assert "".join(jsonl_chunks(got)) == ""


def test_a_replay_spilling_its_records_gives_the_same_records(monkeypatch):
    from aisim import run_config
    from aisim.simulator.config.loading import load_config
    from tests.conftest import ROOT

    cfg, cdir = load_config(ROOT / "configs" / "quickstart.yaml")
    kept = run_config(cfg, cdir, capture_per_request=True).per_request
    monkeypatch.setattr(rec_mod, "SPILL_BYTES", 4096)  # (a file after a few records)
    spilled = run_config(cfg, cdir, capture_per_request=True).per_request
    assert len(kept) > 20 and spilled._spool._file is not None and kept._spool._file is None
    assert "".join(jsonl_chunks(spilled)) == "".join(jsonl_chunks(kept))
    times = [(r["arrival_time_ms"], r["uuid"]) for r in spilled]
    assert times == sorted(times)
