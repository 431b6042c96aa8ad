"""KV capacity from GPU memory (capacity.type: default)."""

from __future__ import annotations

import pytest

from aisim import plan_from_config
from aisim.simulator.catalog.hardware import get_hardware
from aisim.simulator.catalog.kv_capacity import GIB, RUNTIME_OVERHEAD_BYTES, default_capacity, weights_per_gpu
from aisim.simulator.catalog.models import load_geometry
from aisim.simulator.config.loading import validate_config

H200 = get_hardware("h200_sxm")


def size(model, **kw):
    kw.setdefault("block_size", 64)
    kw.setdefault("max_batched_tokens", 8192)
    return default_capacity(load_geometry(model), H200, **kw)


def test_qwen3_32b_fp8_on_one_h200_matches_the_reference():
    s = size("Qwen/Qwen3-32B-FP8")
    assert s.bytes_per_token == 131_072
    assert abs(s.blocks - 11_528) / 11_528 <= 0.05 and s.blocks == 11_528
    # the formula, term by term: 0.9 x 141 GiB - weights - activations - 3.5 GiB
    assert s.weights_bytes == 34_317_271_040  # FP8 layers + 16-bit embedding and LM head
    assert s.activation_bytes == 2 * 8192 * 64 * 128 * 11
    budget = 0.9 * 141 * GIB - s.weights_bytes - s.activation_bytes - RUNTIME_OVERHEAD_BYTES
    assert s.blocks == int(budget // 131_072) // 64


def test_sizing_responds_to_every_input():
    base = size("Qwen/Qwen3-32B-FP8")
    assert size("Qwen/Qwen3-32B-FP8", memory_fraction=0.8).blocks < base.blocks
    assert size("Qwen/Qwen3-32B-FP8", max_batched_tokens=32768).blocks < base.blocks
    # 2 GiB reserved for CUDA graphs = 256 blocks of 64 x 131,072 B (one more when the floor shifts)
    assert base.blocks - size("Qwen/Qwen3-32B-FP8", cuda_graph_reserved_bytes=2 * GIB).blocks in (256, 257)
    assert size("Qwen/Qwen3-32B-FP8", block_size=16).blocks // 4 == base.blocks  # same tokens, smaller blocks
    tp2 = size("Qwen/Qwen3-32B-FP8", tensor=2)
    assert tp2.bytes_per_token == 65_536 and tp2.weights_bytes == base.weights_bytes // 2 and tp2.nccl_bytes > 0
    pp2 = size("Qwen/Qwen3-32B", pipeline=2)
    assert pp2.bytes_per_token == 131_072  # a stage holds the KV of its 32 layers
    g = load_geometry("Qwen/Qwen3-30B-A3B")
    assert weights_per_gpu(g, tensor=1, moe_expert=2, attention_data=2) < weights_per_gpu(g) * 0.6


@pytest.mark.parametrize("model,kw", [("Qwen/Qwen3-32B-FP8", {}), ("Qwen/Qwen3-32B-FP8", {"tensor": 2}),
                                      ("Qwen/Qwen3-32B", {"tensor": 4}), ("Qwen/Qwen3-8B", {})])
def test_dense_models_agree_with_aiconfigurator_core(model, kw):
    pytest.importorskip("aiconfigurator_core")
    from aiconfigurator_core.sdk.memory import estimate_kv_cache

    est = estimate_kv_cache(model, "h200_sxm", "vllm", "current", max_num_tokens=8192, max_batch_size=256,
                            memory_fraction_kind="of_total", memory_fraction_value=0.9,
                            tp_size=kw.get("tensor", 1))
    ours = size(model, **kw)
    assert ours.bytes_per_token == est["kv_size_per_token_bytes"]
    assert ours.kv_bytes // ours.bytes_per_token == est["total_kv_size_tokens"]


def test_config_default_capacity_is_reported(tmp_path):
    cfg = validate_config({"engine": {"model": "Qwen/Qwen3-32B-FP8", "hardware": "h200_sxm",
                                      "workers": {"aggregated": {"timing": {"type": "polynomial"}}}}})
    plan = plan_from_config(cfg)
    pool = plan.pools[0]
    assert pool.scheduler.num_gpu_blocks == 11_528 and pool.kv_bytes_per_token == 131_072
    assert pool.kv_sizing["type"] == "default" and pool.kv_sizing["memory_fraction"] == 0.9


def test_model_too_big_for_the_gpu_says_what_to_do():
    from aisim.simulator.errors import InputError

    cfg = validate_config({"engine": {"model": "Qwen/Qwen3-32B", "hardware": "l40s",
                                      "workers": {"aggregated": {"timing": {"type": "polynomial"}}}}})
    with pytest.raises(InputError, match="raise parallelism.tensor"):
        plan_from_config(cfg)


@pytest.mark.parametrize("model,tensor,trtllm,sglang", [
    ("nvidia/Llama-3.1-8B-Instruct-FP8", 1, 59_146, 1_833_811),
    ("nvidia/Llama-3.1-8B-Instruct-FP8", 2, 122_140, 3_796_552),
    ("Qwen/Qwen3-32B-FP8", 1, 23_999, 724_365),
    ("Qwen/Qwen3-32B-FP8", 2, 55_468, 1_705_736),
])
def test_trtllm_and_sglang_size_their_pools_as_the_reference_does(model, tensor, trtllm, sglang):
    # the reference's blocks per rank on one H200 (max_batched_tokens 8192): TRT-LLM takes 0.9 of
    # the memory left after weights, activations and overheads (block 32); SGLang 0.88 of what
    # its pre-load overhead leaves, then the weights (block 1; no activation reserve)
    assert size(model, tensor=tensor, block_size=32, memory_fraction=0.9, backend="trtllm").blocks == trtllm
    assert size(model, tensor=tensor, block_size=1, memory_fraction=0.88, backend="sglang").blocks == sglang
