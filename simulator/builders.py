"""Builders of the actor objects of a replay (workers, timing models, routers) from a plan's pool
specs (``simulator.plan.PoolPlan``) and router spec.

The engine, router and planner hosts (in process or inside Ray actors) hold what they build.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from aisim.actors.engine.offload import OffloadRegistry
from aisim.actors.engine.scheduler import make_rank
from aisim.actors.engine.timing import (
    FixedTiming,
    MeasuredTiming,
    PassShape,
    PolynomialTiming,
    RooflineFactors,
    RooflineTiming,
    SpeculativeMeasuredTiming,
    TimingModel,
)
from aisim.actors.engine.worker import EngineWorker
from aisim.actors.messages import Capabilities
from aisim.actors.router.policies import KvRouter, RandomRouter, RoundRobinRouter
from aisim.simulator.catalog.hardware import get_hardware
from aisim.simulator.catalog.measured import measured_timing
from aisim.simulator.catalog.models import load_geometry, resolve_model
from aisim.simulator.errors import InputError
from aisim.simulator.metrics.timeline import TimelineSpool


@dataclass(frozen=True)
class TimingSpec:
    """How a pool's passes are timed (``engine.workers.<role>.timing``)."""

    type: str = "polynomial"  # polynomial | fixed | roofline | default (measured)
    prefill_ms: float | None = None  # fixed
    decode_ms: float | None = None  # fixed
    compute_efficiency: float | None = None  # roofline
    memory_efficiency: float | None = None  # roofline
    overhead_ms: float | None = None  # roofline
    speedup_ratio: float = 1.0  # every pass divided by it
    decode_speedup_ratio: float = 1.0  # decode passes further divided by it


class ScaledTiming(TimingModel):
    """Divides durations by ``speedup_ratio`` (decode additionally by ``decode_speedup_ratio``)."""

    def __init__(self, inner: TimingModel, speedup: float, decode_speedup: float) -> None:
        self.inner = inner
        self._pdiv = speedup if speedup > 0 else 1.0
        self._ddiv = self._pdiv * (decode_speedup if decode_speedup > 0 else 1.0)
        self.estimator = inner.estimator
        self.timing_source = inner.timing_source
        self.data_version = inner.data_version

    def prefill_ms(self, shape: PassShape) -> float:
        return self.inner.prefill_ms(shape) / self._pdiv

    def decode_ms(self, num_decode, decode_kv_tokens, total_kv_tokens) -> float:
        return self.inner.decode_ms(num_decode, decode_kv_tokens, total_kv_tokens) / self._ddiv

    def decode_run_ms(self, num_decode, kv_tokens0, total_kv_tokens, num_passes):
        div = self._ddiv
        return [d / div for d in self.inner.decode_run_ms(num_decode, kv_tokens0, total_kv_tokens, num_passes)]

    def decode_passes_ms(self, num_decode, kv_tokens, total_kv_tokens):
        div = self._ddiv
        return [d / div for d in self.inner.decode_passes_ms(num_decode, kv_tokens, total_kv_tokens)]

    def describe(self) -> dict:
        return self.inner.describe()


def build_timing(pool, field: str = "timing") -> TimingModel:
    """The timing model of ``pool`` (a ``PoolPlan``: its timing spec, model, GPU, backend, shape)."""
    t, shape = pool.timing, pool.shape
    if pool.model and shape.tensor > 1:  # a worker shape the engine cannot run, whatever the timing
        from aisim.simulator.catalog.measured import tensor_field
        from aisim.simulator.catalog.models import check_tensor_split

        check_tensor_split(resolve_model(pool.model), shape.tensor, tensor_field(field))
    if t.type == "polynomial":
        model: TimingModel = PolynomialTiming()
    elif t.type == "fixed":
        model = FixedTiming(t.prefill_ms, t.decode_ms)
    elif t.type == "roofline":
        if not pool.model or not pool.hardware:
            raise InputError(field, "roofline timing needs the model and hardware (engine.model, engine.hardware)")
        d = RooflineFactors()
        factors = RooflineFactors(
            compute_efficiency=t.compute_efficiency if t.compute_efficiency is not None else d.compute_efficiency,
            memory_efficiency=t.memory_efficiency if t.memory_efficiency is not None else d.memory_efficiency,
            overhead_ms=t.overhead_ms if t.overhead_ms is not None else d.overhead_ms,
        )
        model = RooflineTiming(load_geometry(pool.model), get_hardware(pool.hardware), shape.tensor, factors)
    else:
        if not pool.model or not pool.hardware:
            raise InputError(field, "timing type default needs the model and hardware (engine.model, engine.hardware)")
        model = measured_timing(
            resolve_model(pool.model), pool.hardware, pool.backend, pool.backend_version,
            tensor=shape.tensor, pipeline=shape.pipeline, attention_data=shape.attention_data,
            moe_tensor=shape.moe_tensor, moe_expert=shape.moe_expert, field=field,
        )
    spec = pool.scheduler.speculation
    if spec is not None and isinstance(model, MeasuredTiming):  # (fixed timing: the pass time as given)
        model = SpeculativeMeasuredTiming(model, spec.verify_tokens, spec.layer_scale, spec.kind == "mtp")
    if t.speedup_ratio != 1.0 or t.decode_speedup_ratio != 1.0:
        model = ScaledTiming(model, t.speedup_ratio, t.decode_speedup_ratio)
    return model


def build_workers(pool, first_id: int, timing: TimingModel, fast_forward: bool = True,
                  record_kv_events: bool = False, pool_label: str | None = None,
                  record_timeline: bool = False, track_queue: bool = False,
                  initial_kv: dict | None = None, replicas: int | None = None,
                  offload: OffloadRegistry | None = None, seed: int = 42) -> list[EngineWorker]:
    """``replicas`` workers of ``pool`` (default: the pool's) from id ``first_id``; ``initial_kv``:
    worker id -> per rank, the blocks its KV cache starts with (warm start); ``offload``: the
    replay's KV tiers (one per replay: shared tiers are built once); ``seed``: the replay's root
    seed (speculative decoding's acceptance streams when its section names none)."""
    cfg = pool.scheduler
    if cfg.speculation is not None and cfg.speculation.seed is None:
        cfg = replace(cfg, speculation=replace(cfg.speculation, seed=seed))
    workers = []
    if cfg.host_offload is not None and offload is None:  # (a shared tier must be built once per replay)
        raise ValueError("workers with KV tiers need the replay's OffloadRegistry (offload=...)")
    for i in range(pool.replicas if replicas is None else replicas):
        ranks = [make_rank(cfg, timing, record_kv_events) for _ in range(pool.num_ranks)]
        if cfg.host_offload is not None:
            for r in ranks:
                r.attach_offload(offload.rank(cfg.host_offload, cfg.g3_offload, cfg.block_size, first_id + i,
                                              [] if record_kv_events else None))
        if cfg.sglang is not None and len(ranks) > 1:  # (SGLang's DP ranks share the interval gate)
            for r in ranks:
                r.group = ranks
        for rank, hashes in zip(ranks, (initial_kv or {}).get(first_id + i, ())):
            rank.kv.preload(list(hashes))
        if pool_label:
            for r in ranks:
                r.pool_label = pool_label
        workers.append(EngineWorker(first_id + i, ranks, fast_forward=fast_forward, record_timeline=record_timeline,
                                    track_queue=track_queue,
                                    timeline_spool=TimelineSpool() if record_timeline else None))
    return workers


@dataclass(frozen=True)
class RouterSpec:
    """The configured router of the entry pool (aggregated or prefill workers)."""

    policy: str = "round_robin"  # round_robin | random | kv_router
    overlap_score_credit: float = 1.0
    prefill_load_scale: float = 1.0
    temperature: float = 0.0
    kv_events: bool = False  # keep the prefix index at credit 0 (retune may raise the credit)
    host_cache_hit_weight: float = 0.75  # a host (G2) tier's blocks in the overlap
    disk_cache_hit_weight: float = 0.25  # a disk (G3) tier's blocks in the overlap


# one random stream per actor, derived from the root seed
STREAM_ENTRY_ROUTER = 1
STREAM_DECODE_ROUTER = 2


def actor_rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(stream,)))


def build_router(spec: RouterSpec, pool, seed: int):
    """Router of the entry pool (a ``PoolPlan``); a disaggregated prefill pool's KV router tracks no
    decode blocks, and a ``cluster_shared`` KV tier of the pool is one view for all candidates (the
    tier publishes through one rank: ``actors.engine.offload.OffloadRegistry``)."""
    if spec.policy == "round_robin":
        return RoundRobinRouter()
    if spec.policy == "random":
        return RandomRouter(actor_rng(seed, STREAM_ENTRY_ROUTER))
    if spec.policy == "kv_router":
        host, disk = pool.scheduler.host_offload, pool.scheduler.g3_offload
        return KvRouter(pool.block_size, actor_rng(seed, STREAM_ENTRY_ROUTER), spec.overlap_score_credit,
                        spec.prefill_load_scale, spec.temperature, track_prefill_tokens=True,
                        track_active_blocks=pool.role == "aggregated", kv_events=spec.kv_events,
                        host_cache_hit_weight=spec.host_cache_hit_weight,
                        disk_cache_hit_weight=spec.disk_cache_hit_weight,
                        host_tier=host.scope if host is not None else None,
                        disk_tier=disk.scope if disk is not None else None)
    raise InputError("router.policy", f"unknown router policy {spec.policy!r}; use round_robin, random or kv_router")


def build_decode_router(block_size: int, seed: int) -> KvRouter:
    """Decode placement is load-only: active decode blocks, no overlap credit, no prefill tokens."""
    return KvRouter(block_size, actor_rng(seed, STREAM_DECODE_ROUTER), overlap_score_credit=0.0,
                    track_prefill_tokens=False, track_active_blocks=True, name="decode_load")


def capabilities(pool) -> Capabilities:
    """What a rank of ``pool`` (a ``PoolPlan``) can hold, as the Planner's perf model reads it."""
    sched = pool.scheduler
    return Capabilities(
        max_batched_tokens=sched.max_batched_tokens,
        max_sequences=sched.max_sequences,
        context_length=sched.context_length or 1 << 30,
        max_kv_tokens=sched.num_gpu_blocks * sched.block_size,
    )
