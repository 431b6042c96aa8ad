"""KV-cache capacity of one rank from GPU memory (``kv_cache.capacity.type: default``).

vLLM's budget (``gpu_memory_utilization`` of *total* memory):

    kv_bytes = memory_fraction x gpu_memory
               - weights_per_gpu - activation_reserve - runtime_overhead - nccl_reserve
               - cuda_graph_reserved_bytes

TensorRT-LLM's (``free_gpu_memory_fraction`` of the memory left after everything else):

    kv_bytes = memory_fraction x (gpu_memory - weights_per_gpu - activation_reserve
                                  - runtime_overhead - nccl_reserve - cuda_graph_reserved_bytes)

SGLang's (``mem_fraction_static`` of the memory left after the pre-load overhead; its activations
are not reserved):

    kv_bytes = memory_fraction x (gpu_memory - 1.2 x runtime_overhead - nccl_reserve)
               - weights_per_gpu - cuda_graph_reserved_bytes

    tokens   = floor(kv_bytes / kv_bytes_per_token)        (per tensor-parallel shard)
    blocks   = floor(tokens / block_size)

- ``weights_per_gpu``: every layer's parameters at the checkpoint's weight dtype (attention and
  dense MLP split across ``tensor``, routed experts across ``moe_tensor x moe_expert``),
  plus the input embedding and LM head in 16-bit split across ``tensor x attention_data``;
  all divided by ``pipeline`` (a stage holds its share of the layers).
- ``activation_reserve`` = max(2 x max_batched_tokens x num_heads x head_dim x c, 70 MiB),
  c by tensor parallelism (1, 2, 4, >=8): dense 11, 6.5, 5, 5; MoE 22, 13, 10, 10.
- ``runtime_overhead`` = 3.5 GiB (CUDA context, allocator slack, sampler);
  ``nccl_reserve`` by tensor parallelism: 0, 342 MiB, 392 MiB (4 and more).
- ``kv_bytes_per_token`` covers the layers on this GPU (``layers / pipeline``).

These are aiconfigurator-core's vLLM constants (Qwen3-32B-FP8 on one H200 at block 64:
11,528 blocks of 131,072 B/token, the reference's number). Where we differ on purpose: with
pipeline parallelism a GPU holds KV only for its own layers, and MoE models count both the
embedding and the LM head.
"""

from __future__ import annotations

from dataclasses import dataclass

from aisim.actors.engine.geometry import HardwareSpec, ModelGeometry

MIB = 1 << 20
GIB = 1 << 30
RUNTIME_OVERHEAD_BYTES = 3758096384  # 3.5 GiB
NCCL_RESERVE_BYTES = {1: 0, 2: 358_612_992, 4: 411_041_792}
MIN_ACTIVATION_BYTES = 70 * MIB
_ACT_COEFF_DENSE = {1: 11.0, 2: 6.5, 4: 5.0, 8: 5.0}
_ACT_COEFF_MOE = {1: 22.0, 2: 13.0, 4: 10.0, 8: 10.0}
DEFAULT_MEMORY_FRACTION = {"vllm": 0.9, "trtllm": 0.9, "sglang": 0.88}
SGLANG_OVERHEAD_FACTOR = 1.2  # SGLang's pre-load overhead: 1.2 x the runtime overhead


@dataclass(frozen=True)
class KvSizing:
    blocks: int  # per rank
    bytes_per_token: int  # per tensor-parallel shard (and pipeline stage)
    kv_bytes: int
    weights_bytes: int
    activation_bytes: int
    runtime_overhead_bytes: int
    nccl_bytes: int

    def as_dict(self) -> dict:
        return {
            "blocks_per_rank": self.blocks,
            "bytes_per_token": self.bytes_per_token,
            "kv_bytes": self.kv_bytes,
            "weights_bytes": self.weights_bytes,
            "activation_bytes": self.activation_bytes,
            "runtime_overhead_bytes": self.runtime_overhead_bytes,
            "nccl_bytes": self.nccl_bytes,
        }


def _by_tp(table: dict[int, float], tp: int) -> float:
    return table[max(k for k in table if k <= max(1, tp))]


def weights_per_gpu(g: ModelGeometry, tensor: int = 1, pipeline: int = 1, attention_data: int = 1,
                    moe_tensor: int = 1, moe_expert: int = 1) -> float:
    layer = g.attention_params_per_layer / tensor
    if g.num_experts:
        experts = g.expert_params_per_layer
        shared = g.mlp_params_per_layer - experts  # shared experts + router
        layer += experts / (moe_tensor * moe_expert) + shared / tensor
    else:
        layer += g.mlp_params_per_layer / tensor
    layers = g.num_layers * layer * g.weight_bytes
    embed = g.embedding_params * g.embedding_bytes_per_param / (tensor * attention_data)
    return (layers + embed) / pipeline


def activation_reserve(g: ModelGeometry, max_batched_tokens: int, tensor: int = 1) -> float:
    coeff = _by_tp(_ACT_COEFF_MOE if g.num_experts else _ACT_COEFF_DENSE, tensor)
    return max(2.0 * max_batched_tokens * g.num_heads * g.head_dim * coeff, float(MIN_ACTIVATION_BYTES))


def kv_bytes_per_token(g: ModelGeometry, tensor: int = 1, pipeline: int = 1) -> int:
    per_layer = g.kv_bytes_per_token(tensor) / g.num_layers
    return int(per_layer * -(-g.num_layers // pipeline))


def default_capacity(
    g: ModelGeometry,
    hw: HardwareSpec,
    *,
    block_size: int,
    max_batched_tokens: int,
    memory_fraction: float = 0.9,
    tensor: int = 1,
    pipeline: int = 1,
    attention_data: int = 1,
    moe_tensor: int = 1,
    moe_expert: int = 1,
    cuda_graph_reserved_bytes: int = 0,
    bytes_per_token: int | None = None,
    backend: str = "vllm",
) -> KvSizing:
    weights = weights_per_gpu(g, tensor, pipeline, attention_data, moe_tensor, moe_expert)
    act = activation_reserve(g, max_batched_tokens, tensor)
    nccl = _by_tp(NCCL_RESERVE_BYTES, tensor)
    mem = hw.memory_bytes
    if backend == "trtllm":  # a fraction of the free memory
        budget = memory_fraction * (mem - weights - act - RUNTIME_OVERHEAD_BYTES - nccl - cuda_graph_reserved_bytes)
    elif backend == "sglang":  # a fraction of what the pre-load overhead leaves; no activation reserve
        act = 0
        budget = (memory_fraction * (mem - SGLANG_OVERHEAD_FACTOR * RUNTIME_OVERHEAD_BYTES - nccl) - weights
                  - cuda_graph_reserved_bytes)
    else:
        budget = memory_fraction * mem - weights - act - RUNTIME_OVERHEAD_BYTES - nccl - cuda_graph_reserved_bytes
    bpt = bytes_per_token or kv_bytes_per_token(g, tensor, pipeline)
    tokens = int(budget // bpt) if budget > 0 else 0
    return KvSizing(tokens // block_size, bpt, max(0, int(budget)), int(weights), int(act), RUNTIME_OVERHEAD_BYTES, int(nccl))
