"""Load predictors: forecast the next interval's value of one series (request count, ISL, OSL).

Families (reference rules): every predictor skips leading zeros until the first non-zero value,
treats NaN as 0 and clamps its output at >= 0.

- ``constant``: the last value.
- ``arima`` (statsmodels): before 5 points the last value; a constant history predicts that
  constant; the order is chosen once by AIC over a small grid, later points update the fit
  without re-estimating; a (0, d, 0) fit of the raw series is refitted on log1p; any error
  falls back to the last value.
- ``prophet`` (optional extra ``aisim[prophet]``): a fresh fit per prediction on the last
  ``prophet_window_size`` points spaced by the throughput interval.
- ``kalman``: local linear trend, state [level, trend], P0 = 1000 I, R = ``kalman_r``,
  Q = diag(q_level, q_trend) floored at 1e-9 / 1e-12; before ``kalman_min_points`` the last value.

``log1p`` wraps any family: it learns log1p(x) and predicts expm1 of the forecast.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class PredictorSpec:
    family: str = "arima"  # constant | arima | prophet | kalman
    log1p: bool = False
    prophet_window_size: int = 50
    kalman_q_level: float = 1.0
    kalman_q_trend: float = 0.1
    kalman_r: float = 10.0
    kalman_min_points: int = 5

    @property
    def min_points(self) -> int:
        return {"constant": 1, "arima": 5, "prophet": 5, "kalman": self.kalman_min_points}[self.family]

    def describe(self) -> dict:
        d = {"load_predictor": self.family, "load_predictor_log1p": self.log1p}
        if self.family == "prophet":
            d["prophet_window_size"] = self.prophet_window_size
        if self.family == "kalman":
            d.update(kalman_q_level=self.kalman_q_level, kalman_q_trend=self.kalman_q_trend, kalman_r=self.kalman_r,
                     kalman_min_points=self.kalman_min_points)
        return d


class PredictorUnavailable(RuntimeError):
    """An optional dependency is missing (the message names the extra to install)."""


@dataclass
class Predictor:
    spec: PredictorSpec
    interval_s: float = 180.0
    history: list[float] = field(default_factory=list)
    _state: object = None

    def add(self, value: float) -> None:
        v = 0.0 if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)
        if not self.history and v == 0.0:
            return  # leading zeros carry no signal
        if self.spec.log1p:
            v = math.log1p(max(v, 0.0))
        self.history.append(v)
        if self.spec.family == "kalman":
            self._kalman_update(v)
        elif self.spec.family == "arima" and self._state is not None:
            self._arima_append(v)

    def predict(self) -> float:
        h = self.history
        if not h:
            return 0.0
        if len(h) < self.spec.min_points:
            out = h[-1]
        else:
            fam = self.spec.family
            if fam == "constant":
                out = h[-1]
            elif fam == "kalman":
                level, trend = self._state[0]
                out = float(level + trend)
            elif fam == "arima":
                out = self._arima_predict()
            else:
                out = self._prophet_predict()
        if not math.isfinite(out):
            out = h[-1]
        if self.spec.log1p:
            out = math.expm1(out)
        return max(0.0, out)

    # -- kalman: local linear trend ------------------------------------------------
    def _kalman_update(self, z: float) -> None:
        s = self.spec
        if self._state is None:
            self._state = (np.array([z, 0.0]), np.eye(2) * 1000.0)
            return
        x, p = self._state
        f = np.array([[1.0, 1.0], [0.0, 1.0]])
        q = np.diag([max(s.kalman_q_level, 1e-9), max(s.kalman_q_trend, 1e-12)])
        x = f @ x
        p = f @ p @ f.T + q
        innovation = z - x[0]
        s_cov = p[0, 0] + s.kalman_r
        k = p[:, 0] / s_cov
        x = x + k * innovation
        p = p - np.outer(k, p[0, :])
        self._state = (x, p)

    # -- arima ---------------------------------------------------------------------
    _ORDERS = ((1, 0, 0), (0, 1, 1), (1, 1, 1), (0, 1, 0))  # candidates, chosen once by AIC

    def _arima_predict(self) -> float:
        h = self.history
        if max(h) == min(h):
            return h[-1]
        try:
            if self._state is None:
                self._state = self._arima_fit(np.asarray(h))
            res, on_log = self._state
            f = float(res.forecast(1)[0])
            return math.expm1(f) if on_log else f
        except Exception:  # noqa: BLE001 - any numerical failure predicts the last value
            self._state = None
            return h[-1]

    def _arima_fit(self, y: np.ndarray):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # statsmodels' import warns about pandas deprecations
            from statsmodels.tsa.arima.model import ARIMA

        best = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for order in self._ORDERS:
                try:
                    res = ARIMA(y, order=order).fit()
                except Exception:  # noqa: BLE001
                    continue
                if best is None or res.aic < best[0]:
                    best = (res.aic, order, res)
            if best is None:
                raise RuntimeError("no ARIMA order fits")
            _, order, res = best
            if order[0] == 0 and order[2] == 0 and not self.spec.log1p and (y >= 0).all():
                return ARIMA(np.log1p(y), order=order).fit(), True
        return res, False

    def _arima_append(self, v: float) -> None:
        res, on_log = self._state
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._state = (res.append([math.log1p(max(v, 0.0)) if on_log else v], refit=False), on_log)
        except Exception:  # noqa: BLE001
            self._state = None

    # -- prophet -------------------------------------------------------------------
    def _prophet_predict(self) -> float:
        try:
            import logging

            logging.getLogger("cmdstanpy").setLevel(logging.ERROR)
            from prophet import Prophet
        except ImportError:
            raise PredictorUnavailable("load_predictor prophet needs the optional extra: pip install 'aisim[prophet]'") from None
        import pandas as pd

        h = self.history[-self.spec.prophet_window_size:]
        ds = pd.to_datetime(np.arange(len(h)) * self.interval_s, unit="s")
        m = Prophet()
        m.fit(pd.DataFrame({"ds": ds, "y": h}))
        future = pd.DataFrame({"ds": [ds[-1] + pd.Timedelta(seconds=self.interval_s)]})
        return float(m.predict(future)["yhat"].iloc[0])


def check_available(spec: PredictorSpec) -> None:
    """Fail early (at configuration time) when the family's optional dependency is missing."""
    if spec.family == "prophet":
        import importlib.util

        if importlib.util.find_spec("prophet") is None:
            raise PredictorUnavailable("load_predictor prophet needs the optional extra: pip install 'aisim[prophet]'")
