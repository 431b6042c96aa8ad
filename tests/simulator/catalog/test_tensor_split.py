"""A tensor parallelism that cannot split the model's attention heads is named as such (not
"no measured data: use roofline")."""

from __future__ import annotations

from pathlib import Path

import pytest

from aisim.simulator.catalog.models import ModelSource, check_tensor_split, resolve_model, tensor_split_ok
from aisim.simulator.errors import InputError

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
ROOT = Path(__file__).resolve().parents[3]


def test_the_rule():
    cfg = {"num_attention_heads": 32, "num_key_value_heads": 8}
    assert [t for t in range(1, 33) if tensor_split_ok(cfg, t)] == [1, 2, 4, 8, 16, 32]
    gqa = {"num_attention_heads": 40, "num_key_value_heads": 8}
    assert tensor_split_ok(gqa, 5) is False  # 8 KV heads over 5 ranks
    assert tensor_split_ok({"num_attention_heads": 128, "kv_lora_rank": 512, "num_key_value_heads": 128}, 16)
    assert tensor_split_ok({"text_config": {"num_attention_heads": 12, "num_hidden_layers": 2}}, 3)
    assert tensor_split_ok({}, 3) is None


def test_llama_8b_with_tensor_3_names_the_heads_and_the_sizes_that_work():
    with pytest.raises(InputError) as info:
        check_tensor_split(resolve_model(LLAMA), 3, "engine.workers.aggregated.parallelism.tensor")
    e = info.value
    assert e.where == "engine.workers.aggregated.parallelism.tensor" and e.category == "invalid_config"
    assert e.message == f"3 does not divide {LLAMA}'s 32 attention heads; use 1, 2, 4 or 8"


def test_kv_heads_are_checked_and_unknown_geometry_passes():
    src = ModelSource("x/y", {"num_attention_heads": 40, "num_key_value_heads": 8}, None, "local")
    with pytest.raises(InputError, match="5 does not divide x/y's 8 KV heads"):
        check_tensor_split(src, 5, "tensor")
    check_tensor_split(ModelSource("x/z", {}, None, "local"), 3, "tensor")
    check_tensor_split(resolve_model(LLAMA), 8, "tensor")


def test_measured_timing_says_so_for_the_quickstart_with_tensor_3():
    pytest.importorskip("aiconfigurator_core")
    from aisim import plan_from_config
    from aisim.simulator.builders import build_timing
    from aisim.simulator.catalog.measured import measured_timing
    from aisim.simulator.config.loading import load_config

    with pytest.raises(InputError) as info:
        measured_timing(resolve_model(LLAMA), "h200_sxm", "vllm", None, tensor=3, field="engine.workers.decode.timing")
    assert info.value.where == "engine.workers.decode.parallelism.tensor"
    cfg, cdir = load_config(ROOT / "configs" / "quickstart.yaml", [
        "engine.workers.aggregated.parallelism.tensor=3", "engine.workers.aggregated.timing.type=default"])
    (pool,) = plan_from_config(cfg, cdir).pools
    with pytest.raises(InputError) as info:
        build_timing(pool, "engine.workers.aggregated.timing")  # as a run builds it
    e = info.value
    assert e.exit_code == 2 and "roofline" not in str(e)
    assert str(e) == f"engine.workers.aggregated.parallelism.tensor: 3 does not divide {LLAMA}'s 32 attention heads; use 1, 2, 4 or 8"
