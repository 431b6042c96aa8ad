"""Builders of the actor objects of a replay (workers, timing models, routers) from a plan.

The engine, router and planner hosts (in process or inside Ray actors) hold what they build.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aisim.actors.engine.scheduler import RankScheduler, SchedulerConfig
from aisim.actors.engine.timing import FixedTiming, PassShape, PolynomialTiming, RooflineFactors, RooflineTiming, TimingModel
from aisim.actors.engine.worker import EngineWorker
from aisim.actors.router.policies import KvRouter, RandomRouter, RoundRobinRouter
from aisim.simulator.catalog.hardware import get_hardware
from aisim.simulator.catalog.measured import measured_timing
from aisim.simulator.catalog.models import load_geometry, resolve_model
from aisim.simulator.config.engine_args import EngineArgs
from aisim.simulator.errors import InputError


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

    def describe(self) -> dict:
        return self.inner.describe()


def build_timing(args: EngineArgs, field: str = "timing_model") -> TimingModel:
    t = args.timing_model
    if args.model and args.tensor_parallel_size > 1:  # a worker shape the engine cannot run, whatever the timing
        from aisim.simulator.catalog.measured import tensor_field
        from aisim.simulator.catalog.models import check_tensor_split

        check_tensor_split(resolve_model(args.model), args.tensor_parallel_size, tensor_field(field))
    if t.type == "polynomial":
        model: TimingModel = PolynomialTiming()
    elif t.type == "fixed":
        model = FixedTiming(t.prefill_ms, t.decode_ms)
    elif t.type == "roofline":
        if not args.model or not args.hardware:
            raise InputError(field, "roofline timing needs the model and hardware (engine.model, engine.hardware)")
        d = RooflineFactors()
        factors = RooflineFactors(
            compute_efficiency=t.compute_efficiency if t.compute_efficiency is not None else d.compute_efficiency,
            memory_efficiency=t.memory_efficiency if t.memory_efficiency is not None else d.memory_efficiency,
            overhead_ms=t.overhead_ms if t.overhead_ms is not None else d.overhead_ms,
        )
        model = RooflineTiming(load_geometry(args.model), get_hardware(args.hardware), args.tensor_parallel_size, factors)
    else:
        if not args.model or not args.hardware:
            raise InputError(field, "timing type default needs the model and hardware (engine.model, engine.hardware)")
        model = measured_timing(
            resolve_model(args.model), args.hardware, args.engine_type, args.backend_version,
            tensor=args.tensor_parallel_size, pipeline=args.pipeline_parallel_size, attention_data=args.dp_size,
            moe_tensor=args.moe_tensor_parallel_size, moe_expert=args.moe_expert_parallel_size, field=field,
        )
    if args.speedup_ratio != 1.0 or args.decode_speedup_ratio != 1.0:
        model = ScaledTiming(model, args.speedup_ratio, args.decode_speedup_ratio)
    return model


def scheduler_config(args: EngineArgs) -> SchedulerConfig:
    return SchedulerConfig(
        max_batched_tokens=args.max_num_batched_tokens,
        max_sequences=args.max_num_seqs,
        block_size=args.block_size,
        num_gpu_blocks=args.num_gpu_blocks,
        enable_prefix_caching=args.enable_prefix_caching,
        enable_chunked_prefill=args.enable_chunked_prefill,
        context_length=args.max_model_len,
        preemption_mode=args.preemption_mode,
        prefill_schedule_interval=args.prefill_schedule_interval,
        prefill_only=args.worker_type == "prefill",
    )


def build_workers(args: EngineArgs, replicas: int, first_id: int, timing: TimingModel, fast_forward: bool = True,
                  record_kv_events: bool = False, pool_label: str | None = None,
                  record_timeline: bool = False, track_queue: bool = False,
                  initial_kv: dict | None = None) -> list[EngineWorker]:
    """``initial_kv``: worker id -> per rank, the blocks its KV cache starts with (warm start)."""
    cfg = scheduler_config(args)
    workers = []
    for i in range(replicas):
        ranks = [RankScheduler(cfg, timing, record_kv_events) for _ in range(args.dp_size)]
        for rank, hashes in zip(ranks, (initial_kv or {}).get(first_id + i, ())):
            rank.kv.preload(list(hashes))
        if pool_label:
            for r in ranks:
                r.pool_label = pool_label
        workers.append(EngineWorker(first_id + i, ranks, fast_forward=fast_forward, record_timeline=record_timeline,
                                    track_queue=track_queue))
    return workers


@dataclass(frozen=True)
class RouterSpec:
    """The configured router of the entry pool (aggregated or prefill workers)."""

    policy: str = "round_robin"  # round_robin | random | kv_router
    overlap_score_credit: float = 1.0
    prefill_load_scale: float = 1.0
    temperature: float = 0.0
    kv_events: bool = False  # keep the prefix index at credit 0 (retune may raise the credit)


# one random stream per actor, derived from the root seed
STREAM_ENTRY_ROUTER = 1
STREAM_DECODE_ROUTER = 2


def actor_rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(stream,)))


def build_router(spec: RouterSpec, block_size: int, seed: int, role: str):
    """Router of the entry pool; a disaggregated prefill pool's KV router tracks no decode blocks."""
    if spec.policy == "round_robin":
        return RoundRobinRouter()
    if spec.policy == "random":
        return RandomRouter(actor_rng(seed, STREAM_ENTRY_ROUTER))
    if spec.policy == "kv_router":
        return KvRouter(block_size, actor_rng(seed, STREAM_ENTRY_ROUTER), spec.overlap_score_credit,
                        spec.prefill_load_scale, spec.temperature, track_prefill_tokens=True,
                        track_active_blocks=role == "aggregated", kv_events=spec.kv_events)
    raise InputError("router.policy", f"unknown router policy {spec.policy!r}; use round_robin, random or kv_router")


def build_decode_router(block_size: int, seed: int) -> KvRouter:
    """Decode placement is load-only: active decode blocks, no overlap credit, no prefill tokens."""
    return KvRouter(block_size, actor_rng(seed, STREAM_DECODE_ROUTER), overlap_score_credit=0.0,
                    track_prefill_tokens=False, track_active_blocks=True, name="decode_load")
