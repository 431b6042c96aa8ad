"""One deployment spec: the YAML and the Python API lower to the same pools; one rule each for
GPUs per worker and KV sizing; every engine argument the API takes has a YAML key."""

from __future__ import annotations

import dataclasses

import pytest

from aisim import plan_from_config, run_config
from aisim.simulator.config.engine_args import EngineArgs, engine_section
from aisim.simulator.config.loading import validate_config
from aisim.simulator.deployment import ParallelShape, gpus_per_worker
from aisim.simulator.plan import lower_engine

TRAFFIC = {"source": {"type": "synthetic", "input_tokens": 100, "output_tokens": 4}, "load": {"type": "concurrency",
           "concurrency": 1}, "stop": {"requests": 1}}
FIXED = {"type": "fixed", "prefill_ms": 100.0, "decode_ms": 10.0}


def _engine(**worker) -> dict:
    return {"model": "meta-llama/Llama-3.1-8B-Instruct", "hardware": "h200_sxm",
            "workers": {"aggregated": {"kv_cache": {"capacity": {"type": "fixed", "blocks": 100}}, "timing": FIXED,
                                       **worker}}}


def test_gpus_per_worker_is_one_formula_and_the_planner_counts_the_seeds_product():
    from aisim.search.spica.dgd import _gpus_per_worker
    from aisim.search.spica.shapes import num_gpus_per_worker

    shape = ParallelShape(tensor=2, pipeline=2, attention_data=2)
    assert shape.gpus_per_worker == gpus_per_worker(2, 2, 2) == 8
    assert shape.planner_gpus_per_replica == 4  # tensor x attention_data: the seed's rule
    assert num_gpus_per_worker({"tp": 2, "pp": 2, "attention_dp": 2}) == 8
    assert _gpus_per_worker({"tp": 2, "pp": 2, "attention_dp": 2}, "") == 8
    assert ParallelShape.from_seed({"agg_tp": 4, "agg_attention_dp": 2}, "agg_") == ParallelShape(4, 1, 2)
    assert ParallelShape(prefill_context=3).gpus_per_worker == 3


def test_the_planner_counts_tensor_x_attention_data_per_replica():
    cfg = validate_config({"engine": _engine(parallelism={"replicas": 1, "tensor": 2, "pipeline": 2}),
                           "traffic": TRAFFIC,
                           "planner": {"policy": "enabled", "target": "load", "max_num_gpus": 8}})
    plan = plan_from_config(cfg)
    from aisim.simulator.planning import build_planner

    planner = build_planner(plan.planner, plan.pools, {"aggregated": None})
    assert plan.pools[0].gpus_per_worker == 4 and planner.settings.decode_engine_num_gpu == 2


def test_speedups_and_preemption_mode_are_yaml_keys():
    # fixed timing: a 100 ms prefill and 10 ms decode passes; halved, then decode halved again:
    # first token at 50 ms, then 3 more tokens 2.5 ms apart
    cfg = validate_config({"engine": _engine(speedup_ratio=2.0, decode_speedup_ratio=2.0,
                                             scheduler={"preemption_mode": "fifo"}), "traffic": TRAFFIC})
    rep = run_config(cfg, capture_per_request=True)
    (r,) = rep.per_request
    assert r["ttft_ms"] == 50.0 and r["e2e_latency_ms"] == 57.5
    assert plan_from_config(cfg).pools[0].scheduler.preemption_mode == "fifo"


# every EngineArgs field with a non-default value, and where the lowered pool shows it
ARGS = {
    "backend_version": ("0.12.0", lambda p, t: p.backend_version == "0.12.0"),
    "model": ("meta-llama/Llama-3.1-8B-Instruct", lambda p, t: p.model == "meta-llama/Llama-3.1-8B-Instruct"),
    "hardware": ("h100_sxm", lambda p, t: p.hardware == "h100_sxm"),
    "max_num_batched_tokens": (4096, lambda p, t: p.scheduler.max_batched_tokens == 4096),
    "max_num_seqs": (8, lambda p, t: p.scheduler.max_sequences == 8),
    "block_size": (16, lambda p, t: p.scheduler.block_size == 16),
    "enable_prefix_caching": (False, lambda p, t: not p.scheduler.enable_prefix_caching),
    "enable_chunked_prefill": (False, lambda p, t: not p.scheduler.enable_chunked_prefill),
    "startup_time": (30.0, lambda p, t: p.startup_seconds == 30.0),
    "max_model_len": (2048, lambda p, t: p.scheduler.context_length == 2048),
    "num_gpu_blocks": (123, lambda p, t: p.scheduler.num_gpu_blocks == 123),
    "tensor_parallel_size": (2, lambda p, t: p.shape.tensor == 2),
    "pipeline_parallel_size": (2, lambda p, t: p.shape.pipeline == 2),
    "prefill_context_parallel_size": (2, lambda p, t: p.shape.prefill_context == 2),
    "dp_size": (2, lambda p, t: p.shape.attention_data == 2 and p.num_ranks == 2),
    "moe_tensor_parallel_size": (2, lambda p, t: p.shape.moe_tensor == 2),
    "moe_expert_parallel_size": (2, lambda p, t: p.shape.moe_expert == 2),
    "timing_model": ({"type": "fixed", "prefill_ms": 5, "decode_ms": 1}, lambda p, t: p.timing.prefill_ms == 5),
    "kv_cache_bytes_per_token": (4096, lambda p, t: p.kv_bytes_per_token == 4096),
    "preemption_mode": ("fifo", lambda p, t: p.scheduler.preemption_mode == "fifo"),
    "speedup_ratio": (2.0, lambda p, t: p.timing.speedup_ratio == 2.0),
    "decode_speedup_ratio": (3.0, lambda p, t: p.timing.decode_speedup_ratio == 3.0),
    "prefill_schedule_interval": (4, lambda p, t: p.scheduler.prefill_schedule_interval == 4),
    "prefill_decode_interval": (2, lambda p, t: p.scheduler.sglang.prefill_decode_interval == 2),  # (sglang)
    "kv_transfer_bandwidth": (7.0, lambda p, t: t.bandwidth_gb_per_second == 7.0),
    "kv_transfer_bytes_per_token": (999, lambda p, t: t.bytes_per_token == 999),
    "kv_transfer_timing_mode": ("full_prompt", lambda p, t: t.timing_mode == "full_prompt"),
    "native_host_offload": ({"num_host_blocks": 77}, lambda p, t: p.scheduler.host_offload.num_blocks == 77
                            and p.scheduler.host_offload.block_bytes == 64 * 1000),
}
NOT_LOWERED = {"worker_type": "the role itself", "engine_type": "engine.backend (each backend's scenarios test it)",
               "gpu_memory_utilization": "sizes KV only without num_gpu_blocks (tested below)",
               "g3_offload": "aggregated workers only (tests/actors/engine/test_offload.py)"}


def _lower(prefill: dict, decode: dict | None = None):
    m = __import__("aisim.simulator.config.models", fromlist=["Engine"])
    roles = {"prefill": (1, EngineArgs.model_validate({"worker_type": "prefill", **prefill}), "prefill_engine_args"),
             "decode": (1, EngineArgs.model_validate({"worker_type": "decode", **(decode or {})}), "decode_engine_args")}
    return lower_engine(m.Engine.model_validate(engine_section(roles)))


def test_every_engine_argument_has_a_yaml_key_and_reaches_the_pool():
    assert set(ARGS) | set(NOT_LOWERED) == set(EngineArgs.model_fields)
    for name, (value, shows) in ARGS.items():
        same = name in ("backend_version", "model", "enable_chunked_prefill", "prefill_decode_interval")
        given = {name: value}  # (engine-wide ones for both roles)
        if name == "prefill_decode_interval":  # (SGLang's: an error with another backend)
            given["engine_type"] = "sglang"
        if name == "kv_transfer_bandwidth":  # (a transfer needs its bytes per token: no model here)
            given["kv_transfer_bytes_per_token"] = 1000
        if name == "native_host_offload":  # (a host block's bytes: no model here)
            given["kv_cache_bytes_per_token"] = 1000
        pools, transfer = _lower(given, given if same else None)
        assert shows(pools[0], transfer), name
        default_pools, default_transfer = _lower({}, {})
        assert (pools[0], transfer) != (default_pools[0], default_transfer), name


def test_gpu_memory_utilization_sizes_kv_from_memory_when_no_blocks_are_given():
    pools, _ = _lower({"model": "meta-llama/Llama-3.1-8B-Instruct", "hardware": "h200_sxm",
                       "gpu_memory_utilization": 0.5}, {"model": "meta-llama/Llama-3.1-8B-Instruct"})
    assert pools[0].kv_sizing["type"] == "default" and pools[0].kv_sizing["memory_fraction"] == 0.5
    assert pools[1].kv_sizing["type"] == "fixed" and pools[1].scheduler.num_gpu_blocks == 16384


def test_the_api_and_the_equivalent_config_lower_to_equal_pools():
    from aisim.simulator.api import _api_plan, _traffic

    args = {"num_gpu_blocks": 500, "block_size": 16, "max_num_seqs": 32, "timing_model": {"type": "fixed",
            "prefill_ms": 20, "decode_ms": 2}, "preemption_mode": "fifo", "max_model_len": 4096}
    traffic = _traffic({"type": "synthetic", "input_tokens": 100, "output_tokens": 4}, {"type": "concurrency",
                       "concurrency": 1}, {"requests": 1}, {})
    kw = dict(prefill_engine_args=None, decode_engine_args=None, num_workers=3, num_prefill_workers=1,
              num_decode_workers=1, router_mode="round_robin", router_config=None, planner_config=None,
              sla_ttft_ms=None, sla_itl_ms=None, sla_e2e_ms=None, capture_per_request=False,
              capture_planner_details=True, fast_forward=True, seed=42, backend="local", router_sync_ms=0.0,
              ray_address=None, engine_actors=None, planner_report_dir=None)
    api = _api_plan(traffic, extra_engine_args=args, **kw)
    section = engine_section({"aggregated": (3, EngineArgs.model_validate(args), "extra_engine_args")})
    cfg = validate_config({"engine": section, "traffic": TRAFFIC})
    yaml = plan_from_config(cfg)
    assert api.pools == yaml.pools
    assert dataclasses.replace(api.pools[0], replicas=1) != api.pools[0]  # (equality is by value)


def test_engine_wide_arguments_must_agree_between_the_roles():
    from aisim.simulator.errors import InputError

    with pytest.raises(InputError, match="decode_engine_args.model: must equal prefill_engine_args.model"):
        _lower({"model": "meta-llama/Llama-3.1-8B-Instruct"}, {})


def _api_planner_plan(planner_config: dict, sla_ttft_ms=None, sla_itl_ms=None):
    from aisim.simulator.api import _api_plan, _traffic

    traffic = _traffic({"type": "synthetic", "input_tokens": 100, "output_tokens": 4}, {"type": "concurrency",
                       "concurrency": 1}, {"requests": 1}, {})
    args = {"num_gpu_blocks": 100, "timing_model": FIXED, "tensor_parallel_size": 2}
    return _api_plan(traffic, extra_engine_args=args, prefill_engine_args=None, decode_engine_args=None,
                     num_workers=2, num_prefill_workers=1, num_decode_workers=1, router_mode="round_robin",
                     router_config=None, planner_config=planner_config, sla_ttft_ms=sla_ttft_ms,
                     sla_itl_ms=sla_itl_ms, sla_e2e_ms=None, capture_per_request=False, capture_planner_details=True,
                     fast_forward=True, seed=42, backend="local", router_sync_ms=0.0, ray_address=None,
                     engine_actors=None, planner_report_dir=None)


def test_the_api_planner_config_and_the_equivalent_planner_section_lower_to_one_plan():
    api = _api_planner_plan({"mode": "agg", "optimization_target": "sla", "ttft_ms": 800, "itl_ms": 40,
                             "enable_load_scaling": True, "max_gpu_budget": 6, "min_gpu_budget": 2,
                             "min_endpoint": 2, "throughput_adjustment_interval": 60, "load_adjustment_interval": 10,
                             "load_predictor": "kalman", "kalman_r": 5.0, "scheduling": {"scale_interval_seconds": 5}})
    engine = _engine(parallelism={"replicas": 2, "tensor": 2})
    section = {"policy": "enabled", "target": "sla", "enable_load_scaling": True, "max_num_gpus": 6,
               "min_num_gpus": 2, "min_workers": 2, "throughput_adjustment_interval_seconds": 60,
               "load_adjustment_interval_seconds": 10, "load_predictor": "kalman", "kalman_r": 5.0,
               "scale_interval_seconds": 5}
    yaml = plan_from_config(validate_config({"engine": engine, "traffic": TRAFFIC, "planner": section,
                                             "evaluation": {"sla": {"ttft_ms": 800, "itl_ms": 40}}})).planner
    assert api.planner == yaml  # settings, retune and warm-up: one value
    s = yaml.settings
    assert (s.max_gpu_budget, s.min_gpu_budget, s.min_endpoint, s.tick_interval_s) == (6, 2, 2, 5.0)
    assert (s.ttft_ms, s.itl_ms, s.predictor.family, s.predictor.kalman_r) == (800, 40, "kalman", 5.0)
    assert (s.enable_throughput_scaling, s.enable_load_scaling, s.decode_engine_num_gpu) == (True, True, 2)
    assert api.planner.digest() == yaml.digest()  # planner_config_digest: the same Planner, the same digest
    # the YAML's own ttft_ms/itl_ms (the Planner's targets) override evaluation.sla's, as the API's do
    own = plan_from_config(validate_config({"engine": engine, "traffic": TRAFFIC,
                                            "planner": {**section, "ttft_ms": 800, "itl_ms": 40},
                                            "evaluation": {"sla": {"ttft_ms": 100, "itl_ms": 10}}})).planner
    assert own.settings == s


def test_a_planner_lowering_error_names_the_key_in_the_callers_dialect():
    from aisim.simulator.errors import InputError

    with pytest.raises(InputError) as info:
        _api_planner_plan({"mode": "agg", "max_gpu_budget": 2, "min_gpu_budget": 4})
    assert info.value.where == "planner_config.min_gpu_budget" and "max_gpu_budget 2" in info.value.message
    with pytest.raises(InputError) as info:
        _api_planner_plan({"mode": "agg", "optimization_target": "sla", "enable_load_scaling": True,
                           "load_adjustment_interval": 200})
    assert info.value.where == "planner_config.load_adjustment_interval"
    with pytest.raises(InputError) as info:
        plan_from_config(validate_config({"engine": _engine(), "traffic": TRAFFIC, "planner": {
            "policy": "enabled", "target": "sla", "enable_load_scaling": True, "load_adjustment_interval_seconds": 200},
            "evaluation": {"sla": {"ttft_ms": 800, "itl_ms": 40}}}))
    assert info.value.where == "planner.load_adjustment_interval_seconds"
    with pytest.raises(InputError) as info:
        _api_planner_plan({"mode": "agg", "prefill_min_endpoint": 2})
    assert info.value.where == "planner_config.prefill_min_endpoint" and "use min_endpoint" in info.value.message
