"""The 11 load-predictor presets and the preset-selection rule (reference §5.2).

Retune's predictor pre-sweep and Spica's ``load_predictor_candidates`` choose among them: each
preset replays the history one throughput interval at a time and is scored by its mean one-step
loss after a common warm-up (the largest minimum number of points among the presets compared):

    err(x, y) = |log1p(x) - log1p(y)|
    loss = 0.4 err(n_hat * isl_hat, n * isl) + 0.4 err(n_hat * osl_hat, n * osl)
         + 0.1 err(isl_hat, isl) + 0.1 err(osl_hat, osl)

where (n, isl, osl) are an interval's request count and mean ISL/OSL and the hats their one-step
forecasts. A preset whose predictor raises (e.g. Prophet without its extra) scores +inf. Ties go
to the earlier preset in ``PRESETS`` order.
"""

from __future__ import annotations

import math

from aisim.actors.planner.predictors import Predictor, PredictorSpec

DEFAULT_PRESET = "constant_last"

_KALMAN_DEFAULT = dict(kalman_q_level=1.0, kalman_q_trend=0.1, kalman_r=10.0, kalman_min_points=5)
_KALMAN_REACTIVE = dict(kalman_q_level=10.0, kalman_q_trend=1.0, kalman_r=5.0, kalman_min_points=3)

PRESETS: dict[str, PredictorSpec] = {
    "constant_last": PredictorSpec("constant"),
    "arima_raw": PredictorSpec("arima"),
    "arima_log1p": PredictorSpec("arima", log1p=True),
    "prophet_w20_raw": PredictorSpec("prophet", prophet_window_size=20),
    "prophet_w20_log1p": PredictorSpec("prophet", log1p=True, prophet_window_size=20),
    "prophet_w50_raw": PredictorSpec("prophet", prophet_window_size=50),
    "prophet_w50_log1p": PredictorSpec("prophet", log1p=True, prophet_window_size=50),
    "kalman_default_raw": PredictorSpec("kalman", **_KALMAN_DEFAULT),
    "kalman_default_log1p": PredictorSpec("kalman", log1p=True, **_KALMAN_DEFAULT),
    "kalman_reactive_raw": PredictorSpec("kalman", **_KALMAN_REACTIVE),
    "kalman_reactive_log1p": PredictorSpec("kalman", log1p=True, **_KALMAN_REACTIVE),
}


def _err(x: float, y: float) -> float:
    return abs(math.log1p(max(x, 0.0)) - math.log1p(max(y, 0.0)))


def step_loss(forecast: tuple[float, float, float], actual: tuple[float, float, float]) -> float:
    """The one-step loss of a forecast (n_hat, isl_hat, osl_hat) against the interval's (n, isl, osl)."""
    nh, ih, oh = forecast
    n, isl, osl = actual
    return 0.4 * _err(nh * ih, n * isl) + 0.4 * _err(nh * oh, n * osl) + 0.1 * _err(ih, isl) + 0.1 * _err(oh, osl)


def spec_loss(spec: PredictorSpec, history: list[tuple[float, float, float]], interval_s: float, warmup: int) -> float:
    """Mean one-step loss of a predictor ``spec`` over ``history`` after ``warmup`` intervals (+inf when
    its predictor raises or nothing is scored)."""
    try:
        preds = [Predictor(spec, interval_s) for _ in range(3)]
        losses = []
        for t, actual in enumerate(history):
            if t >= warmup:
                losses.append(step_loss(tuple(p.predict() for p in preds), actual))
            for p, v in zip(preds, actual):
                p.add(v)
        return sum(losses) / len(losses) if losses else math.inf
    except Exception:  # noqa: BLE001 - a preset that raises loses (the reference's rule)
        return math.inf


def preset_loss(name: str, history: list[tuple[float, float, float]], interval_s: float, warmup: int) -> float:
    """``spec_loss`` of preset ``name``."""
    return spec_loss(PRESETS[name], history, interval_s, warmup)


def common_warmup(names) -> int:
    """The warm-up of a comparison: the largest minimum number of points among the presets."""
    return max(PRESETS[name].min_points for name in names)


def preset_losses(history: list[tuple[float, float, float]], interval_s: float,
                  names: list[str] | None = None) -> dict[str, float]:
    """Mean one-step loss of each preset over ``history`` (per interval: count, mean ISL, mean OSL)."""
    names = list(PRESETS) if names is None else list(names)
    warmup = common_warmup(names)
    return {name: preset_loss(name, history, interval_s, warmup) for name in names}


def select_preset(history: list[tuple[float, float, float]], interval_s: float,
                  names: list[str] | None = None) -> tuple[str, dict[str, float]]:
    """(the preset with the lowest loss, every preset's loss); the default preset when none scores."""
    losses = preset_losses(history, interval_s, names)
    finite = [(loss, i, name) for i, (name, loss) in enumerate(losses.items()) if math.isfinite(loss)]
    if not finite:
        return DEFAULT_PRESET, losses
    return min(finite)[2], losses
