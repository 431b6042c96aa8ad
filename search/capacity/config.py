"""The capacity-search config (``aisim capacity -c capacity.yaml``), strict: unknown keys are
rejected and every error is one line naming the key and the fix (exit 2).

- ``benchmark_base``: a predict config (the ``aisim predict`` schema): a mapping, or
  ``{config: path.yaml, set: {dotted.key: value}}`` (the path relative to this file). The seed's
  ``benchmark_timeout`` may sit in it (it is taken out before the predict validation).
- ``jobs[]``: ``name``, exactly one of ``start_qps`` (adaptive) or ``qps_list`` (linear) after
  ``search.qps_list`` is inherited by jobs that set neither (a job's own setting wins), optional
  ``benchmark_overrides`` deep-merged over the base (a mapping replaces key by key; a list or a
  scalar replaces the whole value).
- ``sla[]``: ``{metric, quantile, threshold, op}``; a trial passes only if every rule passes.
  Adaptive jobs require ``sla``.
- ``search``: ``max_iterations`` (20), ``min_search_granularity_pct`` (2.5), ``max_qps_cap``,
  ``qps_list``, ``benchmark_timeout`` (900 s wall per trial, 0 disables; this key wins over the base's),
  ``early_decisions`` (true: a trial ends once an SLA rule can no longer pass, ``search.capacity.early``).
- ``launch_server`` anywhere is rejected: every trial is its own replay.

How a trial sets its QPS (``trial_config``): synthetic traffic -> open-loop Poisson at
``requests_per_second: qps`` (the base's load seed when it has one, else 42; the base's stop
count kept); trace traffic -> the trace's own timestamps with ``speedup = qps / trace_rps`` where
``trace_rps`` = the trace's requests per second (requests / (last - first timestamp)).
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, ValidationError, field_validator

from aisim.simulator.config.models import NonNegFloat, PosFloat, PosInt, Strict
from aisim.simulator.errors import InputError

__all__ = ["CapacityConfig", "Job", "SlaRuleSpec", "SearchSettings", "load_capacity_config", "job_config",
           "job_qps_list", "trial_config", "deep_merge", "job_key", "DEFAULT_BENCHMARK_TIMEOUT_S"]

DEFAULT_BENCHMARK_TIMEOUT_S = 900.0
_LAUNCH_SERVER = ("is rejected: capacity search runs every trial as its own replay (the seed's harness launches its "
                  "own server per trial); remove it")


class SlaRuleSpec(Strict):
    metric: str
    quantile: float = Field(ge=0, le=1)
    threshold: float
    op: Literal["<=", "<", ">=", ">", "=="]

    @field_validator("metric")
    @classmethod
    def _known(cls, v):
        from aisim.search.capacity.sla import QUEUE_METRICS, REQUEST_METRICS

        if v not in REQUEST_METRICS + QUEUE_METRICS:
            raise ValueError(f"unknown metric {v!r}; use one of {', '.join(REQUEST_METRICS + QUEUE_METRICS)}")
        return v


class Job(Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    start_qps: PosFloat | None = None
    qps_list: list[PosFloat] | None = Field(default=None, min_length=1)
    benchmark_overrides: dict[str, Any] = Field(default_factory=dict)

    @property
    def mode(self) -> str:
        return "adaptive" if self.start_qps is not None else "linear"


class SearchSettings(Strict):
    max_iterations: PosInt = 20
    min_search_granularity_pct: PosFloat = 2.5
    max_qps_cap: PosFloat | None = None
    # end a trial as soon as an SLA rule can no longer pass (search.capacity.early; the same
    # answers as full replays); false replays every trial to its end
    early_decisions: bool = True
    qps_list: list[PosFloat] | None = Field(default=None, min_length=1)
    benchmark_timeout: NonNegFloat | None = None


class BaseRef(Strict):
    config: str
    set: dict[str, Any] = Field(default_factory=dict)


class CapacityConfig(Strict):
    benchmark_base: BaseRef | dict[str, Any]
    jobs: list[Job] = Field(min_length=1)

    @field_validator("benchmark_base", mode="before")
    @classmethod
    def _reference_or_mapping(cls, v):
        """``{config: path, set: {...}}`` refers to a predict config file; any other mapping is one."""
        if isinstance(v, dict) and "config" in v and set(v) <= {"config", "set"}:
            return BaseRef.model_validate(v)
        return v
    sla: list[SlaRuleSpec] = Field(default_factory=list)
    search: SearchSettings = SearchSettings()

    # resolved by load_capacity_config: the base predict mapping and the trial timeout
    _base: dict = PrivateAttr(default_factory=dict)
    _timeout: float = PrivateAttr(default=DEFAULT_BENCHMARK_TIMEOUT_S)

    def base_mapping(self) -> dict:
        return self._base

    @property
    def benchmark_timeout_s(self) -> float | None:
        """Wall seconds per trial (None: no limit)."""
        return None if self._timeout == 0 else self._timeout


def _find_launch_server(node, where: str) -> str | None:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "launch_server":
                return f"{where}.{k}" if where else k
            found = _find_launch_server(v, f"{where}.{k}" if where else str(k))
            if found:
                return found
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found = _find_launch_server(v, f"{where}.{i}")
            if found:
                return found
    return None


def deep_merge(base: dict, over: dict) -> dict:
    """``over`` merged into a copy of ``base``: mappings key by key (recursively); a list or a
    scalar replaces the whole value."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def job_key(mapping: dict) -> str:
    """A short digest of a job's merged config (its directory name's suffix)."""
    return hashlib.sha256(json.dumps(mapping, sort_keys=True, default=str).encode()).hexdigest()[:10]


def _validate_predict(mapping: dict, where: str):
    """The predict config of ``mapping``; an error is reported under ``where``."""
    from aisim.simulator.config.loading import validate_config

    try:
        return validate_config(mapping)
    except InputError as exc:
        raise type(exc)(f"{where}.{exc.where}", exc.message, category=exc.category) from None


def load_capacity_config(path: Path | None = None, data: dict | None = None,
                         overrides: dict | None = None, sets: list[str] | None = None) -> tuple[CapacityConfig, Path | None]:
    """Read (``path``) or take (``data``) a capacity config, apply ``sets`` (``--set PATH=YAML``, e.g.
    ``sla=[...]``), then ``overrides`` (search keys: max_iterations, min_search_granularity_pct,
    max_qps_cap), validate everything (every job's merged predict config included). Returns
    (config, the directory relative paths resolve in)."""
    from aisim.simulator.config.loading import apply_overrides, format_validation_error, read_yaml_mapping

    config_dir = None
    if data is None:
        data = read_yaml_mapping(Path(path), "capacity config")
        config_dir = Path(path).resolve().parent
    data = copy.deepcopy(data)
    if sets:
        data = apply_overrides(data, list(sets))
    bad = _find_launch_server(data, "")
    if bad:
        raise InputError(bad, _LAUNCH_SERVER)
    for k, v in (overrides or {}).items():
        if v is not None:
            data.setdefault("search", {})
            if not isinstance(data["search"], dict):
                raise InputError("search", "must be a mapping")
            data["search"][k] = v
    try:
        cfg = CapacityConfig.model_validate(data)
    except ValidationError as exc:
        raise format_validation_error(exc) from None
    base = cfg.benchmark_base
    if isinstance(base, BaseRef):
        ref = Path(base.config)
        if not ref.is_absolute() and config_dir is not None and not ref.exists():
            ref = config_dir / ref
        mapping = read_yaml_mapping(ref, "benchmark_base.config")
        mapping = apply_overrides(mapping, [f"{k}={json.dumps(v)}" for k, v in base.set.items()])
        config_dir = ref.resolve().parent
    else:
        mapping = copy.deepcopy(base)
    base_timeout = mapping.pop("benchmark_timeout", None)
    if base_timeout is not None and (isinstance(base_timeout, bool) or not isinstance(base_timeout, (int, float))
                                     or base_timeout < 0):
        raise InputError("benchmark_base.benchmark_timeout", f"must be seconds >= 0 (0 disables), got {base_timeout!r}")
    _validate_predict(mapping, "benchmark_base")
    timeout = cfg.search.benchmark_timeout
    if timeout is None:
        timeout = DEFAULT_BENCHMARK_TIMEOUT_S if base_timeout is None else float(base_timeout)
    cfg._base = mapping
    cfg._timeout = float(timeout)
    names = set()
    for i, job in enumerate(cfg.jobs):
        where = f"jobs.{i}"
        if job.name in names:
            raise InputError(f"{where}.name", f"{job.name!r} names two jobs; give each job its own name")
        names.add(job.name)
        if job.start_qps is not None and job.qps_list is not None:
            raise InputError(f"{where}", "set exactly one of start_qps (adaptive) and qps_list (linear), not both")
        if job.start_qps is None and job.qps_list is None and cfg.search.qps_list is None:
            raise InputError(f"{where}", "set one of start_qps (adaptive) or qps_list (linear), or a shared "
                                         "search.qps_list")
        if job.start_qps is not None and not cfg.sla:
            raise InputError(f"{where}.start_qps", "an adaptive job needs sla rules to decide pass or fail; add sla "
                                                   "or use qps_list")
        _validate_predict(job_config(cfg, job), f"{where}.benchmark_overrides")
    return cfg, config_dir


def job_qps_list(cfg: CapacityConfig, job: Job) -> list[float] | None:
    """A linear job's list (its own, else the shared ``search.qps_list``); None for adaptive."""
    if job.start_qps is not None:
        return None
    return list(job.qps_list if job.qps_list is not None else cfg.search.qps_list)


def job_config(cfg: CapacityConfig, job: Job) -> dict:
    """The job's predict config mapping: the base with its overrides merged."""
    return deep_merge(cfg.base_mapping(), job.benchmark_overrides)


def trial_config(mapping: dict, qps: float, trace_rps: float | None) -> dict:
    """The predict config of one trial at ``qps`` (see the module docs); ``trace_rps``: the trace's
    requests per second (None for synthetic traffic)."""
    out = copy.deepcopy(mapping)
    traffic = out.setdefault("traffic", {})
    load = traffic.get("load") or {}
    if trace_rps is not None:
        traffic["load"] = {"type": "trace_timestamps", "speedup": qps / trace_rps}
    else:
        seed = load.get("seed", 42) if isinstance(load, dict) else 42
        traffic["load"] = {"type": "poisson", "requests_per_second": qps, "seed": seed}
    return out
