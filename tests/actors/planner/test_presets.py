"""The 11 predictor presets and the preset-selection loss (reference §5.2)."""

from __future__ import annotations

import math

import pytest

from aisim.actors.planner.presets import DEFAULT_PRESET, PRESETS, preset_losses, select_preset, step_loss


def test_the_eleven_presets_and_their_parameters():
    assert len(PRESETS) == 11 and DEFAULT_PRESET in PRESETS
    k = PRESETS["kalman_reactive_log1p"]
    assert (k.family, k.log1p, k.kalman_q_level, k.kalman_q_trend, k.kalman_r, k.kalman_min_points) == \
        ("kalman", True, 10.0, 1.0, 5.0, 3)
    assert PRESETS["prophet_w20_raw"].prophet_window_size == 20 and not PRESETS["arima_raw"].log1p


def test_the_step_loss_weights():
    # a perfect forecast costs 0; doubling only the count costs 0.4 + 0.4 times |log1p(2x) - log1p(x)|
    assert step_loss((10, 100, 50), (10, 100, 50)) == 0.0
    expected = 0.4 * abs(math.log1p(2000) - math.log1p(1000)) + 0.4 * abs(math.log1p(1000) - math.log1p(500))
    assert step_loss((20, 100, 50), (10, 100, 50)) == pytest.approx(expected)


def test_a_steady_history_is_forecast_exactly_by_the_last_value():
    history = [(30.0, 1000.0, 200.0)] * 12
    losses = preset_losses(history, 180.0, ["constant_last", "kalman_default_raw"])
    assert losses["constant_last"] == 0.0
    name, _ = select_preset(history, 180.0, ["constant_last", "kalman_default_raw"])
    assert name == "constant_last"  # ties go to the earlier preset


def test_a_trend_is_forecast_better_by_a_kalman_preset():
    history = [(10.0 + 5.0 * t, 1000.0, 200.0) for t in range(20)]  # the count grows by 5 per interval
    name, losses = select_preset(history, 180.0, ["constant_last", "kalman_reactive_raw"])
    assert name == "kalman_reactive_raw" and losses["kalman_reactive_raw"] < losses["constant_last"]


def test_a_preset_that_raises_scores_infinity():
    pytest.importorskip("numpy")
    try:
        import prophet  # noqa: F401
    except ImportError:
        losses = preset_losses([(10.0, 100.0, 50.0)] * 8, 180.0, ["constant_last", "prophet_w20_raw"])
        assert losses["prophet_w20_raw"] == math.inf and math.isfinite(losses["constant_last"])
    else:  # pragma: no cover - with the prophet extra installed
        pytest.skip("prophet is installed")
