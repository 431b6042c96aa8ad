"""Model resolution (HF cache, local, bundled), geometry and the hardware catalog. Offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aisim.simulator.catalog.hardware import get_hardware
from aisim.simulator.catalog.models import BUNDLED_DIR, load_geometry, resolve_model
from aisim.simulator.errors import InputError
from tests.conftest import ROOT

TINY = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 1024, "intermediate_size": 4096,
    "num_attention_heads": 16, "num_key_value_heads": 4, "num_hidden_layers": 12, "vocab_size": 32000,
    "max_position_embeddings": 16384, "torch_dtype": "bfloat16",
}


def hf_cache(root: Path, repo: str, files: dict[str, dict], sha: str = "0123456789abcdef0123456789abcdef01234567") -> Path:
    """The real huggingface_hub cache layout: blobs + snapshot symlinks + refs/main."""
    repo_dir = root / "hub" / ("models--" + repo.replace("/", "--"))
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text(sha)
    snap = repo_dir / "snapshots" / sha
    snap.mkdir(parents=True, exist_ok=True)
    (repo_dir / "blobs").mkdir(exist_ok=True)
    for name, content in files.items():
        blob = repo_dir / "blobs" / f"blob-{name}"
        blob.write_text(json.dumps(content))
        (snap / name).symlink_to(os.path.relpath(blob, snap))
    return root


def test_hugging_face_cache_layout_resolves_offline():
    # conftest points HF_HOME at a private directory before huggingface_hub is imported
    hf_cache(Path(os.environ["HF_HOME"]), "acme/tiny-1B", {"config.json": TINY})
    src = resolve_model("acme/tiny-1B")
    assert src.origin.startswith("hf-cache:") and src.config["hidden_size"] == 1024
    g = load_geometry("acme/tiny-1B")
    assert (g.num_layers, g.num_kv_heads, g.head_dim) == (12, 4, 64)
    assert g.kv_bytes_per_token() == 12 * 2 * 4 * 64 * 2 and g.kv_bytes_per_token(2) == 12 * 2 * 2 * 64 * 2


def test_cli_uses_the_cache_named_by_hf_home(tmp_path):
    quant = {"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}
    home = hf_cache(tmp_path / "hf", "acme/tiny-fp8", {"config.json": TINY, "hf_quant_config.json": quant})
    out = tmp_path / "out"
    env = dict(os.environ, HF_HOME=str(home), HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "aisim", "predict", "--set", "engine.model=acme/tiny-fp8",
                        "--output-dir", str(out), "--format", "json"], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    prov = json.loads((out / "prediction.json").read_text())["summary"]["prediction_provenance"]["aggregated"]
    assert prov["model_source"].startswith("hf-cache:")
    assert prov["kv_bytes_per_token"] == 12 * 2 * 4 * 64 * 1  # FP8 KV from hf_quant_config.json
    assert prov["context_length"] == 16384


def test_local_directory_model(tmp_path):
    (tmp_path / "config.json").write_text((BUNDLED_DIR / "Qwen__Qwen3-32B" / "config.json").read_text())
    src = resolve_model(str(tmp_path))
    assert src.origin.startswith("local:") and load_geometry(str(tmp_path)).num_layers == 64


def test_bundled_geometry_and_fp8_kv_bytes_per_token():
    g = load_geometry("meta-llama/Llama-3.1-8B-Instruct")
    assert (g.num_layers, g.num_kv_heads, g.head_dim, g.max_position_embeddings) == (32, 8, 128, 131072)
    assert g.kv_bytes_per_token() == 131_072 and g.kv_bytes_per_token(2) == 65_536
    assert g.kv_bytes_per_token(16) == 16_384  # one head per shard, replicated
    assert 7.9e9 < g.total_params < 8.1e9
    assert load_geometry("nvidia/Llama-3.1-8B-Instruct-FP8").kv_bytes_per_token() == 65_536  # hf_quant_config.json
    qwen = load_geometry("Qwen/Qwen3-32B-FP8")  # quantization_config: fp8
    assert qwen.kv_bytes_per_token() == 131_072 and qwen.weight_bytes == 1.0  # 64 x 2 x 8 x 128 x 1
    moe = load_geometry("Qwen/Qwen3-30B-A3B")
    assert moe.num_experts == 128 and moe.experts_per_token == 8
    assert 29e9 < moe.total_params < 32e9 and 2.5e9 < moe.active_params_per_token < 4e9


def test_aiconfigurator_core_bundled_configs_and_mla():
    pytest.importorskip("aiconfigurator_core")
    src = resolve_model("deepseek-ai/DeepSeek-V3")
    assert src.origin == "bundled:aiconfigurator-core"
    assert load_geometry("deepseek-ai/DeepSeek-V3").kv_bytes_per_token(8) == 61 * (512 + 64) * 1  # MLA latent, FP8


def test_unknown_model_says_where_it_looked_and_what_to_do():
    with pytest.raises(InputError) as info:
        resolve_model("acme/nope-1B")
    msg = str(info.value)
    assert "acme/nope-1B" in msg and "Hugging Face cache" in msg and "bundled" in msg
    assert "HF_HUB_OFFLINE=1" in msg and "huggingface-cli download" in msg and "\n" not in msg


def test_hardware_catalog():
    h = get_hardware("h200_sxm")
    assert h.fp8_tflops > h.bf16_tflops > 0 and h.hbm_tb_per_s > get_hardware("h100_sxm").hbm_tb_per_s
    for name in ("h100_sxm", "h200_sxm", "b200_sxm", "gb200", "a100_sxm", "l40s"):
        assert get_hardware(name).memory_bytes > 40 * 2**30
    with pytest.raises(InputError, match="known: a100_sxm"):
        get_hardware("tpu_v9")
