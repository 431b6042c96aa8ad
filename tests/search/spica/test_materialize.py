"""materialize: a flat sample -> the kv-load fields (resolve_load) and a concrete predict config
(prediction_config) that validates, plans and replays; every unsupported value named."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import yaml

from aisim.search.spica import unroll_sample
from aisim.search.spica.config import SearchConfig, load_search_config
from aisim.search.spica.materialize import kv_capacity_tokens, prediction_config, resolve_load
from aisim.simulator.config.loading import validate_config
from aisim.simulator.errors import InputError
from aisim.simulator.plan import plan_from_config

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "configs" / "spica-agg-vs-disagg.yaml"
ONE = {"tp": 1, "pp": 1, "attention_dp": 1, "moe_tp": 1, "moe_ep": 1, "replicas": 1}
AGG_SELECTION = {"deployment_mode": "agg", "agg_max_num_batched_tokens": 16384, "router_mode": "kv_router"}
DISAGG_SELECTION = {"deployment_mode": "disagg", "prefill_max_num_batched_tokens": 8192, "prefill_max_num_seqs": 4,
                    "router_mode": "round_robin"}
DISAGG_SHAPE = {"prefill": {**ONE, "replicas": 2}, "decode": {**ONE, "tp": 2}}

BASE = {
    "engine": {"model": "meta-llama/Llama-3.1-8B-Instruct", "hardware": "h200_sxm", "timing": {"type": "polynomial"}},
    "workload": {"isl": 1024, "osl": 128, "concurrency": 8, "request_count": 50},
    "evaluation": {"sla": {"ttft_ms": 2000, "itl_ms": 50}},
    "search_space": {"deployment_mode": ["agg", "disagg"], "gpu_budget": 8, "router_mode": ["round_robin"],
                     "agg_max_num_batched_tokens": [8192], "agg_max_num_seqs": [256],
                     "prefill_max_num_batched_tokens": [8192], "prefill_max_num_seqs": [1],
                     "decode_max_num_batched_tokens": [8192], "decode_max_num_seqs": [256],
                     "planner_scaling_policy": ["disabled"]},
    "optimization": {"target": "goodput_per_gpu"},
}


def _cfg(**sections) -> SearchConfig:
    data = copy.deepcopy(BASE)
    for name, value in sections.items():
        if value is None:
            data.pop(name, None)
        elif isinstance(value, dict) and isinstance(data.get(name), dict):
            data[name] = {**data[name], **value}
        else:
            data[name] = value
    for name in [k for k, v in data.get("workload", {}).items() if v is None]:
        del data["workload"][name]
    return SearchConfig.from_dict(data)


def _flat(cfg: SearchConfig, selection: dict, shape: dict, predictor=None, ratio=None) -> dict:
    flat = unroll_sample(cfg.search_space, selection, shape, predictor)
    flat.update(resolve_load(cfg, flat, ratio))
    return flat


def _plan(cfg: SearchConfig, flat: dict, config_dir: Path | None = None):
    mapping = prediction_config(cfg, flat)
    assert yaml.safe_load(yaml.safe_dump(mapping, sort_keys=False)) == mapping  # plain, YAML-dumpable
    assert json.loads(json.dumps(mapping)) == mapping
    return mapping, plan_from_config(validate_config(mapping), config_dir)


def _reject(call, where: str, needle: str, category: str) -> InputError:
    with pytest.raises(InputError) as info:
        call()
    err = info.value
    assert (err.where, err.category) == (where, category), err
    assert needle in err.message, err
    assert "\n" not in str(err)
    return err


# -- the example config: an agg and a disagg candidate plan --------------------------------------
def test_example_agg_candidate_plans():
    cfg, config_dir = load_search_config(EXAMPLE)
    flat = _flat(cfg, AGG_SELECTION, {**ONE, "tp": 2, "replicas": 3})
    assert resolve_load(cfg, flat) == {}  # a request rate appends nothing
    mapping, plan = _plan(cfg, flat, config_dir)
    engine = mapping["engine"]
    assert (engine["mode"], engine["model"], engine["hardware"], engine["backend"], engine["context_length"]) == (
        "aggregated", "meta-llama/Llama-3.1-8B-Instruct", "h200_sxm", "vllm", "max")
    assert list(engine["workers"]) == ["aggregated"] and "kv_transfer" not in engine
    worker = engine["workers"]["aggregated"]
    assert worker == {
        "parallelism": {"replicas": 3, "tensor": 2, "pipeline": 1, "attention_data": 1, "moe_tensor": 1,
                        "moe_expert": 1},
        "scheduler": {"max_batched_tokens": 16384, "max_sequences": 256},
        "kv_cache": {"block_size": 64, "prefix_caching": True, "capacity": {"type": "default", "memory_fraction": 0.9}},
        "timing": {"type": "polynomial"},
    }
    assert mapping["router"] == {"policy": "kv_router", "overlap_score_credit": 1.0, "prefill_load_scale": 1.0,
                                 "temperature": 0.0}
    assert mapping["planner"] == {"policy": "disabled"}
    assert mapping["traffic"] == {"source": {"type": "synthetic", "input_tokens": 2048, "output_tokens": 256},
                                  "load": {"type": "poisson", "requests_per_second": 30.0, "seed": 42},
                                  "stop": {"requests": 1500}}
    assert mapping["evaluation"] == {"sla": {"ttft_ms": 2000.0, "itl_ms": 50.0}}
    assert mapping["execution"] == {"backend": "local"}
    [pool] = plan.pools
    a = pool.scheduler
    assert (pool.role, pool.replicas, pool.shape.tensor, a.max_batched_tokens, a.max_sequences, a.block_size,
            a.enable_prefix_caching, pool.timing.type) == ("aggregated", 3, 2, 16384, 256, 64, True, "polynomial")
    assert pool.kv_sizing["type"] == "default" and pool.kv_sizing["memory_fraction"] == 0.9
    assert plan.router.policy == "kv_router" and plan.planner is None and plan.transfer is None
    assert plan.traffic.workload.num_requests == 1500
    assert plan.sla.ttft_ms == 2000.0


def test_example_disagg_candidate_plans():
    cfg, config_dir = load_search_config(EXAMPLE)
    flat = _flat(cfg, DISAGG_SELECTION, DISAGG_SHAPE)
    mapping, plan = _plan(cfg, flat, config_dir)
    engine = mapping["engine"]
    assert engine["mode"] == "disaggregated" and list(engine["workers"]) == ["prefill", "decode"]
    assert engine["kv_transfer"] == {"bandwidth_gb_per_second": 50.0, "bytes_per_token": "auto",
                                     "timing_mode": "destination_missing"}
    prefill, decode = engine["workers"]["prefill"], engine["workers"]["decode"]
    assert prefill["scheduler"] == {"max_batched_tokens": 8192, "max_sequences": 4}
    assert decode["scheduler"] == {"max_batched_tokens": 8192, "max_sequences": 256}
    assert prefill["kv_cache"]["prefix_caching"] is True and decode["kv_cache"]["prefix_caching"] is False
    assert mapping["router"] == {"policy": "round_robin"}
    roles = {p.role: p for p in plan.pools}
    assert (roles["prefill"].replicas, roles["prefill"].shape.tensor) == (2, 1)
    assert (roles["decode"].replicas, roles["decode"].shape.tensor) == (1, 2)
    assert roles["prefill"].scheduler.max_sequences == 4
    assert plan.transfer is not None and plan.transfer.bandwidth_gb_per_second == 50.0


def test_an_example_candidate_replays():
    from aisim.simulator.run import run_plan

    cfg, config_dir = load_search_config(EXAMPLE, ["workload.request_count=40"])
    _, plan = _plan(cfg, _flat(cfg, AGG_SELECTION, ONE), config_dir)
    report = run_plan(plan)
    assert report.summary["completed_requests"] == 40
    assert report.summary["goodput_output_throughput_tok_s"] > 0


# -- the kv-load fields ---------------------------------------------------------------------------
def _tokens(pool) -> int:
    return pool.kv_sizing["blocks_per_rank"] * pool.block_size * pool.num_ranks * pool.replicas


def test_kv_load_ratio_agg_sizes_concurrency_as_the_replay_sizes_kv():
    cfg = _cfg(workload={"concurrency": None, "kv_load_ratio": 0.5})
    flat = unroll_sample(cfg.search_space, {"deployment_mode": "agg"}, {**ONE, "attention_dp": 2, "replicas": 2}, None)
    fields = resolve_load(cfg, flat)
    assert list(fields) == ["kv_load_ratio", "concurrency", "kv_load_concurrency_capacity", "kv_load_capacity_tokens",
                            "agg_kv_capacity_tokens"]
    flat.update(fields)
    mapping, plan = _plan(cfg, flat)
    tokens = _tokens(plan.pools[0])
    assert fields["agg_kv_capacity_tokens"] == fields["kv_load_capacity_tokens"] == tokens
    assert tokens % (64 * 2 * 2) == 0  # blocks x block size x attention-data ranks x replicas
    assert fields["kv_load_concurrency_capacity"] == tokens / (1024 + 128)
    assert fields["concurrency"] == math.floor(0.5 * tokens / (1024 + 128))
    assert fields["kv_load_ratio"] == 0.5
    assert mapping["traffic"]["load"] == {"type": "concurrency", "concurrency": fields["concurrency"]}
    assert kv_capacity_tokens(flat) == {"agg": tokens}


def test_kv_load_ratio_disagg_uses_the_decode_pool():
    cfg = _cfg(workload={"concurrency": None, "request_count": None, "kv_load_ratio": [0.1, 1.0],
                         "num_request_ratio": 2})
    flat = unroll_sample(cfg.search_space, {"deployment_mode": "disagg", "prefill_max_num_batched_tokens": 8192,
                                            "prefill_max_num_seqs": 1, "decode_max_num_seqs": 256}, DISAGG_SHAPE, None)
    fields = resolve_load(cfg, flat, 0.25)
    assert list(fields) == ["kv_load_ratio", "concurrency", "kv_load_concurrency_capacity", "kv_load_capacity_tokens",
                            "prefill_kv_capacity_tokens", "decode_kv_capacity_tokens"]
    flat.update(fields)
    mapping, plan = _plan(cfg, flat)
    roles = {p.role: p for p in plan.pools}
    assert fields["prefill_kv_capacity_tokens"] == _tokens(roles["prefill"])
    assert fields["decode_kv_capacity_tokens"] == fields["kv_load_capacity_tokens"] == _tokens(roles["decode"])
    assert fields["concurrency"] == math.floor(0.25 * _tokens(roles["decode"]) / 1152)
    assert mapping["traffic"]["stop"] == {"requests": 2 * fields["concurrency"]}  # num_request_ratio x concurrency
    assert plan.traffic.workload.num_requests == 2 * fields["concurrency"]


def test_a_tiny_ratio_still_offers_one_request():
    cfg = _cfg(workload={"concurrency": None, "kv_load_ratio": 1e-9})
    assert resolve_load(cfg, unroll_sample(cfg.search_space, {"deployment_mode": "agg"}, ONE, None))["concurrency"] == 1


def test_fixed_concurrency_is_copied():
    cfg = _cfg()
    flat = _flat(cfg, {"deployment_mode": "agg"}, ONE)
    assert flat["concurrency"] == 8 and list(flat)[-1] == "concurrency"
    mapping, plan = _plan(cfg, flat)
    assert mapping["traffic"]["load"] == {"type": "concurrency", "concurrency": 8}
    assert mapping["traffic"]["stop"] == {"requests": 50}


def test_a_predict_traffic_section_with_a_kv_capacity_fraction():
    traffic = {"source": {"type": "synthetic", "input_tokens": 512, "output_tokens": 64},
               "load": {"type": "kv_capacity_fraction", "fraction": 0.01}, "stop": {"requests_per_load_unit": 3}}
    cfg = _cfg(workload=None, traffic=traffic)
    flat = _flat(cfg, {"deployment_mode": "agg"}, ONE)
    assert flat["kv_load_ratio"] == 0.01
    assert flat["concurrency"] == math.floor(0.01 * flat["agg_kv_capacity_tokens"] / 576)
    mapping, plan = _plan(cfg, flat)
    assert mapping["traffic"]["load"] == {"type": "concurrency", "concurrency": flat["concurrency"]}
    assert mapping["traffic"]["stop"] == {"requests_per_load_unit": 3.0}
    assert plan.traffic.workload.num_requests == round(3 * flat["concurrency"])


def test_num_request_ratio_with_a_rate_counts_per_request_per_second():
    cfg = _cfg(workload={"concurrency": None, "request_count": None, "request_rate": 2.5, "num_request_ratio": 10,
                         "arrival_seed": 7})
    mapping, plan = _plan(cfg, _flat(cfg, {"deployment_mode": "agg"}, ONE))
    assert mapping["traffic"]["load"] == {"type": "poisson", "requests_per_second": 2.5, "seed": 7}
    assert mapping["traffic"]["stop"] == {"requests": 25}


def test_the_ratio_argument_is_checked():
    searched = _cfg(workload={"concurrency": None, "kv_load_ratio": [0.5, 1.0]})
    pinned = _cfg(workload={"concurrency": None, "kv_load_ratio": 0.5})
    flat = unroll_sample(searched.search_space, {"deployment_mode": "agg"}, ONE, None)
    _reject(lambda: resolve_load(searched, flat), "kv_load_ratio", "pass the trial's value", "invalid_config")
    _reject(lambda: resolve_load(searched, flat, 1.5), "kv_load_ratio", "outside the searched range", "invalid_config")
    _reject(lambda: resolve_load(searched, flat, "high"), "kv_load_ratio", "must be a number", "invalid_config")
    _reject(lambda: resolve_load(pinned, flat, 0.75), "kv_load_ratio", "is pinned at 0.5", "invalid_config")
    _reject(lambda: resolve_load(_cfg(), flat, 0.5), "kv_load_ratio", "not part of this search", "invalid_config")
    assert resolve_load(pinned, flat, 0.5) == resolve_load(pinned, flat)


def test_a_pool_without_kv_memory_is_a_kv_capacity_failure():
    cfg = _cfg(engine={"model": "Qwen/Qwen3-32B", "hardware": "l40s"}, workload={"concurrency": None,
                                                                                  "kv_load_ratio": 1.0})
    flat = unroll_sample(cfg.search_space, {"deployment_mode": "agg"}, ONE, None)
    _reject(lambda: resolve_load(cfg, flat), "tp", "leaves no KV memory on l40s", "kv_capacity")


def test_prediction_config_needs_the_resolved_concurrency():
    cfg = _cfg(workload={"concurrency": None, "kv_load_ratio": 0.5})
    flat = unroll_sample(cfg.search_space, {"deployment_mode": "agg"}, ONE, None)
    _reject(lambda: prediction_config(cfg, flat), "concurrency", "merge resolve_load's fields", "invalid_config")


# -- the Planner ------------------------------------------------------------------------------------
def test_an_sla_planner_candidate():
    cfg = _cfg(search_space={"planner_scaling_policy": ["hybrid_180_5"], "min_endpoint": 2, "startup_time": 30,
                             "context_length": 8192})
    predictor = {"best_by_interval": {"180": {"load_predictor": "kalman", "load_predictor_log1p": True}}}
    flat = _flat(cfg, {"deployment_mode": "agg", "planner_fpm_sampling": "large",
                       "planner_load_sensitivity": "conservative"}, {**ONE, "replicas": 2}, predictor)
    mapping, plan = _plan(cfg, flat)
    assert mapping["planner"] == {
        "policy": "enabled", "target": "sla", "enable_throughput_scaling": True, "enable_load_scaling": True,
        "throughput_adjustment_interval_seconds": 180, "load_adjustment_interval_seconds": 5,
        "max_num_fpm_samples": 128, "fpm_sample_bucket_size": 16, "load_scaling_down_sensitivity": 90,
        "load_min_observations": 8, "load_predictor": "kalman", "load_predictor_log1p": True, "kalman_q_level": 1.0,
        "kalman_q_trend": 0.1, "kalman_r": 10.0, "kalman_min_points": 5, "max_num_gpus": 8, "min_workers": 2}
    worker = mapping["engine"]["workers"]["aggregated"]
    assert worker["startup_seconds"] == 30 and mapping["engine"]["context_length"] == 8192
    s = plan.planner.settings
    assert (s.target, s.mode, s.max_gpu_budget, s.min_endpoint, s.predictor.family,
            s.max_num_fpm_samples, s.ttft_ms, s.itl_ms) == ("sla", "agg", 8, 2, "kalman", 128, 2000.0, 50.0)
    assert plan.pools[0].startup_seconds == 30 and plan.pools[0].scheduler.context_length == 8192


def test_a_load_planner_under_a_throughput_target():
    cfg = _cfg(optimization={"target": "throughput_per_gpu"}, search_space={"planner_scaling_policy": ["load_180_5"]})
    mapping, plan = _plan(cfg, _flat(cfg, {"deployment_mode": "disagg", "prefill_max_num_seqs": 1,
                                           "planner_fpm_sampling": "small", "planner_load_sensitivity": "default"},
                                     DISAGG_SHAPE))
    assert mapping["planner"]["target"] == "throughput" and mapping["planner"]["enable_load_scaling"] is True
    assert "min_workers" not in mapping["planner"]
    assert (plan.planner.settings.target, plan.planner.settings.mode) == ("throughput", "disagg")


def test_throughput_scaling_needs_the_sla_planner_target():
    cfg = _cfg(optimization={"target": "throughput"},
               search_space={"planner_scaling_policy": ["disabled", "throughput_180_5"]})
    flat = _flat(cfg, {"deployment_mode": "agg", "planner_scaling_policy": "throughput_180_5",
                       "planner_fpm_sampling": "default", "planner_load_sensitivity": "default"}, ONE)
    _reject(lambda: prediction_config(cfg, flat), "enable_throughput_scaling", "dropped before sampling",
            "invalid_config")


def test_a_gpu_floor_becomes_the_planners_floor():
    cfg = _cfg(search_space={"planner_scaling_policy": ["disabled", "load_180_5"], "min_gpu_budget": 2})
    on = _flat(cfg, {"deployment_mode": "agg", "planner_scaling_policy": "load_180_5",
                     "planner_fpm_sampling": "default", "planner_load_sensitivity": "default"}, {**ONE, "replicas": 2})
    assert prediction_config(cfg, on)["planner"]["min_num_gpus"] == 2
    off = _flat(cfg, {"deployment_mode": "agg", "planner_scaling_policy": "disabled", "planner_fpm_sampling": "default",
                      "planner_load_sensitivity": "default"}, {**ONE, "replicas": 2})
    assert prediction_config(cfg, off)["planner"] == {"policy": "disabled"}


# -- unsupported values ------------------------------------------------------------------------------
@pytest.mark.parametrize(("space", "where", "needle"), [
    ({"num_g2_blocks": 1000, "offload_batch_size": 8}, "offload_batch_size", "no counterpart"),
])
def test_unsupported_values_are_named(space, where, needle):
    cfg = _cfg(search_space=space)
    flat = _flat(cfg, {"deployment_mode": "agg"}, ONE)
    _reject(lambda: prediction_config(cfg, flat), where, needle, "unsupported")


def test_cache_hit_weights_need_the_host_tier():
    cfg = _cfg(search_space={"router_mode": ["kv_router"], "overlap_score_credit": [1.0], "prefill_load_scale": [1.0],
                             "router_temperature": [0.0]})
    flat = _flat(cfg, {"deployment_mode": "agg"}, ONE)
    flat["host_cache_hit_weight"] = 0.5
    _reject(lambda: prediction_config(cfg, flat), "host_cache_hit_weight", "num_g2_blocks > 0", "unsupported")


def test_the_host_tier_lowers_to_aggregated_and_prefill_workers_only():
    cfg = _cfg(search_space={"num_g2_blocks": 50000, "kv_bytes_per_token": 131072, "bandwidth_g2_to_g1_gbps": 16.0})
    mapping, plan = _plan(cfg, _flat(cfg, {**DISAGG_SELECTION, "prefill_max_num_seqs": 1}, DISAGG_SHAPE))
    workers = mapping["engine"]["workers"]
    assert workers["prefill"]["kv_cache"]["host_offload"] == {"num_host_blocks": 50000, "h2d_bandwidth_gbps": 16.0}
    assert workers["prefill"]["kv_cache"]["bytes_per_token"] == 131072
    assert "host_offload" not in workers["decode"]["kv_cache"]
    prefill, decode = plan.pools
    assert prefill.scheduler.host_offload.num_blocks == 50000 and decode.scheduler.host_offload is None
    assert prefill.scheduler.host_offload.block_bytes == 64 * 131072
    cfg = _cfg(search_space={"num_g2_blocks": 50000})
    mapping, _ = _plan(cfg, _flat(cfg, {"deployment_mode": "agg"}, ONE))
    assert mapping["engine"]["workers"]["aggregated"]["kv_cache"]["host_offload"] == {"num_host_blocks": 50000}


def test_aic_nextn_lowers_to_mtp_with_the_searchs_acceptance():
    cfg = _cfg(search_space={"aic_nextn": 2, "backend": ["vllm", "trtllm"]},
               engine={"timing": {"type": "fixed", "prefill_ms": 20, "decode_ms": 5}, "nextn_accepted": 1.4})
    mapping, plan = _plan(cfg, _flat(cfg, {"deployment_mode": "agg", "backend": "trtllm"}, ONE))
    assert (mapping["engine"]["nextn"], mapping["engine"]["nextn_accepted"]) == (2, 1.4)
    spec = plan.pools[0].scheduler.speculation
    assert (spec.kind, spec.draft_tokens, spec.thresholds) == ("mtp", 2, (1.0, pytest.approx(0.4)))
    mapping, plan = _plan(cfg, _flat(cfg, {**DISAGG_SELECTION, "prefill_max_num_seqs": 1, "backend": "vllm"},
                                     DISAGG_SHAPE))
    prefill, decode = plan.pools  # (a prefill worker verifies no drafts)
    assert prefill.scheduler.speculation is None and decode.scheduler.speculation.draft_tokens == 2


@pytest.mark.parametrize(("space", "engine", "where", "needle"), [
    ({"aic_nextn": 2}, {}, "engine.nextn_accepted", "is required with search_space.aic_nextn 2"),
    ({"aic_nextn": 2}, {"nextn_accepted": 2.5}, "engine.nextn_accepted", "must be within [0, aic_nextn=2]"),
    ({}, {"nextn_accepted": 1.0}, "engine.nextn_accepted", "set aic_nextn or remove nextn_accepted"),
    ({"aic_nextn": 6}, {"nextn_accepted": 1.0}, "search_space.aic_nextn", "between 0 and 5"),
    ({"aic_nextn": 1, "backend": ["vllm", "sglang"]}, {"nextn_accepted": 0.5}, "search_space.backend", "SGLang"),
    ({"aic_nextn": 1}, {"nextn_accepted": 0.5, "timing": {"type": "polynomial"}}, "engine.timing.type",
     "default (measured) or fixed"),
    ({}, {"nextn": 1}, "engine.nextn", "pinned for every candidate in search_space.aic_nextn"),
    ({"aic_nextn": 1, "num_g2_blocks": 100}, {"nextn_accepted": 0.5, "timing": {"type": "default"}},
     "search_space.num_g2_blocks", "does not support MTP"),
])
def test_mtp_search_rules(space, engine, where, needle):
    _reject(lambda: _cfg(search_space=space, engine=engine), where, needle, "invalid_config")


def test_inert_flat_keys_map_to_nothing():
    cfg = _cfg(search_space={"aic_nextn": 0, "kv_bytes_per_token": 1024, "offload_batch_size": 8})
    mapping, _ = _plan(cfg, _flat(cfg, {"deployment_mode": "agg"}, ONE))
    assert "nextn" not in mapping["engine"] and "host_offload" not in mapping["engine"]["workers"]["aggregated"][
        "kv_cache"]


def test_a_missing_flat_key_is_named():
    cfg = _cfg()
    flat = _flat(cfg, {"deployment_mode": "agg"}, ONE)
    del flat["agg_max_num_seqs"]
    _reject(lambda: prediction_config(cfg, flat), "agg_max_num_seqs", "build it with unroll_sample", "invalid_config")


def test_execution_replays_in_process():
    cfg = _cfg(execution={"backend": "ray", "ray_address": "auto", "seed": 7, "router_sync_ms": 5})
    mapping, plan = _plan(cfg, _flat(cfg, {"deployment_mode": "agg"}, ONE))
    assert mapping["execution"] == {"seed": 7, "backend": "local", "router_sync_ms": 5.0}
    assert plan.execution.backend == "local" and plan.seed == 7


def test_measured_timing_and_backend_version_pass_through():
    cfg = _cfg(engine={"timing": {"type": "default"}, "backend_version": "0.12.0", "enable_chunked_prefill": False})
    mapping = prediction_config(cfg, _flat(cfg, {"deployment_mode": "agg"}, ONE))
    assert mapping["engine"]["backend_version"] == "0.12.0" and mapping["engine"]["enable_chunked_prefill"] is False
    assert mapping["engine"]["workers"]["aggregated"]["timing"] == {"type": "default"}
    validate_config(mapping)


def test_same_sample_same_config():
    cfg, _ = load_search_config(EXAMPLE)
    flat = _flat(cfg, AGG_SELECTION, ONE)
    assert prediction_config(cfg, flat) == prediction_config(cfg, copy.deepcopy(flat))
    assert flat == _flat(cfg, AGG_SELECTION, ONE)
