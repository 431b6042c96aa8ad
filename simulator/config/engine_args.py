"""Engine arguments: the flat per-role map the public YAML lowers to (reference names).

The Python API (``run_trace_replay(extra_engine_args=...)``) takes this map directly; the
defaults are the reference's native ones (polynomial timing, 16,384 blocks, block 64).
"""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from aisim.simulator.config.models import Float, Fraction01, NonNegFloat, PosFloat, PosInt, Strict

BACKEND_BLOCK_SIZE = {"vllm": 64, "sglang": 1, "trtllm": 32}


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
    preemption_mode: Literal["lifo", "fifo"] = "lifo"
    speedup_ratio: Float = 1.0
    decode_speedup_ratio: Float = 1.0
    prefill_schedule_interval: PosInt = 1
    # disaggregated KV transfer (read from the prefill role's arguments)
    kv_transfer_bandwidth: PosFloat | None = None  # GB/s
    kv_transfer_bytes_per_token: PosInt | None = None  # None: the prefill role's KV bytes per token
    kv_transfer_timing_mode: Literal["destination_missing", "full_prompt"] = "destination_missing"  # as in the YAML

    @model_validator(mode="after")
    def _block(self):
        if self.engine_type in ("vllm", "trtllm") and self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 with {self.engine_type}")
        return self

    @property
    def gpus_per_worker(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.dp_size * self.prefill_context_parallel_size
