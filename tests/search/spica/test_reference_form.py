"""The reference's recommend form (a predict config with search domains, plus optimization and
optimizer): each domain form, each rule with its one-line error, and the same search written in
both forms giving the same validated config and the identical ledger."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from aisim.cli import main
from aisim.search.spica.config import SearchConfig
from aisim.search.spica.domains import Range
from aisim.search.spica.loop import run_search
from aisim.search.spica.reference_form import is_reference_form, lower
from aisim.simulator.errors import InputError

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TRAFFIC = {"source": {"type": "synthetic", "input_tokens": 512, "output_tokens": 32},
           "load": {"type": "poisson", "requests_per_second": 20, "seed": 7}, "stop": {"requests": 120}}

# one search written twice: 4 shapes (2 GPUs) x 2 routers x 2 max_sequences = 16 points
REFERENCE = {
    "engine": {"mode": "aggregated", "model": MODEL, "hardware": "h200_sxm", "backend": "vllm",
               "workers": {"aggregated": {"scheduler": {"max_batched_tokens": 8192,
                                                        "max_sequences": {"choices": [64, 256]}},
                                          "timing": {"type": "polynomial"}}}},
    "router": {"policy": {"choices": ["round_robin", "kv_router"]}, "overlap_score_credit": 1.0,
               "prefill_load_scale": 1.0, "temperature": 0.0},
    "traffic": TRAFFIC,
    "evaluation": {"sla": {"ttft_ms": 500, "itl_ms": 50}},
    "optimization": {"target": "goodput_per_gpu", "constraints": {"max_candidate_gpus": 2}},
    "optimizer": {"algorithm": "random", "max_trials": 16, "seed": 3},
    "study": {"name": "t"},
}
SEED = {
    "engine": {"model": MODEL, "hardware": "h200_sxm", "timing": {"type": "polynomial"}},
    "traffic": TRAFFIC,
    "evaluation": {"sla": {"ttft_ms": 500, "itl_ms": 50}},
    "search_space": {"deployment_mode": ["agg"], "backend": ["vllm"], "gpu_budget": 2,
                     "agg_max_num_batched_tokens": [8192], "agg_max_num_seqs": [64, 256],
                     "router_mode": ["round_robin", "kv_router"], "overlap_score_credit": [1.0],
                     "prefill_load_scale": [1.0], "router_temperature": [0.0], "planner_scaling_policy": ["disabled"]},
    "optimization": {"target": "goodput_per_gpu", "constraints": {"max_candidate_gpus": 2}},
    "optimizer": {"algorithm": "random", "max_trials": 16, "seed": 3},
    "study": {"name": "t"},
}


def ref(**changes) -> dict:
    """REFERENCE with ``a__b__c=value`` changes (None deletes the key)."""
    data = copy.deepcopy(REFERENCE)
    for path, value in changes.items():
        node = data
        *head, last = path.split("__")
        for k in head:
            node = node.setdefault(k, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return data


def space(**changes) -> dict:
    return lower(ref(**changes))["search_space"]


def rejected(data: dict, where: str, needle: str) -> None:
    with pytest.raises(InputError) as err:
        SearchConfig.from_dict(data)
    assert err.value.where == where, str(err.value)
    assert needle in err.value.message, err.value.message
    assert "\n" not in str(err.value)


def test_the_forms_are_told_apart_by_shape():
    assert is_reference_form(REFERENCE) and not is_reference_form(SEED)
    assert not is_reference_form({"engine": {}, "traffic": {}})  # a predict config


def test_both_forms_validate_to_the_same_search():
    a, b = SearchConfig.from_dict(REFERENCE), SearchConfig.from_dict(SEED)
    assert a.dump() == b.dump() and a.fingerprint() == b.fingerprint()


def test_the_same_search_written_both_ways_gives_identical_ledgers(tmp_path):
    runs = [run_search(SearchConfig.from_dict(d), tmp_path / name, parallelism=1)
            for name, d in (("reference", REFERENCE), ("seed", SEED))]
    docs = []
    for r in runs:
        doc = json.loads(json.dumps(r.recommendation))
        for key in ("run_id", "created_at"):
            doc["provenance"].pop(key)
        docs.append(doc)
    assert runs[0].counts["evaluated"] == 16 and runs[0].counts["cache_hits"] == 0
    assert docs[0] == docs[1]
    assert (tmp_path / "reference" / "recommendation.csv").read_text() == \
        (tmp_path / "seed" / "recommendation.csv").read_text()


# -- domain forms ------------------------------------------------------------------------------
def test_a_value_pins_and_choices_search():
    s = space()
    assert s["agg_max_num_batched_tokens"] == [8192] and s["agg_max_num_seqs"] == [64, 256]
    assert s["router_mode"] == ["round_robin", "kv_router"] and s["overlap_score_credit"] == [1.0]
    assert s["deployment_mode"] == ["agg"] and s["backend"] == ["vllm"]


def test_an_integer_linear_range_with_a_step_is_its_values():
    s = space(engine__workers__aggregated__scheduler__max_sequences={"range": {"min": 32, "max": 128, "step": 32}})
    assert s["agg_max_num_seqs"] == [32, 64, 96, 128]


def test_an_integer_log_range_is_continuous_and_yields_integers():
    data = ref(engine__workers__aggregated__scheduler__max_batched_tokens={"range": {"min": 2048, "max": 16384,
                                                                                     "scale": "log"}})
    cfg = SearchConfig.from_dict(data)
    assert cfg.search_space.agg_max_num_batched_tokens == Range(2048, 16384, log=True, integer=True)
    assert Range(2048, 16384, log=True, integer=True).distribution().log


def test_float_ranges_step_or_continuous():
    s = space(router__temperature={"range": {"min": 0.0, "max": 0.5, "step": 0.25}},
              router__overlap_score_credit={"range": {"min": 0.25, "max": 1.0}})
    assert s["router_temperature"] == [0.0, 0.25, 0.5]
    assert s["overlap_score_credit"] == {"range": {"min": 0.25, "max": 1.0, "scale": "linear"}}
    s = space(router__prefill_load_scale={"range": {"min": 0.5, "max": 8.0, "scale": "log"}})
    assert s["prefill_load_scale"] == {"range": {"min": 0.5, "max": 8.0, "scale": "log"}}


def test_omitted_fields_take_the_reference_default_domains():
    data = ref(engine__mode=None, engine__backend=None, router=None)
    data["engine"].pop("workers")
    s = lower(data)["search_space"]
    assert s["deployment_mode"] == ["agg", "disagg"] and s["backend"] == ["vllm", "sglang"]
    assert s["router_mode"] == ["round_robin", "kv_router"]
    assert "overlap_score_credit" not in s  # the seed's default grid, the reference's default domain
    assert s["planner_scaling_policy"] == ["disabled"]  # no planner section: static pools
    assert "parallel_configs" not in s  # preset default: every valid shape enumerated


def test_mode_and_backend_as_domains():
    s = space(engine__mode={"choices": ["disaggregated", "aggregated"]}, engine__backend={"choices": ["sglang"]},
              engine__workers=None)
    assert s["deployment_mode"] == ["disagg", "agg"] and s["backend"] == ["sglang"]


def test_preset_false_filters_the_enumerated_shapes_and_an_omitted_dim_is_free():
    s = space(engine__workers__aggregated__parallelism={"preset": False, "replicas": {"choices": [1, 2]},
                                                        "tensor": 1})
    shapes = s["parallel_configs"]
    assert {(x["tp"], x["attention_dp"], x["replicas"]) for x in shapes} == {(1, 1, 1), (1, 1, 2), (1, 2, 1)}
    s = space(engine__workers__aggregated__parallelism={"preset": False, "replicas": 1,
                                                        "tensor": {"range": {"min": 1, "max": 2, "step": 1}},
                                                        "attention_data": 1})
    assert [(x["tp"], x["replicas"]) for x in s["parallel_configs"]] == [(1, 1), (2, 1)]


def test_a_preset_list_pins_complete_shapes():
    entry = {"replicas": 2, "tensor": 1, "pipeline": 1, "attention_data": 1, "moe_tensor": 1, "moe_expert": 1}
    s = space(engine__workers__aggregated__parallelism={"preset": [entry]})
    assert s["parallel_configs"] == [{"replicas": 2, "tp": 1, "pp": 1, "attention_dp": 1, "moe_tp": 1, "moe_ep": 1}]


def test_role_fields_lower_to_the_role_knobs():
    s = space(engine__workers__aggregated__kv_cache={"block_size": 32, "prefix_caching": False,
                                                     "capacity": {"memory_fraction": 0.8}},
              engine__workers__aggregated__startup_seconds=30, engine__context_length=4096)
    assert (s["agg_block_size"], s["agg_enable_prefix_caching"], s["agg_gpu_memory_utilization"]) == (32, False, 0.8)
    assert s["startup_time"] == 30 and s["context_length"] == 4096


def test_the_planner_section_lowers_to_the_composites():
    from aisim.search.spica.presets import DEFAULTS

    assert space(planner={"policy": "disabled"})["planner_scaling_policy"] == ["disabled"]
    s = space(planner={})  # policy both, every preset default
    assert s["planner_scaling_policy"] == list(DEFAULTS["planner_scaling_policy"])
    s = space(planner={"policy": "enabled"})  # scaling presets only
    assert s["planner_scaling_policy"] == [e for e in DEFAULTS["planner_scaling_policy"] if e != "disabled"]
    load = {"enable_throughput_scaling": False, "enable_load_scaling": True,
            "throughput_adjustment_interval_seconds": None, "load_adjustment_interval_seconds": 10}
    s = space(planner={"scaling_policy": {"preset": ["load_180_5", load]},
                       "fpm_sampling": {"preset": ["small"]}, "load_sensitivity": {"preset": ["aggressive"]},
                       "load_predictor": {"preset": ["constant_last"]}})
    assert s["planner_scaling_policy"] == ["disabled", "load_180_5", load]  # the policy lists disabled too
    assert (s["planner_fpm_sampling"], s["planner_load_sensitivity"], s["load_predictor_candidates"]) == \
        (["small"], ["aggressive"], ["constant_last"])
    cfg = SearchConfig.from_dict(ref(planner={"scaling_policy": {"preset": ["load_180_5"]}}))
    assert cfg.search_space.planner_scaling_policy == ("disabled", "load_180_5")


def test_hardware_auto_takes_the_gpu_of_optimization():
    out = lower(ref(engine__hardware="auto", optimization__hardware="h100_sxm"))
    assert out["engine"]["hardware"] == "h100_sxm" and "hardware" not in out["optimization"]


# -- rules -------------------------------------------------------------------------------------
@pytest.mark.parametrize("changes, where, needle", [
    ({"engine__workers__aggregated__scheduler__max_sequences": {"choices": []}},
     "engine.workers.aggregated.scheduler.max_sequences.choices", "non-empty list"),
    ({"engine__workers__aggregated__scheduler__max_sequences": {"choices": [64, 64]}},
     "engine.workers.aggregated.scheduler.max_sequences.choices", "lists 64 twice"),
    ({"engine__workers__aggregated__scheduler__max_sequences": [64, 128]},
     "engine.workers.aggregated.scheduler.max_sequences", "a bare list is not a domain"),
    ({"engine__workers__aggregated__scheduler__max_sequences": {"range": {"min": 8, "max": 64}}},
     "engine.workers.aggregated.scheduler.max_sequences.range.step", "an integer linear range needs a step"),
    ({"engine__workers__aggregated__scheduler__max_sequences": {"range": {"min": 0, "max": 64, "scale": "log"}}},
     "engine.workers.aggregated.scheduler.max_sequences.range.min", "a log range needs min > 0"),
    ({"engine__workers__aggregated__scheduler__max_sequences": {"range": {"min": 8, "max": 64, "step": 8,
                                                                          "scale": "log"}}},
     "engine.workers.aggregated.scheduler.max_sequences.range.step", "a log range takes no step"),
    ({"router__temperature": {"range": {"min": 1.0, "max": 0.5}}}, "router.temperature.range", "needs min <= max"),
    ({"router__temperature": {"between": [0, 1]}}, "router.temperature", "a domain is {choices: [...]}"),
    ({"engine__mode": {"range": {"min": 1, "max": 2}}}, "engine.mode.range", "not a range"),
    ({"engine__mode": "afd"}, "engine.mode", "'afd' is not one of aggregated, disaggregated"),
    ({"traffic__load__requests_per_second": {"choices": [10, 20]}}, "traffic.load.requests_per_second",
     "holds a search domain"),
    ({"engine__workers__aggregated__kv_cache": {"block_size": {"choices": [16, 64]}}},
     "engine.workers.aggregated.kv_cache.block_size", "aisim's search pins the KV block size"),
    ({"engine__workers__aggregated__parallelism": {"tensor": 1}}, "engine.workers.aggregated.parallelism.tensor",
     "cannot be combined with preset default"),
    ({"engine__mode": {"choices": ["aggregated", "disaggregated"]},
      "engine__workers__aggregated__parallelism": {"preset": False, "replicas": 1}},
     "engine.workers.aggregated.parallelism", "set engine.mode to one mode"),
    ({"engine__workers__prefill": {}}, "engine.workers.prefill", "is a role of another mode"),
    ({"router__policy": "round_robin"}, "router.overlap_score_credit", "round_robin only"),
    ({"router__prefill_load_model": {"type": {"choices": ["none", "aic"]}}}, "router.prefill_load_model.type",
     "aisim models only none"),
    ({"planner": {"enable_load_scaling": True}}, "planner.enable_load_scaling", "is not read in the recommend form"),
    ({"planner": {"scaling_policy": {"preset": False}}}, "planner.scaling_policy.preset", "non-empty list"),
    ({"planner": {"policy": "enabled", "scaling_policy": {"preset": ["disabled"]}}}, "planner.scaling_policy.preset",
     "no preset turns scaling on"),
    ({"planner": {"scaling_policy": {"preset": ["load_999"]}}}, "planner.scaling_policy.preset.0",
     "unknown planner_scaling_policy preset 'load_999'"),
    ({"engine__hardware": "auto", "optimization__hardware": ["h100_sxm", "h200_sxm"]}, "optimization.hardware",
     "runs one GPU type"),
    ({"engine__speculation": {"kind": "ngram"}}, "engine.speculation", "not searched"),
    ({"engine__workers__aggregated__scheduler__prefill_schedule_interval": 2},
     "engine.workers.aggregated.scheduler.prefill_schedule_interval", "is not searched"),
    ({"workload": {"isl": 1}}, "workload", "unknown section"),
])
def test_each_rule_is_one_line_naming_the_key(changes, where, needle):
    rejected(ref(**changes), where, needle)


def test_a_bad_value_inside_a_lowered_domain_keeps_the_search_spaces_error():
    rejected(ref(router__overlap_score_credit={"choices": [0.5, 1.5]}), "search_space.overlap_score_credit",
             "1.5 is outside [0.0, 1.0]")


# -- the command line --------------------------------------------------------------------------
def test_print_search_space_shows_the_lowered_search_and_it_runs_as_is(tmp_path, capsys):
    path = tmp_path / "rec.yaml"
    path.write_text(yaml.safe_dump(REFERENCE))
    assert main(["recommend", "-c", str(path), "--print-search-space"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed == lower(REFERENCE) and "search_space" in printed
    assert SearchConfig.from_dict(printed).fingerprint() == SearchConfig.from_dict(REFERENCE).fingerprint()


def test_predict_refuses_a_config_with_optimization(tmp_path, capsys):
    path = tmp_path / "rec.yaml"
    path.write_text(yaml.safe_dump(REFERENCE))
    assert main(["predict", "-c", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("aisim predict: error: optimization: is a recommend section") and "\n" not in err


def test_validate_reads_the_reference_form(tmp_path, capsys):
    path = tmp_path / "rec.yaml"
    path.write_text(yaml.safe_dump(REFERENCE))
    assert main(["validate", "-c", str(path)]) == 0
    out = capsys.readouterr().out
    assert "valid recommend config" in out and "grid 16 points" in out and "reference's recommend form" in out


def test_a_search_over_continuous_ranges_draws_within_them_and_repeats_with_its_seed(tmp_path, ray_session):
    data = ref(engine__workers__aggregated__scheduler__max_batched_tokens={"range": {"min": 2048, "max": 16384,
                                                                                     "scale": "log"}},
               router__policy="kv_router", router__temperature={"range": {"min": 0.0, "max": 1.0}},
               traffic__stop__requests=20, optimizer__max_trials=4)
    runs = [run_search(SearchConfig.from_dict(data), tmp_path / "local", parallelism=1),
            run_search(SearchConfig.from_dict(data), tmp_path / "ray", backend="ray", parallelism=2)]
    configs = [[(c["config"], c["score"]) for c in r.recommendation["candidates"]] for r in runs]
    assert configs[0] == configs[1] and len(configs[0]) == 4  # the same on Ray
    configs = [[c for c, _ in configs[0]]]
    for c in configs[0]:
        assert isinstance(c["agg_max_num_batched_tokens"], int) and 2048 <= c["agg_max_num_batched_tokens"] <= 16384
        assert isinstance(c["router_temperature"], float) and 0.0 <= c["router_temperature"] <= 1.0
    assert len({c["router_temperature"] for c in configs[0]}) == 4  # continuous: no two draws alike


def test_the_bundled_reference_form_config_is_the_readme_search_space_form():
    from tests.conftest import ROOT

    bundled = yaml.safe_load((ROOT / "configs" / "recommend-reference-form.yaml").read_text())
    seed = {k: bundled[k] for k in ("traffic", "evaluation", "optimization", "optimizer")}
    seed["engine"] = {"model": "nvidia/Llama-3.1-8B-Instruct-FP8", "hardware": "h200_sxm"}
    seed["search_space"] = {  # as README.md "Two ways to write a search" shows it
        "deployment_mode": ["agg"], "backend": ["vllm"],
        "parallel_configs": [{"tp": 1, "replicas": r} for r in (1, 2, 3, 4)],
        "agg_max_num_batched_tokens": [8192], "agg_max_num_seqs": [128, 256],
        "router_mode": ["round_robin", "kv_router"], "overlap_score_credit": [1.0], "prefill_load_scale": [1.0],
        "router_temperature": [0.0], "planner_scaling_policy": ["disabled"]}
    assert SearchConfig.from_dict(bundled).fingerprint() == SearchConfig.from_dict(seed).fingerprint()


def test_a_search_started_in_one_form_resumes_in_the_other(tmp_path):
    whole = run_search(SearchConfig.from_dict(REFERENCE), tmp_path / "whole", parallelism=1)
    half = copy.deepcopy(REFERENCE)
    half["optimizer"]["max_trials"] = 8
    run_search(SearchConfig.from_dict(half), tmp_path / "split", parallelism=1)
    resumed = run_search(SearchConfig.from_dict(SEED), tmp_path / "split", parallelism=1, resume=True)
    assert resumed.resumed and resumed.counts["evaluated"] == 16
    key = [(c["candidate_id"], c["config"], c["score"]) for c in whole.recommendation["candidates"]]
    assert [(c["candidate_id"], c["config"], c["score"]) for c in resumed.recommendation["candidates"]] == key
