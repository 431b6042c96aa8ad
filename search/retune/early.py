"""Retune early drop: a window candidate's replay stops once its score can no longer clear the keep
rule (``planner.retune.early_drop``; docs/early-stopping.md).

The sweep switches to its best candidate only when that candidate's score (goodput output tokens
per GPU-hour, ``search.retune.scoring``) exceeds ``bar = current x (1 + min_improvement_percentage
/ 100)``. At a checkpoint a candidate's final score is at most

    (good tokens so far + requested output tokens of the requests not completed yet)
    / (GPUs x the latest completion so far)

- the numerator: a completed request's goodput is final; any other can add at most its requested
  output (``total_output_tokens`` less the output of the completed ones);
- the denominator: the replay's duration is its last completion, never earlier than the latest so
  far, and with the replicas fixed (a window replayed without a Planner) its GPU-hours are the
  GPUs times that duration. A window replayed with a Planner is never dropped (a Planner may
  scale to zero workers, so no lower bound holds).

A candidate whose bound is at most the bar can never be chosen, so the sweep's decision (applied
or kept, and the point chosen) is the full sweep's; only the dropped candidates' scores are
missing (status ``dropped``), so a kept window's ``improvement_pct`` is the best finished
candidate's. The bound is compared with a relative margin of 1e-9 (the times are read back from
seconds).
"""

from __future__ import annotations

from dataclasses import dataclass

from aisim.simulator.checkpoints import LAST_S, OUTPUT, STATUS, Monitor, as_row, meets_sla

__all__ = ["DropSpec", "DropMonitor", "drop_spec"]

_MARGIN = 1e-9


@dataclass(frozen=True)
class DropSpec:
    """What a window candidate's worker needs to drop it (``search.trial.run_monitored_trial``
    calls ``monitor(plan)``): the bar, the window's requested output tokens, its GPUs, and the
    per-request SLA limits ``(ttft_ms, itl_ms, e2e_ms)`` (None: a percentile SLA, every completed
    request may count; ``sla_set`` False: no goodput at all)."""

    bar: float
    total_output_tokens: int
    gpus: int
    sla_set: bool
    limits: tuple | None

    def monitor(self, plan) -> "DropMonitor":
        return DropMonitor(self, plan.traffic.workload.num_requests)


def drop_spec(plan, current_score: float, min_improvement_percentage: float) -> DropSpec | None:
    """The drop spec of a candidate of window plan ``plan``, or None when no candidate of it can
    be dropped (a Planner in the window replay)."""
    if plan.planner is not None:
        return None
    sla = plan.sla
    per_request = sla is not None and sla.is_set and sla.percentile == "mean"
    w = plan.traffic.workload
    return DropSpec(bar=current_score * (1.0 + min_improvement_percentage / 100.0),
                    total_output_tokens=int(w.output_len.sum()),
                    gpus=sum(p.replicas * p.gpus_per_worker for p in plan.pools),
                    sla_set=sla is not None and sla.is_set,
                    limits=(sla.ttft_ms, sla.itl_ms, sla.e2e_ms) if per_request else None)


class DropMonitor(Monitor):
    """Stops a window candidate once its score bound is at most the bar (module docstring)."""

    def __init__(self, spec: DropSpec, num_requests: int) -> None:
        super().__init__(num_requests)
        self.bar = float(spec.bar)
        self.remaining = int(spec.total_output_tokens)
        self.gpus = int(spec.gpus)
        self.sla_set = bool(spec.sla_set)
        self.limits = spec.limits
        self.good = 0
        self.last_ms = 0.0
        self.decision: dict | None = None

    def observe(self, record: dict, row: tuple | None = None) -> None:
        row = as_row(record, row)
        if row[STATUS] != "completed":
            return
        n = int(row[OUTPUT] or 0)
        self.remaining -= n
        if row[LAST_S] != "":
            self.last_ms = max(self.last_ms, row[LAST_S] * 1000.0)
        if not self.sla_set:
            return  # (no SLA: no goodput at all, the score is 0 whatever happens)
        if self.limits is None or meets_sla(row, self.limits):
            self.good += n

    def bound(self) -> float | None:
        """The most the final score can be (None: nothing completed yet, no bound)."""
        if self.last_ms <= 0 or self.gpus <= 0:
            return None
        tokens = self.good + max(0, self.remaining) if self.sla_set else 0
        return tokens / (self.gpus * self.last_ms / 3.6e6)

    def at_checkpoint(self, now_ms: float, ended: int, in_flight) -> str | None:
        ub = self.bound()
        if ub is None or ub * (1.0 + _MARGIN) > self.bar:
            return None
        self.decision = {"bound": ub, "bar": self.bar, "ended_requests": ended, "at_s": now_ms / 1000.0}
        return f"score at most {ub:.6g} <= {self.bar:.6g} needed to switch"
