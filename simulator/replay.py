"""Public Python API: replay a trace (or synthetic traffic) and get a ``ReplayReport``.

    from simulator.replay import run_trace_replay
    report = run_trace_replay("trace.jsonl", extra_engine_args={"num_gpu_blocks": 29249}, num_workers=2)
    report.summary["mean_ttft_ms"]; report.to_dict()  # == prediction.json

``run_config`` runs a validated ``predict`` config (what ``aisim predict`` calls).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from simulator.catalog.hardware import get_hardware
from simulator.catalog.kv_capacity import DEFAULT_MEMORY_FRACTION, default_capacity, kv_bytes_per_token
from simulator.catalog.models import load_geometry, resolve_model
from simulator.config import models as m
from simulator.config.engine_args import BACKEND_BLOCK_SIZE, EngineArgs, TimingModelArgs
from simulator.config.loading import format_validation_error
from simulator.config.support import check_supported
from simulator.config.planner_config import PlannerConfig, from_replay_section, parse_planner_config
from actors.engine.host import HostPool
from simulator.coordinator import Coordinator, KvTransferModel, Pool
from simulator.runtime.local import LocalRuntime
from simulator.metrics.planner_html import write_planner_html
from simulator.planning import build_planner, capabilities, planner_report
from simulator.errors import InputError, NotSupportedError
from simulator.metrics.collector import RequestLog
from simulator.metrics.summary import PoolAccounting, RunCounters, completed_duration_ms, summarize
from simulator.builders import RouterSpec, build_decode_router, build_router, build_timing, build_workers
from simulator.traffic.arrivals import ArrivalProcess, ClosedLoop, constant_times, poisson_times, trace_times
from simulator.traffic.build import TrafficPlan, open_loop, build_traffic, synthetic_workload
from simulator.traffic.traces import read_dynamo, read_mooncake, resolve_trace_paths
from simulator.traffic.workload import BlockHashStore

__all__ = ["ReplayReport", "run_trace_replay", "run_synthetic_trace_replay", "run_config", "ReplayPlan", "PoolPlan",
           "ExecutionPlan"]


@dataclass
class ReplayReport:
    """Result of one replay. ``to_dict()`` is exactly prediction.json."""

    summary: dict
    per_request: list[dict] | None
    coverage: dict
    planner: dict | None = None
    diagnostics: dict = field(default_factory=dict)  # simulator internals, not part of prediction.json

    def to_dict(self) -> dict:
        return {"summary": self.summary, "per_request": self.per_request, "coverage": self.coverage, "planner": self.planner}


@dataclass
class PoolPlan:
    role: str  # aggregated | prefill | decode
    replicas: int
    args: EngineArgs
    kv_sizing: dict | None = None  # how num_gpu_blocks was resolved (reported in provenance)


@dataclass(frozen=True)
class ExecutionPlan:
    """Where the actors live and how the clock synchronises them."""

    backend: str = "local"  # local | ray
    router_sync_ms: float = 0.0  # 0: exact lockstep; W > 0: the router sees worker state up to W old
    engine_actors: int | None = None  # engine hosts (Ray actors); None: one per CPU, at most one per worker
    ray_address: str | None = None  # None: start a local Ray; "auto" or HOST:PORT: join that cluster
    wire: bool = False  # in process: round-trip every message through msgpack (verification)


@dataclass
class ReplayPlan:
    traffic: TrafficPlan
    pools: list[PoolPlan]  # [aggregated] or [prefill, decode]
    router: RouterSpec = RouterSpec()
    sla: m.Sla | None = None
    capture_per_request: bool = False
    fast_forward: bool = True  # False steps every pass (same results, slower; for verification)
    transfer: KvTransferModel | None = None  # disaggregated only
    seed: int = 42  # root of the actors' random streams
    planner: PlannerConfig | None = None
    capture_planner_details: bool = True
    write_html_report: bool = False  # the Python API's diagnostics page (never from aisim predict)
    planner_field: str = "planner"  # how errors name the Planner's configuration
    execution: ExecutionPlan = ExecutionPlan()


# -- running ------------------------------------------------------------------------
def run_plan(plan: ReplayPlan, resource_guard=None) -> ReplayReport:
    t_wall = time.perf_counter()
    w = plan.traffic.workload
    store = BlockHashStore(w)
    provenance: dict[str, Any] = {}
    accounting = []
    entry_plan = plan.pools[0]
    decode_plan = plan.pools[1] if len(plan.pools) > 1 else None
    entry_router = build_router(plan.router, entry_plan.args.block_size, plan.seed, entry_plan.role)
    decode_router = build_decode_router(decode_plan.args.block_size, plan.seed) if decode_plan else None
    pools: list[Pool] = []
    timings = {}
    num_workers = 0
    for pool in plan.pools:
        timing = build_timing(pool.args, f"engine.workers.{pool.role}.timing")
        timings[pool.role] = timing
        router = decode_router if pool.role == "decode" else entry_router
        make = partial(build_workers, pool.args, 1, timing=timing, fast_forward=plan.fast_forward,
                       record_kv_events=pool.role != "decode" and router.needs_kv_events,
                       pool_label="decode" if pool.role == "decode" else None)
        a = pool.args
        pools.append(Pool(pool.role, list(range(num_workers, num_workers + pool.replicas)), router, a.block_size,
                          caps=capabilities(a), gpus_per_worker=a.gpus_per_worker,
                          startup_ms=(a.startup_time or 0.0) * 1000.0, spawn=_Spawn(make), num_ranks=a.dp_size))
        num_workers += pool.replicas
        provenance[pool.role] = {
            **timing.describe(),
            "kv_capacity_blocks_per_rank": a.num_gpu_blocks,
            "kv_block_size": a.block_size,
            "kv_bytes_per_token": a.kv_cache_bytes_per_token,
            "attention_data_ranks": a.dp_size,
            "gpus_per_worker": a.gpus_per_worker,
            "replicas": pool.replicas,
            "context_length": a.max_model_len,
            "backend": a.engine_type,
            "backend_version": a.backend_version,
            "model": a.model,
            "model_source": resolve_model(a.model).origin if a.model else None,
            "hardware": a.hardware,
            "kv_sizing": pool.kv_sizing,
        }
    planner = None
    if plan.planner is not None:
        planner = build_planner(plan.planner, plan.pools, timings, plan.capture_planner_details, plan.planner_field)
    log = RequestLog(capture=plan.capture_per_request, uuid_of=w.request_uuid)
    decode_pool = pools[1] if decode_plan else None
    planner_wall = [0.0, 0.0]

    def hook(entering: bool) -> None:  # wall time spent in Planner ticks (outside the model)
        if entering:
            planner_wall[1] = time.perf_counter()
        else:
            planner_wall[0] += time.perf_counter() - planner_wall[1]

    ex = plan.execution
    runtime = make_runtime(ex, pools, w, store, entry_router, decode_router, planner)
    try:
        coord = Coordinator(w, store, plan.traffic.arrivals.start(), runtime, pools[0], log, decode=decode_pool,
                            transfer=plan.transfer, stop_ms=plan.traffic.stop_ms, resource_guard=resource_guard,
                            has_planner=planner is not None, window_ms=ex.router_sync_ms)
        coord.planner_hook = hook
        stats = coord.run()
        if planner is not None:
            planner = runtime.planner()
    finally:
        runtime.close()
    totals = coord.worker_totals
    gap_sinks = coord.gap_sinks
    runtime_info = {"backend": runtime.name, "num_hosts": runtime.num_hosts, "num_edges": coord.num_edges,
                    **runtime.counters.as_dict()}

    provisioned = coord.worker_seconds(completed_duration_ms(log)) if planner is not None else {}
    for pool in plan.pools:
        role = "prefill" if pool.role == "prefill" else "decode"
        accounting.append(PoolAccounting(role, pool.args.gpus_per_worker, replicas=pool.replicas,
                                         worker_seconds=provisioned.get(pool.role) if planner is not None else None))
    counters = RunCounters(
        committed_prefill_tokens=sum(t[0] for t in totals),
        generated_tokens=sum(t[1] for t in totals),
        num_preemptions=sum(t[2] for t in totals),
        num_passes=sum(t[3] for t in totals),
        num_offered=coord.num_offered,
        provenance=provenance,
    )
    wall_ms = (time.perf_counter() - t_wall) * 1000.0
    summary = summarize(log, gap_sinks, accounting, counters, plan.sla, wall_ms,
                        planner_total_ticks=planner.total_ticks if planner is not None else None)
    summary["deployment"] = {
        "mode": "disaggregated" if decode_plan else "aggregated",
        "router": entry_router.describe(),
        "decode_router": decode_router.describe() if decode_router else None,
        "workers": {p.role: p.replicas for p in plan.pools},  # at the start
        "gpus": sum(p.replicas * p.args.gpus_per_worker for p in plan.pools),
        "kv_transfer": ({"bandwidth_gb_per_second": plan.transfer.bandwidth_gb_per_second,
                         "bytes_per_token": plan.transfer.bytes_per_token, "timing_mode": plan.transfer.timing_mode}
                        if decode_plan and plan.transfer else None),
        "seed": plan.seed,
        "router_sync_ms": float(ex.router_sync_ms),
    }
    per_request = None
    if log.records is not None:
        per_request = sorted(log.records, key=lambda r: (r["arrival_time_ms"], r["uuid"]))
    coverage = {
        "capture_per_request": plan.capture_per_request,
        "capture_planner_details": planner is not None and plan.capture_planner_details,
        "per_request_records": len(per_request) if per_request is not None else 0,
    }
    planner_obj = None
    if planner is not None:
        planner_obj = planner_report(planner, plan.planner, coord.lifecycle_operations, plan.capture_planner_details)
        if plan.write_html_report and plan.capture_planner_details:
            planner_obj["html_report_path"] = write_planner_html(planner_obj, summary)
    diagnostics = {
        "num_events": stats.num_events,
        "num_passes": counters.num_passes,
        "num_fast_forward_runs": sum(t[4] for t in totals),
        "num_workers": len(totals),
        "num_transfers": stats.num_transfers,
        "planner_wall_s": planner_wall[0] if planner is not None else None,
        "traffic": plan.traffic.description,
        "runtime": runtime_info,
    }
    return ReplayReport(summary, per_request, coverage, planner_obj, diagnostics)


def make_runtime(ex: ExecutionPlan, pools: list[Pool], workload, store, entry_router, decode_router, planner):
    """The actors' home: in process (one host called directly, by default) or on Ray."""
    host_pools = {p.role: HostPool(p.spawn, p.router.tracks_first_tokens and p.role == "aggregated",
                                   p.role == "prefill") for p in pools}
    roles = [p.role for p in pools for _ in p.worker_ids]
    routers = {pools[0].role: entry_router}
    if decode_router is not None:
        routers["decode"] = decode_router
    if ex.backend == "ray":
        from simulator.runtime.ray_runtime import RayRuntime

        return RayRuntime(host_pools, workload, roles, ex.engine_actors, routers, planner, ex.ray_address)
    return LocalRuntime(host_pools, store, roles, ex.engine_actors or 1, routers, planner, wire=ex.wire)


class _Spawn:
    """Builds worker ``wid`` of a pool (picklable, for hosts in other processes)."""

    def __init__(self, make) -> None:
        self.make = make

    def __call__(self, wid: int):
        return self.make(first_id=wid)[0]


# -- from a predict config ------------------------------------------------------------
def plan_from_config(cfg: m.PredictConfig, config_dir: Path | None = None, capture_per_request: bool = False,
                     fast_forward: bool = True) -> ReplayPlan:
    check_supported(cfg)
    e = cfg.engine
    geometry = load_geometry(e.model)
    context = geometry.max_position_embeddings if e.context_length == "max" else int(e.context_length)
    pools = []
    sizings: dict[str, dict] = {}
    for role, wk in e.workers.items():
        base = f"engine.workers.{role}"
        par = wk.parallelism
        bs = wk.kv_cache.block_size or BACKEND_BLOCK_SIZE[e.backend]
        if e.backend in ("vllm", "trtllm") and bs < 2:
            raise InputError(f"{base}.kv_cache.block_size", f"must be >= 2 with backend {e.backend}")
        hardware = get_hardware(wk.hardware or e.hardware, f"{base}.hardware" if wk.hardware else "engine.hardware")
        auto_bpt = kv_bytes_per_token(geometry, par.tensor, par.pipeline)
        bpt = auto_bpt if wk.kv_cache.bytes_per_token == "auto" else wk.kv_cache.bytes_per_token
        cap = wk.kv_cache.capacity
        if cap.type == "default":
            fraction = cap.memory_fraction if cap.memory_fraction is not None else DEFAULT_MEMORY_FRACTION[e.backend]
            sizing = default_capacity(
                geometry, hardware, block_size=bs, max_batched_tokens=wk.scheduler.max_batched_tokens,
                memory_fraction=fraction, tensor=par.tensor, pipeline=par.pipeline, attention_data=par.attention_data,
                moe_tensor=par.moe_tensor, moe_expert=par.moe_expert,
                cuda_graph_reserved_bytes=cap.cuda_graph_reserved_bytes, bytes_per_token=bpt)
            blocks = sizing.blocks
            if blocks <= 0:
                raise InputError(f"{base}.kv_cache.capacity", f"{e.model} leaves no KV memory on {hardware.name} "
                                 f"(weights {sizing.weights_bytes / 1e9:.1f} GB per GPU); raise parallelism.tensor, "
                                 "memory_fraction, or pick a larger GPU", category="kv_capacity")
            sizings[role] = {"type": "default", "memory_fraction": fraction, **sizing.as_dict()}
        else:
            blocks = cap.blocks if cap.blocks is not None else cap.bytes // (bs * bpt)
            if blocks <= 0:
                raise InputError(f"{base}.kv_cache.capacity.bytes", f"{cap.bytes} bytes hold no block of {bs} tokens x {bpt} B/token",
                                 category="kv_capacity")
            sizings[role] = {"type": "fixed", "blocks_per_rank": blocks, "bytes_per_token": bpt}
        t = wk.timing
        timing = TimingModelArgs(type=t.type, prefill_ms=t.prefill_ms, decode_ms=t.decode_ms,
                                 compute_efficiency=t.compute_efficiency, memory_efficiency=t.memory_efficiency,
                                 overhead_ms=t.overhead_ms)
        args = EngineArgs(
            worker_type=role,
            engine_type=e.backend,
            backend_version=e.backend_version,
            model=e.model,
            hardware=hardware.name,
            max_num_batched_tokens=wk.scheduler.max_batched_tokens,
            max_num_seqs=wk.scheduler.max_sequences or (1 if role == "prefill" else 256),
            block_size=bs,
            enable_prefix_caching=wk.kv_cache.prefix_caching,
            enable_chunked_prefill=e.enable_chunked_prefill,
            startup_time=wk.startup_seconds,
            max_model_len=context,
            num_gpu_blocks=blocks,
            tensor_parallel_size=par.tensor,
            pipeline_parallel_size=par.pipeline,
            prefill_context_parallel_size=par.prefill_context,
            dp_size=par.attention_data,
            moe_tensor_parallel_size=par.moe_tensor,
            moe_expert_parallel_size=par.moe_expert,
            timing_model=timing,
            kv_cache_bytes_per_token=bpt,
            prefill_schedule_interval=wk.scheduler.prefill_schedule_interval,
        )
        pools.append(PoolPlan(role, par.replicas, args, sizings[role]))
    pools.sort(key=lambda p: ("prefill", "aggregated", "decode").index(p.role))
    transfer = None
    if e.mode == "disaggregated":
        kt = e.kv_transfer or m.KvTransfer()
        bpt = pools[0].args.kv_cache_bytes_per_token if kt.bytes_per_token == "auto" else kt.bytes_per_token
        transfer = KvTransferModel(kt.bandwidth_gb_per_second, bpt, kt.timing_mode)
    r = cfg.router
    router = RouterSpec(
        r.policy,
        1.0 if r.overlap_score_credit is None else r.overlap_score_credit,
        1.0 if r.prefill_load_scale is None else r.prefill_load_scale,
        0.0 if r.temperature is None else r.temperature,
    )
    traffic = build_traffic(cfg.traffic, config_dir)
    planner = from_replay_section(cfg.planner, e.mode, cfg.evaluation.sla) if cfg.planner.policy == "enabled" else None
    x = cfg.execution
    execution = ExecutionPlan(x.backend, float(x.router_sync_ms), None if x.engine_actors == "auto" else x.engine_actors,
                              x.ray_address)
    return ReplayPlan(traffic, pools, router, cfg.evaluation.sla, capture_per_request, fast_forward, transfer,
                      x.seed, planner, execution=execution)


def run_config(cfg: m.PredictConfig, config_dir: Path | None = None, capture_per_request: bool = False,
               fast_forward: bool = True, resource_guard=None) -> ReplayReport:
    return run_plan(plan_from_config(cfg, config_dir, capture_per_request, fast_forward), resource_guard)


# -- programmatic entry points ----------------------------------------------------------
def _engine_args(raw: dict | EngineArgs | None, name: str = "extra_engine_args") -> EngineArgs:
    if isinstance(raw, EngineArgs):
        return raw
    try:
        return EngineArgs.model_validate(raw or {})
    except ValidationError as exc:
        err = format_validation_error(exc)
        raise InputError(f"{name}.{err.where}", err.message, category=err.category) from None


def _sla(ttft, itl, e2e) -> m.Sla | None:
    if ttft is None and itl is None and e2e is None:
        return None
    try:
        return m.Sla(ttft_ms=ttft, itl_ms=itl, e2e_ms=e2e)
    except ValidationError as exc:
        err = format_validation_error(exc)
        raise InputError(f"sla_{err.where}", err.message, category=err.category) from None


def _router_spec(router_mode: str, router_config: dict | None) -> RouterSpec:
    cfg = dict(router_config or {})
    if "router_temperature" in cfg:
        cfg["temperature"] = cfg.pop("router_temperature")
    unknown = set(cfg) - {"overlap_score_credit", "prefill_load_scale", "temperature"}
    if unknown:
        raise InputError(f"router_config.{sorted(unknown)[0]}", "unknown router knob; use overlap_score_credit, "
                                                               "prefill_load_scale or temperature")
    try:
        r = m.Router(policy=router_mode, **cfg)
    except ValidationError as exc:
        err = format_validation_error(exc)
        raise InputError(f"router_config.{err.where}" if err.where != "policy" else "router_mode", err.message,
                         category=err.category) from None
    return RouterSpec(r.policy, 1.0 if r.overlap_score_credit is None else r.overlap_score_credit,
                      1.0 if r.prefill_load_scale is None else r.prefill_load_scale,
                      0.0 if r.temperature is None else r.temperature)


def _execution(backend: str, router_sync_ms: float, ray_address: str | None, engine_actors: int | None) -> ExecutionPlan:
    try:
        x = m.Execution(backend=backend, router_sync_ms=router_sync_ms, ray_address=ray_address,
                        engine_actors="auto" if engine_actors is None else engine_actors)
    except ValidationError as exc:
        err = format_validation_error(exc)
        raise InputError(err.where or "backend", err.message, category=err.category) from None
    return ExecutionPlan(x.backend, float(x.router_sync_ms), engine_actors, x.ray_address)


def _run_api(traffic: TrafficPlan, extra_args, prefill_args, decode_args, num_workers: int, num_prefill: int,
             num_decode: int, router_mode: str, router_config, planner_config, sla: tuple, capture_per_request: bool,
             fast_forward: bool, seed: int, capture_planner_details: bool, execution: ExecutionPlan) -> ReplayReport:
    planner = parse_planner_config(planner_config) if planner_config is not None else None
    if planner is not None and planner.retune is not None:
        raise NotSupportedError("planner_config.retune", "retune is not supported yet; remove it")
    router = _router_spec(router_mode, router_config)
    transfer = None
    if prefill_args is not None or decode_args is not None:
        if prefill_args is None or decode_args is None or extra_args is not None:
            raise InputError("prefill_engine_args", "disaggregated replay needs prefill_engine_args and "
                                                    "decode_engine_args (and no extra_engine_args)")
        pa = _engine_args({"worker_type": "prefill", "max_num_seqs": 1, **prefill_args}, "prefill_engine_args")
        da = _engine_args({"worker_type": "decode", **decode_args}, "decode_engine_args")
        for name, n in (("num_prefill_workers", num_prefill), ("num_decode_workers", num_decode)):
            if n < 1:
                raise InputError(name, f"must be >= 1, got {n}")
        pools = [PoolPlan("prefill", num_prefill, pa), PoolPlan("decode", num_decode, da)]
        bpt = pa.kv_transfer_bytes_per_token or pa.kv_cache_bytes_per_token
        if bpt is None and pa.model:
            bpt = kv_bytes_per_token(load_geometry(pa.model), pa.tensor_parallel_size, pa.pipeline_parallel_size)
        transfer = KvTransferModel(pa.kv_transfer_bandwidth, bpt, pa.kv_transfer_timing_mode)
    else:
        if num_workers < 1:
            raise InputError("num_workers", f"must be >= 1, got {num_workers}")
        args = _engine_args(extra_args)
        pools = [PoolPlan(args.worker_type, num_workers, args)]
    html = planner is not None and not (planner.report_interval_hours is None and planner.live_dashboard_port == 0)
    return run_plan(ReplayPlan(traffic, pools, router, _sla(*sla), capture_per_request, fast_forward, transfer, seed,
                               planner, capture_planner_details, html, "planner_config", execution))


def run_trace_replay(
    trace_files,
    *,
    extra_engine_args: dict | EngineArgs | None = None,
    prefill_engine_args: dict | None = None,
    decode_engine_args: dict | None = None,
    num_workers: int = 1,
    num_prefill_workers: int = 1,
    num_decode_workers: int = 1,
    router_mode: str = "round_robin",
    router_config: dict | None = None,
    replay_concurrency: int | None = None,
    arrival_speedup_ratio: float = 1.0,
    trace_format: str = "mooncake",
    trace_block_size: int = 512,
    max_sim_time_ms: float | None = None,
    sla_ttft_ms: float | None = None,
    sla_itl_ms: float | None = None,
    sla_e2e_ms: float | None = None,
    planner_config=None,
    capture_per_request: bool = False,
    capture_planner_details: bool = True,
    fast_forward: bool = True,
    seed: int = 42,
    backend: str = "local",
    router_sync_ms: float = 0.0,
    ray_address: str | None = None,
    engine_actors: int | None = None,
) -> ReplayReport:
    """Replay a mooncake or dynamo trace through ``num_workers`` aggregated workers, or through
    ``num_prefill_workers`` + ``num_decode_workers`` given ``prefill_engine_args`` and
    ``decode_engine_args`` (KV transfer: ``kv_transfer_bandwidth`` GB/s, ``kv_transfer_bytes_per_token``,
    ``kv_transfer_timing_mode`` in the prefill arguments). ``router_mode``: round_robin, random or
    kv_router with ``router_config`` {overlap_score_credit, prefill_load_scale, temperature}.

    ``replay_concurrency=None`` paces arrivals by the trace timestamps (divided by
    ``arrival_speedup_ratio``); an int runs a closed loop with that many requests in flight.

    ``backend="ray"`` hosts the workers, router and Planner as Ray actors (``ray_address``:
    join a running cluster; ``engine_actors``: how many actors hold the workers);
    ``router_sync_ms`` lets the router see worker state up to that old (0: exact lockstep).
    """
    paths = [trace_files] if isinstance(trace_files, (str, Path)) else list(trace_files)
    resolved = resolve_trace_paths([str(p) for p in paths], "trace_files")
    if trace_format == "dynamo":
        w = read_dynamo(resolved)
    elif trace_format == "mooncake":
        w = read_mooncake(resolved, trace_block_size, need_timestamps=replay_concurrency is None)
    else:
        raise NotSupportedError("trace_format", f"trace format {trace_format!r} is not supported yet; use mooncake or dynamo")
    if replay_concurrency is not None:
        arrivals: ArrivalProcess = ClosedLoop(w, int(replay_concurrency))
        desc = f"concurrency {replay_concurrency}"
    else:
        if arrival_speedup_ratio <= 0:
            raise InputError("arrival_speedup_ratio", f"must be > 0, got {arrival_speedup_ratio}")
        arrivals = ArrivalProcess(w, trace_times(w, arrival_speedup_ratio), delay_scale=arrival_speedup_ratio)
        desc = f"trace timestamps x{arrival_speedup_ratio}"
    traffic = TrafficPlan(w, arrivals, max_sim_time_ms, "requests", f"{w.description}, {desc}")
    return _run_api(traffic, extra_engine_args, prefill_engine_args, decode_engine_args, num_workers,
                    num_prefill_workers, num_decode_workers, router_mode, router_config, planner_config,
                    (sla_ttft_ms, sla_itl_ms, sla_e2e_ms), capture_per_request, fast_forward, seed,
                    capture_planner_details, _execution(backend, router_sync_ms, ray_address, engine_actors))


def run_synthetic_trace_replay(
    input_tokens: int,
    output_tokens: int,
    request_count: int,
    *,
    extra_engine_args: dict | EngineArgs | None = None,
    prefill_engine_args: dict | None = None,
    decode_engine_args: dict | None = None,
    num_workers: int = 1,
    num_prefill_workers: int = 1,
    num_decode_workers: int = 1,
    router_mode: str = "round_robin",
    router_config: dict | None = None,
    replay_concurrency: int | None = None,
    request_rate: float | None = None,
    arrival_interval_ms: float | None = None,
    arrival_seed: int = 42,
    cached_prefix_tokens: int = 0,
    max_sim_time_ms: float | None = None,
    sla_ttft_ms: float | None = None,
    sla_itl_ms: float | None = None,
    sla_e2e_ms: float | None = None,
    planner_config=None,
    capture_per_request: bool = False,
    capture_planner_details: bool = True,
    fast_forward: bool = True,
    seed: int = 42,
    backend: str = "local",
    router_sync_ms: float = 0.0,
    ray_address: str | None = None,
    engine_actors: int | None = None,
) -> ReplayReport:
    """Fixed-length synthetic requests: exactly one of ``replay_concurrency`` (closed loop),
    ``request_rate`` (Poisson, first at t = 0, seeded by ``arrival_seed``) or ``arrival_interval_ms``."""
    given = [x is not None for x in (replay_concurrency, request_rate, arrival_interval_ms)]
    if sum(given) != 1:
        raise InputError("replay_concurrency", "give exactly one of replay_concurrency, request_rate or arrival_interval_ms")
    for name, v in (("input_tokens", input_tokens), ("request_count", request_count)):
        if v < 1:
            raise InputError(name, f"must be >= 1, got {v}")
    if output_tokens < 0 or not 0 <= cached_prefix_tokens <= input_tokens:
        raise InputError("cached_prefix_tokens", "need 0 <= cached_prefix_tokens <= input_tokens and output_tokens >= 0")
    w = synthetic_workload(request_count, input_tokens, output_tokens, cached_prefix_tokens)
    if replay_concurrency is not None:
        arrivals: ArrivalProcess = ClosedLoop(w, int(replay_concurrency))
    elif request_rate is not None:
        if request_rate <= 0:
            raise InputError("request_rate", f"must be > 0, got {request_rate}")
        arrivals = open_loop(w, poisson_times(request_count, request_rate, arrival_seed))
    else:
        if arrival_interval_ms <= 0:
            raise InputError("arrival_interval_ms", f"must be > 0, got {arrival_interval_ms}")
        arrivals = open_loop(w, constant_times(request_count, 1000.0 / arrival_interval_ms))
    traffic = TrafficPlan(w, arrivals, max_sim_time_ms, "requests", w.description)
    return _run_api(traffic, extra_engine_args, prefill_engine_args, decode_engine_args, num_workers,
                    num_prefill_workers, num_decode_workers, router_mode, router_config, planner_config,
                    (sla_ttft_ms, sla_itl_ms, sla_e2e_ms), capture_per_request, fast_forward, seed,
                    capture_planner_details, _execution(backend, router_sync_ms, ray_address, engine_actors))
