"""Config validation, --set overrides and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from aisim import plan_from_config
from aisim.simulator.config.loading import apply_overrides, load_config, parse_override, read_yaml_mapping, validate_config
from aisim.simulator.config.rules import check_config
from aisim.simulator.errors import InputError, NotSupportedError
from aisim.validate import detect_kind

ROOT = Path(__file__).resolve().parents[3]
QUICK = ROOT / "configs" / "quickstart.yaml"


def base() -> dict:
    return {
        "engine": {
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "hardware": "h200_sxm",
            "workers": {"aggregated": {"kv_cache": {"capacity": {"type": "fixed", "blocks": 100}}, "timing": {"type": "polynomial"}}},
        }
    }


def err(data: dict) -> InputError:
    with pytest.raises(InputError) as info:
        check_config(validate_config(data))
    return info.value


def test_shipped_configs_validate():
    for path in (ROOT / "configs").glob("*.yaml"):
        if detect_kind(read_yaml_mapping(path, "config")) != "predict":  # recommend / capacity: tests/search
            continue
        cfg, _ = load_config(path)
        check_config(cfg)


def test_unknown_key_names_its_path():
    d = base()
    d["engine"]["workers"]["aggregated"]["scheduler"] = {"max_batch_tokens": 5}
    e = err(d)
    assert e.where == "engine.workers.aggregated.scheduler.max_batch_tokens"
    assert "Extra inputs are not permitted" in str(e)


@pytest.mark.parametrize("section,key,value,want", [
    ("engine", "context_length", 0, "Input should be 'max' or greater than 0 (got 0)"),
    ("execution", "engine_actors", "x", "Input should be 'auto' or a valid integer"),
])
def test_a_plain_union_gets_one_message_naming_every_choice(section, key, value, want):
    d = base()
    d.setdefault(section, {})[key] = value
    e = err(d)
    assert e.where == f"{section}.{key}" and want in e.message and "more error" not in e.message


def test_unknown_top_level_section():
    d = base()
    d["optimizer"] = {}
    assert err(d).where == "optimizer"


def test_wrong_type_names_field_and_value():
    d = base()
    d["engine"]["workers"]["aggregated"]["parallelism"] = {"replicas": "two"}
    e = err(d)
    assert e.where == "engine.workers.aggregated.parallelism.replicas" and "'two'" in str(e)
    assert "\n" not in str(e)


def test_union_tag_is_dropped_from_paths():
    d = base()
    d["traffic"] = {"source": {"type": "trace", "paths": ["x"], "block_sise": 5}}
    assert err(d).where == "traffic.source.block_sise"


def test_missing_required_field():
    d = base()
    del d["engine"]["workers"]
    e = err(d)
    assert e.where == "engine.workers" and "Field required" in str(e)


def test_model_and_hardware_are_required_where_a_rule_needs_them():
    d = base()  # polynomial timing and a fixed capacity: neither is needed
    del d["engine"]["hardware"], d["engine"]["model"]
    plan = plan_from_config(validate_config(d))
    assert (plan.pools[0].model, plan.pools[0].hardware, plan.pools[0].scheduler.context_length) == (None, None, None)
    d["engine"]["workers"]["aggregated"]["timing"] = {"type": "default"}
    with pytest.raises(InputError) as info:
        plan_from_config(validate_config(d))
    assert info.value.where == "engine.model" and "Field required: timing type default" in str(info.value)
    d["engine"]["model"] = "meta-llama/Llama-3.1-8B-Instruct"
    with pytest.raises(InputError) as info:
        plan_from_config(validate_config(d))
    assert info.value.where == "engine.hardware" and "need the GPU" in str(info.value)
    del d["engine"]["workers"]["aggregated"]["timing"], d["engine"]["workers"]["aggregated"]["kv_cache"]
    with pytest.raises(InputError, match="engine.hardware: Field required: timing type default and kv_cache.capacity"):
        plan_from_config(validate_config(d))


def test_cross_field_rules():
    d = base()
    d["engine"]["workers"]["aggregated"]["timing"] = {"type": "polynomial", "prefill_ms": 5}
    assert "only allowed with type fixed" in str(err(d))
    d = base()
    d["evaluation"] = {"sla": {"e2e_ms": 100, "ttft_ms": 5}}
    assert "mutually exclusive" in str(err(d))


@pytest.mark.parametrize(
    "path,value,key",
    [
        (("engine", "mode"), "afd", "engine.mode"),
        (("router", "active_prefill_tokens_threshold"), 4096, "router.active_prefill_tokens_threshold"),
        (("router", "prefill_load_model"), {"type": "aic"}, "router.prefill_load_model.type"),
        (("engine", "workers", "aggregated", "timing"), {"type": "default", "forward_model": "fpm"},
         "engine.workers.aggregated.timing.forward_model"),
        (("engine", "tokenization"), {"workers": 2}, "engine.tokenization"),
    ],
)
def test_valid_reference_features_not_modelled_yet_say_not_supported(path, value, key):
    d = base()
    node = d
    for p in path[:-1]:
        node = node.setdefault(p, {})
    if path[-1] == "prefill_load_model":
        d["router"]["policy"] = "kv_router"
    node[path[-1]] = value
    with pytest.raises(NotSupportedError) as info:
        plan_from_config(validate_config(d))
    assert info.value.where == key and "not supported" in str(info.value) and "\n" not in str(info.value)


def test_the_kv_router_over_sglang_needs_pages_of_16_tokens():
    d = base()
    d["engine"]["backend"] = "sglang"
    d["router"] = {"policy": "kv_router"}
    e = err(d)  # (pages of one token: an event per token)
    assert e.where == "engine.workers.aggregated.kv_cache.block_size" and "block_size >= 16" in e.message
    d["engine"]["workers"]["aggregated"]["kv_cache"]["block_size"] = 16
    plan_from_config(validate_config(d))


@pytest.mark.parametrize(("backend", "key", "fix"), [
    ("vllm", "sglang", "set engine.backend: sglang"), ("sglang", "trtllm", "set engine.backend: trtllm")])
def test_a_backends_own_knobs_with_another_backend_name_the_key(backend, key, fix):
    d = base()
    d["engine"]["backend"] = backend
    d["engine"]["workers"]["aggregated"]["scheduler"] = {key: {}}
    e = err(d)
    assert e.where == f"engine.workers.aggregated.scheduler.{key}" and fix in e.message


def test_sglang_needs_a_page_size_that_divides_its_chunk():
    d = base()
    d["engine"]["backend"] = "sglang"
    d["engine"]["workers"]["aggregated"]["kv_cache"]["block_size"] = 3
    e = err(d)
    assert e.where == "engine.workers.aggregated.kv_cache.block_size" and "divisible" in e.message


def test_set_values_are_yaml_and_may_replace_whole_mappings():
    d = apply_overrides(base(), ["planner={policy: disabled}", "router.policy=round_robin",
                                 "engine.workers.aggregated.parallelism.replicas=3", "traffic.source.paths=[a.jsonl, b.jsonl]"])
    assert d["planner"] == {"policy": "disabled"}
    assert d["engine"]["workers"]["aggregated"]["parallelism"]["replicas"] == 3
    assert d["traffic"]["source"]["paths"] == ["a.jsonl", "b.jsonl"]


@pytest.mark.parametrize("bad", ["novalue", "a..b=1", "traffic.source.paths.0=x", "a=[unclosed"])
def test_bad_set_is_one_line(bad):
    with pytest.raises(InputError) as info:
        apply_overrides(base(), [bad])
    assert "\n" not in str(info.value) and str(info.value).startswith("--set")


def test_set_through_a_scalar_is_rejected():
    with pytest.raises(InputError, match="engine.model is a str"):
        apply_overrides(base(), ["engine.model.x=1"])


def test_parse_override_empty_value_is_null():
    assert parse_override("planner.retune=") == (["planner", "retune"], None)


def test_config_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine: [unclosed\n")
    with pytest.raises(InputError, match="invalid YAML"):
        load_config(bad)
    with pytest.raises(InputError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n")
    with pytest.raises(InputError, match="mapping"):
        load_config(lst)


def test_validated_config_is_frozen():
    cfg = validate_config(base())
    with pytest.raises(Exception):
        cfg.engine.model = "other"
