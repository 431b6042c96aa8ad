"""Running a plan: build fresh actors from it, drive them with the coordinator over a runtime,
and assemble the report (``ReplayReport.to_dict()`` is exactly prediction.json)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from actors.engine.host import HostPool
from simulator.builders import build_decode_router, build_router, build_timing, build_workers
from simulator.catalog.models import resolve_model
from simulator.coordinator import Coordinator, Pool
from simulator.metrics.collector import RequestLog
from simulator.metrics.planner_html import write_planner_html
from simulator.metrics.summary import PoolAccounting, RunCounters, completed_duration_ms, summarize
from simulator.plan import ExecutionPlan, ReplayPlan
from simulator.planning import build_planner, capabilities, planner_report
from simulator.runtime.local import LocalRuntime
from simulator.traffic.workload import BlockHashStore

__all__ = ["ReplayReport", "run_plan"]


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


