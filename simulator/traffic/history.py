"""The recorded history of a retune replay: the Dynamo request trace the load predictor warms from
(``load_predictor_warmup_trace``), checked against the replayed workload when a plan is built
(never while a config is validated: the config models read no files).
"""

from __future__ import annotations

import gzip
import json
from typing import Any

import numpy as np

from aisim.simulator.errors import InputError


def _first_row(path) -> tuple[Any, int]:
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        return json.loads(line), n
                    except ValueError:
                        return None, n
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise InputError(str(path), f"cannot read trace: {exc}") from None
    return None, 0


def history_end_ms(spec: str, where: str) -> float:
    """When the recorded history ``spec`` ends, in its absolute milliseconds: the latest request end
    (start + ``total_time_ms``; the start where no total time is recorded). It must be a Dynamo
    request trace (its first row's ``schema``); paths resolve against the working directory."""
    from aisim.simulator.traffic.traces import DYNAMO_SCHEMA, read_dynamo, resolve_trace_paths

    paths = resolve_trace_paths([spec], where)
    for p in paths:
        row, n = _first_row(p)
        schema = row.get("schema") if isinstance(row, dict) else None
        if schema != DYNAMO_SCHEMA:
            raise InputError(where, f"is not a Dynamo request trace ({p}:{n} has schema {schema!r}, not "
                                    f"{DYNAMO_SCHEMA!r}); with throughput scaling retune reads it as its recorded "
                                    "history: give a dynamo trace (aisim trace convert --split-at-seconds S "
                                    "--history-out H converts and splits a mooncake trace)")
    try:
        w = read_dynamo(paths)
    except InputError as exc:
        raise type(exc)(where, f"{exc.where}: {exc.message}", category=exc.category) from None
    total = np.zeros(len(w)) if w.recorded_total_ms is None else np.nan_to_num(w.recorded_total_ms, nan=0.0)
    return float(w.origin_ms + np.max(w.timestamp_ms + total))


def check_history(pp, replay, field: str) -> None:
    """With throughput scaling, ``load_predictor_warmup_trace`` is retune's recorded history: a
    Dynamo request trace that ends at or before the first request of ``replay`` (the replayed
    workload), on the same absolute timestamps. ``pp``: the ``PlannerPlan`` (its resolved retune)."""
    rc = pp.retune
    if rc is None or rc.history_seconds is None:  # resolved: set exactly when throughput scaling runs
        return
    where = f"{field}.load_predictor_warmup_trace"
    if not pp.warmup_trace:
        raise InputError(where, "retune with throughput scaling reads the load-predictor history from it; set it to a "
                                "Dynamo request trace that ends at or before the first replayed request (aisim trace "
                                "convert --split-at-seconds S --history-out H writes one)")
    end = history_end_ms(pp.warmup_trace, where)
    first = float(replay.origin_ms)
    if end > first:
        raise InputError(where, f"the history must end at or before the first replayed request on the same absolute "
                                f"timestamps: its last request ends at {end:g} ms, the replay's first request starts "
                                f"at {first:g} ms; give the part of the recorded trace before the replay (aisim trace "
                                "convert --split-at-seconds S --history-out H)")
