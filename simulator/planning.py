"""Build the Planner of a replay from its PlannerConfig and the engine pools, and report it.

- settings: the config's values with the seed's rules (``planner_config``), the mode and the
  GPUs per replica of each role (``ParallelShape.planner_gpus_per_replica``: tensor x attention_data);
- the perf model (target sla) bootstrapped from each role's own timing model
  (``metadata.bootstrap``: installed / not_required);
- the load predictor warmed with ``load_predictor_warmup_trace`` (target sla);
- the ``planner`` report object of prediction.json.
"""

from __future__ import annotations

import hashlib
import logging

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
from aisim.simulator.config.planner_config import IDENTITY_EXCLUSIONS, PlannerConfig, digest, effective_loops, tick_interval_s
from aisim.simulator.errors import InputError

log = logging.getLogger("aisim.planner")

BUILTIN_PLUGINS = ["builtin_load_predict", "builtin_load_propose", "builtin_throughput_propose"]


def capabilities(pool) -> Capabilities:
    """What a rank of ``pool`` (a ``PoolPlan``) can hold, as the Planner's perf model reads it."""
    sched = pool.scheduler
    return Capabilities(
        max_batched_tokens=sched.max_batched_tokens,
        max_sequences=sched.max_sequences,
        context_length=sched.context_length or 1 << 30,
        max_kv_tokens=sched.num_gpu_blocks * sched.block_size,
    )


def build_planner(pc: PlannerConfig, pools: list, timings: dict[str, TimingModel], capture_details: bool = True,
                  field: str = "planner", warmup: tuple | None = None) -> Planner:
    """The Planner of a replay; ``warmup``: the load predictor's history per throughput interval
    (None: read from ``pc.load_predictor_warmup_trace``)."""
    roles = {p.role: p for p in pools}
    disagg = "prefill" in roles
    if (pc.mode == "disagg") != disagg:
        raise InputError(f"{field}.mode", f"mode {pc.mode} does not match the engine ("
                                          f"{'prefill/decode' if disagg else 'aggregated'} workers)")
    thr, load = effective_loops(pc)
    tick = tick_interval_s(pc, field)
    if pc.optimization_target == "load":
        need = ["decode_scale_up_kv_rate", "decode_scale_down_kv_rate"]
        if disagg:
            need += ["prefill_scale_up_queue_tokens", "prefill_scale_down_queue_tokens"]
        for key in need:
            if getattr(pc, key) is None:
                raise InputError(f"{field}.{key}", "target load needs its thresholds")
    spec = PredictorSpec(pc.load_predictor, pc.load_predictor_log1p, pc.prophet_window_size, pc.kalman_q_level,
                         pc.kalman_q_trend, pc.kalman_r, pc.kalman_min_points)
    if thr:
        try:
            check_available(spec)
        except PredictorUnavailable as exc:
            raise InputError(f"{field}.load_predictor", str(exc)) from None

    def gpus(role: str, explicit) -> int:
        if explicit is not None:
            return explicit
        return roles[role].shape.planner_gpus_per_replica  # (simulator.deployment says why not gpus_per_worker)

    decode_role = "decode" if disagg else "aggregated"
    settings = PlannerSettings(
        mode=pc.mode,
        target=pc.optimization_target,
        enable_throughput_scaling=thr,
        enable_load_scaling=load,
        throughput_interval_s=float(pc.throughput_adjustment_interval),
        load_interval_s=float(pc.load_adjustment_interval),
        tick_interval_s=tick,
        max_throughput_scaling_replicas=pc.max_throughput_scaling_replicas,
        max_num_fpm_samples=pc.max_num_fpm_samples,
        fpm_sample_bucket_size=pc.fpm_sample_bucket_size,
        load_scaling_down_sensitivity=pc.load_scaling_down_sensitivity,
        load_min_observations=pc.load_min_observations,
        predictor=spec,
        advisory=pc.advisory,
        max_gpu_budget=pc.max_gpu_budget,
        min_gpu_budget=pc.min_gpu_budget,
        min_endpoint=pc.min_endpoint,
        prefill_min_endpoint=pc.prefill_min_endpoint,
        decode_min_endpoint=pc.decode_min_endpoint,
        ttft_ms=pc.ttft_ms,
        itl_ms=pc.itl_ms,
        prefill_scale_up_queue_tokens=pc.prefill_scale_up_queue_tokens,
        prefill_scale_down_queue_tokens=pc.prefill_scale_down_queue_tokens,
        decode_scale_up_kv_rate=pc.decode_scale_up_kv_rate,
        decode_scale_down_kv_rate=pc.decode_scale_down_kv_rate,
        prefill_engine_num_gpu=gpus("prefill", pc.prefill_engine_num_gpu) if disagg else 1,
        decode_engine_num_gpu=gpus(decode_role, pc.decode_engine_num_gpu),
    )
    _check_budget(pc, field)
    planner = Planner(settings, capture_details=capture_details)
    if pc.optimization_target == "sla":
        models = {}
        boot = {"status": "installed", "benchmark_granularity": BENCHMARK_GRANULARITY, "prefill_fpm_count": 0,
                "decode_fpm_count": 0}
        digests = []
        for key, role in (("prefill", "prefill"), ("decode", "decode")) if disagg else (("agg", "aggregated"),):
            caps = capabilities(roles[role])
            m = PerfModel(key, caps, pc.max_num_fpm_samples, pc.fpm_sample_bucket_size, pc.load_min_observations)
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
        if thr and warmup is not None:
            planner.warm_up(list(warmup))
        elif thr and pc.load_predictor_warmup_trace:
            planner.warm_up(warmup_windows(pc.load_predictor_warmup_trace, pc.throughput_adjustment_interval,
                                           f"{field}.load_predictor_warmup_trace"))
    else:
        planner.bootstrap = {"status": "not_required"}
    planner.config_digest = digest(pc)
    if pc.advisory:
        log.warning("[ADVISORY] the Planner makes every decision but changes nothing; replicas stay at their "
                    "starting counts")
    return planner


def _check_budget(pc: PlannerConfig, field: str) -> None:
    """Reject a GPU band nothing can satisfy: min_gpu_budget over max_gpu_budget (negative budgets
    are no bound). Minimum workers over the ceiling are not an error: the reference clamps them
    (the Planner then holds every scale-up)."""
    hi, lo = pc.max_gpu_budget, pc.min_gpu_budget
    if 0 <= hi < lo:
        key = "min_num_gpus" if field == "planner" else "min_gpu_budget"  # the YAML's name or PlannerConfig's
        raise InputError(f"{field}.{key}", f"{lo} is over max_gpu_budget {hi}; lower it or raise max_gpu_budget",
                         category="gpu_budget")


def _pass_ms(timing: TimingModel, caps: Capabilities):
    total = caps.max_kv_tokens

    def f(prefill_tokens: int, num_decode: int, decode_kv: int) -> float:
        shape = PassShape(1 if prefill_tokens else 0, prefill_tokens, prefill_tokens, 0, num_decode, decode_kv, total)
        return timing.pass_ms(shape)

    return f


def warmup_windows(spec: str, interval_s: int, field: str) -> list[tuple[int, float, float]]:
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
