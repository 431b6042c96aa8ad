"""Spica's search config (``aisim recommend -c search.yaml``): what is fixed, what is searched, what
is optimised and how, validated once; every bad value is one ``InputError`` (exit 2) whose ``where``
is the dotted key and whose message names the fix.

Sections (reference §7.1; "our choice" where it is silent):

- What is fixed, in the ``predict`` config's own names and models:

  * the traffic, described once: a predict ``traffic`` section (``load.type:
    kv_capacity_fraction`` allowed here, with a ``synthetic`` source) **or** a ``workload`` section:
    ``isl``, ``osl``, exactly one of ``concurrency`` | ``request_rate`` (Poisson requests/s, seeded
    by ``arrival_seed``, 42) | ``kv_load_ratio`` (the candidate's KV capacity in concurrency units; a
    number pins it, ``[min, max]`` searches it as a continuous knob), and exactly one of
    ``request_count`` | ``num_request_ratio`` (requests per unit of load: of the concurrency, or of
    the rate in requests/s, as predict's ``stop.requests_per_load_unit``). Our choice:
    ``concurrency`` and ``request_rate`` are fixed numbers; only ``kv_load_ratio`` takes a range.
  * ``engine``: ``model`` and ``hardware`` (each may instead be ``search_space.model_name`` /
    ``hardware_sku``, the seed's pinned scalars: exactly one place per value), ``timing`` (every
    role's timing model; default ``default``, measured), ``backend_version``,
    ``enable_chunked_prefill`` and ``kv_transfer`` (disaggregated candidates only). ``mode``,
    ``backend``, ``context_length`` and ``workers`` are searched: they are rejected here with the
    ``search_space`` knob to use instead.
  * ``evaluation`` (``sla``) and ``execution`` as in ``predict``.

- ``search_space``: ``search.spica.space.SearchSpace`` (its errors keep their ``search_space.``
  locations). The validated config holds the model and GPU there (``model_name``,
  ``hardware_sku``, filled from ``engine`` when given there), where ``unroll_sample`` reads them;
  ``cfg.model_name`` / ``cfg.hardware_sku`` read them too.
- ``optimization``: ``target`` (required: ``throughput``, ``throughput_per_gpu``,
  ``throughput_per_user``, ``goodput``, ``goodput_per_gpu``, ``ttft``, ``e2e_latency``,
  ``min_gpus``, ``pareto``), ``constraints`` {``min_candidate_gpus``, ``max_candidate_gpus``
  (null: ``search_space.gpu_budget``), ``min_goodput_rps`` (``min_gpus`` only)}, ``strict_sla``
  (false).
- ``optimizer``: ``algorithm`` ``tpe`` (default; ``bayesian``, the reference's name, is read as
  ``tpe``) | ``random`` | ``nsga2`` (``pareto`` only); ``max_trials`` 320; ``parallelism`` (null:
  the CPU count); ``candidate_timeout_seconds`` 600; ``seed`` 42.
- ``study``: ``storage`` (an Optuna storage URL; null: the journal file in the output directory),
  ``name`` ("spica").
- ``dgd`` (optional, deployment output; validated only): ``name`` (a Kubernetes name;
  ``{index}`` required with ``pareto``, forbidden otherwise), ``namespace``, at most one of
  ``output_file`` | ``output_dir``, ``renderer`` ``aic`` | ``direct``, ``runtime_image``,
  ``runtime_version_override``, ``num_gpus_per_node``.

Rules across sections: one traffic description; one source each for the model and the GPU (a
known GPU); goodput targets (``goodput``, ``goodput_per_gpu``, ``min_gpus``) need
``evaluation.sla.ttft_ms`` and ``itl_ms``; ``strict_sla`` needs an SLA; ``nsga2`` only for
``pareto``; ``min_gpus`` needs ``constraints.min_goodput_rps`` (at most the offered rate when it
is known), a fixed synthetic load (no ``kv_load_ratio``, no trace) and static pools (every
``planner_scaling_policy`` disabled); for a non-goodput target, throughput-scaling policies are
dropped before sampling (reference §7.1), so a space with no other policy is rejected;
``kv_transfer`` needs a disagg branch; ``min_candidate_gpus`` <= ``max_candidate_gpus`` and
<= ``gpu_budget``. Unknown keys anywhere (``launch_server``) fail with "Extra inputs are not
permitted".
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from numbers import Real
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, model_validator
from pydantic import Strict as StrictType

from aisim.search.spica.presets import scaling_fields
from aisim.search.spica.space import SearchSpace
from aisim.simulator.config.models import (
    Evaluation,
    Execution,
    Float,
    Int,
    KvCapacityFractionLoad,
    KvTransfer,
    PosFloat,
    PosInt,
    Strict,
    SyntheticSource,
    Timing,
    TraceSource,
    Traffic,
)
from aisim.simulator.errors import InputError

__all__ = ["SearchConfig", "load_search_config", "TARGETS", "GOODPUT_TARGETS", "PLANNER_TARGET"]

TARGETS: tuple[str, ...] = ("throughput", "throughput_per_gpu", "throughput_per_user", "goodput", "goodput_per_gpu",
                            "ttft", "e2e_latency", "min_gpus", "pareto")
GOODPUT_TARGETS: frozenset[str] = frozenset({"goodput", "goodput_per_gpu", "min_gpus"})
# the Planner target a candidate's enabled Planner runs under (reference §7.1)
PLANNER_TARGET: dict[str, str] = {
    "throughput": "throughput", "throughput_per_gpu": "throughput", "throughput_per_user": "throughput",
    "pareto": "throughput", "ttft": "latency", "e2e_latency": "latency",
    "goodput": "sla", "goodput_per_gpu": "sla", "min_gpus": "sla",
}

Name = Annotated[str, StrictType(), Field(min_length=1)]
_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _k8s_name(text: str) -> bool:
    """A Kubernetes resource name (DNS-1123 label): lowercase alphanumerics and '-', at most 63."""
    return len(text) <= 63 and _K8S_NAME.match(text) is not None


# -- fixed parts -----------------------------------------------------------------------------
def _fixed_number(knob: str):
    def check(v: Any) -> Any:
        if isinstance(v, (list, tuple, Mapping)):
            raise ValueError(f"is a fixed load: give one number ({knob}: N; only kv_load_ratio takes a [min, max] "
                             "range)")
        return v
    return BeforeValidator(check)


def _positive_number(x: Any) -> float:
    if isinstance(x, bool) or not isinstance(x, Real) or not 0 < x < math.inf:
        raise ValueError(f"must be a number > 0 (got {x!r})")
    return float(x)


def _kv_load_ratio(v: Any) -> Any:
    """A number > 0 (pinned), or a [min, max] range with 0 < min < max (searched)."""
    if v is None:
        return v
    if isinstance(v, (list, tuple)):
        if len(v) != 2:
            raise ValueError(f"a range is [min, max], two numbers (got {len(v)}); give one number to pin the ratio")
        lo, hi = (_positive_number(x) for x in v)
        if not lo < hi:
            raise ValueError(f"a range needs min < max (got [{v[0]}, {v[1]}]); give one number to pin the ratio")
        return (lo, hi)
    if isinstance(v, Mapping) or isinstance(v, str):
        raise ValueError(f"give a number (pinned) or a [min, max] range (searched), not {v!r}")
    return _positive_number(v)


class Workload(Strict):
    """A synthetic workload of fixed-length requests (reference §7.2 ``workload``)."""

    isl: PosInt
    osl: PosInt
    concurrency: Annotated[PosInt | None, _fixed_number("concurrency")] = None
    request_rate: Annotated[PosFloat | None, _fixed_number("request_rate")] = None
    kv_load_ratio: Annotated[float | tuple[float, float] | None, BeforeValidator(_kv_load_ratio)] = None
    request_count: PosInt | None = None
    num_request_ratio: PosFloat | None = None
    arrival_seed: Int = 42

    @model_validator(mode="after")
    def _one_each(self) -> "Workload":
        _exactly_one(self, ("concurrency", "request_rate", "kv_load_ratio"), "the load")
        _exactly_one(self, ("request_count", "num_request_ratio"), "how many requests to send")
        return self


def _exactly_one(w: Workload, keys: tuple[str, ...], what: str) -> None:
    given = [k for k in keys if getattr(w, k) is not None]
    if not given:
        raise InputError(f"workload.{keys[0]}", f"is missing: set exactly one of {', '.join(keys)} ({what})")
    if len(given) > 1:
        raise InputError(f"workload.{given[1]}", f"conflicts with workload.{given[0]}: set exactly one of "
                                                 f"{', '.join(keys)}")


# keys added to the config after studies were first stored: (section, key), dumped only when set
LATER_KEYS = (("engine", "nextn_accepted"), ("optimizer", "pruner"))

# engine keys a search does not fix: key -> where to set it instead
_SEARCHED_ENGINE_KEYS = {
    "mode": "it is searched: list the modes in search_space.deployment_mode ([agg], [disagg] or both)",
    "backend": "it is searched: list the backends in search_space.backend",
    "context_length": "set it once in search_space.context_length",
    "nextn": "it is pinned for every candidate in search_space.aic_nextn; set its acceptance in "
             "engine.nextn_accepted",
    "workers": "each candidate's workers come from search_space (parallel_configs or the enumerated shapes, the "
               "batching knobs, <role>_block_size, <role>_gpu_memory_utilization, <role>_enable_prefix_caching); "
               "set the timing model in engine.timing",
}


class SearchEngine(Strict):
    """What the search fixes about the engine (the model and GPU live in ``search_space``)."""

    timing: Timing = Timing()
    backend_version: Name | None = None
    enable_chunked_prefill: Annotated[bool, StrictType()] = True
    kv_transfer: KvTransfer | None = None
    # MTP's mean accepted drafts per pass for the candidates of search_space.aic_nextn > 0 (ours: the
    # seed pins aic_nextn in every sample but no acceptance; README "Speculative decoding")
    nextn_accepted: Float | None = None

    @model_validator(mode="before")
    @classmethod
    def _not_searched(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            for key, hint in _SEARCHED_ENGINE_KEYS.items():
                if key in data:
                    raise InputError(f"engine.{key}", f"is not fixed by a search config: {hint}")
        return data


# -- what to optimise, and how ---------------------------------------------------------------
class Constraints(Strict):
    min_candidate_gpus: PosInt | None = None
    max_candidate_gpus: PosInt | None = None  # None: search_space.gpu_budget
    min_goodput_rps: PosFloat | None = None  # target min_gpus only


class Optimization(Strict):
    target: Literal[TARGETS]
    constraints: Constraints = Constraints()
    strict_sla: Annotated[bool, StrictType()] = False


def _algorithm(v: Any) -> Any:
    return "tpe" if v == "bayesian" else v  # the reference's name for its guided sampler


def _pruner(v: Any) -> Any:
    return None if v in ("none", False) else v  # (none is the default: a search's identity is unchanged by it)


class Optimizer(Strict):
    algorithm: Annotated[Literal["tpe", "random", "nsga2"], BeforeValidator(_algorithm)] = "tpe"
    max_trials: PosInt = 320
    parallelism: PosInt | None = None  # None: the CPU count
    candidate_timeout_seconds: PosFloat = 600.0
    seed: Int = 42
    # median | hyperband: prune losing candidates at checkpoints (search.spica.pruning); None = none
    pruner: Annotated[Literal["median", "successive_halving", "hyperband"] | None, BeforeValidator(_pruner)] = None


class Study(Strict):
    storage: Name | None = None  # an Optuna storage URL; None: the journal file in the output directory
    name: Name = "spica"


class Dgd(Strict):
    """The deployment output (``--output dgd``): validated here, rendered by the exporter."""

    name: Name
    namespace: Name | None = None
    output_file: Name | None = None
    output_dir: Name | None = None
    renderer: Literal["aic", "direct"] = "direct"  # aic (aiconfigurator's generator) is not available here
    runtime_image: Name | None = None
    runtime_version_override: Name | None = None
    num_gpus_per_node: PosInt | None = None

    @model_validator(mode="after")
    def _names(self) -> "Dgd":
        if self.output_file is not None and self.output_dir is not None:
            raise InputError("dgd.output_dir", "conflicts with dgd.output_file: set one (output_file: one manifest; "
                                               "output_dir: a kustomize directory)")
        if not _k8s_name(self.name.replace("{index}", "000")):
            raise InputError("dgd.name", f"{self.name!r} is not a Kubernetes name: lowercase letters, digits and '-', "
                                         "at most 63 characters (plus an {index} placeholder for pareto)")
        if self.namespace is not None and not _k8s_name(self.namespace):
            raise InputError("dgd.namespace", f"{self.namespace!r} is not a Kubernetes namespace: lowercase letters, "
                                              "digits and '-', at most 63 characters")
        return self


# -- the config ------------------------------------------------------------------------------
def _search_space(v: Any) -> Any:
    return v if isinstance(v, SearchSpace) else SearchSpace.from_dict(v)


class SearchConfig(Strict):
    """The validated search config (immutable). Build it with ``from_dict`` or ``load_search_config``."""

    traffic: Traffic | None = None
    workload: Workload | None = None
    engine: SearchEngine = SearchEngine()
    evaluation: Evaluation = Evaluation()
    execution: Execution = Execution()
    search_space: Annotated[SearchSpace, BeforeValidator(_search_space)]
    optimization: Optimization
    optimizer: Optimizer = Optimizer()
    study: Study = Study()
    dgd: Dgd | None = None

    @classmethod
    def from_dict(cls, data: Any) -> "SearchConfig":
        """The config as read from YAML (after ``--set`` overrides)."""
        if not isinstance(data, Mapping):
            raise InputError("config", f"a search config is a mapping of sections, not {type(data).__name__}")
        for key in data:
            if not isinstance(key, str) or not key or "." in key:
                raise InputError(str(key), "top-level keys must be non-empty section names without dots")
        from aisim.search.spica.reference_form import is_reference_form, lower

        if is_reference_form(data):
            data = lower(data)
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            from aisim.simulator.config.loading import format_validation_error

            raise format_validation_error(exc) from None

    @model_validator(mode="before")
    @classmethod
    def _model_and_gpu(cls, data: Any) -> Any:
        """One source each for the model and the GPU; the validated config keeps both in the
        search space (the seed's pinned scalars)."""
        if not isinstance(data, Mapping):
            return data
        engine = {} if data.get("engine") is None else data["engine"]
        space = {} if data.get("search_space") is None else data["search_space"]
        if isinstance(space, SearchSpace):
            space = space.to_dict()
        if not isinstance(engine, Mapping) or not isinstance(space, Mapping):
            return data  # the fields report it
        engine, space = dict(engine), dict(space)
        for key, knob, what in (("model", "model_name", "model"), ("hardware", "hardware_sku", "GPU")):
            fixed, pinned = engine.pop(key, None), space.get(knob)
            if fixed is not None and pinned is not None:
                raise InputError(f"search_space.{knob}", f"repeats engine.{key}: name the {what} in one place "
                                                         f"(remove one of them)")
            if fixed is None and pinned is None:
                raise InputError(f"engine.{key}", f"is missing: name the {what} in engine.{key} "
                                                  f"(or search_space.{knob})")
            where = f"engine.{key}" if fixed is not None else f"search_space.{knob}"
            value = fixed if fixed is not None else pinned
            if not isinstance(value, str) or not value:
                raise InputError(where, f"must be a {what} name (text), got {value!r}")
            if key == "hardware":
                from aisim.simulator.catalog.hardware import get_hardware

                get_hardware(value, where)
            space[knob] = value
        return {**data, "engine": engine, "search_space": space}

    @model_validator(mode="after")
    def _rules(self) -> "SearchConfig":
        _check_traffic(self)
        _check_sla(self)
        _check_algorithm(self)
        _check_min_gpus(self)
        _check_policies(self)
        _check_gpu_constraints(self)
        _check_dgd(self)
        _check_nextn(self)
        if self.engine.kv_transfer is not None and "disagg" not in self.branches:
            raise InputError("engine.kv_transfer", "only disaggregated candidates transfer KV, but "
                                                   "search_space.deployment_mode is [agg]; remove it")
        return self

    # -- derived --
    @property
    def model_name(self) -> str:
        return self.search_space.model_name

    @property
    def hardware_sku(self) -> str:
        return self.search_space.hardware_sku

    @property
    def branches(self) -> tuple[str, ...]:
        """The deployment modes searched, one branch (study) each, in the space's order."""
        return tuple(self.search_space.deployment_mode)

    @property
    def planner_target(self) -> str:
        """The Planner target of a candidate whose Planner is on (reference §7.1): throughput targets
        and pareto -> throughput; ttft, e2e_latency -> latency; goodput targets -> sla."""
        return PLANNER_TARGET[self.optimization.target]

    @property
    def kv_load_ratio_range(self) -> tuple[float, float] | None:
        """``workload.kv_load_ratio`` as searched [min, max], or None when it is not searched."""
        ratio = self.workload.kv_load_ratio if self.workload is not None else None
        return ratio if isinstance(ratio, tuple) else None

    def dump(self) -> dict:
        """The validated config as plain data (what a study stores and the fingerprint hashes). A key
        added after studies were first stored appears only when set (``LATER_KEYS``), so a search's
        identity and journal do not change with the version that runs it."""
        data = self.model_dump(mode="json")
        for section, key in LATER_KEYS:
            if data.get(section, {}).get(key) is None:
                data[section].pop(key, None)
        return data

    def fingerprint(self) -> str:
        """sha256 (hex) of the validated config's canonical JSON (sorted keys, no spaces): the same for
        any spelling of the same search (engine.model or search_space.model_name, bayesian or tpe,
        defaults written out or not)."""
        text = json.dumps(self.dump(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()


# -- rules across sections -------------------------------------------------------------------
def _check_nextn(cfg: SearchConfig) -> None:
    """MTP candidates (search_space.aic_nextn > 0): the acceptance they replay with, and the rules
    of engine.nextn (simulator.config.rules.check_speculation) checked once for the whole search."""
    from aisim.simulator.config.rules import MAX_NEXTN, SPEC_TIMING

    n = cfg.search_space.aic_nextn or 0
    acc = cfg.engine.nextn_accepted
    if not n:
        if acc is not None:
            raise InputError("engine.nextn_accepted", "is the MTP acceptance of candidates with search_space.aic_nextn "
                                                      "> 0 (it is null or 0); set aic_nextn or remove nextn_accepted")
        return
    if n > MAX_NEXTN:
        raise InputError("search_space.aic_nextn", f"must be between 0 and {MAX_NEXTN} (got {n})")
    if acc is None:
        raise InputError("engine.nextn_accepted", f"is required with search_space.aic_nextn {n}: the mean accepted "
                                                  f"drafts per pass, in [0, {n}] (the search space carries none; "
                                                  "README: choosing nextn_accepted)")
    if not 0 <= acc <= n:
        raise InputError("engine.nextn_accepted", f"must be within [0, aic_nextn={n}] (got {acc})")
    if cfg.search_space.num_g2_blocks:
        raise InputError("search_space.num_g2_blocks", "host KV offload does not support MTP (aic_nextn > 0), as in "
                                                       "the reference; set num_g2_blocks 0 or aic_nextn null")
    if "sglang" in cfg.search_space.backend:
        raise InputError("search_space.backend", "MTP (aic_nextn > 0) is not modelled for SGLang workers; drop "
                                                 "sglang from the backends or set aic_nextn null")
    if cfg.engine.timing.type not in SPEC_TIMING:
        raise InputError("engine.timing.type", f"MTP candidates need timing that prices the draft tokens: default "
                                               f"(measured) or fixed, not {cfg.engine.timing.type}")


def _check_traffic(cfg: SearchConfig) -> None:
    if cfg.traffic is None and cfg.workload is None:
        raise InputError("workload", "is missing: describe the traffic with a workload section (isl, osl, the load, "
                                     "request_count) or a predict traffic section")
    if cfg.traffic is not None and cfg.workload is not None:
        raise InputError("traffic", "and workload both describe the traffic; keep one of them")
    t = cfg.traffic
    if t is not None and isinstance(t.load, KvCapacityFractionLoad) and not isinstance(t.source, SyntheticSource):
        raise InputError("traffic.source.type", "load kv_capacity_fraction sizes the concurrency from the request "
                                                "length, so it needs a synthetic source (input_tokens, output_tokens)")


def _check_sla(cfg: SearchConfig) -> None:
    sla = cfg.evaluation.sla
    target = cfg.optimization.target
    if target in GOODPUT_TARGETS:
        for key in ("ttft_ms", "itl_ms"):
            if getattr(sla, key) is None:
                raise InputError(f"evaluation.sla.{key}", f"is missing: target {target} scores goodput, which needs "
                                                          "evaluation.sla.ttft_ms and itl_ms")
    if cfg.optimization.strict_sla and not sla.is_set:
        raise InputError("optimization.strict_sla", "needs an SLA to hold candidates to; set evaluation.sla "
                                                    "(ttft_ms and itl_ms, or e2e_ms) or remove strict_sla")


def _check_algorithm(cfg: SearchConfig) -> None:
    target = cfg.optimization.target
    if cfg.optimizer.algorithm == "nsga2" and target != "pareto":
        raise InputError("optimizer.algorithm", f"nsga2 is a multi-objective sampler for target pareto; use tpe or "
                                                f"random for target {target}")
    if cfg.optimizer.pruner is not None and target in ("pareto", "min_gpus"):
        why = ("Optuna prunes single-objective studies only" if target == "pareto"
               else "a candidate's GPU count is known before its replay, so there is nothing to prune on")
        raise InputError("optimizer.pruner", f"cannot prune a {target} search ({why}); set optimizer.pruner none")


def _offered_rate(cfg: SearchConfig) -> float | None:
    if cfg.workload is not None:
        return cfg.workload.request_rate
    rate = getattr(cfg.traffic.load, "requests_per_second", None)
    return rate


def _check_min_gpus(cfg: SearchConfig) -> None:
    c = cfg.optimization.constraints
    if cfg.optimization.target != "min_gpus":
        if c.min_goodput_rps is not None:
            raise InputError("optimization.constraints.min_goodput_rps", "only applies to target min_gpus; remove it")
        return
    if c.min_goodput_rps is None:
        raise InputError("optimization.constraints.min_goodput_rps", "is missing: target min_gpus finds the fewest "
                                                                     "GPUs that serve this goodput (requests/s)")
    w, t = cfg.workload, cfg.traffic
    if w is not None and w.kv_load_ratio is not None:
        raise InputError("workload.kv_load_ratio", "target min_gpus needs a fixed load, but kv_load_ratio changes "
                                                   "with each candidate's KV capacity; use concurrency or request_rate")
    if t is not None:
        if isinstance(t.source, TraceSource):
            raise InputError("traffic.source.type", "target min_gpus needs a fixed synthetic load; use a synthetic "
                                                    "source (or a workload section)")
        if isinstance(t.load, KvCapacityFractionLoad):
            raise InputError("traffic.load.type", "target min_gpus needs a fixed load, but kv_capacity_fraction "
                                                  "changes with each candidate; use concurrency, poisson or "
                                                  "constant_rate")
    rate = _offered_rate(cfg)
    if rate is not None and c.min_goodput_rps > rate:
        raise InputError("optimization.constraints.min_goodput_rps", f"{c.min_goodput_rps} requests/s is above the "
                                                                     f"offered {rate} requests/s, so no candidate "
                                                                     "can meet it; lower it or raise the rate")
    for i, entry in enumerate(cfg.search_space.planner_scaling_policy):
        f = scaling_fields(entry)
        if f["enable_throughput_scaling"] or f["enable_load_scaling"]:
            raise InputError(f"search_space.planner_scaling_policy.{i}", "target min_gpus compares static pools; "
                                                                         "list only disabled (no autoscaling)")


def _check_policies(cfg: SearchConfig) -> None:
    if cfg.planner_target == "sla":
        return
    policies = cfg.search_space.planner_scaling_policy
    if all(scaling_fields(p)["enable_throughput_scaling"] for p in policies):
        raise InputError("search_space.planner_scaling_policy", f"every policy scales on throughput, which needs a "
                                                                f"goodput target (Planner target sla); target "
                                                                f"{cfg.optimization.target} drops them, leaving "
                                                                "nothing to search: add disabled or a load policy")


def _check_gpu_constraints(cfg: SearchConfig) -> None:
    c = cfg.optimization.constraints
    budget = cfg.search_space.gpu_budget
    if c.min_candidate_gpus is None:
        return
    if c.max_candidate_gpus is not None and c.min_candidate_gpus > c.max_candidate_gpus:
        raise InputError("optimization.constraints.min_candidate_gpus", f"{c.min_candidate_gpus} is above "
                                                                        f"max_candidate_gpus {c.max_candidate_gpus}; "
                                                                        "lower it")
    if c.min_candidate_gpus > budget:
        raise InputError("optimization.constraints.min_candidate_gpus", f"{c.min_candidate_gpus} is above "
                                                                        f"search_space.gpu_budget {budget}, so no "
                                                                        "candidate fits; lower it or raise the budget")


def _check_dgd(cfg: SearchConfig) -> None:
    if cfg.dgd is None:
        return
    pareto = cfg.optimization.target == "pareto"
    if pareto and "{index}" not in cfg.dgd.name:
        raise InputError("dgd.name", "target pareto renders every front member: put {index} in the name "
                                     "(e.g. spica-{index}, rendered 000, 001, ...)")
    if not pareto and "{index}" in cfg.dgd.name:
        raise InputError("dgd.name", f"target {cfg.optimization.target} renders one winner: remove {{index}} "
                                     "from the name")


# -- loading ---------------------------------------------------------------------------------
def load_search_config(path: Path, overrides: list[str] | None = None) -> tuple[SearchConfig, Path]:
    """Read a search YAML, apply ``--set`` overrides (``search_space.gpu_budget=16``), validate.
    Returns the config and its directory (relative trace paths are looked up next to it)."""
    from aisim.simulator.config.loading import apply_overrides, read_yaml_mapping

    path = Path(path)
    data = read_yaml_mapping(path, "search config")
    data = apply_overrides(data, overrides or [])
    return SearchConfig.from_dict(data), path.resolve().parent
