"""``aisim trace convert`` as a user runs it: one summary line, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, SLICE

CONVERT = ("trace", "convert", "--from", "mooncake", "--to", "dynamo")


def aisim(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "aisim", *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


def one_line_error(p, code=2):
    assert p.returncode == code, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert p.stdout == ""
    return p.stderr.strip()


def test_trace_without_an_action_prints_help_and_exits_2():
    p = aisim("trace")
    assert p.returncode == 2
    assert "usage: aisim trace" in p.stdout and "convert" in p.stdout
    err = one_line_error(aisim("trace", "split"))
    assert err.startswith("aisim trace: error:") and "'convert'" in err


def test_convert_writes_the_trace_and_one_summary_line(tmp_path):
    out = tmp_path / "out.jsonl"
    p = aisim(*CONVERT, SLICE, out)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    assert p.stdout.splitlines() == [f"wrote 1,000 requests to {out} (dynamo, block size 512)"]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 1000 and rows[0]["schema"] == "dynamo.request.trace.v1"


def test_convert_split_writes_history_and_replay(tmp_path):
    out, hist = tmp_path / "replay.jsonl", tmp_path / "history.jsonl"
    p = aisim(*CONVERT, SLICE, out, "--split-at-seconds", "120", "--history-out", hist, "--block-size", "512")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [f"wrote 661 requests to {out} (from 120 s) and 339 to {hist} (before 120 s); "
                                     "dynamo, block size 512"]
    assert len(out.read_text().splitlines()) == 661 and len(hist.read_text().splitlines()) == 339


def test_a_converted_trace_predicts_like_the_original(tmp_path):
    """The bundled quickstart on its mooncake slice and on the bundled dynamo conversion."""
    base = aisim("predict", "--format", "json", cwd=tmp_path)
    dyn = aisim("predict", "--format", "json", "--set", "traffic.source.format=dynamo",
                "--set", "traffic.source.paths=[data/conversation_slice_dynamo.jsonl]", cwd=tmp_path)
    assert base.returncode == 0 and dyn.returncode == 0, (base.stderr, dyn.stderr)
    wall = ("wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s")
    a, b = ({k: v for k, v in json.loads(p.stdout).items() if k not in wall} for p in (base, dyn))
    assert a == b and a["completed_requests"] == 1000


@pytest.mark.parametrize("args,needle", [
    (["--from", "dynamo", "--to", "dynamo"], "argument --from: invalid choice: 'dynamo' (choose from 'mooncake')"),
    (["--from", "mooncake-delta", "--to", "dynamo"], "argument --from: invalid choice: 'mooncake-delta'"),
    (["--from", "mooncake", "--to", "mooncake"], "argument --to: invalid choice: 'mooncake' (choose from 'dynamo')"),
    (["--to", "dynamo"], "the following arguments are required: --from"),
    (["--from", "mooncake", "--to", "dynamo", "--block-size", "0"], "argument --block-size: must be an integer >= 1"),
    (["--from", "mooncake", "--to", "dynamo", "--block-size", "x"], "argument --block-size: must be an integer >= 1"),
    (["--from", "mooncake", "--to", "dynamo", "--split-at-seconds", "0", "--history-out", "h.jsonl"],
     "argument --split-at-seconds: must be a number of seconds > 0"),
    (["--from", "mooncake", "--to", "dynamo", "--split-at-seconds", "nan", "--history-out", "h.jsonl"],
     "argument --split-at-seconds: must be a number of seconds > 0"),
    (["--from", "mooncake", "--to", "dynamo", "--split-at-seconds", "60"], "--split-at-seconds: needs --history-out"),
    (["--from", "mooncake", "--to", "dynamo", "--history-out", "h.jsonl"], "--history-out: needs --split-at-seconds"),
    (["--from", "mooncake", "--to", "dynamo", "--split-at-seconds", "600", "--history-out", "h.jsonl"],
     "--split-at-seconds: no request at or after 600 s, so the replay would be empty"),
])
def test_bad_flags_are_one_line_exit_2(tmp_path, args, needle):
    err = one_line_error(aisim("trace", "convert", *args, SLICE, "out.jsonl", cwd=tmp_path))
    assert err.startswith("aisim trace convert: error:") and needle in err, err
    assert list(tmp_path.iterdir()) == []


def test_bad_paths_and_rows_are_one_line_exit_2(tmp_path):
    err = one_line_error(aisim(*CONVERT, "nope.jsonl", "out.jsonl", cwd=tmp_path))
    assert "error: IN: trace 'nope.jsonl' not found" in err
    err = one_line_error(aisim(*CONVERT, SLICE, "missing/out.jsonl", cwd=tmp_path))
    assert "error: OUT: directory missing does not exist" in err
    err = one_line_error(aisim(*CONVERT, SLICE, SLICE, cwd=tmp_path))
    assert "OUT:" in err and "is the input trace" in err
    err = one_line_error(aisim(*CONVERT, SLICE, "o.jsonl", "--split-at-seconds", "60", "--history-out", "o.jsonl",
                               cwd=tmp_path))
    assert "--history-out: o.jsonl is given for both outputs" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 4000, "output_length": 1, "hash_ids": [1]}\n')
    err = one_line_error(aisim(*CONVERT, bad, "o.jsonl", "--block-size", "64", cwd=tmp_path))
    assert f"{bad}:1: input_length 4000 exceeds hash_ids capacity 64" in err
    assert "convert with the block size the trace was made with (now 64)" in err
    bad.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1], "session_id": 7}\n')
    err = one_line_error(aisim(*CONVERT, bad, "o.jsonl", cwd=tmp_path))
    assert f"{bad}:1: multi-turn rows (session_id) cannot be converted" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]  # nothing written, no temporary left


def test_failed_conversion_keeps_the_previous_output(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text("previous\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    err = one_line_error(aisim(*CONVERT, bad, out))
    assert f"{bad}:1: invalid JSON" in err
    assert out.read_text() == "previous\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "out.jsonl"]
