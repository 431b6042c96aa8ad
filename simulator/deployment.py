"""The deployment rules every layer shares, each written once: GPUs per worker, the Planner's GPUs per
replica, and a pool's KV sizing. The replay's lowering (``simulator.plan``), Spica (shapes,
materialize, DGD) and ``aisim validate`` all call these; docs/architecture.md "Deployment spec".

GPUs: a worker occupies ``tensor x pipeline x attention_data x prefill_context`` GPUs (what
``gpu_hours``, the deployment's GPU count, Spica's GPU band and the DGD's ``resources.limits.gpu``
count). The Planner's budget arithmetic counts ``tensor x attention_data`` per replica, the seed's
rule for ``prefill_engine_num_gpu`` / ``decode_engine_num_gpu`` (reference planner section 1.2),
kept so the Planner decides as the reference's does; the two differ only when pipeline or
context parallelism is above 1 (``aisim validate`` shows both then).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from aisim.simulator.errors import InputError

__all__ = ["ParallelShape", "gpus_per_worker", "PoolKv", "size_kv"]


def gpus_per_worker(tensor: int = 1, pipeline: int = 1, attention_data: int = 1, prefill_context: int = 1) -> int:
    """The GPUs one worker occupies (the one formula)."""
    return tensor * pipeline * attention_data * prefill_context


@dataclass(frozen=True)
class ParallelShape:
    """A worker's parallelism, in the YAML's names (``engine.workers.<role>.parallelism``)."""

    tensor: int = 1
    pipeline: int = 1
    attention_data: int = 1  # attention-data ranks: each its own scheduler and KV cache
    prefill_context: int = 1
    moe_tensor: int = 1
    moe_expert: int = 1

    @property
    def gpus_per_worker(self) -> int:
        return gpus_per_worker(self.tensor, self.pipeline, self.attention_data, self.prefill_context)

    @property
    def planner_gpus_per_replica(self) -> int:
        """What the Planner counts per replica (the seed's rule; see the module doc)."""
        return self.tensor * self.attention_data

    @classmethod
    def from_seed(cls, shape: Mapping, prefix: str = "") -> ParallelShape:
        """From Spica's names (``tp``, ``pp``, ``attention_dp``, ``moe_tp``, ``moe_ep``, each
        ``prefix``-ed as a flat candidate has them); a missing key is 1."""
        def get(key: str) -> int:
            v = shape.get(prefix + key)
            return 1 if v is None else int(v)

        return cls(get("tp"), get("pp"), get("attention_dp"), 1, get("moe_tp"), get("moe_ep"))


@dataclass(frozen=True)
class PoolKv:
    """A pool's KV cache per rank, and how it was sized (``prediction_provenance[role].kv_sizing``)."""

    blocks_per_rank: int  # <= 0 when the weights leave no KV memory (the caller says what to change)
    bytes_per_token: int | None  # None: unknown (no model named and none given)
    provenance: dict
    weights_bytes: int = 0


def size_kv(geometry, hardware, *, backend: str, block_size: int, max_batched_tokens: int, shape: ParallelShape,
            capacity_type: str = "default", memory_fraction: float | None = None, blocks: int | None = None,
            capacity_bytes: int | None = None, cuda_graph_reserved_bytes: int = 0,
            bytes_per_token: int | str | None = "auto", field: str = "kv_cache.capacity") -> PoolKv:
    """The one KV sizing of a pool's rank. ``capacity_type`` ``default``: from GPU memory
    (``simulator.catalog.kv_capacity.default_capacity``; ``memory_fraction`` None: the backend's
    default); ``fixed``: ``blocks``, or ``capacity_bytes`` // (block size x bytes per token).
    ``bytes_per_token`` ``"auto"``: the model's per shard and stage (None without a model)."""
    from aisim.simulator.catalog.kv_capacity import DEFAULT_MEMORY_FRACTION, default_capacity, kv_bytes_per_token

    if bytes_per_token == "auto" or bytes_per_token is None:
        bpt = kv_bytes_per_token(geometry, shape.tensor, shape.pipeline) if geometry is not None else None
    else:
        bpt = int(bytes_per_token)
    if capacity_type == "default":
        fraction = memory_fraction if memory_fraction is not None else DEFAULT_MEMORY_FRACTION[backend]
        sizing = default_capacity(
            geometry, hardware, block_size=block_size, max_batched_tokens=max_batched_tokens,
            memory_fraction=fraction, tensor=shape.tensor, pipeline=shape.pipeline,
            attention_data=shape.attention_data, moe_tensor=shape.moe_tensor, moe_expert=shape.moe_expert,
            cuda_graph_reserved_bytes=cuda_graph_reserved_bytes, bytes_per_token=bpt, backend=backend)
        return PoolKv(sizing.blocks, sizing.bytes_per_token,
                      {"type": "default", "memory_fraction": fraction, **sizing.as_dict()}, sizing.weights_bytes)
    if blocks is None:
        if bpt is None:
            raise InputError(f"{field}.bytes", "sizing KV capacity from bytes needs the bytes per token: name the "
                                               "model (engine.model) or set kv_cache.bytes_per_token")
        blocks = capacity_bytes // (block_size * bpt)
        if blocks <= 0:
            raise InputError(f"{field}.bytes", f"{capacity_bytes} bytes hold no block of {block_size} tokens x "
                                               f"{bpt} B/token", category="kv_capacity")
    return PoolKv(blocks, bpt, {"type": "fixed", "blocks_per_rank": blocks, "bytes_per_token": bpt})
