"""search.asktell: one ask/tell loop for every search - new points once, duplicates told from the
cache, points in flight told failed or held until they settle, budget and finite-space exhaustion."""

from __future__ import annotations

import math

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from aisim.search.asktell import AskTell, point_key

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _loop(points, **kw) -> AskTell:
    study = optuna.create_study(directions=kw.pop("directions", ["maximize"]), sampler=optuna.samplers.RandomSampler(seed=1))
    for p in points:
        study.enqueue_trial(p)
    return AskTell(study, {"x": CategoricalDistribution([1, 2, 3])}, **kw)


def _asked(loop: AskTell) -> list:
    """The study's trials that were asked (not the enqueued ones still waiting)."""
    return [t for t in loop.study.get_trials(deepcopy=False) if t.state != TrialState.WAITING]


def test_the_key_is_canonical_json():
    assert point_key({"b": 1, "a": 0.5}) == point_key({"a": 0.5, "b": 1}) == '{"a": 0.5, "b": 1}'
    assert point_key({"a": 1}) != point_key({"a": 1.0}) != point_key({"a": True})


def test_a_duplicate_is_told_the_cached_outcome_and_asked_again():
    loop = _loop([{"x": 1}, {"x": 1}, {"x": 2}], size=3)
    trial, point, key = loop.ask()
    assert point == {"x": 1} and key == '{"x": 1}'
    loop.record(trial, key, {"score": 5.0}, 5.0)
    seen = []
    trial2, point2, _ = loop.ask(outcome_of=lambda rec: rec["score"], on_duplicate=lambda t, rec: seen.append(rec))
    assert point2 == {"x": 2} and loop.cache_hits == 1 and seen == [{"score": 5.0}]
    trials = _asked(loop)
    assert [(t.state, t.values) for t in trials[:2]] == [(TrialState.COMPLETE, [5.0]), (TrialState.COMPLETE, [5.0])]
    assert trials[2].state == TrialState.RUNNING and not loop.exhausted
    loop.record(trial2, point_key(point2), {"score": None}, None)  # a failed candidate
    assert _asked(loop)[2].state == TrialState.FAIL and len(loop.seen) == 2


def test_in_flight_points_fail_and_held_points_wait_for_their_outcome():
    loop = _loop([{"x": 1}, {"x": 2}, {"x": 3}, {"x": 3}])
    loop.hold(point_key({"x": 2}))
    assert loop.ask(in_flight={point_key({"x": 1})}, attempts=1) is None  # x=1 in flight: failed
    assert loop.ask(attempts=1) is None  # x=2 held: the trial waits
    trial, point, key = loop.ask()
    assert point == {"x": 3}
    trials = _asked(loop)
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.RUNNING, TrialState.RUNNING]
    loop.settle(point_key({"x": 2}), "record", 7.0)
    assert (_asked(loop)[1].state, _asked(loop)[1].values) == (TrialState.COMPLETE, [7.0])
    assert loop.seen[point_key({"x": 2})] == "record"


def test_the_budget_counts_asks_and_a_finite_space_is_exhausted_when_seen():
    loop = _loop([{"x": 1}, {"x": 1}], budget=2)
    trial, _, key = loop.ask()
    loop.record(trial, key, None, 1.0)
    assert loop.ask() is None and loop.spent and loop.exhausted and loop.asked == 2  # (the duplicate used an ask)
    finite = _loop([{"x": 1}], size=1)
    trial, _, key = finite.ask()
    finite.record(trial, key, None, math.nan)  # a non-finite outcome is a failed trial
    assert finite.exhausted and not finite.spent
    assert finite.study.get_trials(deepcopy=False)[0].state == TrialState.FAIL


@pytest.mark.parametrize("outcome,state,values", [((1.0, 2.0), TrialState.COMPLETE, [1.0, 2.0]),
                                                  (None, TrialState.FAIL, None)])
def test_several_objectives_are_told_as_a_sequence(outcome, state, values):
    loop = _loop([{"x": 1}], directions=["maximize", "minimize"])
    trial, _, key = loop.ask()
    loop.record(trial, key, None, outcome)
    t = loop.study.get_trials(deepcopy=False)[0]
    assert (t.state, t.values) == (state, values)
