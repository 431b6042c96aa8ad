"""Load predictors and the perf model."""

from __future__ import annotations

import math

import pytest

from aisim.actors.messages import Capabilities
from aisim.actors.planner.perf_model import PURE_DECODE, PURE_PREFILL, Pass, PerfModel, bootstrap_samples
from aisim.actors.planner.predictors import Predictor, PredictorSpec, PredictorUnavailable, check_available


def run(spec, values):
    p = Predictor(spec)
    for v in values:
        p.add(v)
    return p.predict()


def test_constant_and_common_rules():
    assert run(PredictorSpec("constant"), [0, 0, 3, 5]) == 5
    p = Predictor(PredictorSpec("constant"))
    p.add(0)
    p.add(0)
    assert p.history == []  # leading zeros are skipped
    assert run(PredictorSpec("constant"), [4, float("nan")]) == 0.0  # NaN counts as 0


def test_kalman_follows_a_linear_trend():
    assert run(PredictorSpec("kalman"), [10, 20, 30, 40, 50, 60, 70]) == pytest.approx(80, rel=0.05)
    assert run(PredictorSpec("kalman", kalman_min_points=5), [10, 20]) == 20  # before min points: last value


def test_arima_constant_history_and_trend():
    assert run(PredictorSpec("arima"), [7] * 8) == 7
    pred = run(PredictorSpec("arima"), [100, 110, 120, 130, 140, 150, 160, 170])
    assert 150 < pred < 200
    assert run(PredictorSpec("arima"), [5, 6]) == 6  # fewer than 5 points: last value


def test_log1p_variant_and_nonnegative_output():
    grow = [1, 2, 4, 8, 16, 32, 64]
    raw = run(PredictorSpec("kalman"), grow)
    logged = run(PredictorSpec("kalman", log1p=True), grow)
    assert raw < 64 < logged  # the linear trend lags a doubling series; log1p extrapolates it
    assert run(PredictorSpec("kalman"), [100, 50, 20, 5, 1, 0.5]) == 0.0  # a falling trend is clamped at 0


def test_prophet_missing_names_the_extra():
    try:
        import prophet  # noqa: F401
    except ImportError:
        with pytest.raises(PredictorUnavailable, match=r"aisim\[prophet\]"):
            check_available(PredictorSpec("prophet"))


def test_a_store_keeps_at_most_max_samples_dropping_the_oldest_of_the_fullest_bucket():
    caps = Capabilities(8192, 256, 32768, 1_000_000)
    m = PerfModel("agg", caps, max_samples=16, bucket_size=16, min_observations=5)
    assert not m.ready(PURE_PREFILL)
    for t in range(200, 8001, 200):  # 40 pure prefill passes, linear in their attention term
        m.observe(Pass(1, t, 0, 0, 0), 3 + 1e-6 * t * t / 2)
    store = m.stores[PURE_PREFILL]
    assert m.ready(PURE_PREFILL) and store.num_samples == 16 and m.num_observed == 40
    assert not m.ready(PURE_DECODE)
    # the long prompts (one bucket of tokens/max_batched_tokens) lost their oldest samples first
    assert m.price(Pass(1, 4000, 0, 0, 0)) == (pytest.approx(3 + 1e-6 * 4000 * 4000 / 2), PURE_PREFILL)


def test_bootstrap_grid_matches_the_reference_spacing():
    caps = Capabilities(8192, 256, 32768, 1_000_000)
    s = bootstrap_samples(lambda t, b, kv: 1.0 + t + b, caps, "agg")
    assert [isl for isl, _ in s.prefill] == list(range(100, 8193, (8192 - 100) // 8))
    assert {ctx for _, ctx, _ in s.decode} == {500, 2000, 4000, 8000}
    assert all(b * ctx <= caps.max_kv_tokens for b, ctx, _ in s.decode)
    assert len(s.sha256) == 64 and s.sha256 == bootstrap_samples(lambda t, b, kv: 1.0 + t + b, caps, "agg").sha256
    assert math.isclose(s.prefill[0][1], 101.0)
