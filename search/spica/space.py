"""Spica's search space: the ``search_space:`` section, its defaults and every rule it must obey.

``SearchSpace.from_dict(mapping)`` validates the section as written in YAML; an omitted knob takes
its default (``search.spica.presets.DEFAULTS``, the reference's resolved defaults; ``min_endpoint``
defaults to null, ``model_name`` / ``hardware_sku`` to null until the search fills them). Every bad
value raises one ``InputError`` whose ``where`` is the dotted path (``search_space.agg_max_num_seqs``,
``search_space.planner_scaling_policy.1.enable_load_scaling``) and whose message names the fix.

Kinds of knob:

- searched (a list of choices; a one-element list pins the knob, seed mechanism 1):
  ``deployment_mode``, ``backend``, the batching knobs ``<agg|prefill|decode>_max_num_batched_tokens``
  / ``_max_num_seqs``, ``router_mode``, the kv-router knobs ``overlap_score_credit``,
  ``prefill_load_scale``, ``host_cache_hit_weight``, ``disk_cache_hit_weight``,
  ``router_temperature``. String knobs take the reference's allowed choices
  (``presets.ALLOWED_CHOICES``: a value outside is rejected with the allowed list); the numeric
  kv-router knobs any value within their bounds (``ROUTER_BOUNDS``: credit and cache-hit weights in
  [0, 1], the others >= 0; the reference's recommend form takes any such value); the batching knobs
  any positive integer. A scalar in place of the list is rejected (``[x]`` pins), as is an empty
  list or a value listed twice. The batching and numeric router knobs (``RANGE_KNOBS``) may instead
  hold ``{range: {min, max, step, scale}}`` (``search.spica.domains``): a stepped range is its list
  of choices, an unstepped one is held as a continuous ``Range``.
- composites (a list of preset ids and/or dicts): ``planner_scaling_policy``,
  ``planner_fpm_sampling``, ``planner_load_sensitivity``, ``load_predictor_candidates``. A dict pins
  the unrolled fields directly (seed mechanism 2, no merge with a preset): keys from the composite's
  fields only; the planner composites need all of them, ``load_predictor_candidates`` at least
  ``load_predictor`` (other family parameters default; another family's parameters are rejected).
  Values are type-checked with the Planner's field types (finer legality is PlannerConfig's);
  a scaling dict with either flag on needs both intervals.
- ``parallel_configs``: a list of shapes (seed mechanism 3); an entry pins the shape, needs
  ``deployment_mode`` to list exactly one mode, and omits dims that default to 1 (agg: ``{tp, pp,
  attention_dp, moe_tp, moe_ep, replicas}``; disagg: ``{prefill: shape, decode: shape}``).
- pinned scalars (never searched; a list is rejected): ``model_name``, ``hardware_sku``,
  ``gpu_budget``, ``min_gpu_budget`` (<= ``gpu_budget``), ``min_endpoint``, ``context_length``,
  ``startup_time``, ``aic_nextn``, the per-role ``_block_size`` / ``_gpu_memory_utilization`` /
  ``_enable_prefix_caching``, the KV-manager offload fields and the router admission fields.
  The admission fields are reserved: in a space whose ``router_mode`` includes ``kv_router``, setting
  one (non-null, or ``no_admission_control: true``) is rejected, because Dynamo replay cannot model
  router admission control yet.

Gating (seed): the kv-router knobs are searched only when ``router_mode`` includes ``kv_router``;
the cache-hit weights also need multi-tier offload (``num_g2_blocks`` > 0); ``planner_fpm_sampling``
and ``planner_load_sensitivity`` only when some scaling policy turns scaling on. A gated-out knob is
accepted and simply not searched (as the reference does). ``branch_choices(mode)`` lists what a
sampler draws in one branch.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from functools import cache
from numbers import Real
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_serializer,
    model_validator,
)
from pydantic import Strict as StrictType

from aisim.search.spica.domains import Range, parse_range
from aisim.search.spica.presets import (
    ALLOWED_CHOICES,
    COMPOSITE_DICT_KEYS,
    COMPOSITE_FIELDS,
    COMPOSITE_REQUIRED_KEYS,
    DEFAULTS,
    PREDICTOR_FAMILIES,
    PREDICTOR_FAMILY_KEYS,
    PRESET_EXPANSIONS,
    scaling_is_on,
)
from aisim.search.spica.shapes import ROLES, check_parallel_config
from aisim.simulator.config.models import Fraction01, Int, NonNegFloat, NonNegInt, PosFloat, PosInt, Strict
from aisim.simulator.errors import InputError

__all__ = ["SearchSpace", "MODES", "BATCHING_KNOBS", "ENGINE_PINNED", "DEPLOYMENT_PINNED", "KV_MANAGER",
           "KV_ROUTER_KNOBS", "CACHE_HIT_WEIGHTS", "ROUTER_ADMISSION", "PLANNER_TUNING", "COMPOSITE_FIELD_TYPES",
           "check_field_value", "check_composite_entry", "same_value", "show"]

SECTION = "search_space"
MODES: tuple[str, ...] = ("agg", "disagg")

# Knob groups, each in the flat sample's emission order. The seed gives the order of the sections;
# within a section we keep the space's field order (the reference dump's): the seed folds the pinned
# scalars as ``_DEPLOYMENT_PINNED + _KV_MANAGER`` (its bullets group context, limits and offload, but
# the fold puts min_endpoint right after min_gpu_budget and the offload fields after aic_nextn), and
# ``_KV_ROUTER_KNOBS`` puts the cache-hit weights between prefill_load_scale and router_temperature
# (the seed's prose names router_temperature first, but as a list of what applies, not an order).
DEPLOYMENT_PINNED: tuple[str, ...] = ("model_name", "hardware_sku", "gpu_budget", "min_gpu_budget", "min_endpoint",
                                      "context_length", "startup_time", "aic_nextn")
KV_MANAGER: tuple[str, ...] = ("num_g2_blocks", "kv_bytes_per_token", "bandwidth_g1_to_g2_gbps",
                               "bandwidth_g2_to_g1_gbps", "offload_batch_size")
BATCHING_KNOBS: dict[str, tuple[str, ...]] = {
    "agg": ("agg_max_num_batched_tokens", "agg_max_num_seqs"),
    "disagg": ("prefill_max_num_batched_tokens", "prefill_max_num_seqs", "decode_max_num_batched_tokens",
               "decode_max_num_seqs"),
}
ENGINE_PINNED: dict[str, tuple[str, ...]] = {
    "agg": ("agg_block_size", "agg_gpu_memory_utilization", "agg_enable_prefix_caching"),
    "disagg": tuple(f"{role}_{knob}" for role in ROLES
                    for knob in ("block_size", "gpu_memory_utilization", "enable_prefix_caching")),
}
CACHE_HIT_WEIGHTS: tuple[str, ...] = ("host_cache_hit_weight", "disk_cache_hit_weight")
KV_ROUTER_KNOBS: tuple[str, ...] = ("overlap_score_credit", "prefill_load_scale", *CACHE_HIT_WEIGHTS,
                                    "router_temperature")
ROUTER_ADMISSION: tuple[str, ...] = ("active_decode_blocks_threshold", "active_prefill_tokens_threshold",
                                     "active_prefill_tokens_threshold_frac", "no_admission_control")
PLANNER_TUNING: tuple[str, ...] = ("planner_fpm_sampling", "planner_load_sensitivity")
# knobs that may hold a ``{range: ...}`` domain -> whether the range is of integers
RANGE_KNOBS: dict[str, bool] = {**{k: True for knobs in BATCHING_KNOBS.values() for k in knobs},
                                **{k: False for k in KV_ROUTER_KNOBS}}


# -- values ----------------------------------------------------------------------------------
StrictBool = Annotated[bool, StrictType()]
Name = Annotated[str, StrictType(), Field(min_length=1)]


def _perfect_square(v: int) -> int:
    if math.isqrt(v) ** 2 != v:
        raise ValueError(f"must be a perfect square (got {v}); use e.g. 4, 16 or 64")
    return v


# The Planner's types of the composites' unrolled fields (simulator.config.models.PlannerKnobs).
COMPOSITE_FIELD_TYPES: dict[str, Any] = {
    "enable_throughput_scaling": StrictBool,
    "enable_load_scaling": StrictBool,
    "throughput_adjustment_interval_seconds": PosInt | None,
    "load_adjustment_interval_seconds": PosFloat | None,
    "max_num_fpm_samples": PosInt,
    "fpm_sample_bucket_size": Annotated[PosInt, AfterValidator(_perfect_square)],
    "load_scaling_down_sensitivity": Annotated[Int, Field(ge=0, le=100)],
    "load_min_observations": NonNegInt,
    "load_predictor": Literal[PREDICTOR_FAMILIES],
    "load_predictor_log1p": StrictBool,
    "prophet_window_size": PosInt,
    "kalman_q_level": NonNegFloat,
    "kalman_q_trend": NonNegFloat,
    "kalman_r": PosFloat,
    "kalman_min_points": PosInt,
}


@cache
def _adapter(key: str) -> TypeAdapter:
    return TypeAdapter(COMPOSITE_FIELD_TYPES[key])


def check_field_value(key: str, value: Any, where: str) -> Any:
    """``value`` of the unrolled field ``key``, checked with the Planner's type. Plain JSON values are
    kept as given (a dict equal to a preset unrolls exactly like it); others (numpy) are converted."""
    from aisim.simulator.config.loading import format_validation_error  # (loading imports the config models)

    try:
        checked = _adapter(key).validate_python(value)
    except ValidationError as exc:
        raise InputError(where, format_validation_error(exc).message) from None
    return value if type(value) in (bool, int, float, str, type(None)) else checked


def same_value(a: Any, b: Any) -> bool:
    """Equal as a config value: numbers by value (1 == 1.0) but never a bool for a number,
    mappings key by key."""
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        return (isinstance(a, Mapping) and isinstance(b, Mapping) and a.keys() == b.keys()
                and all(same_value(a[k], b[k]) for k in a))
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, Real) and isinstance(b, Real):
        return a == b
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    return a == b


def show(values) -> str:
    """Choices as a user writes them: ``vllm, sglang`` / ``0.0, 0.5``; dicts as ``{...}``."""
    return ", ".join(str(v) if not isinstance(v, Mapping) else repr(dict(v)) for v in values)


# -- knob kinds ------------------------------------------------------------------------------
def _choice_list(value: Any) -> tuple:
    if isinstance(value, Mapping) or not isinstance(value, (list, tuple)):
        raise ValueError(f"is searched: give a list of values (a one-element list [x] pins it), got {value!r}")
    if not value:
        raise ValueError("an empty list searches nothing; give at least one value (one value pins the knob)")
    return tuple(value)


def _distinct(values: tuple) -> tuple:
    for i, v in enumerate(values):
        if any(same_value(v, w) for w in values[:i]):
            raise ValueError(f"lists {show([v])} twice; list each value once")
    return values


def _one_value(value: Any) -> Any:
    if isinstance(value, (list, tuple, Mapping)):
        raise ValueError(f"is never searched: give one value, not {type(value).__name__} {value!r}")
    return value


def _searched(tp):
    return Annotated[tuple[tp, ...], BeforeValidator(_choice_list), AfterValidator(_distinct)]


# numeric router knobs: their legal bounds (our choice: any value in them may be searched; the
# reference's default grids are ``presets.DEFAULTS``)
ROUTER_BOUNDS: dict[str, tuple[float, float]] = {
    "overlap_score_credit": (0.0, 1.0), "host_cache_hit_weight": (0.0, 1.0), "disk_cache_hit_weight": (0.0, 1.0),
    "prefill_load_scale": (0.0, math.inf), "router_temperature": (0.0, math.inf),
}


def _router_choices(knob: str):
    """A numeric router knob: a list of values within the knob's legal bounds (``ROUTER_BOUNDS``)."""
    lo, hi = ROUTER_BOUNDS[knob]

    def check(values: tuple) -> tuple:
        for v in values:
            if not lo <= v <= hi:
                raise ValueError(f"{v!r} is outside {_bounds_text(lo, hi)}; give values in it")
        return values
    return Annotated[tuple[NonNegFloat, ...], BeforeValidator(_choice_list), AfterValidator(_distinct),
                     AfterValidator(check)]


def _bounds_text(lo: float, hi: float) -> str:
    return f"[{lo}, {hi}]" if hi != math.inf else f">= {lo}"


def _pinned(tp):
    return Annotated[tp, BeforeValidator(_one_value)]


def _choices(knob: str):
    return Literal[ALLOWED_CHOICES[knob]]


# -- composites ------------------------------------------------------------------------------
def _composite_dict(knob: str, entry: Mapping, where: str) -> dict[str, Any]:
    allowed, required = COMPOSITE_DICT_KEYS[knob], COMPOSITE_REQUIRED_KEYS[knob]
    fields = COMPOSITE_FIELDS[knob]
    for key in entry:
        if key not in allowed:
            raise InputError(f"{where}.{key}", f"unknown key; a {knob} dict takes {', '.join(fields)}")
    missing = [key for key in fields if key in required and key not in entry]
    if missing:
        raise InputError(f"{where}.{missing[0]}", f"is missing: a {knob} dict pins the unrolled fields directly "
                                                  f"(no merge with a preset), so it needs "
                                                  f"{', '.join(k for k in fields if k in required)}")
    out = {key: check_field_value(key, value, f"{where}.{key}") for key, value in entry.items()}
    if knob == "planner_scaling_policy":
        _check_intervals(out, where)
    if knob == "load_predictor_candidates":
        _check_family_keys(out, where)
    return out


def _check_intervals(fields: Mapping[str, Any], where: str) -> None:
    """Each scaling loop the policy turns on needs its own interval (the other may stay null)."""
    for flag, key in (("enable_throughput_scaling", "throughput_adjustment_interval_seconds"),
                      ("enable_load_scaling", "load_adjustment_interval_seconds")):
        if fields[flag] and fields[key] is None:
            raise InputError(f"{where}.{key}", f"is null, but the policy sets {flag}: give the interval in "
                                               f"seconds (null only while {flag} is false)")


def _check_family_keys(fields: Mapping[str, Any], where: str) -> None:
    family = fields["load_predictor"]
    for other, keys in PREDICTOR_FAMILY_KEYS.items():
        for key in keys:
            if key in fields and other != family:
                raise InputError(f"{where}.{key}", f"tunes the {other} predictor, but load_predictor is {family}; "
                                                   "remove it")


def _composite_entry(knob: str, entry: Any, where: str) -> str | dict[str, Any]:
    if isinstance(entry, str):
        if entry not in PRESET_EXPANSIONS[knob]:
            raise InputError(where, f"unknown {knob} preset {entry!r}; use one of "
                                    f"{show(ALLOWED_CHOICES[knob])}, or a dict of its unrolled fields")
        return entry
    if isinstance(entry, Mapping):
        return _composite_dict(knob, entry, where)
    raise InputError(where, f"give a {knob} preset id or a dict of its unrolled fields "
                            f"({', '.join(COMPOSITE_FIELDS[knob])}), not {entry!r}")


def check_composite_entry(knob: str, entry: Any, where: str) -> str | dict[str, Any]:
    """One entry of a composite knob (a preset id or a dict of its fields), checked; errors at ``where``."""
    return _composite_entry(knob, entry, where)


def _composite(knob: str):
    def check(value: Any) -> tuple:
        entries = _choice_list(value)
        return tuple(_composite_entry(knob, e, f"{SECTION}.{knob}.{i}") for i, e in enumerate(entries))
    return Annotated[tuple[Any, ...], BeforeValidator(check), AfterValidator(_distinct)]


# -- parallel shapes -------------------------------------------------------------------------
def _pinned_shapes(value: Any) -> tuple:
    """Each entry filled to a complete shape (omitted dims 1); its form (agg shape, or
    prefill/decode) must match the one deployment_mode, checked by the model."""
    if isinstance(value, Mapping) or not isinstance(value, (list, tuple)):
        raise ValueError(f"give a list of shapes ([{{tp: 2}}] pins one), got {value!r}")
    out = []
    for i, raw in enumerate(value):
        mode = "disagg" if isinstance(raw, Mapping) and any(role in raw for role in ROLES) else "agg"
        out.append(check_parallel_config(mode, raw, f"{SECTION}.parallel_configs.{i}", fill=True))
    return tuple(out)


_ParallelConfigs = Annotated[tuple[Any, ...], BeforeValidator(_pinned_shapes), AfterValidator(_distinct)]


# -- the section -----------------------------------------------------------------------------
class SearchSpace(Strict):
    """The validated ``search_space:`` section (immutable). Build it with ``from_dict``; searched
    knobs hold tuples of choices, composites tuples of preset ids / dicts."""

    model_config = ConfigDict(validate_default=True)

    deployment_mode: _searched(_choices("deployment_mode")) = DEFAULTS["deployment_mode"]
    backend: _searched(_choices("backend")) = DEFAULTS["backend"]
    parallel_configs: _ParallelConfigs = DEFAULTS["parallel_configs"]
    model_name: _pinned(Name | None) = DEFAULTS["model_name"]
    hardware_sku: _pinned(Name | None) = DEFAULTS["hardware_sku"]
    gpu_budget: _pinned(PosInt) = DEFAULTS["gpu_budget"]
    min_gpu_budget: _pinned(NonNegInt | None) = DEFAULTS["min_gpu_budget"]
    min_endpoint: _pinned(NonNegInt | None) = DEFAULTS["min_endpoint"]
    context_length: _pinned(PosInt | None) = DEFAULTS["context_length"]
    startup_time: _pinned(NonNegFloat | None) = DEFAULTS["startup_time"]
    aic_nextn: _pinned(NonNegInt | None) = DEFAULTS["aic_nextn"]
    prefill_max_num_batched_tokens: _searched(PosInt) = DEFAULTS["prefill_max_num_batched_tokens"]
    prefill_max_num_seqs: _searched(PosInt) = DEFAULTS["prefill_max_num_seqs"]
    prefill_block_size: _pinned(PosInt) = DEFAULTS["prefill_block_size"]
    prefill_gpu_memory_utilization: _pinned(Fraction01) = DEFAULTS["prefill_gpu_memory_utilization"]
    prefill_enable_prefix_caching: _pinned(StrictBool) = DEFAULTS["prefill_enable_prefix_caching"]
    decode_max_num_batched_tokens: _searched(PosInt) = DEFAULTS["decode_max_num_batched_tokens"]
    decode_max_num_seqs: _searched(PosInt) = DEFAULTS["decode_max_num_seqs"]
    decode_block_size: _pinned(PosInt) = DEFAULTS["decode_block_size"]
    decode_gpu_memory_utilization: _pinned(Fraction01) = DEFAULTS["decode_gpu_memory_utilization"]
    decode_enable_prefix_caching: _pinned(StrictBool) = DEFAULTS["decode_enable_prefix_caching"]
    agg_max_num_batched_tokens: _searched(PosInt) = DEFAULTS["agg_max_num_batched_tokens"]
    agg_max_num_seqs: _searched(PosInt) = DEFAULTS["agg_max_num_seqs"]
    agg_block_size: _pinned(PosInt) = DEFAULTS["agg_block_size"]
    agg_gpu_memory_utilization: _pinned(Fraction01) = DEFAULTS["agg_gpu_memory_utilization"]
    agg_enable_prefix_caching: _pinned(StrictBool) = DEFAULTS["agg_enable_prefix_caching"]
    num_g2_blocks: _pinned(NonNegInt) = DEFAULTS["num_g2_blocks"]
    kv_bytes_per_token: _pinned(PosInt | None) = DEFAULTS["kv_bytes_per_token"]
    bandwidth_g1_to_g2_gbps: _pinned(PosFloat | None) = DEFAULTS["bandwidth_g1_to_g2_gbps"]
    bandwidth_g2_to_g1_gbps: _pinned(PosFloat | None) = DEFAULTS["bandwidth_g2_to_g1_gbps"]
    offload_batch_size: _pinned(PosInt | None) = DEFAULTS["offload_batch_size"]
    router_mode: _searched(_choices("router_mode")) = DEFAULTS["router_mode"]
    overlap_score_credit: _router_choices("overlap_score_credit") = DEFAULTS["overlap_score_credit"]
    prefill_load_scale: _router_choices("prefill_load_scale") = DEFAULTS["prefill_load_scale"]
    host_cache_hit_weight: _router_choices("host_cache_hit_weight") = DEFAULTS["host_cache_hit_weight"]
    disk_cache_hit_weight: _router_choices("disk_cache_hit_weight") = DEFAULTS["disk_cache_hit_weight"]
    router_temperature: _router_choices("router_temperature") = DEFAULTS["router_temperature"]
    active_decode_blocks_threshold: _pinned(NonNegFloat | None) = DEFAULTS["active_decode_blocks_threshold"]
    active_prefill_tokens_threshold: _pinned(NonNegInt | None) = DEFAULTS["active_prefill_tokens_threshold"]
    active_prefill_tokens_threshold_frac: _pinned(NonNegFloat | None) = \
        DEFAULTS["active_prefill_tokens_threshold_frac"]
    no_admission_control: _pinned(StrictBool) = DEFAULTS["no_admission_control"]
    planner_scaling_policy: _composite("planner_scaling_policy") = DEFAULTS["planner_scaling_policy"]
    planner_fpm_sampling: _composite("planner_fpm_sampling") = DEFAULTS["planner_fpm_sampling"]
    planner_load_sensitivity: _composite("planner_load_sensitivity") = DEFAULTS["planner_load_sensitivity"]
    load_predictor_candidates: _composite("load_predictor_candidates") = DEFAULTS["load_predictor_candidates"]

    @classmethod
    def from_dict(cls, mapping: Mapping[str, Any] | None) -> "SearchSpace":
        """The section as written in YAML (None or {}: every default)."""
        if mapping is None:
            mapping = {}
        if not isinstance(mapping, Mapping):
            raise InputError(SECTION, f"must be a mapping of knob -> value, not {type(mapping).__name__}")
        for key in mapping:
            if key not in cls.model_fields:
                raise InputError(f"{SECTION}.{key}", _unknown_knob(key))
        data, ranges = _take_ranges(mapping)
        try:
            space = cls.model_validate(data)
        except ValidationError as exc:
            from aisim.simulator.config.loading import format_validation_error

            err = format_validation_error(exc)
            raise InputError(f"{SECTION}.{err.where}", err.message, category=err.category) from None
        for knob, rng in ranges.items():  # validated through its endpoints; held as the Range
            object.__setattr__(space, knob, rng)
        return space

    @model_serializer(mode="plain")
    def _serialize(self) -> dict[str, Any]:
        return self.to_dict()

    @model_validator(mode="after")
    def _rules(self) -> "SearchSpace":
        _check_gpu_bounds(self)
        _check_pinned_shapes(self)
        _check_admission(self)
        return self

    # -- gating (what a sampler searches) --
    @property
    def kv_router_searched(self) -> bool:
        """Some trial may route with kv_router, so the kv-router knobs are searched."""
        return "kv_router" in self.router_mode

    @property
    def cache_hit_weights_searched(self) -> bool:
        """The two cache-hit weights are searched: kv_router possible and multi-tier offload on."""
        return self.kv_router_searched and self.num_g2_blocks > 0

    @property
    def planner_tuning_searched(self) -> bool:
        """Some scaling policy turns scaling on, so fpm sampling and load sensitivity are searched."""
        return any(scaling_is_on(entry) for entry in self.planner_scaling_policy)

    def branch_choices(self, mode: str) -> dict[str, tuple]:
        """The knobs a sampler draws in ``mode``'s branch (its own study), each with its choices,
        in emission order. A knob with one choice is pinned."""
        if mode not in self.deployment_mode:
            raise ValueError(f"{mode!r} is not a deployment_mode of this space ({show(self.deployment_mode)})")
        out: dict[str, tuple] = {"deployment_mode": (mode,), "backend": self.backend}
        out.update({knob: getattr(self, knob) for knob in BATCHING_KNOBS[mode]})
        out["router_mode"] = self.router_mode
        if self.kv_router_searched:
            out.update({knob: getattr(self, knob) for knob in KV_ROUTER_KNOBS
                        if knob not in CACHE_HIT_WEIGHTS or self.cache_hit_weights_searched})
        out["planner_scaling_policy"] = self.planner_scaling_policy
        if self.planner_tuning_searched:
            out.update({knob: getattr(self, knob) for knob in PLANNER_TUNING})
        return out

    def to_dict(self) -> dict[str, Any]:
        """The resolved section as plain JSON values (lists, dicts), every knob present."""
        return {name: _jsonable(getattr(self, name)) for name in type(self).model_fields}


def _take_ranges(mapping: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Range]]:
    """The mapping with every ``{range: ...}`` knob made plain: a stepped range becomes its list of
    choices, a continuous one its two endpoints (so the field's type checks them) and is returned
    apart, to be held as the ``Range`` once validated."""
    data, ranges = dict(mapping), {}
    for knob, value in mapping.items():
        if not (isinstance(value, Mapping) and "range" in value):
            continue
        if knob not in RANGE_KNOBS:
            raise InputError(f"{SECTION}.{knob}", "takes no range; give a list of values (a range is for the batching "
                                                  "and numeric router knobs)")
        if len(value) != 1:
            raise InputError(f"{SECTION}.{knob}", "a range domain is {range: {min, max, step, scale}} alone")
        got = parse_range(value["range"], f"{SECTION}.{knob}.range", integer=RANGE_KNOBS[knob])
        if isinstance(got, Range):
            ranges[knob] = got
            got = (got.low, got.high)
        data[knob] = list(got)
    return data, ranges


def _jsonable(value: Any) -> Any:
    if isinstance(value, Range):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def _unknown_knob(key: Any) -> str:
    close = difflib.get_close_matches(str(key), list(SearchSpace.model_fields), n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return f"unknown knob; {hint}remove it or fix its spelling"


# -- rules across knobs ----------------------------------------------------------------------
def _check_gpu_bounds(space: SearchSpace) -> None:
    if space.min_gpu_budget is not None and space.min_gpu_budget > space.gpu_budget:
        raise InputError(f"{SECTION}.min_gpu_budget", f"is {space.min_gpu_budget}, above gpu_budget "
                                                      f"{space.gpu_budget}; lower it or raise gpu_budget")


def _check_pinned_shapes(space: SearchSpace) -> None:
    if not space.parallel_configs:
        return
    if len(space.deployment_mode) != 1:
        raise InputError(f"{SECTION}.parallel_configs", f"pins the parallel shape, which needs exactly one "
                                                        f"deployment_mode (got {show(space.deployment_mode)}); "
                                                        "list one mode ([agg] or [disagg]) or remove parallel_configs")
    mode = space.deployment_mode[0]
    for i, shape in enumerate(space.parallel_configs):
        is_disagg = set(shape) == set(ROLES)
        if is_disagg != (mode == "disagg"):
            form = ("{prefill: shape, decode: shape}" if mode == "disagg"
                    else "one shape (tp, pp, attention_dp, moe_tp, moe_ep, replicas)")
            raise InputError(f"{SECTION}.parallel_configs.{i}", f"does not match deployment_mode {mode}: "
                                                                f"give {form}")


def _check_admission(space: SearchSpace) -> None:
    if not space.kv_router_searched:
        return
    for knob in ROUTER_ADMISSION:
        if getattr(space, knob) != DEFAULTS[knob]:
            raise InputError(f"{SECTION}.{knob}", "is reserved and rejected in a search that includes kv_router: "
                                                  "Dynamo replay cannot model router admission control yet; "
                                                  "remove it")
