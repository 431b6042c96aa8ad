"""PlannerConfig: the Planner's configuration in the reference's programmatic names, as the
Python API takes it (``planner_config``), and its input adapter: ``planner_section`` turns it
into the YAML ``planner`` section, which ``simulator.planning.lower_planner`` lowers like a
config's. Nothing past the adapter reads PlannerConfig; the seed's rules live in the lowering.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, ValidationError

from aisim.simulator.config import models as m
from aisim.simulator.config.loading import format_validation_error, read_yaml_mapping
from aisim.simulator.config.models import Int, NonNegInt, PlannerKnobs, PosFloat, PosInt, Strict
from aisim.simulator.config.retune import RetuneConfig
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
    scheduling: Scheduling = Scheduling()
    report_interval_hours: PosFloat | None = 24.0  # the API's HTML diagnostics page (None and port 0: none)
    live_dashboard_port: NonNegInt | None = 8080
    retune: RetuneConfig | None = None

    @property
    def wants_report_page(self) -> bool:
        return not (self.report_interval_hours is None and self.live_dashboard_port == 0)


# fields that do not change decisions (listed in the report's planner_config_identity_exclusions)
IDENTITY_EXCLUSIONS = ("load_predictor_warmup_trace", "report_interval_hours", "live_dashboard_port")

# a YAML ``planner`` key -> its PlannerConfig name, where they differ: how the adapter renames
# PlannerConfig into the section, and how the lowering's errors name a key for an API caller
API_NAMES = {
    "target": "optimization_target", "max_num_gpus": "max_gpu_budget", "min_num_gpus": "min_gpu_budget",
    "min_workers": "min_endpoint", "prefill_min_workers": "prefill_min_endpoint",
    "decode_min_workers": "decode_min_endpoint",
    "throughput_adjustment_interval_seconds": "throughput_adjustment_interval",
    "load_adjustment_interval_seconds": "load_adjustment_interval",
    "scale_interval_seconds": "scheduling.scale_interval_seconds",
}


def planner_section(pc: PlannerConfig, engine_mode: str, engine_backend: str,
                    field: str = "planner_config") -> m.Planner:
    """The YAML ``planner`` section a PlannerConfig describes (the input adapter). The fields the
    reference derives from the deployment (``mode``, ``backend``) must agree with the engine; the
    flags are passed as given (the lowering applies the seed's rules to both dialects alike); the
    Planner's own ``ttft_ms``/``itl_ms`` are passed where target sla uses them or they were set."""
    disagg = engine_mode == "disaggregated"
    if (pc.mode == "disagg") != disagg:
        raise InputError(f"{field}.mode", f"mode {pc.mode} does not match the engine "
                                          f"({'prefill/decode' if disagg else 'aggregated'} workers); "
                                          f"use mode {'disagg' if disagg else 'agg'}")
    if pc.backend is not None and pc.backend != engine_backend:
        raise InputError(f"{field}.backend", f"{pc.backend!r} is not the engine's backend ({engine_backend}); "
                                             "remove it (the Planner takes the engine's)")
    if pc.optimization_target == "load":  # (the YAML's target load has fixed defaults; the API's has none)
        need = ["decode_scale_up_kv_rate", "decode_scale_down_kv_rate"]
        if disagg:
            need += ["prefill_scale_up_queue_tokens", "prefill_scale_down_queue_tokens"]
        for key in need:
            if getattr(pc, key) is None:
                raise InputError(f"{field}.{key}", "target load needs its thresholds; set "
                                                   f"{' and '.join(need)}")
    data = {
        **pc.model_dump(include=set(PlannerKnobs.model_fields)),  # (the same names in both)
        **{key: _value(pc, name) for key, name in API_NAMES.items()},  # (renamed)
        "policy": "enabled", "retune": pc.retune,
        "enable_throughput_scaling": pc.enable_throughput_scaling, "enable_load_scaling": pc.enable_load_scaling,
    }
    for key in ("ttft_ms", "itl_ms"):
        if pc.optimization_target == "sla" or key in pc.model_fields_set:
            data[key] = getattr(pc, key)
    try:
        return m.Planner.model_validate(data)
    except ValidationError as exc:
        err = format_validation_error(exc)
        raise InputError(f"{field}.{api_name(err.where)}", err.message, category=err.category) from None


def _value(pc: PlannerConfig, name: str):
    """PlannerConfig's field ``name`` (a dotted path into a nested section)."""
    value = pc
    for part in name.split("."):
        value = getattr(value, part)
    return value


def api_name(path: str) -> str:
    """A YAML planner key path in PlannerConfig's names."""
    head, _, rest = path.partition(".")
    return API_NAMES.get(head, head) + (f".{rest}" if rest else "")


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
    if isinstance(raw, PlannerConfig):
        return raw
    data = raw
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
        return PlannerConfig.model_validate(data)
    except ValidationError as exc:
        err = format_validation_error(exc)
        raise InputError(f"{field}.{err.where}", err.message, category=err.category) from None
