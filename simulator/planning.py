"""The Planner of a replay: ``lower_planner`` is the one lowering of a validated ``planner``
section (a config's, or the Python API's PlannerConfig through its adapter) onto the engine pools,
giving a ``PlannerPlan`` (the actor's ``PlannerSettings``, the resolved retune section and the
warm-up trace); ``build_planner`` builds the actor from it; ``planner_report`` reports it.

- settings: the section's values with the seed's rules (reference planner section 1: the loops
  each target runs, target load's fixed thresholds, target sla's latency targets from
  ``evaluation.sla``, the interval rules and the tick), the mode and the GPUs per replica of each
  role (``ParallelShape.planner_gpus_per_replica``: tensor x attention_data);
- the perf model (target sla) bootstrapped from each role's own timing model
  (``metadata.bootstrap``: installed / not_required);
- the load predictor warmed with ``load_predictor_warmup_trace`` (target sla);
- the ``planner`` report object of prediction.json.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aisim.actors.engine.timing import PassShape, TimingModel
from aisim.actors.messages import Capabilities
from aisim.actors.planner.perf_model import (
    BENCHMARK_GRANULARITY,
    PerfModel,
    bootstrap_samples,
    install_bootstrap,
)
from aisim.actors.planner.planner import Planner, PlannerSettings
from aisim.actors.planner.predictors import PredictorSpec, PredictorUnavailable, check_available
from aisim.simulator.builders import capabilities
from aisim.simulator.config import models as m
from aisim.simulator.config.planner_config import IDENTITY_EXCLUSIONS
from aisim.simulator.config.retune import RetuneConfig
from aisim.simulator.config.retune import resolve as resolve_retune
from aisim.simulator.errors import InputError

log = logging.getLogger("aisim.planner")

BUILTIN_PLUGINS = ["builtin_load_predict", "builtin_load_propose", "builtin_throughput_propose"]


@dataclass(frozen=True)
class PlannerPlan:
    """The Planner of a replay as the actors take it: the actor's own settings, the resolved
    retune section (None: no retune) and the load predictor's warm-up trace (None: none)."""
    settings: PlannerSettings
    retune: RetuneConfig | None = None
    warmup_trace: str | None = None

    def knob(self, name: str):
        """A Planner runtime knob by its config name (retune's, the YAML's)."""
        return self.settings.knob(name)

    def with_knobs(self, changes: dict, retune: bool = True) -> PlannerPlan:
        """This plan with Planner runtime knobs changed (config names); ``retune`` False drops retune."""
        return dataclasses.replace(self, settings=self.settings.with_knobs(changes) if changes else self.settings,
                                   retune=self.retune if retune else None)

    def digest(self) -> str:
        """sha256 of what decides (settings and retune, not I/O): ``planner_config_digest``.
        (``early_drop`` decides nothing: a sweep decides the same with or without it.)"""
        doc = {"settings": dataclasses.asdict(self.settings),
               "retune": self.retune.model_dump(mode="json", exclude={"max_parallel", "early_drop"})
               if self.retune else None}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


# the section's keys that PlannerSettings takes under the same name
_SAME_NAMES = ("max_throughput_scaling_replicas", "max_num_fpm_samples", "fpm_sample_bucket_size",
               "load_scaling_down_sensitivity", "load_min_observations", "advisory")
# target load's thresholds when the section leaves them out (the reference's fixed values)
LOAD_THRESHOLDS = {"decode_scale_up_kv_rate": 90.0, "decode_scale_down_kv_rate": 70.0}
LOAD_PREFILL_THRESHOLDS = {"prefill_scale_up_queue_tokens": 1.0, "prefill_scale_down_queue_tokens": 0.0}


def lower_planner(p: m.Planner, pools: list, sla: m.Sla | None, field: str = "planner",
                  name: Callable[[str], str] = str, config_dir: Path | None = None) -> PlannerPlan:
    """The one lowering of a validated ``planner`` section (``policy: enabled``) onto the engine
    pools (``PoolPlan``s, entry pool first) with ``evaluation.sla``. ``field``/``name``: how errors
    name the section and a key of it (the API passes ``planner_config`` and PlannerConfig's names);
    ``config_dir``: where a relative warm-up trace may also be found."""
    def where(key: str) -> str:
        return f"{field}.{name(key)}"

    roles = {pl.role: pl for pl in pools}
    disagg = "prefill" in roles
    if not disagg:  # aggregated workers are the decode side and have no per-role minimum
        instead = {"prefill_min_workers": "min_workers", "decode_min_workers": "min_workers",
                   "prefill_engine_num_gpu": "decode_engine_num_gpu",
                   "prefill_scale_up_queue_tokens": "decode_scale_up_kv_rate",
                   "prefill_scale_down_queue_tokens": "decode_scale_down_kv_rate"}
        for key, other in instead.items():
            if getattr(p, key) is not None:
                raise InputError(where(key), f"needs engine.mode disaggregated; use {name(other)}")
    retune_only = p.retune is not None and p.enable_throughput_scaling is False and p.enable_load_scaling is False
    if retune_only:
        thr = load = False
    elif p.target == "sla":
        thr = True if p.enable_throughput_scaling is None else p.enable_throughput_scaling
        load = False if p.enable_load_scaling is None else p.enable_load_scaling
    else:  # throughput, latency and load run load scaling only
        thr, load = False, True
    own = {"ttft_ms": p.ttft_ms, "itl_ms": p.itl_ms}
    if p.target == "sla":
        for key in own:
            if own[key] is None and sla is not None:
                own[key] = getattr(sla, key)
        if thr and (own["ttft_ms"] is None or own["itl_ms"] is None):
            raise InputError("evaluation.sla", "planner target sla needs evaluation.sla.ttft_ms and itl_ms (or "
                                               "planner.ttft_ms and itl_ms); an SLA with only e2e_ms cannot size "
                                               "throughput")
    elif p.retune is None:
        for key in [k for k, v in own.items() if v is not None]:
            log.warning("%s is only used by target sla (target is %s)", where(key), p.target)
    thresholds = {k: getattr(p, k) for k in (*LOAD_THRESHOLDS, *LOAD_PREFILL_THRESHOLDS)}
    if p.target == "load":
        for key, v in (LOAD_THRESHOLDS | (LOAD_PREFILL_THRESHOLDS if disagg else {})).items():
            thresholds[key] = v if thresholds[key] is None else thresholds[key]
    else:
        for key in [k for k, v in thresholds.items() if v is not None]:
            log.warning("%s is only used by target load (target is %s)", where(key), p.target)
    thr_s = float(p.throughput_adjustment_interval_seconds or 180)
    load_s = float(p.load_adjustment_interval_seconds or 5.0)
    tick = _tick_s(thr, load, retune_only, thr_s, load_s, p.scale_interval_seconds, where)
    spec = PredictorSpec(p.load_predictor, p.load_predictor_log1p, p.prophet_window_size, p.kalman_q_level,
                         p.kalman_q_trend, p.kalman_r, p.kalman_min_points)
    if thr:
        try:
            check_available(spec)
        except PredictorUnavailable as exc:
            raise InputError(where("load_predictor"), str(exc)) from None
    if 0 <= p.max_num_gpus < p.min_num_gpus:  # (negative budgets are no bound; minimum workers over
        # the ceiling are not an error: the reference clamps them and the Planner holds every scale-up)
        raise InputError(where("min_num_gpus"), f"{p.min_num_gpus} is over {name('max_num_gpus')} {p.max_num_gpus}; "
                                                f"lower it or raise {name('max_num_gpus')}", category="gpu_budget")

    def gpus(role: str, explicit) -> int:
        if explicit is not None:
            return explicit
        return roles[role].shape.planner_gpus_per_replica  # (simulator.deployment says why not gpus_per_worker)

    settings = PlannerSettings(
        mode="disagg" if disagg else "agg",
        target=p.target,
        enable_throughput_scaling=thr,
        enable_load_scaling=load,
        throughput_interval_s=thr_s,
        load_interval_s=load_s,
        tick_interval_s=tick,
        **{k: getattr(p, k) for k in _SAME_NAMES},
        predictor=spec,
        max_gpu_budget=p.max_num_gpus,
        min_gpu_budget=p.min_num_gpus,
        min_endpoint=p.min_workers,
        prefill_min_endpoint=p.prefill_min_workers,
        decode_min_endpoint=p.decode_min_workers,
        ttft_ms=500.0 if own["ttft_ms"] is None else float(own["ttft_ms"]),
        itl_ms=50.0 if own["itl_ms"] is None else float(own["itl_ms"]),
        **thresholds,
        prefill_engine_num_gpu=gpus("prefill", p.prefill_engine_num_gpu) if disagg else 1,
        decode_engine_num_gpu=gpus("decode" if disagg else "aggregated", p.decode_engine_num_gpu),
    )
    rc = None
    if p.retune is not None:  # scored against evaluation.sla where set, else the Planner's own targets
        rc = resolve_retune(
            p.retune, field=field, tick_s=tick, throughput=thr, load=load, target=p.target,
            load_predictor=p.load_predictor, throughput_interval_s=thr_s,
            ttft_ms=sla.ttft_ms if sla is not None and sla.ttft_ms is not None else settings.ttft_ms,
            itl_ms=sla.itl_ms if sla is not None and sla.itl_ms is not None else settings.itl_ms)
    warmup = p.load_predictor_warmup_trace
    if warmup:
        warmup = _beside_config(warmup, config_dir)
    return PlannerPlan(settings, rc, warmup or None)


def _tick_s(thr: bool, load: bool, retune_only: bool, thr_s: float, load_s: float, given: float | None,
            where: Callable[[str], str]) -> float:
    """The Planner's tick: ``scale_interval_seconds`` where given, else the millisecond GCD of the
    intervals of the loops that run (retune-only mode: the load interval)."""
    if retune_only:
        return given if given is not None else round(load_s * 1000) / 1000.0
    if not thr and not load:
        raise InputError(where("enable_load_scaling"), "at least one of enable_throughput_scaling and "
                                                       "enable_load_scaling must be on")
    if thr and load and not load_s < thr_s:
        raise InputError(where("load_adjustment_interval_seconds"), "must be shorter than the throughput interval "
                                                                    "when both loops run")
    if given is not None:
        return given
    ms = ([round(load_s * 1000)] if load else []) + ([round(thr_s * 1000)] if thr else [])
    g = 0
    for x in ms:
        g = math.gcd(g, int(x))
    return g / 1000.0


def _beside_config(raw: str, config_dir: Path | None) -> str:
    """A relative path is looked up in the working directory first, then next to the config file
    (as trace paths are)."""
    path = Path(raw)
    if config_dir is None or path.is_absolute() or path.exists() or not (config_dir / path).exists():
        return raw
    return str(config_dir / path)


def build_planner(pp: PlannerPlan, pools: list, timings: dict[str, TimingModel], capture_details: bool = True,
                  field: str = "planner", warmup: tuple | None = None) -> Planner:
    """The Planner of a replay; ``warmup``: the load predictor's history per throughput interval
    (None: read from ``pp.warmup_trace``)."""
    s = pp.settings
    roles = {p.role: p for p in pools}
    disagg = s.mode == "disagg"
    planner = Planner(s, capture_details=capture_details)
    if s.target == "sla":
        models = {}
        boot = {"status": "installed", "benchmark_granularity": BENCHMARK_GRANULARITY, "prefill_fpm_count": 0,
                "decode_fpm_count": 0}
        digests = []
        for key, role in (("prefill", "prefill"), ("decode", "decode")) if disagg else (("agg", "aggregated"),):
            caps = capabilities(roles[role])
            m = PerfModel(key, caps, s.max_num_fpm_samples, s.fpm_sample_bucket_size, s.load_min_observations)
            samples = bootstrap_samples(_pass_ms(timings[role], caps), caps, key)
            install_bootstrap(m, samples)
            models[key] = m
            boot["prefill_fpm_count"] += len(samples.prefill)
            boot["decode_fpm_count"] += len(samples.decode)
            boot[f"{key}_source"] = timings[role].describe()["estimator"]
            digests.append(samples.sha256)
        boot["fpm_sha256"] = hashlib.sha256("".join(digests).encode()).hexdigest() if disagg else digests[0]
        planner.perf_models = models
        planner.bootstrap = boot
        if s.enable_throughput_scaling and warmup is not None:
            planner.warm_up(list(warmup))
        elif s.enable_throughput_scaling and pp.warmup_trace:
            planner.warm_up(warmup_windows(pp.warmup_trace, s.throughput_interval_s, f"{field}.load_predictor_warmup_trace"))
    else:
        planner.bootstrap = {"status": "not_required"}
    planner.config_digest = pp.digest()
    if s.advisory:
        log.warning("[ADVISORY] the Planner makes every decision but changes nothing; replicas stay at their "
                    "starting counts")
    return planner


def _pass_ms(timing: TimingModel, caps: Capabilities):
    total = caps.max_kv_tokens

    def f(prefill_tokens: int, num_decode: int, decode_kv: int) -> float:
        shape = PassShape(1 if prefill_tokens else 0, prefill_tokens, prefill_tokens, 0, num_decode, decode_kv, total)
        return timing.pass_ms(shape)

    return f


def warmup_windows(spec: str, interval_s: float, field: str) -> list[tuple[int, float, float]]:
    """Bucket a recorded trace into throughput-interval windows: (count, mean ISL, mean OSL);
    empty windows count 0. Paths resolve against the working directory."""
    from aisim.simulator.traffic.traces import read_dynamo, read_mooncake, resolve_trace_paths

    paths = resolve_trace_paths([spec], field)
    head = paths[0].read_text(encoding="utf-8", errors="replace")[:4096] if not paths[0].name.endswith(".gz") else ""
    w = read_dynamo(paths) if ('"schema"' in head or paths[0].name.endswith(".gz")) else read_mooncake(paths)
    t = w.timestamp_ms
    t = np.where(np.isnan(t), 0.0, t - np.nanmin(t))
    return interval_buckets(t, w.input_len, w.output_len, 0.0, interval_s * 1000.0)


def interval_buckets(times_ms, isl, osl, zero_ms: float, width_ms: float, lo: int = 0,
                     hi: int | None = None) -> list[tuple[float, float, float]]:
    """(count, mean ISL, mean OSL) of the requests arriving in each bucket ``k = lo .. hi - 1``,
    bucket ``k`` = ``[zero + k width, zero + (k + 1) width)`` (``hi`` None: up to the last
    arrival's); an empty bucket counts 0. The Planner's load-predictor history (warm-up, retune's
    history and pre-sweep, Spica's pre-sweep)."""
    t = np.asarray(times_ms, dtype=np.float64)
    idx = np.floor((t - zero_ms) / width_ms).astype(np.int64)
    if hi is None:
        hi = int(idx.max()) + 1 if len(idx) else lo
    isl = np.asarray(isl)
    osl = np.asarray(osl)
    out = []
    for k in range(lo, hi):
        sel = idx == k
        n = int(sel.sum())
        out.append((float(n), float(isl[sel].mean()) if n else 0.0, float(osl[sel].mean()) if n else 0.0))
    return out


def planner_report(planner: Planner, lifecycle: list[dict], capture_details: bool) -> dict:
    s = planner.settings
    metadata = {
        "planner_config_digest": planner.config_digest,
        "planner_config_identity_exclusions": list(IDENTITY_EXCLUSIONS),
        "builtin_plugin_ids": list(BUILTIN_PLUGINS),
        "configured_plugin_identities": [],
        "plugin_pipeline": ["builtin_load_predict", "builtin_throughput_propose", "builtin_load_propose"]
        if s.enable_throughput_scaling else ["builtin_load_propose"],
        "pipeline_schema_version": "planner-plugin-pipeline.v1",
        "mode": s.mode,
        "target": s.target,
        "enable_throughput_scaling": s.enable_throughput_scaling,
        "enable_load_scaling": s.enable_load_scaling,
        "tick_interval_s": s.tick_interval_s,
        "benchmark_granularity": BENCHMARK_GRANULARITY,
        "bootstrap": planner.bootstrap,
        "details_captured": capture_details,
        "advisory": s.advisory,
        "load_predictor": s.predictor.describe() if s.enable_throughput_scaling else None,
    }
    out = {
        "metadata": metadata,
        "scaling_events": planner.scaling_events,
        "total_ticks": planner.total_ticks,
        "html_report_path": None,  # the caller fills it in when it writes the HTML report
        "retune_events": None,
    }
    if capture_details:
        out["ticks"] = planner.ticks
        out["lifecycle_operations"] = lifecycle
    if s.advisory:
        out["recommended_scaling_events"] = planner.recommended_scaling_events
    return out
