"""A replay plan is a value: the validated workload and arrivals, the pools' engine arguments,
the router, the Planner's configuration and where the actors live. ``plan_from_config`` is
the one translation from a ``predict`` config; the Python API (``simulator.api``) builds its
config sections and comes through here too.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
from dataclasses import dataclass
from pathlib import Path

from aisim.simulator.builders import RouterSpec
from aisim.simulator.catalog.hardware import get_hardware
from aisim.simulator.catalog.kv_capacity import DEFAULT_MEMORY_FRACTION, default_capacity, kv_bytes_per_token
from aisim.simulator.catalog.models import load_geometry
from aisim.simulator.config import models as m
from aisim.simulator.config.engine_args import BACKEND_BLOCK_SIZE, EngineArgs, TimingModelArgs
from aisim.simulator.config.planner_config import PlannerConfig, from_replay_section
from aisim.simulator.config.retune import check_history, check_replay_sections
from aisim.simulator.config.support import check_supported
from aisim.simulator.coordinator import KvTransferModel
from aisim.simulator.errors import InputError
from aisim.simulator.traffic.build import TrafficPlan, build_traffic
from aisim.simulator.traffic.workload import Workload

__all__ = ["ReplayPlan", "PoolPlan", "ExecutionPlan", "plan_from_config", "router_spec", "execution_plan",
           "register_workload", "dump_plan", "load_plan"]


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class ReplayPlan:
    """What to replay and how: a value. Running it builds fresh actors and arrival state, so
    one plan runs any number of times (in this process, a worker process or a Ray task) with
    identical reports."""

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
    planner_html_dir: str | None = None  # write the Python API's Planner diagnostics page here (None: no file)
    planner_field: str = "planner"  # how errors name the Planner's configuration
    execution: ExecutionPlan = ExecutionPlan()
    capture_worker_timeline: bool = False  # per-worker queue depth and KV usage over time (ReplayReport.timelines)
    # the load predictor's recorded history, (count, mean ISL, mean OSL) per throughput interval; None:
    # the Planner's load_predictor_warmup_trace (a retune window replay passes the history up to its window)
    planner_warmup: tuple[tuple[float, float, float], ...] | None = None
    # warm start: pool role -> per worker -> per rank, the KV blocks the caches start with (next
    # eviction first; a retune window replay passes the outer replay's at the window start)
    initial_kv: dict[str, tuple] | None = None


def plan_from_config(cfg: m.PredictConfig, config_dir: Path | None = None, capture_per_request: bool = False,
                     fast_forward: bool = True, capture_worker_timeline: bool = False) -> ReplayPlan:
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
        timing = TimingModelArgs(**t.model_dump(exclude={"forward_model"}))
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
    if cfg.planner.retune is not None:  # (the section model rejects it under policy disabled)
        check_replay_sections(cfg)  # the traffic and router retune needs, before the trace is read
    traffic = build_traffic(cfg.traffic, config_dir)
    planner = from_replay_section(cfg.planner, e.mode, cfg.evaluation.sla) if cfg.planner.policy == "enabled" else None
    if planner is not None and planner.load_predictor_warmup_trace:
        warmup = _beside_config(planner.load_predictor_warmup_trace, config_dir)
        planner = planner.model_copy(update={"load_predictor_warmup_trace": warmup})
    plan = ReplayPlan(traffic, pools, router_spec(cfg.router), cfg.evaluation.sla, capture_per_request, fast_forward,
                      transfer, cfg.execution.seed, planner, execution=execution_plan(cfg.execution),
                      capture_worker_timeline=capture_worker_timeline)
    if planner is not None and planner.retune is not None:
        check_history(planner, traffic.workload, "planner")  # the recorded history (throughput scaling)
        plan = dataclasses.replace(plan, router=retune_router(plan.router, planner.retune))
    return plan


def retune_router(spec: RouterSpec, rc) -> RouterSpec:
    """The router a retuned replay starts with: a KV router whose overlap credit a sweep may raise
    above 0 keeps its prefix index from the start (workers publish KV events)."""
    dom = rc.router_domains().get("overlap_score_credit")
    if spec.policy != "kv_router" or dom is None:
        return spec
    values = dom.points() if not dom.continuous else (dom.high,)
    return dataclasses.replace(spec, kv_events=any(v > 0 for v in values)) if not spec.kv_events else spec


def _beside_config(raw: str, config_dir: Path | None) -> str:
    """A relative path is looked up in the working directory first, then next to the config file
    (as trace paths are)."""
    p = Path(raw)
    if config_dir is None or p.is_absolute() or p.exists() or not (config_dir / p).exists():
        return raw
    return str(config_dir / p)


def router_spec(r: m.Router) -> RouterSpec:
    """The router section as the plan carries it (the KV router's defaults filled in)."""
    return RouterSpec(r.policy, 1.0 if r.overlap_score_credit is None else r.overlap_score_credit,
                      1.0 if r.prefill_load_scale is None else r.prefill_load_scale,
                      0.0 if r.temperature is None else r.temperature)


def execution_plan(x: m.Execution) -> ExecutionPlan:
    return ExecutionPlan(x.backend, float(x.router_sync_ms), None if x.engine_actors == "auto" else x.engine_actors,
                         x.ray_address)




# -- shipping plans: the workload once per process, plans by reference ----------------------
# A search sends one workload to each worker process (or Ray worker) once, then many plans
# that differ in their deployment. ``dump_plan(plan, by_reference=True)`` pickles the plan with
# its workload replaced by the workload's digest; ``load_plan`` resolves the digest against the
# workloads registered in the receiving process.
_WORKLOADS: dict[str, Workload] = {}


def register_workload(workload: Workload) -> str:
    """Make ``workload`` available to plans loaded in this process; returns its digest."""
    _WORKLOADS[workload.digest] = workload
    return workload.digest


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Workload):
            return ("workload", obj.digest)
        return None


class _Unpickler(pickle.Unpickler):
    def persistent_load(self, pid):
        kind, digest = pid
        workload = _WORKLOADS.get(digest) if kind == "workload" else None
        if workload is None:
            raise LookupError(f"plan refers to workload {digest[:12]}..., which this process has not registered "
                              "(call register_workload first)")
        return workload


def dump_plan(plan: ReplayPlan, by_reference: bool = False) -> bytes:
    """A plan as bytes; ``by_reference`` leaves its workload out (the receiver registered it)."""
    if not by_reference:
        return pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL)
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(plan)
    return buf.getvalue()


def load_plan(data: bytes) -> ReplayPlan:
    return _Unpickler(io.BytesIO(data)).load()
