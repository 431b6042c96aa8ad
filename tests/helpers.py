"""Small builders shared by the scenario tests."""

from __future__ import annotations

import json
from pathlib import Path

from aisim import run_trace_replay

WALL = ("wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s")


def write_trace(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def replay_rows(tmp_path: Path, rows: list[dict], engine: dict, **kw):
    trace = write_trace(tmp_path / "trace.jsonl", rows)
    kw.setdefault("capture_per_request", True)
    return run_trace_replay(str(trace), extra_engine_args=engine, **kw)


def by_uuid(report) -> dict[str, dict]:
    return {r["uuid"]: r for r in report.per_request}


def without_wall(d: dict) -> dict:
    s = dict(d["summary"])
    for k in WALL:
        s.pop(k, None)
    return {**d, "summary": s}
