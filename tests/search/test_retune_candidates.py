"""Retune candidates through one ask/tell loop: the grid enumerates exactly the product, tpe and
random propose max_candidates seeded points, duplicates are evaluated once, failures never win."""

from __future__ import annotations

import itertools

from aisim.search.asktell import point_key
from aisim.search.retune.candidates import CandidateSearch, best
from aisim.simulator.config.retune import Domain

ROUTER = {"overlap_score_credit": Domain(values=(1.0,)), "prefill_load_scale": Domain(values=(0.5, 1.0, 2.0)),
          "temperature": Domain(values=(0.0, 1.0))}


def evaluate_by(fn, calls=None):
    def evaluate(points):
        if calls is not None:
            calls.append(len(points))
        return [fn(p) for p in points]
    return evaluate


def test_the_grid_enumerates_the_product_once_with_pinned_knobs_in_every_point():
    calls = []
    search = CandidateSearch(ROUTER, "grid", seed=7)
    scored = search.run(evaluate_by(lambda p: p["prefill_load_scale"] * 10 - p["temperature"], calls), batch=4)
    expected = [{"overlap_score_credit": 1.0, "prefill_load_scale": s, "temperature": t}
                for s, t in itertools.product((0.5, 1.0, 2.0), (0.0, 1.0))]
    assert sorted(point_key(p) for p, _ in scored) == sorted(point_key(p) for p in expected)
    assert calls == [4, 2]  # 6 points, at most 4 at a time
    assert best(scored) == ({"overlap_score_credit": 1.0, "prefill_load_scale": 2.0, "temperature": 0.0}, 20.0)


def test_the_grid_order_of_records_does_not_depend_on_the_seed():
    a = CandidateSearch(ROUTER, "grid", seed=1).run(evaluate_by(lambda p: 1.0), batch=2)
    b = CandidateSearch(ROUTER, "grid", seed=2).run(evaluate_by(lambda p: 1.0), batch=3)
    assert a == b


def test_tpe_and_random_propose_max_candidates_seeded_points_within_the_bounds():
    domains = {"temperature": Domain(low=0.0, high=2.0), "prefill_load_scale": Domain(low=0.1, high=10.0, log=True)}
    for sampler in ("tpe", "random"):
        runs = [CandidateSearch(domains, sampler, max_candidates=8, seed=3).run(
            evaluate_by(lambda p: -abs(p["temperature"] - 1.0)), batch=2) for _ in range(2)]
        assert runs[0] == runs[1] and 1 <= len(runs[0]) <= 8
        assert all(0.0 <= p["temperature"] <= 2.0 and 0.1 <= p["prefill_load_scale"] <= 10.0 for p, _ in runs[0])


def test_a_failed_candidate_never_wins_and_all_failed_is_none():
    scored = CandidateSearch(ROUTER, "grid").run(
        evaluate_by(lambda p: None if p["temperature"] == 0.0 else p["prefill_load_scale"]), batch=6)
    assert best(scored)[0]["temperature"] == 1.0 and best(scored)[1] == 2.0
    assert best(CandidateSearch(ROUTER, "grid").run(evaluate_by(lambda p: None), batch=6)) is None


def test_ties_go_to_the_earliest_point_in_canonical_order():
    scored = CandidateSearch(ROUTER, "grid").run(evaluate_by(lambda p: 5.0), batch=6)
    assert best(scored)[0] == {"overlap_score_credit": 1.0, "prefill_load_scale": 0.5, "temperature": 0.0}


def test_nothing_to_search_is_one_candidate():
    scored = CandidateSearch({"temperature": Domain(values=(0.3,))}, "grid").run(evaluate_by(lambda p: 1.0), batch=2)
    assert scored == [({"temperature": 0.3}, 1.0)]
