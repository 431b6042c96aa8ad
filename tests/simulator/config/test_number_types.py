"""Every number field of the config models is strict: a boolean is never a number (``replicas:
true`` is not 1), an integer field takes no float or quoted number, a float field takes integers."""

from __future__ import annotations

import types
import typing
from pathlib import Path

import numpy as np
import pytest
from pydantic import BaseModel, Strict

from aisim.simulator.config import engine_args as ea
from aisim.simulator.config import models as m
from aisim.simulator.config import planner_config as pcfg
from aisim.simulator.config.loading import load_config, read_yaml_mapping, validate_config
from aisim.simulator.config.planner_config import parse_planner_config
from aisim.simulator.errors import InputError
from aisim.validate import detect_kind

ROOT = Path(__file__).resolve().parents[3]


def base() -> dict:
    return {"engine": {"model": "meta-llama/Llama-3.1-8B-Instruct", "hardware": "h200_sxm",
                       "workers": {"aggregated": {"timing": {"type": "polynomial"}}}}}


def _number_fields(model: type[BaseModel], prefix: str, seen: set, out: list) -> None:
    if model in seen:
        return
    seen.add(model)
    for name, f in model.model_fields.items():
        _walk(f.annotation, list(f.metadata), f"{prefix}{model.__name__}.{name}", seen, out)


def _walk(tp, metadata: list, where: str, seen: set, out: list) -> None:
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        inner, *meta = typing.get_args(tp)
        _walk(inner, metadata + meta, where, seen, out)
    elif tp in (int, float):
        out.append((where, tp, any(isinstance(x, Strict) and x.strict for x in metadata)))
    elif origin in (typing.Union, types.UnionType, list, dict, tuple):
        for arg in typing.get_args(tp):
            _walk(arg, [], where, seen, out)
    elif isinstance(tp, type) and issubclass(tp, BaseModel):
        _number_fields(tp, "", seen, out)


def test_every_number_field_of_every_config_model_is_strict():
    out: list = []
    seen: set = set()
    for model in (m.PredictConfig, ea.EngineArgs, pcfg.PlannerConfig):
        _number_fields(model, "", seen, out)
    assert len(out) > 80
    assert [w for w, _, strict in out if not strict] == []


@pytest.mark.parametrize("section,value", [
    ({"engine": {"workers": {"aggregated": {"parallelism": {"replicas": True}}}}}, True),
    ({"engine": {"workers": {"aggregated": {"parallelism": {"tensor": False}}}}}, False),
    ({"execution": {"engine_actors": True}}, True),
    ({"execution": {"seed": True}}, True),
    ({"planner": {"max_num_gpus": True}}, True),
    ({"traffic": {"stop": {"requests": True}}}, True),
    ({"evaluation": {"sla": {"ttft_ms": True}}}, True),
    ({"engine": {"nextn_accepted": True}}, True),
    ({"router": {"policy": "kv_router", "temperature": True}}, True),
])
def test_a_boolean_is_not_a_number(section, value):
    data = base()
    for key, sub in section.items():
        if key == "engine":
            _merge(data["engine"], sub)
        else:
            data[key] = sub
    with pytest.raises(InputError) as info:
        validate_config(data)
    e = info.value
    assert e.exit_code == 2 and f"(got {value!r}); true/false is a boolean, not a number" in e.message


def _merge(dst: dict, src: dict) -> None:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _merge(dst[k], v)
        else:
            dst[k] = v


def test_an_integer_field_takes_no_float_or_quoted_number():
    for value, hint in ((2.0, "whole number"), ("2", "quoted number")):
        data = base()
        data["engine"]["workers"]["aggregated"]["parallelism"] = {"replicas": value}
        with pytest.raises(InputError) as info:
            validate_config(data)
        assert info.value.where == "engine.workers.aggregated.parallelism.replicas" and hint in info.value.message


def test_float_fields_take_integers_and_numpy_numbers_stay_valid():
    data = base()
    data["evaluation"] = {"sla": {"ttft_ms": 500, "itl_ms": np.float32(20.5)}}
    data["engine"]["workers"]["aggregated"]["parallelism"] = {"replicas": np.int64(3)}
    data["engine"]["workers"]["aggregated"]["startup_seconds"] = 1
    cfg = validate_config(data)
    assert cfg.evaluation.sla.ttft_ms == 500.0 and isinstance(cfg.evaluation.sla.ttft_ms, float)
    assert cfg.engine.workers["aggregated"].parallelism.replicas == 3
    assert type(cfg.engine.workers["aggregated"].parallelism.replicas) is int


def test_engine_args_and_planner_config_are_strict_too():
    with pytest.raises(Exception, match="valid integer"):
        ea.EngineArgs.model_validate({"num_gpu_blocks": True})
    assert ea.EngineArgs.model_validate({"speedup_ratio": 2}).speedup_ratio == 2.0
    with pytest.raises(InputError) as info:
        parse_planner_config({"max_gpu_budget": True})
    assert info.value.where == "planner_config.max_gpu_budget" and "boolean" in info.value.message
    assert parse_planner_config({"ttft_ms": 100, "decode_scale_up_kv_rate": 90,
                                 "decode_scale_down_kv_rate": 70}).ttft_ms == 100.0


def test_every_shipped_config_still_validates():
    paths = sorted(p for p in (ROOT / "configs").glob("*.yaml")
                   if detect_kind(read_yaml_mapping(p, "config")) == "predict")  # recommend / capacity: tests/search
    assert paths
    for path in paths:
        load_config(path)
