"""Model geometry and the hardware catalog."""

from __future__ import annotations

import json

import pytest

from simulator.catalog.hardware import get_hardware
from simulator.catalog.models import load_geometry
from simulator.errors import InputError


def test_bundled_geometry_and_kv_bytes_per_token():
    g = load_geometry("meta-llama/Llama-3.1-8B-Instruct")
    assert (g.num_layers, g.num_kv_heads, g.head_dim, g.max_position_embeddings) == (32, 8, 128, 131072)
    assert g.kv_bytes_per_token() == 131_072 and g.kv_bytes_per_token(2) == 65_536
    assert 7.9e9 < g.total_params < 8.1e9
    fp8 = load_geometry("Qwen/Qwen3-32B-FP8")
    assert fp8.kv_bytes_per_token() == 131_072  # 64 layers x 2 x 8 heads x 128 x 1 byte
    moe = load_geometry("Qwen/Qwen3-30B-A3B")
    assert 29e9 < moe.total_params < 32e9 and 2.5e9 < moe.active_params_per_token < 4e9


def test_local_directory_model(tmp_path):
    cfg = json.loads((__import__("simulator.catalog.models", fromlist=["x"]).BUNDLED_DIR /
                      "Qwen__Qwen3-32B" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert load_geometry(str(tmp_path)).num_layers == 64


def test_unknown_model_and_hardware_say_what_to_do():
    with pytest.raises(InputError, match="not found offline") as info:
        load_geometry("acme/nope-1B")
    assert "bundled" in str(info.value)
    with pytest.raises(InputError, match="known: a100_sxm"):
        get_hardware("tpu_v9")
