"""Retune sweeps: the window's requests replayed under the current point and each candidate.

- The window replay (``window_plan``): the window's requests (``windows.window_requests``, on
  the replay's own clock: trace time from the first request divided by the speedup) as a
  workload of their own, arriving as they did relative to the window start; the replica counts
  provisioned at the window start; a cold KV cache; the outer replay's seed (every candidate
  shares it and the request ids); the scoring SLA; and either no Planner (retune-only: replicas
  fixed) or the current Planner without retune (scaling on), its load predictor warmed with the
  history up to the window start, which each candidate runs with its own Planner fields.
- Candidates come from ``candidates.CandidateSearch`` (one ask/tell loop); their replays run
  through ``search.fanout`` ``max_parallel`` at a time. The current point is replayed first and its
  score seeds the search, so a candidate equal to the current point scores exactly the current
  score. A candidate whose replay fails is recorded as failed and never wins.
- Keep rule (``scoring.should_switch``): switch only when the best candidate beats the current
  score by more than ``min_improvement_percentage``.
- ``RetuneSweeper`` answers the Planner's sweep protocol (``actors.planner.retune``) for one outer
  replay: one Fanout for the whole run (started at the first sweep, reused by every window), the
  predictor pre-sweep (``history.presweep``) before the candidates when ``planner: default`` runs
  throughput scaling, and ``timeout_seconds`` bounding each whole sweep (pre-sweep included): past
  it the running replays are killed and nothing changes (outcome ``timeout``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

import numpy as np

from aisim.actors.planner.retune import SweepAnswer, SweepRequest
from aisim.search.asktell import point_key
from aisim.search.retune.candidates import CandidateSearch, best, point_order
from aisim.search.retune.history import interval_history, preset_fields, preset_of, presweep
from aisim.search.retune.scoring import improvement_pct, score, should_switch
from aisim.search.retune.windows import Window, window_requests
from aisim.simulator.config import models as m
from aisim.simulator.plan import ExecutionPlan, ReplayPlan
from aisim.simulator.traffic.arrivals import ArrivalProcess
from aisim.simulator.traffic.build import TrafficPlan

__all__ = ["SweepResult", "RetuneSweeper", "make_sweeper", "window_plan", "current_point", "candidate_plan", "sweep",
           "replay_starts_ms"]

ROUTER_KNOBS = ("overlap_score_credit", "prefill_load_scale", "temperature")
SCORE_KEYS = ("goodput_output_tokens", "gpu_hours")
ERROR_MEASURE = ("mean one-step loss after the common warm-up: 0.4 |log1p(n^ isl^) - log1p(n isl)| + "
                 "0.4 |log1p(n^ osl^) - log1p(n osl)| + 0.1 |log1p(isl^) - log1p(isl)| + 0.1 |log1p(osl^) - log1p(osl)|")


@dataclass
class SweepResult:
    current: dict  # {"point", "score"}
    candidates: list[dict] = field(default_factory=list)  # {"point", "score", "status"} in canonical order
    chosen: dict | None = None  # the winning point when it switches
    improvement_pct: float | None = None
    outcome: str = "kept"  # applied | kept | failed | timeout
    sweep_wall_s: float = 0.0
    num_requests: int = 0


def replay_starts_ms(workload, speedup: float) -> np.ndarray:
    """Each request's arrival on the replay's clock: trace time from the first request / speedup."""
    ts = workload.timestamp_ms
    first = np.nanmin(ts) if len(ts) else 0.0
    return np.nan_to_num((ts - first) / speedup)


def window_plan(plan: ReplayPlan, req: SweepRequest, sla: m.Sla, planner_on: bool,
                warmup: tuple | None = None) -> ReplayPlan | None:
    """The replay of the window of ``req`` at the point in effect (None when no request belongs to it)."""
    workload = plan.traffic.workload
    speedup = plan.traffic.arrivals.delay_scale
    starts = replay_starts_ms(workload, speedup)
    w = Window(req.window_index, req.window_start_ms, req.window_end_ms, req.launch_ms)
    idx = window_requests(starts, workload.recorded_total_ms, w)
    if len(idx) == 0:
        return None
    first = float(np.nanmin(workload.timestamp_ms))
    sub = workload.subset(idx, shift_ms=first + req.window_start_ms * speedup)
    times = np.nan_to_num(sub.timestamp_ms / speedup)
    arrivals = ArrivalProcess(sub, times, delay_scale=speedup)
    traffic = TrafficPlan(sub, arrivals, None, "requests", f"retune window {req.window_index}: {sub.description}")
    pools = [dataclasses.replace(p, replicas=max(1, req.replicas.get(p.role, p.replicas))) for p in plan.pools]
    planner = None
    if planner_on and plan.planner is not None:
        planner = plan.planner.with_knobs(req.planner, retune=False)
    router = dataclasses.replace(plan.router, **req.router) if req.router else plan.router
    execution = ExecutionPlan(router_sync_ms=plan.execution.router_sync_ms)
    return dataclasses.replace(plan, traffic=traffic, pools=pools, router=router, sla=sla, planner=planner,
                               capture_per_request=False, capture_planner_details=False, planner_html_dir=None,
                               capture_worker_timeline=False, execution=execution,
                               planner_warmup=warmup if planner is not None else None, initial_kv=req.kv_blocks)


def current_point(plan: ReplayPlan, knobs: list[str]) -> dict:
    """The values the searched knobs have in ``plan``."""
    return {k: getattr(plan.router, k) if k in ROUTER_KNOBS else plan.planner.knob(k) for k in knobs}


def candidate_plan(base: ReplayPlan, point: dict) -> ReplayPlan:
    router = {k: v for k, v in point.items() if k in ROUTER_KNOBS}
    planner = {k: v for k, v in point.items() if k not in ROUTER_KNOBS}
    out = dataclasses.replace(base, router=dataclasses.replace(base.router, **router)) if router else base
    if planner and base.planner is not None:
        out = dataclasses.replace(out, planner=base.planner.with_knobs(planner))
    return out


def sweep(base: ReplayPlan, domains: dict, fan, *, sampler: str = "grid", max_candidates: int | None = None,
          min_improvement_percentage: float = 3.0, timeout_s: float | None = None, seed: int = 42,
          early_drop: bool = False) -> SweepResult:
    """Replay the current point and the candidates of ``domains`` on ``base`` (a window plan).
    ``early_drop``: the candidates replayed after the current point stop once they cannot clear
    the keep rule (``search.retune.early``; status ``dropped``, never chosen)."""
    t0 = time.perf_counter()
    now = current_point(base, sorted(domains))
    search = CandidateSearch(domains, sampler, max_candidates, seed)
    search.hold(now)  # a candidate equal to the current point waits for, and gets, exactly its score
    statuses: dict[str, str] = {}  # point key -> the trial's status
    timed_out = False
    deadline = None if timeout_s is None else t0 + timeout_s

    dropped: dict[str, dict] = {}  # point key -> the bound that dropped it
    drop = None  # the candidates' drop monitor spec, once the current score is known

    def run(plans: list, points: list[dict]) -> list:
        nonlocal timed_out
        left = None if deadline is None else deadline - time.perf_counter()
        if timed_out or (left is not None and left <= 0):
            timed_out = True
            for p in points:
                statuses[point_key(p)] = "timeout"
            return [None] * len(points)
        trials = fan.run_trials(plans, SCORE_KEYS, left, monitors=[drop] * len(plans) if drop else None)
        scores = []
        for p, r in zip(points, trials):
            k = point_key(p)
            statuses[k] = r.status
            timed_out |= r.status == "timeout"
            if r.ok and "stopped_early" in r.metrics:
                statuses[k] = "dropped"
                dropped[k] = r.metrics["decision"]
            scores.append(score(r.metrics) if r.ok and k not in dropped else None)
        return scores

    # the current point runs with the first candidates (one batch of max_parallel)
    first = search.ask(max(0, fan.max_parallel - 1))
    scores = run([base] + [candidate_plan(base, p) for _, p in first], [now] + [p for _, p in first])
    out = SweepResult(current={"point": now, "score": scores[0]}, num_requests=base.traffic.workload.num_requests)
    search.settle(now, scores[0])
    search.record(first, scores[1:])
    cur_status = statuses[point_key(now)]
    if cur_status != "ok":
        scores = search.scores
        out.candidates = [{"point": p, "score": scores[k], "status": statuses.get(k, "ok")}
                          for k, p in sorted(search.points.items(), key=lambda kp: point_order(kp[1]))]
        out.outcome = "timeout" if cur_status == "timeout" else "failed"
        out.sweep_wall_s = time.perf_counter() - t0
        return out

    def evaluate(points: list[dict]) -> list[float | None]:
        return run([candidate_plan(base, p) for p in points], points)

    if early_drop:
        from aisim.search.retune.early import drop_spec

        drop = drop_spec(base, scores[0], min_improvement_percentage)
    scored = search.run(evaluate, fan.max_parallel)
    out.candidates = [{"point": p, "score": s, "status": statuses.get(point_key(p), "ok"),
                       **({"dropped": dropped[point_key(p)]} if point_key(p) in dropped else {})} for p, s in scored]
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


class RetuneSweeper:
    """The sweeps of one outer replay (``actors.planner.retune.Sweeper``). ``fan``: a Fanout to use
    (the caller closes it); None starts one at the first sweep on the plan's backend
    (``execution.backend``, ``ray_address``) with ``retune.max_parallel`` workers, closed by ``close()``."""

    def __init__(self, plan: ReplayPlan, fan=None) -> None:
        pp = plan.planner
        self.plan = plan
        self.rc = rc = pp.retune
        thr, load = pp.settings.enable_throughput_scaling, pp.settings.enable_load_scaling
        self.scaling = thr or load
        self.throughput = thr
        self.router_knobs = rc.router_domains()
        self.planner_knobs = rc.planner_domains(load)
        self.domains = {**self.router_knobs, **self.planner_knobs}
        self.presweep_on = rc.predictor_presweep(thr)
        # the limits retune resolved; the statistic they bound is the replay's (evaluation.sla.percentile)
        self.sla = m.Sla(ttft_ms=rc.sla_ttft_ms, itl_ms=rc.sla_itl_ms,
                         percentile=plan.sla.percentile if plan.sla is not None else "mean")
        self._fan = fan
        self._own_fan = fan is None
        self._history = None
        self._history_read = False

    # -- resources ---------------------------------------------------------------------------------
    @property
    def fan(self):
        if self._fan is None:
            from aisim.search.fanout import fanout

            ex = self.plan.execution
            self._fan = fanout(ex.backend, self.rc.parallel, ex.ray_address if ex.backend == "ray" else None)
        return self._fan

    def close(self) -> None:
        if self._own_fan and self._fan is not None:
            self._fan.close()
        self._fan = None

    def history(self):
        """The recorded history (the warm-up trace) as a Workload, or None without throughput scaling."""
        if not self._history_read:
            self._history_read = True
            spec = self.plan.planner.warmup_trace
            if self.throughput and spec:
                from aisim.simulator.traffic.traces import read_dynamo, resolve_trace_paths

                self._history = read_dynamo(resolve_trace_paths([spec], "planner.load_predictor_warmup_trace"))
        return self._history

    def _interval_history(self, end_ms: float) -> tuple:
        return interval_history(self.history(), self.plan.traffic.workload, self.plan.traffic.arrivals.delay_scale,
                                self.plan.planner.settings.throughput_interval_s, end_ms, self.rc.history_seconds)

    # -- the protocol ---------------------------------------------------------------------------------
    def sweep(self, req: SweepRequest) -> SweepAnswer:
        rc = self.rc
        t0 = time.perf_counter()
        deadline = t0 + rc.timeout_seconds
        answer = SweepAnswer("kept")
        predictor_changes: dict = {}
        if self.presweep_on:
            hist = self._interval_history(req.window_end_ms)
            winner, losses = presweep(hist, self.plan.planner.settings.throughput_interval_s, self.fan,
                                      max(1e-3, deadline - time.perf_counter()))
            current = preset_of(req.planner)
            answer.predictor_warmup = {
                "current_preset": current, "selected_preset": winner, "history_intervals": len(hist),
                "losses": {k: (v if math.isfinite(v) else None) for k, v in losses.items()},
                "error_measure": ERROR_MEASURE, "changed": False}
            if time.perf_counter() > deadline:
                answer.outcome = "timeout"
                answer.sweep_wall_s = time.perf_counter() - t0
                return answer
            if winner is not None and winner != current:
                fields = preset_fields(winner)
                predictor_changes = {k: v for k, v in fields.items() if req.planner.get(k) != v}
                answer.predictor_warmup["changed"] = bool(predictor_changes)
        result = None
        if self.domains:
            warmup = self._interval_history(req.window_start_ms) if self.throughput else None
            base = window_plan(self.plan, req, self.sla, self.scaling, warmup)
            if base is not None:
                seed = int(np.random.SeedSequence([self.plan.seed, req.window_index]).generate_state(1)[0])
                result = sweep(base, self.domains, self.fan, sampler=rc.sampler, max_candidates=rc.max_candidates,
                               min_improvement_percentage=rc.min_improvement_percentage,
                               timeout_s=max(1e-3, deadline - time.perf_counter()), seed=seed,
                               early_drop=rc.early_drop)
        if result is not None:
            answer.current, answer.candidates = result.current, result.candidates
            answer.improvement_pct, answer.num_requests = result.improvement_pct, result.num_requests
            if result.outcome in ("timeout", "failed"):
                answer.outcome = result.outcome
                answer.sweep_wall_s = time.perf_counter() - t0
                return answer
        router: dict = {}
        planner: dict = {}
        if result is not None and result.chosen is not None:
            router = {k: v for k, v in result.chosen.items() if k in ROUTER_KNOBS}
            planner = {k: v for k, v in result.chosen.items() if k not in ROUTER_KNOBS}
        planner.update(predictor_changes)
        if router or planner:
            answer.outcome = "applied"
            answer.router, answer.planner = router, planner
            answer.chosen = {"router": ({**req.router, **router} if self.router_knobs else None),
                             "planner": ({k: planner.get(k, req.planner.get(k)) for k in req.planner}
                                         if req.planner else None)}
        answer.sweep_wall_s = time.perf_counter() - t0
        return answer


def make_sweeper(plan: ReplayPlan) -> RetuneSweeper:
    """The ``aisim.sweepers:retune`` entry point: the sweeper ``simulator.run.run_plan`` asks."""
    return RetuneSweeper(plan)
