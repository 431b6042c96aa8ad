"""Failure categories: every error says what kind of failure it is, so a search can classify a
failed trial without parsing its message. Each category comes out of a real failing config."""

from __future__ import annotations

import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest

from aisim import plan_from_config, run_trace_replay
from aisim.simulator.config.loading import load_config
from aisim.simulator.errors import (
    CATEGORIES,
    AisimError,
    InitTimeoutError,
    InputError,
    NotSupportedError,
    ResourceLimitError,
    RuntimeFailure,
)
from tests.conftest import SLICE

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "configs" / "quickstart.yaml"
PLANNER_AGG = ROOT / "configs" / "planner-aggregated.yaml"


def failure(path: Path, *overrides: str) -> AisimError:
    """The error planning ``path`` with ``overrides`` raises (loading and validating included)."""
    with pytest.raises(AisimError) as info:
        cfg, config_dir = load_config(path, list(overrides))
        plan_from_config(cfg, config_dir)
    assert "\n" not in str(info.value)
    return info.value


# -- the categories themselves ----------------------------------------------------------------
def test_categories_and_class_defaults():
    assert CATEGORIES == ("kv_capacity", "gpu_budget", "context_length", "unsupported", "invalid_config", "timeout",
                          "resource_limit", "runtime")
    defaults = {InputError("f", "m"): "invalid_config", NotSupportedError("f", "m"): "unsupported",
                ResourceLimitError("m"): "resource_limit", InitTimeoutError("m"): "timeout",
                RuntimeFailure("m"): "runtime", AisimError("m"): "runtime"}
    for err, want in defaults.items():
        assert err.category == want


def test_a_category_overrides_the_default_but_never_the_message():
    e = InputError("engine.x", "bad", category="kv_capacity")
    assert e.category == "kv_capacity" and str(e) == "engine.x: bad" and (e.where, e.message) == ("engine.x", "bad")
    assert InputError("f", "m").category == "invalid_config"  # the override is per instance
    assert RuntimeFailure("slow", category="timeout").category == "timeout"
    with pytest.raises(ValueError, match="unknown error category 'oom'"):
        InputError("f", "m", category="oom")


@pytest.mark.parametrize("err", [InputError("a.b", "bad", category="gpu_budget"), NotSupportedError("a", "later"),
                                 RuntimeFailure("slow", category="timeout"), ResourceLimitError("big")])
def test_errors_cross_processes_with_their_category(err):
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and back.category == err.category and str(back) == str(err)
    if isinstance(err, InputError):
        assert (back.where, back.message) == (err.where, err.message)


# -- each category from a real failing config -------------------------------------------------
@pytest.mark.parametrize("overrides,where", [
    # weights fill the GPU: the memory-sized KV cache holds nothing
    (["engine.model=Qwen/Qwen3-32B", "engine.hardware=l40s", "engine.workers.aggregated.kv_cache.capacity={type: default}"],
     "engine.workers.aggregated.kv_cache.capacity"),
    (["engine.workers.aggregated.kv_cache.capacity={type: fixed, bytes: 1000}"],
     "engine.workers.aggregated.kv_cache.capacity.bytes"),
])
def test_kv_capacity(overrides, where):
    e = failure(QUICK, *overrides)
    assert e.category == "kv_capacity" and e.where == where and type(e) is InputError and e.exit_code == 2


def test_minimum_workers_over_the_budget_run_clamped_as_in_the_reference():
    cfg, config_dir = load_config(PLANNER_AGG, ["planner.max_num_gpus=1", "planner.min_workers=3",
                                                "traffic.source.paths=[data/conversation_slice.jsonl]"])
    assert plan_from_config(cfg, config_dir).planner.settings.max_gpu_budget == 1


def test_gpu_budget_from_the_python_api():
    with pytest.raises(InputError) as info:
        run_trace_replay(str(SLICE), planner_config={"mode": "agg", "optimization_target": "throughput",
                                                     "max_gpu_budget": 4, "min_gpu_budget": 6,
                                                     "report_interval_hours": None, "live_dashboard_port": 0},
                         extra_engine_args={"num_gpu_blocks": 3000}, max_sim_time_ms=1000)
    e = info.value
    assert e.category == "gpu_budget" and e.where == "planner_config.min_gpu_budget"
    assert "over max_gpu_budget 4" in e.message


@pytest.mark.parametrize("value", ["0", "-5"])
def test_context_length(value):
    e = failure(QUICK, f"engine.context_length={value}")
    assert e.category == "context_length" and e.where == "engine.context_length"


def test_context_length_from_the_python_api():
    with pytest.raises(InputError) as info:
        run_trace_replay(str(SLICE), extra_engine_args={"num_gpu_blocks": 3000, "max_model_len": 0})
    assert info.value.category == "context_length" and info.value.where == "extra_engine_args.max_model_len"


def test_a_role_may_set_its_own_context_length():
    from aisim import load_config, plan_from_config

    cfg, cdir = load_config(QUICK, ["engine.workers.aggregated.context_length=4096"])
    assert plan_from_config(cfg, cdir).pools[0].scheduler.context_length == 4096
    e = failure(QUICK, "engine.workers.aggregated.context_length=0")
    assert e.category == "context_length" and e.where == "engine.workers.aggregated.context_length"
    e = failure(QUICK, "engine.workers.aggregated.context_len=4096")
    assert e.category == "invalid_config" and "Extra inputs are not permitted" in e.message


@pytest.mark.parametrize("path,overrides", [
    (QUICK, ["engine.mode=afd"]),
    (QUICK, ["engine.tokenization={workers: 2}"]),
])
def test_unsupported(path, overrides):
    e = failure(path, *overrides)
    assert e.category == "unsupported" and isinstance(e, NotSupportedError) and e.exit_code == 2


@pytest.mark.parametrize("overrides,where", [
    (["router.bogus=1"], "router.bogus"),  # an unknown key
    (["engine.workers.aggregated.parallelism.replicas=two"], "engine.workers.aggregated.parallelism.replicas"),
    (["engine.model.x=1"], "--set engine.model.x=1"),  # a --set through a scalar
    (["engine.hardware=tpu9000"], "engine.hardware"),
])
def test_invalid_config(overrides, where):
    e = failure(QUICK, *overrides)
    assert e.category == "invalid_config" and e.where == where and e.exit_code == 2


def test_resource_limit():
    from aisim.simulator.runtime.resources import ResourceGuard

    with pytest.raises(ResourceLimitError) as info:
        ResourceGuard(1).check()  # one byte of memory
    assert info.value.category == "resource_limit" and info.value.exit_code == 3


class _Timeout(Exception):
    pass


class _ActorDied(Exception):
    pass


class _TaskFailed(Exception):
    cause = None


def _ray_runtime(raise_exc):
    """A RayRuntime whose ray.get raises ``raise_exc`` (no Ray started)."""
    from aisim.simulator.runtime.ray_runtime import RayRuntime

    def get(refs, timeout=None):
        raise raise_exc

    rt = RayRuntime.__new__(RayRuntime)
    rt.ray = SimpleNamespace(get=get, exceptions=SimpleNamespace(GetTimeoutError=_Timeout, RayActorError=_ActorDied,
                                                                  RayTaskError=_TaskFailed))
    return rt


@pytest.mark.parametrize("exc,category", [(_Timeout(), "timeout"), (_ActorDied("killed"), "runtime"),
                                          (_TaskFailed("boom"), "runtime")])
def test_ray_call_failures(exc, category):
    with pytest.raises(RuntimeFailure) as info:
        _ray_runtime(exc)._get([], timeout=5, what="a step")
    assert info.value.category == category and info.value.exit_code == 1
