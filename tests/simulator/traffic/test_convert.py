"""mooncake -> dynamo.request.trace.v1 conversion: same requests, same prefixes, exact split, atomic files."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from aisim import run_trace_replay
from aisim.simulator.errors import InputError, NotSupportedError
from aisim.simulator.metrics.output import canonical_json
from aisim.simulator.traffic.convert import mooncake_to_dynamo
from aisim.simulator.traffic.traces import read_dynamo, read_mooncake
from tests.conftest import ROOT, SLICE
from tests.helpers import without_wall

DATA = ROOT / "configs" / "data"
BUNDLED_WHOLE = DATA / "conversation_slice_dynamo.jsonl"
BUNDLED_HISTORY = DATA / "conversation_slice_history_dynamo.jsonl"
BUNDLED_REPLAY = DATA / "conversation_slice_replay_dynamo.jsonl"
BUNDLED_SPLIT_S = 120
COLUMNS = ("input_len", "output_len", "piece_ptr", "piece_src", "piece_len")


def write(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def relative(ts: np.ndarray) -> np.ndarray:
    return ts - np.nanmin(ts)


def assert_same_requests(moon, dyn) -> None:
    for col in COLUMNS:
        assert np.array_equal(getattr(moon, col), getattr(dyn, col)), col
    assert np.array_equal(relative(moon.timestamp_ms), relative(dyn.timestamp_ms))


# -- round trip ---------------------------------------------------------------------------
def test_slice_round_trip_reads_back_the_same_requests(tmp_path):
    out = tmp_path / "slice_dynamo.jsonl"
    counts = mooncake_to_dynamo(SLICE, out)
    assert counts == {"requests": 1000, "out": 1000, "history": 0, "block_size": 512, "split_at_ms": None,
                      "span_ms": 330000}
    moon, dyn = read_mooncake([SLICE]), read_dynamo([out])
    assert_same_requests(moon, dyn)  # lengths, relative timestamps, and every block's identity
    assert dyn.request_ids == [f"mooncake-{i}" for i in range(1000)]
    # prompts that share leading hash ids still share leading pieces (the shared system prompt, id 0)
    first = dyn.piece_src[dyn.piece_ptr[:-1]]
    assert (first == first[0]).sum() > 1


def test_replays_of_both_formats_agree(tmp_path):
    """The formats carry the same information: a KV-routed replay (prefix reuse matters) gives the
    same summary and the same per-request timings."""
    rows = [json.loads(line) for line in itertools.islice(SLICE.open(), 300)]
    moon = write(tmp_path / "m.jsonl", rows)
    dyn = tmp_path / "d.jsonl"
    mooncake_to_dynamo(moon, dyn)
    kw = dict(extra_engine_args={"num_gpu_blocks": 29249}, num_workers=2, router_mode="kv_router",
              capture_per_request=True, sla_ttft_ms=2000, sla_itl_ms=50)
    a = run_trace_replay(str(moon), trace_format="mooncake", **kw)
    b = run_trace_replay(str(dyn), trace_format="dynamo", **kw)
    assert a.summary["prefix_cache_reused_ratio"] > 0  # the hash identity is exercised
    assert canonical_json(without_wall(a.to_dict())["summary"]) == canonical_json(without_wall(b.to_dict())["summary"])
    timing = ("arrival_time_ms", "ttft_ms", "e2e_latency_ms", "reused_input_tokens", "prefill_worker_idx")
    assert [[r[k] for k in timing] for r in a.per_request] == [[r[k] for k in timing] for r in b.per_request]


def test_record_layout(tmp_path):
    big = (1 << 64) - 5
    src = write(tmp_path / "m.jsonl", [
        {"timestamp": 1500, "input_length": 700, "output_length": 9, "hash_ids": [7, 8, 99], "priority": 3},
        {"created_time": 1600.25, "input_tokens": 10, "output_tokens": 2, "hash_ids": [-1, big], "request_id": "r-1"},
        {"timestamp": 1700, "output_length": 1, "hash_ids": [5, 6]},  # no length: the hash ids' capacity
        {"timestamp": 1800, "input_length": 0, "output_length": 1, "hash_ids": []},
    ])
    out = tmp_path / "d.jsonl"
    mooncake_to_dynamo(src, out, block_size=512)
    lines = out.read_text().splitlines()
    assert all(line.startswith('{"schema": "dynamo.request.trace.v1"') for line in lines)  # sniffable head
    r = [json.loads(line) for line in lines]
    assert r[0] == {"schema": "dynamo.request.trace.v1", "event_type": "request_end", "event_time_unix_ms": 1500,
                    "request": {"request_id": "mooncake-0", "model": "mooncake", "output_tokens": 9,
                                "request_received_ms": 1500,
                                "replay": {"trace_block_size": 512, "input_length": 700,
                                           "input_sequence_hashes": [7, 8]}}}  # cut to the covered blocks
    assert all("total_time_ms" not in x["request"] for x in r)  # no recorded completion time
    assert r[1]["request"]["request_id"] == "r-1"
    assert r[1]["request"]["request_received_ms"] == 1600.25 and r[1]["event_time_unix_ms"] == 1601  # never before
    assert r[1]["request"]["replay"]["input_sequence_hashes"] == [(1 << 64) - 1]  # u64, as the readers map ids
    assert r[2]["request"]["replay"]["input_length"] == 1024
    assert r[3]["request"]["replay"] == {"trace_block_size": 512, "input_length": 0, "input_sequence_hashes": []}
    assert_same_requests(read_mooncake([src]), read_dynamo([out]))


def test_block_size_is_embedded(tmp_path):
    src = write(tmp_path / "m.jsonl", [{"timestamp": 0, "input_length": 40, "output_length": 1, "hash_ids": [1, 2, 3]}])
    out = tmp_path / "d.jsonl"
    assert mooncake_to_dynamo(src, out, block_size=16)["block_size"] == 16
    assert records(out)[0]["request"]["replay"]["trace_block_size"] == 16
    assert_same_requests(read_mooncake([src], block_size=16), read_dynamo([out]))


def test_unsorted_input_keeps_order_and_time(tmp_path):
    rows = [{"timestamp": t, "input_length": 10, "output_length": 1, "hash_ids": [i]} for i, t in enumerate([500, 100, 300])]
    src = write(tmp_path / "m.jsonl", rows)
    out = tmp_path / "d.jsonl"
    mooncake_to_dynamo(src, out)
    assert [x["request"]["request_received_ms"] for x in records(out)] == [500, 100, 300]  # input order
    assert read_dynamo([out]).timestamp_ms.tolist() == [0.0, 200.0, 400.0]  # the reader sorts by arrival


# -- split --------------------------------------------------------------------------------
def test_split_boundary_goes_to_the_replay(tmp_path):
    """History is [0, S), replay [S, end]: a request exactly at S is replayed. Times are relative
    to the earliest request; the files keep the absolute timestamps."""
    rows = [{"timestamp": t, "input_length": 10, "output_length": 1, "hash_ids": [i]}
            for i, t in enumerate([3000, 1000, 1999.5, 2000, 2000.5])]
    src = write(tmp_path / "m.jsonl", rows)
    out, hist = tmp_path / "replay.jsonl", tmp_path / "history.jsonl"
    counts = mooncake_to_dynamo(src, out, split_at_seconds=1, history_out=hist)
    assert (counts["history"], counts["out"], counts["split_at_ms"]) == (2, 3, 1000)
    assert [x["request"]["request_received_ms"] for x in records(hist)] == [1000, 1999.5]
    assert [x["request"]["request_received_ms"] for x in records(out)] == [3000, 2000, 2000.5]
    assert [x["request"]["request_id"] for x in records(out)] == ["mooncake-0", "mooncake-3", "mooncake-4"]


def test_slice_split_at_120_s(tmp_path):
    out, hist = tmp_path / "replay.jsonl", tmp_path / "history.jsonl"
    whole = tmp_path / "whole.jsonl"
    counts = mooncake_to_dynamo(SLICE, out, split_at_seconds=120, history_out=hist)
    mooncake_to_dynamo(SLICE, whole)
    ts = read_mooncake([SLICE]).timestamp_ms
    assert (ts == 120_000).sum() == 7  # the slice has requests exactly at the boundary
    assert counts["history"] == int((ts < 120_000).sum()) == 339
    assert counts["out"] == int((ts >= 120_000).sum()) == 661
    h = [x["request"]["request_received_ms"] for x in records(hist)]
    r = [x["request"]["request_received_ms"] for x in records(out)]
    assert max(h) < 120_000 <= min(r) == 120_000  # history ends before the first replayed request
    assert hist.read_text() + out.read_text() == whole.read_text()  # a partition of the whole conversion


def test_split_float_seconds_and_offset_origin(tmp_path):
    rows = [{"timestamp": 10_000 + t, "input_length": 10, "output_length": 1, "hash_ids": [1]} for t in (0, 1499, 1500, 9000)]
    src = write(tmp_path / "m.jsonl", rows)
    counts = mooncake_to_dynamo(src, tmp_path / "r.jsonl", split_at_seconds=1.5, history_out=tmp_path / "h.jsonl")
    assert (counts["history"], counts["out"]) == (2, 2)


def test_split_past_the_end_is_rejected(tmp_path):
    out, hist = tmp_path / "r.jsonl", tmp_path / "h.jsonl"
    with pytest.raises(InputError) as e:
        mooncake_to_dynamo(SLICE, out, split_at_seconds=400, history_out=hist)
    assert e.value.where == "split_at_seconds"
    assert "no request at or after 400 s, so the replay would be empty (the trace spans 330 s" in e.value.message
    assert not out.exists() and not hist.exists()


def test_tiny_split_keeps_only_the_first_instant(tmp_path):
    counts = mooncake_to_dynamo(SLICE, tmp_path / "r.jsonl", split_at_seconds=1e-9, history_out=tmp_path / "h.jsonl")
    assert counts["history"] == int((read_mooncake([SLICE]).timestamp_ms == 0).sum()) > 0


def test_split_with_one_timestamp_has_no_replay(tmp_path):
    src = write(tmp_path / "m.jsonl", [{"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [1]}] * 2)
    with pytest.raises(InputError, match="the replay would be empty"):
        mooncake_to_dynamo(src, tmp_path / "r.jsonl", split_at_seconds=1, history_out=tmp_path / "h.jsonl")


@pytest.mark.parametrize("kw,where,needle", [
    (dict(split_at_seconds=10), "split_at_seconds", "needs history_out"),
    (dict(history_out="h.jsonl"), "history_out", "needs split_at_seconds"),
    (dict(split_at_seconds=0, history_out="h.jsonl"), "split_at_seconds", "> 0"),
    (dict(split_at_seconds=-3, history_out="h.jsonl"), "split_at_seconds", "> 0"),
    (dict(split_at_seconds=math.inf, history_out="h.jsonl"), "split_at_seconds", "> 0"),
    (dict(split_at_seconds=math.nan, history_out="h.jsonl"), "split_at_seconds", "> 0"),
    (dict(split_at_seconds=True, history_out="h.jsonl"), "split_at_seconds", "> 0"),
    (dict(block_size=0), "block_size", ">= 1"),
    (dict(block_size=512.0), "block_size", ">= 1"),
    (dict(block_size=True), "block_size", ">= 1"),
])
def test_bad_arguments(tmp_path, kw, where, needle):
    with pytest.raises(InputError) as e:
        mooncake_to_dynamo(SLICE, tmp_path / "o.jsonl", **kw)
    assert e.value.where == where and needle in e.value.message


# -- bad input ----------------------------------------------------------------------------
@pytest.mark.parametrize("rows,line,needle,cls", [
    ([{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}, "{oops"], 2, "invalid JSON", InputError),
    ([{"timestamp": 0, "input_length": 10, "hash_ids": [1]}], 1, "missing field 'output_length'", InputError),
    ([{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": ["a"]}], 1, "must hold integers", InputError),
    ([{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [1]}], 1, "non-negative", InputError),
    ([{"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [1]}], 1,
     "convert with the block size the trace was made with (now 512)", InputError),
    ([{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]},
      {"input_length": 10, "output_length": 1, "hash_ids": [1]}], 2, "'timestamp' (or 'created_time') is required", InputError),
    ([{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1], "session_id": "s"},
      {"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": [1], "session_id": "s"}], 1,
     "multi-turn rows (session_id) cannot be converted", NotSupportedError),
    ([{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1], "request_id": "a"},
      {"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [1], "request_id": "a"}], 2,
     "duplicate request_id 'a'", InputError),
    # (not JSON: Infinity and NaN are no JSON numbers)
    (['{"timestamp": Infinity, "input_length": 10, "output_length": 1, "hash_ids": [1]}'], 1, "invalid JSON", InputError),
])
def test_bad_rows_name_file_and_line(tmp_path, rows, line, needle, cls):
    src = write(tmp_path / "m.jsonl", rows)
    out = tmp_path / "o.jsonl"
    with pytest.raises(cls) as e:
        mooncake_to_dynamo(src, out)
    assert e.value.where.startswith(f"{src}:{line}"), e.value.where
    assert needle in e.value.message
    assert "traffic.source.block_size" not in e.value.message  # no config key for a conversion
    assert not out.exists()


def test_empty_input_is_rejected(tmp_path):
    src = write(tmp_path / "m.jsonl", [])
    with pytest.raises(InputError, match="trace holds no requests"):
        mooncake_to_dynamo(src, tmp_path / "o.jsonl")


@pytest.mark.parametrize("target,where,needle", [
    ("missing/o.jsonl", "out_path", "does not exist"),
    (".", "out_path", "is a directory"),
    ("o.jsonl.gz", "out_path", "gzip output is not supported"),
    ("m.jsonl", "out_path", "is the input trace"),
])
def test_bad_outputs(tmp_path, target, where, needle):
    src = write(tmp_path / "m.jsonl", [{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}])
    before = src.read_text()
    with pytest.raises(InputError) as e:
        mooncake_to_dynamo(src, tmp_path / target)
    assert e.value.where == where and needle in e.value.message
    assert src.read_text() == before


def test_history_and_out_must_differ(tmp_path):
    with pytest.raises(InputError, match="given for both outputs") as e:
        mooncake_to_dynamo(SLICE, tmp_path / "o.jsonl", split_at_seconds=60, history_out=tmp_path / "o.jsonl")
    assert e.value.where == "history_out"


# -- atomic files -------------------------------------------------------------------------
def test_failed_conversion_leaves_previous_files(tmp_path):
    out, hist = tmp_path / "r.jsonl", tmp_path / "h.jsonl"
    out.write_text("old replay\n")
    hist.write_text("old history\n")
    bad = write(tmp_path / "bad.jsonl", [{"timestamp": 0, "hash_ids": [1]}])
    with pytest.raises(InputError):
        mooncake_to_dynamo(bad, out, split_at_seconds=60, history_out=hist)

    def interrupted():
        raise KeyboardInterrupt  # a signal once both files are written, before they are renamed

    with pytest.raises(KeyboardInterrupt):
        mooncake_to_dynamo(SLICE, out, split_at_seconds=60, history_out=hist, on_commit=interrupted)
    assert (out.read_text(), hist.read_text()) == ("old replay\n", "old history\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "h.jsonl", "r.jsonl"]  # no temporary left
    mooncake_to_dynamo(SLICE, out, split_at_seconds=60, history_out=hist)  # an existing file is replaced
    assert records(out)[0]["schema"] == "dynamo.request.trace.v1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "h.jsonl", "r.jsonl"]


def test_accepts_shard_directories_and_gzip(tmp_path):
    import gzip

    shards = tmp_path / "shards"
    shards.mkdir()
    rows = [json.loads(line) for line in itertools.islice(SLICE.open(), 20)]
    write(shards / "a.jsonl", rows[:10])
    with gzip.open(shards / "b.jsonl.gz", "wt") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in rows[10:]))
    out = tmp_path / "o.jsonl"
    assert mooncake_to_dynamo(shards, out)["requests"] == 20
    assert [x["request"]["request_id"] for x in records(out)] == [f"mooncake-{i}" for i in range(20)]


# -- bundled files ------------------------------------------------------------------------
def test_bundled_conversions_equal_a_fresh_conversion(tmp_path):
    """configs/data/*_dynamo.jsonl are conversions of conversation_slice.jsonl; they cannot drift.
    Regenerate them with:
    aisim trace convert --from mooncake --to dynamo configs/data/conversation_slice.jsonl configs/data/conversation_slice_dynamo.jsonl
    aisim trace convert --from mooncake --to dynamo configs/data/conversation_slice.jsonl \\
        configs/data/conversation_slice_replay_dynamo.jsonl --split-at-seconds 120 \\
        --history-out configs/data/conversation_slice_history_dynamo.jsonl"""
    whole, replay, history = tmp_path / "w.jsonl", tmp_path / "r.jsonl", tmp_path / "h.jsonl"
    mooncake_to_dynamo(SLICE, whole)
    mooncake_to_dynamo(SLICE, replay, split_at_seconds=BUNDLED_SPLIT_S, history_out=history)
    for fresh, bundled in ((whole, BUNDLED_WHOLE), (replay, BUNDLED_REPLAY), (history, BUNDLED_HISTORY)):
        assert fresh.read_bytes() == bundled.read_bytes(), f"{bundled.name} drifted; regenerate it (see docstring)"
        assert bundled.stat().st_size < 1_000_000
