"""The outer replay's side of retune: when sweeps launch, what they are asked, when and how their
decisions land, and what the report records (``planner.retune_events``, the ticks' router state).

The sweeps themselves come from an injected ``actors.planner.retune.Sweeper`` (``search.retune``
implements it; ``simulator`` never imports ``search``). Timing (reference §6.3), all in virtual
milliseconds from the start of the replay:

- window k = [k I, (k+1) I); its sweep launches at (k+1) I + grace. Virtual time stops while it
  runs: the coordinator calls the sweeper at the first Planner tick after the launch, with the
  point in effect at the launch and the replicas provisioned at the window start.
- The decision lands at the first tick t with t > launch and t >= launch + latency (latency 0,
  fixed seconds, or the sweep's measured wall time x ``decision_latency_scale``). At that tick the
  Planner's changed fields apply before it decides, and the router's changed knobs apply to the
  arrivals after the tick (ticks come last at an instant).
- Advisory: a decision that would apply is recorded with outcome ``advisory`` and nothing changes
  (``runtime_decision.router_parameters`` is null on every tick).
"""

from __future__ import annotations

import math

from aisim.actors.planner.retune import Sweeper, SweepRequest

__all__ = ["RetuneDriver", "decision_tick_ms"]

_EPS_MS = 1e-6


def decision_tick_ms(launch_ms: float, latency_ms: float, tick_ms: float) -> float:
    """The first tick ``t`` (a multiple of ``tick_ms``) with ``t > launch_ms`` and ``t >= launch_ms + latency_ms``."""
    if tick_ms <= 0:
        raise ValueError("tick_ms must be > 0")
    k = math.floor(launch_ms / tick_ms) + 1  # the first tick after the launch
    ready = launch_ms + max(0.0, latency_ms)
    k = max(k, math.ceil(ready / tick_ms - 1e-12))
    t = k * tick_ms
    while t <= launch_ms:  # float safety: strictly after the launch
        k += 1
        t = k * tick_ms
    return t


def _s(ms: float) -> float:
    return ms / 1000.0


class RetuneDriver:
    """Launches the sweeps of one replay and delivers their decisions (see the module docs).

    ``router``: the entry router's policy name and its retunable knobs at the start (empty for a
    router without any); ``planner_fields``: the searched Planner fields at the start;
    ``replicas``: pool role -> workers at the start; ``component``: how the records name the
    entry pool (``agg`` or ``prefill``)."""

    def __init__(self, rc, sweeper: Sweeper, *, tick_ms: float, advisory: bool, router_policy: str,
                 router: dict, planner_fields: dict, replicas: dict[str, int], component: str,
                 on_sweep=None) -> None:
        self.rc = rc
        self.sweeper = sweeper
        self.tick_ms = float(tick_ms)
        self.advisory = advisory
        self.router_policy = router_policy
        self.component = component
        self.router = dict(router)
        self.planner_fields = dict(planner_fields)
        self.interval_ms = rc.interval_seconds * 1000.0
        self.grace_ms = rc.grace_seconds * 1000.0
        self.events: list[dict] = []
        self._starts: dict[int, dict[str, int]] = {0: dict(replicas)}  # window -> replicas at its start
        self._kv: dict[int, dict] = {}  # warm start: window -> the caches' contents at its start (window 0: cold)
        self._next_window = 0
        self._pending: list[tuple[float, SweepRequest, object, float]] = []  # (decided_at, request, answer, latency)
        self._router_log: list[tuple[float, int, dict]] = [(-math.inf, 0, dict(router))]  # (at_ms, revision, knobs)
        self.on_sweep = on_sweep  # progress: called with (window_index, answer) after each sweep

    # -- the coordinator's call, once per Planner tick ---------------------------------------------
    def launch_ms(self, k: int) -> float:
        return (k + 1) * self.interval_ms + self.grace_ms

    def at_tick(self, now_ms: float, replicas: dict[str, int], kv_contents=None) -> tuple[dict | None, dict | None]:
        """Run the sweeps launched before ``now_ms``, deliver the decisions due now; returns (the
        Planner fields, the router knobs) that change at this tick (None: none). ``replicas``: the
        workers provisioned per pool now; ``kv_contents()``: the caches' contents now (warm start)."""
        k = int(math.floor(now_ms / self.interval_ms + 1e-9))
        if k not in self._starts and k * self.interval_ms <= now_ms + _EPS_MS:
            self._starts[k] = dict(replicas)
            if self.rc.warm_start and k > 0 and kv_contents is not None:
                self._kv[k] = kv_contents()
        while self.launch_ms(self._next_window) < now_ms - _EPS_MS:
            self._launch(self._next_window)
            self._next_window += 1
        planner_changes: dict = {}
        router_changes: dict = {}
        due = [p for p in self._pending if p[0] <= now_ms + _EPS_MS]
        self._pending = [p for p in self._pending if p[0] > now_ms + _EPS_MS]
        for decided_at, req, answer, latency_ms in due:
            p, r = self._deliver(now_ms, req, answer, latency_ms)
            planner_changes.update(p)
            router_changes.update(r)
        if router_changes:
            revision = self._router_log[-1][1] + 1
            self._router_log.append((now_ms, revision, dict(self.router)))
        return planner_changes or None, router_changes or None

    def _launch(self, k: int) -> None:
        start = k * self.interval_ms
        replicas = self._starts.get(k)
        if replicas is None:  # no tick at the window start (nothing ran then): the latest known
            replicas = self._starts[max(j for j in self._starts if j < k)]
        launch = self.launch_ms(k)
        req = SweepRequest(k, start, start + self.interval_ms, launch, dict(replicas), dict(self.router),
                           dict(self.planner_fields), self._kv.pop(k, None))
        answer = self.sweeper.sweep(req)
        if self.on_sweep is not None:
            self.on_sweep(k, answer)
        rc = self.rc
        if rc.decision_latency_seconds == "measured":
            latency_ms = answer.sweep_wall_s * rc.decision_latency_scale * 1000.0
        else:
            latency_ms = float(rc.decision_latency_seconds) * 1000.0
        self._pending.append((decision_tick_ms(launch, latency_ms, self.tick_ms), req, answer, latency_ms))

    def _deliver(self, now_ms: float, req: SweepRequest, answer, latency_ms: float) -> tuple[dict, dict]:
        outcome = answer.outcome
        planner = {k: v for k, v in answer.planner.items() if self.planner_fields.get(k) != v}
        router = {k: v for k, v in answer.router.items() if self.router.get(k) != v}
        if outcome == "applied" and not (planner or router):
            outcome = "kept"  # (the winner equals what runs now)
        if outcome == "applied" and self.advisory:
            outcome = "advisory"
        applied = outcome == "applied"
        self.events.append({
            "window_index": req.window_index,
            "window_start_s": _s(req.window_start_ms),
            "window_end_s": _s(req.window_end_ms),
            "launched_at_s": _s(req.launch_ms),
            "decided_at_s": _s(now_ms),
            "decision_latency_s": _s(latency_ms),
            "outcome": outcome,
            "chosen": answer.chosen,
            "router_changes": router if outcome in ("applied", "advisory") else {},
            "planner_changes": planner if outcome in ("applied", "advisory") else {},
            "predictor_warmup": None if self.advisory else answer.predictor_warmup,
            "replicas": dict(req.replicas),
            "num_requests": answer.num_requests,
            "current": answer.current,
            "candidates": answer.candidates,
            "improvement_pct": answer.improvement_pct,
            "sweep_wall_s": answer.sweep_wall_s,
        })
        if not applied:
            return {}, {}
        self.planner_fields.update(planner)
        self.router.update(router)
        return planner, router

    # -- the report ----------------------------------------------------------------------------------
    def annotate_ticks(self, ticks: list[dict]) -> None:
        """Each tick's ``router_policies`` (state, revision and knobs before the tick's update) and
        ``runtime_decision.router_parameters`` (the knobs from that tick on; null in advisory)."""
        log = self._router_log
        j = 0
        for tick in ticks:
            at = tick["at_ms"]
            while j + 1 < len(log) and log[j + 1][0] < at - _EPS_MS:
                j += 1
            before = log[j]
            after = log[j + 1] if j + 1 < len(log) and abs(log[j + 1][0] - at) <= _EPS_MS else before
            tick["router_policies"] = {self.component: {"policy": self.router_policy, "state": "active",
                                                        "revision": before[1], "parameters": dict(before[2])}}
            tick["runtime_decision"]["router_parameters"] = (None if self.advisory
                                                             else {self.component: dict(after[2])})

    def close(self) -> None:
        self.sweeper.close()
