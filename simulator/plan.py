"""A replay plan is a value: the validated workload and arrivals, each pool's deployment spec,
the router, the Planner's configuration and where the actors live. ``plan_from_config`` is the
one lowering from a validated ``predict`` config to what the actors take; the Python API
(``simulator.api``) turns its arguments into config sections and comes through here too. A pool's
spec holds the scheduler's own config (``SchedulerConfig``), its timing spec, its parallel shape in
the YAML's names, its KV sizing and its startup; docs/architecture.md "Deployment spec".
"""

from __future__ import annotations

import dataclasses
import io
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from aisim.actors.engine.capacity import POLICIES
from aisim.actors.engine.offload import G3Spec, HostOffloadSpec
from aisim.actors.engine.scheduler import SchedulerConfig
from aisim.actors.engine.sglang import SGLangKnobs
from aisim.actors.engine.speculation import Speculation, rates_from_mean, thresholds
from aisim.simulator.builders import RouterSpec, TimingSpec
from aisim.simulator.catalog.hardware import get_hardware
from aisim.simulator.catalog.models import load_geometry
from aisim.simulator.config import models as m
from aisim.simulator.config.rules import block_size, check_config
from aisim.simulator.coordinator import KvTransferModel
from aisim.simulator.deployment import ParallelShape, size_kv
from aisim.simulator.errors import InputError
from aisim.simulator.traffic.build import TrafficPlan, build_traffic
from aisim.simulator.traffic.history import check_history
from aisim.simulator.traffic.workload import Workload

if TYPE_CHECKING:
    from aisim.simulator.planning import PlannerPlan

# the rank scheduler's capacity policy of each backend (actors.engine.capacity)
CAPACITY_POLICY = {"vllm": "vllm", "trtllm": "guaranteed_no_evict", "sglang": "vllm"}  # (sglang: its own rank)


def _fresh_destinations(backend: str) -> bool:
    """Decode workers that reserve a handoff's blocks before its transfer (TensorRT-LLM) take the
    prompt into fresh blocks: no prefix reuse at the destination (so no cache there to reuse from
    either). (SGLang's destinations reserve before the prefill, reusing what they cache.)"""
    return POLICIES[CAPACITY_POLICY[backend]].reserves

__all__ = ["ReplayPlan", "PoolPlan", "ExecutionPlan", "plan_from_config", "router_spec", "execution_plan",
           "register_workload", "dump_plan", "load_plan"]


@dataclass(frozen=True)
class PoolPlan:
    """One pool's deployment spec: everything its workers are built from."""

    role: str  # aggregated | prefill | decode
    replicas: int
    scheduler: SchedulerConfig  # the rank scheduler's own config (batch limits, KV blocks per rank, ...)
    timing: TimingSpec
    shape: ParallelShape = ParallelShape()
    model: str | None = None
    hardware: str | None = None  # the GPU's catalog name
    backend: str = "vllm"
    backend_version: str | None = None  # performance-data selector (recorded in provenance)
    kv_bytes_per_token: int | None = None  # per tensor shard and pipeline stage; None: unknown (no model)
    startup_seconds: float = 0.0
    kv_sizing: dict | None = None  # how the blocks per rank were resolved (reported in provenance)

    @property
    def gpus_per_worker(self) -> int:
        return self.shape.gpus_per_worker

    @property
    def num_ranks(self) -> int:
        return self.shape.attention_data

    @property
    def block_size(self) -> int:
        return self.scheduler.block_size

    @property
    def route_block_size(self) -> int:
        """The blocks the pool's router hashes prompts in: its KV block, except that an SGLang
        decode pool's load-only router (no KV events) counts at least 64-token blocks (one-token
        pages would hash every token of every prompt for the same choices, up to rounding)."""
        bs = self.scheduler.block_size
        if self.role == "decode" and self.scheduler.sglang is not None:
            return max(bs, 64)
        return bs


@dataclass(frozen=True)
class ExecutionPlan:
    """Where the actors live and how the clock synchronises them."""

    backend: str = "local"  # local | ray
    router_sync_ms: float = 0.0  # 0: exact lockstep; W > 0: the router sees worker state up to W old
    engine_actors: int | None = None  # engine hosts (Ray actors); None: one per CPU, at most one per worker
    ray_address: str | None = None  # None: start a local Ray; "auto" or HOST:PORT: join that cluster
    wire: bool = False  # in process: round-trip every message through msgpack (verification)
    driver_hosts_workers: bool = True  # (Ray) the driver hosts a share of the workers besides the actors


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
    planner: PlannerPlan | None = None  # the Planner (None: replicas stay fixed)
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
    check_config(cfg)  # every cross-section rule, before the trace is read
    e = cfg.engine
    pools, transfer = lower_engine(e)
    traffic = build_traffic(cfg.traffic, config_dir)
    planner = None
    if cfg.planner.policy == "enabled":
        from aisim.simulator.planning import lower_planner  # (its imports only where a Planner runs)

        planner = lower_planner(cfg.planner, pools, cfg.evaluation.sla, config_dir=config_dir)
    plan = ReplayPlan(traffic, pools, router_spec(cfg.router), cfg.evaluation.sla, capture_per_request, fast_forward,
                      transfer, cfg.execution.seed, planner, execution=execution_plan(cfg.execution),
                      capture_worker_timeline=capture_worker_timeline)
    if planner is not None and planner.retune is not None:
        check_history(planner, traffic.workload, "planner")  # the recorded history (throughput scaling)
        plan = dataclasses.replace(plan, router=retune_router(plan.router, planner.retune))
    return plan


def lower_engine(e: m.Engine) -> tuple[list[PoolPlan], KvTransferModel | None]:
    """The pools (entry pool first) and KV transfer (disaggregated) of an ``engine`` section that
    passed its rules (``simulator.config.rules.check_engine``)."""
    geometry = load_geometry(e.model) if e.model is not None else None

    def context(wk: m.Worker) -> int | None:
        given = e.context_length if wk.context_length == "engine" else wk.context_length
        if given == "max":
            return geometry.max_position_embeddings if geometry is not None else None
        return given

    pools = [pool_plan(e, role, wk, geometry, context(wk)) for role, wk in e.workers.items()]
    pools.sort(key=lambda p: ("prefill", "aggregated", "decode").index(p.role))
    transfer = None
    if e.mode == "disaggregated":
        kt = e.kv_transfer or m.KvTransfer()
        bpt = pools[0].kv_bytes_per_token if kt.bytes_per_token == "auto" else kt.bytes_per_token
        if bpt is None and kt.bandwidth_gb_per_second is not None:
            raise InputError("engine.kv_transfer.bytes_per_token", "auto needs the model (engine.model) or the "
                                                                   "prefill workers' kv_cache.bytes_per_token; set one")
        # a TensorRT-LLM destination reserves fresh blocks and reuses no cached prefix: every
        # transfer moves the whole prompt (docs/schedulers.md)
        mode = "full_prompt" if _fresh_destinations(e.backend) else kt.timing_mode
        transfer = KvTransferModel(kt.bandwidth_gb_per_second, bpt, mode)
    return pools, transfer


def pool_plan(e: m.Engine, role: str, wk: m.Worker, geometry, context_length: int | None) -> PoolPlan:
    """One pool's spec from its validated ``engine.workers.<role>`` section (the one lowering)."""
    base = f"engine.workers.{role}"
    par = wk.parallelism
    shape = ParallelShape(par.tensor, par.pipeline, par.attention_data, par.prefill_context, par.moe_tensor,
                          par.moe_expert)
    bs = block_size(e, wk)
    t, cap = wk.timing, wk.kv_cache.capacity
    hw_name, hw_field = (wk.hardware, f"{base}.hardware") if wk.hardware else (e.hardware, "engine.hardware")
    hardware = get_hardware(hw_name, hw_field) if hw_name is not None else None
    kv = size_kv(geometry, hardware, backend=e.backend, block_size=bs, max_batched_tokens=wk.scheduler.max_batched_tokens,
                 shape=shape, capacity_type=cap.type, memory_fraction=cap.memory_fraction, blocks=cap.blocks,
                 capacity_bytes=cap.bytes, cuda_graph_reserved_bytes=cap.cuda_graph_reserved_bytes,
                 bytes_per_token=wk.kv_cache.bytes_per_token, field=f"{base}.kv_cache.capacity")
    if kv.blocks_per_rank <= 0:
        raise InputError(f"{base}.kv_cache.capacity", f"{e.model} leaves no KV memory on {hardware.name} "
                         f"(weights {kv.weights_bytes / 1e9:.1f} GB per GPU); raise parallelism.tensor, "
                         "memory_fraction, or pick a larger GPU", category="kv_capacity")
    scheduler = SchedulerConfig(
        max_batched_tokens=wk.scheduler.max_batched_tokens,
        max_sequences=wk.scheduler.max_sequences or (1 if role == "prefill" else 256),
        block_size=bs,
        num_gpu_blocks=kv.blocks_per_rank,
        enable_prefix_caching=wk.kv_cache.prefix_caching and not (role == "decode" and _fresh_destinations(e.backend)),
        enable_chunked_prefill=e.enable_chunked_prefill,
        context_length=context_length,
        preemption_mode=wk.scheduler.preemption_mode,
        prefill_schedule_interval=wk.scheduler.prefill_schedule_interval,
        prefill_only=role == "prefill",
        capacity_policy=CAPACITY_POLICY[e.backend],
        sglang=_sglang_knobs(wk) if e.backend == "sglang" else None,
        host_offload=_host_offload(wk, bs, kv.bytes_per_token, base),
        g3_offload=_g3_offload(wk, bs, kv.bytes_per_token),
        speculation=None if role == "prefill" else _speculation(e, geometry),
    )
    timing = TimingSpec(t.type, t.prefill_ms, t.decode_ms, t.compute_efficiency, t.memory_efficiency, t.overhead_ms,
                        wk.speedup_ratio, wk.decode_speedup_ratio)
    return PoolPlan(role, par.replicas, scheduler, timing, shape, e.model, hardware.name if hardware else None,
                    e.backend, e.backend_version, kv.bytes_per_token, wk.startup_seconds, kv.provenance)


def _host_offload(wk: m.Worker, block_size: int, bytes_per_token: int | None, base: str) -> HostOffloadSpec | None:
    """A worker's G2 tier, its block bytes from the resolved KV bytes per token."""
    h = wk.kv_cache.host_offload
    if h is None:
        return None
    if not bytes_per_token:
        raise InputError(f"{base}.kv_cache.bytes_per_token", "host_offload needs the KV bytes per token to size a "
                                                             "host block; set kv_cache.bytes_per_token or engine.model")
    return HostOffloadSpec(h.num_host_blocks, block_size * bytes_per_token, h.scope, h.d2h_bandwidth_gbps,
                           h.h2d_bandwidth_gbps, h.shared_d2h_bandwidth_gbps, h.shared_h2d_bandwidth_gbps,
                           h.latency_to_first_byte_ms)


def _speculation(e: m.Engine, geometry) -> Speculation | None:
    """A decoding role's speculative decoding: MTP's mean acceptance as conditional rates, its draft
    heads as extra layers of decode attention; n-gram drafts as given. The seed: the section's, else
    the replay's root seed (filled in when the workers are built)."""
    if e.nextn:
        scale = (geometry.num_layers + e.nextn) / geometry.num_layers if geometry is not None else 1.0
        return Speculation("mtp", e.nextn, thresholds(rates_from_mean(e.nextn_accepted, e.nextn)), scale, None)
    sp = e.speculation
    if sp is None:
        return None
    return Speculation("ngram", sp.num_speculative_tokens, thresholds(sp.acceptance_rates), 1.0, sp.seed)


def _g3_offload(wk: m.Worker, block_size: int, bytes_per_token: int | None) -> G3Spec | None:
    g = wk.kv_cache.g3_offload
    if g is None:
        return None
    return G3Spec(g.scope, g.num_g3_blocks, block_size * bytes_per_token, g.latency_to_first_byte_ms,
                  g.read_bandwidth_gbps, g.write_bandwidth_gbps, g.shared_read_bandwidth_gbps,
                  g.shared_write_bandwidth_gbps)


def _sglang_knobs(wk: m.Worker) -> SGLangKnobs:
    """SGLang's scheduler knobs of a worker (its ``scheduler.sglang`` extension, else the engine's
    defaults); the chunk budget is per attention-data rank."""
    k = wk.scheduler.sglang or m.SGLangScheduler()
    return SGLangKnobs(k.schedule_policy, k.max_prefill_tokens, k.chunked_prefill_size // wk.parallelism.attention_data,
                       k.clip_max_new_tokens, float(k.schedule_conservativeness), wk.scheduler.prefill_decode_interval)


def retune_router(spec: RouterSpec, rc) -> RouterSpec:
    """The router a retuned replay starts with: a KV router whose overlap credit a sweep may raise
    above 0 keeps its prefix index from the start (workers publish KV events)."""
    dom = rc.router_domains().get("overlap_score_credit")
    if spec.policy != "kv_router" or dom is None:
        return spec
    values = dom.points() if not dom.continuous else (dom.high,)
    return dataclasses.replace(spec, kv_events=any(v > 0 for v in values)) if not spec.kv_events else spec


def router_spec(r: m.Router) -> RouterSpec:
    """The router section as the plan carries it (the KV router's defaults filled in)."""
    weights = {k: getattr(r, k) for k in ("host_cache_hit_weight", "disk_cache_hit_weight")
               if getattr(r, k) is not None}  # (else RouterSpec's: Dynamo's defaults)
    return RouterSpec(r.policy, 1.0 if r.overlap_score_credit is None else r.overlap_score_credit,
                      1.0 if r.prefill_load_scale is None else r.prefill_load_scale,
                      0.0 if r.temperature is None else r.temperature, **weights)


def execution_plan(x: m.Execution) -> ExecutionPlan:
    return ExecutionPlan(x.backend, float(x.router_sync_ms), None if x.engine_actors == "auto" else x.engine_actors,
                         x.ray_address, driver_hosts_workers=x.driver_hosts_workers)




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
