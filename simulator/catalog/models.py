"""Resolve ``engine.model`` to a ``config.json`` and read the model's geometry.

Lookup order: a local directory holding ``config.json``; then the configs bundled with aisim
(``simulator/catalog/bundled_models``). Nothing here touches the network.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from actors.engine.geometry import ModelGeometry
from simulator.errors import InputError

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled_models"

_DTYPE_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "float8_e4m3fn": 1.0, "fp8": 1.0}


def bundled_model_ids() -> list[str]:
    return sorted(p.name.replace("__", "/") for p in BUNDLED_DIR.iterdir() if (p / "config.json").is_file())


def _bundled_dir(model_id: str) -> Path:
    return BUNDLED_DIR / model_id.replace("/", "__")


def find_model_dir(model: str, field: str = "engine.model") -> Path:
    local = Path(model).expanduser()
    if (local / "config.json").is_file():
        return local
    bundled = _bundled_dir(model)
    if (bundled / "config.json").is_file():
        return bundled
    raise InputError(
        field,
        f"model {model!r} not found offline (looked for {local}/config.json and the bundled configs: "
        f"{', '.join(bundled_model_ids())}); pass a local directory holding config.json or a bundled id",
    )


@lru_cache(maxsize=64)
def load_geometry(model: str, field: str = "engine.model") -> ModelGeometry:
    directory = find_model_dir(model, field)
    try:
        cfg = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(field, f"cannot read {directory / 'config.json'}: {exc}") from None
    return geometry_from_config(model, cfg, field)


def geometry_from_config(name: str, cfg: dict, field: str = "engine.model") -> ModelGeometry:
    if "text_config" in cfg and "num_hidden_layers" not in cfg:
        cfg = {**cfg, **cfg["text_config"]}

    def need(key: str):
        if key not in cfg:
            raise InputError(field, f"config.json of {name!r} lacks {key!r}; this model family is not supported yet")
        return cfg[key]

    hidden = int(need("hidden_size"))
    heads = int(need("num_attention_heads"))
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 0)
    quant = cfg.get("quantization_config") or {}
    fp8 = str(quant.get("quant_method", "")).lower() == "fp8" or "fp8" in str(quant.get("fmt", "")).lower()
    dtype_bytes = _DTYPE_BYTES.get(str(cfg.get("torch_dtype", "bfloat16")), 2.0)
    weight_bytes = 1.0 if fp8 else dtype_bytes
    return ModelGeometry(
        name=name,
        num_layers=int(need("num_hidden_layers")),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=int(cfg.get("intermediate_size") or 4 * hidden),
        vocab_size=int(need("vocab_size")),
        max_position_embeddings=int(need("max_position_embeddings")),
        weight_bytes=weight_bytes,
        kv_bytes=1.0 if fp8 else dtype_bytes,
        num_experts=experts,
        experts_per_token=int(cfg.get("num_experts_per_tok") or 0) if experts else 0,
        moe_intermediate_size=int(cfg.get("moe_intermediate_size") or 0) if experts else 0,
        num_shared_experts=int(cfg.get("n_shared_experts") or 0) if experts else 0,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
    )
