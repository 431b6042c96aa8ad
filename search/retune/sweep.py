"""One retune sweep: the window's requests replayed under the current point and each candidate.

- The window replay (``window_plan``): the window's requests (``windows.window_requests``) as a
  workload of their own on their recorded timestamps, the replica counts as at the window start,
  a cold KV cache, the outer replay's router seed (every candidate shares it and the request ids),
  the scoring SLA, and either no Planner (retune-only: replicas fixed) or the current Planner
  without retune (scaling on), which each candidate runs with its own Planner fields.
- Candidates come from ``candidates.CandidateSearch`` (one ask/tell loop); their replays run
  through ``search.fanout`` ``max_parallel`` at a time. The current point is replayed first and its
  score seeds the search, so a candidate equal to the current point scores exactly the current
  score. A candidate whose replay fails is recorded as failed and never wins.
- Keep rule (``scoring.should_switch``): switch only when the best candidate beats the current
  score by more than ``min_improvement_percentage``.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from search.retune.candidates import CandidateSearch, best, point_key
from search.retune.scoring import improvement_pct, score, should_switch
from search.retune.windows import Window, window_requests
from simulator.config import models as m
from simulator.plan import ReplayPlan
from simulator.traffic.arrivals import ArrivalProcess, trace_times
from simulator.traffic.build import TrafficPlan

ROUTER_KNOBS = ("overlap_score_credit", "prefill_load_scale", "temperature")
SCORE_KEYS = ("goodput_output_tokens", "gpu_hours")


@dataclass
class SweepResult:
    current: dict  # {"point", "score"}
    candidates: list[dict] = field(default_factory=list)  # {"point", "score", "status"} in canonical order
    chosen: dict | None = None  # the winning point when it switches
    improvement_pct: float | None = None
    outcome: str = "kept"  # applied | kept | failed | timeout
    sweep_wall_s: float = 0.0
    num_requests: int = 0


def window_plan(plan: ReplayPlan, w: Window, replicas: dict[str, int], sla: m.Sla,
                planner_on: bool) -> ReplayPlan | None:
    """The replay of window ``w`` at the current point (None when no request belongs to it)."""
    workload = plan.traffic.workload
    idx = window_requests(workload.timestamp_ms, workload.recorded_total_ms, w)
    if len(idx) == 0:
        return None
    sub = workload.subset(idx, shift_ms=w.start_ms)
    speedup = plan.traffic.arrivals.delay_scale
    arrivals = ArrivalProcess(sub, trace_times(sub, speedup), delay_scale=speedup)
    traffic = TrafficPlan(sub, arrivals, None, "requests", f"retune window {w.index}: {sub.description}")
    pools = [dataclasses.replace(p, replicas=replicas.get(p.role, p.replicas)) for p in plan.pools]
    planner = plan.planner.model_copy(update={"retune": None}) if planner_on and plan.planner is not None else None
    return dataclasses.replace(plan, traffic=traffic, pools=pools, sla=sla, planner=planner, capture_per_request=False,
                               capture_planner_details=False, write_html_report=False, capture_worker_timeline=False)


def current_point(plan: ReplayPlan, knobs: list[str]) -> dict:
    """The values the searched knobs have in ``plan``."""
    out = {}
    for k in knobs:
        out[k] = getattr(plan.router, k) if k in ROUTER_KNOBS else getattr(plan.planner, k)
    return out


def candidate_plan(base: ReplayPlan, point: dict) -> ReplayPlan:
    router = {k: v for k, v in point.items() if k in ROUTER_KNOBS}
    planner = {k: v for k, v in point.items() if k not in ROUTER_KNOBS}
    out = dataclasses.replace(base, router=dataclasses.replace(base.router, **router)) if router else base
    if planner and base.planner is not None:
        out = dataclasses.replace(out, planner=base.planner.model_copy(update=planner))
    return out


def sweep(base: ReplayPlan, domains: dict, fan, *, sampler: str = "grid", max_candidates: int | None = None,
          min_improvement_percentage: float = 3.0, timeout_s: float | None = None, seed: int = 42) -> SweepResult:
    """Replay the current point and the candidates of ``domains`` on ``base`` (a window plan)."""
    t0 = time.perf_counter()
    knobs = sorted(domains)
    now = current_point(base, knobs)
    results = fan.run_trials([base], SCORE_KEYS, timeout_s)  # the whole sweep shares timeout_s
    cur = results[0]
    out = SweepResult(current={"point": now, "score": score(cur.metrics) if cur.ok else None},
                      num_requests=base.traffic.workload.num_requests)
    if not cur.ok:
        out.outcome = "timeout" if cur.status == "timeout" else "failed"
        out.sweep_wall_s = time.perf_counter() - t0
        return out
    search = CandidateSearch(domains, sampler, max_candidates, seed)
    search.scores[point_key(now)] = out.current["score"]  # a candidate equal to it scores exactly this
    statuses = {point_key(now): "ok"}
    timed_out = False
    deadline = None if timeout_s is None else t0 + timeout_s

    def evaluate(points: list[dict]) -> list[float | None]:
        nonlocal timed_out
        left = None if deadline is None else deadline - time.perf_counter()
        if left is not None and left <= 0:
            timed_out = True
            for p in points:
                statuses[point_key(p)] = "timeout"
            return [None] * len(points)
        trials = fan.run_trials([candidate_plan(base, p) for p in points], SCORE_KEYS, left)
        scores = []
        for p, r in zip(points, trials):
            statuses[point_key(p)] = r.status
            timed_out |= r.status == "timeout"
            scores.append(score(r.metrics) if r.ok else None)
        return scores

    scored = search.run(evaluate, fan.max_parallel)
    out.candidates = [{"point": p, "score": s, "status": statuses.get(point_key(p), "ok")} for p, s in scored]
    out.sweep_wall_s = time.perf_counter() - t0
    if timed_out:
        out.outcome = "timeout"
        return out
    top = best(scored)
    if top is not None and point_key(top[0]) != point_key(now):
        out.improvement_pct = improvement_pct(out.current["score"], top[1])
        if should_switch(out.current["score"], top[1], min_improvement_percentage):
            out.chosen, out.outcome = top[0], "applied"
    return out
