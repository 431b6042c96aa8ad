"""A flat sample (``unroll_sample``) -> the concrete ``aisim predict`` config a candidate replays.

``resolve_load(cfg, flat, kv_load_ratio)`` gives the load fields the search appends after
unrolling (reference §7.5 item 8); ``prediction_config(cfg, flat)`` maps the flat sample to a
plain, YAML-dumpable predict config that ``simulator.config.loading.validate_config`` accepts.
Invariants: pure functions of their arguments; a pool's KV tokens are sized exactly as the replay
sizes them (``simulator.deployment.size_kv``); an unsupported value is an ``InputError`` naming the
flat key (category ``unsupported``), never dropped. The field-by-field mapping and the keys with no
predict equivalent: docs/spica-candidates.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from numbers import Real
from typing import Any

from aisim.search.spica.config import SearchConfig
from aisim.search.spica.space import CACHE_HIT_WEIGHTS, ROUTER_ADMISSION
from aisim.simulator.config import models as m
from aisim.simulator.errors import InputError

__all__ = ["resolve_load", "prediction_config", "kv_capacity_tokens", "ENGINE_MODE", "PLANNER_FIELDS"]

ENGINE_MODE = {"agg": "aggregated", "disagg": "disaggregated"}
# per mode: (predict worker role, parallel-field prefix, engine-knob prefix)
_ROLES: dict[str, tuple[tuple[str, str, str], ...]] = {
    "agg": (("aggregated", "", "agg_"),),
    "disagg": (("prefill", "prefill_", "prefill_"), ("decode", "decode_", "decode_")),
}
_CAPACITY_NAME = {"aggregated": "agg", "prefill": "prefill", "decode": "decode"}
# flat Planner fields copied under the same name into the predict planner section
PLANNER_FIELDS: tuple[str, ...] = (
    "throughput_adjustment_interval_seconds", "load_adjustment_interval_seconds", "max_num_fpm_samples",
    "fpm_sample_bucket_size", "load_scaling_down_sensitivity", "load_min_observations", "load_predictor",
    "load_predictor_log1p", "prophet_window_size", "kalman_q_level", "kalman_q_trend", "kalman_r",
    "kalman_min_points",
)


def _need(flat: Mapping[str, Any], key: str) -> Any:
    if key not in flat:
        raise InputError(key, "is missing from the flat sample; build it with unroll_sample (and merge "
                              "resolve_load's fields)")
    return flat[key]


def _mode(flat: Mapping[str, Any]) -> str:
    mode = _need(flat, "deployment_mode")
    if mode not in _ROLES:
        raise InputError("deployment_mode", f"must be agg or disagg, got {mode!r}")
    return mode


def _unsupported(key: str, message: str) -> InputError:
    return InputError(key, message, category="unsupported")


# -- the candidate's load ----------------------------------------------------------------------
def kv_capacity_tokens(flat: Mapping[str, Any]) -> dict[str, int]:
    """KV tokens per pool of the candidate, ``{"agg": n}`` or ``{"prefill": n, "decode": n}``:
    blocks per rank (sized as the replay sizes them) x block size x attention-data ranks x replicas.
    A pool whose weights leave no KV block raises ``InputError`` (category ``kv_capacity``)."""
    from aisim.simulator.catalog.hardware import get_hardware
    from aisim.simulator.catalog.models import load_geometry
    from aisim.simulator.deployment import ParallelShape, size_kv

    geometry = load_geometry(_need(flat, "model_name"), "model_name")
    hardware = get_hardware(_need(flat, "hardware_sku"), "hardware_sku")
    out = {}
    for role, par, eng in _ROLES[_mode(flat)]:
        tp, pp, adp = _need(flat, f"{par}tp"), _need(flat, f"{par}pp"), _need(flat, f"{par}attention_dp")
        block_size = _need(flat, f"{eng}block_size")
        shape = ParallelShape(tensor=tp, pipeline=pp, attention_data=adp, moe_tensor=_need(flat, f"{par}moe_tp"),
                              moe_expert=_need(flat, f"{par}moe_ep"))
        sizing = size_kv(geometry, hardware, backend=str(flat.get("backend") or "vllm"), block_size=block_size,
                         max_batched_tokens=_need(flat, f"{eng}max_num_batched_tokens"), shape=shape,
                         memory_fraction=_need(flat, f"{eng}gpu_memory_utilization"))
        if sizing.blocks_per_rank <= 0:
            raise InputError(f"{par}tp", f"{flat['model_name']} leaves no KV memory on {hardware.name} at tp {tp}, "
                                         f"pp {pp} (weights {sizing.weights_bytes / 1e9:.1f} GB per GPU); a larger "
                                         f"shape or {eng}gpu_memory_utilization is needed", category="kv_capacity")
        out[_CAPACITY_NAME[role]] = sizing.blocks_per_rank * block_size * adp * _need(flat, f"{par}replicas")
    return out


def _configured_ratio(cfg: SearchConfig) -> float | tuple[float, float] | None:
    if cfg.workload is not None:
        return cfg.workload.kv_load_ratio
    load = cfg.traffic.load
    return load.fraction if isinstance(load, m.KvCapacityFractionLoad) else None


def _ratio(cfg: SearchConfig, given: Any) -> float | None:
    configured = _configured_ratio(cfg)
    if given is not None and (isinstance(given, bool) or not isinstance(given, Real) or not math.isfinite(given)):
        raise InputError("kv_load_ratio", f"must be a number, got {given!r}")
    if configured is None:
        if given is not None:
            raise InputError("kv_load_ratio", "is not part of this search (no workload.kv_load_ratio); pass None")
        return None
    if isinstance(configured, tuple):
        lo, hi = configured
        if given is None:
            raise InputError("kv_load_ratio", f"is searched over [{lo}, {hi}]: pass the trial's value")
        if not lo <= given <= hi:
            raise InputError("kv_load_ratio", f"{given} is outside the searched range [{lo}, {hi}]")
        return float(given)
    if given is not None and float(given) != configured:
        raise InputError("kv_load_ratio", f"is pinned at {configured}, got {given}; pass None or {configured}")
    return configured


def _lengths(cfg: SearchConfig) -> tuple[int, int]:
    if cfg.workload is not None:
        return cfg.workload.isl, cfg.workload.osl
    src = cfg.traffic.source  # kv_capacity_fraction: a synthetic source (the config checks it)
    return src.input_tokens, src.output_tokens


def _fixed_concurrency(cfg: SearchConfig) -> int | None:
    if cfg.workload is not None:
        return cfg.workload.concurrency
    load = cfg.traffic.load
    return load.concurrency if isinstance(load, m.ConcurrencyLoad) else None


def resolve_load(cfg: SearchConfig, flat: Mapping[str, Any], kv_load_ratio: float | None = None) -> dict[str, Any]:
    """The load fields to append to ``flat`` (only those, in order; see the module docstring).
    ``kv_load_ratio``: the trial's draw when ``workload.kv_load_ratio`` is a [min, max] range
    (None otherwise)."""
    ratio = _ratio(cfg, kv_load_ratio)
    if ratio is None:
        concurrency = _fixed_concurrency(cfg)
        return {} if concurrency is None else {"concurrency": concurrency}
    caps = kv_capacity_tokens(flat)
    tokens = caps["agg"] if "agg" in caps else caps["decode"]
    isl, osl = _lengths(cfg)
    at_one = tokens / (isl + osl)
    out: dict[str, Any] = {
        "kv_load_ratio": ratio,
        "concurrency": max(1, math.floor(ratio * at_one)),
        "kv_load_concurrency_capacity": at_one,
        "kv_load_capacity_tokens": tokens,
    }
    out.update({f"{name}_kv_capacity_tokens": n for name, n in caps.items()})
    return out


# -- the predict config --------------------------------------------------------------------------
def _check_supported(flat: Mapping[str, Any]) -> None:
    backend = _need(flat, "backend")
    if flat.get("num_g2_blocks"):
        if backend != "vllm":
            raise _unsupported("num_g2_blocks", f"host (G2) KV offload is modelled for vllm workers only (backend is "
                                                f"{backend}); set num_g2_blocks 0")
        if flat.get("offload_batch_size") is not None:
            raise _unsupported("offload_batch_size", "has no counterpart in the modelled offload, which stores one "
                                                     "batch per request and pass as the reference does; leave it null")
    for key in CACHE_HIT_WEIGHTS:
        if key in flat and not flat.get("num_g2_blocks"):
            raise _unsupported(key, "weighs host/disk cache hits, which need the host tier; set num_g2_blocks > 0")
    for key in ROUTER_ADMISSION:
        if flat.get(key) not in (None, False):
            raise _unsupported(key, "router admission control is not modelled yet; leave it unset")


def _worker(cfg: SearchConfig, flat: Mapping[str, Any], role: str, par: str, eng: str) -> dict[str, Any]:
    worker: dict[str, Any] = {}
    if flat.get("startup_time") is not None:
        worker["startup_seconds"] = flat["startup_time"]
    worker["parallelism"] = {
        "replicas": _need(flat, f"{par}replicas"), "tensor": _need(flat, f"{par}tp"),
        "pipeline": _need(flat, f"{par}pp"), "attention_data": _need(flat, f"{par}attention_dp"),
        "moe_tensor": _need(flat, f"{par}moe_tp"), "moe_expert": _need(flat, f"{par}moe_ep"),
    }
    worker["scheduler"] = {"max_batched_tokens": _need(flat, f"{eng}max_num_batched_tokens"),
                           "max_sequences": _need(flat, f"{eng}max_num_seqs")}
    worker["kv_cache"] = {
        "block_size": _need(flat, f"{eng}block_size"),
        "prefix_caching": _need(flat, f"{eng}enable_prefix_caching"),
        "capacity": {"type": "default", "memory_fraction": _need(flat, f"{eng}gpu_memory_utilization")},
    }
    if role != "decode" and flat.get("num_g2_blocks"):
        # the seed's deployment generator: the G2 tier on aggregated and prefill workers only
        # (decode workers consume transferred KV)
        if flat.get("kv_bytes_per_token") is not None:
            worker["kv_cache"]["bytes_per_token"] = flat["kv_bytes_per_token"]
        offload: dict[str, Any] = {"num_host_blocks": flat["num_g2_blocks"]}
        for key, name in (("bandwidth_g1_to_g2_gbps", "d2h_bandwidth_gbps"),
                          ("bandwidth_g2_to_g1_gbps", "h2d_bandwidth_gbps")):
            if flat.get(key) is not None:
                offload[name] = flat[key]
        worker["kv_cache"]["host_offload"] = offload
    timing = cfg.engine.timing
    worker["timing"] = {"type": timing.type, **timing.model_dump(mode="json", exclude_defaults=True)}
    return worker


def _engine(cfg: SearchConfig, flat: Mapping[str, Any], mode: str) -> dict[str, Any]:
    e = cfg.engine
    context = flat.get("context_length")
    out: dict[str, Any] = {
        "mode": ENGINE_MODE[mode],
        "model": _need(flat, "model_name"),
        "hardware": _need(flat, "hardware_sku"),
        "backend": _need(flat, "backend"),
    }
    if e.backend_version is not None:
        out["backend_version"] = e.backend_version
    out["context_length"] = "max" if context is None else context
    out["enable_chunked_prefill"] = e.enable_chunked_prefill
    if flat.get("aic_nextn"):  # (MTP: the search's acceptance, engine.nextn_accepted)
        out["nextn"] = flat["aic_nextn"]
        out["nextn_accepted"] = e.nextn_accepted
    if mode == "disagg" and e.kv_transfer is not None:
        out["kv_transfer"] = e.kv_transfer.model_dump(mode="json", exclude_none=True)
    out["workers"] = {role: _worker(cfg, flat, role, par, eng) for role, par, eng in _ROLES[mode]}
    return out


def _router(flat: Mapping[str, Any]) -> dict[str, Any]:
    policy = _need(flat, "router_mode")
    if policy != "kv_router":
        return {"policy": policy}
    out = {"policy": "kv_router", "overlap_score_credit": _need(flat, "overlap_score_credit"),
           "prefill_load_scale": _need(flat, "prefill_load_scale"), "temperature": _need(flat, "router_temperature")}
    if "host_cache_hit_weight" in flat:
        out["host_cache_hit_weight"] = flat["host_cache_hit_weight"]
    # (disk_cache_hit_weight goes to the DGD only: the candidate has no disk tier, so it cannot
    # change the replay)
    return out


def _planner(cfg: SearchConfig, flat: Mapping[str, Any]) -> dict[str, Any]:
    throughput, load = _need(flat, "enable_throughput_scaling"), _need(flat, "enable_load_scaling")
    if not (throughput or load):
        return {"policy": "disabled"}
    target = cfg.planner_target
    if throughput and target != "sla":
        raise InputError("enable_throughput_scaling", f"throughput scaling needs the Planner target sla (a goodput "
                                                      f"optimization target); target {cfg.optimization.target} plans "
                                                      f"for {target}, so these policies are dropped before sampling")
    out: dict[str, Any] = {"policy": "enabled", "target": target, "enable_throughput_scaling": throughput,
                           "enable_load_scaling": load}
    out.update({key: flat[key] for key in PLANNER_FIELDS if key in flat})
    out["max_num_gpus"] = _need(flat, "gpu_budget")
    if flat.get("min_gpu_budget") is not None:
        out["min_num_gpus"] = flat["min_gpu_budget"]
    if flat.get("min_endpoint") is not None:
        out["min_workers"] = flat["min_endpoint"]
    return out


def _traffic(cfg: SearchConfig, flat: Mapping[str, Any]) -> dict[str, Any]:
    if cfg.traffic is not None:
        out = cfg.traffic.model_dump(mode="json", exclude_none=True)
        if isinstance(cfg.traffic.load, m.KvCapacityFractionLoad):
            out["load"] = {"type": "concurrency", "concurrency": _need(flat, "concurrency")}
        return out
    w = cfg.workload
    if w.request_rate is not None:
        load = {"type": "poisson", "requests_per_second": w.request_rate, "seed": w.arrival_seed}
        unit = w.request_rate
    else:
        concurrency = w.concurrency if w.concurrency is not None else _need(flat, "concurrency")
        load = {"type": "concurrency", "concurrency": concurrency}
        unit = concurrency
    requests = w.request_count if w.request_count is not None else max(1, round(w.num_request_ratio * unit))
    return {"source": {"type": "synthetic", "input_tokens": w.isl, "output_tokens": w.osl}, "load": load,
            "stop": {"requests": requests}}


def prediction_config(cfg: SearchConfig, flat: Mapping[str, Any]) -> dict[str, Any]:
    """The concrete, domain-free predict config (a plain mapping) the candidate ``flat`` replays;
    see the module docstring for the mapping and the unsupported values."""
    mode = _mode(flat)
    _check_supported(flat)
    execution = cfg.execution.model_dump(mode="json", exclude_defaults=True)
    execution.update(backend="local")
    execution.pop("ray_address", None)
    return {
        "traffic": _traffic(cfg, flat),
        "engine": _engine(cfg, flat, mode),
        "router": _router(flat),
        "planner": _planner(cfg, flat),
        "evaluation": _evaluation(cfg),
        "execution": execution,
    }


def _evaluation(cfg) -> dict:
    """The config's ``evaluation`` as a predict section (``percentile`` only when it is not the mean)."""
    out = cfg.evaluation.model_dump(mode="json", exclude_none=True)
    if out.get("sla", {}).get("percentile") == "mean":
        del out["sla"]["percentile"]
    return out
