"""search.trial: a plan run once as plain data; failures classified, never raised."""

from __future__ import annotations

import dataclasses
import pickle

import msgpack
import pytest

from aisim.search.trial import TrialResult, plan_with_overrides, run_dumped_trial, run_trial
from aisim.simulator.config.loading import load_config, read_yaml_mapping
from aisim.simulator.errors import InputError
from aisim.simulator.metrics.summary import WALL_TIME_FIELDS
from aisim.simulator.plan import dump_plan, plan_from_config
from aisim.simulator.run import run_plan
from tests.conftest import ROOT

QUICKSTART = ROOT / "configs" / "quickstart.yaml"
STOP = "traffic.stop={max_virtual_time_seconds: 20}"


@pytest.fixture(scope="module")
def plan():
    cfg, cdir = load_config(QUICKSTART, [STOP])
    return plan_from_config(cfg, cdir)


def without_wall(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in WALL_TIME_FIELDS}


def test_an_ok_trial_carries_the_reports_summary_without_wall_fields(plan):
    result = run_trial(plan)
    assert (result.status, result.category, result.message) == ("ok", None, None)
    assert result.ok
    assert result.metrics == without_wall(run_plan(plan).summary)
    assert not set(WALL_TIME_FIELDS) & set(result.metrics)
    assert result.metrics["completed_requests"] == 51  # quickstart's first 20 virtual seconds
    assert result.wall_s >= 0.0


def test_a_trial_is_deterministic_and_equality_ignores_wall_time(plan):
    first, second = run_trial(plan), run_trial(plan)
    assert first == second
    assert TrialResult("ok", metrics={"a": 1}, wall_s=1.0) == TrialResult("ok", metrics={"a": 1}, wall_s=2.0)


def test_metrics_keys_keep_only_those_keys(plan):
    result = run_trial(plan, ("completed_requests", "p90_ttft_ms"))
    full = run_plan(plan).summary
    assert result.metrics == {"completed_requests": full["completed_requests"], "p90_ttft_ms": full["p90_ttft_ms"]}


def test_a_metrics_key_the_summary_lacks_fails_the_trial(plan):
    result = run_trial(plan, ("completed_requests", "no_such_metric"))
    assert (result.status, result.category, result.metrics) == ("failed", "runtime", None)
    assert result.message == "KeyError: \"the report's summary has no 'no_such_metric'\""


def test_a_failing_run_is_a_failed_result_with_its_category_and_one_line(plan):
    # a plan built by hand whose pool asks for measured timing without a model: the run refuses it
    # when it builds the timing model
    pool = plan.pools[0]
    bad = dataclasses.replace(plan, pools=[dataclasses.replace(
        pool, model=None, timing=dataclasses.replace(pool.timing, type="default"))])
    result = run_trial(bad)
    assert result == TrialResult("failed", "invalid_config", "engine.workers.aggregated.timing: timing type default "
                                 "needs the model and hardware (engine.model, engine.hardware)", None)


def test_any_exception_is_a_failed_result_of_category_runtime(plan, monkeypatch):
    import aisim.simulator.run

    def broken(_plan):
        raise ValueError("first line\n  Traceback-looking second line")

    monkeypatch.setattr(aisim.simulator.run, "run_plan", broken)
    result = run_trial(plan)
    assert result == TrialResult("failed", "runtime", "ValueError: first line", None)


def test_results_are_plain_data_for_pickle_and_msgpack(plan):
    for result in (run_trial(plan, ("completed_requests", "mean_ttft_ms")),
                   TrialResult("failed", "kv_capacity", "x: no block", None, 0.5), TrialResult.timed_out(2.0, 2.0)):
        assert pickle.loads(pickle.dumps(result)) == result
        back = TrialResult.from_dict(msgpack.unpackb(msgpack.packb(result.to_dict())))
        assert back == result and back.wall_s == result.wall_s
    assert TrialResult.timed_out(2.0) == TrialResult("timeout", "timeout", "did not finish within the 2 s limit", None)


def test_a_dumped_plan_runs_by_reference_only_where_its_workload_is_registered(plan, monkeypatch):
    from aisim.simulator import plan as plan_module

    data = dump_plan(plan, by_reference=True)
    monkeypatch.setattr(plan_module, "_WORKLOADS", {})  # a process that never registered it
    result = run_dumped_trial(data)
    assert (result.status, result.category) == ("failed", "runtime")
    assert result.message.startswith("LookupError: plan refers to workload ") and "register_workload" in result.message
    plan_module.register_workload(plan.traffic.workload)
    assert run_dumped_trial(data) == run_trial(plan)


# -- plan_with_overrides --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mapping():
    return read_yaml_mapping(QUICKSTART)


def test_overrides_build_the_same_plan_the_yaml_path_builds(mapping):
    before = pickle.dumps(mapping)
    plan = plan_with_overrides(mapping, {"traffic.stop": {"max_virtual_time_seconds": 20}, "router.policy": "kv_router",
                                         "engine.workers.aggregated.parallelism.replicas": 3}, QUICKSTART.parent)
    assert pickle.dumps(mapping) == before  # the mapping is not changed
    assert (plan.router.policy, plan.pools[0].replicas) == ("kv_router", 3)
    cfg, cdir = load_config(QUICKSTART, [STOP, "router.policy=kv_router",
                                         "engine.workers.aggregated.parallelism.replicas=3"])
    assert run_trial(plan) == run_trial(plan_from_config(cfg, cdir))


@pytest.mark.parametrize("overrides, category, message", [
    ({"engine.workers.aggregated.kv_cache.capacity": {"type": "fixed", "bytes": 1000}}, "kv_capacity",
     "engine.workers.aggregated.kv_cache.capacity.bytes: 1000 bytes hold no block of 64 tokens x 131072 B/token"),
    ({"engine.context_length": 0}, "context_length", "engine.context_length: "),
    ({"engine.workers.aggregated.parallelism.decode_context": 2}, "unsupported",
     "engine.workers.aggregated.parallelism.decode_context: decode_context must divide tensor"),
    ({"router.polcy": "kv_router"}, "invalid_config", "router.polcy: Extra inputs are not permitted"),
    ({"router.policy.name": "x"}, "invalid_config", "router.policy.name: router.policy is a str, not a section"),
])
def test_a_candidate_that_cannot_run_raises_input_error_with_its_category(mapping, overrides, category, message):
    with pytest.raises(InputError) as info:
        plan_with_overrides(mapping, {"traffic.stop": {"max_virtual_time_seconds": 20}, **overrides}, QUICKSTART.parent)
    failed = TrialResult.from_exception(info.value)
    assert (failed.status, failed.category, failed.metrics) == ("failed", category, None)
    assert failed.message.startswith(message) and "\n" not in failed.message
