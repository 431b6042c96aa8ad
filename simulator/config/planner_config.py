"""PlannerConfig: the Planner's own configuration (reference field names), as the Python API
takes it, and the lowering of the ``planner`` YAML section into it.

The seed's rules live here, so both entry points obey them:
- targets throughput, latency and load run load scaling only and ignore the two flags;
- target sla uses the flags (throughput on, load off unless set) and needs ttft_ms and itl_ms;
- target load fixes the thresholds (decode KV rate 90/70; prefill queue tokens 1/0 when
  disaggregated); policy disabled rejects advisory;
- intervals: throughput an integer > 0, load > 0 and strictly shorter than the throughput
  interval when both loops run; the tick is their (millisecond) GCD;
- retune (``simulator.config.retune``): the section is validated into a ``RetuneConfig`` and
  resolved against the Planner (tick, loops, SLA); retune-only mode (both scaling flags false
  with retune set, any target) runs no loop and ticks every load interval; both flags false
  without retune keep the rules above.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, ValidationError, model_validator

from aisim.simulator.config.loading import format_validation_error, read_yaml_mapping
from aisim.simulator.config.models import Float, Int, NonNegInt, PlannerKnobs, PosFloat, PosInt, Strict
from aisim.simulator.config.retune import RetuneConfig
from aisim.simulator.config.retune import resolve as resolve_retune
from aisim.simulator.errors import InputError


class Scheduling(Strict):
    scale_interval_seconds: PosFloat | None = None


class PlannerConfig(PlannerKnobs):
    optimization_target: Literal["throughput", "latency", "load", "sla"] = "throughput"
    mode: Literal["agg", "disagg"] = "disagg"
    backend: str | None = None
    enable_throughput_scaling: bool = True
    enable_load_scaling: bool = False
    throughput_adjustment_interval: PosInt = Field(
        180, validation_alias=AliasChoices("throughput_adjustment_interval", "throughput_adjustment_interval_seconds"))
    load_adjustment_interval: PosFloat = Field(
        5.0, validation_alias=AliasChoices("load_adjustment_interval", "load_adjustment_interval_seconds"))
    max_gpu_budget: Int = 8
    min_gpu_budget: Int = -1
    min_endpoint: NonNegInt = 1
    prefill_min_endpoint: PosInt | None = None
    decode_min_endpoint: PosInt | None = None
    ttft_ms: PosFloat = 500.0
    itl_ms: PosFloat = 50.0
    prefill_scale_up_queue_tokens: Annotated[Float, Field(ge=0)] | None = None
    prefill_scale_down_queue_tokens: Annotated[Float, Field(ge=0)] | None = None
    decode_scale_up_kv_rate: Annotated[Float, Field(ge=0, le=100)] | None = None
    decode_scale_down_kv_rate: Annotated[Float, Field(ge=0, le=100)] | None = None
    prefill_engine_num_gpu: PosInt | None = None
    decode_engine_num_gpu: PosInt | None = None
    scheduling: Scheduling = Scheduling()
    report_interval_hours: PosFloat | None = 24.0
    live_dashboard_port: NonNegInt | None = 8080
    retune: RetuneConfig | None = None

    @model_validator(mode="after")
    def _rules(self):
        for lo, hi in (("prefill_scale_down_queue_tokens", "prefill_scale_up_queue_tokens"),
                       ("decode_scale_down_kv_rate", "decode_scale_up_kv_rate")):
            a, b = getattr(self, lo), getattr(self, hi)
            if a is not None and b is not None and not b > a:
                raise ValueError(f"{hi} must be greater than {lo}")
        return self


# fields that do not change decisions (excluded from planner_config_digest)
IDENTITY_EXCLUSIONS = ("load_predictor_warmup_trace", "report_interval_hours", "live_dashboard_port")


class _DuplicateKey(Exception):
    pass


def _no_duplicate_keys(pairs: list) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def parse_planner_config(raw, field: str = "planner_config") -> PlannerConfig:
    """A mapping, an inline JSON string, or the path of a JSON or YAML file."""
    data = raw
    if isinstance(raw, PlannerConfig):
        return _with_retune(raw, field)
    if isinstance(raw, (str, Path)):
        text = str(raw).strip()
        if text.startswith("{"):
            try:
                data = json.loads(text, object_pairs_hook=_no_duplicate_keys)
            except _DuplicateKey as exc:
                raise InputError(field, f"inline JSON has duplicate key {exc.args[0]!r}; keep one") from None
            except ValueError as exc:
                raise InputError(field, f"inline JSON does not parse ({exc.msg})") from None
        else:
            p = Path(text)
            if not p.is_file():
                raise InputError(field, f"{text!r} is neither inline JSON nor an existing JSON/YAML file")
            data = read_yaml_mapping(p, "planner config")
    if not isinstance(data, dict):
        raise InputError(field, f"expected a mapping, inline JSON or a file path, got {type(raw).__name__}")
    try:
        pc = PlannerConfig.model_validate(data)
    except ValidationError as exc:
        err = format_validation_error(exc)
        raise InputError(f"{field}.{err.where}", err.message, category=err.category) from None
    return _with_retune(pc, field)  # the API scores against the Planner's own ttft_ms / itl_ms


def from_replay_section(section, engine_mode: str, sla) -> PlannerConfig:
    """The ``planner`` YAML section (replay key names) -> PlannerConfig, with the seed's rules."""
    p = section
    disagg = engine_mode == "disaggregated"
    if not disagg and (p.prefill_min_workers is not None or p.decode_min_workers is not None):
        key = "prefill_min_workers" if p.prefill_min_workers is not None else "decode_min_workers"
        raise InputError(f"planner.{key}", "per-role minimums need engine.mode disaggregated; use planner.min_workers")
    data: dict[str, Any] = {
        "optimization_target": p.target, "mode": "disagg" if disagg else "agg",
        **p.model_dump(include=set(PlannerKnobs.model_fields)),
        "max_gpu_budget": p.max_num_gpus, "min_gpu_budget": p.min_num_gpus, "min_endpoint": p.min_workers,
        "prefill_min_endpoint": p.prefill_min_workers, "decode_min_endpoint": p.decode_min_workers,
        "report_interval_hours": None, "live_dashboard_port": 0,  # predict writes no HTML report
    }
    if p.throughput_adjustment_interval_seconds is not None:
        data["throughput_adjustment_interval"] = p.throughput_adjustment_interval_seconds
    if p.load_adjustment_interval_seconds is not None:
        data["load_adjustment_interval"] = p.load_adjustment_interval_seconds
    if p.retune is not None:
        data["retune"] = p.retune
        if p.enable_throughput_scaling is False and p.enable_load_scaling is False:  # retune-only mode
            data.update(enable_throughput_scaling=False, enable_load_scaling=False)
    if p.target == "sla":
        data["enable_throughput_scaling"] = True if p.enable_throughput_scaling is None else p.enable_throughput_scaling
        data["enable_load_scaling"] = False if p.enable_load_scaling is None else p.enable_load_scaling
        if data["enable_throughput_scaling"]:
            if sla is None or sla.ttft_ms is None or sla.itl_ms is None:
                raise InputError("evaluation.sla", "planner target sla needs evaluation.sla.ttft_ms and itl_ms "
                                                   "(an SLA with only e2e_ms cannot size throughput)")
        if sla is not None and sla.ttft_ms is not None:
            data["ttft_ms"] = sla.ttft_ms
        if sla is not None and sla.itl_ms is not None:
            data["itl_ms"] = sla.itl_ms
    if p.target == "load":
        data.update(decode_scale_up_kv_rate=90, decode_scale_down_kv_rate=70)
        if disagg:
            data.update(prefill_scale_up_queue_tokens=1, prefill_scale_down_queue_tokens=0)
    try:
        pc = PlannerConfig.model_validate(data)
    except ValidationError as exc:
        err = format_validation_error(exc)
        raise InputError(f"planner.{err.where}", err.message, category=err.category) from None
    tick_interval_s(pc, "planner", replay_keys=True)  # the interval rules, checked with the config
    return _with_retune(pc, "planner", sla, replay_keys=True)


def _with_retune(pc: PlannerConfig, field: str, sla=None, replay_keys: bool = False) -> PlannerConfig:
    """``pc`` with its retune section checked against the Planner and its defaults resolved
    (scoring SLA: ``sla`` (evaluation.sla) where set, else the Planner's ttft_ms / itl_ms)."""
    if pc.retune is None:
        return pc
    thr, load = effective_loops(pc)
    rc = resolve_retune(
        pc.retune, field=field, tick_s=tick_interval_s(pc, field, replay_keys), throughput=thr, load=load,
        target=pc.optimization_target, load_predictor=pc.load_predictor,
        throughput_interval_s=pc.throughput_adjustment_interval,
        ttft_ms=sla.ttft_ms if sla is not None and sla.ttft_ms is not None else pc.ttft_ms,
        itl_ms=sla.itl_ms if sla is not None and sla.itl_ms is not None else pc.itl_ms)
    return pc.model_copy(update={"retune": rc})


def retune_only(pc: PlannerConfig) -> bool:
    """Retune-only mode: retune set and both scaling flags false; the Planner never scales."""
    return pc.retune is not None and not pc.enable_throughput_scaling and not pc.enable_load_scaling


def effective_loops(pc: PlannerConfig) -> tuple[bool, bool]:
    """(throughput scaling, load scaling) as a live Planner runs them (neither in retune-only mode)."""
    if retune_only(pc):
        return False, False
    if pc.optimization_target != "sla":
        return False, True
    return pc.enable_throughput_scaling, pc.enable_load_scaling


def tick_interval_s(pc: PlannerConfig, field: str, replay_keys: bool = False) -> float:
    thr, load = effective_loops(pc)
    if retune_only(pc):  # ticks every load interval
        if pc.scheduling.scale_interval_seconds is not None:
            return pc.scheduling.scale_interval_seconds
        return round(pc.load_adjustment_interval * 1000) / 1000.0
    if not thr and not load:
        raise InputError(f"{field}.enable_load_scaling", "at least one of enable_throughput_scaling and "
                                                         "enable_load_scaling must be on")
    if thr and load and not pc.load_adjustment_interval < pc.throughput_adjustment_interval:
        key = "load_adjustment_interval_seconds" if replay_keys else "load_adjustment_interval"
        raise InputError(f"{field}.{key}", "must be shorter than the throughput interval when both loops run")
    if pc.scheduling.scale_interval_seconds is not None:
        return pc.scheduling.scale_interval_seconds
    ms = [round(pc.load_adjustment_interval * 1000)]
    if thr:
        ms.append(pc.throughput_adjustment_interval * 1000)
    if not load:
        ms = ms[1:]
    g = 0
    for x in ms:
        g = math.gcd(g, int(x))
    return g / 1000.0


def digest(pc: PlannerConfig) -> str:
    import hashlib

    doc = pc.model_dump(mode="json", exclude=set(IDENTITY_EXCLUSIONS))
    if isinstance(doc.get("retune"), dict):
        doc["retune"].pop("max_parallel", None)  # how many sweep workers: the same decisions either way
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
