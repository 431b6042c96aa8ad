"""Spica objectives (§7.6): every target's value and sign, strict_sla's inclusive limits, missing
samples, the reason categories and their order, ranking ties, min_gpus ranking and the Pareto front."""

from __future__ import annotations

import math
import random

import pytest

from aisim.search.spica.objectives import TARGETS, Score, directions, pareto_front, rank_key, score

# avg GPUs = gpu_hours / (duration_ms / 3.6e6) = 16 / 2 = 8
METRICS = {
    "duration_ms": 7.2e6, "gpu_hours": 16.0,
    "output_throughput_tok_s": 2000.0, "goodput_output_throughput_tok_s": 1600.0,
    "goodput_request_throughput_rps": 4.0, "mean_output_token_throughput_per_user": 40.0,
    "mean_ttft_ms": 250.0, "num_ttft_samples": 100, "mean_tpot_ms": 20.0, "num_tpot_samples": 100,
    "mean_e2e_latency_ms": 3000.0, "num_e2e_latency_samples": 100,
}


def _score(target, metrics=None, used_gpus=4, sla=None, strict_sla=False, constraints=None, **kw) -> Score:
    return score(target, METRICS if metrics is None else metrics, used_gpus, sla=sla, strict_sla=strict_sla,
                 constraints=constraints, **kw)


def _m(**changes) -> dict:
    m = dict(METRICS)
    for k, v in changes.items():
        if v is ...:
            del m[k]
        else:
            m[k] = v
    return m


# -- values and signs ----------------------------------------------------------------------------
@pytest.mark.parametrize("target, values, objectives", [
    ("throughput", (2000.0,), {"throughput": 2000.0}),
    ("throughput_per_gpu", (250.0,), {"throughput_per_gpu": 250.0}),
    ("throughput_per_user", (40.0,), {"throughput_per_user": 40.0}),
    ("goodput", (1600.0,), {"goodput": 1600.0}),
    ("goodput_per_gpu", (200.0,), {"goodput_per_gpu": 200.0}),
    ("ttft", (-250.0,), {"ttft": 250.0}),
    ("e2e_latency", (-3000.0,), {"e2e_latency": 3000.0}),
    ("min_gpus", (-4.0,), {"min_gpus": 4}),
    ("pareto", (250.0, 40.0), {"throughput_per_gpu": 250.0, "throughput_per_user": 40.0}),
])
def test_each_target_value_and_sign(target, values, objectives):
    assert _score(target, sla={"ttft_ms": 500.0}) == Score(values=values, objectives=objectives, status="feasible",
                                                           reason_category=None, reason=None)


def test_targets_and_directions():
    assert TARGETS == ("throughput", "throughput_per_gpu", "throughput_per_user", "goodput", "goodput_per_gpu",
                       "ttft", "e2e_latency", "min_gpus", "pareto")
    for t in TARGETS:
        assert directions(t) == (["maximize", "maximize"] if t == "pareto" else ["maximize"])
    assert directions("pareto", ["throughput", "ttft", "goodput"]) == ["maximize"] * 3
    with pytest.raises(ValueError, match="unknown target"):
        directions("latency")


def test_pareto_objectives_can_be_chosen_and_minimised_ones_are_negated():
    s = _score("pareto", pareto_objectives=("throughput", "ttft"))
    assert s.values == (2000.0, -250.0) and s.objectives == {"throughput": 2000.0, "ttft": 250.0}
    for bad in (["throughput"], ["throughput", "throughput"], ["throughput", "min_gpus"]):
        with pytest.raises(ValueError):
            _score("pareto", pareto_objectives=bad)
    with pytest.raises(ValueError, match="only applies"):
        _score("throughput", pareto_objectives=("throughput", "ttft"))


# -- strict SLA ----------------------------------------------------------------------------------
@pytest.mark.parametrize("sla", [{"ttft_ms": 250.0, "itl_ms": 20.0}, {"e2e_ms": 3000.0},
                                 {"ttft": 250.0, "itl": 20.0, "e2e": 3000.0}])
def test_strict_sla_limits_are_inclusive(sla):
    assert _score("throughput", sla=sla, strict_sla=True).status == "feasible"


@pytest.mark.parametrize("sla, reason", [
    ({"ttft_ms": 249.999}, "mean_ttft_ms 250 > SLA ttft_ms 249.999"),
    ({"ttft_ms": 500.0, "itl_ms": 19.5}, "mean_tpot_ms 20 > SLA itl_ms 19.5"),
    ({"e2e": 2999.0}, "mean_e2e_latency_ms 3000 > SLA e2e_ms 2999"),
])
def test_strict_sla_violation_is_infeasible(sla, reason):
    s = _score("throughput", sla=sla, strict_sla=True)
    assert s == Score(values=None, objectives={"throughput": 2000.0}, status="infeasible",
                      reason_category="sla_constraint", reason=reason)
    assert _score("throughput", sla=sla, strict_sla=False).status == "feasible"  # not strict: not checked


@pytest.mark.parametrize("changes, reason", [
    ({"num_tpot_samples": 0}, "mean_tpot_ms has no samples (SLA itl_ms 50)"),
    ({"mean_tpot_ms": None}, "mean_tpot_ms has no samples (SLA itl_ms 50)"),
    ({"mean_tpot_ms": ...}, "mean_tpot_ms has no samples (SLA itl_ms 50)"),
    ({"num_ttft_samples": 0}, "mean_ttft_ms has no samples (SLA ttft_ms 500)"),
])
def test_strict_sla_missing_or_zero_samples_fail(changes, reason):
    s = _score("throughput", _m(**changes), sla={"ttft_ms": 500.0, "itl_ms": 50.0}, strict_sla=True)
    assert (s.status, s.reason_category, s.reason) == ("infeasible", "sla_constraint", reason)


def test_unknown_or_bad_sla_is_a_caller_error():
    with pytest.raises(ValueError, match="unknown SLA key"):
        _score("throughput", sla={"tpot_ms": 5.0}, strict_sla=True)
    with pytest.raises(ValueError, match="positive"):
        _score("throughput", sla={"ttft_ms": 0.0}, strict_sla=True)


# -- samples and invalid metrics -----------------------------------------------------------------
@pytest.mark.parametrize("changes", [{"num_ttft_samples": 0}, {"mean_ttft_ms": None, "num_ttft_samples": 0},
                                     {"mean_ttft_ms": None}])
def test_ttft_without_samples_is_infinite_and_not_scored(changes):
    s = _score("ttft", _m(**changes))
    assert s == Score(values=None, objectives={"ttft": math.inf}, status="infeasible", reason_category="no_samples",
                      reason="no num_ttft_samples (the ttft objective is infinite)")


@pytest.mark.parametrize("target, changes, category, reason", [
    ("throughput", {"output_throughput_tok_s": None}, "no_samples",
     "output_throughput_tok_s is null (nothing completed)"),
    ("e2e_latency", {"num_e2e_latency_samples": 0}, "no_samples",
     "no num_e2e_latency_samples (the e2e_latency objective is infinite)"),
    ("throughput_per_gpu", {"duration_ms": 0.0}, "no_samples", "duration_ms is 0 (nothing completed)"),
    ("throughput_per_gpu", {"gpu_hours": 0.0}, "invalid_metrics",
     "cannot average GPUs from gpu_hours=0.0, duration_ms=7200000.0"),
    ("throughput", {"output_throughput_tok_s": math.nan}, "invalid_metrics",
     "output_throughput_tok_s is not a finite number: nan"),
    ("goodput_per_gpu", {"gpu_hours": math.inf}, "invalid_metrics", "gpu_hours is not a finite number: inf"),
    ("throughput_per_user", {"mean_output_token_throughput_per_user": "40"}, "invalid_metrics",
     "mean_output_token_throughput_per_user is not a finite number: '40'"),
    ("throughput", {"output_throughput_tok_s": True}, "invalid_metrics",
     "output_throughput_tok_s is not a finite number: True"),
    ("goodput", {"goodput_output_throughput_tok_s": ...}, "invalid_metrics",
     "the replay summary has no goodput_output_throughput_tok_s"),
    ("throughput", {"mean_tpot_ms": math.nan}, "invalid_metrics", "mean_tpot_ms is not a finite number: nan"),
])
def test_no_samples_and_invalid_metrics(target, changes, category, reason):
    s = _score(target, _m(**changes), sla={"itl_ms": 50.0}, strict_sla=True)
    assert (s.values, s.status, s.reason_category, s.reason) == (None, "infeasible", category, reason)


def test_no_summary_is_invalid_metrics():
    s = score("throughput", None, 4, sla=None, strict_sla=False, constraints=None)
    assert (s.status, s.reason_category) == ("infeasible", "invalid_metrics")


def test_unknown_target_raises():
    with pytest.raises(ValueError, match="unknown target"):
        _score("latency")


# -- GPU budget and precedence -------------------------------------------------------------------
@pytest.mark.parametrize("gpus, status, reason", [
    (1, "infeasible", "used_gpus 1 < min_candidate_gpus 2"), (2, "feasible", None), (8, "feasible", None),
    (9, "infeasible", "used_gpus 9 > max_candidate_gpus 8")])
def test_gpu_budget_bounds_are_inclusive(gpus, status, reason):
    s = _score("throughput", used_gpus=gpus, constraints={"min_candidate_gpus": 2, "max_candidate_gpus": 8})
    assert (s.status, s.reason) == (status, reason)
    assert s.reason_category == (None if status == "feasible" else "gpu_budget")


def test_gpu_budget_is_checked_before_the_metrics():
    s = _score("throughput", _m(output_throughput_tok_s=math.nan), used_gpus=64,
               constraints={"max_candidate_gpus": 32})
    assert s.reason_category == "gpu_budget"


# -- min_gpus ------------------------------------------------------------------------------------
MIN_SLA = {"ttft_ms": 500.0, "itl_ms": 50.0}


@pytest.mark.parametrize("changes, constraints, offered, category, reason", [
    ({}, {"min_goodput_rps": 4.0}, None, None, None),  # inclusive
    ({}, {"min_goodput_rps": 4.5}, None, "load_constraint", "goodput_request_throughput_rps 4 < min_goodput_rps 4.5"),
    ({"goodput_request_throughput_rps": None}, {"min_goodput_rps": 1.0}, None, "load_constraint",
     "goodput_request_throughput_rps 0 < min_goodput_rps 1"),
    ({}, {"min_goodput_rps": 3.0}, 2.0, "load_constraint", "min_goodput_rps 3 > offered rate 2 rps"),
    ({"mean_ttft_ms": 501.0}, {"min_goodput_rps": 1.0}, None, "sla_constraint", "mean_ttft_ms 501 > SLA ttft_ms 500"),
    ({"goodput_request_throughput_rps": ...}, {}, None, "invalid_metrics",
     "the replay summary has no goodput_request_throughput_rps"),
])
def test_min_gpus_needs_goodput_and_the_mean_sla(changes, constraints, offered, category, reason):
    s = _score("min_gpus", _m(**changes), used_gpus=6, sla=MIN_SLA, strict_sla=False, constraints=constraints,
               offered_rps=offered)
    assert (s.reason_category, s.reason) == (category, reason)
    assert s.values == ((-6.0,) if category is None else None)
    if category != "invalid_metrics":
        assert s.objectives == {"min_gpus": 6}


# -- ranking -------------------------------------------------------------------------------------
def _cand(cid, status="feasible", score=None, gpus=4, config=None, metrics=None):
    return {"candidate_id": f"candidate-{cid:06d}", "status": status, "score": score, "used_gpus": gpus,
            "config": config if config is not None else {"id": cid}, "metrics": metrics or {}}


def _ids(cands, target=None):
    return [c["candidate_id"][-1] for c in sorted(cands, key=lambda c: rank_key(c, target))]


def test_rank_by_score_then_fewer_gpus_then_canonical_config_json():
    cands = [
        _cand(1, score=10.0, gpus=8, config={"b": 1}),
        _cand(2, score=10.0, gpus=4, config={"b": 2, "a": 9}),  # '{"a": 9, "b": 2}'
        _cand(3, score=10.0, gpus=4, config={"b": 1, "a": 10}),  # '{"a": 10, "b": 1}' < '{"a": 9, ...'
        _cand(4, score=12.5, gpus=16),
        _cand(5, "infeasible", gpus=1, config={"z": 0}),
        _cand(6, "failed", gpus=None),
        _cand(7, "timed_out", gpus=1, config={"a": 0}),
    ]
    assert _ids(cands) == ["4", "3", "2", "1", "7", "5", "6"]
    assert _ids(list(reversed(cands))) == ["4", "3", "2", "1", "7", "5", "6"]


def test_identical_configs_fall_back_to_the_candidate_id():
    a, b = _cand(2, score=1.0, config={"x": 1}), _cand(1, score=1.0, config={"x": 1})
    assert _ids([a, b]) == ["1", "2"]


def test_vector_scores_rank_lexicographically():
    cands = [_cand(1, score=[5.0, 1.0]), _cand(2, score=[5.0, 3.0]), _cand(3, score=[6.0, 0.0])]
    assert _ids(cands, "pareto") == ["3", "2", "1"]


def test_min_gpus_rank_fewer_gpus_then_goodput_then_e2e():
    def c(cid, gpus, goodput, e2e, config=None):
        return _cand(cid, score=-float(gpus), gpus=gpus, config=config,
                     metrics={"goodput_output_throughput_tok_s": goodput, "mean_e2e_latency_ms": e2e})
    cands = [c(1, 8, 9000.0, 100.0), c(2, 4, 1000.0, 900.0), c(3, 4, 2000.0, 800.0), c(4, 4, 2000.0, 700.0),
             c(5, 4, 2000.0, 700.0, config={"a": 1}), _cand(6, "infeasible", gpus=1)]
    assert _ids(cands, "min_gpus") == ["5", "4", "3", "2", "1", "6"]
    # without the target, equal scores and GPUs fall through to the config JSON ('{"a": 1}' < '{"id": 2}')
    assert _ids(cands) == ["5", "2", "3", "4", "1", "6"]


# -- Pareto front --------------------------------------------------------------------------------
def test_pareto_front_on_a_hand_made_set():
    cands = [
        _cand(1, score=[10.0, 1.0]),       # front
        _cand(2, score=[8.0, 4.0], gpus=4),  # front
        _cand(3, score=[5.0, 5.0]),        # front
        _cand(4, score=[5.0, 3.0]),        # dominated by 3
        _cand(5, score=[8.0, 4.0], gpus=2),  # same point as 2: kept, ranks first (fewer GPUs)
        _cand(6, score=[9.0, 0.5]),        # dominated by 1
        _cand(7, score=[1.0, 5.0]),        # dominated by 3 (equal second, lower first)
        _cand(8, "infeasible", score=None),
        {**_cand(9, score=[100.0, 100.0]), "status": "failed"},  # not feasible: ignored
    ]
    assert [c["candidate_id"][-1] for c in pareto_front(cands)] == ["1", "5", "2", "3"]
    assert pareto_front([_cand(8, "infeasible")]) == []


def test_pareto_front_sweep_matches_brute_force():
    rng = random.Random(7)
    for _ in range(50):
        cands = [_cand(i, score=[float(rng.randint(0, 6)), float(rng.randint(0, 6))]) for i in range(25)]
        vals = [tuple(c["score"]) for c in cands]
        brute = {c["candidate_id"] for c, v in zip(cands, vals)
                 if not any(all(x >= y for x, y in zip(w, v)) and w != v for w in vals)}
        front = pareto_front(cands)
        assert {c["candidate_id"] for c in front} == brute
        lasts = [c["score"][-1] for c in front]
        assert lasts == sorted(lasts)


def test_pareto_front_three_objectives():
    cands = [_cand(1, score=[1.0, 2.0, 3.0]), _cand(2, score=[1.0, 2.0, 2.0]), _cand(3, score=[3.0, 0.0, 0.0])]
    assert [c["candidate_id"][-1] for c in pareto_front(cands)] == ["3", "1"]
