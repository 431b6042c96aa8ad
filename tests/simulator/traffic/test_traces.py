"""Trace readers: mooncake and dynamo.request.trace.v1 rows, paths, and row errors."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from simulator.errors import InputError, NotSupportedError
from simulator.traffic.traces import read_dynamo, read_mooncake, resolve_trace_paths
from tests.conftest import SLICE


def write(path, rows):
    path.write_text("".join((json.dumps(r) if not isinstance(r, str) else r) + "\n" for r in rows))
    return path


def test_mooncake_slice_columns():
    w = read_mooncake([SLICE])
    assert w.num_requests == 1000
    assert w.input_len[0] == 6758 and w.output_len[0] == 500
    assert w.piece_ptr[1] == 14 and w.piece_len[13] == 6758 - 13 * 512
    assert np.all(np.diff(w.piece_ptr) == -(-w.input_len // 512))


def test_mooncake_input_length_is_clamped_to_hash_ids_and_defaults_to_them(tmp_path):
    p = write(tmp_path / "t.jsonl", [
        {"timestamp": 0, "input_length": 5000, "output_length": 3, "hash_ids": [1, 2]},
        {"timestamp": 1, "output_tokens": 2, "hash_ids": [1, 2, 3]},
    ])
    w = read_mooncake([p])
    assert w.input_len.tolist() == [1024, 1536]
    assert w.output_len.tolist() == [3, 2]


def test_mooncake_sessions_are_turns_in_file_order(tmp_path):
    p = write(tmp_path / "t.jsonl", [
        {"timestamp": 0, "output_length": 3, "hash_ids": [1], "session_id": "a"},
        {"timestamp": 5, "output_length": 3, "hash_ids": [9], "session_id": "b"},
        {"output_length": 3, "hash_ids": [1, 2], "session_id": "a", "delay": 250},
    ])
    w = read_mooncake([p], need_timestamps=True)
    assert w.session_index.tolist() == [0, 1, 0] and w.turn_index.tolist() == [0, 0, 1]
    assert w.delay_ms[2] == 250


@pytest.mark.parametrize(
    "line,field",
    [
        ('{"timestamp": 0, "hash_ids": [1]}', "output_length"),
        ('{"timestamp": 0, "output_length": "7", "hash_ids": [1]}', "output_length"),
        ('{"timestamp": 0, "output_length": 7, "hash_ids": "1,2"}', "hash_ids"),
        ('{"timestamp": 0, "output_length": 7, "hash_ids": [1.5]}', "hash_ids"),
        ('{"timestamp": -3, "output_length": 7, "hash_ids": [1]}', "timestamp"),
        ('{"output_length": 7, "hash_ids": [1]}', "timestamp"),
        ('{"timestamp": 0, "output_length": 7, "hash_ids": [1]', "invalid JSON"),
        ("[1, 2]", "JSON object"),
    ],
)
def test_malformed_mooncake_row_names_file_line_and_field(tmp_path, line, field):
    p = write(tmp_path / "t.jsonl", ['{"timestamp": 0, "output_length": 1, "hash_ids": [1]}', "", line])
    with pytest.raises(InputError) as info:
        read_mooncake([p], need_timestamps=True)
    assert info.value.where == f"{p}:3"
    assert field in str(info.value) and "\n" not in str(info.value)


def dyn(rid, start, inp=600, out=4, block=64, ids=None, **extra):
    req = {"request_id": rid, "model": "m", "output_tokens": out, "request_received_ms": start,
           "replay": {"trace_block_size": block, "input_length": inp, "input_sequence_hashes": ids or [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}}
    return {"schema": "dynamo.request.trace.v1", "event_type": "request_end", "event_time_unix_ms": start + 100,
            "request": req, **extra}


def test_dynamo_jsonl_gz_directory_and_glob(tmp_path):
    d = tmp_path / "shards"
    d.mkdir()
    write(d / "a.jsonl", [dyn("x", 1_000_500), {"schema": "dynamo.request.trace.v1", "event_type": "tool_end"}])
    with gzip.open(d / "b.jsonl.gz", "wt") as fh:
        fh.write(json.dumps(dyn("y", 1_000_000)) + "\n")
    paths = resolve_trace_paths([str(d)], "paths")
    w = read_dynamo(paths)
    assert w.request_ids == ["y", "x"] and w.timestamp_ms.tolist() == [0.0, 500.0]
    assert len(resolve_trace_paths([str(d / "*.jsonl*")], "paths")) == 2


def test_dynamo_start_from_end_minus_total_time(tmp_path):
    r = dyn("x", 0)
    del r["request"]["request_received_ms"]
    r["event_time_unix_ms"] = 5000
    r["request"]["total_time_ms"] = 1200
    w = read_dynamo([write(tmp_path / "t.jsonl", [r, dyn("y", 3000)])])
    assert w.request_ids == ["y", "x"] and w.timestamp_ms.tolist() == [0.0, 800.0]


def test_dynamo_rejects_duplicates_mixed_block_sizes_and_agentic(tmp_path):
    with pytest.raises(InputError, match="duplicate request_id"):
        read_dynamo([write(tmp_path / "d.jsonl", [dyn("x", 0), dyn("x", 1)])])
    with pytest.raises(InputError, match="share one block size"):
        read_dynamo([write(tmp_path / "b.jsonl", [dyn("x", 0), dyn("y", 1, block=32)])])
    with pytest.raises(NotSupportedError, match="agentic"):
        read_dynamo([write(tmp_path / "a.jsonl", [dyn("x", 0, agent_context={"a": 1})])])


def test_missing_trace_path_says_where_it_looked(tmp_path):
    with pytest.raises(InputError, match="not found") as info:
        resolve_trace_paths(["nope.jsonl"], "traffic.source.paths", tmp_path)
    assert info.value.where == "traffic.source.paths"
