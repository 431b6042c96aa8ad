"""Spica objectives, feasibility, ranking and the Pareto front (reference §7.6).

``score(target, metrics, used_gpus, ...)`` turns one replay's summary (the flat ``summary`` map of
prediction.json, ``simulator.metrics.summary``) into a ``Score``: signed values (higher is always
better, so every Optuna direction is ``maximize``), the raw objective values for the ledger, and
``feasible`` / ``infeasible`` with a reason category.

| target | value (signed) | summary fields |
|---|---|---|
| ``throughput`` | + | ``output_throughput_tok_s`` |
| ``throughput_per_gpu`` | + | ``output_throughput_tok_s`` / avg GPUs |
| ``throughput_per_user`` | + | ``mean_output_token_throughput_per_user`` |
| ``goodput`` | + | ``goodput_output_throughput_tok_s`` (the replay needs an SLA) |
| ``goodput_per_gpu`` | + | ``goodput_output_throughput_tok_s`` / avg GPUs |
| ``ttft`` | - | ``mean_ttft_ms`` (infinite, so not scored, without samples: ``num_ttft_samples``) |
| ``e2e_latency`` | - | ``mean_e2e_latency_ms`` (likewise: ``num_e2e_latency_samples``) |
| ``min_gpus`` | - | ``used_gpus``; needs ``goodput_request_throughput_rps`` >= ``min_goodput_rps`` and the mean SLA |
| ``pareto`` | vector | default (``throughput_per_gpu``, ``throughput_per_user``) |

avg GPUs = ``gpu_hours`` / (``duration_ms`` / 3.6e6). The mean SLA (``strict_sla``, and always for
``min_gpus``) is ``mean_ttft_ms`` <= ttft, ``mean_tpot_ms`` <= itl, ``mean_e2e_latency_ms`` <= e2e for
each limit set, inclusive; a missing mean or zero samples (``num_ttft_samples``,
``num_tpot_samples``, ``num_e2e_latency_samples``) fails.

Checks, first failure wins: ``gpu_budget`` (``min_candidate_gpus`` <= used_gpus <=
``max_candidate_gpus``, each bound only when set) -> ``invalid_metrics`` (a needed field is NaN,
infinite or not a number, or an objective field is absent from the summary) -> ``no_samples`` (an
objective field is null: nothing completed, or no samples for a mean) -> ``sla_constraint`` for a
goodput objective of 0 (no request met the SLA) -> ``load_constraint`` (``min_gpus``) ->
``sla_constraint``.

``rank_key(candidate, target)`` orders ledger records (``search.spica.outputs.candidate_record``):
feasible scored records first, by score descending (lexicographic for a vector), then fewer GPUs,
then the canonical config JSON (``json.dumps(config, sort_keys=True)``), then the candidate id; for
``min_gpus``: fewer GPUs, higher ``goodput_output_throughput_tok_s``, lower ``mean_e2e_latency_ms``,
then the same tail. Every other record follows, by GPUs, config JSON and id.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Real

TARGETS = ("throughput", "throughput_per_gpu", "throughput_per_user", "goodput", "goodput_per_gpu", "ttft",
           "e2e_latency", "min_gpus", "pareto")

#: the scalar objectives a Pareto search may combine (``min_gpus`` and ``pareto`` themselves excepted)
PARETO_OBJECTIVES = ("throughput", "throughput_per_gpu", "throughput_per_user", "goodput", "goodput_per_gpu",
                     "ttft", "e2e_latency")
DEFAULT_PARETO_OBJECTIVES = ("throughput_per_gpu", "throughput_per_user")

#: objectives minimised (their signed value is the negated raw value)
MINIMISED = frozenset({"ttft", "e2e_latency", "min_gpus"})

#: objective -> the summary field it reads (per-GPU objectives also read gpu_hours and duration_ms)
OBJECTIVE_FIELDS = {
    "throughput": "output_throughput_tok_s",
    "throughput_per_gpu": "output_throughput_tok_s",
    "throughput_per_user": "mean_output_token_throughput_per_user",
    "goodput": "goodput_output_throughput_tok_s",
    "goodput_per_gpu": "goodput_output_throughput_tok_s",
    "ttft": "mean_ttft_ms",
    "e2e_latency": "mean_e2e_latency_ms",
}
PER_GPU = frozenset({"throughput_per_gpu", "goodput_per_gpu"})
#: latency objectives: no samples means an infinite value (not scored)
SAMPLE_COUNTS = {"mean_ttft_ms": "num_ttft_samples", "mean_tpot_ms": "num_tpot_samples",
                 "mean_e2e_latency_ms": "num_e2e_latency_samples"}

#: SLA limit -> the summary mean it bounds (reference names ttft/itl/e2e, aisim names *_ms)
SLA_FIELDS = (("ttft_ms", "mean_ttft_ms"), ("itl_ms", "mean_tpot_ms"), ("e2e_ms", "mean_e2e_latency_ms"))
_SLA_ALIASES = {"ttft": "ttft_ms", "itl": "itl_ms", "e2e": "e2e_ms", "ttft_ms": "ttft_ms", "itl_ms": "itl_ms",
                "e2e_ms": "e2e_ms"}

MS_PER_HOUR = 3.6e6


@dataclass(frozen=True)
class Score:
    # signed so higher is better (one value; pareto: one per objective); None = not scored
    values: tuple[float, ...] | None
    objectives: dict = field(default_factory=dict)  # raw (unsigned) objective values by name, for the ledger
    status: str = "feasible"  # "feasible" | "infeasible"
    reason_category: str | None = None
    reason: str | None = None


class _Fail(Exception):
    def __init__(self, category: str, reason: str) -> None:
        super().__init__(reason)
        self.category = category
        self.reason = reason


def objective_names(target: str, pareto_objectives: Sequence[str] | None = None) -> tuple[str, ...]:
    """The named objectives of ``target`` (one, or the Pareto objectives in order)."""
    _check_target(target)
    if target != "pareto":
        if pareto_objectives is not None:
            raise ValueError(f"pareto_objectives only applies to target 'pareto', not {target!r}")
        return (target,)
    names = tuple(DEFAULT_PARETO_OBJECTIVES if pareto_objectives is None else pareto_objectives)
    if len(names) < 2 or len(set(names)) != len(names):
        raise ValueError(f"pareto objectives must be at least two distinct names, got {list(names)}")
    for n in names:
        if n not in PARETO_OBJECTIVES:
            raise ValueError(f"unknown pareto objective {n!r}; expected one of {', '.join(PARETO_OBJECTIVES)}")
    return names


def directions(target: str, pareto_objectives: Sequence[str] | None = None) -> list[str]:
    """Optuna study directions: values are signed, so always maximize (one per objective)."""
    return ["maximize"] * len(objective_names(target, pareto_objectives))


def _check_target(target: str) -> None:
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {', '.join(TARGETS)}")


def _sla_limits(sla: Mapping | None) -> dict[str, float]:
    """The set SLA limits under aisim's names (``ttft_ms``, ``itl_ms``, ``e2e_ms``)."""
    limits: dict[str, float] = {}
    for key, value in (sla or {}).items():
        if key == "percentile":
            continue
        if key not in _SLA_ALIASES:
            raise ValueError(f"unknown SLA key {key!r}; expected ttft_ms, itl_ms or e2e_ms")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"SLA {key} must be a positive finite number, got {value!r}")
        name = _SLA_ALIASES[key]
        if name in limits and limits[name] != float(value):
            raise ValueError(f"SLA {name} given twice with different values")
        limits[name] = float(value)
    return limits


def _is_bad_number(v) -> bool:
    """Present but not a finite real number (None is absent, not bad)."""
    if v is None:
        return False
    return isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(v)


def _number(metrics: Mapping, key: str) -> float | None:
    """A field the objective needs: absent key -> invalid_metrics; null -> None (the caller decides)."""
    if key not in metrics:
        raise _Fail("invalid_metrics", f"the replay summary has no {key}")
    v = metrics[key]
    return None if v is None else float(v)


def _objective(name: str, metrics: Mapping) -> float:
    """The raw objective value; ``_Fail`` with ``no_samples`` or ``invalid_metrics``."""
    key = OBJECTIVE_FIELDS[name]
    v = _number(metrics, key)
    count_key = SAMPLE_COUNTS.get(key)
    if count_key is not None and metrics.get(count_key) == 0:
        v = None
    if v is None:
        if count_key:
            raise _Fail("no_samples", f"no {count_key} (the {name} objective is infinite)")
        raise _Fail("no_samples", f"{key} is null (nothing completed)")
    if name not in PER_GPU:
        return v
    gpu_hours = _number(metrics, "gpu_hours")
    duration_ms = _number(metrics, "duration_ms")
    if not duration_ms:
        raise _Fail("no_samples", "duration_ms is 0 (nothing completed)")
    if duration_ms < 0 or gpu_hours is None or gpu_hours <= 0:
        raise _Fail("invalid_metrics", f"cannot average GPUs from gpu_hours={gpu_hours!r}, duration_ms={duration_ms!r}")
    return v / (gpu_hours / (duration_ms / MS_PER_HOUR))


def sla_statistic(sla: Mapping | None) -> str:
    """The summary statistic an SLA bounds: ``mean`` (default), ``median`` or ``pP``."""
    q = (sla or {}).get("percentile", "mean")
    if q in (None, "mean"):
        return "mean"
    return "median" if q == 50 else f"p{q:g}"


def sla_fields(stat: str) -> tuple[tuple[str, str], ...]:
    """(SLA limit, the summary field it bounds) under statistic ``stat``."""
    return tuple((limit, f"{stat}_{mean[len('mean_'):]}") for limit, mean in SLA_FIELDS)


def _needed_fields(names: Sequence[str], target: str, limits: dict, check_sla: bool,
                   stat: str = "mean") -> list[str]:
    keys: list[str] = []
    for n in names:
        if n in OBJECTIVE_FIELDS:
            keys.append(OBJECTIVE_FIELDS[n])
            if n in PER_GPU:
                keys += ["gpu_hours", "duration_ms"]
    if target == "min_gpus":
        keys += ["goodput_request_throughput_rps", "goodput_output_throughput_tok_s", "mean_e2e_latency_ms"]
    if check_sla:
        for (limit, mean), (_, bound) in zip(SLA_FIELDS, sla_fields(stat)):
            if limit in limits:
                keys += [bound, SAMPLE_COUNTS[mean]]
    return list(dict.fromkeys(keys))


def _sla_failure(metrics: Mapping, limits: dict, stat: str = "mean") -> str | None:
    """The first violated SLA limit (on statistic ``stat``) as a one-line reason, or None when every
    set limit holds."""
    for (limit, mean_field), (_, mean) in zip(SLA_FIELDS, sla_fields(stat)):
        if limit not in limits:
            continue
        count = metrics.get(SAMPLE_COUNTS[mean_field])
        value = metrics.get(mean)
        if value is None or count == 0:
            return f"{mean} has no samples (SLA {limit} {limits[limit]:g})"
        if float(value) > limits[limit]:
            return f"{mean} {float(value):g} > SLA {limit} {limits[limit]:g}"
    return None


def _infeasible(category: str, reason: str, objectives: dict | None = None) -> Score:
    return Score(values=None, objectives=dict(objectives or {}), status="infeasible", reason_category=category,
                 reason=reason)


def score(target: str, metrics: Mapping | None, used_gpus: int, *, sla: Mapping | None, strict_sla: bool,
          constraints: Mapping | None, offered_rps: float | None = None,
          pareto_objectives: Sequence[str] | None = None) -> Score:
    """Score one replay (see the module docstring for the table and the order of checks).

    ``sla``: the limits (``ttft_ms``, ``itl_ms``, ``e2e_ms``; the reference's ``ttft``, ``itl``, ``e2e``
    are accepted too; null = unset). ``constraints``: ``min_candidate_gpus``, ``max_candidate_gpus``,
    ``min_goodput_rps`` (``min_gpus``; unset = 0); a missing bound is not checked (the config layer
    supplies the defaults). ``offered_rps``: the fixed offered rate of a ``min_gpus`` search; a
    ``min_goodput_rps`` above it can never be met (``load_constraint``). Raises ``ValueError`` for an
    unknown target, SLA key or Pareto objective (a caller error, not a candidate's).
    """
    names = objective_names(target, pareto_objectives)
    limits = _sla_limits(sla)
    cons = dict(constraints or {})
    lo, hi = cons.get("min_candidate_gpus"), cons.get("max_candidate_gpus")
    if lo is not None and used_gpus < lo:
        return _infeasible("gpu_budget", f"used_gpus {used_gpus} < min_candidate_gpus {lo}")
    if hi is not None and used_gpus > hi:
        return _infeasible("gpu_budget", f"used_gpus {used_gpus} > max_candidate_gpus {hi}")
    if not isinstance(metrics, Mapping):
        return _infeasible("invalid_metrics", "the replay produced no summary")

    stat = sla_statistic(sla)
    check_sla = strict_sla or target == "min_gpus" or stat != "mean"  # a percentile SLA is a constraint
    for key in _needed_fields(names, target, limits, check_sla, stat):
        if _is_bad_number(metrics.get(key)):
            return _infeasible("invalid_metrics", f"{key} is not a finite number: {metrics.get(key)!r}")

    objectives: dict = {}
    if target == "min_gpus":
        objectives["min_gpus"] = used_gpus
    else:
        for n in names:
            try:
                objectives[n] = _objective(n, metrics)
            except _Fail as f:
                if f.category == "no_samples" and n in ("ttft", "e2e_latency"):
                    objectives[n] = math.inf
                return _infeasible(f.category, f.reason, objectives)

    for n in names:  # a goodput of 0: no request met the SLA, so nothing about the candidate is feasible
        if n in ("goodput", "goodput_per_gpu") and objectives.get(n) == 0:
            return _infeasible("sla_constraint", f"no request met the SLA ({n} 0)", objectives)

    if target == "min_gpus":
        need = float(cons.get("min_goodput_rps") or 0.0)
        if offered_rps is not None and need > offered_rps:
            return _infeasible("load_constraint", f"min_goodput_rps {need:g} > offered rate {offered_rps:g} rps",
                               objectives)
        try:
            got = _number(metrics, "goodput_request_throughput_rps")
        except _Fail as f:
            return _infeasible(f.category, f.reason, objectives)
        got = 0.0 if got is None else got  # null: nothing completed
        if got < need:
            return _infeasible("load_constraint", f"goodput_request_throughput_rps {got:g} < min_goodput_rps {need:g}",
                               objectives)

    if check_sla:
        why = _sla_failure(metrics, limits, stat)
        if why is not None:
            return _infeasible("sla_constraint", why, objectives)

    values = tuple(-float(objectives[n]) if n in MINIMISED else float(objectives[n]) for n in names)
    return Score(values=values, objectives=objectives, status="feasible")


# -- ranking -------------------------------------------------------------------------------------
def canonical_config(config) -> str:
    """The ranking tie-break: ``json.dumps(config, sort_keys=True)``."""
    return json.dumps(config, sort_keys=True)


def score_values(candidate: Mapping) -> tuple[float, ...] | None:
    """A ledger record's score as a tuple (None unless the record is feasible and scored)."""
    s = candidate.get("score")
    if candidate.get("status") != "feasible" or s is None:
        return None
    if isinstance(s, Score):
        return s.values
    if isinstance(s, (list, tuple)):
        return tuple(float(v) for v in s)
    return (float(s),)


def _gpus(candidate: Mapping) -> float:
    g = candidate.get("used_gpus")
    return math.inf if g is None else g


def _metric_or(candidate: Mapping, key: str, default: float) -> float:
    v = (candidate.get("metrics") or {}).get(key)
    return default if _is_bad_number(v) or v is None else float(v)


def rank_key(candidate: Mapping, target: str | None = None):
    """``sorted(records, key=lambda c: rank_key(c, target))`` puts the best first (module docstring)."""
    values = score_values(candidate)
    tail = (canonical_config(candidate.get("config")), str(candidate.get("candidate_id", "")))
    if values is None:
        return (1, (), _gpus(candidate), (), *tail)
    if target == "min_gpus":
        secondary = (-_metric_or(candidate, "goodput_output_throughput_tok_s", -math.inf),
                     _metric_or(candidate, "mean_e2e_latency_ms", math.inf))
        return (0, tuple(-v for v in values), _gpus(candidate), secondary, *tail)
    return (0, tuple(-v for v in values), _gpus(candidate), (), *tail)


def _dominates(a: tuple, b: tuple) -> bool:
    return all(x >= y for x, y in zip(a, b)) and any(x > y for x, y in zip(a, b))


def pareto_front(candidates: Sequence[Mapping], target: str | None = None) -> list[dict]:
    """The non-dominated feasible records (maximising every signed score value), sorted by the last
    value ascending, ties in rank order. Records with identical values are all kept."""
    scored = [(score_values(c), c) for c in candidates]
    scored = [(v, c) for v, c in scored if v is not None]
    if not scored:
        return []
    if len(scored[0][0]) == 1:
        top = max(v[0] for v, _ in scored)
        front = [c for v, c in scored if v[0] == top]
    elif len(scored[0][0]) == 2:  # sweep: by the first value descending, keep a strictly better second
        ordered = sorted(scored, key=lambda vc: (-vc[0][0], -vc[0][1]))
        front, best, i = [], -math.inf, 0
        while i < len(ordered):
            j = i
            while j < len(ordered) and ordered[j][0][0] == ordered[i][0][0]:
                j += 1
            top = ordered[i][0][1]  # the group's best second value
            if top > best:
                front += [c for v, c in ordered[i:j] if v[1] == top]
                best = top
            i = j
    else:
        front = [c for v, c in scored if not any(_dominates(w, v) for w, _ in scored)]
    return sorted(front, key=lambda c: (score_values(c)[-1], rank_key(c, target)))
