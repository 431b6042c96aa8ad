"""unroll_sample: the seed's keys and order for every mode, router and planner state, the
predictor lookup, and every rejection of a bad trial."""

from __future__ import annotations

import copy
import json

import pytest

from aisim.search.spica import SearchSpace, unroll_sample
from aisim.simulator.errors import InputError

BASE = {"model_name": "Qwen/Qwen3-32B-FP8", "hardware_sku": "h200_sxm"}
PINNED = [  # deployment-pinned scalars, then the KV-manager offload fields (defaults)
    ("model_name", "Qwen/Qwen3-32B-FP8"), ("hardware_sku", "h200_sxm"), ("gpu_budget", 32),
    ("min_gpu_budget", None), ("min_endpoint", None), ("context_length", None), ("startup_time", None),
    ("aic_nextn", None), ("num_g2_blocks", 0), ("kv_bytes_per_token", None), ("bandwidth_g1_to_g2_gbps", None),
    ("bandwidth_g2_to_g1_gbps", None), ("offload_batch_size", None)]
AGG_ENGINE_PINNED = [("agg_block_size", 64), ("agg_gpu_memory_utilization", 0.9), ("agg_enable_prefix_caching", True)]
DISAGG_ENGINE_PINNED = [
    ("prefill_block_size", 64), ("prefill_gpu_memory_utilization", 0.9), ("prefill_enable_prefix_caching", True),
    ("decode_block_size", 64), ("decode_gpu_memory_utilization", 0.9), ("decode_enable_prefix_caching", False)]
ADMISSION = [("active_decode_blocks_threshold", None), ("active_prefill_tokens_threshold", None),
             ("active_prefill_tokens_threshold_frac", None), ("no_admission_control", False)]
ONE = {"tp": 1, "pp": 1, "attention_dp": 1, "moe_tp": 1, "moe_ep": 1, "replicas": 1}
AGG_SHAPE = {**ONE, "tp": 2, "replicas": 3}
DISAGG_SHAPE = {"prefill": {**ONE, "tp": 4, "moe_ep": 4, "replicas": 2},
                "decode": {**ONE, "attention_dp": 8, "moe_ep": 8, "replicas": 1}}
DISAGG_PARALLEL = [
    ("prefill_tp", 4), ("prefill_pp", 1), ("prefill_attention_dp", 1), ("prefill_moe_tp", 1), ("prefill_moe_ep", 4),
    ("prefill_strategy", "tep"), ("prefill_replicas", 2),
    ("decode_tp", 1), ("decode_pp", 1), ("decode_attention_dp", 8), ("decode_moe_tp", 1), ("decode_moe_ep", 8),
    ("decode_strategy", "dep"), ("decode_replicas", 1),
    ("used_gpus", 16)]
AGG_SELECTION = {
    "deployment_mode": "agg", "backend": "vllm", "agg_max_num_batched_tokens": 16384, "agg_max_num_seqs": 512,
    "router_mode": "kv_router", "overlap_score_credit": 0.5, "prefill_load_scale": 2.0, "router_temperature": 0.2,
    "planner_scaling_policy": "hybrid_180_5", "planner_fpm_sampling": "large", "planner_load_sensitivity": "aggressive"}
DISAGG_SELECTION = {
    "deployment_mode": "disagg", "backend": "vllm", "prefill_max_num_batched_tokens": 8192, "prefill_max_num_seqs": 4,
    "decode_max_num_batched_tokens": 8192, "decode_max_num_seqs": 1024, "router_mode": "kv_router",
    "overlap_score_credit": 1.0, "prefill_load_scale": 0.0, "router_temperature": 0.0,
    "planner_scaling_policy": "throughput_600_5", "planner_fpm_sampling": "small",
    "planner_load_sensitivity": "default"}
PROPHET_180 = {"best_by_interval": {"180": {"load_predictor": "prophet", "load_predictor_log1p": True,
                                            "prophet_window_size": 20}}}


def _space(**knobs) -> SearchSpace:
    return SearchSpace.from_dict({**BASE, **knobs})


def _items(space, selection, shape, predictor=None) -> list:
    return list(unroll_sample(space, selection, shape, predictor).items())


# -- whole samples, exact keys in order ---------------------------------------------------------
def test_agg_kv_router_hybrid_with_a_prophet_winner():
    assert _items(_space(), AGG_SELECTION, AGG_SHAPE, PROPHET_180) == [
        ("deployment_mode", "agg"), ("backend", "vllm"),
        *PINNED,
        ("tp", 2), ("pp", 1), ("attention_dp", 1), ("moe_tp", 1), ("moe_ep", 1), ("strategy", "tp"), ("replicas", 3),
        ("used_gpus", 6),
        ("agg_max_num_batched_tokens", 16384), ("agg_max_num_seqs", 512), *AGG_ENGINE_PINNED,
        ("router_mode", "kv_router"), ("overlap_score_credit", 0.5), ("prefill_load_scale", 2.0),
        ("router_temperature", 0.2), *ADMISSION,
        ("planner_scaling_policy", "hybrid_180_5"), ("enable_throughput_scaling", True), ("enable_load_scaling", True),
        ("throughput_adjustment_interval_seconds", 180), ("load_adjustment_interval_seconds", 5),
        ("max_num_fpm_samples", 128), ("fpm_sample_bucket_size", 16),
        ("load_scaling_down_sensitivity", 70), ("load_min_observations", 3),
        ("load_predictor", "prophet"), ("load_predictor_log1p", True), ("prophet_window_size", 20)]


def test_disagg_kv_router_throughput_600_looks_up_the_600_s_winner():
    predictor = {"best_by_interval": {"180": {"load_predictor": "arima"},
                                      "600": {"load_predictor": "kalman", "kalman_q_level": 10.0}}}
    assert _items(_space(), DISAGG_SELECTION, DISAGG_SHAPE, predictor) == [
        ("deployment_mode", "disagg"), ("backend", "vllm"),
        *PINNED,
        *DISAGG_PARALLEL,
        ("prefill_max_num_batched_tokens", 8192), ("prefill_max_num_seqs", 4), ("decode_max_num_batched_tokens", 8192),
        ("decode_max_num_seqs", 1024), *DISAGG_ENGINE_PINNED,
        ("router_mode", "kv_router"), ("overlap_score_credit", 1.0), ("prefill_load_scale", 0.0),
        ("router_temperature", 0.0), *ADMISSION,
        ("planner_scaling_policy", "throughput_600_5"), ("enable_throughput_scaling", True),
        ("enable_load_scaling", False), ("throughput_adjustment_interval_seconds", 600),
        ("load_adjustment_interval_seconds", 5), ("max_num_fpm_samples", 32), ("fpm_sample_bucket_size", 4),
        ("load_scaling_down_sensitivity", 80), ("load_min_observations", 5),
        ("load_predictor", "kalman"), ("load_predictor_log1p", False), ("kalman_q_level", 10.0),
        ("kalman_q_trend", 0.1), ("kalman_r", 10.0), ("kalman_min_points", 5)]


def test_a_round_robin_disabled_trial_of_a_mixed_study_drops_router_and_planner_knobs():
    selection = {**DISAGG_SELECTION, "router_mode": "round_robin", "planner_scaling_policy": "disabled"}
    assert _items(_space(), selection, DISAGG_SHAPE, PROPHET_180) == [
        ("deployment_mode", "disagg"), ("backend", "vllm"),
        *PINNED,
        *DISAGG_PARALLEL,
        ("prefill_max_num_batched_tokens", 8192), ("prefill_max_num_seqs", 4), ("decode_max_num_batched_tokens", 8192),
        ("decode_max_num_seqs", 1024), *DISAGG_ENGINE_PINNED,
        ("router_mode", "round_robin"),
        ("planner_scaling_policy", "disabled"), ("enable_throughput_scaling", False), ("enable_load_scaling", False)]


def test_offload_fields_and_cache_hit_weights_with_multi_tier_offload():
    space = _space(num_g2_blocks=4096, kv_bytes_per_token=163840, bandwidth_g1_to_g2_gbps=50.0,
                   bandwidth_g2_to_g1_gbps=40.0, offload_batch_size=32, context_length=32768, startup_time=120.0,
                   aic_nextn=1, gpu_budget=16, min_gpu_budget=4, min_endpoint=2, router_mode=["kv_router"],
                   planner_scaling_policy=["disabled"], deployment_mode=["agg"])
    selection = {"backend": "vllm", "agg_max_num_batched_tokens": 8192, "agg_max_num_seqs": 256,
                 "overlap_score_credit": 0.0, "prefill_load_scale": 1.0, "host_cache_hit_weight": 0.75,
                 "disk_cache_hit_weight": 0.25, "router_temperature": 1.0}
    assert _items(space, selection, AGG_SHAPE) == [
        ("deployment_mode", "agg"), ("backend", "vllm"),
        ("model_name", "Qwen/Qwen3-32B-FP8"), ("hardware_sku", "h200_sxm"), ("gpu_budget", 16),
        ("min_gpu_budget", 4), ("min_endpoint", 2), ("context_length", 32768), ("startup_time", 120.0),
        ("aic_nextn", 1), ("num_g2_blocks", 4096), ("kv_bytes_per_token", 163840),
        ("bandwidth_g1_to_g2_gbps", 50.0), ("bandwidth_g2_to_g1_gbps", 40.0), ("offload_batch_size", 32),
        ("tp", 2), ("pp", 1), ("attention_dp", 1), ("moe_tp", 1), ("moe_ep", 1), ("strategy", "tp"), ("replicas", 3),
        ("used_gpus", 6),
        ("agg_max_num_batched_tokens", 8192), ("agg_max_num_seqs", 256), *AGG_ENGINE_PINNED,
        ("router_mode", "kv_router"), ("overlap_score_credit", 0.0), ("prefill_load_scale", 1.0),
        ("host_cache_hit_weight", 0.75), ("disk_cache_hit_weight", 0.25), ("router_temperature", 1.0), *ADMISSION,
        ("planner_scaling_policy", "disabled"), ("enable_throughput_scaling", False), ("enable_load_scaling", False)]


def test_a_round_robin_only_space_needs_no_router_knobs():
    space = _space(router_mode=["round_robin"])
    selection = {k: v for k, v in AGG_SELECTION.items()
                 if k not in ("router_mode", "overlap_score_credit", "prefill_load_scale", "router_temperature")}
    flat = unroll_sample(space, selection, AGG_SHAPE, None)
    assert flat["router_mode"] == "round_robin"
    assert list(flat)[list(flat).index("router_mode") + 1] == "planner_scaling_policy"


# -- planner ------------------------------------------------------------------------------------
PLANNER_HEAD = ["planner_scaling_policy", "enable_throughput_scaling", "enable_load_scaling"]
PLANNER_ON = [*PLANNER_HEAD, "throughput_adjustment_interval_seconds", "load_adjustment_interval_seconds",
              "max_num_fpm_samples", "fpm_sample_bucket_size", "load_scaling_down_sensitivity", "load_min_observations"]


def _planner_items(flat: dict) -> list:
    keys = list(flat)
    return [(k, flat[k]) for k in keys[keys.index("planner_scaling_policy"):]]


def test_load_scaling_alone_emits_no_predictor_fields():
    flat = unroll_sample(_space(), {**AGG_SELECTION, "planner_scaling_policy": "load_180_10"}, AGG_SHAPE, PROPHET_180)
    assert _planner_items(flat) == [
        ("planner_scaling_policy", "load_180_10"), ("enable_throughput_scaling", False), ("enable_load_scaling", True),
        ("throughput_adjustment_interval_seconds", 180), ("load_adjustment_interval_seconds", 10),
        ("max_num_fpm_samples", 128), ("fpm_sample_bucket_size", 16),
        ("load_scaling_down_sensitivity", 70), ("load_min_observations", 3)]


def test_an_all_disabled_space_needs_no_fpm_or_sensitivity_in_the_selection():
    space = _space(planner_scaling_policy=["disabled"])
    selection = {k: v for k, v in AGG_SELECTION.items()
                 if k not in ("planner_scaling_policy", "planner_fpm_sampling", "planner_load_sensitivity")}
    assert [k for k, _ in _planner_items(unroll_sample(space, selection, AGG_SHAPE, PROPHET_180))] == PLANNER_HEAD


def test_a_policy_dict_is_emitted_raw_and_unrolled_and_its_interval_looked_up():
    policy = {"throughput_adjustment_interval_seconds": 240, "enable_throughput_scaling": True,
              "enable_load_scaling": False, "load_adjustment_interval_seconds": 5}
    fpm = {"fpm_sample_bucket_size": 36, "max_num_fpm_samples": 256}
    sensitivity = {"load_scaling_down_sensitivity": 60, "load_min_observations": 2}
    space = _space(planner_scaling_policy=["disabled", policy], planner_fpm_sampling=["default", fpm],
                   planner_load_sensitivity=[sensitivity])
    predictor = {"best_by_interval": {"180": {"load_predictor": "arima"}, "240": {"load_predictor": "constant"}}}
    selection = {**AGG_SELECTION, "planner_scaling_policy": dict(policy), "planner_fpm_sampling": dict(fpm),
                 "planner_load_sensitivity": dict(sensitivity)}
    flat = unroll_sample(space, selection, AGG_SHAPE, predictor)
    assert _planner_items(flat) == [
        ("planner_scaling_policy", policy), ("enable_throughput_scaling", True), ("enable_load_scaling", False),
        ("throughput_adjustment_interval_seconds", 240), ("load_adjustment_interval_seconds", 5),
        ("max_num_fpm_samples", 256), ("fpm_sample_bucket_size", 36),
        ("load_scaling_down_sensitivity", 60), ("load_min_observations", 2),
        ("load_predictor", "constant"), ("load_predictor_log1p", False)]
    assert list(flat["planner_scaling_policy"]) == list(policy)  # the raw entry, as written
    assert flat["planner_scaling_policy"] is not space.planner_scaling_policy[1]  # a copy, not the space's dict


def test_a_dict_equal_to_a_preset_unrolls_exactly_like_it():
    preset = {"enable_throughput_scaling": True, "enable_load_scaling": True,
              "throughput_adjustment_interval_seconds": 180, "load_adjustment_interval_seconds": 5}
    by_dict = unroll_sample(_space(planner_scaling_policy=[preset]),
                            {**AGG_SELECTION, "planner_scaling_policy": preset}, AGG_SHAPE, PROPHET_180)
    by_id = unroll_sample(_space(), AGG_SELECTION, AGG_SHAPE, PROPHET_180)
    assert by_dict.pop("planner_scaling_policy") == preset
    assert by_id.pop("planner_scaling_policy") == "hybrid_180_5"
    assert list(by_dict.items()) == list(by_id.items())


# -- the load-predictor winner ------------------------------------------------------------------
THROUGHPUT_180 = {**AGG_SELECTION, "planner_scaling_policy": "throughput_180_5"}


def _predictor_items(predictor) -> list:
    flat = unroll_sample(_space(), THROUGHPUT_180, AGG_SHAPE, predictor)
    keys = list(flat)
    return [(k, flat[k]) for k in keys[keys.index("load_min_observations") + 1:]]


@pytest.mark.parametrize("predictor", [
    None,
    {"best_by_interval": {}},
    {"best_by_interval": {"600": {"load_predictor": "arima"}}},
    {"best_by_interval": {"180": None}},
])
def test_no_winner_for_the_interval_means_no_predictor_fields(predictor):
    assert _predictor_items(predictor) == []


@pytest.mark.parametrize("winner, expected", [
    ({"load_predictor": "constant"}, [("load_predictor", "constant"), ("load_predictor_log1p", False)]),
    ({"load_predictor": "arima", "load_predictor_log1p": True},
     [("load_predictor", "arima"), ("load_predictor_log1p", True)]),
    ({"load_predictor": "prophet"},
     [("load_predictor", "prophet"), ("load_predictor_log1p", False), ("prophet_window_size", 50)]),
    ({"load_predictor": "kalman", "kalman_min_points": 3},
     [("load_predictor", "kalman"), ("load_predictor_log1p", False), ("kalman_q_level", 1.0),
      ("kalman_q_trend", 0.1), ("kalman_r", 10.0), ("kalman_min_points", 3)]),
    ({"kalman_r": 5.0, "load_predictor": "arima", "prophet_window_size": 20, "preset": "arima_raw", "loss": 0.1},
     [("load_predictor", "arima"), ("load_predictor_log1p", False)]),
    ({"load_predictor": "prophet", "kalman_r": 5.0, "prophet_window_size": 20, "load_predictor_log1p": True},
     [("load_predictor", "prophet"), ("load_predictor_log1p", True), ("prophet_window_size", 20)]),
])
def test_the_winner_expands_to_its_family_fields_only(winner, expected):
    assert _predictor_items({"best_by_interval": {"180": winner}, "scores": {"180": {}}}) == expected


# -- pins and selections ------------------------------------------------------------------------
def test_pinned_knobs_may_be_left_out_of_the_selection():
    space = _space(deployment_mode=["agg"], backend=["sglang"], agg_max_num_seqs=[128], router_mode=["kv_router"],
                   router_temperature=[0.5], planner_fpm_sampling=["fine"])
    selection = {"agg_max_num_batched_tokens": 8192, "overlap_score_credit": 0.5, "prefill_load_scale": 1.0,
                 "planner_scaling_policy": "load_180_5", "planner_load_sensitivity": "default"}
    flat = unroll_sample(space, selection, AGG_SHAPE, None)
    assert (flat["deployment_mode"], flat["backend"], flat["agg_max_num_seqs"], flat["router_mode"],
            flat["router_temperature"], flat["max_num_fpm_samples"]) == ("agg", "sglang", 128, "kv_router", 0.5, 128)
    # given anyway, a pinned knob must hold its one value
    assert unroll_sample(space, {**selection, "backend": "sglang"}, AGG_SHAPE, None) == flat


def test_a_selected_number_takes_the_space_s_value():
    flat = unroll_sample(_space(), {**AGG_SELECTION, "overlap_score_credit": 1, "prefill_load_scale": 0},
                         AGG_SHAPE, None)
    assert type(flat["overlap_score_credit"]) is float and flat["overlap_score_credit"] == 1.0


def test_a_pinned_shape_must_be_the_trial_s_shape():
    space = _space(deployment_mode=["agg"], parallel_configs=[{"tp": 2, "replicas": 3}, {"tp": 8}])
    selection = {k: v for k, v in AGG_SELECTION.items() if k != "deployment_mode"}
    flat = unroll_sample(space, selection, AGG_SHAPE, None)
    assert (flat["tp"], flat["replicas"], flat["used_gpus"]) == (2, 3, 6)
    with pytest.raises(InputError) as info:
        unroll_sample(space, selection, {**ONE, "tp": 4}, None)
    assert info.value.where == "parallel_config"
    assert "is not one of the shapes search_space.parallel_configs pins" in info.value.message


def test_a_mixed_strategy_and_pp_count_in_used_gpus():
    flat = unroll_sample(_space(), AGG_SELECTION, {**ONE, "tp": 2, "pp": 2, "attention_dp": 2, "moe_ep": 8,
                                                   "replicas": 2}, None)
    assert (flat["strategy"], flat["used_gpus"]) == ("mixed", 16)


# -- purity ------------------------------------------------------------------------------------
def test_unrolling_is_pure_and_json():
    space = _space()
    args = (copy.deepcopy(AGG_SELECTION), copy.deepcopy(AGG_SHAPE), copy.deepcopy(PROPHET_180))
    before = copy.deepcopy(args)
    first = unroll_sample(space, *args)
    assert args == before
    assert unroll_sample(space, *args) == first
    assert json.loads(json.dumps(first)) == first
    assert all(isinstance(v, (str, int, float, bool, type(None), dict)) for v in first.values())


# -- rejections ---------------------------------------------------------------------------------
def _drop(mapping: dict, *keys: str) -> dict:
    return {k: v for k, v in mapping.items() if k not in keys}


@pytest.mark.parametrize("space_knobs, selection, where, needle", [
    ({}, ["agg"], "selection", "must be a mapping of knob -> chosen value"),
    ({}, _drop(AGG_SELECTION, "deployment_mode"), "selection.deployment_mode", "is missing: this branch searches it"),
    ({}, {**AGG_SELECTION, "deployment_mode": "aggregated"}, "selection.deployment_mode",
     "aggregated is not a choice of search_space.deployment_mode (disagg, agg); give one of them"),
    ({"deployment_mode": ["disagg"]}, AGG_SELECTION, "selection.deployment_mode",
     "agg is not a choice of search_space.deployment_mode (disagg)"),
    ({}, _drop(AGG_SELECTION, "agg_max_num_seqs"), "selection.agg_max_num_seqs",
     "is missing: this branch searches it; give one of 256, 512, 1024"),
    ({}, {**AGG_SELECTION, "agg_max_num_seqs": 300}, "selection.agg_max_num_seqs",
     "300 is not a choice of search_space.agg_max_num_seqs (256, 512, 1024)"),
    ({}, {**AGG_SELECTION, "overlap_score_credit": True}, "selection.overlap_score_credit",
     "True is not a choice"),
    ({}, {**AGG_SELECTION, "planner_scaling_policy": "throughput_240_5"}, "selection.planner_scaling_policy",
     "throughput_240_5 is not a choice"),
    ({}, {**AGG_SELECTION, "planner_scaling_policy": {"enable_throughput_scaling": False}},
     "selection.planner_scaling_policy", "is not a choice"),
    ({}, _drop(AGG_SELECTION, "router_temperature"), "selection.router_temperature", "is missing"),
    ({}, _drop(AGG_SELECTION, "planner_fpm_sampling"), "selection.planner_fpm_sampling", "is missing"),
    ({}, {**AGG_SELECTION, "prefill_max_num_seqs": 4}, "selection.prefill_max_num_seqs",
     "is a disagg knob; the agg branch does not search it; remove it"),
    ({}, {**AGG_SELECTION, "host_cache_hit_weight": 1.0}, "selection.host_cache_hit_weight",
     "is searched only with multi-tier offload (num_g2_blocks > 0)"),
    ({"router_mode": ["round_robin"]}, AGG_SELECTION, "selection.overlap_score_credit",
     "is a kv_router knob, but this space routes round_robin only; remove it"),
    ({"router_mode": ["round_robin"], "num_g2_blocks": 8}, {**AGG_SELECTION, "router_mode": "round_robin",
                                                             "disk_cache_hit_weight": 0.0},
     "selection.overlap_score_credit", "is a kv_router knob"),
    ({"planner_scaling_policy": ["disabled"]}, AGG_SELECTION, "selection.planner_fpm_sampling",
     "is searched only when a planner_scaling_policy turns scaling on (every policy here is disabled)"),
    ({}, {**AGG_SELECTION, "load_predictor_candidates": "arima_raw"}, "selection.load_predictor_candidates",
     "is chosen by the load-predictor pre-sweep, not the sampler"),
    ({}, {**AGG_SELECTION, "agg_block_size": 64}, "selection.agg_block_size",
     "is pinned by the search space, never searched; remove it"),
    ({}, {**AGG_SELECTION, "tp": 2}, "selection.tp", "is not searched in the agg branch"),
])
def test_bad_selections(space_knobs, selection, where, needle):
    with pytest.raises(InputError) as info:
        unroll_sample(_space(**space_knobs), selection, AGG_SHAPE, None)
    assert info.value.where == where, info.value
    assert needle in info.value.message, info.value


@pytest.mark.parametrize("selection, shape, where, needle", [
    (AGG_SELECTION, _drop(AGG_SHAPE, "moe_ep"), "parallel_config.moe_ep", "is missing"),
    (AGG_SELECTION, {**AGG_SHAPE, "strategy": "tp"}, "parallel_config.strategy", "not settable"),
    (AGG_SELECTION, {**AGG_SHAPE, "replicas": 0}, "parallel_config.replicas", "must be a positive integer"),
    (AGG_SELECTION, DISAGG_SHAPE, "parallel_config", "is a disagg (prefill/decode) shape, but the mode is agg"),
    (DISAGG_SELECTION, AGG_SHAPE, "parallel_config.tp", "a disagg shape takes only prefill and decode"),
    (DISAGG_SELECTION, {"prefill": DISAGG_SHAPE["prefill"]}, "parallel_config.decode", "is missing"),
    (DISAGG_SELECTION, {"prefill": DISAGG_SHAPE["prefill"], "decode": {"tp": 1}}, "parallel_config.decode.pp",
     "is missing"),
    (AGG_SELECTION, None, "parallel_config", "must be a mapping"),
])
def test_bad_parallel_configs(selection, shape, where, needle):
    with pytest.raises(InputError) as info:
        unroll_sample(_space(), selection, shape, None)
    assert info.value.where == where, info.value
    assert needle in info.value.message, info.value


@pytest.mark.parametrize("predictor, where, needle", [
    ({"180": {"load_predictor": "arima"}}, "load_predictor.best_by_interval", "is missing or not a mapping"),
    ("arima", "load_predictor.best_by_interval", "is missing or not a mapping"),
    ({"best_by_interval": {180: {"load_predictor": "arima"}}}, "load_predictor.best_by_interval",
     "keys are throughput intervals in seconds as strings ('180'), got 180"),
    ({"best_by_interval": {"180": "arima_raw"}}, "load_predictor.best_by_interval.180", "must be the winner's fields"),
    ({"best_by_interval": {"180": {"load_predictor_log1p": True}}},
     "load_predictor.best_by_interval.180.load_predictor",
     "is missing: a predictor winner names its family"),
    ({"best_by_interval": {"180": {"load_predictor": "lstm"}}}, "load_predictor.best_by_interval.180.load_predictor",
     "'constant', 'arima', 'prophet' or 'kalman'"),
    ({"best_by_interval": {"180": {"load_predictor": "prophet", "prophet_window_size": 0}}},
     "load_predictor.best_by_interval.180.prophet_window_size", "greater than 0"),
    ({"best_by_interval": {"180": {"load_predictor": "arima", "load_predictor_log1p": "yes"}}},
     "load_predictor.best_by_interval.180.load_predictor_log1p", "valid boolean"),
])
def test_bad_load_predictor_results(predictor, where, needle):
    with pytest.raises(InputError) as info:
        unroll_sample(_space(), THROUGHPUT_180, AGG_SHAPE, predictor)
    assert info.value.where == where, info.value
    assert needle in info.value.message, info.value


def test_a_malformed_pre_sweep_result_is_rejected_even_without_throughput_scaling():
    with pytest.raises(InputError, match="best_by_interval"):
        unroll_sample(_space(), {**AGG_SELECTION, "planner_scaling_policy": "disabled"}, AGG_SHAPE, {"x": 1})


def test_the_space_must_be_a_search_space():
    with pytest.raises(TypeError, match="space must be a SearchSpace"):
        unroll_sample({}, AGG_SELECTION, AGG_SHAPE, None)


def test_knobs_a_trial_does_not_emit_are_still_checked():
    """A round_robin / disabled trial of a mixed study carries the kv-router and planner-tuning knobs
    the sampler drew; they are not emitted, but they must still be choices of the space."""
    selection = {**AGG_SELECTION, "router_mode": "round_robin", "planner_scaling_policy": "disabled"}
    flat = unroll_sample(_space(), selection, AGG_SHAPE, None)
    assert "overlap_score_credit" not in flat and "max_num_fpm_samples" not in flat
    for knob, bad in (("overlap_score_credit", 0.3), ("planner_fpm_sampling", "huge")):
        with pytest.raises(InputError) as info:
            unroll_sample(_space(), {**selection, knob: bad}, AGG_SHAPE, None)
        assert info.value.where == f"selection.{knob}"
    with pytest.raises(InputError) as info:
        unroll_sample(_space(), _drop(selection, "router_temperature"), AGG_SHAPE, None)
    assert info.value.where == "selection.router_temperature"
