"""Checkpoints inside a replay: a monitor sees every request as it ends and, at checkpoints in
virtual time, may stop the replay (``run_plan(plan, monitor=...)``; docs/early-stopping.md).

The contract (what ``Coordinator.run`` and ``RequestLog`` call):

- ``observe(record, row)``: each request's per-request record (``requests.jsonl`` keys) as it
  ends, completed or rejected, in the order the replay logs them (needs ``capture_per_request``),
  with its ``request_metrics.csv`` row when the replay keeps rows (else None).
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
"""

from __future__ import annotations

import math

__all__ = ["Monitor", "as_row", "meets_sla", "STATUS", "LAST_S", "OUTPUT", "TTFT", "TPOT", "E2E"]

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
    """Base class: counts ended requests and calls ``at_checkpoint`` every ``every`` of them."""

    def __init__(self, num_requests: int, checkpoints: int = 50) -> None:
        self.num_requests = int(num_requests)
        self.every = max(1, math.ceil(self.num_requests / max(1, checkpoints)))
        self._next = self.every
        self.checkpoints = 0  # checkpoints reached so far
        self.at_ms: float | None = None  # where the decision was taken

    def observe(self, record: dict, row: tuple | None = None) -> None:  # noqa: B027 - a hook
        """One ended request's record (and its request_metrics.csv row when the replay keeps
        rows: ``run_plan(request_rows=True)``)."""

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
        if reason is None and ended >= self._next:
            self._next = (ended // self.every + 1) * self.every
            self.checkpoints += 1
            reason = self.at_checkpoint(now_ms, ended, in_flight if in_flight is not None else list)
        if reason is not None:
            self.at_ms = now_ms
        return reason
