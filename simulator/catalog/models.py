"""Resolve ``engine.model`` to its ``config.json`` (+ ``hf_quant_config.json``) and read the geometry.

Lookup order, offline first:

1. a local directory holding ``config.json`` (a path is unambiguous);
2. the Hugging Face cache, through ``huggingface_hub`` (honours ``HF_HOME``/``HF_HUB_CACHE``);
3. configs bundled with aisim (``simulator/catalog/bundled_models``), then those shipped by
   aiconfigurator-core;
4. the Hugging Face Hub itself, unless ``HF_HUB_OFFLINE=1`` (gated repositories need a token).

Bundled configs come before the network so a run never waits on it for a known model.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from aisim.actors.engine.geometry import ModelGeometry
from aisim.simulator.errors import InputError

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled_models"

_DTYPE_BYTES = {
    "float32": 4.0, "float": 4.0, "float16": 2.0, "half": 2.0, "bfloat16": 2.0,
    "float8_e4m3fn": 1.0, "float8_e5m2": 1.0, "fp8": 1.0,
}
# ModelOpt / hf_quant_config quant_algo -> bytes per weight
_QUANT_ALGO_BYTES = {"FP8": 1.0, "FP8_BLOCK_SCALES": 1.0, "FP8_PER_CHANNEL_PER_TOKEN": 1.0, "NVFP4": 0.5,
                     "W4A16_AWQ": 0.5, "W4A8_AWQ": 0.5, "INT8": 1.0, "W8A16": 1.0, "MXFP4": 0.5}


@dataclass(frozen=True)
class ModelSource:
    model_id: str
    config: dict
    quant_config: dict | None
    origin: str  # where config.json came from: local, hf-cache, bundled, aiconfigurator-core, hf-hub


def bundled_model_ids() -> list[str]:
    return sorted(p.name.replace("__", "/") for p in BUNDLED_DIR.iterdir() if (p / "config.json").is_file())


def _read_json(path: Path, field: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(field, f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise InputError(field, f"{path} is not a JSON object")
    return data


def _from_dir(model: str, directory: Path, origin: str, field: str) -> ModelSource:
    quant = directory / "hf_quant_config.json"
    return ModelSource(model, _read_json(directory / "config.json", field),
                       _read_json(quant, field) if quant.is_file() else None, origin)


def _aiconfigurator_dir() -> Path | None:
    try:
        import importlib.util

        spec = importlib.util.find_spec("aiconfigurator_core")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    d = Path(spec.origin).parent / "model_configs"
    return d if d.is_dir() else None


def _hf_cache_dirs() -> list[Path]:
    """Where huggingface_hub looks for its cache (its own precedence: HF_HUB_CACHE,
    HUGGINGFACE_HUB_CACHE, HF_HOME/hub, XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub)."""
    env = os.environ
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
    dirs = [env.get("HF_HUB_CACHE"), env.get("HUGGINGFACE_HUB_CACHE"), os.path.join(home, "hub")]
    return [Path(d).expanduser() for d in dirs if d]


def _hf_cache(model: str, field: str) -> ModelSource | None:
    if model.count("/") != 1 or model.startswith(("/", ".")):
        return None
    folder = "models--" + model.replace("/", "--")
    if not any((d / folder).is_dir() for d in _hf_cache_dirs()):
        return None  # not cached: skip importing huggingface_hub (a tenth of a second)
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - a core dependency
        return None
    found = try_to_load_from_cache(model, "config.json")
    if not isinstance(found, str):
        return None
    quant = try_to_load_from_cache(model, "hf_quant_config.json")
    return ModelSource(model, _read_json(Path(found), field),
                       _read_json(Path(quant), field) if isinstance(quant, str) else None,
                       f"hf-cache:{Path(found).parent}")


def _hf_hub(model: str, field: str) -> ModelSource | None:
    if model.count("/") != 1 or os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        return None
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError
    except ImportError:  # pragma: no cover
        return None
    try:
        cfg = hf_hub_download(model, "config.json")
    except Exception:  # noqa: BLE001 - any hub failure means "not found online" here
        return None
    try:
        quant = hf_hub_download(model, "hf_quant_config.json")
    except (EntryNotFoundError, Exception):  # noqa: BLE001
        quant = None
    return ModelSource(model, _read_json(Path(cfg), field), _read_json(Path(quant), field) if quant else None, "hf-hub")


@lru_cache(maxsize=128)
def resolve_model(model: str, field: str = "engine.model") -> ModelSource:
    local = Path(model).expanduser()
    if (local / "config.json").is_file():
        return _from_dir(model, local, f"local:{local.resolve()}", field)
    cached = _hf_cache(model, field)
    if cached is not None:
        return cached
    ours = BUNDLED_DIR / model.replace("/", "__")
    if (ours / "config.json").is_file():
        return _from_dir(model, ours, "bundled:aisim", field)
    aic = _aiconfigurator_dir()
    if aic is not None:
        stem = model.replace("/", "--")
        cfg = aic / f"{stem}_config.json"
        if cfg.is_file():
            quant = aic / f"{stem}_hf_quant_config.json"
            return ModelSource(model, _read_json(cfg, field), _read_json(quant, field) if quant.is_file() else None,
                               "bundled:aiconfigurator-core")
    online = _hf_hub(model, field)
    if online is not None:
        return online
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")
    raise InputError(
        field,
        f"model {model!r} not found (looked for {local}/config.json, in the Hugging Face cache, in the configs "
        f"bundled with aisim ({', '.join(bundled_model_ids())}) and aiconfigurator-core"
        + (", and HF_HUB_OFFLINE=1 ruled out the Hub" if offline else ", and on the Hugging Face Hub")
        + "); pass a local directory holding config.json, or download it with `huggingface-cli download "
        f"{model} config.json` while online",
    )


def load_geometry(model: str, field: str = "engine.model") -> ModelGeometry:
    return geometry_of(resolve_model(model, field), field)


def geometry_of(src: ModelSource, field: str = "engine.model") -> ModelGeometry:
    return geometry_from_config(src.model_id, src.config, src.quant_config, field)


def _text_config(cfg: dict) -> dict:
    return {**cfg, **cfg["text_config"]} if "text_config" in cfg and "num_hidden_layers" not in cfg else cfg


def tensor_split_ok(cfg: dict, tensor: int) -> bool | None:
    """Whether tensor parallelism ``tensor`` splits the model's attention as an engine needs: the
    attention heads divide by it, and the KV heads either divide by it or (fewer KV heads than
    ranks, replicated) divide it; MLA has no separate KV heads. None: config.json has no heads."""
    cfg = _text_config(cfg)
    try:
        heads = int(cfg["num_attention_heads"])
        kv = int(cfg.get("num_key_value_heads") or heads)
    except (KeyError, TypeError, ValueError):
        return None
    if heads <= 0 or kv <= 0:
        return None
    if heads % tensor:
        return False
    return bool(cfg.get("kv_lora_rank")) or kv % tensor == 0 or tensor % kv == 0


def check_tensor_split(src: ModelSource, tensor: int, field: str) -> None:
    """InputError at ``field`` when ``tensor`` cannot split ``src``'s attention heads (see
    tensor_split_ok), naming the sizes that can; nothing when it can or the heads are unknown."""
    if tensor <= 1 or tensor_split_ok(src.config, tensor) is not False:
        return
    cfg = _text_config(src.config)
    heads = int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads") or heads)
    good = [t for t in range(1, max(8, tensor) + 1) if tensor_split_ok(cfg, t)]
    sizes = ", ".join(map(str, good[:-1])) + f" or {good[-1]}" if len(good) > 1 else str(good[0])
    if heads % tensor:
        what = f"{heads} attention heads"
    else:
        what = f"{kv} KV heads (it must divide them, or be a multiple of them)"
    raise InputError(field, f"{tensor} does not divide {src.model_id}'s {what}; use {sizes}")


def _dtype_bytes(cfg: dict) -> float:
    return _DTYPE_BYTES.get(str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"), 2.0)


def quantization_bytes(cfg: dict, quant: dict | None) -> tuple[float, float]:
    """(bytes per weight, bytes per KV element) from hf_quant_config.json or config.json's
    quantization_config. An FP8 checkpoint keeps an FP8 KV cache (as the reference sizes it)."""
    base = _dtype_bytes(cfg)
    if quant:
        q = quant.get("quantization", quant)
        algo = str(q.get("quant_algo") or "").upper()
        kv_algo = str(q.get("kv_cache_quant_algo") or "").upper()
        w = _QUANT_ALGO_BYTES.get(algo, base)
        kv = 1.0 if kv_algo in ("FP8", "NVFP4", "INT8") else base
        return w, kv
    qc = cfg.get("quantization_config") or {}
    method = str(qc.get("quant_method") or "").lower()
    if method == "fp8" or "fp8" in str(qc.get("fmt", "")).lower():
        return 1.0, 1.0
    if method == "modelopt":
        algo = str(qc.get("quant_algo") or "").upper()
        kv = 1.0 if str(qc.get("kv_cache_quant_algo") or "").upper() == "FP8" else base
        return _QUANT_ALGO_BYTES.get(algo, base), kv
    if method == "compressed-tensors":
        w = base
        for group in (qc.get("config_groups") or {}).values():
            weights = (group or {}).get("weights") or {}
            bits = weights.get("num_bits")
            if bits:
                w = bits / 8.0
        kv_scheme = qc.get("kv_cache_scheme") or {}
        kv = kv_scheme.get("num_bits", 16) / 8.0 if kv_scheme else base
        return w, kv
    if method in ("awq", "gptq"):
        return qc.get("bits", 4) / 8.0, base
    if method == "mxfp4":
        return 0.5, base
    return base, base


def geometry_from_config(name: str, cfg: dict, quant: dict | None = None, field: str = "engine.model") -> ModelGeometry:
    cfg = _text_config(cfg)

    def need(key: str):
        if cfg.get(key) is None:
            raise InputError(field, f"config.json of {name!r} lacks {key!r}; this model family is not supported yet",
                             category="unsupported")
        return cfg[key]

    hidden = int(need("hidden_size"))
    heads = int(need("num_attention_heads"))
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 0)
    weight_bytes, kv_bytes = quantization_bytes(cfg, quant)
    mla = int(cfg.get("kv_lora_rank") or 0) + int(cfg.get("qk_rope_head_dim") or 0) if cfg.get("kv_lora_rank") else 0
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
        kv_bytes=kv_bytes,
        num_experts=experts,
        experts_per_token=int(cfg.get("num_experts_per_tok") or 0) if experts else 0,
        moe_intermediate_size=int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 0) if experts else 0,
        num_shared_experts=int(cfg.get("n_shared_experts") or 0) if experts else 0,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        mla_kv_dim=mla,
    )
