"""The config rules that read more than one section or field, in one place (the pydantic
models check each section alone). ``check_config`` runs them all on a validated ``predict``
config before it is lowered; the Python API runs the same engine rules on the engine section its
arguments become, and the retune rules in its own argument names.

- not modelled yet: valid reference features this build does not model; each names the key and
  what to use instead, and is removed as its feature lands (never ignored silently);
- engine: what each worker's timing and KV sizing need (the model, the GPU), block sizes per
  backend;
- retune: the traffic and the router a retune needs.
The Planner's rules that need the engine and the SLA are part of its one lowering
(``simulator.planning.lower_planner``), where both the YAML section and the API's PlannerConfig
pass.
"""

from __future__ import annotations

from aisim.simulator.config import models as m
from aisim.simulator.config.models import ROUTER_RESERVED
from aisim.simulator.errors import InputError, NotSupportedError

__all__ = ["BACKEND_BLOCK_SIZE", "check_config", "check_engine", "check_retune_sections", "check_retune_api_arguments",
           "block_size"]

KV_ROUTER_MIN_SGLANG_PAGE = 16  # the smallest SGLang page (kv_cache.block_size) the KV router indexes
BACKEND_BLOCK_SIZE = {"vllm": 64, "sglang": 1, "trtllm": 32}  # kv_cache.block_size when not given


def check_config(cfg: m.PredictConfig) -> None:
    """Every cross-section rule of a ``predict`` config (before the trace is read)."""
    check_engine(cfg.engine)
    _check_supported(cfg)
    if cfg.planner.retune is not None:  # (the section model rejects it under policy disabled)
        check_retune_sections(cfg)


# -- not modelled yet ---------------------------------------------------------------------
def _no(path: str, what: str, instead: str) -> NotSupportedError:
    return NotSupportedError(path, f"{what} is not supported yet; {instead}")


def _check_supported(cfg: m.PredictConfig) -> None:
    """The traffic and router features this build does not model yet."""
    src = cfg.traffic.source
    if isinstance(src, m.TraceSource) and src.format not in ("mooncake", "dynamo"):
        raise _no("traffic.source.format", f"trace format {src.format}", "use format mooncake or dynamo")
    r = cfg.router
    if r.policy == "kv_router" and cfg.engine.backend == "sglang":
        for role, wk in cfg.engine.workers.items():
            if block_size(cfg.engine, wk) < KV_ROUTER_MIN_SGLANG_PAGE:
                raise InputError(f"engine.workers.{role}.kv_cache.block_size",
                                 f"the KV router indexes SGLang's pages, and pages of {block_size(cfg.engine, wk)} "
                                 f"token(s) would publish an event per token or so; set block_size >= "
                                 f"{KV_ROUTER_MIN_SGLANG_PAGE} (Dynamo's SGLang examples use 16) or router.policy: "
                                 "round_robin")
    for key, tier, fix in (("host_cache_hit_weight", "host_offload", "kv_cache.host_offload"),
                           ("disk_cache_hit_weight", "g3_offload", "kv_cache.g3_offload")):
        if getattr(r, key) is None:
            continue
        if r.policy != "kv_router":
            raise InputError(f"router.{key}", f"weighs cached blocks in the KV router's overlap (policy is "
                                              f"{r.policy}); set router.policy: kv_router or remove it")
        if not any(getattr(w.kv_cache, tier) is not None for w in cfg.engine.workers.values()):
            raise InputError(f"router.{key}", f"weighs blocks found in a KV tier no worker has; add {fix} to the "
                                              f"routed workers or remove router.{key}")
    for key, reason in ROUTER_RESERVED.items():
        if getattr(r, key) is not None:
            raise NotSupportedError(f"router.{key}", f"not supported: {reason}; remove router.{key}")
    if r.prefill_load_model.type != "none":
        raise NotSupportedError("router.prefill_load_model.type", "aic (time-decaying prefill backlog) is not supported "
                                                                 "yet; use none (prefill tokens count until the first token)")


def check_engine_supported(e: m.Engine) -> None:
    """The engine features this build does not model yet."""
    if e.mode == "afd":
        raise _no("engine.mode", "mode afd (analytical attention-FFN disaggregation)", "use aggregated or disaggregated")
    if e.tokenization is not None:
        raise _no("engine.tokenization", "tokenization", "remove engine.tokenization")
    for role, w in e.workers.items():
        base = f"engine.workers.{role}"
        if role == "encoder":
            raise _no(base, "the encoder role", "remove workers.encoder")
        if w.timing.forward_model != "op_level":
            raise _no(f"{base}.timing.forward_model", "forward_model fpm", "remove timing.forward_model")
        p = w.parallelism
        if p.decode_context > 1 and p.tensor % p.decode_context:
            raise NotSupportedError(f"{base}.parallelism.decode_context", "decode_context must divide tensor")
        if role == "aggregated" and p.prefill_context > 1 and p.decode_context > 1:
            raise NotSupportedError(f"{base}.parallelism", "aggregated workers may set at most one of prefill_context/decode_context > 1")


# -- engine -------------------------------------------------------------------------------
def block_size(e: m.Engine, wk: m.Worker) -> int:
    """A worker's KV block size: its own, else the backend's default."""
    return wk.kv_cache.block_size or BACKEND_BLOCK_SIZE[e.backend]


def _required(field: str, why: str, example: str) -> InputError:
    return InputError(field, f"Field required: {why}; name it (e.g. {example})")


def check_offload(e: m.Engine) -> None:
    """The host (G2) and disk (G3) KV tiers' rules, the reference's messages (docs/kv-offload.md)."""
    shared = {}
    for role, wk in e.workers.items():
        base = f"engine.workers.{role}.kv_cache"
        kc = wk.kv_cache
        if kc.g3_offload is not None:
            if kc.host_offload is None:
                raise InputError(f"{base}.g3_offload", "g3_offload requires host_offload; add kv_cache.host_offload "
                                                       "or remove g3_offload")
            if role != "aggregated" or wk.parallelism.attention_data != 1:
                raise InputError(f"{base}.g3_offload", "g3_offload is supported only for the aggregated worker with "
                                                       "attention_data=1; remove it")
        h = kc.host_offload
        if h is None:
            continue
        if e.backend != "vllm":
            raise InputError(f"{base}.host_offload", f"host_offload is supported only for backend=vllm (backend is "
                                                     f"{e.backend}); remove it or set engine.backend: vllm")
        if not kc.prefix_caching:
            raise InputError(f"{base}.host_offload", "host_offload requires prefix_caching=true; set "
                                                     "kv_cache.prefix_caching: true or remove host_offload")
        if h.scope == "cluster_shared":
            shared[role] = (wk, h)
    if len(shared) == 2:  # one pool: its participants agree on the pool contract
        (r1, (w1, h1)), (r2, (w2, h2)) = shared.items()
        pairs = [("num_host_blocks", h1.num_host_blocks, h2.num_host_blocks),
                 ("shared_d2h_bandwidth_gbps", h1.shared_d2h_bandwidth_gbps, h2.shared_d2h_bandwidth_gbps),
                 ("shared_h2d_bandwidth_gbps", h1.shared_h2d_bandwidth_gbps, h2.shared_h2d_bandwidth_gbps)]
        for key, a, b in pairs:
            if a != b:
                raise InputError(f"engine.workers.{r2}.kv_cache.host_offload.{key}",
                                 f"cluster_shared host_offload roles require matching host_offload.{key}: "
                                 f"{r1}={a}, {r2}={b}; set the same value on both")
        for key, a, b in [("kv_cache.block_size", block_size(e, w1), block_size(e, w2)),
                          ("kv_cache.bytes_per_token", w1.kv_cache.bytes_per_token, w2.kv_cache.bytes_per_token),
                          ("parallelism.tensor", w1.parallelism.tensor, w2.parallelism.tensor)]:
            if a != b:
                raise InputError(f"engine.workers.{r2}.{key}",
                                 f"cluster_shared host_offload roles share one block layout and require matching "
                                 f"{key}: {r1}={a}, {r2}={b}; set the same value on both")


MAX_NEXTN = 5
SPEC_TIMING = ("default", "fixed")  # timing types that price a pass's draft tokens


def check_speculation(e: m.Engine) -> None:
    """MTP (``nextn``) and n-gram ``speculation``: the reference's rules, one-line errors
    (docs/speculative-decoding.md)."""
    sp = e.speculation
    if e.nextn_accepted is not None and not e.nextn:
        raise InputError("engine.nextn_accepted", "is the mean accepted MTP drafts per pass and needs engine.nextn > 0; "
                                                  "set engine.nextn or remove nextn_accepted")
    if e.nextn:
        if e.nextn > MAX_NEXTN:
            raise InputError("engine.nextn", f"must be between 0 and {MAX_NEXTN} (got {e.nextn})")
        if e.nextn_accepted is None:
            raise InputError("engine.nextn_accepted", f"Field required with engine.nextn {e.nextn}: the mean accepted "
                                                      f"drafts per pass, in [0, {e.nextn}] (e.g. 1.4; README: choosing "
                                                      "nextn_accepted)")
        if not 0 <= e.nextn_accepted <= e.nextn:
            raise InputError("engine.nextn_accepted", f"must be within [0, nextn={e.nextn}] (got {e.nextn_accepted})")
        if sp is not None:
            raise InputError("engine.speculation", "n-gram speculation cannot be combined with MTP (engine.nextn); "
                                                   "remove one of them")
    if sp is not None:
        if e.backend != "vllm":
            raise InputError("engine.speculation", f"n-gram speculation is supported only for vLLM language workers "
                                                   f"(backend is {e.backend}); set engine.backend: vllm or remove it")
        if len(sp.acceptance_rates) != sp.num_speculative_tokens:
            raise InputError("engine.speculation.acceptance_rates", f"needs one rate per speculative token: "
                                                                    f"{sp.num_speculative_tokens}, got "
                                                                    f"{len(sp.acceptance_rates)}")
        for i, r in enumerate(sp.acceptance_rates):
            if not 0 <= r <= 1:
                raise InputError(f"engine.speculation.acceptance_rates[{i}]", f"is a probability: must be within "
                                                                              f"[0, 1] (got {r})")
    if not e.nextn and sp is None:
        return
    for role, wk in e.workers.items():
        if wk.kv_cache.host_offload is not None:  # (the reference refuses both with it)
            raise InputError(f"engine.workers.{role}.kv_cache.host_offload", "host KV offload does not support "
                                                                             "speculative decoding (MTP or n-gram), as "
                                                                             "in the reference; remove one of them")
    if e.backend == "sglang":
        raise _no("engine.nextn", "speculative decoding on SGLang workers", "use engine.backend vllm or trtllm")
    for role, wk in e.workers.items():
        if role != "prefill" and wk.timing.type not in SPEC_TIMING:
            raise InputError(f"engine.workers.{role}.timing.type", f"speculative decoding needs timing that prices "
                                                                   f"the draft tokens: default (measured) or fixed, "
                                                                   f"not {wk.timing.type}")


def check_engine(e: m.Engine) -> None:
    """The engine section's rules across its fields (the Python API's engine section too)."""
    check_engine_supported(e)
    check_speculation(e)
    check_offload(e)
    for role, wk in e.workers.items():
        base = f"engine.workers.{role}"
        sched = wk.scheduler
        if sched.prefill_decode_interval and e.backend != "sglang":
            raise InputError(f"{base}.scheduler.prefill_decode_interval", f"is supported only for backend sglang "
                                                                          f"(backend is {e.backend}); remove it")
        if sched.prefill_schedule_interval != 1 and e.backend != "vllm":
            raise InputError(f"{base}.scheduler.prefill_schedule_interval", f"is supported only for backend vllm "
                                                                            f"(backend is {e.backend}); remove it")
        if e.backend in ("vllm", "trtllm") and block_size(e, wk) < 2:
            raise InputError(f"{base}.kv_cache.block_size", f"must be >= 2 with backend {e.backend}")
        for key in ("sglang", "trtllm"):
            if getattr(sched, key) is not None and e.backend != key:
                raise InputError(f"{base}.scheduler.{key}", f"holds backend {key}'s knobs (backend is {e.backend}); "
                                                            f"remove it or set engine.backend: {key}")
        if e.backend == "sglang":
            knobs = sched.sglang or m.SGLangScheduler()
            chunk = knobs.chunked_prefill_size // wk.parallelism.attention_data
            if chunk <= 0:
                raise InputError(f"{base}.parallelism.attention_data", f"SGLang attention DP size "
                                 f"{wk.parallelism.attention_data} reduces chunked_prefill_size "
                                 f"{knobs.chunked_prefill_size} to zero; lower attention_data")
            if knobs.chunked_prefill_size % block_size(e, wk):
                raise InputError(f"{base}.kv_cache.block_size", f"SGLang's chunked_prefill_size "
                                 f"{knobs.chunked_prefill_size} must be divisible by the block (page) size "
                                 f"{block_size(e, wk)}; pick a block size that divides it")
        needs = [f"timing type {wk.timing.type}"] if wk.timing.type in ("default", "roofline") else []
        if wk.kv_cache.capacity.type == "default":
            needs.append("kv_cache.capacity type default")
        if needs and e.model is None:
            raise _required("engine.model", f"{' and '.join(needs)} of {base} need the model",
                            "meta-llama/Llama-3.1-8B-Instruct")
        if needs and (wk.hardware or e.hardware) is None:
            raise _required("engine.hardware", f"{' and '.join(needs)} of {base} need the GPU", "h200_sxm")


# -- retune -------------------------------------------------------------------------------
def check_retune_sections(cfg: m.PredictConfig) -> None:
    """The ``predict`` config's traffic and router sections, as retune needs them."""
    rc = cfg.planner.retune
    src, load, stop = cfg.traffic.source, cfg.traffic.load, cfg.traffic.stop
    if not isinstance(src, m.TraceSource):
        raise InputError("traffic.source.type", f"retune replays windows of a recorded Dynamo request trace, not "
                                                f"{src.type} traffic; use type: trace with format: dynamo")
    if src.format != "dynamo":
        raise InputError("traffic.source.format", f"retune needs format: dynamo (got {src.format}): it replays windows "
                                                  "of a Dynamo request trace; convert one with aisim trace convert "
                                                  "--from mooncake --to dynamo")
    if isinstance(load, m.ConcurrencyLoad):
        raise InputError("traffic.load.type", "retune needs open-loop arrivals on the trace's timestamps, not a closed "
                                              "loop (concurrency); use type: trace_timestamps (speedup allowed)")
    if not isinstance(load, m.TraceTimestampsLoad):
        raise InputError("traffic.load.type", f"retune needs type: trace_timestamps (speedup allowed), got "
                                              f"{load.type}: its windows are cut on the recorded arrival times")
    if stop.max_virtual_time_seconds is not None:
        raise InputError("traffic.stop.max_virtual_time_seconds", "is not allowed with retune (it replays the whole "
                                                                  "trace); remove it, or cut the trace instead")
    if rc.router is not None and cfg.router.policy != "kv_router":
        raise InputError("router.policy", f"planner.retune.router tunes the KV router's parameters, but the router is "
                                          f"{cfg.router.policy}; set router.policy: kv_router or remove "
                                          "planner.retune.router")


def check_retune_api_arguments(rc, *, trace_format: str | None, traffic, router_mode: str) -> None:
    """The Python API's arguments, as retune needs them (``trace_format`` None: synthetic traffic)."""
    from aisim.simulator.traffic.arrivals import ClosedLoop

    if trace_format is None:
        raise InputError("planner_config.retune", "run_synthetic_trace_replay does not take retune: it replays windows "
                                                  "of a recorded Dynamo request trace; use run_trace_replay(..., "
                                                  "trace_format='dynamo') or remove retune")
    if trace_format != "dynamo":
        raise InputError("planner_config.retune", f"retune needs trace_format='dynamo' (got {trace_format!r}): it "
                                                  "replays windows of a Dynamo request trace; convert the trace (aisim "
                                                  "trace convert --from mooncake --to dynamo) or remove retune")
    if isinstance(traffic.arrivals, ClosedLoop):
        raise InputError("replay_concurrency", "retune needs open-loop arrivals on the trace's timestamps, not a "
                                               "closed loop; leave replay_concurrency None (arrival_speedup_ratio is "
                                               "allowed)")
    if traffic.stop_ms is not None:
        raise InputError("max_sim_time_ms", "is not allowed with retune (it replays the whole trace); leave it None, "
                                            "or cut the trace instead")
    if rc.router is not None and router_mode != "kv_router":
        raise InputError("router_mode", f"retune.router tunes the KV router's parameters, but router_mode is "
                                        f"{router_mode!r}; use router_mode='kv_router' or remove retune.router")
