"""Capacity-search algorithms (seed "Capacity Search", reference §8.2): pure functions over an
``evaluate(qps) -> TrialOutcome`` callback. Nothing here runs a replay or touches a file.

Adaptive (``start_qps``), one trial at a time:

1. Grow: evaluate ``start_qps`` (clamped to ``max_qps_cap``), then double after every pass. A
   doubling past the cap evaluates the cap itself; a passing cap ends the search with the cap
   (``stopped="cap"``).
2. Shrink: if ``start_qps`` fails, halve until a trial passes. A halving below ``min_qps`` is
   not evaluated: the search ends with no pass (``max_qps_under_sla=None``, ``"no_pass"``).
3. Bisect: between the highest passing QPS ``p`` and the lowest failing QPS ``f``, evaluate
   ``(p + f) / 2`` until ``(f - p) / p * 100 <= min_search_granularity_pct`` (``"converged"``).

Before every trial: if ``max_iterations`` trials have run, stop (``"max_iterations"``); the
natural ends above are checked first, so a search that converges on its last allowed trial
reports ``"converged"``. A timed-out trial counts as not passed and stops the search
(``"timed_out"``). The result is always the highest passing QPS evaluated (None if none).
Arithmetic is exact float arithmetic: no rounding, no formatting.

Example (pass iff qps <= 11.3, start 2, granularity 2.5 %):
2 P, 4 P, 8 P, 16 F, 12 F, 10 P, 11 P, 11.5 F, 11.25 P -> (11.5 - 11.25) / 11.25 = 2.22 % ->
converged at 11.25 after 9 trials.

Linear (``qps_list``): every listed QPS in order; the result is the highest passing one (not
the last). Without an SLA the evaluator returns ``passed=None`` and the result is None. A
timed-out trial stops the sweep. A QPS listed twice runs once (the trace keeps its first
position).

``AdaptivePlan`` is the adaptive search as a sequencer (``next_qps`` / ``tell``) with
``speculative(depth)``: the points the next ``depth`` trials may need whatever their outcomes,
so a caller can run them in parallel; ``adaptive_search_batched`` drives it over an
``evaluate_many(list[qps])`` callback and returns the same result and trace as
``adaptive_search`` with a deterministic evaluator.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = [
    "TrialOutcome",
    "SearchOutcome",
    "STOP_REASONS",
    "AdaptivePlan",
    "adaptive_plan",
    "adaptive_search",
    "adaptive_search_batched",
    "LinearPlan",
    "linear_search",
]

STOP_REASONS = ("converged", "max_iterations", "cap", "timed_out", "no_pass", "list_done")
_RESERVED = ("qps", "passed", "timed_out")


@dataclass(frozen=True)
class TrialOutcome:
    """What the evaluator returns for one QPS."""

    passed: bool | None  # None: no SLA (linear without sla)
    timed_out: bool = False  # a timed-out trial stops its job's search (it counts as not passed)
    extra: dict = field(default_factory=dict)  # carried into the trace (sla_results, cached, ...)

    def __post_init__(self) -> None:
        if self.passed is not None and not isinstance(self.passed, bool):
            raise ValueError(f"TrialOutcome.passed must be True, False or None, not {self.passed!r}")
        clash = [k for k in _RESERVED if k in self.extra]
        if clash:
            raise ValueError(f"TrialOutcome.extra may not set {', '.join(clash)} (the trace's own keys)")


@dataclass
class SearchOutcome:
    max_qps_under_sla: float | None
    trace: list[dict]  # one per trial in run order: {"qps", "passed", "timed_out", **extra}
    stopped: str  # one of STOP_REASONS
    # adaptive_search_batched only: trials run speculatively that the search never needed
    # (same entry shape, in evaluation order); empty for the sequential searches
    speculative: list[dict] = field(default_factory=list)


def _entry(qps: float, passed: bool | None, outcome: TrialOutcome) -> dict:
    return {"qps": qps, "passed": passed, "timed_out": bool(outcome.timed_out), **outcome.extra}


def _positive(name: str, x: float) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
        raise ValueError(f"{name} must be a positive finite number, not {x!r}")
    return float(x)


class AdaptivePlan:
    """The adaptive search as a sequencer: ask ``next_qps()``, run it, ``tell(qps, outcome)``;
    repeat until ``done``; then ``outcome()``. See the module doc for the rules."""

    def __init__(self, start_qps: float, *, max_iterations: int = 20, min_search_granularity_pct: float = 2.5,
                 max_qps_cap: float | None = None, min_qps: float = 1e-3) -> None:
        start = _positive("start_qps", start_qps)
        if isinstance(max_iterations, bool) or not isinstance(max_iterations, int) or max_iterations < 1:
            raise ValueError(f"max_iterations must be an integer >= 1, not {max_iterations!r}")
        g = min_search_granularity_pct
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not math.isfinite(g) or g < 0:
            raise ValueError(f"min_search_granularity_pct must be a finite number >= 0, not {g!r}")
        self.max_iterations = max_iterations
        self.min_search_granularity_pct = float(g)
        self.max_qps_cap = None if max_qps_cap is None else _positive("max_qps_cap", max_qps_cap)
        self.min_qps = _positive("min_qps", min_qps)
        if self.max_qps_cap is not None and start > self.max_qps_cap:
            start = self.max_qps_cap  # the cap bounds every QPS searched, the first one too
        self.start_qps = start
        self.trace: list[dict] = []
        self.highest_pass: float | None = None
        self.lowest_fail: float | None = None
        self.stopped: str | None = None
        self._pending: float | None = start

    # -- sequencing ----------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.stopped is not None

    def next_qps(self) -> float | None:
        """The QPS the search needs next (None once done)."""
        return self._pending

    def tell(self, qps: float, outcome: TrialOutcome) -> None:
        """Record the outcome of ``next_qps()`` and plan the next trial."""
        _check_told(self, qps)
        if outcome.passed is None and not outcome.timed_out:
            raise ValueError("adaptive search needs a pass/fail verdict (an SLA); got passed=None")
        passed = bool(outcome.passed) and not outcome.timed_out
        self.trace.append(_entry(qps, passed, outcome))
        if outcome.timed_out:
            self._finish("timed_out")
            return
        if passed:
            if self.highest_pass is None or qps > self.highest_pass:
                self.highest_pass = qps
        elif self.lowest_fail is None or qps < self.lowest_fail:
            self.lowest_fail = qps
        self._plan_next()

    def _finish(self, reason: str) -> None:
        self.stopped = reason
        self._pending = None

    def _plan_next(self) -> None:
        p, f = self.highest_pass, self.lowest_fail
        if f is None:  # growing: every trial so far passed
            cap = self.max_qps_cap
            if cap is not None and p >= cap:
                return self._finish("cap")
            nxt = p * 2.0
            if cap is not None and nxt > cap:
                nxt = cap
        elif p is None:  # shrinking: every trial so far failed
            nxt = f / 2.0
            if nxt < self.min_qps:
                return self._finish("no_pass")
        else:  # bisecting
            if (f - p) / p * 100.0 <= self.min_search_granularity_pct:
                return self._finish("converged")
            nxt = (p + f) / 2.0
            if not p < nxt < f:  # the bounds are adjacent floats: nothing left to split
                return self._finish("converged")
        if len(self.trace) >= self.max_iterations:
            return self._finish("max_iterations")
        self._pending = nxt

    def outcome(self) -> SearchOutcome:
        if not self.done:
            raise RuntimeError("the search is not done")
        return SearchOutcome(self.highest_pass, list(self.trace), self.stopped)

    # -- speculation ---------------------------------------------------------------------------
    def likely_path(self, n: int) -> list[float]:
        """While the search grows (no trial failed yet: a growing search mostly passes), the next
        ``n`` QPS it needs after ``next_qps()`` if every trial passes (fewer where it would stop);
        empty otherwise."""
        out: list[float] = []
        if self.done or self.lowest_fail is not None:
            return out
        twin = self
        while len(out) < n:
            twin = twin._clone()
            twin.tell(twin._pending, TrialOutcome(passed=True))
            if twin.done:
                break
            out.append(twin.next_qps())
        return out

    def _clone(self) -> "AdaptivePlan":
        twin = copy.copy(self)
        twin.trace = list(self.trace)
        return twin

    def speculative(self, depth: int) -> list[float]:
        """The distinct QPS the next ``depth`` trials may need, whatever their pass/fail outcomes,
        breadth first (the first is ``next_qps()``; at most ``2**depth - 1`` points; within the
        ``max_iterations`` budget). Empty once done."""
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be an integer >= 1, not {depth!r}")
        out: list[float] = []
        level = [self] if not self.done else []
        for _ in range(depth):
            nxt_level = []
            for plan in level:
                q = plan.next_qps()
                if q not in out:
                    out.append(q)
                for verdict in (True, False):
                    twin = plan._clone()
                    twin.tell(q, TrialOutcome(passed=verdict))
                    if not twin.done:
                        nxt_level.append(twin)
            level = nxt_level
        return out


def adaptive_plan(start_qps: float, *, max_iterations: int = 20, min_search_granularity_pct: float = 2.5,
                  max_qps_cap: float | None = None, min_qps: float = 1e-3) -> AdaptivePlan:
    """A fresh ``AdaptivePlan`` (the sequencer form of ``adaptive_search``)."""
    return AdaptivePlan(start_qps, max_iterations=max_iterations,
                        min_search_granularity_pct=min_search_granularity_pct, max_qps_cap=max_qps_cap,
                        min_qps=min_qps)


def adaptive_search(evaluate: Callable[[float], TrialOutcome], start_qps: float, *, max_iterations: int = 20,
                    min_search_granularity_pct: float = 2.5, max_qps_cap: float | None = None,
                    min_qps: float = 1e-3) -> SearchOutcome:
    """Double from ``start_qps`` until a trial fails, then bisect (see the module doc). Each QPS
    is evaluated at most once."""
    return adaptive_search_batched(lambda points: [evaluate(q) for q in points], start_qps, lookahead=1,
                                   max_iterations=max_iterations,
                                   min_search_granularity_pct=min_search_granularity_pct, max_qps_cap=max_qps_cap,
                                   min_qps=min_qps)


def adaptive_search_batched(evaluate_many: Callable[[list[float]], Iterable[TrialOutcome]], start_qps: float, *,
                            lookahead: int = 2, max_iterations: int = 20, min_search_granularity_pct: float = 2.5,
                            max_qps_cap: float | None = None, min_qps: float = 1e-3) -> SearchOutcome:
    """``adaptive_search`` with speculation: each round evaluates, in one ``evaluate_many`` call,
    the not yet evaluated points the next ``lookahead`` trials may need (at most
    ``2**lookahead - 1``), then advances the search through every outcome it has. The result,
    trace and stop reason equal ``adaptive_search``'s for a deterministic evaluator; the trials
    the search never needed are listed in ``SearchOutcome.speculative``. ``lookahead=1`` is the
    sequential search."""
    plan = adaptive_plan(start_qps, max_iterations=max_iterations,
                         min_search_granularity_pct=min_search_granularity_pct, max_qps_cap=max_qps_cap,
                         min_qps=min_qps)
    seen: dict[float, TrialOutcome] = {}
    while not plan.done:
        q = plan.next_qps()
        if q not in seen:
            points = [x for x in plan.speculative(lookahead) if x not in seen]
            outcomes = list(evaluate_many(points))
            if len(outcomes) != len(points):
                raise ValueError(f"evaluate_many returned {len(outcomes)} outcomes for {len(points)} QPS")
            for x, o in zip(points, outcomes):
                seen[x] = _checked(o, x)
        plan.tell(q, seen[q])
    result = plan.outcome()
    used = {e["qps"] for e in result.trace}
    result.speculative = [_entry(x, None if o.passed is None else (o.passed and not o.timed_out), o)
                          for x, o in seen.items() if x not in used]
    return result


def _check_told(plan, qps: float) -> None:
    """A sequencer is told the QPS it asked for, and only before it is done."""
    if plan.done:
        raise RuntimeError("the search is already done")
    if qps != plan.next_qps():
        raise ValueError(f"told QPS {qps!r}, but the search asked for {plan.next_qps()!r}")


def _checked(outcome: TrialOutcome, qps: float) -> TrialOutcome:
    if not isinstance(outcome, TrialOutcome):
        raise TypeError(f"the evaluator returned {type(outcome).__name__} for QPS {qps!r}, not a TrialOutcome")
    return outcome


class LinearPlan:
    """The linear sweep as a sequencer (``next_qps`` / ``tell`` / ``done`` / ``outcome``, as
    ``AdaptivePlan``): every listed QPS in order, each once; ``speculative(depth)``: the next
    ``depth`` QPS of the list (a sweep needs every one until a trial times out)."""

    def __init__(self, qps_list: list[float]) -> None:
        values = [_positive("qps_list entry", q) for q in qps_list]
        if not values:
            raise ValueError("qps_list is empty")
        self._todo = list(dict.fromkeys(values))  # (a QPS listed twice runs once, at its first place)
        self.trace: list[dict] = []
        self.best: float | None = None
        self.stopped: str | None = None

    @property
    def done(self) -> bool:
        return self.stopped is not None

    def next_qps(self) -> float | None:
        return None if self.done else self._todo[len(self.trace)]

    def tell(self, qps: float, outcome: TrialOutcome) -> None:
        _check_told(self, qps)
        passed = outcome.passed
        if outcome.timed_out and passed is not None:
            passed = False
        self.trace.append(_entry(qps, passed, outcome))
        if passed and (self.best is None or qps > self.best):
            self.best = qps
        if outcome.timed_out:
            self.stopped = "timed_out"
        elif len(self.trace) == len(self._todo):
            self.stopped = "list_done"

    def speculative(self, depth: int) -> list[float]:
        return [] if self.done else self._todo[len(self.trace):len(self.trace) + depth]

    def outcome(self) -> SearchOutcome:
        if not self.done:
            raise RuntimeError("the sweep is not done")
        return SearchOutcome(self.best, list(self.trace), self.stopped)


def linear_search(evaluate: Callable[[float], TrialOutcome], qps_list: list[float]) -> SearchOutcome:
    """Evaluate every QPS of ``qps_list`` in order; the result is the highest passing one (None
    when none passed or the evaluator has no SLA, ``passed=None``). A timed-out trial counts as
    not passed (``passed`` stays None without an SLA) and stops the sweep."""
    plan = LinearPlan(qps_list)
    while not plan.done:
        q = plan.next_qps()
        plan.tell(q, _checked(evaluate(q), q))
    return plan.outcome()
