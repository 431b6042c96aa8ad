"""Engine arguments: the reference's flat per-role map (``run_trace_replay(extra_engine_args=...)``),
an input-only dialect. ``engine_section`` turns the API's pools into the YAML ``engine`` section,
which ``simulator.plan`` lowers like any config's; nothing inside aisim reads ``EngineArgs``.
The defaults are the reference's native ones (polynomial timing, 16,384 blocks, block 64).
"""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from aisim.simulator.config.models import (
    Fraction01,
    G3Offload,
    HostOffload,
    NonNegFloat,
    NonNegInt,
    PosFloat,
    PosInt,
    Strict,
)
from aisim.simulator.errors import InputError


class TimingModelArgs(Strict):
    type: Literal["polynomial", "fixed", "roofline", "default"] = "polynomial"
    prefill_ms: NonNegFloat | None = None
    decode_ms: NonNegFloat | None = None
    compute_efficiency: Fraction01 | None = None
    memory_efficiency: Fraction01 | None = None
    overhead_ms: NonNegFloat | None = None

    @model_validator(mode="after")
    def _fixed(self):
        if self.type == "fixed" and (self.prefill_ms is None or self.decode_ms is None):
            raise ValueError("timing_model type fixed needs prefill_ms and decode_ms")
        return self


class EngineArgs(Strict):
    worker_type: Literal["aggregated", "prefill", "decode"] = "aggregated"
    engine_type: Literal["vllm", "sglang", "trtllm"] = "vllm"
    backend_version: str | None = None  # performance-data selector (recorded in provenance)
    model: str | None = None  # aisim: geometry for roofline timing and context length
    hardware: str | None = None  # aisim: GPU for roofline timing
    max_num_batched_tokens: PosInt = 8192
    max_num_seqs: PosInt = 256
    block_size: PosInt = 64
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    startup_time: NonNegFloat | None = None
    max_model_len: PosInt | None = None
    num_gpu_blocks: PosInt = 16384
    gpu_memory_utilization: Fraction01 | None = None
    tensor_parallel_size: PosInt = 1
    pipeline_parallel_size: PosInt = 1
    prefill_context_parallel_size: PosInt = 1
    dp_size: PosInt = 1
    moe_tensor_parallel_size: PosInt = 1
    moe_expert_parallel_size: PosInt = 1
    timing_model: TimingModelArgs = TimingModelArgs()
    kv_cache_bytes_per_token: PosInt | None = None
    # host (G2) / disk (G3) KV tiers: the reference's engine arguments, the YAML's
    # kv_cache.host_offload / g3_offload keys (docs/kv-offload.md)
    native_host_offload: HostOffload | None = None
    g3_offload: G3Offload | None = None
    preemption_mode: Literal["lifo", "fifo"] = "lifo"
    speedup_ratio: PosFloat = 1.0
    decode_speedup_ratio: PosFloat = 1.0
    prefill_schedule_interval: PosInt = 1
    prefill_decode_interval: NonNegInt = 0  # SGLang only
    # disaggregated KV transfer (read from the prefill role's arguments)
    kv_transfer_bandwidth: PosFloat | None = None  # GB/s
    kv_transfer_bytes_per_token: PosInt | None = None  # None: the prefill role's KV bytes per token
    kv_transfer_timing_mode: Literal["destination_missing", "full_prompt"] = "destination_missing"  # as in the YAML

    @model_validator(mode="after")
    def _block(self):
        if self.engine_type in ("vllm", "trtllm") and self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 with {self.engine_type}")
        return self

    def worker_section(self, replicas: int) -> dict:
        """This role's ``engine.workers.<role>`` section (the YAML's names)."""
        t = self.timing_model
        timing = {"type": t.type, **t.model_dump(exclude={"type"}, exclude_none=True)}
        if self.gpu_memory_utilization is not None and "num_gpu_blocks" not in self.model_fields_set:
            capacity = {"type": "default", "memory_fraction": self.gpu_memory_utilization}  # sized from GPU memory
        else:
            capacity = {"type": "fixed", "blocks": self.num_gpu_blocks}
        return {
            "startup_seconds": self.startup_time or 0.0,
            "context_length": self.max_model_len,
            "speedup_ratio": self.speedup_ratio,
            "decode_speedup_ratio": self.decode_speedup_ratio,
            "parallelism": {"replicas": replicas, "tensor": self.tensor_parallel_size,
                            "pipeline": self.pipeline_parallel_size, "attention_data": self.dp_size,
                            "prefill_context": self.prefill_context_parallel_size,
                            "moe_tensor": self.moe_tensor_parallel_size, "moe_expert": self.moe_expert_parallel_size},
            "scheduler": {"max_batched_tokens": self.max_num_batched_tokens, "max_sequences": self.max_num_seqs,
                          "prefill_schedule_interval": self.prefill_schedule_interval,
                          "prefill_decode_interval": self.prefill_decode_interval,
                          "preemption_mode": self.preemption_mode},
            "kv_cache": {"block_size": self.block_size, "prefix_caching": self.enable_prefix_caching,
                         "bytes_per_token": self.kv_cache_bytes_per_token or "auto", "capacity": capacity,
                         **({"host_offload": self.native_host_offload.model_dump()}
                            if self.native_host_offload is not None else {}),
                         **({"g3_offload": self.g3_offload.model_dump()} if self.g3_offload is not None else {})},
            "timing": timing,
        }


#: the arguments the YAML sets once per engine: every role must agree on them
_ENGINE_WIDE = {"engine_type": "backend", "backend_version": "backend_version", "model": "model",
                "enable_chunked_prefill": "enable_chunked_prefill"}


def engine_section(roles: dict[str, tuple[int, EngineArgs, str]]) -> dict:
    """The YAML ``engine`` section of the API's pools: role -> (replicas, its arguments, the API
    argument they came in, for errors). One role: aggregated; prefill + decode: disaggregated (the
    KV transfer from the prefill role's ``kv_transfer_*``)."""
    items = list(roles.items())
    _, first, first_name = items[0][1]
    for key, yaml_key in _ENGINE_WIDE.items():
        for _, (_, args, name) in items[1:]:
            if getattr(args, key) != getattr(first, key):
                raise InputError(f"{name}.{key}", f"must equal {first_name}.{key} ({getattr(first, key)!r}): the engine "
                                                  f"has one {yaml_key}")
    hardware = {args.hardware for _, (_, args, _) in items}
    engine = {
        "mode": "disaggregated" if "prefill" in roles else "aggregated",
        "backend": first.engine_type,
        "backend_version": first.backend_version,
        "model": first.model,
        "hardware": first.hardware if len(hardware) == 1 else None,
        "context_length": first.max_model_len,  # None: no limit (the reference's default); per role below
        "enable_chunked_prefill": first.enable_chunked_prefill,
        "workers": {},
    }
    for role, (replicas, args, _) in items:
        worker = args.worker_section(replicas)
        if len(hardware) > 1:
            worker["hardware"] = args.hardware
        engine["workers"][role] = worker
    if "prefill" in roles:
        pa = roles["prefill"][1]
        engine["kv_transfer"] = {"bandwidth_gb_per_second": pa.kv_transfer_bandwidth,
                                 "bytes_per_token": pa.kv_transfer_bytes_per_token or "auto",
                                 "timing_mode": pa.kv_transfer_timing_mode}
    return engine
