"""Progress inside a replay: running quantile estimates, running metrics from hand-made rows, and
a progress monitor over a real replay (its checkpoints in virtual time, never stopping it)."""

from __future__ import annotations

import numpy as np
import pytest

from aisim.simulator.checkpoints import LogHistogram, ProgressMonitor, RunningMetrics
from tests.conftest import ROOT


def _row(i, status="completed", out=100, ttft=100.0, tpot=10.0, e2e=1000.0):
    """A request_metrics.csv row (REQUEST_CSV_COLUMNS order)."""
    return (f"r{i}", status, 0, 0.0, 0.0, 0.1, 1.0, 512, out, 0, 0.0, ttft, tpot, tpot, e2e)


def test_the_quantile_estimate_is_within_half_a_percent_of_the_nearest_rank_value():
    h = LogHistogram()
    assert h.quantile(0.5) is None
    for v in range(1, 1001):
        h.add(float(v))
    for q, exact in ((0.5, 500.0), (0.9, 900.0), (0.99, 990.0), (0.0, 1.0), (1.0, 1000.0)):
        assert h.quantile(q) == pytest.approx(exact, rel=0.005)
    z = LogHistogram()
    for v in (0.0, 0.0, 0.0, 5.0):
        z.add(v)
    assert z.quantile(0.75) == 0.0 and z.quantile(0.9) == pytest.approx(5.0, rel=0.005)


def test_running_metrics_count_tokens_goodput_and_means_by_hand():
    m = RunningMetrics((500.0, 50.0, None))
    m.observe(_row(0, out=100, ttft=400.0, tpot=20.0, e2e=2400.0))  # good
    m.observe(_row(1, out=60, ttft=600.0, tpot=25.0, e2e=2100.0))  # TTFT over its limit
    m.observe(_row(2, status="rejected", out=0, ttft="", tpot="", e2e=""))
    s = m.snapshot(4000.0)
    assert (s["completed"], s["rejected"], s["output_tokens"]) == (2, 1, 160)
    assert s["output_throughput_tok_s"] == 40.0 and s["goodput_output_throughput_tok_s"] == 25.0
    assert s["mean_ttft_ms"] == 500.0 and s["mean_tpot_ms"] == 22.5 and s["mean_e2e_latency_ms"] == 2250.0
    assert s["p50_ttft_ms"] == pytest.approx(400.0, rel=0.005)  # nearest rank: the first of two
    assert m.per_user_sum / m.per_user_n == pytest.approx((50.0 + 40.0) / 2)
    assert "in_flight" not in s
    held = [(0.0, None, None), (0.0, 5.0, 1.0), (1.0, None, 2.0)]  # (arrival, first token, admitted)
    s = m.snapshot(4000.0, lambda: held)
    assert s["in_flight"] == 3 and s["queued"] == 1
    assert RunningMetrics().snapshot(1000.0)["goodput_output_throughput_tok_s"] is None  # no SLA, no goodput


def test_a_progress_monitor_follows_a_replay_without_changing_it():
    from aisim.simulator.config.loading import load_config
    from aisim.simulator.metrics.summary import WALL_TIME_FIELDS
    from aisim.simulator.plan import plan_from_config
    from aisim.simulator.run import run_plan

    cfg, cdir = load_config(ROOT / "configs" / "quickstart.yaml", [])
    plain = run_plan(plan_from_config(cfg, cdir, capture_per_request=True))
    n = plain.summary["num_requests"]
    monitor = ProgressMonitor(n, checkpoints=10, limits=(cfg.evaluation.sla.ttft_ms, cfg.evaluation.sla.itl_ms,
                                                          cfg.evaluation.sla.e2e_ms) if cfg.evaluation.sla else
                              (None, None, None))
    watched = run_plan(plan_from_config(cfg, cdir, capture_per_request=True), monitor=monitor)
    strip = lambda s: {k: v for k, v in s.items() if k not in WALL_TIME_FIELDS}  # noqa: E731
    assert strip(watched.summary) == strip(plain.summary)  # never stopped, the same replay
    snaps = monitor.snapshots
    assert 5 <= len(snaps) <= 10
    assert [s["at_s"] for s in snaps] == sorted(s["at_s"] for s in snaps)
    assert all(a["completed"] <= b["completed"] for a, b in zip(snaps, snaps[1:]))
    assert all(s["in_flight"] >= s["queued"] >= 0 for s in snaps)
    ttft = np.sort([r["first_token_ms"] - r["arrival_time_ms"] for r in watched.per_request
                    if r["terminal_status"] == "completed"])
    exact = ttft[int(np.ceil(0.9 * len(ttft))) - 1]  # nearest rank over every completed request
    assert monitor.metrics.hists["ttft_ms"].quantile(0.9) == pytest.approx(exact, rel=0.005)
