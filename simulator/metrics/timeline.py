"""Per-worker timelines: waiting-queue depth, running-batch size and KV-cache usage over time.

An ``EngineWorker`` built with ``record_timeline=True`` samples its state (summed over its
attention-data ranks) after every event that can change it; ``WorkerHost.finish`` returns the
samples as plain data (``out["timelines"]``), which ``WorkerTimeline.from_plain`` reads.

Semantics: the state is piecewise constant. Sample ``i`` holds on ``[times_ms[i],
times_ms[i+1])``, the last one up to ``end_ms``; before the first sample the worker is idle
(0, 0, 0). The timeline covers the window ``[start_ms, end_ms)`` (by default the whole run:
``start_ms = 0``; a coordinator that knows a worker's lifetime narrows it with ``window``).
Within a fast-forwarded decode run the KV usage is sampled at the run's start and end only
(see ``actors.engine.worker``).

Metrics (names accepted by ``weighted_quantile``):

- ``waiting``: requests in the waiting queues (= ``queue_depth_waiting``),
- ``running``: requests in the running batches,
- ``kv_blocks_used``: KV blocks held by live requests,
- ``kv_usage``: ``kv_blocks_used / kv_blocks_total`` (a fraction in [0, 1]).

``worker_timeline.csv`` (``write_csv``, ``CSV_COLUMNS``): one row per interval of constant state,
by worker id then time: ``worker_id``, ``role`` (empty when unknown), ``start_s`` (interval start,
seconds from the first arrival), ``duration_s``, ``queue_depth_waiting``, ``queue_depth_running``,
``kv_blocks_used``, ``kv_usage``; written row by row.
"""

from __future__ import annotations

import bisect
import io
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np

from aisim.simulator.metrics.output import atomic_write_csv, csv_lines
from aisim.simulator.metrics.stats import weighted_sum
from aisim.simulator.spill import READ_ELEMENTS, ColumnFile, SpilledArray

#: samples a worker's timeline keeps in memory; past this its older samples go to scratch files
#: (``TimelineSpool``; tests lower it)
SPILL_SAMPLES = 1 << 16

METRICS = ("waiting", "running", "kv_blocks_used", "kv_usage")
CSV_COLUMNS = ("worker_id", "role", "start_s", "duration_s", "queue_depth_waiting", "queue_depth_running",
               "kv_blocks_used", "kv_usage")


class Interval(NamedTuple):
    start_ms: float
    duration_s: float
    waiting: int
    running: int
    kv_usage: float


def _column(data, dtype):
    """bytes (native-endian, as ``array.tobytes``) / array / list / ndarray -> a 1-d ndarray; a
    ``SpilledArray`` of that dtype stays one (read a chunk at a time)."""
    if isinstance(data, SpilledArray) and data.dtype == np.dtype(dtype):
        return data
    if isinstance(data, (bytes, bytearray, memoryview)):
        return np.frombuffer(data, dtype=dtype)
    return np.array(data, dtype=dtype)  # a copy: a view would pin an array.array's buffer


def _search(col, value: float, side: str) -> int:
    """``np.searchsorted`` on a sorted column (a spilled one by bisection, a value per read)."""
    if isinstance(col, np.ndarray):
        return int(np.searchsorted(col, value, side=side))
    return (bisect.bisect_right if side == "right" else bisect.bisect_left)(col, value)


def _in_order(times) -> bool:
    if isinstance(times, np.ndarray):
        return not (len(times) > 1 and bool(np.any(np.diff(times) < 0)))
    last = None
    for chunk in times.chunks():
        if len(chunk) and ((last is not None and chunk[0] < last) or bool(np.any(np.diff(chunk) < 0))):
            return False
        last = chunk[-1] if len(chunk) else last
    return True


class TimelineSpool:
    """A worker's older timeline samples in scratch files (``simulator.spill``), so a long
    replay's timelines do not stay in memory: the worker hands over its columns past ``limit``
    samples (``append``; it keeps the last two, which coalescing may rewrite) and, when exported,
    the rest (``columns``): the columns are then ``SpilledArray``s, which ``WorkerTimeline`` reads
    a chunk at a time to write ``worker_timeline.csv``."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = max(3, SPILL_SAMPLES if limit is None else int(limit))  # (the worker keeps two)
        self._files: tuple[ColumnFile, ...] | None = None
        self._frozen: tuple[SpilledArray, ...] | None = None

    @property
    def spilled(self) -> bool:
        return self._files is not None

    def append(self, times_ms, waiting, running, kv_blocks_used) -> None:
        """Samples (buffers of float64 / int64 values) after those appended before."""
        if self._frozen is not None:
            raise RuntimeError("the timeline was exported already")
        if self._files is None:
            self._files = (ColumnFile(np.float64), ColumnFile(np.int64), ColumnFile(np.int64), ColumnFile(np.int64))
        for f, col in zip(self._files, (times_ms, waiting, running, kv_blocks_used)):
            f.append(np.frombuffer(col, dtype=f.dtype))

    def columns(self, times_ms, waiting, running, kv_blocks_used) -> tuple:
        """Every sample: the spilled ones, then these (the worker's last ones), as the four
        columns; the given columns themselves when nothing was spilled. Once spilled, the first
        call appends them and later calls return the same columns."""
        if self._files is None:
            return times_ms, waiting, running, kv_blocks_used
        if self._frozen is None:
            self.append(times_ms, waiting, running, kv_blocks_used)
            self._frozen = tuple(f.freeze() for f in self._files)
        return self._frozen


class WorkerTimeline:
    """The recorded timeline of one worker (see the module doc)."""

    __slots__ = ("worker_id", "role", "times_ms", "waiting", "running", "kv_blocks_used", "kv_blocks_total",
                 "start_ms", "end_ms")

    def __init__(self, worker_id: int, role: str | None, times_ms, waiting, running, kv_blocks_used,
                 kv_blocks_total: int, end_ms: float, start_ms: float = 0.0) -> None:
        self.worker_id = int(worker_id)
        self.role = role
        self.times_ms = _column(times_ms, np.float64)
        self.waiting = _column(waiting, np.int64)
        self.running = _column(running, np.int64)
        self.kv_blocks_used = _column(kv_blocks_used, np.int64)
        self.kv_blocks_total = int(kv_blocks_total)
        self.start_ms = float(start_ms)
        self.end_ms = float(end_ms)
        n = len(self.times_ms)
        if not (len(self.waiting) == len(self.running) == len(self.kv_blocks_used) == n):
            raise ValueError("timeline columns differ in length")
        if not _in_order(self.times_ms):
            raise ValueError("timeline times are not in order")

    @property
    def spilled(self) -> bool:
        """Its columns live in scratch files (a long replay's, ``TimelineSpool``)."""
        return isinstance(self.times_ms, SpilledArray)

    # -- plain data -----------------------------------------------------------------------------
    @classmethod
    def from_plain(cls, data: dict, start_ms: float | None = None, end_ms: float | None = None) -> "WorkerTimeline":
        """From ``EngineWorker.export_timeline`` / ``to_plain`` data (columns as bytes, arrays or
        lists); ``start_ms`` / ``end_ms`` override the window stored there."""
        end = end_ms if end_ms is not None else data.get("end_ms")
        if end is None:
            raise ValueError("the timeline has no end time; pass end_ms")
        start = start_ms if start_ms is not None else (data.get("start_ms") or 0.0)
        return cls(data["worker_id"], data.get("role"), data["times_ms"], data["waiting"], data["running"],
                   data["kv_blocks_used"], data["kv_blocks_total"], end, start)

    def to_plain(self) -> dict:
        """msgpack-safe plain data (columns as native-endian bytes of float64 / int64)."""
        return {
            "worker_id": self.worker_id,
            "role": self.role,
            "times_ms": np.asarray(self.times_ms).tobytes(),
            "waiting": np.asarray(self.waiting).tobytes(),
            "running": np.asarray(self.running).tobytes(),
            "kv_blocks_used": np.asarray(self.kv_blocks_used).tobytes(),
            "kv_blocks_total": self.kv_blocks_total,
            "start_ms": self.start_ms,
            "end_ms": self.end_ms,
        }

    def window(self, start_ms: float, end_ms: float) -> "WorkerTimeline":
        """The same samples seen over another window (e.g. the worker's lifetime)."""
        return WorkerTimeline(self.worker_id, self.role, self.times_ms, self.waiting, self.running,
                              self.kv_blocks_used, self.kv_blocks_total, end_ms, start_ms)

    # -- intervals ------------------------------------------------------------------------------
    def _segments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(start_ms, duration_ms, waiting, running, kv_blocks_used) of the intervals of positive
        duration in ``[start_ms, end_ms)``."""
        parts = list(self._segment_chunks(None))
        if len(parts) == 1:
            return parts[0]
        return tuple(np.concatenate(cols) for cols in zip(*parts))

    def _segment_chunks(self, size: int | None) -> Iterator[tuple]:
        """``_segments`` in pieces of at most ``size`` samples (None: one piece): the same values,
        an interval's duration being the next interval's start (or ``end_ms``) minus its own."""
        t0, t1 = self.start_ms, self.end_ms
        times = self.times_ms
        if t1 <= t0:
            e = np.empty(0)
            ei = np.empty(0, dtype=np.int64)
            yield e, e, ei, ei, ei
            return
        # the state at t0: the last sample at or before it (idle before the first)
        i0 = _search(times, t0, "right")
        i1 = _search(times, t1, "left")  # samples at or after t1 never hold
        z = np.zeros(1, dtype=np.int64)
        if i0 > 0:
            first = (self.waiting[i0 - 1 : i0], self.running[i0 - 1 : i0], self.kv_blocks_used[i0 - 1 : i0])
        else:
            first = (z, z, z)
        a = i0
        while True:
            b = i1 if size is None else min(a + size, i1)
            starts, w, r, k = times[a:b], self.waiting[a:b], self.running[a:b], self.kv_blocks_used[a:b]
            if a == i0:  # (the interval from t0)
                starts = np.concatenate(([t0], starts))
                w = np.concatenate((first[0], w))
                r = np.concatenate((first[1], r))
                k = np.concatenate((first[2], k))
            dur = np.diff(np.concatenate((starts, [times[b] if b < i1 else t1])))
            keep = dur > 0
            if not keep.all():
                starts, dur, w, r, k = starts[keep], dur[keep], w[keep], r[keep], k[keep]
            yield starts, dur, w, r, k
            if b >= i1:
                return
            a = b

    def _usage(self, used: np.ndarray) -> np.ndarray:
        total = self.kv_blocks_total
        return used / total if total > 0 else np.zeros(len(used))

    def intervals(self) -> list[Interval]:
        """Per interval of constant state (positive duration, in time order) up to ``end_ms``:
        ``(start_ms, duration_s, waiting, running, kv_usage fraction)``."""
        starts, dur, w, r, k = self._segments()
        usage = self._usage(k)
        return [Interval(float(a), float(d) / 1000.0, int(x), int(y), float(u))
                for a, d, x, y, u in zip(starts, dur, w, r, usage)]

    def values(self, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """(value, duration_ms) of ``metric`` per interval."""
        starts, dur, w, r, k = self._segments()
        if metric == "waiting":
            v = w
        elif metric == "running":
            v = r
        elif metric == "kv_blocks_used":
            v = k
        elif metric == "kv_usage":
            v = self._usage(k)
        else:
            raise ValueError(f"unknown timeline metric {metric!r}; use one of {', '.join(METRICS)}")
        return v.astype(np.float64), dur

    # -- statistics -----------------------------------------------------------------------------
    def weighted_quantile(self, metric: str, q: float) -> float | None:
        """Duration-weighted quantile of ``metric`` with linear interpolation on the cumulative
        weight (None when the window has no duration). See ``weighted_quantile``."""
        v, d = self.values(metric)
        return weighted_quantile(v, d, q)

    def time_weighted_mean(self, metric: str) -> float | None:
        v, d = self.values(metric)
        total = float(d.sum())
        return weighted_sum(v, d) / total if total > 0 else None

    def iter_rows(self) -> Iterator[tuple]:
        """CSV rows, one per interval (``CSV_COLUMNS``), made as they are consumed (a spilled
        timeline a chunk of samples at a time)."""
        wid, role = self.worker_id, self.role or ""
        for starts, dur, w, r, k in self._segment_chunks(READ_ELEMENTS if self.spilled else None):
            usage = self._usage(k)
            for a, d, x, y, b, u in zip(starts.tolist(), dur.tolist(), w.tolist(), r.tolist(), k.tolist(),
                                        usage.tolist()):
                yield (wid, role, a / 1000.0, d / 1000.0, x, y, b, u)

    def to_rows(self) -> list[tuple]:
        """CSV rows, one per interval: ``CSV_COLUMNS``."""
        return list(self.iter_rows())


def weighted_quantile(values, weights, q: float) -> float | None:
    """Weighted quantile: the inverse of the weighted CDF linearly interpolated between the
    distinct values.

    Let ``v_1 < v_2 < ... < v_m`` be the distinct values, ``W_j`` the total weight (duration)
    at ``v_j`` (equal values are merged; zero weights dropped), ``W`` the total and
    ``F_j = (W_1 + ... + W_j) / W`` the fraction of the weight at values ``<= v_j``. The quantile
    interpolates linearly through the points ``(F_j, v_j)``, constant ``v_1`` below ``F_1``:

        Q(q) = v_1                                                      if q <= F_1
        Q(q) = v_{j-1} + (v_j - v_{j-1}) * (q - F_{j-1}) / (F_j - F_{j-1})    if F_{j-1} < q <= F_j

    ``Q(0)`` is the minimum, ``Q(1)`` the maximum, ``Q`` is continuous and non-decreasing in
    ``q``, and depends only on how long each value held (never on how the time is split into
    intervals). With distinct values of equal weight it is numpy's
    ``method="interpolated_inverted_cdf"`` (Hyndman & Fan type 4); the step-wise inverted CDF
    (numpy ``"inverted_cdf"``) would instead return the smallest ``v_j`` with ``F_j >= q``.
    Example: 0 for 3 s then 4 for 1 s: ``F = (0.75, 1)``: Q(0.5) = Q(0.75) = 0,
    Q(0.95) = 4 * 0.2 / 0.25 = 3.2 (the inverted CDF gives 4), Q(1) = 4.
    Returns None when the total weight is zero (or there are no values).
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    v = np.asarray(values, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if v.shape != w.shape:
        raise ValueError("values and weights differ in length")
    if np.any(w < 0):
        raise ValueError("negative weight")
    keep = w > 0
    if not keep.any():
        return None
    v, inverse = np.unique(v[keep], return_inverse=True)  # sorted distinct values
    c = np.cumsum(np.bincount(inverse.ravel(), weights=w[keep], minlength=len(v)))
    target = q * c[-1]
    i = min(int(np.searchsorted(c, target, side="left")), len(c) - 1)
    if i == 0:
        return float(v[0])
    lo, hi = c[i - 1], c[i]
    return float(v[i - 1] + (v[i] - v[i - 1]) * ((target - lo) / (hi - lo)))


def worst_worker_quantile(timelines: Iterable[WorkerTimeline | None], metric: str, q: float) -> float | None:
    """The rule's value: the largest per-worker ``weighted_quantile(metric, q)`` (workers without a
    timeline or without duration are skipped; None when none is left)."""
    best = None
    for tl in timelines:
        if tl is None:
            continue
        x = tl.weighted_quantile(metric, q)
        if x is not None and (best is None or x > best):
            best = x
    return best


def timeline_rows(timelines: Iterable[WorkerTimeline | None]) -> Iterator[tuple]:
    """Every worker's intervals (``CSV_COLUMNS``), by worker id then time; None entries skipped."""
    for tl in sorted((t for t in timelines if t is not None), key=lambda t: t.worker_id):
        yield from tl.iter_rows()


def timelines_to_csv(timelines: Iterable[WorkerTimeline | None]) -> str:
    """``worker_timeline.csv`` as one string (small timelines; files go through ``write_csv``)."""
    buf = io.StringIO()
    buf.writelines(csv_lines(CSV_COLUMNS, timeline_rows(timelines)))
    return buf.getvalue()


def write_csv(path: Path, timelines: Iterable[WorkerTimeline | None]) -> None:
    """Write ``worker_timeline.csv``: every worker's intervals (``CSV_COLUMNS``, by worker id then
    time), row by row, atomically (e.g. ``ReplayReport.timelines`` of a plan with
    ``capture_worker_timeline``)."""
    atomic_write_csv(Path(path), CSV_COLUMNS, timeline_rows(timelines))
