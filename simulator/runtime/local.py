"""In-process runtime: builds the actor objects (workers, router) for a replay.

The same classes will be wrapped as Ray actors by the Ray runtime; here they are plain
objects driven directly by the coordinator (the fastest form).
"""

from __future__ import annotations

from actors.engine.scheduler import RankScheduler, SchedulerConfig
from actors.engine.timing import FixedTiming, PassShape, PolynomialTiming, RooflineFactors, RooflineTiming, TimingModel
from actors.engine.worker import EngineWorker
from actors.router.policies import RoundRobinRouter
from simulator.catalog.hardware import get_hardware
from simulator.catalog.measured import measured_timing
from simulator.catalog.models import load_geometry, resolve_model
from simulator.config.engine_args import EngineArgs
from simulator.errors import InputError, NotSupportedError


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
        return self.inner.decode_run_ms(num_decode, kv_tokens0, total_kv_tokens, num_passes) / self._ddiv

    def describe(self) -> dict:
        return self.inner.describe()


def build_timing(args: EngineArgs, field: str = "timing_model") -> TimingModel:
    t = args.timing_model
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


def build_workers(args: EngineArgs, replicas: int, first_id: int, timing: TimingModel, fast_forward: bool = True) -> list[EngineWorker]:
    cfg = scheduler_config(args)
    return [
        EngineWorker(first_id + i, [RankScheduler(cfg, timing) for _ in range(args.dp_size)], fast_forward=fast_forward)
        for i in range(replicas)
    ]


def build_router(policy: str):
    if policy == "round_robin":
        return RoundRobinRouter()
    raise NotSupportedError("router_mode", f"router policy {policy} is not supported yet; use round_robin")
