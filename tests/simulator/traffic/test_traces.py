"""Trace readers: mooncake and dynamo.request.trace.v1 rows, paths, and row errors."""

from __future__ import annotations

import gzip
import json
import os
import threading

import numpy as np
import pytest

from aisim.actors import hashing
from aisim.simulator.errors import InputError, NotSupportedError
from aisim.simulator.traffic.traces import read_dynamo, read_mooncake, resolve_trace_paths
from tests.conftest import SHARED_TRACES, SLICE


def write(path, rows):
    path.write_text("".join((json.dumps(r) if not isinstance(r, str) else r) + "\n" for r in rows))
    return path


def test_mooncake_slice_columns():
    w = read_mooncake([SLICE])
    assert w.num_requests == 1000
    assert w.input_len[0] == 6758 and w.output_len[0] == 500
    assert w.piece_ptr[1] == 14 and w.piece_len[13] == 6758 - 13 * 512
    assert np.all(np.diff(w.piece_ptr) == -(-w.input_len // 512))


@pytest.mark.parametrize("block_size", [512, 1024])
def test_plain_mooncake_rows_read_by_column_equal_the_row_by_row_reading(monkeypatch, tmp_path, block_size):
    from aisim.simulator.traffic import traces

    rows = [json.loads(line) for line in SLICE.read_text().splitlines()[:200]]
    rows[3]["input_length"] = 0  # no prompt blocks
    rows[4]["hash_ids"] = []
    rows[4]["input_length"] = 0
    rows[5]["timestamp"] = float(rows[5]["timestamp"]) + 0.25
    plain = write(tmp_path / "plain.jsonl", rows)
    shard = write(tmp_path / "shard.jsonl", rows[:50])
    by_column = [read_mooncake([plain], block_size), read_mooncake([plain, shard], block_size)]
    assert traces._plain_mooncake_columns(rows, block_size, traces._Builder(block_size))
    monkeypatch.setattr(traces, "_plain_mooncake_columns", lambda *args: False)
    by_row = [read_mooncake([plain], block_size), read_mooncake([plain, shard], block_size)]
    assert [w.digest for w in by_column] == [w.digest for w in by_row]
    assert by_column[1].description == "mooncake:plain.jsonl,shard.jsonl"


def test_a_trace_read_in_chunks_is_the_same_workload_whatever_the_chunk(monkeypatch, tmp_path):
    """Rows become columns a chunk at a time: plain chunks by column, others row by row, sessions,
    delays and request ids first seen in a later chunk; the workload does not depend on where the
    chunks end (a gzipped shard included)."""
    from aisim.simulator.traffic import traces

    rows = [json.loads(line) for line in SLICE.read_text().splitlines()[:40]]
    for i in (21, 25):  # (later turns of one session: the second with a delay)
        rows[i]["session_id"] = "s"
    rows[25]["delay"] = 250.0
    rows[33]["request_id"] = "r-33"
    plain = write(tmp_path / "a.jsonl", rows[:17])
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as fh:
        fh.write("\n\n".join(json.dumps(r) for r in rows[17:]) + "\n")  # (blank lines between rows)
    paths = [plain, tmp_path / "b.jsonl.gz"]
    whole = read_mooncake(paths)
    told = []
    for size in (1, 3, 7, 16):
        monkeypatch.setattr(traces, "CHUNK_ROWS", size)
        told.clear()
        with traces.rows_read(lambda path, n: told.append((path.name, n))):
            assert read_mooncake(paths).digest == whole.digest
        assert sum(n for _, n in told) == 40 and max(n for _, n in told) <= size
    assert whole.session_name(21) == "s" and whole.session_name(20) is None
    assert whole.turn_index[25] == 1 and whole.delay_ms[25] == 250.0 and np.isnan(whole.delay_ms[24])
    assert whole.request_ids[33] == "r-33" and whole.request_ids[0] is None
    assert whole.request_uuid(0) == "req-0000000"


def test_an_id_beyond_64_bits_is_named_not_taken_for_a_float(tmp_path):
    rows = ['{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [18446744073709551615]}',
            '{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [18446744073709551616]}']
    with pytest.raises(InputError) as e:
        read_mooncake([write(tmp_path / "m.jsonl", rows)])
    assert e.value.where.endswith("m.jsonl:2") and "beyond 64 bits (18446744073709551616)" in e.value.message
    w = read_mooncake([write(tmp_path / "ok.jsonl", rows[:1])])  # (2^64 - 1: a 64-bit id)
    assert w.piece_src.tolist() == hashing.trace_sources(np.array([2 ** 64 - 1], dtype=np.uint64)).tolist()


def test_bad_json_names_its_line_in_any_chunk(monkeypatch, tmp_path):
    from aisim.simulator.traffic import traces

    monkeypatch.setattr(traces, "CHUNK_ROWS", 2)
    rows = [json.loads(line) for line in SLICE.read_text().splitlines()[:5]]
    path = write(tmp_path / "m.jsonl", rows[:4] + ["{oops"] + rows[4:])
    with pytest.raises(InputError) as e:
        read_mooncake([path])
    assert e.value.where == f"{path}:5" and "invalid JSON" in e.value.message


@pytest.mark.parametrize("change", [
    {"input_length": 1024.0},  # an integral float: the row reader accepts it
    {"session_id": "s1"},  # another field
    {"timestamp": -1},  # a bad value: the row reader names it
    {"output_length": True},
    {"hash_ids": [1, "2"]},
    {"input_length": 10 ** 9},  # longer than its hash ids hold
])
def test_rows_other_than_plain_mooncake_go_row_by_row(change):
    from aisim.simulator.traffic import traces

    rows = [{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2]} for _ in range(3)]
    rows[1] = {**rows[1], **change}
    assert not traces._plain_mooncake_columns(rows, 512, traces._Builder(512))


def test_mooncake_input_length_fits_hash_ids_and_defaults_to_them(tmp_path):
    p = write(tmp_path / "t.jsonl", [
        {"timestamp": 0, "input_length": 1024, "output_length": 3, "hash_ids": [1, 2]},  # exactly full
        {"timestamp": 1, "output_tokens": 2, "hash_ids": [1, 2, 3]},  # no length: every block full
        {"timestamp": 2, "input_tokens": 513, "output_length": 1, "hash_ids": [1, 2]},  # last block partial
        {"timestamp": 3, "input_length": 0, "output_length": 1, "hash_ids": []},
    ])
    w = read_mooncake([p])
    assert w.input_len.tolist() == [1024, 1536, 513, 0]
    assert w.output_len.tolist() == [3, 2, 1, 1]
    assert w.piece_ptr.tolist() == [0, 2, 5, 7, 7] and w.piece_len[5:7].tolist() == [512, 1]


@pytest.mark.parametrize(
    "row,phrases",
    [
        ({"input_length": 5000, "hash_ids": [1, 2]},
         ["input_length 5000 exceeds hash_ids capacity 1024", "at least 2500",
          "set traffic.source.block_size (now 512"]),
        ({"input_tokens": 10**12, "hash_ids": [7]},
         ["input_tokens 1000000000000 exceeds hash_ids capacity 512", "traffic.source.block_size (now 512"]),
        ({"input_length": 1025, "hash_ids": [1, 2]}, ["input_length 1025 exceeds hash_ids capacity 1024"]),
        ({"input_length": 3, "hash_ids": []}, ["input_length 3 exceeds hash_ids capacity 0", "hash_ids is empty"]),
    ],
)
def test_mooncake_input_longer_than_hash_ids_is_refused_not_clamped(tmp_path, row, phrases):
    p = write(tmp_path / "t.jsonl", [{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]},
                                     {"timestamp": 1, "output_length": 1, **row}])
    with pytest.raises(InputError) as info:
        read_mooncake([p])
    assert info.value.where == f"{p}:2" and info.value.category == "invalid_config"
    for phrase in phrases:
        assert phrase in info.value.message
    assert "\n" not in str(info.value)


def test_mooncake_block_size_smaller_than_the_traces_is_refused_at_its_first_row():
    """The conversation slice was made with 512-token blocks; read at 64 its first row (6758 tokens,
    14 ids) needs 106 blocks, not 14 (the reference: 'input_length 6758 exceeds hash_ids capacity 896')."""
    with pytest.raises(InputError) as info:
        read_mooncake([SLICE], 64)
    assert info.value.where == f"{SLICE}:1"
    msg = info.value.message
    assert "input_length 6758 exceeds hash_ids capacity 896" in msg
    assert "block size is probably larger (at least 483)" in msg and "traffic.source.block_size (now 64" in msg


@pytest.mark.parametrize("name,requests", [("conversation_trace.jsonl", 12031), ("synthetic_trace.jsonl", 3993)])
def test_real_traces_load_at_their_block_size(name, requests):
    path = SHARED_TRACES / name
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    w = read_mooncake([path], 512)
    assert w.num_requests == requests
    assert np.all(np.diff(w.piece_ptr) == -(-w.input_len // 512))
    assert np.all((w.piece_len >= 1) & (w.piece_len <= 512))
    with pytest.raises(InputError, match="exceeds hash_ids capacity"):
        read_mooncake([path], 64)


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


def test_dynamo_records_sort_by_start_then_file_order_with_their_own_blocks(monkeypatch, tmp_path):
    """Records in (start, file order), each with its own prompt blocks, whatever chunks the ids
    were hashed in; the same workload as the records written in that order."""
    from aisim.simulator.traffic import traces

    recs = [dyn("a", 30, inp=130, ids=[1, 2, 3]), dyn("b", 10, inp=64, ids=[4]), dyn("c", 10, inp=0, ids=[]),
            dyn("d", 20, inp=200, ids=[5, 6, 7, 8])]
    monkeypatch.setattr(traces, "CHUNK_ROWS", 1)  # (ids hashed every 16 ids)
    w = read_dynamo([write(tmp_path / "t.jsonl", recs)])
    assert w.request_ids == ["b", "c", "d", "a"] and w.timestamp_ms.tolist() == [0.0, 0.0, 10.0, 20.0]
    assert w.input_len.tolist() == [64, 0, 200, 130] and w.piece_ptr.tolist() == [0, 1, 1, 5, 8]
    assert w.piece_len.tolist() == [64, 64, 64, 64, 8, 64, 64, 2]
    assert w.piece_src.tolist() == hashing.trace_sources(np.array([4, 5, 6, 7, 8, 1, 2, 3], dtype=np.uint64)).tolist()
    assert w.origin_ms == 10.0
    monkeypatch.undo()
    (tmp_path / "o").mkdir()
    ordered = read_dynamo([write(tmp_path / "o" / "t.jsonl", [recs[1], recs[2], recs[3], recs[0]])])
    assert ordered.digest == w.digest


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


def test_missing_absolute_path_and_empty_glob(tmp_path):
    with pytest.raises(InputError) as info:
        resolve_trace_paths([str(tmp_path / "nope.jsonl")], "traffic.source.paths", tmp_path)
    assert info.value.where == "traffic.source.paths"
    assert info.value.message.startswith(f"trace '{tmp_path / 'nope.jsonl'}' not found; give an existing file")
    with pytest.raises(InputError) as info:
        resolve_trace_paths(["shards/*.jsonl"], "traffic.source.paths", tmp_path)
    assert info.value.where == "traffic.source.paths"
    assert info.value.message.startswith(f"glob 'shards/*.jsonl' matched nothing (looked in the working "
                                         f"directory and {tmp_path})")


def resolve_error(raw, field="traffic.source.paths", config_dir=None) -> InputError:
    """The InputError resolving ``raw`` raises; fails (instead of hanging) if resolving blocks."""
    box: list = []

    def go():
        try:
            resolve_trace_paths([str(raw)], field, config_dir)
            box.append(None)
        except InputError as exc:
            box.append(exc)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(10)
    assert box, f"resolving {raw} blocked"
    assert box[0] is not None, f"{raw} resolved"
    assert box[0].where == field and "\n" not in str(box[0])
    return box[0]


def test_empty_directory_is_named(tmp_path):
    d = tmp_path / "shards"
    d.mkdir()
    msg = resolve_error(d).message
    assert msg.startswith(f"{d} is an empty directory; give")


def test_directory_without_shards_lists_what_it_holds(tmp_path):
    d = tmp_path / "shards"
    d.mkdir()
    for name in ("c.csv", "a.txt", "b.json"):
        (d / name).write_text("{}\n")
    msg = resolve_error(d).message
    assert msg.startswith(f"{d} is a directory with no .jsonl or .jsonl.gz shards "
                          "(it holds 3 other files: a.txt, b.json, c.csv)")
    (d / "sub").mkdir()
    for i in range(4):
        (d / f"z{i}.md").write_text("")
    msg = resolve_error(d, "trace_files").message
    assert "(it holds 8 other entries: a.txt, b.json, c.csv, sub/, z0.md and 3 more)" in msg


def test_relative_directory_found_next_to_the_config_is_described(tmp_path):
    (tmp_path / "traces").mkdir()
    msg = resolve_error("traces", config_dir=tmp_path).message
    assert msg.startswith(f"{tmp_path / 'traces'} is an empty directory")


def test_fifo_is_named_and_never_read(tmp_path):
    fifo = tmp_path / "trace.jsonl"
    os.mkfifo(fifo)
    assert resolve_error(fifo).message.startswith(f"{fifo} is a FIFO, not a regular file; give")
    d = tmp_path / "shards"
    d.mkdir()
    os.mkfifo(d / "a.jsonl")
    msg = resolve_error(d).message
    assert msg.startswith(f"{d} is a directory whose .jsonl/.jsonl.gz entries are not regular files: "
                          "a.jsonl (a FIFO)")
    msg = resolve_error(tmp_path / "*.jsonl").message
    assert msg.startswith(f"glob '{tmp_path / '*.jsonl'}' matched 1 path but no regular file: {fifo} (a FIFO)")


def test_character_device_is_named():
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    assert resolve_error("/dev/zero").message.startswith("/dev/zero is a character device, not a regular file")


def test_broken_symlink_is_named(tmp_path):
    link = tmp_path / "t.jsonl"
    link.symlink_to(tmp_path / "gone.jsonl")
    assert resolve_error(link).message.startswith(f"{link} is a broken symbolic link (to {tmp_path / 'gone.jsonl'})")
