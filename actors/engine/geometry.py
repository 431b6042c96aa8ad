"""Plain descriptions of a model's shape and a GPU's speeds, as the engine needs them.

Built by ``simulator.catalog`` from Hugging Face ``config.json`` files and the hardware
catalog; kept here so timing models depend on data, not on where it came from.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelGeometry:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    weight_bytes: float = 2.0  # bytes per parameter (bf16 = 2, fp8 = 1)
    kv_bytes: float = 2.0  # bytes per KV element
    num_experts: int = 0  # 0 = dense MLP
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    tie_word_embeddings: bool = False
    mla_kv_dim: int = 0  # multi-head latent attention: kv_lora_rank + qk_rope_head_dim (0 = regular KV)

    @property
    def attention_params_per_layer(self) -> int:
        q = self.hidden_size * self.num_heads * self.head_dim
        kv = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * self.hidden_size
        return q + kv + o

    @property
    def mlp_params_per_layer(self) -> int:
        """All MLP parameters of one layer (every expert for MoE)."""
        if self.num_experts:
            per_expert = 3 * self.hidden_size * self.moe_intermediate_size
            shared = 3 * self.hidden_size * self.moe_intermediate_size * self.num_shared_experts
            router = self.hidden_size * self.num_experts
            return per_expert * self.num_experts + shared + router
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def active_mlp_params_per_layer(self) -> int:
        """MLP parameters one token multiplies by."""
        if self.num_experts:
            per_expert = 3 * self.hidden_size * self.moe_intermediate_size
            return per_expert * (self.experts_per_token + self.num_shared_experts) + self.hidden_size * self.num_experts
        return self.mlp_params_per_layer

    @property
    def embedding_params(self) -> int:
        """Input embedding + LM head (one matrix when tied)."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    @property
    def expert_params_per_layer(self) -> int:
        """Routed-expert parameters of one layer (0 for a dense model)."""
        if not self.num_experts:
            return 0
        return 3 * self.hidden_size * self.moe_intermediate_size * self.num_experts

    @property
    def embedding_bytes_per_param(self) -> float:
        """Quantized checkpoints keep embeddings and the LM head in 16-bit."""
        return max(self.weight_bytes, 2.0)

    @property
    def total_params(self) -> int:
        return self.num_layers * (self.attention_params_per_layer + self.mlp_params_per_layer) + self.embedding_params

    @property
    def active_params_per_token(self) -> int:
        """Parameters in the per-token matmuls (excluding the LM head and embeddings)."""
        return self.num_layers * (self.attention_params_per_layer + self.active_mlp_params_per_layer)

    def kv_bytes_per_token(self, tensor_parallel: int = 1) -> int:
        """KV bytes per token on one tensor-parallel shard.

        Regular attention: layers x 2 (K and V) x KV heads per shard x head_dim x KV dtype bytes;
        KV heads split across the shard, never below one (replicated when fewer than shards).
        MLA: layers x (kv_lora_rank + qk_rope_head_dim) x bytes, the latent replicated per shard.
        """
        if self.mla_kv_dim:
            return int(self.num_layers * self.mla_kv_dim * self.kv_bytes)
        kv_heads = max(1, -(-self.num_kv_heads // max(1, tensor_parallel)))
        return int(self.num_layers * 2 * kv_heads * self.head_dim * self.kv_bytes)


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    memory_bytes: int  # HBM per GPU
    bf16_tflops: float  # dense peak
    fp8_tflops: float  # dense peak (== bf16 where the GPU has no FP8 units)
    hbm_tb_per_s: float
    interconnect_gb_per_s: float  # per-GPU NVLink (or PCIe) bandwidth, one direction
