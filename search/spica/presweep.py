"""Spica's load-predictor pre-sweep: for each throughput interval of the space's scaling
policies, the ``load_predictor_candidates`` entry (a preset id of ``actors.planner.presets`` or
a dict of predictor fields) with the lowest mean one-step forecast loss over the workload's own
arrivals bucketed per interval (the §5.2 loss and common warm-up). The result is the
``best_by_interval`` map ``unroll_sample`` reads: ``{"180": {"load_predictor": ..., ...}}``.

The history is the traffic the candidates replay: a trace's timestamps (with its speedup), or a
synthetic workload's open-loop arrivals (Poisson at ``request_rate`` with ``arrival_seed``). A
closed loop has no arrival times to forecast: no winners, so candidates run the Planner's
default predictor.
"""

from __future__ import annotations

import math

import numpy as np

from aisim.actors.planner.predictors import PredictorSpec
from aisim.actors.planner.presets import PRESETS, spec_loss
from aisim.simulator.planning import interval_buckets

__all__ = ["predictor_winners", "candidate_spec", "arrival_history"]

_FAMILY_DEFAULTS = {"prophet_window_size": 50, "kalman_q_level": 1.0, "kalman_q_trend": 0.1, "kalman_r": 10.0,
                    "kalman_min_points": 5}


def candidate_spec(entry) -> PredictorSpec:
    """A ``load_predictor_candidates`` entry as a predictor spec."""
    if isinstance(entry, str):
        return PRESETS[entry]
    f = {**_FAMILY_DEFAULTS, **entry}
    return PredictorSpec(f["load_predictor"], bool(f.get("load_predictor_log1p", False)), int(f["prophet_window_size"]),
                         float(f["kalman_q_level"]), float(f["kalman_q_trend"]), float(f["kalman_r"]),
                         int(f["kalman_min_points"]))


def arrival_history(times_ms: np.ndarray, isl: np.ndarray, osl: np.ndarray, interval_s: float) -> list[tuple]:
    """(count, mean ISL, mean OSL) per interval of the arrivals (from the first one)."""
    if len(times_ms) == 0:
        return []
    return interval_buckets(times_ms, isl, osl, float(np.min(times_ms)), interval_s * 1000.0)


def _arrivals(cfg, config_dir):
    """(arrival ms, ISL, OSL) of the workload the candidates replay, or None for a closed loop."""
    w = cfg.workload
    if w is not None:
        rate = getattr(w, "request_rate", None)
        if rate is None or isinstance(rate, (list, tuple)):
            return None
        from aisim.simulator.traffic.arrivals import poisson_times

        n = w.request_count or 1000
        t = poisson_times(int(n), float(rate), int(w.arrival_seed))
        return t, np.full(len(t), float(w.isl)), np.full(len(t), float(w.osl))
    from aisim.simulator.config import models as m
    from aisim.simulator.traffic.build import build_traffic

    if isinstance(cfg.traffic.load, m.ConcurrencyLoad):
        return None
    plan = build_traffic(cfg.traffic, config_dir)
    times, idx = plan.arrivals.start().initial()
    times = np.asarray(times, dtype=np.float64)
    idx = np.asarray(idx)
    wl = plan.workload
    return times, wl.input_len[idx].astype(np.float64), wl.output_len[idx].astype(np.float64)


def predictor_winners(cfg, config_dir=None) -> dict[str, dict]:
    """``best_by_interval``: str(throughput interval) -> the winner's predictor fields."""
    from aisim.search.spica.presets import predictor_fields, scaling_fields

    space = cfg.search_space
    intervals = sorted({int(f["throughput_adjustment_interval_seconds"])
                        for f in map(scaling_fields, space.planner_scaling_policy) if f["enable_throughput_scaling"]})
    if not intervals:
        return {}
    arrivals = _arrivals(cfg, config_dir)
    if arrivals is None:
        return {}
    entries = list(space.load_predictor_candidates)
    specs = [candidate_spec(e) for e in entries]
    warmup = max(s.min_points for s in specs)
    out = {}
    for interval in intervals:
        history = arrival_history(*arrivals, float(interval))
        losses = [spec_loss(s, history, float(interval), warmup) for s in specs]
        finite = [(loss, i) for i, loss in enumerate(losses) if math.isfinite(loss)]
        if finite:
            out[str(interval)] = predictor_fields(entries[min(finite)[1]])
    return out
