"""Capacity-search SLA rules (seed "SLA rules", reference §8.3): pure functions over the rows of
a trial's ``request_metrics.csv`` and ``worker_timeline.csv`` (``csv.DictReader`` rows: dicts of
strings; numbers are accepted too). Nothing here reads a file.

A rule ``{metric, quantile, threshold, op}`` passes when ``value <op> threshold``, where value is:

- Request metrics (``REQUEST_METRICS``): the plain quantile over the trial's requests, linear
  interpolation (numpy's default ``"linear"``, Hyndman & Fan type 7). ``request_scheduling_delay``
  is in seconds (arrival to first admission into a running batch); the others in ms, ``itl_ms``
  being each request's mean inter-token gap. A request whose ``status`` is not ``completed``
  (``rejected``, ``incomplete``) never completed: it enters the quantile as +inf AND fails the
  rule whatever the value (a trial that drops requests never passes a latency rule). A completed
  request with an empty value (e.g. no ``itl_ms`` for a one-token output) is left out. No value
  at all (no completed request) -> value None, failed.
- Queue metrics (``QUEUE_METRICS``, from ``worker_timeline.csv``): per worker, the
  ``duration_s``-weighted quantile (``weighted_quantile``) of the piecewise-constant signal; the
  value is the worst (max) worker's. Workers without positive duration are skipped; none left
  -> value None, failed. The columns ``queue_depth_waiting`` / ``queue_depth_running`` may also
  be named ``waiting`` / ``running`` (the ``aisim predict --capture-worker-timeline`` names).

``evaluate_rules`` returns ``(all passed, [{metric, quantile, op, threshold, value, passed}])``
in rule order; an empty rule list passes. A value may be ``inf`` (JSON writers must cope).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from aisim.simulator.metrics.timeline import weighted_quantile  # the project's one duration-weighted quantile

__all__ = [
    "REQUEST_METRICS",
    "QUEUE_METRICS",
    "KNOWN_METRICS",
    "OPS",
    "SlaRule",
    "quantile",
    "weighted_quantile",
    "request_metric_values",
    "queue_metric_value",
    "evaluate_rules",
    "evaluate_columns",
]

REQUEST_METRICS = ("request_scheduling_delay", "ttft_ms", "tpot_ms", "itl_ms", "e2e_latency_ms")
QUEUE_METRICS = ("queue_depth_waiting", "queue_depth_running", "kv_usage")
KNOWN_METRICS = REQUEST_METRICS + QUEUE_METRICS
OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt, "==": operator.eq}

# worker_timeline.csv column names accepted per queue metric, in order of preference
_QUEUE_COLUMNS = {
    "queue_depth_waiting": ("queue_depth_waiting",),
    "queue_depth_running": ("queue_depth_running",),
    "kv_usage": ("kv_usage",),
}


def _unknown_metric(metric) -> ValueError:
    return ValueError(f"unknown SLA metric {metric!r}; known metrics: {', '.join(KNOWN_METRICS)}")


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_q(q) -> float:
    if not _is_number(q) or not 0.0 <= q <= 1.0:  # NaN fails the comparison
        raise ValueError(f"quantile must be a number in [0, 1], not {q!r}")
    return float(q)


@dataclass(frozen=True)
class SlaRule:
    metric: str
    quantile: float
    threshold: float
    op: str

    def __post_init__(self) -> None:
        if self.metric not in KNOWN_METRICS:
            raise _unknown_metric(self.metric)
        object.__setattr__(self, "quantile", _check_q(self.quantile))
        if not _is_number(self.threshold) or math.isnan(self.threshold):
            raise ValueError(f"threshold must be a number, not {self.threshold!r}")
        object.__setattr__(self, "threshold", float(self.threshold))
        if self.op not in OPS:
            raise ValueError(f"unknown SLA op {self.op!r}; known ops: {', '.join(OPS)}")

    @property
    def kind(self) -> str:
        """``"request"`` (request_metrics.csv) or ``"queue"`` (worker_timeline.csv)."""
        return "request" if self.metric in REQUEST_METRICS else "queue"

    def check(self, value: float | None) -> bool:
        """``value <op> threshold``; None never passes."""
        return value is not None and bool(OPS[self.op](value, self.threshold))


def quantile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile with linear interpolation, as ``numpy.quantile(values, q)`` (method
    ``"linear"``): sorted ``x``, ``h = (n - 1) q``, ``i = floor(h)``, ``g = h - i``,
    ``x[i] + (x[i+1] - x[i]) g`` (numpy's two-sided form, so results match it bit for bit).
    ``+inf`` values are allowed: a quantile that interpolates towards one is ``inf``."""
    q = _check_q(q)
    x = sorted(float(v) for v in values)
    if not x:
        raise ValueError("quantile of no values")
    if any(math.isnan(v) for v in x):
        raise ValueError("quantile of NaN")
    n = len(x)
    h = (n - 1) * q
    i = math.floor(h)
    if i >= n - 1:
        return x[-1]
    g = h - i
    a, b = x[i], x[i + 1]
    if g == 0 or a == b:
        return a
    if math.isinf(b):
        return b
    d = b - a
    return b - d * (1 - g) if g >= 0.5 else a + d * g


def _number(raw) -> float | None:
    """A CSV cell as a float; empty / None / NaN -> None (missing)."""
    if raw is None:
        return None
    if _is_number(raw):
        x = float(raw)
    else:
        s = str(raw).strip()
        if not s:
            return None
        try:
            x = float(s)
        except ValueError:
            raise ValueError(f"not a number: {raw!r}") from None
    return None if math.isnan(x) else x


def _check_request_metric(metric: str) -> None:
    if metric not in REQUEST_METRICS:
        if metric in QUEUE_METRICS:
            raise ValueError(f"{metric!r} is a queue metric (worker_timeline.csv), not a request metric; "
                             f"request metrics: {', '.join(REQUEST_METRICS)}")
        raise _unknown_metric(metric)


def _check_queue_metric(metric: str) -> None:
    if metric not in QUEUE_METRICS:
        if metric in REQUEST_METRICS:
            raise ValueError(f"{metric!r} is a request metric (request_metrics.csv), not a queue metric; "
                             f"queue metrics: {', '.join(QUEUE_METRICS)}")
        raise _unknown_metric(metric)


def _request_columns(rows: list, metric: str) -> dict:
    """The ``status`` and ``metric`` columns of ``request_metrics.csv`` rows (mappings); a
    row without a ``status`` column, or a completed one without ``metric``, is an error."""
    status, values = [], []
    for n, row in enumerate(rows):
        if "status" not in row:
            raise ValueError(f"request_metrics row {n} has no 'status' column")
        s = str(row["status"]).strip().lower()
        if s == "completed" and metric not in row:
            raise ValueError(f"request_metrics row {n} has no {metric!r} column")
        status.append(s)
        values.append(row.get(metric))
    return {"status": status, metric: values}


def _timeline_columns(rows: list, metric: str) -> dict:
    """The ``worker_id``, ``duration_s`` and ``metric`` columns of ``worker_timeline.csv`` rows
    (mappings); a row without one of them is an error."""
    workers, durations, values = [], [], []
    for n, row in enumerate(rows):
        column = next((c for c in _QUEUE_COLUMNS[metric] if c in row), None)
        if column is None:
            raise ValueError(f"worker_timeline row {n} has no {' / '.join(_QUEUE_COLUMNS[metric])} column")
        for key in ("worker_id", "duration_s"):
            if key not in row:
                raise ValueError(f"worker_timeline row {n} has no {key!r} column")
        workers.append(row["worker_id"])
        durations.append(row["duration_s"])
        values.append(row[column])
    return {"worker_id": workers, "duration_s": durations, metric: values}


def _numbers(cells) -> list[float | None]:
    """``_number`` of each cell."""
    out = []
    for c in cells:
        k = c.__class__
        if k is float:
            out.append(None if c != c else c)
        elif k is int:
            out.append(float(c))
        else:
            out.append(_number(c))
    return out


def _request_values(columns: Mapping, metric: str) -> tuple[list[float], int]:
    status = columns["status"]
    cells = [c for s, c in zip(status, columns[metric]) if s == "completed"]  # (only these are read)
    return [x for x in _numbers(cells) if x is not None], len(status) - len(cells)


def _floats(cells) -> np.ndarray:
    """``_number`` of each cell as float64, a missing one NaN."""
    if set(map(type, cells)) <= {float, int}:  # (the simulator's own rows: numbers only)
        return np.array(cells, dtype=np.float64)
    return np.array(_numbers(cells), dtype=np.float64)


def _queue_value(columns: Mapping, metric: str, q: float) -> float | None:
    workers = columns["worker_id"]
    if set(map(type, workers)) != {int}:  # (worker ids as the CSV text has them)
        workers = [str(w).strip() for w in workers]
    x = _floats(columns[metric])
    d = _floats(columns["duration_s"])
    if not len(x):
        return None
    keep = ~(np.isnan(x) | np.isnan(d))  # (missing values are left out)
    ids, which = np.unique(np.asarray(workers)[keep], return_inverse=True)
    x, d = x[keep], d[keep]
    best: float | None = None
    for k in range(len(ids)):
        mine = which == k
        v = weighted_quantile(x[mine], d[mine], q)
        if v is not None and (best is None or v > best):
            best = v
    return best


def request_metric_values(rows: Iterable[Mapping], metric: str) -> tuple[list[float], int]:
    """``(values of the completed requests, number of requests that never completed)`` for a
    request metric over ``request_metrics.csv`` rows. A request never completed when its
    ``status`` is anything but ``completed``; a completed request with an empty value is left
    out of both. A row without a ``status`` or ``metric`` column is an error."""
    _check_request_metric(metric)
    return _request_values(_request_columns(list(rows), metric), metric)


def queue_metric_value(rows: Iterable[Mapping], metric: str, q: float) -> float | None:
    """The worst (max) worker's ``duration_s``-weighted ``q`` quantile of a queue metric over
    ``worker_timeline.csv`` rows (grouped by ``worker_id``); rows with an empty value are left
    out; None when no worker has positive duration."""
    _check_queue_metric(metric)
    q = _check_q(q)
    return _queue_value(_timeline_columns(list(rows), metric), metric, q)


def evaluate_rules(rules: Iterable[SlaRule], request_rows: Iterable[Mapping] | None,
                   timeline_rows: Iterable[Mapping] | None) -> tuple[bool, list[dict]]:
    """``(every rule passed, [{metric, quantile, op, threshold, value, passed}])`` in rule order.

    Latency rules: value = the quantile over the completed requests' values plus one ``+inf``
    per request that never completed; a rule fails whenever any request never completed (even
    if the value passes), and has value None (failed) when there is no value at all. Queue rules:
    ``queue_metric_value`` (None -> failed). Missing rows (None) count as no rows."""
    request_rows = list(request_rows or [])
    timeline_rows = list(timeline_rows or [])
    rules = list(rules)
    request_columns: dict = {}
    timeline_columns: dict = {}
    for rule in rules:
        if isinstance(rule, SlaRule) and rule.metric not in request_columns and rule.metric not in timeline_columns:
            if rule.kind == "request":
                request_columns.update(_request_columns(request_rows, rule.metric))
            else:
                timeline_columns.update(_timeline_columns(timeline_rows, rule.metric))
    return evaluate_columns(rules, request_columns, timeline_columns)


def evaluate_columns(rules: Iterable[SlaRule], request_columns: Mapping, timeline_columns: Mapping
                     ) -> tuple[bool, list[dict]]:
    """``evaluate_rules`` on columns: ``request_columns`` maps ``status`` and each request
    rule's metric, ``timeline_columns`` ``worker_id``, ``duration_s`` and each queue rule's
    metric, to a column of cells (numbers, or CSV text; a status is ``completed`` exactly), as
    a capacity trial's rows give them without a dict per row."""
    results = []
    cache: dict[str, tuple[list[float], int]] = {}
    for rule in rules:
        if not isinstance(rule, SlaRule):
            raise TypeError(f"expected an SlaRule, not {type(rule).__name__}")
        if rule.kind == "request":
            if rule.metric not in cache:
                cache[rule.metric] = (_request_values(request_columns, rule.metric)
                                      if request_columns.get("status") else ([], 0))
            values, never = cache[rule.metric]
            if values:
                value = quantile(values + [math.inf] * never, rule.quantile)
                passed = never == 0 and rule.check(value)
            else:
                value, passed = None, False
        else:
            value = _queue_value(timeline_columns, rule.metric, rule.quantile) \
                if timeline_columns.get("worker_id") else None
            passed = rule.check(value)
        results.append({"metric": rule.metric, "quantile": rule.quantile, "op": rule.op,
                        "threshold": rule.threshold, "value": value, "passed": passed})
    return all(r["passed"] for r in results), results
