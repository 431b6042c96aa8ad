"""Fuzz: valid configs and traces, mutated (types, ranges, keys, encodings, truncation), through
the command line in process. Every case ends in exactly one of:

- exit 0 with a complete report (prediction.json parses and counts every request);
- exit 1, 2 or 3 with one line on stderr and no traceback; a report written with exit 1 (no
  request completed) is complete, and no other failure leaves anything in the output directory.

The cases are seeded (same cases every run) and small (a 40-request trace), so a few hundred
run in well under a minute.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest
import yaml

from aisim.cli import main
from tests.conftest import SLICE

NUM_CONFIG_CASES = 160
NUM_TRACE_CASES = 120

BASE = {
    "traffic": {"source": {"type": "trace", "format": "mooncake", "paths": ["trace.jsonl"], "block_size": 512},
                "load": {"type": "trace_timestamps", "speedup": 4.0}},
    "engine": {"mode": "aggregated", "model": "meta-llama/Llama-3.1-8B-Instruct", "hardware": "h200_sxm",
               "backend": "vllm",
               "workers": {"aggregated": {"parallelism": {"replicas": 2, "tensor": 1},
                                          "scheduler": {"max_batched_tokens": 8192, "max_sequences": 64},
                                          "kv_cache": {"block_size": 64, "capacity": {"type": "fixed", "blocks": 8000}},
                                          "timing": {"type": "polynomial"}}}},
    "router": {"policy": "round_robin"},
    "evaluation": {"sla": {"ttft_ms": 2000, "itl_ms": 50}},
}
ODD_VALUES = [0, -1, 1, 3, 2**40, 0.5, -0.0, 1e300, float("nan"), True, False, None, "", "x", "12", [], [1, 2], {},
              {"a": 1}, "max", "auto", "\u00e9\u4e2d", "1e3"]


def _leaves(node, prefix=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, prefix + (k,))
            yield prefix + (k,)
    elif isinstance(node, list):
        yield prefix


def _set(node, path, value):
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value


def _delete(node, path):
    for k in path[:-1]:
        node = node[k]
    del node[path[-1]]


def mutate_config(rng: random.Random) -> str:
    cfg = copy.deepcopy(BASE)
    paths = sorted(set(_leaves(cfg)))
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(paths)
        op = rng.random()
        try:
            if op < 0.6:
                _set(cfg, path, rng.choice(ODD_VALUES))
            elif op < 0.75:
                _delete(cfg, path)
            elif op < 0.9:
                _set(cfg, path[:-1] + (path[-1] + "_typo",), 1)
            else:
                _set(cfg, path[:-1] + ("unknown_key",), {"nested": [1, 2]})
        except (KeyError, TypeError):
            pass
    text = yaml.safe_dump(cfg, allow_unicode=True)
    r = rng.random()
    if r < 0.08:
        text = text[: rng.randint(0, len(text))]  # truncated
    elif r < 0.12:
        text = text + "\nengine: {model: again}\n"  # a duplicate top-level key
    elif r < 0.15:
        text = "\ufeff" + text  # a byte-order mark
    return text


def mutate_trace(rng: random.Random, rows: list[dict]) -> bytes:
    rows = copy.deepcopy(rows)
    for _ in range(rng.randint(1, 3)):
        row = rng.choice(rows)
        key = rng.choice(["timestamp", "input_length", "output_length", "hash_ids", "extra"])
        op = rng.random()
        if op < 0.5:
            row[key] = rng.choice(ODD_VALUES)
        elif op < 0.7:
            row.pop(key, None)
        else:
            row[key] = [rng.randint(-5, 5)] * rng.randint(0, 3)
    lines = []
    for row in rows:
        try:
            lines.append(json.dumps(row, allow_nan=True))
        except (TypeError, ValueError):
            lines.append("{not json")
    data = ("\n".join(lines) + "\n").encode()
    r = rng.random()
    if r < 0.15:
        data = data[: rng.randint(0, len(data))]  # truncated mid-row
    elif r < 0.22:
        data = data.replace(b'"', b"\xff", 1)  # not UTF-8
    elif r < 0.27:
        data = b""  # empty
    elif r < 0.32:
        data = data + b"garbage\n"
    return data


def run_case(tmp: Path, config_text: str, trace: bytes, capsys) -> None:
    (tmp / "trace.jsonl").write_bytes(trace)
    (tmp / "c.yaml").write_text(config_text, encoding="utf-8")
    out = tmp / "out"
    capsys.readouterr()
    code = main(["predict", "-c", str(tmp / "c.yaml"), "--output-dir", str(out), "--format", "json"])
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "Traceback" not in captured.err and "Traceback" not in captured.out
    written = sorted(p.name for p in out.iterdir()) if out.exists() else []
    if code == 0:
        report = json.loads((out / "prediction.json").read_text())
        s = report["summary"]
        assert s["num_requests"] == s["completed_requests"] + s["rejected_requests"] + s["incomplete_requests"]
        return
    assert code in (1, 2, 3), (code, err)
    errors = [line for line in err.splitlines() if "warning" not in line]
    assert len(errors) == 1, err
    if "prediction.json" in written:  # only a run that ended with no completed request writes its report
        assert code == 1
        json.loads((out / "prediction.json").read_text())
    else:
        assert [n for n in written if not n.startswith(".")] == [], written


def _rows() -> list[dict]:
    return [json.loads(line) for line in SLICE.read_text().splitlines()[:40]]


@pytest.mark.parametrize("seed", range(NUM_CONFIG_CASES))
def test_a_mutated_config_runs_or_fails_in_one_line(seed, tmp_path, capsys):
    rng = random.Random(seed)
    rows = _rows()
    trace = ("\n".join(json.dumps(r) for r in rows) + "\n").encode()
    run_case(tmp_path, mutate_config(rng), trace, capsys)


@pytest.mark.parametrize("seed", range(NUM_TRACE_CASES))
def test_a_mutated_trace_runs_or_fails_in_one_line(seed, tmp_path, capsys):
    rng = random.Random(10_000 + seed)
    run_case(tmp_path, yaml.safe_dump(BASE), mutate_trace(rng, _rows()), capsys)
