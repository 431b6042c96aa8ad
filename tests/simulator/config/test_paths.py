"""Dotted paths into config mappings: set_path, get_path, with_paths."""

from __future__ import annotations

import pytest

from aisim.simulator.config import get_path, set_path, with_paths
from aisim.simulator.config.loading import apply_overrides
from aisim.simulator.errors import InputError


def test_set_path_creates_missing_and_null_intermediates_in_place():
    d = {"engine": {"model": "m"}, "planner": None}
    out = set_path(d, "engine.workers.aggregated.parallelism.replicas", 4)
    assert out is d and d["engine"] == {"model": "m", "workers": {"aggregated": {"parallelism": {"replicas": 4}}}}
    set_path(d, ("planner", "policy"), "enabled")
    assert d["planner"] == {"policy": "enabled"}
    set_path(d, "router", {"policy": "kv_router"})  # a one-key path replaces the whole section
    assert d["router"] == {"policy": "kv_router"}


def test_set_path_through_a_scalar_names_the_path_and_changes_nothing():
    d = {"engine": {"model": "m"}, "traffic": {"source": {"paths": ["a"]}}}
    with pytest.raises(InputError) as info:
        set_path(d, "engine.model.x.y", 1)
    e = info.value
    assert e.where == "engine.model.x.y" and e.message == "engine.model is a str, not a section; set engine.model itself"
    assert e.category == "invalid_config"
    with pytest.raises(InputError, match="traffic.source.paths is a list, not a section"):
        set_path(d, "traffic.source.paths.0", "b")
    with pytest.raises(InputError, match="engine.model is a str") as info:
        set_path(d, "engine.model.x", 1, field="--set engine.model.x=1")
    assert info.value.where == "--set engine.model.x=1"
    assert d == {"engine": {"model": "m"}, "traffic": {"source": {"paths": ["a"]}}}  # failed calls change nothing


@pytest.mark.parametrize("bad", ["", "a..b", ".a", "a."])
def test_empty_keys_are_rejected(bad):
    with pytest.raises(InputError, match="dot-separated keys"):
        set_path({}, bad, 1)


def test_get_path():
    d = {"engine": {"model": "m", "workers": {"aggregated": None}}, "traffic": {"source": {"paths": ["a"]}}}
    assert get_path(d, "engine.model") == "m"
    assert get_path(d, ("engine", "workers")) == {"aggregated": None}
    assert get_path(d, "engine.workers.aggregated") is None
    assert get_path(d, "engine.workers.aggregated.parallelism", 7) == 7
    assert get_path(d, "engine.model.x", "dflt") == "dflt"  # through a scalar: absent
    assert get_path(d, "traffic.source.paths.0") is None  # lists are not indexed
    assert get_path(d, "nope") is None


def test_with_paths_leaves_its_input_and_values_alone():
    base = {"engine": {"workers": {"aggregated": {"parallelism": {"replicas": 1}}}}, "router": {"policy": "random"}}
    section = {"policy": "enabled"}
    out = with_paths(base, {"engine.workers.aggregated.parallelism.replicas": 4, "planner": section,
                            "planner.max_num_gpus": 8})
    assert base == {"engine": {"workers": {"aggregated": {"parallelism": {"replicas": 1}}}}, "router": {"policy": "random"}}
    assert section == {"policy": "enabled"}
    assert out["engine"]["workers"]["aggregated"]["parallelism"]["replicas"] == 4
    assert out["planner"] == {"policy": "enabled", "max_num_gpus": 8}
    out["router"]["policy"] = "kv_router"
    assert base["router"]["policy"] == "random"  # a deep copy
    assert with_paths(base, [(("router", "policy"), "round_robin")])["router"] == {"policy": "round_robin"}


def test_apply_overrides_copies_and_keeps_its_messages():
    base = {"engine": {"model": "m", "workers": {"aggregated": {}}}}
    out = apply_overrides(base, ["engine.workers.aggregated.parallelism.replicas=3", "planner={policy: disabled}"])
    assert base == {"engine": {"model": "m", "workers": {"aggregated": {}}}}
    assert out["engine"]["workers"]["aggregated"] == {"parallelism": {"replicas": 3}} and out["planner"] == {"policy": "disabled"}
    with pytest.raises(InputError) as info:
        apply_overrides(base, ["engine.model.x=1"])
    assert str(info.value) == "--set engine.model.x=1: engine.model is a str, not a section; set engine.model itself"
