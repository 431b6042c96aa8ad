"""Running a plan: build fresh actors from it, drive them with the coordinator over a runtime,
and assemble the report (``ReplayReport.to_dict()`` is exactly prediction.json)."""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from aisim.actors.engine.capacity import POLICIES
from aisim.actors.engine.host import HostPool
from aisim.actors.engine.offload import OffloadRegistry
from aisim.simulator.builders import build_decode_router, build_router, build_timing, build_workers, capabilities
from aisim.simulator.catalog.models import resolve_model
from aisim.simulator.coordinator import Coordinator, Pool
from aisim.simulator.metrics.collector import RequestLog
from aisim.simulator.metrics.planner_html import write_planner_html
from aisim.simulator.metrics.summary import PoolAccounting, RunCounters, completed_duration_ms, summarize
from aisim.simulator.metrics.timeline import WorkerTimeline
from aisim.simulator.plan import ExecutionPlan, ReplayPlan
from aisim.simulator.runtime.local import LocalRuntime
from aisim.simulator.traffic.workload import BlockHashStore

__all__ = ["ReplayReport", "run_plan", "pool_provenance", "deployment_summary"]


@dataclass
class ReplayReport:
    """Result of one replay. ``to_dict()`` is exactly prediction.json."""

    summary: dict
    per_request: Sequence[dict] | None  # (``Records``: read back from where they were written as requests ended)
    coverage: dict
    planner: dict | None = None
    diagnostics: dict = field(default_factory=dict)  # simulator internals, not part of prediction.json
    timelines: list[WorkerTimeline] | None = None  # with capture_worker_timeline: one per worker (worker_timeline.csv)

    def to_dict(self, with_records: bool = True) -> dict:
        """prediction.json; ``with_records=False``: ``per_request`` left None (the caller points
        it at requests.jsonl instead of reading every record back)."""
        per_request = list(self.per_request) if self.per_request is not None and with_records else None
        return {"summary": self.summary, "per_request": per_request, "coverage": self.coverage, "planner": self.planner}


@dataclass
class _Actors:
    """What one run builds from a plan (fresh every run)."""

    pools: list[Pool]  # [entry] or [entry, decode]
    entry_router: Any
    decode_router: Any
    timings: dict
    provenance: dict[str, dict]
    planner: Any = None
    router_description: dict | None = None  # the entry router as it starts (retune may change its knobs)


def _build_actors(plan: ReplayPlan) -> _Actors:
    entry_plan = plan.pools[0]
    decode_plan = plan.pools[1] if len(plan.pools) > 1 else None
    entry_router = build_router(plan.router, entry_plan, plan.seed)
    decode_router = build_decode_router(decode_plan.route_block_size, plan.seed) if decode_plan else None
    pools: list[Pool] = []
    timings = {}
    provenance: dict[str, dict] = {}
    num_workers = 0
    offload = OffloadRegistry() if any(p.scheduler.host_offload is not None for p in plan.pools) else None
    for pool in plan.pools:
        timing = build_timing(pool, f"engine.workers.{pool.role}.timing")
        timings[pool.role] = timing
        router = decode_router if pool.role == "decode" else entry_router
        sglang = pool.scheduler.sglang is not None  # (its destinations reserve before the prefill starts)
        initial_kv = _initial_kv(plan, pool, num_workers, router)
        make = partial(build_workers, pool, replicas=1, timing=timing, fast_forward=plan.fast_forward,
                       record_kv_events=pool.role != "decode" and router.needs_kv_events,
                       pool_label="decode" if pool.role == "decode" else None,
                       record_timeline=plan.capture_worker_timeline, track_queue=plan.planner is not None,
                       initial_kv=initial_kv, offload=offload, seed=plan.seed)
        pools.append(Pool(pool.role, list(range(num_workers, num_workers + pool.replicas)), router, pool.route_block_size,
                          caps=capabilities(pool), gpus_per_worker=pool.gpus_per_worker,
                          startup_ms=pool.startup_seconds * 1000.0, spawn=_Spawn(make), num_ranks=pool.num_ranks,
                          reserves=pool.role == "decode" and (sglang or POLICIES[pool.scheduler.capacity_policy].reserves),
                          destination_first=pool.role == "decode" and sglang))
        num_workers += pool.replicas
        provenance[pool.role] = pool_provenance(pool, timing)
    actors = _Actors(pools, entry_router, decode_router, timings, provenance,
                     router_description=entry_router.describe())
    if plan.planner is not None:
        from aisim.simulator.planning import build_planner  # (its imports only where a Planner runs)

        actors.planner = build_planner(plan.planner, plan.pools, timings, plan.capture_planner_details,
                                       plan.planner_field, plan.planner_warmup)
    return actors


def _initial_kv(plan: ReplayPlan, pool, first_id: int, router) -> dict | None:
    """Warm start: worker id -> per rank the blocks its cache starts with; the router's prefix
    index learns them as it would from the workers' KV events."""
    from aisim.actors.engine.kv_cache import STORED

    given = (plan.initial_kv or {}).get(pool.role)
    if not given:
        return None
    out = {}
    cap = pool.scheduler.num_gpu_blocks
    for i, ranks in enumerate(given[: pool.replicas]):
        wid = first_id + i
        out[wid] = ranks = [list(dict.fromkeys(r))[-cap:] for r in ranks[: pool.num_ranks]]
        if router.needs_kv_events and pool.scheduler.enable_prefix_caching:
            for rank, hashes in enumerate(ranks):
                for h in hashes:  # (one block at a time: the chains behind a flat list are unknown)
                    router.on_kv_events(wid, rank, STORED, [h])
    return out


def deployment_summary(plan: ReplayPlan, router: dict, decode_router: dict | None) -> dict:
    """``summary.deployment``: the deployment a plan starts with (``router``/``decode_router``: the
    routers' ``describe()`` before the run)."""
    disaggregated = len(plan.pools) > 1
    return {
        "mode": "disaggregated" if disaggregated else "aggregated",
        "router": router,
        "decode_router": decode_router,
        "workers": {p.role: p.replicas for p in plan.pools},  # at the start
        "gpus": sum(p.replicas * p.gpus_per_worker for p in plan.pools),
        "kv_transfer": ({"bandwidth_gb_per_second": plan.transfer.bandwidth_gb_per_second,
                         "bytes_per_token": plan.transfer.bytes_per_token, "timing_mode": plan.transfer.timing_mode}
                        if disaggregated and plan.transfer else None),
        "seed": plan.seed,
        "router_sync_ms": float(plan.execution.router_sync_ms),
    }


def pool_provenance(pool, timing) -> dict:
    """What a pool runs with, as ``summary.prediction_provenance[role]`` reports it (also what
    ``aisim validate`` prints without replaying)."""
    sched = pool.scheduler
    tiers = {}  # (only where configured: a replay without KV tiers reports as before)
    if sched.host_offload is not None:
        tiers["host_offload"] = sched.host_offload.plain()
    if sched.g3_offload is not None:
        tiers["g3_offload"] = sched.g3_offload.plain()
    return {
        **timing.describe(),
        "kv_capacity_blocks_per_rank": sched.num_gpu_blocks,
        "kv_block_size": sched.block_size,
        "kv_bytes_per_token": pool.kv_bytes_per_token,
        "attention_data_ranks": pool.num_ranks,
        "gpus_per_worker": pool.gpus_per_worker,
        "replicas": pool.replicas,
        "context_length": sched.context_length,
        "backend": pool.backend,
        "backend_version": pool.backend_version,
        "model": pool.model,
        "model_source": resolve_model(pool.model).origin if pool.model else None,
        "hardware": pool.hardware,
        "kv_sizing": pool.kv_sizing,
        **tiers,
    }


class _PlannerClock:
    """Wall time spent in Planner ticks (outside the model; a diagnostic)."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self._since = 0.0

    def __call__(self, entering: bool) -> None:
        if entering:
            self._since = time.perf_counter()
        else:
            self.total_s += time.perf_counter() - self._since


SWEEPER_ENTRY_POINTS = "aisim.sweepers"  # entry-point group of the retune sweeper factories (``search.retune``)


def load_sweeper(plan: ReplayPlan):
    """The retune sweeper of ``plan``, from the ``retune`` factory registered in the
    ``aisim.sweepers`` entry-point group (``search.retune:make_sweeper``): the simulator asks for
    sweeps through ``actors.planner.retune.Sweeper`` and never imports ``search`` itself."""
    from importlib.metadata import entry_points

    from aisim.simulator.errors import NotSupportedError

    found = [ep for ep in entry_points(group=SWEEPER_ENTRY_POINTS) if ep.name == "retune"]
    if not found:
        raise NotSupportedError(f"{plan.planner_field}.retune", "no retune sweeper is installed (entry point "
                                f"{SWEEPER_ENTRY_POINTS}:retune); install aisim with pip install -e . or pass "
                                "run_plan(..., sweeper=...)")
    return found[0].load()(plan)


def _retune_driver(plan: ReplayPlan, sweeper, on_sweep=None):
    from aisim.actors.planner.planner import PREDICTOR_KNOBS
    from aisim.simulator.retune_driver import RetuneDriver

    pp = plan.planner
    rc, s = pp.retune, pp.settings
    fields = list(rc.planner_domains(s.enable_load_scaling))
    if rc.predictor_presweep(s.enable_throughput_scaling):
        fields += list(PREDICTOR_KNOBS)
    spec = plan.router
    router = ({k: getattr(spec, k) for k in ("overlap_score_credit", "prefill_load_scale", "temperature")}
              if spec.policy == "kv_router" else {})
    return RetuneDriver(rc, sweeper, tick_ms=s.tick_interval_s * 1000.0, advisory=s.advisory,
                        router_policy=spec.policy, router=router, planner_fields={k: pp.knob(k) for k in fields},
                        replicas={p.role: p.replicas for p in plan.pools},
                        component="prefill" if len(plan.pools) > 1 else "agg", on_sweep=on_sweep)



@contextmanager
def replay_gc():
    """Garbage collection tuned for a replay, restored after it. A replay allocates millions of
    short-lived objects (pass records, tuples) and makes almost no reference cycles, so the
    default collector (the youngest generation every 700 net allocations) spends 5-10% of the
    replay scanning live state: collect every 50,000 instead, and leave everything built before
    the replay (plan, workload, modules) out of the scans (``gc.freeze``). Memory is unchanged
    on the benchmarks (BENCHMARKS.md)."""
    old = tune_gc_for_replay()
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


def tune_gc_for_replay() -> tuple[int, int, int]:
    """Set the collector as ``replay_gc`` does (for a process that only replays, e.g. a Ray engine
    host); returns the thresholds before."""
    old = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(50_000, old[1], old[2])
    return old


def run_plan(plan: ReplayPlan, resource_guard=None, sweeper=None, on_sweep=None, on_progress=None,
             monitor=None, request_rows: bool = False) -> ReplayReport:
    """Run a plan once: fresh actors and arrival state, the coordinator over the plan's runtime.
    A plan whose Planner retunes asks ``sweeper`` (an ``actors.planner.retune.Sweeper``; None: the
    installed one, ``load_sweeper``) for its sweeps; the run closes it. ``on_sweep(window, answer)``
    is called after each sweep, ``on_progress(now_ms, last_arrival_ms, requests_ended,
    num_requests)`` as the replay advances (``Coordinator.progress``); neither changes a result.
    ``monitor`` (``simulator.checkpoints.Monitor``; needs ``capture_per_request``) sees every
    request's record as it ends and may stop the replay at an edge: the report then carries
    ``summary.stopped_early`` ({at_s, reason}) and the requests in flight end incomplete.
    ``request_rows``: the captured records are kept only as their request_metrics.csv rows
    (``report.per_request`` is then that list of rows: a capacity trial's need, no JSON)."""
    t_wall = time.perf_counter()
    w = plan.traffic.workload
    store = BlockHashStore(w)
    actors = _build_actors(plan)
    pools = actors.pools
    log = RequestLog(capture=plan.capture_per_request, uuid_of=w.request_uuid, rows=request_rows)
    planner_clock = _PlannerClock()
    ex = plan.execution
    if any(p.scheduler.host_offload is not None and (p.scheduler.host_offload.shared or (
            p.scheduler.g3_offload is not None and p.scheduler.g3_offload.shared)) for p in plan.pools):
        # (a shared KV tier is one state: its workers share a host)
        ex = dataclasses.replace(ex, engine_actors=1, driver_hosts_workers=False)
    retune = None
    if plan.planner is not None and plan.planner.retune is not None:
        retune = _retune_driver(plan, sweeper if sweeper is not None else load_sweeper(plan), on_sweep)
    runtime = None
    try:
        runtime = make_runtime(ex, pools, w, store, actors.entry_router, actors.decode_router, actors.planner,
                               reserve_cpus=retune is None)
        coord = Coordinator(w, store, plan.traffic.arrivals.start(), runtime, pools[0], log,
                            decode=pools[1] if len(pools) > 1 else None, transfer=plan.transfer,
                            stop_ms=plan.traffic.stop_ms, resource_guard=resource_guard,
                            has_planner=actors.planner is not None, window_ms=ex.router_sync_ms)
        coord.planner_hook = planner_clock
        coord.retune = retune
        coord.progress = on_progress
        if monitor is not None:
            if log.records is None:
                raise ValueError("a checkpoint monitor reads the per-request records: plan with capture_per_request")
            log.observer = monitor.observe
            coord.monitor = monitor
        with replay_gc():
            coord.run()
        planner = runtime.planner()  # the Planner as it ended (it may have lived in an actor)
    finally:
        if runtime is not None:
            runtime.close()
        if retune is not None:
            retune.close()
    runtime_info = {"backend": runtime.name, "num_hosts": runtime.num_hosts, "num_nodes": runtime.num_nodes,
                    "num_edges": coord.num_edges,
                    **runtime.counters.as_dict()}
    if getattr(runtime, "driver_host", False):
        runtime_info["driver_hosts_workers"] = True  # (host 0, first in host_busy_s)
    return _report(plan, actors, coord, log, planner, runtime_info, planner_clock.total_s, t_wall, retune)


def _report(plan: ReplayPlan, actors: _Actors, coord: Coordinator, log: RequestLog, planner, runtime_info: dict,
            planner_wall_s: float, t_wall: float, retune=None) -> ReplayReport:
    totals = coord.worker_totals
    stats = coord.stats
    provisioned = coord.worker_seconds(completed_duration_ms(log)) if planner is not None else {}
    accounting = [PoolAccounting("prefill" if pool.role == "prefill" else "decode", pool.gpus_per_worker,
                                 replicas=pool.replicas,
                                 worker_seconds=provisioned.get(pool.role) if planner is not None else None)
                  for pool in plan.pools]
    counters = RunCounters(
        committed_prefill_tokens=sum(t[0] for t in totals),
        generated_tokens=sum(t[1] for t in totals),
        num_preemptions=sum(t[2] for t in totals),
        num_passes=sum(t[3] for t in totals),
        num_offered=coord.num_offered,
        provenance=actors.provenance,
    )
    wall_ms = (time.perf_counter() - t_wall) * 1000.0
    summary = summarize(log, coord.gap_sinks, accounting, counters, plan.sla, wall_ms,
                        planner_total_ticks=planner.total_ticks if planner is not None else None,
                        kv_tier_reports=getattr(coord, "offload_reports", None))
    if stats.stopped_early is not None:  # (only then: a complete run's report is unchanged)
        summary["stopped_early"] = dict(stats.stopped_early)
    summary["deployment"] = deployment_summary(plan, actors.router_description,
                                                actors.decode_router.describe() if actors.decode_router else None)
    per_request = None
    if log.records is not None:
        per_request = log.records.records()  # (by arrival, then uuid)
    coverage = {
        "capture_per_request": plan.capture_per_request,
        "capture_planner_details": planner is not None and plan.capture_planner_details,
        "per_request_records": len(per_request) if per_request is not None else 0,
    }
    planner_obj = None
    if planner is not None:
        from aisim.simulator.planning import planner_report

        planner_obj = planner_report(planner, coord.lifecycle_operations, plan.capture_planner_details)
        if retune is not None:
            planner_obj["retune_events"] = retune.events
            if plan.capture_planner_details:
                retune.annotate_ticks(planner_obj["ticks"])
        if plan.planner_html_dir is not None and plan.capture_planner_details:
            planner_obj["html_report_path"] = write_planner_html(planner_obj, summary, plan.planner_html_dir)
    diagnostics = {
        "num_events": stats.num_events,
        "num_passes": counters.num_passes,
        "num_fast_forward_runs": sum(t[4] for t in totals),
        "num_workers": len(totals),
        "num_transfers": stats.num_transfers,
        "planner_wall_s": planner_wall_s if planner is not None else None,
        "traffic": plan.traffic.description,
        "runtime": runtime_info,
    }
    timelines = coord.timelines if plan.capture_worker_timeline else None
    return ReplayReport(summary, per_request, coverage, planner_obj, diagnostics, timelines)


def make_runtime(ex: ExecutionPlan, pools: list[Pool], workload, store, entry_router, decode_router, planner,
                 reserve_cpus: bool = True):
    """The actors' home: in process (one host called directly, by default) or on Ray.
    ``reserve_cpus`` False: Ray engine hosts reserve no CPU (a retuned replay pauses while its
    sweeps' Ray tasks use the CPUs)."""
    host_pools = {p.role: HostPool(p.spawn, p.router.tracks_first_tokens and p.role == "aggregated",
                                   p.role == "prefill", p.reserves) for p in pools}
    roles = [p.role for p in pools for _ in p.worker_ids]
    routers = {pools[0].role: entry_router}
    if decode_router is not None:
        routers["decode"] = decode_router
    if ex.backend == "ray":
        from aisim.simulator.runtime.ray_runtime import RayRuntime

        return RayRuntime(host_pools, workload, roles, ex.engine_actors, routers, planner, ex.ray_address,
                          reserve_cpus=reserve_cpus, driver_host=ex.driver_hosts_workers, hash_source=store)
    return LocalRuntime(host_pools, store, roles, ex.engine_actors or 1, routers, planner, wire=ex.wire)


class _Spawn:
    """Builds worker ``wid`` of a pool (picklable, for hosts in other processes)."""

    def __init__(self, make) -> None:
        self.make = make

    def __call__(self, wid: int):
        return self.make(first_id=wid)[0]


