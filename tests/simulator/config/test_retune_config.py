"""``planner.retune``: every key, requirement and rejection of the seed is checked before anything
runs (one line, exit 2, naming the key and the fix); a section that passes them all gives a plan
that carries the resolved section."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from aisim.simulator.api import run_synthetic_trace_replay, run_trace_replay
from aisim.simulator.config.loading import load_config
from aisim.simulator.config.models import ROUTER_RESERVED, PlannerKnobs
from aisim.simulator.config.planner_config import parse_planner_config, planner_section
from aisim.simulator.config.retune import (
    DEFAULT_SENSITIVITY_DOMAIN,
    PLANNER_KNOBS,
    ROUTER_DEFAULT_DOMAINS,
    Domain,
    RetuneConfig,
)
from aisim.simulator.errors import InputError, NotSupportedError
from aisim.simulator.plan import lower_engine, plan_from_config
from aisim.simulator.planning import PlannerPlan, lower_planner
from aisim.simulator.traffic.history import history_end_ms

ROOT = Path(__file__).resolve().parents[3]
QUICK = ROOT / "configs" / "quickstart.yaml"
DATA = ROOT / "configs" / "data"
WHOLE = DATA / "conversation_slice_dynamo.jsonl"  # 1,000 requests
HISTORY = DATA / "conversation_slice_history_dynamo.jsonl"  # the same trace before 120 s ...
REPLAY = DATA / "conversation_slice_replay_dynamo.jsonl"  # ... and from 120 s on
MOONCAKE = DATA / "conversation_slice.jsonl"

ROUTER = {"overlap_score_credit": 1.0, "prefill_load_scale": [0.5, 1, 2], "temperature": [0, 1]}
RETUNE_ONLY = {"policy": "enabled", "enable_load_scaling": False, "enable_throughput_scaling": False}
SLA_BOTH = {"policy": "enabled", "target": "sla", "enable_load_scaling": True}  # throughput + load scaling


def trace(path: Path = WHOLE, fmt: str = "dynamo") -> list[str]:
    return [f"traffic.source.format={fmt}", f"traffic.source.paths={json.dumps([str(path)])}"]


def overrides(planner: dict, *extra: str, path: Path = WHOLE, router: str = "kv_router") -> list[str]:
    return [*trace(path), f"router.policy={router}", f"planner={json.dumps(planner)}", *extra]


def retune_only(retune: dict) -> dict:
    return {**RETUNE_ONLY, "retune": {"interval_seconds": 600, **retune}}


def plan(ov: list[str]):
    cfg, config_dir = load_config(QUICK, ov)
    return plan_from_config(cfg, config_dir)


def failure(ov: list[str]) -> InputError:
    with pytest.raises(InputError) as info:
        plan(ov)
    e = info.value
    assert e.exit_code == 2 and "\n" not in str(e) and str(e) == f"{e.where}: {e.message}"
    return e


def invalid(ov: list[str], where: str, *needles: str) -> InputError:
    e = failure(ov)
    assert not isinstance(e, NotSupportedError), str(e)
    assert e.where == where and e.category == "invalid_config", str(e)
    for needle in needles:
        assert needle in e.message, str(e)
    return e


def valid(ov: list[str]):
    """Passes every check: the plan carries the resolved section."""
    p = plan(ov)
    assert isinstance(p.planner.retune, RetuneConfig)
    return p


def planner_config(planner: dict, *extra: str, path: Path = WHOLE) -> PlannerPlan:
    """The PlannerPlan the section lowers to (what plan_from_config carries), retune resolved."""
    cfg, _ = load_config(QUICK, overrides(planner, *extra, path=path))
    pools, _ = lower_engine(cfg.engine)
    return lower_planner(cfg.planner, pools, cfg.evaluation.sla)


def api_planner(raw) -> PlannerPlan:
    """The PlannerPlan an API planner_config lowers to (aggregated quickstart pools, no SLA)."""
    cfg, _ = load_config(QUICK, [])
    pools, _ = lower_engine(cfg.engine)
    return lower_planner(planner_section(parse_planner_config(raw), "aggregated", "vllm"), pools, None,
                         field="planner_config")


def loops(pp: PlannerPlan) -> tuple[bool, bool]:
    return pp.settings.enable_throughput_scaling, pp.settings.enable_load_scaling


# -- valid sections and what the PlannerConfig carries ------------------------------------------
def test_a_valid_section_gives_a_plan_whose_router_keeps_its_prefix_index():
    p = valid(overrides(retune_only({"router": {"overlap_score_credit": [0.0, 0.5]}}), "router.overlap_score_credit=0"))
    assert p.router.overlap_score_credit == 0.0 and p.router.kv_events  # the credit may rise: KV events flow
    p = valid(overrides(retune_only({"router": {"overlap_score_credit": 0.0}}), "router.overlap_score_credit=0"))
    assert not p.router.kv_events  # pinned at 0: no prefix index needed


def test_the_validated_section_is_a_typed_retune_config_on_the_planner_config():
    pc = planner_config(retune_only({"router": ROUTER}))
    rc = pc.retune
    assert isinstance(rc, RetuneConfig)
    assert (rc.interval_seconds, rc.grace_seconds) == (600, 60)
    assert (rc.decision_latency_seconds, rc.decision_latency_scale) == (0, 1)
    assert rc.timeout_seconds == 600  # defaults to interval_seconds
    assert (rc.sla_ttft_ms, rc.sla_itl_ms) == (2000, 50)  # from evaluation.sla
    assert rc.history_seconds is None  # no throughput scaling
    assert (rc.min_improvement_percentage, rc.sampler, rc.max_candidates, rc.warm_start) == (3, "grid", None, False)
    assert rc.max_parallel is None and rc.parallel == (os.cpu_count() or 1)
    doms = rc.router_domains()
    assert doms["overlap_score_credit"].pinned and doms["overlap_score_credit"].points() == (1.0,)
    assert doms["prefill_load_scale"].points() == (0.5, 1.0, 2.0) and doms["temperature"].points() == (0.0, 1.0)
    assert rc.planner is None and rc.planner_domains(load_scaling=False) == {}


def test_retune_only_mode_never_scales_and_ticks_every_load_interval():
    for target in ("throughput", "sla", "load"):
        pc = planner_config({**retune_only({"router": ROUTER}), "target": target,
                             "load_adjustment_interval_seconds": 2.5}, path=WHOLE)
        assert loops(pc) == (False, False) and pc.settings.tick_interval_s == 2.5
    valid(overrides({**retune_only({"router": ROUTER}), "target": "sla"}))


def test_both_flags_false_without_retune_keep_todays_rules():
    cfg, config_dir = load_config(QUICK, [f"planner={json.dumps(RETUNE_ONLY)}"])
    pc = plan_from_config(cfg, config_dir).planner
    assert loops(pc) == (False, True)  # a non-sla target ignores the flags and autoscales
    cfg, config_dir = load_config(QUICK, [f"planner={json.dumps({**RETUNE_ONLY, 'target': 'sla'})}"])
    with pytest.raises(InputError, match="at least one of enable_throughput_scaling"):
        plan_from_config(cfg, config_dir)


def test_omitted_router_knobs_search_their_default_domains():
    rc = planner_config(retune_only({"router": {"temperature": 0.5}})).retune
    doms = rc.router_domains()
    assert doms["temperature"].points() == (0.5,)
    assert doms["overlap_score_credit"] == ROUTER_DEFAULT_DOMAINS["overlap_score_credit"]
    assert doms["prefill_load_scale"].points() == (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
    assert planner_config(retune_only({"router": {}})).retune.router_domains() == ROUTER_DEFAULT_DOMAINS


def test_the_scoring_sla_falls_back_to_the_planner_and_the_history_to_50_throughput_intervals():
    rc = planner_config(retune_only({"router": ROUTER}), "evaluation={sla: {}}").retune
    assert (rc.sla_ttft_ms, rc.sla_itl_ms) == (500, 50)  # the Planner's ttft_ms / itl_ms
    rc = planner_config(retune_only({"router": ROUTER, "sla_ttft_ms": 900, "sla_itl_ms": 30})).retune
    assert (rc.sla_ttft_ms, rc.sla_itl_ms) == (900, 30)
    pc = planner_config({**SLA_BOTH, "load_predictor_warmup_trace": str(HISTORY),
                         "retune": {"interval_seconds": 600, "planner": "default"}}, path=REPLAY)
    assert pc.retune.history_seconds == 180 * 50
    assert pc.retune.planner_domains(load_scaling=True) == {"load_scaling_down_sensitivity": DEFAULT_SENSITIVITY_DOMAIN}
    assert pc.retune.predictor_presweep(throughput_scaling=True)


def test_advisory_and_speedup_are_allowed():
    valid(overrides({**retune_only({"router": ROUTER}), "advisory": True}, "traffic.load.speedup=2.0"))


# -- requirements outside the section -------------------------------------------------------
def test_policy_disabled_rejects_retune():
    invalid(overrides({"policy": "disabled", "retune": {"interval_seconds": 600}}), "planner.retune",
            "needs policy: enabled")


@pytest.mark.parametrize("extra,where,needle", [
    (["traffic={source: {type: synthetic}, load: {type: concurrency}, stop: {requests: 10}}"], "traffic.source.type",
     "type: trace with format: dynamo"),
    (trace(MOONCAKE, "mooncake"), "traffic.source.format", "format: dynamo"),
    (["traffic.load={type: concurrency, concurrency: 4}"], "traffic.load.type", "closed loop"),
    (["traffic.load={type: poisson, requests_per_second: 2}"], "traffic.load.type", "trace_timestamps"),
    (["traffic.stop.max_virtual_time_seconds=60"], "traffic.stop.max_virtual_time_seconds", "remove it"),
    (["router.policy=round_robin"], "router.policy", "kv_router"),
])
def test_traffic_and_router_requirements(extra, where, needle):
    invalid(overrides(retune_only({"router": ROUTER}), *extra), where, needle)


def test_round_robin_is_fine_when_the_router_is_not_retuned():
    valid(overrides({**SLA_BOTH, "enable_throughput_scaling": False,
                     "retune": {"interval_seconds": 600, "planner": "default"}}, router="round_robin"))


def test_agentic_dynamo_requests_are_rejected(tmp_path):
    row = json.loads(WHOLE.read_text().splitlines()[0])
    row["agent_context"] = {"session_id": "s"}
    p = tmp_path / "agentic.jsonl"
    p.write_text(json.dumps(row) + "\n")
    e = failure(overrides(retune_only({"router": ROUTER}), path=p))
    assert "agent_context" in e.message


def test_with_throughput_scaling_the_warmup_trace_is_required():
    invalid(overrides({**SLA_BOTH, "retune": {"interval_seconds": 180, "planner": "default"}}, path=REPLAY),
            "planner.load_predictor_warmup_trace", "Dynamo request trace")


def test_the_history_must_be_a_dynamo_trace():
    invalid(overrides({**SLA_BOTH, "load_predictor_warmup_trace": str(MOONCAKE),
                       "retune": {"interval_seconds": 180}}, path=REPLAY),
            "planner.load_predictor_warmup_trace", "not a Dynamo request trace", "dynamo.request.trace.v1")


def test_the_history_must_end_by_the_first_replayed_request():
    invalid(overrides({**SLA_BOTH, "load_predictor_warmup_trace": str(WHOLE),
                       "retune": {"interval_seconds": 180}}, path=REPLAY),
            "planner.load_predictor_warmup_trace", "ends at 330000 ms", "starts at 120000 ms")
    valid(overrides({**SLA_BOTH, "load_predictor_warmup_trace": str(HISTORY),
                     "retune": {"interval_seconds": 180, "planner": "default"}}, path=REPLAY))


def test_the_history_ends_at_its_last_recorded_completion(tmp_path):
    row = json.loads(HISTORY.read_text().splitlines()[-1])  # starts at 117,000 ms
    row["request"]["total_time_ms"] = 4000  # completes at 121,000 ms, after the replay's first request
    p = tmp_path / "history.jsonl"
    p.write_text(json.dumps(row) + "\n")
    assert history_end_ms(str(p), "h") == 121_000 and history_end_ms(str(HISTORY), "h") == 117_000
    invalid(overrides({**SLA_BOTH, "load_predictor_warmup_trace": str(p), "retune": {"interval_seconds": 180}},
                      path=REPLAY), "planner.load_predictor_warmup_trace", "ends at 121000 ms")


def test_without_throughput_scaling_the_warmup_trace_is_not_read():
    valid(overrides({**SLA_BOTH, "enable_throughput_scaling": False, "load_predictor_warmup_trace": str(MOONCAKE),
                     "retune": {"interval_seconds": 600, "planner": "default"}}))


# -- the section's own keys -------------------------------------------------------------------
@pytest.mark.parametrize("retune,where,needle", [
    ({"interval_seconds": None}, "planner.retune.interval_seconds", ""),
    ({"interval_seconds": 0}, "planner.retune.interval_seconds", "greater than 0"),
    ({"interval_seconds": 61}, "planner.retune.interval_seconds", "multiple of the Planner tick (5 s)"),
    ({"interval_seconds": "600"}, "planner.retune.interval_seconds", "quoted number"),
    ({"grace_seconds": -1}, "planner.retune.grace_seconds", "greater than or equal to 0"),
    ({"decision_latency_seconds": -1}, "planner.retune.decision_latency_seconds", "'measured'"),
    ({"decision_latency_seconds": "soon"}, "planner.retune.decision_latency_seconds", "'measured'"),
    ({"decision_latency_scale": 0}, "planner.retune.decision_latency_scale", "greater than 0"),
    ({"decision_latency_scale": 2}, "planner.retune.decision_latency_scale", "decision_latency_seconds: measured"),
    ({"decision_latency_seconds": "measured", "decision_latency_scale": 2}, "planner.retune.timeout_seconds",
     "timeout_seconds <= interval_seconds / decision_latency_scale = 300 s"),
    ({"decision_latency_seconds": "measured", "decision_latency_scale": 2, "timeout_seconds": 301},
     "planner.retune.timeout_seconds", "301 s is longer"),
    ({"timeout_seconds": 0}, "planner.retune.timeout_seconds", "greater than 0"),
    ({"max_parallel": 0}, "planner.retune.max_parallel", "greater than 0"),
    ({"max_parallel": 2.0}, "planner.retune.max_parallel", "whole number"),
    ({"min_improvement_percentage": -1}, "planner.retune.min_improvement_percentage", "greater than or equal to 0"),
    ({"sla_ttft_ms": 0}, "planner.retune.sla_ttft_ms", "greater than 0"),
    ({"sla_itl_ms": True}, "planner.retune.sla_itl_ms", "boolean"),
    ({"history_seconds": 0}, "planner.retune.history_seconds", "greater than 0"),
    ({"history_seconds": 3600}, "planner.retune.history_seconds", "only with throughput scaling"),
    ({"sampler": "bayes"}, "planner.retune.sampler", "'grid', 'tpe' or 'random'"),
    ({"sampler": "tpe"}, "planner.retune.max_candidates", "set max_candidates >= 1"),
    ({"sampler": "random"}, "planner.retune.max_candidates", "set max_candidates >= 1"),
    ({"sampler": "tpe", "max_candidates": 0}, "planner.retune.max_candidates", "greater than 0"),
    ({"max_candidates": 8}, "planner.retune.max_candidates", "only to sampler tpe or random"),
    ({"bogus": 1}, "planner.retune.bogus", "Extra inputs are not permitted"),
])
def test_section_keys(retune, where, needle):
    section = {"interval_seconds": 600, "router": ROUTER, **retune}
    if section["interval_seconds"] is None:
        del section["interval_seconds"]
    invalid(overrides({**RETUNE_ONLY, "retune": section}), where, needle)


@pytest.mark.parametrize("retune", [
    {"decision_latency_seconds": 12.5},
    {"decision_latency_seconds": "measured"},
    {"decision_latency_seconds": "measured", "decision_latency_scale": 0.5},
    {"decision_latency_seconds": "measured", "decision_latency_scale": 2, "timeout_seconds": 300},
    {"grace_seconds": 0, "max_parallel": 4, "min_improvement_percentage": 0, "timeout_seconds": 900},
    {"sampler": "random", "max_candidates": 5},
    {"sampler": "tpe", "max_candidates": 5, "warm_start": True},
])
def test_valid_section_keys(retune):
    valid(overrides(retune_only({"router": ROUTER, **retune})))


def test_interval_is_a_multiple_of_the_load_interval_tick():
    valid(overrides({**retune_only({"router": ROUTER}), "load_adjustment_interval_seconds": 2.5,
                     "retune": {"interval_seconds": 7.5, "router": ROUTER}}))
    invalid(overrides({**SLA_BOTH, "enable_load_scaling": False, "retune": {"interval_seconds": 600}}, path=REPLAY),
            "planner.retune.interval_seconds", "(180 s)")  # throughput scaling only: 180 s ticks


# -- domains ---------------------------------------------------------------------------------
@pytest.mark.parametrize("router,where,needle", [
    ({"overlap_score_credit": 1.5}, "overlap_score_credit", "less than or equal to 1"),
    ({"prefill_load_scale": -1}, "prefill_load_scale", "greater than or equal to 0"),
    ({"temperature": True}, "temperature", "true/false is a boolean, not a number"),
    ({"temperature": [0, "hot"]}, "temperature", "list item 1: "),
    ({"temperature": []}, "temperature", "empty list"),
    ({"temperature": [0, 0.0]}, "temperature", "twice"),
    ({"temperature": {"low": 1, "high": 0, "step": 0.1}}, "temperature", "must be below high"),
    ({"temperature": {"low": 0, "step": 0.1}}, "temperature", "needs low and high"),
    ({"temperature": {"low": 0, "high": 1, "by": 0.1}}, "temperature", "unknown range key 'by'"),
    ({"temperature": {"low": 0, "high": 1, "step": 0}}, "temperature", "step: "),
    ({"temperature": {"low": 0.1, "high": 1, "step": 0.1, "log": True}}, "temperature", "not both"),
    ({"temperature": {"low": 0, "high": 1, "log": True}}, "temperature", "low > 0"),
    ({"overlap_score_credit": {"low": 0, "high": 2, "step": 0.5}}, "overlap_score_credit", "high: "),
    ({"router_temperature": 1}, "router_temperature", "unknown router knob"),
    ({"temperature": {"low": 0, "high": 1}}, "temperature", "add a step"),
    ({"prefill_load_scale": {"low": 0.1, "high": 8, "log": True}}, "prefill_load_scale", "sampler: tpe"),
])
def test_router_domains(router, where, needle):
    invalid(overrides(retune_only({"router": router})), f"planner.retune.router.{where}", needle)


@pytest.mark.parametrize("knob", ["host_cache_hit_weight", "disk_cache_hit_weight", "shared_cache_multiplier"])
def test_cache_weights_are_not_retunable(knob):
    e = invalid(overrides(retune_only({"router": {knob: [0.25, 0.75]}})), f"planner.retune.router.{knob}",
                "is not retunable", *([ROUTER_RESERVED[knob]] if knob in ROUTER_RESERVED else []))
    assert ("runtime update does not change" if "cache_hit" in knob else "no shared cache hits") in e.message


def test_continuous_domains_need_a_sampler_that_draws():
    valid(overrides(retune_only({"router": {"temperature": {"low": 0, "high": 1},
                                            "prefill_load_scale": {"low": 0.25, "high": 8, "log": True}},
                                 "sampler": "tpe", "max_candidates": 12})))
    rc = planner_config(retune_only({"router": {"temperature": {"low": 0, "high": 1, "step": 0.25}}})).retune
    assert rc.router_domains()["temperature"].points() == (0.0, 0.25, 0.5, 0.75, 1.0)


def test_domain_points():
    assert Domain(low=70, high=90, step=10).points() == (70, 80, 90)
    assert Domain(low=0.1, high=0.35, step=0.1).points() == (0.1, 0.2, 0.3)
    assert Domain(low=0.1, high=1.0, log=True).continuous


@pytest.mark.parametrize("planner,retune_planner,where,needle", [
    (SLA_BOTH, {"throughput_adjustment_interval": [60, 180]}, "throughput_adjustment_interval",
     "not a Planner runtime knob"),
    (SLA_BOTH, {"fpm_sample_bucket_size": [16]}, "fpm_sample_bucket_size", "not a Planner runtime knob"),
    (SLA_BOTH, {"load_scaling_down_sensitivity": [70, 101]}, "load_scaling_down_sensitivity", "list item 1: "),
    (SLA_BOTH, {"load_scaling_down_sensitivity": {"low": 70, "high": 90, "step": 2.5}},
     "load_scaling_down_sensitivity", "step: "),
    (SLA_BOTH, {"load_scaling_down_sensitivity": {"low": 70, "high": 90}}, "load_scaling_down_sensitivity",
     "add a step"),
    (SLA_BOTH, {"load_predictor": ["arima", "lstm"]}, "load_predictor", "list item 1: "),
    (SLA_BOTH, {"load_predictor": {"low": 0, "high": 1}}, "load_predictor", "categorical"),
    (SLA_BOTH, {"kalman_r": [5, 10]}, "kalman_r", "does not search kalman"),
    (SLA_BOTH, {"prophet_window_size": [20, 50]}, "prophet_window_size", "does not search prophet"),
    ({"policy": "enabled"}, {"load_predictor": ["arima", "kalman"]}, "load_predictor", "throughput scaling"),
    ({"policy": "enabled"}, {"load_min_observations": [3, 5]}, "load_min_observations", "only target sla uses"),
    ({**SLA_BOTH, "enable_load_scaling": False}, {"load_scaling_down_sensitivity": [70, 90]},
     "load_scaling_down_sensitivity", "load scaling"),
])
def test_planner_domains(planner, retune_planner, where, needle):
    section = {**planner, "load_predictor_warmup_trace": str(HISTORY),
               "retune": {"interval_seconds": 180, "planner": retune_planner}}
    invalid(overrides(section, path=REPLAY), f"planner.retune.planner.{where}", needle)


def test_planner_domains_that_act():
    section = {**SLA_BOTH, "load_predictor_warmup_trace": str(HISTORY),
               "retune": {"interval_seconds": 180, "planner": {
                   "load_scaling_down_sensitivity": {"low": 70, "high": 90, "step": 10},
                   "load_predictor": ["arima", "kalman"], "kalman_r": [5, 10], "load_predictor_log1p": [True, False],
                   "load_min_observations": 5, "max_throughput_scaling_replicas": [2, 8]}}}
    valid(overrides(section, path=REPLAY))
    pc = planner_config(section, path=REPLAY)
    doms = pc.retune.planner_domains(load_scaling=True)
    assert doms["load_scaling_down_sensitivity"].points() == (70, 80, 90)
    assert doms["kalman_r"].points() == (5.0, 10.0) and doms["load_predictor_log1p"].points() == (True, False)
    assert not pc.retune.predictor_presweep(throughput_scaling=True)


@pytest.mark.parametrize("retune_planner,needle", [
    ("default", "no Planner field is tuned"),
    ({"load_scaling_down_sensitivity": [70, 90]}, "no Planner field is tuned"),
    ("all", "takes default or a map"),
    ({}, "empty map"),
])
def test_planner_section_shapes(retune_planner, needle):
    invalid(overrides(retune_only({"planner": retune_planner})), "planner.retune.planner", needle)


def test_every_planner_knob_is_a_planner_runtime_field_and_its_default_validates():
    for knob in PLANNER_KNOBS:
        default = PlannerKnobs.model_fields[knob].default
        rc = RetuneConfig.model_validate({"interval_seconds": 600, "planner": {knob: default}})
        assert rc.planner.given()[knob].points() == (default,)


# -- the Python API ------------------------------------------------------------------------------
API_RETUNE_ONLY = {"mode": "agg", "enable_throughput_scaling": False, "enable_load_scaling": False,
                   "retune": {"interval_seconds": 600, "router": ROUTER}}


def api_failure(fn, *args, **kwargs) -> InputError:
    with pytest.raises(InputError) as info:
        fn(*args, **kwargs)
    e = info.value
    assert e.exit_code == 2 and "\n" not in str(e)
    return e


def test_the_api_takes_retune_with_planner_config_names_and_a_dynamo_trace(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # (the API's HTML page goes to ./planner_reports)
    report = run_trace_replay(str(WHOLE), trace_format="dynamo", router_mode="kv_router",
                              planner_config=API_RETUNE_ONLY, extra_engine_args={"num_gpu_blocks": 29249})
    assert report.planner["retune_events"] == []  # ~5 minutes: shorter than one window plus grace
    pp = api_planner(API_RETUNE_ONLY)
    assert loops(pp) == (False, False) and (pp.retune.sla_ttft_ms, pp.retune.sla_itl_ms) == (500, 50)
    pc = parse_planner_config(API_RETUNE_ONLY)
    assert parse_planner_config(pc) is pc
    sla = {"mode": "agg", "optimization_target": "sla", "ttft_ms": 800, "itl_ms": 40,
           "load_predictor_warmup_trace": str(HISTORY), "retune": {"interval_seconds": 180, "planner": "default"}}
    assert api_planner(sla).retune.sla_ttft_ms == 800  # the Planner's own SLA


@pytest.mark.parametrize("kwargs,where,needle", [
    ({"trace_format": "mooncake", "trace_files": str(MOONCAKE)}, "planner_config.retune", "trace_format='dynamo'"),
    ({"router_mode": "round_robin"}, "router_mode", "kv_router"),
    ({"replay_concurrency": 4}, "replay_concurrency", "closed loop"),
    ({"max_sim_time_ms": 60_000}, "max_sim_time_ms", "not allowed with retune"),
    ({"planner_config": {**API_RETUNE_ONLY, "retune": {"interval_seconds": 601}}},
     "planner_config.retune.interval_seconds", "multiple of the Planner tick"),
    ({"planner_config": {**API_RETUNE_ONLY,
                         "retune": {"interval_seconds": 600, "router": {"disk_cache_hit_weight": 1}}}},
     "planner_config.retune.router.disk_cache_hit_weight", "not retunable"),
    ({"planner_config": {"mode": "agg", "optimization_target": "sla", "retune": {"interval_seconds": 180}},
      "trace_files": str(REPLAY)}, "planner_config.load_predictor_warmup_trace", "Dynamo request trace"),
])
def test_the_api_checks_retune_the_same_way(kwargs, where, needle):
    args = {"trace_files": str(WHOLE), "trace_format": "dynamo", "router_mode": "kv_router",
            "planner_config": API_RETUNE_ONLY, **kwargs}
    e = api_failure(run_trace_replay, args.pop("trace_files"), **args)
    assert not isinstance(e, NotSupportedError) and e.where == where and needle in e.message, str(e)


def test_synthetic_replay_rejects_retune():
    e = api_failure(run_synthetic_trace_replay, 100, 10, 10, request_rate=1.0, router_mode="kv_router",
                    planner_config=API_RETUNE_ONLY)
    assert not isinstance(e, NotSupportedError) and e.where == "planner_config.retune"
    assert "run_trace_replay(..., trace_format='dynamo')" in e.message
