"""Planner decisions on constructed observations: every target, gates, floors, GPU budget,
advisory recommendations."""

from __future__ import annotations

import dataclasses

import pytest

from aisim.actors.messages import Capabilities, Fpm, RoleState, Snapshot, TrafficWindow
from aisim.actors.planner.perf_model import Pass, PerfModel
from aisim.actors.planner.planner import Planner, PlannerSettings
from aisim.actors.planner.predictors import PredictorSpec

CAPS = Capabilities(max_batched_tokens=8192, max_sequences=256, context_length=32768, max_kv_tokens=100_000)


def fpm(wid, decode_kv=0, queued_prefill_tokens=0, queued_decode_kv=0, rank=0, ordinal=1, wall=0.02, num_decode=4):
    return Fpm(wid, rank, ordinal, wall, 0, 0, 0, 0.0, num_decode, decode_kv, 0.0, 1 if queued_prefill_tokens else 0,
               queued_prefill_tokens, 0.0, 0, queued_decode_kv, 0.0)


def agg(active, fpms, starting=()):
    return {"decode": RoleState(list(active), list(starting), [], fpms, CAPS)}


def tick(planner, roles, t=5000.0, traffic=None):
    return planner.on_tick(Snapshot(t, roles, traffic))


def settings(**kw):
    kw.setdefault("mode", "agg")
    return PlannerSettings(**kw)


@pytest.mark.parametrize(
    "target,kv,expected,reason",
    [
        ("throughput", 101_000, 3, "scale_up"),  # util 1.01 > 1.0
        ("throughput", 100_000, None, "no_change"),  # util 1.0 is not > 1.0 (and not < 0.6)
        ("throughput", 20_000, 1, "scale_down"),  # all util 0.2 < 0.6
        ("latency", 41_000, 3, "scale_up"),  # util > 0.4
        ("latency", 9_000, 1, "scale_down"),  # util < 0.1
    ],
)
def test_static_targets_on_aggregated_utilisation(target, kv, expected, reason):
    p = Planner(settings(target=target, max_gpu_budget=16))
    d = tick(p, agg([0, 1], [fpm(0, kv), fpm(1, 1000)]))
    assert d.target_decode == expected
    assert p.ticks[-1]["effects"]["diagnostics"]["reasons"]["decode"] == reason


def test_aggregated_signal_counts_queued_prefill_tokens_and_queued_decodes():
    p = Planner(settings(target="throughput"))
    d = tick(p, agg([0], [fpm(0, decode_kv=50_000, queued_prefill_tokens=40_000, queued_decode_kv=11_000)]))
    assert d.target_decode == 2  # (50k + 11k + 40k) / 100k = 1.01


def test_consolidation_guard_refuses_a_scale_down_that_would_overload():
    p = Planner(settings(target="throughput"))
    # both at 0.55 < 0.6, but one worker would carry 0.55 x 2 = 1.1 >= 1.0
    d = tick(p, agg([0, 1], [fpm(0, 55_000), fpm(1, 55_000)]))
    assert d.target_decode is None
    assert p.ticks[-1]["effects"]["diagnostics"]["reasons"]["decode"] == "scale_down_refused_consolidation"


def test_load_target_thresholds_and_disaggregated_roles():
    s = settings(mode="disagg", target="load", prefill_scale_up_queue_tokens=1, prefill_scale_down_queue_tokens=0,
                 decode_scale_up_kv_rate=90, decode_scale_down_kv_rate=70, max_gpu_budget=16)
    p = Planner(s)
    roles = {"prefill": RoleState([0, 1], [], [], [fpm(0, queued_prefill_tokens=5), fpm(1)], CAPS),
             "decode": RoleState([2, 3], [], [], [fpm(2, 20_000), fpm(3, 30_000)], CAPS)}
    d = tick(p, roles)
    assert (d.target_prefill, d.target_decode) == (3, 1)  # queued >= 1; all util <= 0.70 (and 0.3 x 2 < 0.9)
    p3 = Planner(s)
    roles["decode"] = RoleState([2, 3], [], [], [fpm(2, 60_000), fpm(3, 70_000)], CAPS)
    assert tick(p3, roles).target_decode is None  # 0.7 x 2 >= 0.9: one decode worker would be overloaded
    roles["decode"] = RoleState([2, 3], [], [], [fpm(2, 90_000), fpm(3, 10)], CAPS)
    roles["prefill"] = RoleState([0, 1], [], [], [fpm(0), fpm(1)], CAPS)
    p2 = Planner(s)
    d = tick(p2, roles)
    assert (d.target_prefill, d.target_decode) == (1, 3)  # no queue anywhere: down; util 0.9 >= 0.9: up


@pytest.mark.parametrize(
    "roles,reason",
    [
        (agg([0, 1], []), "no_fpm_data"),
        (agg([0, 1], [fpm(0, 101_000)]), "worker_count_mismatch"),  # worker 1 has not run a pass yet
        (agg([0], [fpm(0, 101_000)], starting=[1]), "scaling_in_progress"),
    ],
)
def test_gates_hold_and_say_why(roles, reason):
    p = Planner(settings(target="throughput"))
    assert tick(p, roles).target_decode is None
    assert p.ticks[-1]["effects"]["diagnostics"]["reasons"]["decode"] == reason


def test_min_workers_floor():
    p = Planner(settings(target="throughput", min_endpoint=2))
    assert tick(p, agg([0, 1, 2], [fpm(0, 10), fpm(1, 10), fpm(2, 10)])).target_decode == 2
    assert tick(p, agg([0, 1], [fpm(0, 10), fpm(1, 10)]), t=10_000).target_decode is None


def test_gpu_budget_suppresses_a_scale_up_at_the_ceiling():
    # 2 GPUs per replica, budget 6: a wanted 4th replica is held at 3
    p = Planner(settings(target="throughput", max_gpu_budget=6, decode_engine_num_gpu=2))
    assert tick(p, agg([0, 1, 2], [fpm(i, 101_000) for i in range(3)])).target_decode is None
    assert p.ticks[-1]["effects"]["diagnostics"]["budget"]["reason"] == "gpu_budget_clamp"


def test_an_allocation_over_the_budget_is_reconciled_from_current_counts():
    p = Planner(settings(target="throughput", max_gpu_budget=6, decode_engine_num_gpu=2))
    d = tick(p, agg([0, 1, 2, 3], [fpm(i, 101_000) for i in range(4)]))  # 8 GPUs > 6, and wanting more
    assert d.target_decode == 3
    assert p.ticks[-1]["effects"]["diagnostics"]["budget"]["reason"] == "gpu_budget_reconcile"


def test_a_scale_up_at_the_ceiling_is_suppressed_rather_than_shrinking_the_other_leg():
    s = settings(mode="disagg", target="load", prefill_scale_up_queue_tokens=1, prefill_scale_down_queue_tokens=0,
                 decode_scale_up_kv_rate=90, decode_scale_down_kv_rate=70, max_gpu_budget=4)
    p = Planner(s)
    # 1P + 3D = 4 GPUs (at the ceiling); prefill wants +1 while decode holds: the pair clamp keeps
    # decode at 3 and suppresses the prefill step
    roles = {"prefill": RoleState([0], [], [], [fpm(0, queued_prefill_tokens=9)], CAPS),
             "decode": RoleState([1, 2, 3], [], [], [fpm(1, 80_000), fpm(2, 80_000), fpm(3, 80_000)], CAPS)}
    d = tick(p, roles)
    assert (d.target_prefill, d.target_decode) == (None, None)
    assert p.ticks[-1]["effects"]["diagnostics"]["budget"]["reason"] == "gpu_budget_clamp"


def test_disaggregated_pair_budget_fits_both_legs():
    s = settings(mode="disagg", target="load", prefill_scale_up_queue_tokens=1, prefill_scale_down_queue_tokens=0,
                 decode_scale_up_kv_rate=90, decode_scale_down_kv_rate=70, max_gpu_budget=4)
    p = Planner(s)
    roles = {"prefill": RoleState([0], [], [], [fpm(0, queued_prefill_tokens=9)], CAPS),
             "decode": RoleState([1, 2], [], [], [fpm(1, 95_000), fpm(2, 95_000)], CAPS)}
    d = tick(p, roles)  # wants 2 + 3 = 5 > 4 GPUs
    total = (d.target_prefill or 1) + (d.target_decode or 2)
    assert total <= 4 and (d.target_prefill or 1) >= 1 and (d.target_decode or 2) >= 2


def test_advisory_changes_nothing_and_relists_a_recommendation_after_a_hold():
    p = Planner(settings(target="throughput", advisory=True, max_gpu_budget=16))
    up = agg([0], [fpm(0, 101_000)])
    hold = agg([0], [fpm(0, 80_000)])
    for t, roles in ((5000, up), (10_000, up), (15_000, hold), (20_000, up)):
        d = tick(p, roles, t=t)
        assert d.target_decode is None and d.target_prefill is None
    assert p.scaling_events == []
    assert [(e["at_s"], e["from_count"], e["to_count"]) for e in p.recommended_scaling_events] == [(5.0, 1, 2), (20.0, 1, 2)]
    assert [t["effects"]["scale_to"] for t in p.ticks] == [{"prefill": None, "decode": 2}, {"prefill": None, "decode": 2},
                                                           None, {"prefill": None, "decode": 2}]


def sla_model(role="agg"):
    """Every store priced by the same rule: 5 ms + 1 ms per 100 prompt tokens + 0.1 ms per decode."""
    m = PerfModel(role, CAPS, 64, 16, 5)
    for t in (500, 1000, 2000, 4000, 8000):
        for b in (0, 1, 8, 32, 128):
            m.observe(Pass(1 if t else 0, t, 0, b, 0), 5 + t / 100 + 0.1 * b)
    for b in (1, 8, 32, 128, 200):
        m.observe(Pass(0, 0, 0, b, b * 100), 5 + b * 0.1)
    return m


def test_sla_target_scales_up_when_every_engine_misses_and_down_when_all_pass():
    s = settings(target="sla", enable_throughput_scaling=False, enable_load_scaling=True, ttft_ms=200, itl_ms=20,
                 max_gpu_budget=16)
    p = Planner(s, perf_models={"agg": sla_model()})
    # 30k queued prompt tokens: drain + one request ~ 4 chunks ~ 340 ms > 200 ms on both engines
    d = tick(p, agg([0, 1], [fpm(0, queued_prefill_tokens=30_000), fpm(1, queued_prefill_tokens=30_000)]))
    assert d.target_decode == 3
    # an aggregated ITL is a mixed pass carrying the typical prefill chunk (here ~36 ms): with a
    # 200 ms ITL SLA both sides pass their consolidation checks on both engines
    p = Planner(dataclasses.replace(s, itl_ms=200), perf_models={"agg": sla_model()})
    assert tick(p, agg([0, 1], [fpm(0, 1000, num_decode=1), fpm(1, 1000, num_decode=1)])).target_decode == 1


def test_sla_throughput_sizing_from_predicted_demand():
    s = settings(target="sla", enable_throughput_scaling=True, enable_load_scaling=False, ttft_ms=500, itl_ms=20,
                 throughput_interval_s=60, tick_interval_s=60, max_gpu_budget=64, predictor=PredictorSpec("constant"))
    m = sla_model()
    p = Planner(s, perf_models={"agg": m})
    rps, ok = m.capacity_rps(2000, 200, 0.0, 500, 20)
    window = TrafficWindow(60.0, int(60 * rps * 3.5), 2000, 200, None, None, 0.0)
    d = tick(p, agg([0], [fpm(0, 1000)]), t=60_000, traffic=window)
    assert ok and d.target_decode == 4  # ceil(3.5 engines of demand)
    info = p.ticks[-1]["effects"]["diagnostics"]["throughput"]
    assert info["demand_rps"] == pytest.approx(window.num_req / 60)


def test_throughput_step_cap():
    s = settings(target="sla", enable_throughput_scaling=True, enable_load_scaling=False, ttft_ms=500, itl_ms=20,
                 throughput_interval_s=60, tick_interval_s=60, max_gpu_budget=64, max_throughput_scaling_replicas=2,
                 predictor=PredictorSpec("constant"))
    m = sla_model()
    p = Planner(s, perf_models={"agg": m})
    rps, _ = m.capacity_rps(2000, 200, 0.0, 500, 20)
    d = tick(p, agg([0], [fpm(0, 1000)]), t=60_000, traffic=TrafficWindow(60.0, int(60 * rps * 10), 2000, 200, None, None, 0.0))
    assert d.target_decode == 3  # 1 + at most 2 per decision


def test_first_throughput_decision_waits_a_full_interval():
    s = settings(target="sla", enable_throughput_scaling=True, enable_load_scaling=True, throughput_interval_s=180,
                 load_interval_s=5, tick_interval_s=5, predictor=PredictorSpec("constant"))
    p = Planner(s, perf_models={"agg": sla_model()})
    assert not p.needs_traffic(5000) and p.needs_traffic(180_000)


# -- runtime fields (retune decisions) -------------------------------------------------------
def test_runtime_fields_change_from_now_on_and_a_new_predictor_is_fed_the_observed_history():
    s = PlannerSettings(mode="agg", target="sla", enable_throughput_scaling=True, predictor=PredictorSpec("constant"))
    p = Planner(s)
    p.warm_up([(10, 100.0, 20.0), (0, 0.0, 0.0), (30, 300.0, 40.0)])
    p.set_runtime_fields({"load_scaling_down_sensitivity": 70, "max_throughput_scaling_replicas": 2})
    assert (p.settings.load_scaling_down_sensitivity, p.settings.max_throughput_scaling_replicas) == (70, 2)
    assert p.predictors["num_req"].predict() == 30  # the constant predictor kept its history
    p.set_runtime_fields({"load_predictor": "kalman", "kalman_min_points": 2})
    assert p.settings.predictor == PredictorSpec("kalman", kalman_min_points=2)
    fresh = Planner(dataclasses.replace(s, predictor=PredictorSpec("kalman", kalman_min_points=2)))
    fresh.warm_up([(10, 100.0, 20.0), (0, 0.0, 0.0), (30, 300.0, 40.0)])
    for key in ("num_req", "isl", "osl"):  # as if it had run from the start
        assert p.predictors[key].predict() == fresh.predictors[key].predict()
        assert p.predictors[key].history == fresh.predictors[key].history
    with pytest.raises(ValueError, match="not a Planner runtime field"):
        p.set_runtime_fields({"throughput_interval_s": 60})


def test_a_retuned_minimum_of_observations_reaches_every_store():
    p = Planner(PlannerSettings(mode="agg", target="sla"))
    p.perf_models = {"agg": PerfModel("agg", Capabilities(), 64, 16, 5)}
    p.set_runtime_fields({"load_min_observations": 9})
    assert {st.min_observations for st in p.perf_models["agg"].stores.values()} == {9}
