"""Retune early drop: the score bound by hand (the exact request at which a candidate is dropped),
and sweeps and a whole retuned replay that decide exactly as without it."""

from __future__ import annotations

import pytest

from aisim.search.fanout import fanout
from aisim.search.retune.early import DropMonitor, DropSpec, drop_spec
from aisim.search.retune.sweep import sweep
from aisim.simulator.errors import InputError
from tests.search.test_retune_sweep import DOMAINS, base  # noqa: F401 - the window fixture


def _row(i, out=100, last_s=1.0, ttft=100.0, tpot=10.0, status="completed"):
    """A request_metrics.csv row (REQUEST_CSV_COLUMNS order)."""
    e2e = "" if last_s == "" else 1000.0 * last_s
    return (f"r{i}", status, 0, 0.0, 0.0, 0.1, last_s, 512, out, 0, 0.0, ttft, tpot, tpot, e2e)


def _monitor(bar, total=1000, gpus=2, limits=(500.0, 50.0, None), n=10):
    return DropMonitor(DropSpec(bar=bar, total_output_tokens=total, gpus=gpus, sla_set=True, limits=limits), n)


def test_the_bound_counts_every_token_still_possible_over_the_gpu_hours_so_far():
    m = _monitor(bar=1e9)
    assert m.bound() is None  # nothing completed: no duration yet, no bound
    m.observe({}, _row(0, out=100, last_s=1.8))  # good
    m.observe({}, _row(1, out=100, last_s=3.6, ttft=900.0))  # TTFT over the limit: never good
    m.observe({}, _row(2, status="rejected", out=0, last_s=""))
    # (100 good + 800 still possible) tokens / (2 GPUs x 3.6 s = 0.002 GPU-hours)
    assert m.bound() == pytest.approx(900 / 0.002)


def test_a_candidate_is_dropped_at_the_first_checkpoint_whose_bound_reaches_the_bar():
    # ten requests of 100 tokens, one a checkpoint; each completes 3.6 s after the last, TTFT too
    # slow for the SLA: after k of them the bound is (1000 - 100 k) / (2 x 3.6 k / 3600)
    m = _monitor(bar=100_000.0)
    reasons = []
    for k in range(1, 10):
        m.observe({}, _row(k, out=100, last_s=3.6 * k, ttft=900.0))
        reasons.append(m.check(3600.0 * k, k))
        if reasons[-1] is not None:
            break  # (the replay stops here)
    bounds = [(1000 - 100 * k) / (2 * 3.6 * k / 3600) for k in range(1, 10)]
    first = next(k for k, b in enumerate(bounds, 1) if b <= 100_000.0)
    assert first == 4  # 600 / 0.008 = 75,000 (k = 3: 700 / 0.006 = 116,667 is still above the bar)
    assert reasons[:first - 1] == [None] * (first - 1)
    assert reasons[first - 1] == "score at most 75000 <= 100000 needed to switch"
    assert m.decision == {"bound": pytest.approx(75_000.0), "bar": 100_000.0, "ended_requests": 4, "at_s": 14.4}


def test_a_window_with_a_planner_is_never_dropped(base):  # noqa: F811
    import dataclasses

    assert drop_spec(base, 10.0, 3.0).bar == pytest.approx(10.3)
    assert drop_spec(dataclasses.replace(base, planner=object()), 10.0, 3.0) is None


@pytest.mark.parametrize("threshold", [0.0, 3.0, 25.0])
def test_a_sweep_with_early_drop_decides_as_the_full_sweep(base, threshold):  # noqa: F811
    with fanout("local", max_parallel=2) as fan:
        full = sweep(base, DOMAINS, fan, min_improvement_percentage=threshold)
        early = sweep(base, DOMAINS, fan, min_improvement_percentage=threshold, early_drop=True)
    assert (early.outcome, early.chosen) == (full.outcome, full.chosen)
    assert early.current == full.current
    bar = full.current["score"] * (1 + threshold / 100)
    for e, f in zip(early.candidates, full.candidates):
        assert e["point"] == f["point"]
        if e["status"] == "dropped":  # only a candidate that could not clear the bar
            assert e["score"] is None and f["score"] <= bar <= e["dropped"]["bar"] * (1 + 1e-12)
            assert f["score"] <= e["dropped"]["bound"]
        else:
            assert e["score"] == f["score"]
    if threshold == 25.0:
        assert any(c["status"] == "dropped" for c in early.candidates)


def test_early_drop_is_refused_with_tpe():
    from aisim.simulator.config.retune import RetuneConfig

    with pytest.raises((InputError, ValueError), match="early_drop"):
        RetuneConfig.model_validate({"interval_seconds": 60, "sampler": "tpe", "max_candidates": 4,
                                     "early_drop": True})
