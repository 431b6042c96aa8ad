"""The ``planner.retune`` section (reference §6, seed "Simulate Retune"): its keys, their search
domains, and every requirement and rejection the seed states, checked before anything runs.

The same block is the YAML ``planner.retune`` and the Python API's ``planner_config["retune"]``
(PlannerConfig names). ``RetuneConfig`` checks the section itself, ``resolve`` the rules that need
the Planner (called by ``simulator.planning.lower_planner``); the traffic and router a retune
needs are checked with the other cross-section rules (``simulator.config.rules``), the recorded
history against the replayed trace when the plan is built (``simulator.traffic.history``). Every error is
one line naming the key and the fix. Keys, defaults, domains and requirements: docs/retune-config.md.
"""

from __future__ import annotations

import math
import os
from functools import cache
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, TypeAdapter, ValidationError, field_validator, model_validator
from pydantic import Strict as StrictType
from pydantic_core import InitErrorDetails, PydanticCustomError

from aisim.simulator.config.models import (
    ROUTER_RESERVED,
    Float,
    Int,
    NonNegFloat,
    NonNegInt,
    PosFloat,
    PosInt,
    Strict,
)
from aisim.simulator.errors import InputError

__all__ = ["Domain", "RouterDomains", "PlannerDomains", "RetuneConfig", "ROUTER_KNOBS", "ROUTER_DEFAULT_DOMAINS",
           "PLANNER_KNOBS", "DEFAULT_SENSITIVITY_DOMAIN", "PRESET_MAX_PROPHET_WINDOW", "resolve"]


# -- knobs -------------------------------------------------------------------------------
# knob -> (kind, value type). kind: "int" | "float" (ranges allowed) | "choice" (values only)
ROUTER_KNOBS: dict[str, tuple[str, Any]] = {
    "overlap_score_credit": ("float", Annotated[Float, Field(ge=0, le=1, allow_inf_nan=False)]),
    "prefill_load_scale": ("float", NonNegFloat),
    "temperature": ("float", NonNegFloat),
}

# The Planner runtime knobs retune may search (our choice of allow-list): knob -> (kind, value
# type, what must run for the knob to act, predictor family it belongs to). Intervals, budgets,
# minimum workers and the FPM sample stores are not runtime knobs (they shape the tick, the GPU
# band or the performance model), so retune does not change them.
PLANNER_KNOBS: dict[str, tuple[str, Any, str, str | None]] = {
    "load_scaling_down_sensitivity": ("int", Annotated[Int, Field(ge=0, le=100)], "load", None),
    "load_min_observations": ("int", NonNegInt, "perf_model", None),
    "max_throughput_scaling_replicas": ("int", PosInt, "throughput", None),
    "load_predictor": ("choice", Literal["constant", "arima", "prophet", "kalman"], "throughput", None),
    "load_predictor_log1p": ("choice", Annotated[bool, StrictType()], "throughput", None),
    "prophet_window_size": ("int", PosInt, "throughput", "prophet"),
    "kalman_q_level": ("float", NonNegFloat, "throughput", "kalman"),
    "kalman_q_trend": ("float", NonNegFloat, "throughput", "kalman"),
    "kalman_r": ("float", PosFloat, "throughput", "kalman"),
    "kalman_min_points": ("int", PosInt, "throughput", "kalman"),
}

# why each reserved router knob cannot be retuned (the seed's reason, with the replay's own)
_NOT_RETUNABLE = {
    "host_cache_hit_weight": "it also sets how the startup router counts cached tokens, which a runtime update "
                             "does not change",
    "disk_cache_hit_weight": "it also sets how the startup router counts cached tokens, which a runtime update "
                             "does not change",
    "shared_cache_multiplier": "replay reports no shared cache hits for it",
}

PRESET_MAX_PROPHET_WINDOW = 50  # the largest prophet_window_size among the predictor presets (§5.2)


def _loc_error(title: str, loc: tuple, message: str, value: Any) -> ValidationError:
    """A validation error at ``loc`` (relative to the model being validated), with ``message``."""
    return ValidationError.from_exception_data(title, [InitErrorDetails(
        type=PydanticCustomError("value_error", "{message}", {"message": message}), loc=loc, input=value)])


@cache
def _adapter(tp) -> TypeAdapter:
    return TypeAdapter(tp)


def _check_value(tp, value, what: str = "") -> Any:
    """``value`` validated as ``tp``; a bad one raises ValueError with the config's wording."""
    from aisim.simulator.config.loading import format_validation_error  # (loading imports the models)

    if value is None:
        raise ValueError(f"{what}null is not a value; give one")
    try:
        return _adapter(tp).validate_python(value)
    except ValidationError as exc:
        raise ValueError(what + format_validation_error(exc).message) from None


# -- domains -----------------------------------------------------------------------------
class Domain(Strict):
    """One knob's candidates: ``values`` (one value pins the knob) or a range ``low``..``high``
    (with ``step``: a grid; without: continuous, uniform or ``log``-uniform)."""

    values: tuple[Int | Float | bool | str, ...] | None = None
    low: Int | Float | None = None
    high: Int | Float | None = None
    step: Int | Float | None = None
    log: bool = False

    @property
    def pinned(self) -> bool:
        return self.values is not None and len(self.values) == 1

    @property
    def continuous(self) -> bool:
        return self.values is None and self.step is None

    def points(self) -> tuple:
        """The grid points (``values``, or low, low + step, ... <= high); a continuous domain has none."""
        if self.values is not None:
            return self.values
        if self.step is None:
            raise ValueError("a continuous domain has no grid points")
        n = int(math.floor((self.high - self.low) / self.step + 1e-9))
        if isinstance(self.step, int) and isinstance(self.low, int):
            return tuple(self.low + i * self.step for i in range(n + 1))
        return tuple(round(self.low + i * self.step, 12) for i in range(n + 1))


_RANGE_KEYS = ("low", "high", "step", "log")


def _parse_domain(raw, kind: str, tp) -> Domain | None:
    if raw is None or isinstance(raw, Domain):
        return raw
    if isinstance(raw, (list, tuple)):
        if not raw:
            raise ValueError("an empty list searches nothing; list at least one value (a scalar pins the knob)")
        vals = [_check_value(tp, v, f"list item {i}: ") for i, v in enumerate(raw)]
        for i, v in enumerate(vals):
            if any(type(v) is type(w) and v == w for w in vals[:i]):
                raise ValueError(f"lists {v!r} twice; list each value once")
        return Domain(values=tuple(vals))
    if isinstance(raw, dict):
        if kind == "choice":
            raise ValueError("is categorical: give a value (pins it) or a list of values, not a range")
        unknown = [k for k in raw if k not in _RANGE_KEYS]
        if unknown:
            raise ValueError(f"unknown range key {unknown[0]!r}; a range is {{low, high, step}} (a grid), "
                             "{low, high} or {low, high, log: true}")
        if "low" not in raw or "high" not in raw:
            raise ValueError("a range needs low and high ({low, high, step} or {low, high, log: true})")
        low = _check_value(tp, raw["low"], "low: ")
        high = _check_value(tp, raw["high"], "high: ")
        if not low < high:
            raise ValueError(f"range low ({low!r}) must be below high ({high!r}); a scalar pins the knob")
        log = raw.get("log", False)
        if not isinstance(log, bool):
            raise ValueError(f"range log must be true or false, got {log!r}")
        step = raw.get("step")
        if step is not None:
            if log:
                raise ValueError("a range takes step or log: true, not both; drop step for a log-uniform search "
                                 "(sampler tpe or random) or drop log for a grid")
            step = _check_value(PosInt if kind == "int" else PosFloat, step, "step: ")
        if log and low <= 0:
            raise ValueError(f"a log range needs low > 0, got {low!r}")
        return Domain(low=low, high=high, step=step, log=log)
    return Domain(values=(_check_value(tp, raw),))


def _domain_field(kind: str, tp):
    return Annotated[Domain | None, BeforeValidator(lambda v: _parse_domain(v, kind, tp))]


def _not_retunable(knob: str):
    def check(v):
        if v is None:
            return None
        extra = f" ({ROUTER_RESERVED[knob]})" if knob in ROUTER_RESERVED else ""
        raise ValueError(f"{knob} is not retunable: {_NOT_RETUNABLE[knob]}{extra}; remove it from retune.router")
    return Annotated[Any, BeforeValidator(check)]


_ROUTER_DEFAULTS = {
    "overlap_score_credit": (0.0, 0.5, 1.0),
    "prefill_load_scale": (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0),
    "temperature": (0.0, 0.2, 0.5, 1.0),
}
ROUTER_DEFAULT_DOMAINS: dict[str, Domain] = {k: Domain(values=v) for k, v in _ROUTER_DEFAULTS.items()}
DEFAULT_SENSITIVITY_DOMAIN = Domain(values=(70, 80, 90))


class RouterDomains(Strict):
    """``retune.router``: the KV-router knobs searched; an omitted knob searches its default domain."""

    overlap_score_credit: _domain_field(*ROUTER_KNOBS["overlap_score_credit"]) = None
    prefill_load_scale: _domain_field(*ROUTER_KNOBS["prefill_load_scale"]) = None
    temperature: _domain_field(*ROUTER_KNOBS["temperature"]) = None
    host_cache_hit_weight: _not_retunable("host_cache_hit_weight") = None
    disk_cache_hit_weight: _not_retunable("disk_cache_hit_weight") = None
    shared_cache_multiplier: _not_retunable("shared_cache_multiplier") = None

    @model_validator(mode="before")
    @classmethod
    def _known(cls, data):
        if isinstance(data, dict):
            for k, v in data.items():
                if k not in ROUTER_KNOBS and k not in _NOT_RETUNABLE:
                    raise _loc_error("RouterDomains", (k,), f"unknown router knob; retune.router takes "
                                     f"{', '.join(ROUTER_KNOBS)}", v)
        return data

    def given(self) -> dict[str, Domain]:
        """The domains the section sets."""
        return {k: getattr(self, k) for k in ROUTER_KNOBS if getattr(self, k) is not None}

    def domains(self) -> dict[str, Domain]:
        """Every knob's domain: the given one, else the default."""
        return {k: getattr(self, k) or ROUTER_DEFAULT_DOMAINS[k] for k in ROUTER_KNOBS}


class PlannerDomains(Strict):
    """``retune.planner`` as a map: the Planner runtime knobs searched (only those given)."""

    load_scaling_down_sensitivity: _domain_field(*PLANNER_KNOBS["load_scaling_down_sensitivity"][:2]) = None
    load_min_observations: _domain_field(*PLANNER_KNOBS["load_min_observations"][:2]) = None
    max_throughput_scaling_replicas: _domain_field(*PLANNER_KNOBS["max_throughput_scaling_replicas"][:2]) = None
    load_predictor: _domain_field(*PLANNER_KNOBS["load_predictor"][:2]) = None
    load_predictor_log1p: _domain_field(*PLANNER_KNOBS["load_predictor_log1p"][:2]) = None
    prophet_window_size: _domain_field(*PLANNER_KNOBS["prophet_window_size"][:2]) = None
    kalman_q_level: _domain_field(*PLANNER_KNOBS["kalman_q_level"][:2]) = None
    kalman_q_trend: _domain_field(*PLANNER_KNOBS["kalman_q_trend"][:2]) = None
    kalman_r: _domain_field(*PLANNER_KNOBS["kalman_r"][:2]) = None
    kalman_min_points: _domain_field(*PLANNER_KNOBS["kalman_min_points"][:2]) = None

    @model_validator(mode="before")
    @classmethod
    def _known(cls, data):
        if isinstance(data, dict):
            if not data:
                raise _loc_error("PlannerDomains", (), "an empty map searches nothing; give Planner knob -> domain, "
                                 "or default", data)
            for k, v in data.items():
                if k not in PLANNER_KNOBS:
                    raise _loc_error("PlannerDomains", (k,), "not a Planner runtime knob retune can change "
                                     f"(retune.planner takes {', '.join(PLANNER_KNOBS)}, or default)", v)
        return data

    def given(self) -> dict[str, Domain]:
        return {k: getattr(self, k) for k in PLANNER_KNOBS if getattr(self, k) is not None}


# -- the section -------------------------------------------------------------------------
class RetuneConfig(Strict):
    """``planner.retune`` (YAML) / ``planner_config["retune"]`` (API). After ``resolve`` (the
    PlannerConfig carries the resolved section): ``timeout_seconds``, ``sla_ttft_ms`` and
    ``sla_itl_ms`` are set, and ``history_seconds`` is set exactly when throughput scaling runs."""

    interval_seconds: PosFloat
    grace_seconds: NonNegFloat = 60.0
    router: RouterDomains | None = None
    planner: PlannerDomains | Literal["default"] | None = None
    decision_latency_seconds: Literal["measured"] | NonNegFloat = 0.0
    decision_latency_scale: PosFloat = 1.0
    timeout_seconds: PosFloat | None = None
    max_parallel: PosInt | None = None
    min_improvement_percentage: NonNegFloat = 3.0
    sla_ttft_ms: PosFloat | None = None
    sla_itl_ms: PosFloat | None = None
    history_seconds: PosFloat | None = None
    sampler: Literal["grid", "tpe", "random"] = "grid"
    max_candidates: PosInt | None = None
    warm_start: bool = False
    early_drop: bool = False  # stop candidates that cannot clear the keep rule (search.retune.early)

    @field_validator("planner", mode="wrap")
    @classmethod
    def _planner(cls, v, handler):
        if isinstance(v, dict):
            return PlannerDomains.model_validate(v)  # its errors keep their knob's location
        if v is None or v == "default" or isinstance(v, PlannerDomains):
            return handler(v)
        raise ValueError(f"takes default or a map of Planner runtime knob -> domain, got {v!r}")

    @model_validator(mode="after")
    def _rules(self):
        def fail(loc: tuple, message: str, value=None):
            raise _loc_error("RetuneConfig", loc, message, value)

        if self.sampler in ("tpe", "random") and self.max_candidates is None:
            fail(("max_candidates",), f"sampler {self.sampler} draws max_candidates points per sweep; set "
                                      "max_candidates >= 1", None)
        if self.sampler == "grid" and self.max_candidates is not None:
            fail(("max_candidates",), "applies only to sampler tpe or random (grid evaluates every point of the "
                                      "domain); remove it or set sampler: tpe", self.max_candidates)
        if self.sampler == "grid":
            planner = self.planner.given() if isinstance(self.planner, PlannerDomains) else {}
            for section, doms in (("router", self.router.given() if self.router else {}), ("planner", planner)):
                for knob, d in doms.items():
                    if d.continuous:
                        shape = "{low, high, log: true}" if d.log else "{low, high} without step"
                        fail((section, knob), f"{shape} is a continuous domain, which sampler grid cannot enumerate; "
                                              "add a step (or list the values), or set sampler: tpe (or random) "
                                              "with max_candidates", None)
        if self.early_drop and self.sampler == "tpe":
            fail(("early_drop",), "tpe learns from every candidate's score and a dropped candidate has none, so the "
                                  "sweep would differ from the full one; use sampler grid or random, or set "
                                  "early_drop: false", True)
        if self.decision_latency_scale != 1 and self.decision_latency_seconds != "measured":
            fail(("decision_latency_scale",), "scales the measured sweep time only; set decision_latency_seconds: "
                                              "measured, or remove decision_latency_scale", self.decision_latency_scale)
        if self.decision_latency_scale > 1:
            bound = self.interval_seconds / self.decision_latency_scale
            timeout = self.timeout_seconds
            if timeout is None or timeout > bound:
                now = (f"the default timeout (interval_seconds, {self.interval_seconds:g} s)" if timeout is None
                       else f"{timeout:g} s")
                fail(("timeout_seconds",), f"with decision_latency_scale {self.decision_latency_scale:g} a sweep's "
                                           f"scaled time must fit in one window: set timeout_seconds <= "
                                           f"interval_seconds / decision_latency_scale = {bound:g} s ({now} is "
                                           "longer)", timeout)
        return self

    @property
    def parallel(self) -> int:
        """Worker processes per sweep: ``max_parallel``, else the CPU count."""
        return self.max_parallel or os.cpu_count() or 1

    def router_domains(self) -> dict[str, Domain]:
        """Router knob -> domain searched ({} when the router is not retuned)."""
        return self.router.domains() if self.router is not None else {}

    def planner_domains(self, load_scaling: bool) -> dict[str, Domain]:
        """Planner knob -> domain searched; ``default`` searches the load-scaling sensitivity when load
        scaling runs (its predictor pre-sweep is ``predictor_presweep``)."""
        if self.planner == "default":
            return {"load_scaling_down_sensitivity": DEFAULT_SENSITIVITY_DOMAIN} if load_scaling else {}
        return self.planner.given() if self.planner is not None else {}

    def predictor_presweep(self, throughput_scaling: bool) -> bool:
        """``planner: default`` with throughput scaling runs the pre-sweep over the predictor presets."""
        return self.planner == "default" and throughput_scaling


# -- rules that need the Planner ------------------------------------------------------------
def _multiple_of(interval: float, tick: float) -> bool:
    k = interval / tick
    return round(k) >= 1 and abs(k - round(k)) <= 1e-9 * max(1.0, k)


def resolve(rc: RetuneConfig, *, field: str, tick_s: float, throughput: bool, load: bool, target: str,
            load_predictor: str, throughput_interval_s: float, ttft_ms: float, itl_ms: float) -> RetuneConfig:
    """Check the rules that need the Planner (``throughput``/``load``: the loops it runs) and fill
    the defaults that come from it; ``ttft_ms``/``itl_ms``: the scoring SLA's fallback
    (``evaluation.sla``, else the Planner's own). ``field``: how errors name the planner
    (``planner`` or ``planner_config``)."""
    where = f"{field}.retune"
    if not _multiple_of(rc.interval_seconds, tick_s):
        lo = max(1, math.floor(rc.interval_seconds / tick_s)) * tick_s
        raise InputError(f"{where}.interval_seconds", f"must be a multiple of the Planner tick ({tick_s:g} s), so "
                                                      f"windows end on ticks; got {rc.interval_seconds:g}, use e.g. "
                                                      f"{lo:g} or {lo + tick_s:g}")
    if not throughput and not load and rc.planner is not None:
        raise InputError(f"{where}.planner", "retune-only mode (enable_throughput_scaling and enable_load_scaling "
                                             "both false) never scales, so no Planner field is tuned; remove "
                                             "retune.planner or turn a scaling loop on")
    if isinstance(rc.planner, PlannerDomains):
        given = rc.planner.given()
        searched = given.get("load_predictor")
        families = {load_predictor} | (set(searched.points()) if searched is not None else set())
        for knob in given:
            _, _, needs, family = PLANNER_KNOBS[knob]
            if needs == "load" and not load:
                raise InputError(f"{where}.planner.{knob}", "acts only while load scaling runs, which is off here "
                                                            "(target sla with enable_load_scaling false); remove it")
            if needs == "throughput" and not throughput:
                raise InputError(f"{where}.planner.{knob}", "acts only while throughput scaling runs (target sla with "
                                                            "enable_throughput_scaling true), which is off here; "
                                                            "remove it")
            if needs == "perf_model" and target != "sla":
                raise InputError(f"{where}.planner.{knob}", "is the performance model's cold-start threshold, which "
                                                            f"only target sla uses (target is {target}); remove it")
            if family is not None and family not in families:
                raise InputError(f"{where}.planner.{knob}", f"tunes the {family} predictor, but the Planner's "
                                                            f"load_predictor is {load_predictor} and retune.planner "
                                                            f"does not search {family}; add {family} to "
                                                            "retune.planner.load_predictor or remove the knob")
    if rc.history_seconds is not None and not throughput:
        raise InputError(f"{where}.history_seconds", "sizes the load-predictor history, which retune reads only with "
                                                     "throughput scaling (target sla); remove it")
    update: dict[str, Any] = {}
    if rc.timeout_seconds is None:
        update["timeout_seconds"] = rc.interval_seconds
    if rc.sla_ttft_ms is None:
        update["sla_ttft_ms"] = float(ttft_ms)
    if rc.sla_itl_ms is None:
        update["sla_itl_ms"] = float(itl_ms)
    if throughput and rc.history_seconds is None:
        update["history_seconds"] = float(throughput_interval_s * PRESET_MAX_PROPHET_WINDOW)
    return rc.model_copy(update=update) if update else rc
