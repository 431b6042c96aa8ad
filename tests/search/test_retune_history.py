"""The predictor's history for a retune window and the pre-sweep over the presets."""

from __future__ import annotations

import math

import numpy as np

from aisim.actors.planner.presets import PRESETS, select_preset
from aisim.search.retune.history import interval_history, preset_fields, preset_of, presweep
from aisim.simulator.traffic.workload import Workload


def workload(times_ms, origin_ms: float, isl: int = 100, osl: int = 10) -> Workload:
    n = len(times_ms)
    return Workload(input_len=np.full(n, isl), output_len=np.full(n, osl), timestamp_ms=np.asarray(times_ms, float),
                    piece_ptr=np.arange(n + 1), piece_src=np.arange(n, dtype=np.uint64), piece_len=np.full(n, isl),
                    origin_ms=origin_ms)


def test_history_buckets_the_recorded_history_then_the_replay_on_absolute_time():
    history = workload([0, 1_000, 61_000], origin_ms=1_000_000.0, isl=50)  # absolute 1,000,000 .. 1,061,000
    replay = workload([0, 30_000, 65_000, 70_000], origin_ms=1_120_000.0, isl=200)  # 2 minutes later
    h = interval_history(history, replay, 1.0, 60.0, 120_000.0, 9_000.0)
    # intervals aligned on the first replayed request: [-120 s, -60 s), [-60 s, 0), [0, 60 s), [60 s, 120 s)
    assert h == ((2.0, 50.0, 10.0), (1.0, 50.0, 10.0), (2.0, 200.0, 10.0), (2.0, 200.0, 10.0))
    assert interval_history(history, replay, 1.0, 60.0, 120_000.0, 120.0) == h[-2:]  # history_seconds
    assert interval_history(None, replay, 1.0, 60.0, 60_000.0, 9_000.0) == ((2.0, 200.0, 10.0),)
    # with a speedup of 2 an interval of replay time spans twice the trace time
    assert interval_history(None, replay, 2.0, 30.0, 30_000.0, 9_000.0) == ((2.0, 200.0, 10.0),)


def test_the_presweep_picks_the_preset_with_the_lowest_loss_as_select_preset_does():
    rng = np.random.default_rng(3)
    hist = tuple((float(50 + 5 * t + rng.normal(0, 3)), 1000.0 + 10 * t, 200.0) for t in range(20))
    winner, losses = presweep(hist, 180.0)
    assert (winner, losses) == select_preset(list(hist), 180.0)
    assert set(losses) == set(PRESETS) and math.isfinite(losses[winner])
    assert preset_of(preset_fields(winner)) == winner
    assert preset_of({"load_predictor": "kalman", "load_predictor_log1p": False, "kalman_q_level": 2.0}) is None
