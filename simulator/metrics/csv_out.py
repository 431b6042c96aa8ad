"""CSV outputs: ``request_metrics.csv`` (one row per request) and ``worker_timeline.csv`` (one row
per worker state interval, ``simulator.metrics.timeline.write_csv``).

``aisim predict --output-dir D --csv`` writes both (``write_csv_outputs``); a capacity search writes
them from a ``ReplayReport`` of a plan with ``capture_per_request`` and ``capture_worker_timeline``::

    write_request_csv(path, report.per_request)
    simulator.metrics.timeline.write_csv(path, report.timelines)

``request_metrics.csv`` (``REQUEST_CSV_COLUMNS``), from the per-request records (``requests.jsonl``
keys in brackets); times in seconds from the first arrival, latencies in milliseconds; an empty cell
where the value does not exist:

- ``request_id`` [``uuid``], ``status`` [``terminal_status``: completed, rejected or incomplete],
  ``worker_id`` [``decode_worker_idx``: the worker that generated the tokens; empty if never routed],
- ``arrival_time_s`` [``arrival_time_ms`` / 1000], ``first_admit_time_s`` [``first_admit_ms``: first
  admission into a running batch], ``first_token_time_s`` [``first_token_ms``], ``last_token_time_s``
  [``last_token_ms``], each / 1000,
- ``input_tokens`` [``input_length``], ``output_tokens`` [``output_length``: tokens generated],
  ``reused_input_tokens`` [``reused_input_tokens``: prefix-cache hit, the largest over admissions],
- the metrics, only for a completed request (the requests the summary's latency statistics count;
  empty for a rejected or incomplete one):
  ``request_scheduling_delay`` = (``first_admit_ms`` - ``arrival_time_ms``) / 1000, in seconds;
  ``ttft_ms`` = ``first_token_ms`` - ``arrival_time_ms``;
  ``tpot_ms`` = (``last_token_ms`` - ``first_token_ms``) / (``output_length`` - 1), empty for a
  single-token output;
  ``itl_ms`` = the request's mean inter-token gap [``itl_ms``] (the same value as ``tpot_ms``);
  ``e2e_latency_ms`` = ``last_token_ms`` - ``arrival_time_ms``.

With a Planner in the loop, ``--csv`` also writes ``planner_events.csv`` (``PLANNER_EVENT_COLUMNS``:
one row per scaling decision, from prediction.json's ``planner.scaling_events``: ``time_s``,
``component``, ``from_count``, ``to_count``, ``reason``) and ``planner_replicas.csv``
(``PLANNER_REPLICA_COLUMNS``: the replica count over time, one row per lifecycle batch from
``planner.lifecycle_operations``: ``time_s``, ``pool``, ``active``, ``starting``, ``draining``,
``cause``; each row holds until the pool's next one).

Rows follow the records' order (``ReplayReport.per_request`` is sorted by arrival, then uuid) and
are formatted one at a time as the file is written.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from pathlib import Path

from aisim.simulator.metrics.output import atomic_write_csv
from aisim.simulator.metrics.timeline import write_csv as write_timeline_csv

REQUEST_CSV = "request_metrics.csv"
TIMELINE_CSV = "worker_timeline.csv"

REQUEST_CSV_COLUMNS = (
    "request_id", "status", "worker_id", "arrival_time_s", "first_admit_time_s", "first_token_time_s",
    "last_token_time_s", "input_tokens", "output_tokens", "reused_input_tokens", "request_scheduling_delay",
    "ttft_ms", "tpot_ms", "itl_ms", "e2e_latency_ms",
)


def _num(x) -> float | None:
    """A finite number, or None (missing, null, NaN, inf)."""
    if x.__class__ is float:  # (the usual case, the short way: inf - inf and nan - nan are nan)
        return x if x - x == 0.0 else None
    if x is None or isinstance(x, bool):
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _cell(x):
    return "" if x is None else x


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def request_row(rec: dict) -> tuple:
    """One ``request_metrics.csv`` row (``REQUEST_CSV_COLUMNS``) from a per-request record."""
    return row_of(rec.get("uuid"), rec.get("terminal_status"), rec.get("decode_worker_idx"), rec.get("arrival_time_ms"),
                  rec.get("first_admit_ms"), rec.get("first_token_ms"), rec.get("last_token_ms"),
                  rec.get("input_length"), rec.get("output_length"), rec.get("reused_input_tokens"),
                  rec.get("itl_ms"))


def row_of(uuid, status, worker, arrival_ms, admit_ms, first_ms, last_ms, input_len, n, reused, itl_ms) -> tuple:
    """One ``request_metrics.csv`` row from the record's fields (``request_row``; the metrics
    collector calls it directly when it keeps rows and no records)."""
    arrival = _num(arrival_ms)
    admit = _num(admit_ms)
    first = _num(first_ms)
    last = _num(last_ms)
    delay = ttft = tpot = itl = e2e = None
    if status == "completed":
        d = _diff(admit, arrival)
        delay = None if d is None else d / 1000.0
        ttft = _diff(first, arrival)
        gen = _diff(last, first)
        if gen is not None and isinstance(n, int) and n >= 2:
            tpot = gen / (n - 1)
        itl = _num(itl_ms)
        if itl is None:
            itl = tpot
        e2e = _diff(last, arrival)
    return ("" if uuid is None else uuid, "" if status is None else status, "" if worker is None else worker,
            "" if arrival is None else arrival / 1000.0, "" if admit is None else admit / 1000.0,
            "" if first is None else first / 1000.0, "" if last is None else last / 1000.0,
            "" if input_len is None else input_len, "" if n is None else n, "" if reused is None else reused,
            "" if delay is None else delay, "" if ttft is None else ttft, "" if tpot is None else tpot,
            "" if itl is None else itl, "" if e2e is None else e2e)


def request_rows(records: Iterable[dict]) -> Iterator[tuple]:
    """``request_row`` of every record, in order, made as they are consumed."""
    return (request_row(r) for r in records)


def write_request_csv(path, records: Iterable[dict]) -> None:
    """Write ``request_metrics.csv`` (``REQUEST_CSV_COLUMNS``) from per-request records (e.g.
    ``ReplayReport.per_request``), row by row, atomically (temporary sibling, fsync, rename)."""
    atomic_write_csv(Path(path), REQUEST_CSV_COLUMNS, request_rows(records))


def write_csv_outputs(directory, per_request: Iterable[dict], timelines, planner: dict | None = None) -> None:
    """``request_metrics.csv`` and ``worker_timeline.csv`` in ``directory`` (and, with a Planner
    report, ``planner_events.csv`` and ``planner_replicas.csv``)."""
    directory = Path(directory)
    write_request_csv(directory / REQUEST_CSV, per_request)
    write_timeline_csv(directory / TIMELINE_CSV, timelines)
    if planner:
        write_planner_csv(directory, planner)


PLANNER_EVENTS_CSV = "planner_events.csv"
PLANNER_REPLICAS_CSV = "planner_replicas.csv"
PLANNER_EVENT_COLUMNS = ("time_s", "component", "from_count", "to_count", "reason")
PLANNER_REPLICA_COLUMNS = ("time_s", "pool", "active", "starting", "draining", "cause")


def write_planner_csv(directory, planner: dict) -> None:
    """``planner_events.csv`` and ``planner_replicas.csv`` from a Planner report (module docstring)."""
    directory = Path(directory)
    events = ((_cell(e.get("at_s")), e.get("component", ""), e.get("from_count", ""), e.get("to_count", ""),
               e.get("reason", "")) for e in planner.get("scaling_events") or ())
    atomic_write_csv(directory / PLANNER_EVENTS_CSV, PLANNER_EVENT_COLUMNS, events)
    rows = []
    for op in planner.get("lifecycle_operations") or ():
        state = op.get("state_after_batch") or {}
        rows.append((_cell(op["at_ms"] / 1000.0), op.get("pool", ""), state.get("active", ""),
                     state.get("starting", ""), state.get("draining", ""), op.get("cause", "")))
    atomic_write_csv(directory / PLANNER_REPLICAS_CSV, PLANNER_REPLICA_COLUMNS, rows)
