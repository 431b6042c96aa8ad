"""Checkpoints inside a replay: a monitor sees every request as it ends and, at checkpoints in
virtual time, may stop the replay (``run_plan(plan, monitor=...)``; docs/early-stopping.md).

The contract (what ``Coordinator.run`` and ``RequestLog`` call):

- ``observe(record, row)``: each request's per-request record (``requests.jsonl`` keys) as it
  ends, completed or rejected, in the order the replay logs them (needs ``capture_per_request``);
  a replay that keeps rows (``run_plan(request_rows=True)``) builds no record and passes its
  ``request_metrics.csv`` row instead (record None); ``as_row`` gives the row either way.
- ``check(now_ms, ended, in_flight) -> str | None``: at every coordinator edge, after the requests of that
  edge were logged (``ended`` counts them), and after each slice of a monitored run-out (the
  workers run out in ``Coordinator.checkpoint_slices`` slices of the arrival span instead of one
  step: the same events, a place to stop). A reason stops the replay at ``now_ms``: the requests
  in flight end ``incomplete`` and the report's summary carries ``stopped_early: {at_s, reason}``.
  Once every offered request has ended the replay is never stopped (nothing is left to save).

``Monitor`` spaces its checkpoints: ``at_checkpoint`` runs once ``every`` more requests have ended
(``checkpoints`` per offered workload, our choice: 50), and ``decided()`` (cheap) at every edge,
for a decision a single request can make (a rejection against a latency rule). Checkpoints are
counted in ended requests, so the same replay reaches the same checkpoints on every runtime.

``RunningMetrics`` keeps what the ended requests say in O(1) per request (counts, tokens,
goodput, means and running quantile estimates of TTFT / TPOT / E2E); ``ProgressMonitor`` records
them with the queue (requests held and not yet admitted) at every checkpoint and never stops.
"""

from __future__ import annotations

import math

__all__ = ["Monitor", "ProgressMonitor", "RunningMetrics", "LogHistogram", "as_row", "meets_sla", "STATUS", "LAST_S",
           "OUTPUT", "TTFT", "TPOT", "E2E"]

# request_metrics.csv columns the monitors read (simulator.metrics.csv_out.REQUEST_CSV_COLUMNS)
STATUS, LAST_S, OUTPUT, TTFT, TPOT, E2E = 1, 6, 8, 11, 12, 14


def as_row(record: dict, row: tuple | None) -> tuple:
    """The request_metrics.csv row ``observe`` was given, or the one of ``record``."""
    if row is not None:
        return row
    from aisim.simulator.metrics.csv_out import request_row

    return request_row(record)


def meets_sla(row: tuple, limits: tuple) -> bool:
    """A completed request within every per-request limit ``(ttft_ms, itl_ms, e2e_ms)`` (None:
    unset), as the summary's goodput counts it: a one-token request has no TPOT and passes ITL."""
    lt, li, le = limits
    ttft, tpot, e2e = row[TTFT], row[TPOT], row[E2E]
    return ((lt is None or (ttft != "" and ttft <= lt)) and (le is None or (e2e != "" and e2e <= le))
            and (li is None or tpot == "" or tpot <= li))


class Monitor:
    """Base class: counts ended requests and calls ``at_checkpoint`` every ``every`` of them and,
    given ``time_checkpoints``, also at the first check past each of that many equal parts of the
    arrival span (``begin``): an overloaded replay ends few requests while its queue grows."""

    def __init__(self, num_requests: int, checkpoints: int = 50, time_checkpoints: int | None = None) -> None:
        self.num_requests = int(num_requests)
        self.every = max(1, math.ceil(self.num_requests / max(1, checkpoints)))
        self._next = self.every
        self.time_checkpoints = time_checkpoints
        self.every_ms: float | None = None
        self._next_ms = math.inf
        self.checkpoints = 0  # checkpoints reached so far
        self.at_ms: float | None = None  # where the decision was taken

    def begin(self, span_ms: float) -> None:
        """The replay starts; its arrivals span ``span_ms`` of virtual time (the coordinator calls
        this once, before the first check)."""
        if self.time_checkpoints:
            self.every_ms = max(span_ms / self.time_checkpoints, 1.0)
            self._next_ms = self.every_ms

    def observe(self, record: dict | None, row: tuple | None = None) -> None:  # noqa: B027 - a hook
        """One ended request's record, or (record None) its request_metrics.csv row when the
        replay keeps rows (``run_plan(request_rows=True)``)."""

    def decided(self) -> str | None:
        """A decision already certain between checkpoints (cheap; called at every edge)."""
        return None

    def at_checkpoint(self, now_ms: float, ended: int, in_flight) -> str | None:
        """The decision at a checkpoint, or None to run on. ``in_flight()`` returns
        ``(arrival_ms, first_token_ms, first_admit_ms)`` of every request the workers hold as of
        ``now_ms`` (None: not known yet), for lower bounds on what they will report."""
        return None

    def check(self, now_ms: float, ended: int, in_flight=None) -> str | None:
        if ended >= self.num_requests:  # every request has ended: nothing left to save, let it finish
            return None
        reason = self.decided()
        if reason is None and (ended >= self._next or now_ms >= self._next_ms):
            if ended >= self._next:
                self._next = (ended // self.every + 1) * self.every
            if now_ms >= self._next_ms:
                self._next_ms = (math.floor(now_ms / self.every_ms) + 1) * self.every_ms
            self.checkpoints += 1
            reason = self.at_checkpoint(now_ms, ended, in_flight if in_flight is not None else list)
        if reason is not None:
            self.at_ms = now_ms
        return reason


class LogHistogram:
    """A running quantile estimate in O(1) per value: counts in bins of 1% relative width (value
    ``v > 0`` in bin ``floor(log(v) / log(1.01))``; 0 and below in one bin). ``quantile(q)`` is the
    geometric middle of the bin that holds the nearest-rank q-quantile (rank ``ceil(q n)``), so
    within 0.5% of it (exact for 0)."""

    _LOG = math.log1p(0.01)

    def __init__(self) -> None:
        self.bins: dict[int, int] = {}
        self.zero = 0
        self.n = 0

    def add(self, v: float) -> None:
        self.n += 1
        if v <= 0:
            self.zero += 1
            return
        k = math.floor(math.log(v) / self._LOG)
        self.bins[k] = self.bins.get(k, 0) + 1

    def quantile(self, q: float) -> float | None:
        if self.n == 0:
            return None
        rank = max(1, math.ceil(q * self.n))
        seen = self.zero
        if seen >= rank:
            return 0.0
        for k in sorted(self.bins):  # (rank <= n: the loop ends at a bin)
            seen += self.bins[k]
            if seen >= rank:
                break
        return math.exp((k + 0.5) * self._LOG)


class RunningMetrics:
    """What the requests ended so far say, updated in O(1) per request (``observe(row)``, a
    request_metrics.csv row): completed and rejected counts, output tokens, goodput tokens (those
    of completed requests within every per-request ``limits`` ``(ttft_ms, itl_ms, e2e_ms)``; no
    limit set: none), exact means and running quantile estimates (``LogHistogram``) of TTFT, TPOT
    and E2E latency, and the mean per-user output rate (1000 / TPOT)."""

    def __init__(self, limits: tuple = (None, None, None)) -> None:
        self.limits = tuple(limits)
        self.sla_set = any(x is not None for x in self.limits)
        self.completed = self.rejected = 0
        self.output_tokens = self.good_tokens = 0
        self.sums = {"ttft_ms": 0.0, "tpot_ms": 0.0, "e2e_latency_ms": 0.0}
        self.hists = {k: LogHistogram() for k in self.sums}
        self.per_user_sum = 0.0
        self.per_user_n = 0

    def observe(self, row: tuple) -> None:
        if row[STATUS] != "completed":
            self.rejected += row[STATUS] == "rejected"
            return
        self.completed += 1
        n = int(row[OUTPUT] or 0)
        self.output_tokens += n
        for name, col in (("ttft_ms", TTFT), ("tpot_ms", TPOT), ("e2e_latency_ms", E2E)):
            v = row[col]
            if v != "":
                self.sums[name] += v
                self.hists[name].add(v)
        tpot = row[TPOT]
        if tpot != "" and tpot > 0:
            self.per_user_sum += 1000.0 / tpot
            self.per_user_n += 1
        if self.sla_set and meets_sla(row, self.limits):
            self.good_tokens += n

    def mean(self, name: str) -> float | None:
        h = self.hists[name]
        return self.sums[name] / h.n if h.n else None

    def snapshot(self, now_ms: float, in_flight=None) -> dict:
        """The running metrics at ``now_ms`` (throughputs per second of virtual time); with
        ``in_flight`` (the monitor's callable) also the requests the workers hold and those of them
        not admitted yet (the queue)."""
        s = now_ms / 1000.0
        out = {"at_s": s, "completed": self.completed, "rejected": self.rejected,
               "output_tokens": self.output_tokens,
               "output_throughput_tok_s": self.output_tokens / s if s > 0 else None,
               "goodput_output_throughput_tok_s": (self.good_tokens / s if s > 0 else None) if self.sla_set
               else None}
        for name in self.sums:
            out[f"mean_{name}"] = self.mean(name)
            for q in (50, 90, 99):
                out[f"p{q}_{name}"] = self.hists[name].quantile(q / 100.0)
        if in_flight is not None:
            held = in_flight()
            out["in_flight"] = len(held)
            out["queued"] = sum(1 for item in held if item[2] is None)
        return out


class ProgressMonitor(Monitor):
    """A monitor that never stops a replay: at each checkpoint it keeps the running metrics
    (``snapshots``, ``RunningMetrics.snapshot`` with the in-flight counts), for a replay's
    progress in virtual time."""

    def __init__(self, num_requests: int, checkpoints: int = 50, limits: tuple = (None, None, None)) -> None:
        super().__init__(num_requests, checkpoints)
        self.metrics = RunningMetrics(limits)
        self.snapshots: list[dict] = []

    def observe(self, record: dict, row: tuple | None = None) -> None:
        self.metrics.observe(as_row(record, row))

    def at_checkpoint(self, now_ms: float, ended: int, in_flight) -> str | None:
        self.snapshots.append({"ended": ended, **self.metrics.snapshot(now_ms, in_flight)})
        return None
