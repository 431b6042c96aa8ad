"""Capacity-search algorithms: exact trial sequences for stub evaluators with known thresholds."""

from __future__ import annotations

import pytest

from aisim.search.capacity.algorithms import (
    SearchOutcome,
    TrialOutcome,
    adaptive_plan,
    adaptive_search,
    adaptive_search_batched,
    linear_search,
)


class Stub:
    """pass iff qps <= threshold; records every call; optional timeout at given QPS."""

    def __init__(self, threshold: float, timeout_at: tuple[float, ...] = (), sla: bool = True) -> None:
        self.threshold = threshold
        self.timeout_at = timeout_at
        self.sla = sla
        self.calls: list[float] = []

    def __call__(self, qps: float) -> TrialOutcome:
        self.calls.append(qps)
        if qps in self.timeout_at:
            return TrialOutcome(passed=False if self.sla else None, timed_out=True, extra={"cached": False})
        if not self.sla:
            return TrialOutcome(passed=None, extra={"cached": False})
        return TrialOutcome(passed=qps <= self.threshold, extra={"cached": False})

    def many(self, points: list[float]) -> list[TrialOutcome]:
        return [self(q) for q in points]


def qps_of(result: SearchOutcome) -> list[float]:
    return [e["qps"] for e in result.trace]


# -- adaptive ------------------------------------------------------------------------------------

def test_adaptive_doubles_then_bisects_until_granularity():
    # pass iff qps <= 11.3 from 2, granularity 2.5 %:
    # 2 P, 4 P, 8 P, 16 F (bounds 8..16), 12 F (8..12), 10 P (10..12), 11 P (11..12: 9.1 %),
    # 11.5 F (11..11.5: 4.5 %), 11.25 P (11.25..11.5: 0.25 / 11.25 = 2.22 % <= 2.5) -> stop
    stub = Stub(11.3)
    r = adaptive_search(stub, 2.0)
    assert qps_of(r) == [2.0, 4.0, 8.0, 16.0, 12.0, 10.0, 11.0, 11.5, 11.25]
    assert [e["passed"] for e in r.trace] == [True, True, True, False, False, True, True, False, True]
    assert r.max_qps_under_sla == 11.25
    assert r.stopped == "converged"
    assert stub.calls == qps_of(r)  # each QPS evaluated once, in trace order
    assert r.trace[0] == {"qps": 2.0, "passed": True, "timed_out": False, "cached": False}
    assert r.speculative == []


def test_adaptive_granularity_is_relative_to_the_highest_pass():
    # with 5 %: after 11.5 F the bounds 11..11.5 are 4.55 % apart -> stop at 11
    r = adaptive_search(Stub(11.3), 2.0, min_search_granularity_pct=5.0)
    assert qps_of(r) == [2.0, 4.0, 8.0, 16.0, 12.0, 10.0, 11.0, 11.5]
    assert (r.max_qps_under_sla, r.stopped) == (11.0, "converged")


def test_adaptive_start_failing_halves_until_a_pass_then_bisects():
    # pass iff qps <= 0.3 from 2: 2 F, 1 F, 0.5 F, 0.25 P, then bisect 0.25..0.5:
    # 0.375 F, 0.3125 F, 0.28125 P, 0.296875 P, 0.3046875 F (2.63 %), 0.30078125 F (1.32 %) -> stop
    r = adaptive_search(Stub(0.3), 2.0)
    assert qps_of(r) == [2.0, 1.0, 0.5, 0.25, 0.375, 0.3125, 0.28125, 0.296875, 0.3046875, 0.30078125]
    assert r.max_qps_under_sla == 0.296875
    assert r.stopped == "converged"


def test_adaptive_none_passing_is_null():
    # halving stops before going below min_qps: 2 / 2**11 = 0.000977 < 0.001 is not evaluated
    r = adaptive_search(Stub(0.0001), 2.0)
    assert qps_of(r) == [2.0 / 2**k for k in range(11)]
    assert r.max_qps_under_sla is None
    assert r.stopped == "no_pass"
    r = adaptive_search(Stub(0.0), 1.0, min_qps=0.3)
    assert qps_of(r) == [1.0, 0.5]
    assert (r.max_qps_under_sla, r.stopped) == (None, "no_pass")


def test_adaptive_cap_passing_ends_the_search_at_the_cap():
    # doubling past the cap evaluates the cap itself
    r = adaptive_search(Stub(100.0), 2.0, max_qps_cap=10.0)
    assert qps_of(r) == [2.0, 4.0, 8.0, 10.0]
    assert (r.max_qps_under_sla, r.stopped) == (10.0, "cap")
    # a cap hit exactly by doubling
    r = adaptive_search(Stub(100.0), 2.0, max_qps_cap=8.0)
    assert qps_of(r) == [2.0, 4.0, 8.0]
    assert (r.max_qps_under_sla, r.stopped) == (8.0, "cap")


def test_adaptive_cap_failing_bisects_below_it():
    # 10 F -> bisect 8..10: 9 P (11.1 %), 9.5 F (5.6 %), 9.25 F (2.8 %), 9.125 F (1.4 %) -> stop
    r = adaptive_search(Stub(9.0), 2.0, max_qps_cap=10.0)
    assert qps_of(r) == [2.0, 4.0, 8.0, 10.0, 9.0, 9.5, 9.25, 9.125]
    assert (r.max_qps_under_sla, r.stopped) == (9.0, "converged")


def test_adaptive_start_above_the_cap_starts_at_the_cap():
    r = adaptive_search(Stub(100.0), 50.0, max_qps_cap=10.0)
    assert qps_of(r) == [10.0]
    assert (r.max_qps_under_sla, r.stopped) == (10.0, "cap")


def test_adaptive_max_iterations():
    r = adaptive_search(Stub(11.3), 2.0, max_iterations=6)
    assert qps_of(r) == [2.0, 4.0, 8.0, 16.0, 12.0, 10.0]
    assert (r.max_qps_under_sla, r.stopped) == (10.0, "max_iterations")
    # never failing: doubling until the budget
    r = adaptive_search(Stub(1e9), 1.0, max_iterations=5)
    assert qps_of(r) == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert (r.max_qps_under_sla, r.stopped) == (16.0, "max_iterations")
    # never passing: halving until the budget
    r = adaptive_search(Stub(0.0), 8.0, max_iterations=3)
    assert qps_of(r) == [8.0, 4.0, 2.0]
    assert (r.max_qps_under_sla, r.stopped) == (None, "max_iterations")
    # converging on the last allowed trial reports convergence (9 trials in the 11.3 example)
    r = adaptive_search(Stub(11.3), 2.0, max_iterations=9)
    assert (len(r.trace), r.max_qps_under_sla, r.stopped) == (9, 11.25, "converged")
    r = adaptive_search(Stub(11.3), 2.0, max_iterations=8)
    assert (len(r.trace), r.max_qps_under_sla, r.stopped) == (8, 11.0, "max_iterations")


def test_adaptive_timeout_stops_and_keeps_the_highest_pass():
    r = adaptive_search(Stub(11.3, timeout_at=(12.0,)), 2.0)
    assert qps_of(r) == [2.0, 4.0, 8.0, 16.0, 12.0]
    assert r.trace[-1] == {"qps": 12.0, "passed": False, "timed_out": True, "cached": False}
    assert (r.max_qps_under_sla, r.stopped) == (8.0, "timed_out")
    r = adaptive_search(Stub(11.3, timeout_at=(2.0,)), 2.0)
    assert (qps_of(r), r.max_qps_under_sla, r.stopped) == ([2.0], None, "timed_out")


def test_adaptive_zero_granularity_bisects_to_the_budget():
    r = adaptive_search(Stub(3.0), 2.0, min_search_granularity_pct=0.0, max_iterations=6)
    assert qps_of(r) == [2.0, 4.0, 3.0, 3.5, 3.25, 3.125]
    assert (r.max_qps_under_sla, r.stopped) == (3.0, "max_iterations")


def test_adaptive_needs_a_verdict_and_valid_settings():
    with pytest.raises(ValueError, match="verdict"):
        adaptive_search(lambda q: TrialOutcome(passed=None), 2.0)
    with pytest.raises(TypeError, match="TrialOutcome"):
        adaptive_search(lambda q: True, 2.0)
    for kwargs in ({"start_qps": 0.0}, {"start_qps": -1.0}, {"start_qps": float("inf")},
                   {"start_qps": 1.0, "max_iterations": 0}, {"start_qps": 1.0, "max_qps_cap": 0.0},
                   {"start_qps": 1.0, "min_search_granularity_pct": -1.0}, {"start_qps": 1.0, "min_qps": 0.0}):
        with pytest.raises(ValueError):
            adaptive_search(Stub(1.0), **kwargs)


def test_trial_outcome_validation():
    with pytest.raises(ValueError, match="qps"):
        TrialOutcome(passed=True, extra={"qps": 1.0})
    with pytest.raises(ValueError):
        TrialOutcome(passed=1)


# -- the sequencer and speculation ---------------------------------------------------------------

def test_plan_sequencer_matches_adaptive_search():
    plan = adaptive_plan(2.0)
    asked = []
    while not plan.done:
        q = plan.next_qps()
        asked.append(q)
        plan.tell(q, TrialOutcome(passed=q <= 11.3))
    assert asked == [2.0, 4.0, 8.0, 16.0, 12.0, 10.0, 11.0, 11.5, 11.25]
    assert plan.next_qps() is None
    out = plan.outcome()
    assert (out.max_qps_under_sla, out.stopped) == (11.25, "converged")
    with pytest.raises(RuntimeError):
        plan.tell(11.25, TrialOutcome(passed=True))


def test_plan_rejects_an_unasked_qps():
    plan = adaptive_plan(2.0)
    with pytest.raises(ValueError, match="asked for 2.0"):
        plan.tell(3.0, TrialOutcome(passed=True))


def test_speculative_points_breadth_first():
    plan = adaptive_plan(2.0)
    # 2; then 4 (2 passed) or 1 (2 failed); then 8 / 3 after 4, 1.5 / 0.5 after 1
    assert plan.speculative(1) == [2.0]
    assert plan.speculative(3) == [2.0, 4.0, 1.0, 8.0, 3.0, 1.5, 0.5]
    # within the budget: one trial left -> only the next point
    plan = adaptive_plan(2.0, max_iterations=1)
    assert plan.speculative(3) == [2.0]
    # speculation leaves the plan untouched
    plan = adaptive_plan(2.0)
    plan.speculative(4)
    assert (plan.next_qps(), plan.trace) == (2.0, [])


def test_likely_path_is_the_all_pass_branch_while_growing_only():
    plan = adaptive_plan(2.0, max_qps_cap=12.0)
    assert plan.likely_path(1) == [4.0]  # 2 passes -> 4
    assert plan.likely_path(5) == [4.0, 8.0, 12.0]  # then 8, then 16 capped at 12, then done (cap)
    plan.tell(2.0, TrialOutcome(passed=True))
    assert plan.likely_path(2) == [8.0, 12.0]
    plan.tell(4.0, TrialOutcome(passed=False))  # bisecting: either verdict as likely
    assert plan.likely_path(3) == []
    assert adaptive_plan(2.0, max_iterations=1).likely_path(3) == []  # no trial after this one
    assert (plan.next_qps(), len(plan.trace)) == (3.0, 2)  # untouched


def test_batched_search_equals_the_sequential_one():
    for threshold, kwargs in ((11.3, {}), (0.3, {}), (9.0, {"max_qps_cap": 10.0}), (11.3, {"max_iterations": 6})):
        seq = adaptive_search(Stub(threshold), 2.0, **kwargs)
        for lookahead in (1, 2, 3):
            stub = Stub(threshold)
            batched = adaptive_search_batched(stub.many, 2.0, lookahead=lookahead, **kwargs)
            assert batched.trace == seq.trace
            assert (batched.max_qps_under_sla, batched.stopped) == (seq.max_qps_under_sla, seq.stopped)
            assert sorted(stub.calls) == sorted(set(stub.calls))  # never twice
            assert {e["qps"] for e in batched.speculative} == set(stub.calls) - set(qps_of(seq))
            if lookahead == 1:
                assert batched.speculative == []


def test_batched_rounds():
    rounds = []
    stub = Stub(11.3)

    def many(points):
        rounds.append(list(points))
        return stub.many(points)

    r = adaptive_search_batched(many, 2.0, lookahead=2)
    # each round: the next point, then its successor if it passes, then if it fails; 11.25 has
    # none (11.25..11.5 and 11..11.25 are both within 2.5 %)
    assert rounds == [[2.0, 4.0, 1.0], [8.0, 16.0, 6.0], [12.0, 14.0, 10.0], [11.0, 11.5, 10.5], [11.25]]
    assert qps_of(r) == [2.0, 4.0, 8.0, 16.0, 12.0, 10.0, 11.0, 11.5, 11.25]


# -- linear --------------------------------------------------------------------------------------

def test_linear_records_the_highest_passing_qps_in_list_order():
    stub = Stub(7.0)
    r = linear_search(stub, [4.0, 9.0, 7.0, 2.0])
    assert stub.calls == [4.0, 9.0, 7.0, 2.0]
    assert [(e["qps"], e["passed"]) for e in r.trace] == [(4.0, True), (9.0, False), (7.0, True), (2.0, True)]
    assert (r.max_qps_under_sla, r.stopped) == (7.0, "list_done")


def test_linear_none_passing_is_null():
    r = linear_search(Stub(1.0), [4.0, 6.0])
    assert [e["passed"] for e in r.trace] == [False, False]
    assert (r.max_qps_under_sla, r.stopped) == (None, "list_done")


def test_linear_without_sla_runs_everything_with_null_verdicts():
    stub = Stub(7.0, sla=False)
    r = linear_search(stub, [7.0, 9.0])
    assert stub.calls == [7.0, 9.0]
    assert r.trace == [{"qps": 7.0, "passed": None, "timed_out": False, "cached": False},
                       {"qps": 9.0, "passed": None, "timed_out": False, "cached": False}]
    assert (r.max_qps_under_sla, r.stopped) == (None, "list_done")


def test_linear_timeout_stops_the_sweep():
    stub = Stub(7.0, timeout_at=(6.0,))
    r = linear_search(stub, [4.0, 6.0, 2.0])
    assert stub.calls == [4.0, 6.0]
    assert [(e["qps"], e["passed"], e["timed_out"]) for e in r.trace] == [(4.0, True, False), (6.0, False, True)]
    assert (r.max_qps_under_sla, r.stopped) == (4.0, "timed_out")
    r = linear_search(Stub(7.0, timeout_at=(6.0,), sla=False), [4.0, 6.0, 2.0])
    assert [(e["passed"], e["timed_out"]) for e in r.trace] == [(None, False), (None, True)]
    assert (r.max_qps_under_sla, r.stopped) == (None, "timed_out")


def test_linear_runs_a_repeated_qps_once_and_validates():
    stub = Stub(7.0)
    r = linear_search(stub, [4.0, 6.0, 4.0])
    assert stub.calls == qps_of(r) == [4.0, 6.0]
    with pytest.raises(ValueError, match="empty"):
        linear_search(Stub(1.0), [])
    with pytest.raises(ValueError):
        linear_search(Stub(1.0), [1.0, 0.0])
