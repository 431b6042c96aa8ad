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


def request_metric_values(rows: Iterable[Mapping], metric: str) -> tuple[list[float], int]:
    """``(values of the completed requests, number of requests that never completed)`` for a
    request metric over ``request_metrics.csv`` rows. A request never completed when its
    ``status`` is anything but ``completed``; a completed request with an empty value is left
    out of both. A row without a ``status`` or ``metric`` column is an error."""
    if metric not in REQUEST_METRICS:
        if metric in QUEUE_METRICS:
            raise ValueError(f"{metric!r} is a queue metric (worker_timeline.csv), not a request metric; "
                             f"request metrics: {', '.join(REQUEST_METRICS)}")
        raise _unknown_metric(metric)
    values: list[float] = []
    never = 0
    for n, row in enumerate(rows):
        if "status" not in row:
            raise ValueError(f"request_metrics row {n} has no 'status' column")
        if str(row["status"]).strip().lower() != "completed":
            never += 1
            continue
        if metric not in row:
            raise ValueError(f"request_metrics row {n} has no {metric!r} column")
        x = _number(row[metric])
        if x is not None:
            values.append(x)
    return values, never


def queue_metric_value(rows: Iterable[Mapping], metric: str, q: float) -> float | None:
    """The worst (max) worker's ``duration_s``-weighted ``q`` quantile of a queue metric over
    ``worker_timeline.csv`` rows (grouped by ``worker_id``); rows with an empty value are left
    out; None when no worker has positive duration."""
    if metric not in QUEUE_METRICS:
        if metric in REQUEST_METRICS:
            raise ValueError(f"{metric!r} is a request metric (request_metrics.csv), not a queue metric; "
                             f"queue metrics: {', '.join(QUEUE_METRICS)}")
        raise _unknown_metric(metric)
    q = _check_q(q)
    per_worker: dict[str, tuple[list[float], list[float]]] = {}
    for n, row in enumerate(rows):
        column = next((c for c in _QUEUE_COLUMNS[metric] if c in row), None)
        if column is None:
            raise ValueError(f"worker_timeline row {n} has no {' / '.join(_QUEUE_COLUMNS[metric])} column")
        for key in ("worker_id", "duration_s"):
            if key not in row:
                raise ValueError(f"worker_timeline row {n} has no {key!r} column")
        x = _number(row[column])
        d = _number(row["duration_s"])
        if x is None or d is None:
            continue
        vs, ws = per_worker.setdefault(str(row["worker_id"]).strip(), ([], []))
        vs.append(x)
        ws.append(d)
    best: float | None = None
    for vs, ws in per_worker.values():
        x = weighted_quantile(vs, ws, q)
        if x is not None and (best is None or x > best):
            best = x
    return best


def evaluate_rules(rules: Iterable[SlaRule], request_rows: Iterable[Mapping] | None,
                   timeline_rows: Iterable[Mapping] | None) -> tuple[bool, list[dict]]:
    """``(every rule passed, [{metric, quantile, op, threshold, value, passed}])`` in rule order.

    Latency rules: value = the quantile over the completed requests' values plus one ``+inf``
    per request that never completed; a rule fails whenever any request never completed (even
    if the value passes), and has value None (failed) when there is no value at all. Queue rules:
    ``queue_metric_value`` (None -> failed). Missing rows (None) count as no rows."""
    request_rows = list(request_rows or [])
    timeline_rows = list(timeline_rows or [])
    cache: dict[str, tuple[list[float], int]] = {}
    results = []
    for rule in rules:
        if not isinstance(rule, SlaRule):
            raise TypeError(f"expected an SlaRule, not {type(rule).__name__}")
        if rule.kind == "request":
            if rule.metric not in cache:
                cache[rule.metric] = request_metric_values(request_rows, rule.metric)
            values, never = cache[rule.metric]
            if values:
                value = quantile(values + [math.inf] * never, rule.quantile)
                passed = never == 0 and rule.check(value)
            else:
                value, passed = None, False
        else:
            value = queue_metric_value(timeline_rows, rule.metric, rule.quantile)
            passed = rule.check(value)
        results.append({"metric": rule.metric, "quantile": rule.quantile, "op": rule.op,
                        "threshold": rule.threshold, "value": value, "passed": passed})
    return all(r["passed"] for r in results), results
