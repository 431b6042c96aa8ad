"""SearchConfig / load_search_config: the example config, defaults, derived values, the fingerprint
and every rule (one-line InputError naming the dotted key)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from aisim.search.spica import SearchSpace
from aisim.search.spica.config import PLANNER_TARGET, TARGETS, SearchConfig, load_search_config
from aisim.simulator.errors import InputError

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "configs" / "spica-agg-vs-disagg.yaml"

BASE = {
    "engine": {"model": "meta-llama/Llama-3.1-8B-Instruct", "hardware": "h200_sxm", "timing": {"type": "polynomial"}},
    "workload": {"isl": 1024, "osl": 128, "concurrency": 8, "request_count": 100},
    "evaluation": {"sla": {"ttft_ms": 2000, "itl_ms": 50}},
    "search_space": {"deployment_mode": ["agg"], "gpu_budget": 4, "planner_scaling_policy": ["disabled"]},
    "optimization": {"target": "goodput_per_gpu"},
}


def _cfg(**changes) -> dict:
    """BASE with dotted keys set (value ``...`` deletes the key)."""
    data = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        if value is ...:
            node.pop(last, None)
        else:
            node[last] = value
    return data


def _reject(data: dict, where: str, needle: str, category: str = "invalid_config") -> InputError:
    with pytest.raises(InputError) as info:
        SearchConfig.from_dict(data)
    err = info.value
    assert err.where == where, err
    assert needle in err.message, err
    assert err.category == category
    assert err.exit_code == 2
    assert "\n" not in str(err)
    return err


# -- the example config ------------------------------------------------------------------------
def test_the_example_config_loads():
    cfg, config_dir = load_search_config(EXAMPLE)
    assert config_dir == EXAMPLE.resolve().parent
    assert cfg.model_name == "meta-llama/Llama-3.1-8B-Instruct" and cfg.hardware_sku == "h200_sxm"
    assert cfg.search_space.model_name == cfg.model_name  # unroll_sample reads it there
    assert cfg.branches == ("agg", "disagg")
    assert cfg.planner_target == "sla"
    assert cfg.engine.timing.type == "polynomial"
    w = cfg.workload
    assert (w.isl, w.osl, w.request_rate, w.request_count, w.concurrency, w.kv_load_ratio) == (2048, 256, 30.0, 1500,
                                                                                                None, None)
    assert cfg.traffic is None
    assert cfg.search_space.router_mode == ("round_robin", "kv_router")
    assert cfg.search_space.planner_scaling_policy == ("disabled",)
    assert cfg.search_space.gpu_budget == 8
    assert (cfg.optimization.target, cfg.optimizer.algorithm, cfg.optimizer.max_trials, cfg.optimizer.seed) == (
        "goodput_per_gpu", "random", 32, 42)
    assert cfg.kv_load_ratio_range is None


def test_overrides_apply_before_validation():
    cfg, _ = load_search_config(EXAMPLE, ["optimizer.seed=7", "search_space.gpu_budget=16",
                                          "workload.request_rate=null", "workload.kv_load_ratio=[0.25, 1.0]"])
    assert cfg.optimizer.seed == 7 and cfg.search_space.gpu_budget == 16
    assert cfg.kv_load_ratio_range == (0.25, 1.0)
    with pytest.raises(InputError) as info:
        load_search_config(EXAMPLE, ["workload.concurrency=4"])
    assert info.value.where == "workload.request_rate" and "conflicts with workload.concurrency" in info.value.message


def test_load_errors_are_one_line():
    with pytest.raises(InputError) as info:
        load_search_config(ROOT / "configs" / "no-such-search.yaml")
    assert "not found" in info.value.message
    with pytest.raises(InputError) as info:
        load_search_config(EXAMPLE, ["optimizer.seed"])
    assert info.value.where == "--set optimizer.seed"


def test_defaults():
    cfg = SearchConfig.from_dict(BASE)
    o = cfg.optimizer
    assert (o.algorithm, o.max_trials, o.parallelism, o.candidate_timeout_seconds, o.seed) == ("tpe", 320, None,
                                                                                               600.0, 42)
    assert (cfg.study.storage, cfg.study.name) == (None, "spica")
    c = cfg.optimization.constraints
    assert (c.min_candidate_gpus, c.max_candidate_gpus, c.min_goodput_rps) == (None, None, None)
    assert cfg.optimization.strict_sla is False
    assert cfg.dgd is None
    assert cfg.workload.arrival_seed == 42
    assert cfg.engine.enable_chunked_prefill is True and cfg.engine.kv_transfer is None
    assert SearchConfig.from_dict(_cfg(engine__timing=...)).engine.timing.type == "default"


@pytest.mark.parametrize("target", TARGETS)
def test_planner_target_follows_the_search_target(target):
    data = _cfg(optimization={"target": target})
    if target == "min_gpus":
        data["optimization"]["constraints"] = {"min_goodput_rps": 1.0}
    cfg = SearchConfig.from_dict(data)
    expected = {"throughput": "throughput", "throughput_per_gpu": "throughput", "throughput_per_user": "throughput",
                "pareto": "throughput", "ttft": "latency", "e2e_latency": "latency", "goodput": "sla",
                "goodput_per_gpu": "sla", "min_gpus": "sla"}[target]
    assert cfg.planner_target == expected == PLANNER_TARGET[target]


def test_branches_are_the_space_modes():
    assert SearchConfig.from_dict(_cfg(search_space__deployment_mode=["disagg", "agg"])).branches == ("disagg", "agg")
    assert SearchConfig.from_dict(_cfg(search_space__deployment_mode=...)).branches == ("disagg", "agg")  # default


def test_model_and_gpu_may_be_pinned_in_the_space():
    data = _cfg(engine__model=..., engine__hardware=..., search_space__model_name="meta-llama/Llama-3.1-8B-Instruct",
                search_space__hardware_sku="h200_sxm")
    cfg = SearchConfig.from_dict(data)
    assert cfg.model_name == "meta-llama/Llama-3.1-8B-Instruct" and cfg.hardware_sku == "h200_sxm"
    assert cfg == SearchConfig.from_dict(BASE)
    assert cfg.fingerprint() == SearchConfig.from_dict(BASE).fingerprint()


def test_a_search_space_instance_is_accepted():
    space = SearchSpace.from_dict(BASE["search_space"])
    assert SearchConfig.from_dict(_cfg(search_space=space)) == SearchConfig.from_dict(BASE)


def test_bayesian_is_the_reference_name_for_tpe():
    cfg = SearchConfig.from_dict(_cfg(optimizer={"algorithm": "bayesian"}))
    assert cfg.optimizer.algorithm == "tpe"
    assert cfg.fingerprint() == SearchConfig.from_dict(_cfg(optimizer={"algorithm": "tpe"})).fingerprint()


def test_kv_load_ratio_scalar_or_range():
    pinned = SearchConfig.from_dict(_cfg(workload__concurrency=..., workload__kv_load_ratio=1))
    assert pinned.workload.kv_load_ratio == 1.0 and pinned.kv_load_ratio_range is None
    searched = SearchConfig.from_dict(_cfg(workload__concurrency=..., workload__kv_load_ratio=[0.5, 2]))
    assert searched.kv_load_ratio_range == (0.5, 2.0)


def test_a_predict_traffic_section_instead_of_a_workload():
    traffic = {"source": {"type": "synthetic", "input_tokens": 512, "output_tokens": 64},
               "load": {"type": "kv_capacity_fraction", "fraction": 0.5}, "stop": {"requests_per_load_unit": 4}}
    cfg = SearchConfig.from_dict(_cfg(workload=..., traffic=traffic))
    assert cfg.workload is None and cfg.traffic.load.fraction == 0.5


def test_dgd_section_is_validated():
    dgd = {"name": "llama-spica", "namespace": "inference", "output_file": "dgd.yaml", "renderer": "direct",
           "runtime_image": "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.6.0", "num_gpus_per_node": 8}
    cfg = SearchConfig.from_dict(_cfg(dgd=dgd))
    assert cfg.dgd.renderer == "direct" and cfg.dgd.num_gpus_per_node == 8
    pareto = SearchConfig.from_dict(_cfg(optimization={"target": "pareto"},
                                         dgd={"name": "spica-{index}", "output_dir": "out/dgd"}))
    assert pareto.dgd.output_dir == "out/dgd"


# -- the fingerprint ---------------------------------------------------------------------------
def test_fingerprint_is_stable_and_sensitive():
    a, _ = load_search_config(EXAMPLE)
    b, _ = load_search_config(EXAMPLE)
    fp = a.fingerprint()
    assert len(fp) == 64 and int(fp, 16) >= 0
    assert fp == b.fingerprint()
    assert load_search_config(EXAMPLE, ["optimizer.seed=43"])[0].fingerprint() != fp
    assert load_search_config(EXAMPLE, ["search_space.gpu_budget=16"])[0].fingerprint() != fp
    # defaults written out are the same search
    assert load_search_config(EXAMPLE, ["optimizer.candidate_timeout_seconds=600"])[0].fingerprint() == fp


def test_the_validated_config_round_trips():
    cfg, _ = load_search_config(EXAMPLE)
    again = SearchConfig.from_dict(cfg.model_dump(mode="json"))
    assert again == cfg and again.fingerprint() == cfg.fingerprint()


# -- rejections --------------------------------------------------------------------------------
TRACE = {"source": {"type": "trace", "paths": ["trace.jsonl"]}, "load": {"type": "trace_timestamps"}}
REJECTIONS = [
    # traffic: exactly one description
    (dict(workload=...), "workload", "is missing: describe the traffic"),
    (dict(traffic=TRACE), "traffic", "both describe the traffic"),
    (dict(workload=..., traffic={**TRACE, "load": {"type": "kv_capacity_fraction", "fraction": 1.0}}),
     "traffic.source.type", "needs a synthetic source"),
    # the workload
    (dict(workload__concurrency=..., ), "workload.concurrency", "set exactly one of concurrency, request_rate, "
                                                                 "kv_load_ratio"),
    (dict(workload__request_rate=2.0), "workload.request_rate", "conflicts with workload.concurrency"),
    (dict(workload__kv_load_ratio=1.0), "workload.kv_load_ratio", "conflicts with workload.concurrency"),
    (dict(workload__request_count=...), "workload.request_count", "request_count, num_request_ratio"),
    (dict(workload__num_request_ratio=4), "workload.num_request_ratio", "conflicts with workload.request_count"),
    (dict(workload__concurrency=[4, 16]), "workload.concurrency", "only kv_load_ratio takes a [min, max] range"),
    (dict(workload__concurrency=..., workload__request_rate=[1, 2]), "workload.request_rate", "one number"),
    (dict(workload__concurrency=..., workload__kv_load_ratio=[2, 1]), "workload.kv_load_ratio", "min < max"),
    (dict(workload__concurrency=..., workload__kv_load_ratio=[1]), "workload.kv_load_ratio", "two numbers"),
    (dict(workload__concurrency=..., workload__kv_load_ratio=[0, 1]), "workload.kv_load_ratio", "number > 0"),
    (dict(workload__concurrency=..., workload__kv_load_ratio="high"), "workload.kv_load_ratio", "[min, max]"),
    (dict(workload__concurrency=0), "workload.concurrency", "greater than 0"),
    (dict(workload__isl=...), "workload.isl", "Field required"),
    (dict(workload__prompt_tokens=10), "workload.prompt_tokens", "Extra inputs are not permitted"),
    # model and GPU: one source each
    (dict(search_space__model_name="Qwen/Qwen3-32B"), "search_space.model_name", "repeats engine.model"),
    (dict(engine__model=...), "engine.model", "is missing"),
    (dict(engine__hardware=..., search_space__hardware_sku="h200_sxm", engine__model=...,
          search_space__model_name=None), "engine.model", "is missing"),
    (dict(engine__hardware="h300"), "engine.hardware", "unknown hardware 'h300'"),
    (dict(engine__hardware=..., search_space__hardware_sku="tpu"), "search_space.hardware_sku", "unknown hardware"),
    (dict(engine__model=7), "engine.model", "must be a model name"),
    # engine keys a search does not fix
    (dict(engine__mode="aggregated"), "engine.mode", "search_space.deployment_mode"),
    (dict(engine__backend="vllm"), "engine.backend", "search_space.backend"),
    (dict(engine__context_length=4096), "engine.context_length", "search_space.context_length"),
    (dict(engine__workers={"aggregated": {}}), "engine.workers", "engine.timing"),
    (dict(engine__kv_transfer={"bandwidth_gb_per_second": 50}), "engine.kv_transfer", "only disaggregated"),
    (dict(engine__timing={"type": "fixed"}), "engine.timing", "needs both prefill_ms and decode_ms"),
    # the search space keeps its own locations
    (dict(search_space__agg_max_num_seqs=256), "search_space.agg_max_num_seqs", "is searched: give a list"),
    (dict(search_space__agg_max_seqs=[256]), "search_space.agg_max_seqs", "did you mean agg_max_num_seqs"),
    (dict(search_space__router_mode=["kv_router"], search_space__no_admission_control=True),
     "search_space.no_admission_control", "cannot model router admission control"),
    # goodput targets need ttft and itl
    (dict(evaluation__sla={"itl_ms": 50}), "evaluation.sla.ttft_ms", "target goodput_per_gpu scores goodput"),
    (dict(evaluation__sla={"ttft_ms": 500}, optimization={"target": "goodput"}), "evaluation.sla.itl_ms",
     "target goodput scores goodput"),
    (dict(evaluation__sla={"e2e_ms": 5000}), "evaluation.sla.ttft_ms", "needs evaluation.sla.ttft_ms and itl_ms"),
    (dict(evaluation=..., optimization={"target": "throughput", "strict_sla": True}), "optimization.strict_sla",
     "needs an SLA"),
    # optimizer
    (dict(optimizer={"algorithm": "nsga2"}), "optimizer.algorithm", "for target pareto"),
    (dict(optimizer={"algorithm": "grid"}), "optimizer.algorithm", "Input should be"),
    (dict(optimizer={"max_trials": 0}), "optimizer.max_trials", "greater than 0"),
    (dict(optimizer={"parallelism": 2.5}), "optimizer.parallelism", "whole number"),
    (dict(optimizer={"candidate_timeout_seconds": -1}), "optimizer.candidate_timeout_seconds", "greater than 0"),
    # optimization
    (dict(optimization=...), "optimization", "Field required"),
    (dict(optimization={}), "optimization.target", "Field required"),
    (dict(optimization={"target": "latency"}), "optimization.target", "Input should be"),
    (dict(optimization={"target": "goodput", "hardware": "h200_sxm"}), "optimization.hardware",
     "Extra inputs are not permitted"),
    (dict(optimization={"target": "goodput", "constraints": {"min_goodput_rps": 1}}),
     "optimization.constraints.min_goodput_rps", "only applies to target min_gpus"),
    (dict(optimization={"target": "min_gpus"}), "optimization.constraints.min_goodput_rps", "is missing"),
    (dict(optimization={"target": "min_gpus", "constraints": {"min_goodput_rps": 1}}, workload__concurrency=...,
          workload__kv_load_ratio=0.5), "workload.kv_load_ratio", "needs a fixed load"),
    (dict(optimization={"target": "min_gpus", "constraints": {"min_goodput_rps": 8}}, workload__concurrency=...,
          workload__request_rate=4), "optimization.constraints.min_goodput_rps", "above the offered 4.0"),
    (dict(optimization={"target": "min_gpus", "constraints": {"min_goodput_rps": 1}},
          search_space__planner_scaling_policy=["disabled", "load_180_5"]), "search_space.planner_scaling_policy.1",
     "static pools"),
    (dict(optimization={"target": "min_gpus", "constraints": {"min_goodput_rps": 1}}, workload=..., traffic=TRACE),
     "traffic.source.type", "fixed synthetic load"),
    (dict(optimization={"target": "throughput"}, search_space__planner_scaling_policy=["throughput_180_5"]),
     "search_space.planner_scaling_policy", "drops them"),
    (dict(optimization={"target": "goodput", "constraints": {"min_candidate_gpus": 4, "max_candidate_gpus": 2}}),
     "optimization.constraints.min_candidate_gpus", "above max_candidate_gpus 2"),
    (dict(optimization={"target": "goodput", "constraints": {"min_candidate_gpus": 8}}),
     "optimization.constraints.min_candidate_gpus", "above search_space.gpu_budget 4"),
    # study, dgd
    (dict(study={"name": ""}), "study.name", "at least 1 character"),
    (dict(study={"storage": 5}), "study.storage", "valid string"),
    (dict(dgd={"name": "spica-{index}"}), "dgd.name", "remove {index}"),
    (dict(dgd={"name": "spica"}, optimization={"target": "pareto"}), "dgd.name", "put {index} in the name"),
    (dict(dgd={"name": "Spica_1"}), "dgd.name", "not a Kubernetes name"),
    (dict(dgd={"name": "spica", "namespace": "A B"}), "dgd.namespace", "not a Kubernetes namespace"),
    (dict(dgd={"name": "spica", "output_file": "a.yaml", "output_dir": "d"}), "dgd.output_dir", "set one"),
    (dict(dgd={"name": "spica", "renderer": "helm"}), "dgd.renderer", "Input should be"),
    (dict(dgd={"output_dir": "d"}), "dgd.name", "Field required"),
    # unknown keys
    (dict(launch_server=True), "launch_server", "Extra inputs are not permitted"),
    (dict(execution__backend="slurm"), "execution.backend", "Input should be"),
]


@pytest.mark.parametrize(("changes", "where", "needle"), REJECTIONS,
                         ids=[f"{i}-{r[1]}" for i, r in enumerate(REJECTIONS)])
def test_rejections(changes, where, needle):
    _reject(_cfg(**changes), where, needle)


def test_a_non_mapping_config_is_rejected():
    with pytest.raises(InputError) as info:
        SearchConfig.from_dict(["engine"])
    assert info.value.where == "config"
    with pytest.raises(InputError) as info:
        SearchConfig.from_dict({**BASE, "a.b": 1})
    assert "without dots" in info.value.message


def test_pareto_accepts_every_sampler():
    for algorithm in ("nsga2", "tpe", "random", "bayesian"):
        SearchConfig.from_dict(_cfg(optimization={"target": "pareto"}, optimizer={"algorithm": algorithm}))


def test_non_goodput_targets_keep_spaces_with_a_policy_left_to_search():
    cfg = SearchConfig.from_dict(_cfg(optimization={"target": "ttft"},
                                      search_space__planner_scaling_policy=["throughput_180_5", "load_180_5"]))
    assert cfg.planner_target == "latency"


def test_min_gpus_with_a_fixed_load():
    cfg = SearchConfig.from_dict(_cfg(optimization={"target": "min_gpus", "constraints": {"min_goodput_rps": 2}},
                                      workload__concurrency=..., workload__request_rate=4))
    assert cfg.optimization.constraints.min_goodput_rps == 2.0
