"""SearchSpace.from_dict: defaults, the seed's three override mechanisms, gating, every rejection."""

from __future__ import annotations

import json

import pytest

from aisim.search.spica import SearchSpace
from aisim.search.spica.domains import Range
from aisim.search.spica.presets import DEFAULTS
from aisim.simulator.errors import InputError

KV_KNOBS = ["overlap_score_credit", "prefill_load_scale", "router_temperature"]


def _reject(mapping, where: str, needle: str) -> InputError:
    with pytest.raises(InputError) as info:
        SearchSpace.from_dict(mapping)
    assert info.value.where == where, info.value
    assert needle in info.value.message, info.value
    assert info.value.category == "invalid_config"
    return info.value


# -- defaults ----------------------------------------------------------------------------------
def test_an_empty_section_takes_every_default():
    space = SearchSpace.from_dict({})
    assert space.to_dict() == json.loads(json.dumps(DEFAULTS))
    assert list(space.to_dict()) == list(DEFAULTS)
    assert SearchSpace.from_dict(None) == space


def test_defaults_of_note():
    space = SearchSpace.from_dict({})
    assert space.deployment_mode == ("disagg", "agg")
    assert space.router_mode == ("kv_router", "round_robin")
    assert space.min_endpoint is None  # null, not 1
    assert space.gpu_budget == 32
    assert space.model_name is None and space.hardware_sku is None
    assert space.parallel_configs == ()


def test_omitted_knobs_keep_their_defaults_next_to_given_ones():
    space = SearchSpace.from_dict({"backend": ["vllm", "sglang"], "agg_max_num_seqs": [64]})
    assert space.backend == ("vllm", "sglang")
    assert space.agg_max_num_seqs == (64,)
    assert space.agg_max_num_batched_tokens == (8192, 16384, 32768)


def test_to_dict_is_plain_json():
    space = SearchSpace.from_dict({"planner_scaling_policy": ["disabled", {
        "enable_throughput_scaling": True, "enable_load_scaling": False,
        "throughput_adjustment_interval_seconds": 240, "load_adjustment_interval_seconds": 5}],
        "deployment_mode": ["agg"], "parallel_configs": [{"tp": 2}]})
    out = space.to_dict()
    assert json.loads(json.dumps(out)) == out
    assert out["parallel_configs"] == [{"tp": 2, "pp": 1, "attention_dp": 1, "moe_tp": 1, "moe_ep": 1, "replicas": 1}]


def test_the_space_is_immutable():
    space = SearchSpace.from_dict({})
    with pytest.raises(Exception):
        space.gpu_budget = 8


# -- pinned scalars ----------------------------------------------------------------------------
def test_model_name_and_hardware_sku_are_pinned_scalars():
    space = SearchSpace.from_dict({"model_name": "Qwen/Qwen3-32B-FP8", "hardware_sku": "h200_sxm"})
    assert (space.model_name, space.hardware_sku) == ("Qwen/Qwen3-32B-FP8", "h200_sxm")


@pytest.mark.parametrize("knob, value", [
    ("model_name", ["a", "b"]), ("hardware_sku", ["h200_sxm"]), ("agg_block_size", [64]), ("gpu_budget", [8, 16]),
    ("num_g2_blocks", {"low": 0}), ("agg_enable_prefix_caching", [True])])
def test_a_never_searched_knob_takes_no_list(knob, value):
    _reject({knob: value}, f"search_space.{knob}", "is never searched: give one value")


@pytest.mark.parametrize("mapping, where, needle", [
    ({"gpu_budget": 0}, "search_space.gpu_budget", "greater than 0"),
    ({"gpu_budget": 8.0}, "search_space.gpu_budget", "valid integer"),
    ({"min_endpoint": -1}, "search_space.min_endpoint", "greater than or equal to 0"),
    ({"agg_gpu_memory_utilization": 1.5}, "search_space.agg_gpu_memory_utilization", "less than or equal to 1"),
    ({"decode_enable_prefix_caching": "yes"}, "search_space.decode_enable_prefix_caching", "valid boolean"),
    ({"decode_enable_prefix_caching": 1}, "search_space.decode_enable_prefix_caching", "valid boolean"),
    ({"model_name": ""}, "search_space.model_name", "at least 1 character"),
    ({"bandwidth_g1_to_g2_gbps": 0}, "search_space.bandwidth_g1_to_g2_gbps", "greater than 0"),
    ({"min_gpu_budget": 40}, "search_space.min_gpu_budget", "is 40, above gpu_budget 32; lower it or raise gpu_budget"),
])
def test_bad_pinned_values(mapping, where, needle):
    _reject(mapping, where, needle)


# -- mechanism 1: a one-element list pins an atomic knob ---------------------------------------
def test_a_one_element_list_pins_the_knob():
    space = SearchSpace.from_dict({"router_mode": ["round_robin"], "agg_max_num_seqs": [512],
                                   "deployment_mode": ["agg"]})
    choices = space.branch_choices("agg")
    assert choices["router_mode"] == ("round_robin",)
    assert choices["agg_max_num_seqs"] == (512,)
    assert choices["deployment_mode"] == ("agg",)


@pytest.mark.parametrize("mapping, where, needle", [
    ({"backend": "vllm"}, "search_space.backend",
     "is searched: give a list of values (a one-element list [x] pins it)"),
    ({"agg_max_num_seqs": 512}, "search_space.agg_max_num_seqs", "a one-element list [x] pins it"),
    ({"agg_max_num_seqs": []}, "search_space.agg_max_num_seqs", "an empty list searches nothing"),
    ({"agg_max_num_seqs": [256, 256]}, "search_space.agg_max_num_seqs", "lists 256 twice; list each value once"),
    ({"prefill_load_scale": [1, 1.0]}, "search_space.prefill_load_scale", "lists 1.0 twice"),
    ({"agg_max_num_seqs": [0]}, "search_space.agg_max_num_seqs.0", "greater than 0"),
    ({"agg_max_num_seqs": [True]}, "search_space.agg_max_num_seqs.0", "boolean, not a number"),
    ({"backend": ["vllm", "tgi"]}, "search_space.backend.1", "'vllm', 'sglang' or 'trtllm' (got 'tgi')"),
    ({"deployment_mode": ["aggregated"]}, "search_space.deployment_mode.0", "'disagg' or 'agg'"),
    ({"router_mode": ["random"]}, "search_space.router_mode.0", "'kv_router' or 'round_robin'"),
    ({"overlap_score_credit": [1.5]}, "search_space.overlap_score_credit", "1.5 is outside [0.0, 1.0]"),
    ({"router_temperature": [-0.1]}, "search_space.router_temperature.0", "greater than or equal to 0"),
    ({"router_temperature": {"low": 0, "high": 1}}, "search_space.router_temperature", "give a list of values"),
    ({"router_temperature": {"range": {"min": 1, "max": 0}}}, "search_space.router_temperature.range",
     "needs min <= max"),
    ({"agg_max_num_seqs": {"range": {"min": 1, "max": 64}}}, "search_space.agg_max_num_seqs.range.step",
     "an integer linear range needs a step"),
    ({"agg_max_num_seqs": {"range": {"min": 0, "max": 64, "scale": "log"}}}, "search_space.agg_max_num_seqs.range.min",
     "a log range needs min > 0"),
    ({"agg_max_num_seqs": {"range": {"min": 1, "max": 64, "step": 2, "scale": "log"}}},
     "search_space.agg_max_num_seqs.range.step", "a log range takes no step"),
    ({"overlap_score_credit": {"range": {"min": 0.5, "max": 2.0}}}, "search_space.overlap_score_credit",
     "2.0 is outside [0.0, 1.0]"),
    ({"gpu_budget": {"range": {"min": 1, "max": 2, "step": 1}}}, "search_space.gpu_budget", "takes no range"),
])
def test_bad_searched_knobs(mapping, where, needle):
    _reject(mapping, where, needle)


def test_numeric_router_knobs_take_values_within_their_bounds():
    space = SearchSpace.from_dict({"prefill_load_scale": [0.25, 3], "overlap_score_credit": [0.3]})
    assert space.prefill_load_scale == (0.25, 3.0)
    assert space.overlap_score_credit == (0.3,)
    with pytest.raises(InputError, match=r"-1.0 is outside >= 0.0|greater than or equal to 0"):
        SearchSpace.from_dict({"prefill_load_scale": [-1.0]})


def test_a_stepped_range_is_its_list_of_choices_and_a_continuous_one_a_range():
    space = SearchSpace.from_dict({"agg_max_num_seqs": {"range": {"min": 64, "max": 256, "step": 64}},
                                   "overlap_score_credit": {"range": {"min": 0.0, "max": 0.3, "step": 0.1}},
                                   "router_temperature": {"range": {"min": 0.0, "max": 1.0}},
                                   "agg_max_num_batched_tokens": {"range": {"min": 4096, "max": 32768,
                                                                            "scale": "log"}}})
    assert space.agg_max_num_seqs == (64, 128, 192, 256)
    assert space.overlap_score_credit == (0.0, 0.1, 0.2, 0.3)
    assert space.router_temperature == Range(0.0, 1.0, log=False, integer=False)
    assert space.agg_max_num_batched_tokens == Range(4096, 32768, log=True, integer=True)
    d = space.to_dict()
    assert d["router_temperature"] == {"range": {"min": 0.0, "max": 1.0, "scale": "linear"}}
    assert d["agg_max_num_batched_tokens"] == {"range": {"min": 4096, "max": 32768, "scale": "log"}}
    assert SearchSpace.from_dict(d) == space  # the printed form reads back as the same space
    assert space.branch_choices("agg")["router_temperature"] == Range(0.0, 1.0)


# -- mechanism 2: a dict pins a composite's unrolled fields ------------------------------------
THROUGHPUT_240 = {"enable_throughput_scaling": True, "enable_load_scaling": False,
                  "throughput_adjustment_interval_seconds": 240, "load_adjustment_interval_seconds": 5}


def test_composite_dicts_are_kept_next_to_preset_ids():
    space = SearchSpace.from_dict({
        "planner_scaling_policy": ["disabled", THROUGHPUT_240],
        "planner_fpm_sampling": [{"max_num_fpm_samples": 256, "fpm_sample_bucket_size": 36}],
        "planner_load_sensitivity": ["default", {"load_scaling_down_sensitivity": 60, "load_min_observations": 2}],
        "load_predictor_candidates": ["arima_raw", {"load_predictor": "prophet"}],
    })
    assert space.planner_scaling_policy == ("disabled", THROUGHPUT_240)
    assert space.planner_fpm_sampling == ({"max_num_fpm_samples": 256, "fpm_sample_bucket_size": 36},)
    assert space.planner_load_sensitivity == ("default", {"load_scaling_down_sensitivity": 60,
                                                          "load_min_observations": 2})
    assert space.load_predictor_candidates == ("arima_raw", {"load_predictor": "prophet"})


def test_a_disabled_policy_dict_may_leave_the_intervals_null():
    off = {"enable_throughput_scaling": False, "enable_load_scaling": False,
           "throughput_adjustment_interval_seconds": None, "load_adjustment_interval_seconds": None}
    assert SearchSpace.from_dict({"planner_scaling_policy": [off]}).planner_scaling_policy == (off,)


def test_a_predictor_dict_takes_its_family_parameters():
    entry = {"load_predictor": "kalman", "load_predictor_log1p": True, "kalman_r": 2.5, "kalman_min_points": 4}
    assert SearchSpace.from_dict({"load_predictor_candidates": [entry]}).load_predictor_candidates == (entry,)


@pytest.mark.parametrize("mapping, where, needle", [
    ({"planner_scaling_policy": ["throughput_240_5"]}, "search_space.planner_scaling_policy.0",
     "unknown planner_scaling_policy preset 'throughput_240_5'; use one of disabled, throughput_180_5"),
    ({"planner_fpm_sampling": ["default", "tiny"]}, "search_space.planner_fpm_sampling.1",
     "unknown planner_fpm_sampling preset 'tiny'"),
    ({"planner_scaling_policy": "disabled"}, "search_space.planner_scaling_policy", "give a list of values"),
    ({"planner_scaling_policy": THROUGHPUT_240}, "search_space.planner_scaling_policy", "give a list of values"),
    ({"planner_scaling_policy": [7]}, "search_space.planner_scaling_policy.0",
     "give a planner_scaling_policy preset id or a dict of its unrolled fields"),
    ({"planner_scaling_policy": [{**THROUGHPUT_240, "max_num_fpm_samples": 64}]},
     "search_space.planner_scaling_policy.0.max_num_fpm_samples", "unknown key; a planner_scaling_policy dict takes"),
    ({"planner_scaling_policy": [{"enable_throughput_scaling": True, "throughput_adjustment_interval_seconds": 240}]},
     "search_space.planner_scaling_policy.0.enable_load_scaling", "no merge with a preset"),
    ({"planner_fpm_sampling": [{"max_num_fpm_samples": 64}]},
     "search_space.planner_fpm_sampling.0.fpm_sample_bucket_size", "is missing"),
    ({"planner_load_sensitivity": [{"load_min_observations": 5}]},
     "search_space.planner_load_sensitivity.0.load_scaling_down_sensitivity", "is missing"),
    ({"load_predictor_candidates": [{"load_predictor_log1p": True}]},
     "search_space.load_predictor_candidates.0.load_predictor", "is missing"),
    ({"load_predictor_candidates": [{"load_predictor": "lstm"}]},
     "search_space.load_predictor_candidates.0.load_predictor", "'constant', 'arima', 'prophet' or 'kalman'"),
    ({"load_predictor_candidates": [{"load_predictor": "arima", "prophet_window_size": 20}]},
     "search_space.load_predictor_candidates.0.prophet_window_size",
     "tunes the prophet predictor, but load_predictor is arima; remove it"),
    ({"load_predictor_candidates": [{"load_predictor": "kalman", "window": 20}]},
     "search_space.load_predictor_candidates.0.window", "unknown key"),
    ({"planner_scaling_policy": [{**THROUGHPUT_240, "enable_load_scaling": "no"}]},
     "search_space.planner_scaling_policy.0.enable_load_scaling", "valid boolean"),
    ({"planner_scaling_policy": [{**THROUGHPUT_240, "throughput_adjustment_interval_seconds": 240.5}]},
     "search_space.planner_scaling_policy.0.throughput_adjustment_interval_seconds", "valid integer"),
    ({"planner_scaling_policy": [{**THROUGHPUT_240, "throughput_adjustment_interval_seconds": None}]},
     "search_space.planner_scaling_policy.0.throughput_adjustment_interval_seconds",
     "is null, but the policy sets enable_throughput_scaling"),
    ({"planner_fpm_sampling": [{"max_num_fpm_samples": 64, "fpm_sample_bucket_size": 10}]},
     "search_space.planner_fpm_sampling.0.fpm_sample_bucket_size", "must be a perfect square"),
    ({"planner_load_sensitivity": [{"load_scaling_down_sensitivity": 120, "load_min_observations": 5}]},
     "search_space.planner_load_sensitivity.0.load_scaling_down_sensitivity", "less than or equal to 100"),
    ({"planner_scaling_policy": [THROUGHPUT_240, dict(THROUGHPUT_240)]}, "search_space.planner_scaling_policy",
     "twice; list each value once"),
    ({"planner_scaling_policy": []}, "search_space.planner_scaling_policy", "an empty list searches nothing"),
])
def test_bad_composites(mapping, where, needle):
    _reject(mapping, where, needle)


# -- mechanism 3: parallel_configs pins the shape ----------------------------------------------
def test_a_pinned_agg_shape_fills_omitted_dims_with_1():
    space = SearchSpace.from_dict({"deployment_mode": ["agg"], "parallel_configs": [{"tp": 4, "replicas": 2}]})
    assert space.parallel_configs == ({"tp": 4, "pp": 1, "attention_dp": 1, "moe_tp": 1, "moe_ep": 1,
                                       "replicas": 2},)


def test_a_pinned_disagg_shape_fills_each_role():
    space = SearchSpace.from_dict({"deployment_mode": ["disagg"],
                                   "parallel_configs": [{"prefill": {"tp": 2}, "decode": {"attention_dp": 4}}]})
    one = {"tp": 1, "pp": 1, "attention_dp": 1, "moe_tp": 1, "moe_ep": 1, "replicas": 1}
    assert space.parallel_configs == ({"prefill": {**one, "tp": 2}, "decode": {**one, "attention_dp": 4}},)


@pytest.mark.parametrize("mapping, where, needle", [
    ({"parallel_configs": [{"tp": 2}]}, "search_space.parallel_configs",
     "needs exactly one deployment_mode (got disagg, agg); list one mode ([agg] or [disagg]) or remove "
     "parallel_configs"),
    ({"deployment_mode": ["agg"], "parallel_configs": {"tp": 2}}, "search_space.parallel_configs",
     "give a list of shapes"),
    ({"deployment_mode": ["agg"], "parallel_configs": [{"tp": 2}, {"tp": 2, "pp": 1}]},
     "search_space.parallel_configs", "twice"),
    ({"deployment_mode": ["agg"], "parallel_configs": [{"tp": 0}]}, "search_space.parallel_configs.0.tp",
     "must be a positive integer"),
    ({"deployment_mode": ["agg"], "parallel_configs": [{"tensor_parallel": 2}]},
     "search_space.parallel_configs.0.tensor_parallel", "unknown shape key"),
    ({"deployment_mode": ["agg"], "parallel_configs": [{"tp": 2, "strategy": "tp"}]},
     "search_space.parallel_configs.0.strategy", "derived from the shape, not settable"),
    ({"deployment_mode": ["agg"], "parallel_configs": [{"prefill": {}, "decode": {}}]},
     "search_space.parallel_configs.0", "does not match deployment_mode agg: give one shape"),
    ({"deployment_mode": ["disagg"], "parallel_configs": [{"tp": 2}]},
     "search_space.parallel_configs.0", "does not match deployment_mode disagg: give {prefill: shape, decode: shape}"),
    ({"deployment_mode": ["disagg"], "parallel_configs": [{"prefill": {"tp": 2}}]},
     "search_space.parallel_configs.0.decode", "is missing"),
    ({"deployment_mode": ["disagg"], "parallel_configs": [{"prefill": {}, "decode": {}, "tp": 2}]},
     "search_space.parallel_configs.0.tp", "a disagg shape takes only prefill and decode"),
    ({"deployment_mode": ["agg"], "parallel_configs": ["tp2"]}, "search_space.parallel_configs.0",
     "must be a mapping"),
])
def test_bad_pinned_shapes(mapping, where, needle):
    _reject(mapping, where, needle)


# -- admission control and kv_router -----------------------------------------------------------
@pytest.mark.parametrize("knob, value", [
    ("active_decode_blocks_threshold", 0.9), ("active_prefill_tokens_threshold", 4096),
    ("active_prefill_tokens_threshold_frac", 0.5), ("no_admission_control", True)])
def test_admission_fields_are_rejected_in_a_search_with_kv_router(knob, value):
    _reject({knob: value}, f"search_space.{knob}",
            "is reserved and rejected in a search that includes kv_router: Dynamo replay cannot model router "
            "admission control yet; remove it")
    _reject({knob: value, "router_mode": ["kv_router"]}, f"search_space.{knob}", "is reserved")


def test_admission_fields_at_their_defaults_are_accepted_with_kv_router():
    space = SearchSpace.from_dict({"no_admission_control": False, "active_decode_blocks_threshold": None})
    assert space.no_admission_control is False


def test_admission_fields_are_accepted_in_a_round_robin_only_search():
    space = SearchSpace.from_dict({"router_mode": ["round_robin"], "active_decode_blocks_threshold": 0.9,
                                   "no_admission_control": True})
    assert space.active_decode_blocks_threshold == 0.9


# -- the section itself ------------------------------------------------------------------------
def test_unknown_knobs_are_rejected_with_a_suggestion():
    _reject({"router_modes": ["kv_router"]}, "search_space.router_modes",
            "unknown knob; did you mean router_mode? remove it or fix its spelling")
    _reject({"parallel_configs_by_mode": {}}, "search_space.parallel_configs_by_mode", "unknown knob")
    _reject({"zzz": 1}, "search_space.zzz", "unknown knob; remove it or fix its spelling")


def test_the_section_must_be_a_mapping():
    _reject(["agg"], "search_space", "must be a mapping of knob -> value, not list")


# -- gating: what a sampler draws in a branch --------------------------------------------------
def test_branch_choices_of_the_default_space():
    space = SearchSpace.from_dict({})
    assert list(space.branch_choices("agg")) == [
        "deployment_mode", "backend", "agg_max_num_batched_tokens", "agg_max_num_seqs", "router_mode",
        *KV_KNOBS, "planner_scaling_policy", "planner_fpm_sampling", "planner_load_sensitivity"]
    assert list(space.branch_choices("disagg")) == [
        "deployment_mode", "backend", "prefill_max_num_batched_tokens", "prefill_max_num_seqs",
        "decode_max_num_batched_tokens", "decode_max_num_seqs", "router_mode", *KV_KNOBS,
        "planner_scaling_policy", "planner_fpm_sampling", "planner_load_sensitivity"]
    assert space.branch_choices("disagg")["deployment_mode"] == ("disagg",)
    assert space.branch_choices("agg")["router_temperature"] == (0.0, 0.2, 0.5, 1.0)


def test_a_round_robin_only_space_searches_no_kv_router_knob():
    space = SearchSpace.from_dict({"router_mode": ["round_robin"], "num_g2_blocks": 1000})
    assert not space.kv_router_searched and not space.cache_hit_weights_searched
    assert list(space.branch_choices("agg")) == [
        "deployment_mode", "backend", "agg_max_num_batched_tokens", "agg_max_num_seqs", "router_mode",
        "planner_scaling_policy", "planner_fpm_sampling", "planner_load_sensitivity"]


def test_cache_hit_weights_are_searched_only_with_offload():
    assert not SearchSpace.from_dict({"host_cache_hit_weight": [1.0]}).cache_hit_weights_searched
    space = SearchSpace.from_dict({"num_g2_blocks": 1000})
    assert space.cache_hit_weights_searched
    assert [k for k in space.branch_choices("agg") if k in KV_KNOBS or "cache" in k] == [
        "overlap_score_credit", "prefill_load_scale", "host_cache_hit_weight", "disk_cache_hit_weight",
        "router_temperature"]


def test_an_all_disabled_planner_space_searches_no_fpm_or_sensitivity():
    off = {"enable_throughput_scaling": False, "enable_load_scaling": False,
           "throughput_adjustment_interval_seconds": None, "load_adjustment_interval_seconds": None}
    for policies in (["disabled"], ["disabled", off]):
        space = SearchSpace.from_dict({"planner_scaling_policy": policies})
        assert not space.planner_tuning_searched
        assert list(space.branch_choices("agg"))[-1] == "planner_scaling_policy"
    assert SearchSpace.from_dict({"planner_scaling_policy": ["disabled", "load_180_5"]}).planner_tuning_searched


def test_branch_choices_of_a_mode_outside_the_space():
    with pytest.raises(ValueError, match="'agg' is not a deployment_mode of this space"):
        SearchSpace.from_dict({"deployment_mode": ["disagg"]}).branch_choices("agg")


def test_same_value():
    from aisim.search.spica.space import same_value

    assert same_value(1, 1.0) and same_value("a", "a") and same_value(None, None)
    assert not same_value(True, 1) and not same_value(1, True) and not same_value("1", 1)
    assert same_value({"a": 1, "b": True}, {"b": True, "a": 1.0})
    assert not same_value({"a": 1}, {"a": True}) and not same_value({"a": 1}, {"a": 1, "b": 2})
    assert not same_value({"a": 1}, "a")
