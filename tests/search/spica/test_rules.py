"""Spica's rules from the reference's search-space facts: the kv-router knobs take only their
allowed choices, a selection may carry ``kv_load_ratio`` (consumed by the KV-load step, never
emitted), and a load-only scaling policy may leave the throughput interval null."""

from __future__ import annotations

import pytest

from aisim.search.spica import SearchSpace, unroll_sample
from aisim.search.spica.presets import ALLOWED_CHOICES
from aisim.simulator.errors import InputError

BASE = {"model_name": "meta-llama/Llama-3.1-8B-Instruct", "hardware_sku": "h200_sxm", "deployment_mode": ["agg"],
        "router_mode": ["kv_router"]}
SHAPE = {"tp": 1, "pp": 1, "attention_dp": 1, "moe_tp": 1, "moe_ep": 1, "replicas": 2}
LOAD_ONLY = {"enable_throughput_scaling": False, "enable_load_scaling": True,
             "load_adjustment_interval_seconds": 5, "throughput_adjustment_interval_seconds": None}


def first_of_each(space: SearchSpace) -> dict:
    return {k: v[0] for k, v in space.branch_choices("agg").items()}


@pytest.mark.parametrize("knob, bad, bounds", [("overlap_score_credit", 1.5, "[0.0, 1.0]"),
                                               ("host_cache_hit_weight", 1.25, "[0.0, 1.0]"),
                                               ("disk_cache_hit_weight", 2.0, "[0.0, 1.0]")])
def test_a_router_knob_value_outside_its_bounds_is_rejected_naming_them(knob, bad, bounds):
    with pytest.raises(InputError) as err:
        SearchSpace.from_dict({**BASE, knob: [bad]})
    assert err.value.where == f"search_space.{knob}"
    assert err.value.message == f"{bad!r} is outside {bounds}; give values in it"
    ok = SearchSpace.from_dict({**BASE, knob: list(ALLOWED_CHOICES[knob])})
    assert getattr(ok, knob) == ALLOWED_CHOICES[knob]


@pytest.mark.parametrize("knob, value", [("overlap_score_credit", 0.7), ("prefill_load_scale", 3.0),
                                         ("router_temperature", 2.0), ("host_cache_hit_weight", 0.6)])
def test_a_router_knob_takes_any_value_within_its_bounds_not_only_the_default_grid(knob, value):
    assert getattr(SearchSpace.from_dict({**BASE, knob: [value]}), knob) == (value,)


def test_a_selection_may_carry_kv_load_ratio_and_the_sample_does_not_emit_it():
    space = SearchSpace.from_dict(BASE)
    sel = first_of_each(space)
    flat = unroll_sample(space, {**sel, "kv_load_ratio": 0.5}, SHAPE, None)
    assert "kv_load_ratio" not in flat and flat == unroll_sample(space, sel, SHAPE, None)
    with pytest.raises(InputError, match="selection.kv_load_ratio: must be a number > 0, got -1"):
        unroll_sample(space, {**sel, "kv_load_ratio": -1}, SHAPE, None)


def test_a_load_only_policy_may_leave_the_throughput_interval_null():
    space = SearchSpace.from_dict({**BASE, "planner_scaling_policy": [LOAD_ONLY]})
    flat = unroll_sample(space, first_of_each(space), SHAPE, None)
    assert flat["enable_load_scaling"] is True and flat["enable_throughput_scaling"] is False
    assert flat["throughput_adjustment_interval_seconds"] is None  # carried as given
    assert flat["load_adjustment_interval_seconds"] == 5
    with pytest.raises(InputError, match=r"0\.load_adjustment_interval_seconds: is null, but the policy sets "
                                         "enable_load_scaling"):
        SearchSpace.from_dict({**BASE, "planner_scaling_policy": [{**LOAD_ONLY, "load_adjustment_interval_seconds": None}]})
    with pytest.raises(InputError, match="throughput_adjustment_interval_seconds: is null, but the policy sets "
                                         "enable_throughput_scaling"):
        SearchSpace.from_dict({**BASE, "planner_scaling_policy": [{**LOAD_ONLY, "enable_throughput_scaling": True}]})
