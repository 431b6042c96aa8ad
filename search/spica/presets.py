"""Spica's tables (copied from the reference search-space dump) and the composite expansions.

The tables are facts of the reference (``shared/reference/spica-search-space.json``; a test checks
that they still equal it): the default of every knob (``DEFAULTS``), the closed choices of the
categorical knobs (``ALLOWED_CHOICES``), the keys a composite dict may and must carry
(``COMPOSITE_DICT_KEYS``, ``COMPOSITE_REQUIRED_KEYS``), every preset's unrolled fields
(``PRESET_EXPANSIONS``) and the predictor family defaults (``PREDICTOR_FAMILY_DEFAULTS``).

Composite expansion (seed "Pin a composite's unrolled fields"): ``scaling_fields``,
``fpm_fields``, ``load_sensitivity_fields`` and ``predictor_fields`` take a preset id or a dict
and return the unrolled fields in emission order. A dict pins the fields directly and replaces
the preset (no merge). Only ``predictor_fields`` fills gaps: ``load_predictor_log1p`` defaults to
false, the family's own knobs to ``PREDICTOR_FAMILY_DEFAULTS``, and another family's knobs are
never emitted. The functions trust their input: ``search.spica.space`` validates it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Every knob's default, in the reference's field order. ``model_name`` and ``hardware_sku`` have no
# default (the dump shows them as its ``input``): the search fills them from the engine section,
# so they are None here until set.
DEFAULTS: dict[str, Any] = {
    "deployment_mode": ("disagg", "agg"),
    "backend": ("vllm",),
    "parallel_configs": (),
    "model_name": None,
    "hardware_sku": None,
    "gpu_budget": 32,
    "min_gpu_budget": None,
    "min_endpoint": None,
    "context_length": None,
    "startup_time": None,
    "aic_nextn": None,
    "prefill_max_num_batched_tokens": (8192, 16384, 32768),
    "prefill_max_num_seqs": (1, 2, 4, 8, 16, 32, 64, 128, 256),
    "prefill_block_size": 64,
    "prefill_gpu_memory_utilization": 0.9,
    "prefill_enable_prefix_caching": True,
    "decode_max_num_batched_tokens": (8192,),
    "decode_max_num_seqs": (256, 512, 1024),
    "decode_block_size": 64,
    "decode_gpu_memory_utilization": 0.9,
    "decode_enable_prefix_caching": False,
    "agg_max_num_batched_tokens": (8192, 16384, 32768),
    "agg_max_num_seqs": (256, 512, 1024),
    "agg_block_size": 64,
    "agg_gpu_memory_utilization": 0.9,
    "agg_enable_prefix_caching": True,
    "num_g2_blocks": 0,
    "kv_bytes_per_token": None,
    "bandwidth_g1_to_g2_gbps": None,
    "bandwidth_g2_to_g1_gbps": None,
    "offload_batch_size": None,
    "router_mode": ("kv_router", "round_robin"),
    "overlap_score_credit": (0.0, 0.5, 1.0),
    "prefill_load_scale": (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0),
    "host_cache_hit_weight": (0.5, 0.75, 1.0),
    "disk_cache_hit_weight": (0.0, 0.25, 0.5),
    "router_temperature": (0.0, 0.2, 0.5, 1.0),
    "active_decode_blocks_threshold": None,
    "active_prefill_tokens_threshold": None,
    "active_prefill_tokens_threshold_frac": None,
    "no_admission_control": False,
    "planner_scaling_policy": ("disabled", "throughput_180_5", "throughput_600_5", "load_180_5", "load_180_10",
                               "hybrid_180_5", "hybrid_600_5"),
    "planner_fpm_sampling": ("small", "default", "large", "fine"),
    "planner_load_sensitivity": ("aggressive", "default", "conservative"),
    "load_predictor_candidates": ("constant_last", "arima_raw", "arima_log1p", "prophet_w20_raw", "prophet_w20_log1p",
                                  "prophet_w50_raw", "prophet_w50_log1p", "kalman_default_raw",
                                  "kalman_default_log1p", "kalman_reactive_raw", "kalman_reactive_log1p"),
}

COMPOSITE_KNOBS: tuple[str, ...] = ("planner_scaling_policy", "planner_fpm_sampling", "planner_load_sensitivity",
                                    "load_predictor_candidates")

# The reference's choices per knob. The string knobs and the composites' preset ids are closed
# sets; the numeric router knobs list their default grid (our choice: any value in the knob's
# legal range may be searched, see search.spica.space).
ALLOWED_CHOICES: dict[str, tuple] = {
    "deployment_mode": ("disagg", "agg"),
    "backend": ("vllm", "sglang", "trtllm"),
    "router_mode": ("kv_router", "round_robin"),
    "overlap_score_credit": (0.0, 0.5, 1.0),
    "prefill_load_scale": (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0),
    "router_temperature": (0.0, 0.2, 0.5, 1.0),
    "host_cache_hit_weight": (0.5, 0.75, 1.0),
    "disk_cache_hit_weight": (0.0, 0.25, 0.5),
    **{knob: DEFAULTS[knob] for knob in COMPOSITE_KNOBS},
}

# The unrolled fields of each composite, in emission order (a composite dict takes these keys).
COMPOSITE_FIELDS: dict[str, tuple[str, ...]] = {
    "planner_scaling_policy": ("enable_throughput_scaling", "enable_load_scaling",
                               "throughput_adjustment_interval_seconds", "load_adjustment_interval_seconds"),
    "planner_fpm_sampling": ("max_num_fpm_samples", "fpm_sample_bucket_size"),
    "planner_load_sensitivity": ("load_scaling_down_sensitivity", "load_min_observations"),
    "load_predictor_candidates": ("load_predictor", "load_predictor_log1p", "prophet_window_size", "kalman_q_level",
                                  "kalman_q_trend", "kalman_r", "kalman_min_points"),
}
COMPOSITE_DICT_KEYS: dict[str, frozenset[str]] = {k: frozenset(v) for k, v in COMPOSITE_FIELDS.items()}
COMPOSITE_REQUIRED_KEYS: dict[str, frozenset[str]] = {
    **{k: COMPOSITE_DICT_KEYS[k] for k in COMPOSITE_KNOBS[:3]},  # the planner composites: allowed == required
    "load_predictor_candidates": frozenset({"load_predictor"}),
}

PREDICTOR_FAMILIES: tuple[str, ...] = ("constant", "arima", "prophet", "kalman")
# each family's own knobs, in emission order (constant and arima have none)
PREDICTOR_FAMILY_KEYS: dict[str, tuple[str, ...]] = {
    "constant": (),
    "arima": (),
    "prophet": ("prophet_window_size",),
    "kalman": ("kalman_q_level", "kalman_q_trend", "kalman_r", "kalman_min_points"),
}
PREDICTOR_FAMILY_DEFAULTS: dict[str, Any] = {
    "prophet_window_size": 50,
    "kalman_q_level": 1.0,
    "kalman_q_trend": 0.1,
    "kalman_r": 10.0,
    "kalman_min_points": 5,
    "load_predictor_log1p": False,
}


def _scaling(throughput: bool, load: bool, throughput_s: int | None, load_s: int | None) -> dict[str, Any]:
    return {"enable_throughput_scaling": throughput, "enable_load_scaling": load,
            "throughput_adjustment_interval_seconds": throughput_s, "load_adjustment_interval_seconds": load_s}


def _predictor(family: str, log1p: bool, **params: Any) -> dict[str, Any]:
    return {"load_predictor": family, "load_predictor_log1p": log1p, **params}


_KALMAN_DEFAULT = {"kalman_q_level": 1.0, "kalman_q_trend": 0.1, "kalman_r": 10.0, "kalman_min_points": 5}
_KALMAN_REACTIVE = {"kalman_q_level": 10.0, "kalman_q_trend": 1.0, "kalman_r": 5.0, "kalman_min_points": 3}

PRESET_EXPANSIONS: dict[str, dict[str, dict[str, Any]]] = {
    "planner_scaling_policy": {
        "disabled": _scaling(False, False, None, None),
        "throughput_180_5": _scaling(True, False, 180, 5),
        "throughput_600_5": _scaling(True, False, 600, 5),
        "load_180_5": _scaling(False, True, 180, 5),
        "load_180_10": _scaling(False, True, 180, 10),
        "hybrid_180_5": _scaling(True, True, 180, 5),
        "hybrid_600_5": _scaling(True, True, 600, 5),
    },
    "planner_fpm_sampling": {
        "small": {"max_num_fpm_samples": 32, "fpm_sample_bucket_size": 4},
        "default": {"max_num_fpm_samples": 64, "fpm_sample_bucket_size": 16},
        "large": {"max_num_fpm_samples": 128, "fpm_sample_bucket_size": 16},
        "fine": {"max_num_fpm_samples": 128, "fpm_sample_bucket_size": 64},
    },
    "planner_load_sensitivity": {
        "aggressive": {"load_scaling_down_sensitivity": 70, "load_min_observations": 3},
        "default": {"load_scaling_down_sensitivity": 80, "load_min_observations": 5},
        "conservative": {"load_scaling_down_sensitivity": 90, "load_min_observations": 8},
    },
    "load_predictor_candidates": {
        "constant_last": _predictor("constant", False),
        "arima_raw": _predictor("arima", False),
        "arima_log1p": _predictor("arima", True),
        "prophet_w20_raw": _predictor("prophet", False, prophet_window_size=20),
        "prophet_w20_log1p": _predictor("prophet", True, prophet_window_size=20),
        "prophet_w50_raw": _predictor("prophet", False, prophet_window_size=50),
        "prophet_w50_log1p": _predictor("prophet", True, prophet_window_size=50),
        "kalman_default_raw": _predictor("kalman", False, **_KALMAN_DEFAULT),
        "kalman_default_log1p": _predictor("kalman", True, **_KALMAN_DEFAULT),
        "kalman_reactive_raw": _predictor("kalman", False, **_KALMAN_REACTIVE),
        "kalman_reactive_log1p": _predictor("kalman", True, **_KALMAN_REACTIVE),
    },
}


def _fields(knob: str, entry: str | Mapping[str, Any]) -> dict[str, Any]:
    """The unrolled fields of one composite entry (preset id or dict), in emission order."""
    source = PRESET_EXPANSIONS[knob][entry] if isinstance(entry, str) else entry
    return {key: source[key] for key in COMPOSITE_FIELDS[knob] if key in source}


def scaling_fields(entry: str | Mapping[str, Any]) -> dict[str, Any]:
    """``planner_scaling_policy``: the two scaling flags and the two intervals (seconds)."""
    return _fields("planner_scaling_policy", entry)


def fpm_fields(entry: str | Mapping[str, Any]) -> dict[str, Any]:
    """``planner_fpm_sampling``: ``max_num_fpm_samples``, ``fpm_sample_bucket_size``."""
    return _fields("planner_fpm_sampling", entry)


def load_sensitivity_fields(entry: str | Mapping[str, Any]) -> dict[str, Any]:
    """``planner_load_sensitivity``: ``load_scaling_down_sensitivity``, ``load_min_observations``."""
    return _fields("planner_load_sensitivity", entry)


def predictor_fields(entry: str | Mapping[str, Any]) -> dict[str, Any]:
    """A predictor (preset id, composite dict or sweep winner): ``load_predictor``,
    ``load_predictor_log1p`` (default false) and only the family's own knobs (missing ones take
    ``PREDICTOR_FAMILY_DEFAULTS``); keys of another family and any other key are dropped."""
    source = PRESET_EXPANSIONS["load_predictor_candidates"][entry] if isinstance(entry, str) else entry
    family = source["load_predictor"]
    log1p = source.get("load_predictor_log1p", PREDICTOR_FAMILY_DEFAULTS["load_predictor_log1p"])
    out = {"load_predictor": family, "load_predictor_log1p": log1p}
    for key in PREDICTOR_FAMILY_KEYS[family]:
        out[key] = source.get(key, PREDICTOR_FAMILY_DEFAULTS[key])
    return out


def scaling_is_on(entry: str | Mapping[str, Any]) -> bool:
    """Whether a scaling policy turns on throughput or load scaling (False: ``disabled``)."""
    fields = scaling_fields(entry)
    return bool(fields["enable_throughput_scaling"] or fields["enable_load_scaling"])
