"""Reject valid reference features this build does not model yet (never ignore them silently).

Each rule names the key and what to use instead. Rules are removed as features land.
"""

from __future__ import annotations

from aisim.simulator.config import models as m
from aisim.simulator.config.models import ROUTER_RESERVED
from aisim.simulator.errors import NotSupportedError


def _no(path: str, what: str, instead: str) -> NotSupportedError:
    return NotSupportedError(path, f"{what} is not supported yet; {instead}")


def check_supported(cfg: m.PredictConfig) -> None:
    check_engine_supported(cfg.engine)
    src = cfg.traffic.source
    if isinstance(src, m.TraceSource) and src.format not in ("mooncake", "dynamo"):
        raise _no("traffic.source.format", f"trace format {src.format}", "use format mooncake or dynamo")
    r = cfg.router
    for key, reason in ROUTER_RESERVED.items():
        if getattr(r, key) is not None:
            raise NotSupportedError(f"router.{key}", f"not supported: {reason}; remove router.{key}")
    if r.prefill_load_model.type != "none":
        raise NotSupportedError("router.prefill_load_model.type", "aic (time-decaying prefill backlog) is not supported "
                                                                 "yet; use none (prefill tokens count until the first token)")


def check_engine_supported(e: m.Engine) -> None:
    """The engine features this build does not model yet (the Python API's engine section too)."""
    if e.mode == "afd":
        raise _no("engine.mode", "mode afd (analytical attention-FFN disaggregation)", "use aggregated or disaggregated")
    if e.backend != "vllm":
        raise _no("engine.backend", f"backend {e.backend} scheduling", "use backend: vllm")
    for key in ("speculation", "nextn_accepted", "tokenization"):
        if getattr(e, key) is not None:
            raise _no(f"engine.{key}", key, f"remove engine.{key}")
    if e.nextn:
        raise _no("engine.nextn", "speculative decoding (nextn > 0)", "remove engine.nextn")
    for role, w in e.workers.items():
        base = f"engine.workers.{role}"
        if role == "encoder":
            raise _no(base, "the encoder role", "remove workers.encoder")
        if w.kv_cache.host_offload is not None:
            raise _no(f"{base}.kv_cache.host_offload", "host (G2) KV offload", "remove kv_cache.host_offload")
        if w.timing.forward_model != "op_level":
            raise _no(f"{base}.timing.forward_model", "forward_model fpm", "remove timing.forward_model")
        if w.scheduler.prefill_decode_interval:
            raise NotSupportedError(f"{base}.scheduler.prefill_decode_interval", "prefill_decode_interval is SGLang-only; "
                                                                                 "remove it with backend vllm")
        p = w.parallelism
        if p.decode_context > 1 and p.tensor % p.decode_context:
            raise NotSupportedError(f"{base}.parallelism.decode_context", "decode_context must divide tensor")
        if role == "aggregated" and p.prefill_context > 1 and p.decode_context > 1:
            raise NotSupportedError(f"{base}.parallelism", "aggregated workers may set at most one of prefill_context/decode_context > 1")
