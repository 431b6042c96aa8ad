"""Spica's load-predictor pre-sweep: the winner per throughput interval of the space's policies."""

from __future__ import annotations

from aisim.actors.planner.presets import PRESETS, preset_losses
from aisim.search.spica.config import load_search_config
from aisim.search.spica.presets import predictor_fields
from aisim.search.spica.presweep import arrival_history, candidate_spec, predictor_winners
from tests.conftest import ROOT

EXAMPLE = ROOT / "configs" / "spica-agg-vs-disagg.yaml"


def test_winners_per_throughput_interval_are_the_lowest_loss_candidates():
    cfg, cdir = load_search_config(EXAMPLE, ["search_space.planner_scaling_policy=[disabled, throughput_180_5, "
                                             "hybrid_600_5]", "workload.request_rate=1", "workload.request_count=5000"])
    winners = predictor_winners(cfg, cdir)
    assert sorted(winners) == ["180", "600"]
    from aisim.search.spica.presweep import _arrivals

    times, isl, osl = _arrivals(cfg, cdir)
    hist = arrival_history(times, isl, osl, 180.0)
    losses = preset_losses(hist, 180.0)
    best = min((loss, i, n) for i, (n, loss) in enumerate(losses.items()))[2]
    assert winners["180"] == predictor_fields(best)


def test_no_throughput_policy_or_a_closed_loop_gives_no_winners():
    cfg, cdir = load_search_config(EXAMPLE)
    assert predictor_winners(cfg, cdir) == {}  # every policy is disabled
    cfg, cdir = load_search_config(EXAMPLE, ["search_space.planner_scaling_policy=[throughput_180_5]",
                                             "workload.request_rate=null", "workload.concurrency=8"])
    assert predictor_winners(cfg, cdir) == {}


def test_a_dict_candidate_takes_its_family_defaults():
    spec = candidate_spec({"load_predictor": "kalman", "kalman_r": 3.0})
    assert (spec.family, spec.kalman_r, spec.kalman_q_level, spec.kalman_min_points) == ("kalman", 3.0, 1.0, 5)
    assert candidate_spec("arima_log1p") == PRESETS["arima_log1p"]
