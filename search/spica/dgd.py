"""The deployment output of a Spica search (``--output dgd``, section ``dgd``; reference §7.7): the
winning candidate (scalar targets) or every Pareto-front member rendered as a Dynamo
``DynamoGraphDeployment`` for its backend (vLLM or TensorRT-LLM workers).

Invariants: ``render_manifest`` is pure (the same candidate config gives the same dict, the config
is not modified); every flag is written explicitly (no choice rides on a default); a field the
manifest cannot express raises ``NotSupportedError`` naming the flat key, never renders silently;
files are written atomically, manifests first and the index last. The services, the flag tables,
multinode placement, the Planner's JSON and the file layout: docs/dgd.md.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from numbers import Integral, Real
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from aisim.search.spica.config import Dgd
from aisim.search.spica.materialize import PLANNER_FIELDS
from aisim.search.spica.space import CACHE_HIT_WEIGHTS, ROUTER_ADMISSION
from aisim.simulator.errors import InputError, NotSupportedError
from aisim.simulator.metrics.output import atomic_write_text, canonical_json

__all__ = ["render_manifest", "manifest_yaml", "write_dgd", "DEFAULT_RUNTIME_VERSION", "DEFAULT_RUNTIME_IMAGE_REPO",
           "RUNTIME_IMAGE_REPOS", "WORKER_WORKDIR", "API_VERSION", "KIND"]

API_VERSION = "nvidia.com/v1alpha1"
KIND = "DynamoGraphDeployment"
DEFAULT_RUNTIME_VERSION = "1.5.0"
DEFAULT_RUNTIME_IMAGE_REPO = "nvcr.io/nvidia/ai-dynamo/vllm-runtime"
RUNTIME_IMAGE_REPOS = {"vllm": DEFAULT_RUNTIME_IMAGE_REPO, "trtllm": "nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime",
                       "sglang": "nvcr.io/nvidia/ai-dynamo/sglang-runtime"}
WORKER_WORKDIR = "/workspace/examples/backends/vllm"
WORKER_WORKDIRS = {"vllm": WORKER_WORKDIR, "trtllm": "/workspace/", "sglang": "/workspace/examples/backends/sglang"}
DEFAULT_OUTPUT_FILE = "dgd.yaml"
INDEX_FILE = "index.json"
KUSTOMIZATION_FILE = "kustomization.yaml"
PLANNER_TARGETS = ("throughput", "latency", "load", "sla")
_SEMVER = re.compile(r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$")
# per mode: (service name, subComponentType, parallel-field prefix, engine-knob prefix, role flag)
# per backend and mode: (service name, subComponentType, parallel-field prefix, engine-knob prefix, role)
_WORKERS: dict[str, dict[str, tuple[tuple[str, str | None, str, str, str | None], ...]]] = {
    "vllm": {
        "agg": (("VllmDecodeWorker", None, "", "agg_", None),),
        "disagg": (("VllmPrefillWorker", "prefill", "prefill_", "prefill_", "prefill"),
                   ("VllmDecodeWorker", "decode", "decode_", "decode_", "decode")),
    },
    "sglang": {
        "agg": (("decode", None, "", "agg_", None),),
        "disagg": (("prefill", "prefill", "prefill_", "prefill_", "prefill"),
                   ("decode", "decode", "decode_", "decode_", "decode")),
    },
    "trtllm": {
        "agg": (("TRTLLMWorker", None, "", "agg_", None),),
        "disagg": (("prefill", "prefill", "prefill_", "prefill_", "prefill"),
                   ("decode", "decode", "decode_", "decode_", "decode")),
    },
}
_VLLM_ROLE_FLAGS = {"prefill": "--is-prefill-worker", "decode": "--is-decode-worker"}


# -- small helpers -----------------------------------------------------------------------------
def _need(config: Mapping[str, Any], key: str) -> Any:
    if key not in config:
        raise InputError(key, "is missing from the candidate config; render the flat sample unroll_sample builds")
    return config[key]


def _arg(value: Any, key: str) -> str:
    """A container argument (Kubernetes args are strings): ints as digits, floats as their
    shortest round-trip repr."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise InputError(key, f"must be a number, got {value!r}")
    if isinstance(value, Integral):
        return str(int(value))
    if not math.isfinite(value):
        raise InputError(key, f"must be a finite number, got {value!r}")
    return repr(float(value))


def _count(config: Mapping[str, Any], key: str) -> int:
    value = _need(config, key)
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise InputError(key, f"must be a positive integer, got {value!r}")
    return int(value)


def _dgd(dgd: Dgd | Mapping[str, Any]) -> Dgd:
    if isinstance(dgd, Dgd):
        return dgd
    if not isinstance(dgd, Mapping):
        raise InputError("dgd", f"must be a mapping (the dgd section), not {type(dgd).__name__}")
    try:
        return Dgd.model_validate(dict(dgd))
    except ValidationError as exc:
        from aisim.simulator.config.loading import format_validation_error

        err = format_validation_error(exc)
        raise InputError(f"dgd.{err.where}", err.message) from None


def _check_renderer(dgd: Dgd) -> None:
    if dgd.renderer == "aic":
        raise NotSupportedError("dgd.renderer", "aic (aiconfigurator's DGD generator) is not part of this build; "
                                                "use renderer: direct (the built-in vLLM renderer)")


def _image(dgd: Dgd, backend: str) -> str:
    if dgd.runtime_image is not None:
        return dgd.runtime_image
    return f"{RUNTIME_IMAGE_REPOS[backend]}:{dgd.runtime_version_override or DEFAULT_RUNTIME_VERSION}"


def _version_override(dgd: Dgd) -> str | None:
    override = dgd.runtime_version_override
    if override is not None and not _SEMVER.match(override):
        raise InputError("dgd.runtime_version_override", f"{override!r} is not a canonical MAJOR.MINOR.PATCH "
                                                         "version (e.g. 1.5.0)")
    return override


def _name(dgd: Dgd, index: int | None) -> str:
    if "{index}" not in dgd.name:
        return dgd.name
    if isinstance(index, bool) or not isinstance(index, Integral) or index < 0:
        raise InputError("dgd.name", f"{dgd.name!r} has an {{index}} placeholder: render it with the front "
                                     f"member's index (a non-negative integer), got {index!r}")
    return dgd.name.replace("{index}", f"{int(index):03d}")


# -- the candidate ------------------------------------------------------------------------------
def _check_supported(config: Mapping[str, Any]) -> None:
    backend = _need(config, "backend")
    if backend not in _WORKERS:
        raise NotSupportedError("backend", f"{backend} workers are not rendered; vllm, sglang and trtllm "
                                           "candidates render to a DGD")
    if config.get("num_g2_blocks") and backend != "vllm":
        raise NotSupportedError("num_g2_blocks", f"host (G2) KV offload is rendered for vllm workers only (KVBM's "
                                                 f"connector; backend is {backend}); set num_g2_blocks 0")
    for key in CACHE_HIT_WEIGHTS:
        if key in config and not config.get("num_g2_blocks"):
            raise NotSupportedError(key, "host/disk cache-hit weights come with the host tier; set num_g2_blocks > 0")
    if config.get("aic_nextn") and backend == "sglang":
        raise NotSupportedError("aic_nextn", "MTP on SGLang workers is not rendered (nor modelled); set aic_nextn "
                                             "null or use vllm or trtllm")
    for key in ROUTER_ADMISSION:
        if config.get(key) not in (None, False):
            raise NotSupportedError(key, "router admission control is reserved in the search and not rendered")


def _gpus_per_worker(config: Mapping[str, Any], par: str) -> int:
    from aisim.simulator.deployment import gpus_per_worker

    return gpus_per_worker(tensor=_count(config, f"{par}tp"), pipeline=_count(config, f"{par}pp"),
                           attention_data=_count(config, f"{par}attention_dp"))


def _expert_args(config: Mapping[str, Any], par: str) -> list[str]:
    tp, adp = _count(config, f"{par}tp"), _count(config, f"{par}attention_dp")
    moe_tp, moe_ep = _count(config, f"{par}moe_tp"), _count(config, f"{par}moe_ep")
    if moe_ep == 1:
        if moe_tp not in (1, tp * adp):
            raise NotSupportedError(f"{par}moe_tp", f"{moe_tp} is not expressible in vLLM: without expert "
                                                    f"parallelism the experts split over all tp x data-parallel "
                                                    f"ranks ({tp * adp})")
        return []
    if moe_tp != 1 or moe_ep != tp * adp:
        raise NotSupportedError(f"{par}moe_ep", f"moe_ep {moe_ep} with moe_tp {moe_tp} is not expressible in vLLM: "
                                                f"--enable-expert-parallel spans all tp x data-parallel ranks "
                                                f"({tp * adp}) with no expert tensor split")
    return ["--enable-expert-parallel"]


def _trtllm_worker_args(config: Mapping[str, Any], par: str, eng: str, role: str | None) -> list[str]:
    """A TensorRT-LLM worker (``python3 -m dynamo.trtllm``): first-class flags plus one
    ``--override-engine-args`` JSON for what has no flag (docs/dgd.md, "TensorRT-LLM workers")."""
    model = str(_need(config, "model_name"))
    tp, adp = _count(config, f"{par}tp"), _count(config, f"{par}attention_dp")
    if adp > 1 and tp > 1:
        raise NotSupportedError(f"{par}attention_dp", f"tp {tp} with attention_dp {adp} is not expressible in "
                                                      "TensorRT-LLM: its attention-DP size is its tensor-parallel "
                                                      "size (use tp 1 with attention_dp)")
    moe_tp, moe_ep = _count(config, f"{par}moe_tp"), _count(config, f"{par}moe_ep")
    if moe_tp * moe_ep not in (1, tp * adp):
        raise NotSupportedError(f"{par}moe_ep", f"moe_tp {moe_tp} x moe_ep {moe_ep} must span the worker's "
                                                f"{tp * adp} GPUs in TensorRT-LLM")
    block = _arg(_need(config, f"{eng}block_size"), f"{eng}block_size")
    seqs = _arg(_need(config, f"{eng}max_num_seqs"), f"{eng}max_num_seqs")
    fraction = _need(config, f"{eng}gpu_memory_utilization")
    _arg(fraction, f"{eng}gpu_memory_utilization")
    caching = _need(config, f"{eng}enable_prefix_caching")
    if not isinstance(caching, bool):
        raise InputError(f"{eng}enable_prefix_caching", f"must be true or false, got {caching!r}")
    args = ["--model-path", model, "--served-model-name", model,
            "--tensor-parallel-size", str(tp * adp),
            "--pipeline-parallel-size", _arg(_count(config, f"{par}pp"), f"{par}pp"),
            "--expert-parallel-size", str(moe_ep),
            "--enable-attention-dp" if adp > 1 else "--no-enable-attention-dp",
            "--max-num-tokens", _arg(_need(config, f"{eng}max_num_batched_tokens"), f"{eng}max_num_batched_tokens"),
            "--max-batch-size", seqs, "--kv-block-size", block,
            "--free-gpu-memory-fraction", _arg(fraction, f"{eng}gpu_memory_utilization")]
    if config.get("context_length") is not None:
        args += ["--max-seq-len", _arg(config["context_length"], "context_length")]
    if role is not None:
        args += ["--disaggregation-mode", role]
    if config.get("router_mode") == "kv_router" and role != "decode":
        args.append("--publish-events-and-metrics")
    engine: dict[str, Any] = {
        "kv_cache_config": {"tokens_per_block": int(block), "enable_block_reuse": caching,
                            "free_gpu_memory_fraction": float(fraction)},
        "enable_chunked_prefill": True, "trust_remote_code": True,
        "cuda_graph_config": {"max_batch_size": int(seqs)},
    }
    if moe_tp > 1:
        engine["moe_tensor_parallel_size"] = moe_tp
    if config.get("aic_nextn"):  # MTP: the model's next-n prediction layers draft
        engine["speculative_config"] = {"decoding_type": "MTP",
                                        "num_nextn_predict_layers": _count(config, "aic_nextn")}
    if role is not None:
        engine["cache_transceiver_config"] = {"backend": "DEFAULT"}
        engine["disable_overlap_scheduler"] = role == "prefill"
    return args + ["--override-engine-args", json.dumps(engine, sort_keys=True, separators=(",", ":"))]


def _sglang_worker_args(config: Mapping[str, Any], par: str, eng: str, role: str | None) -> list[str]:
    """An SGLang worker (``python3 -m dynamo.sglang``): SGLang's own flags (docs/dgd.md, "SGLang
    workers"). The prefill budgets are the ones the replay simulated (SGLang's defaults; its
    scheduler does not read max_num_batched_tokens); per-rank limits become the worker totals
    SGLang divides over its attention-data ranks."""
    model = str(_need(config, "model_name"))
    tp, adp = _count(config, f"{par}tp"), _count(config, f"{par}attention_dp")
    moe_tp, moe_ep = _count(config, f"{par}moe_tp"), _count(config, f"{par}moe_ep")
    if adp > 1 and moe_ep == 1:
        raise NotSupportedError(f"{par}attention_dp", f"attention_dp {adp} on a dense model is not expressible in "
                                                      "SGLang (its DP attention serves MoE models); use tp instead")
    if moe_ep > 1 and moe_tp * moe_ep != tp * adp:
        raise NotSupportedError(f"{par}moe_ep", f"moe_tp {moe_tp} x moe_ep {moe_ep} must span the worker's "
                                                f"{tp * adp} GPUs in SGLang (it has no MoE tensor-parallel flag)")
    if moe_ep == 1 and moe_tp not in (1, tp * adp):
        raise NotSupportedError(f"{par}moe_tp", f"moe_tp {moe_tp} is not expressible in SGLang: without expert "
                                                f"parallelism the experts split over all {tp * adp} ranks")
    from aisim.simulator.config.models import SGLangScheduler

    knobs = SGLangScheduler()
    seqs = _count(config, f"{eng}max_num_seqs")
    block = _count(config, f"{eng}block_size")
    if knobs.chunked_prefill_size % block:
        raise NotSupportedError(f"{eng}block_size", f"SGLang needs chunked_prefill_size {knobs.chunked_prefill_size} "
                                                    f"divisible by the page size {block}")
    args = ["--model-path", model, "--served-model-name", model, "--tp-size", str(tp * adp),
            "--pp-size", _arg(_count(config, f"{par}pp"), f"{par}pp")]
    if adp > 1:
        args += ["--dp-size", str(adp), "--enable-dp-attention"]
    if moe_ep > 1:
        args += ["--ep-size", str(moe_ep)]
    args += ["--page-size", str(block),
             "--mem-fraction-static", _arg(_need(config, f"{eng}gpu_memory_utilization"), f"{eng}gpu_memory_utilization"),
             "--max-running-requests", str(seqs * adp),
             "--chunked-prefill-size", str(knobs.chunked_prefill_size),
             "--max-prefill-tokens", str(knobs.max_prefill_tokens)]
    caching = _need(config, f"{eng}enable_prefix_caching")
    if not isinstance(caching, bool):
        raise InputError(f"{eng}enable_prefix_caching", f"must be true or false, got {caching!r}")
    if not caching:
        args.append("--disable-radix-cache")
    if config.get("context_length") is not None:
        args += ["--context-length", _arg(config["context_length"], "context_length")]
    args += ["--trust-remote-code", "--skip-tokenizer-init"]
    if config.get("router_mode") == "kv_router" and role != "decode":
        args += ["--kv-events-config", json.dumps({"publisher": "zmq", "topic": "kv-events",
                                                   "endpoint": "tcp://*:5557"}, separators=(",", ":"))]
    if role is not None:
        args += ["--disaggregation-mode", role, "--disaggregation-transfer-backend", "nixl",
                 "--disaggregation-bootstrap-port", "12345", "--host", "0.0.0.0"]
    return args


def _worker_args(config: Mapping[str, Any], par: str, eng: str, role_flag: str | None) -> list[str]:
    args = ["--model", str(_need(config, "model_name")),
            "--tensor-parallel-size", _arg(_count(config, f"{par}tp"), f"{par}tp"),
            "--pipeline-parallel-size", _arg(_count(config, f"{par}pp"), f"{par}pp")]
    adp = _count(config, f"{par}attention_dp")
    if adp > 1:
        args += ["--data-parallel-size", _arg(adp, f"{par}attention_dp")]
    args += _expert_args(config, par)
    for knob, flag in (("max_num_batched_tokens", "--max-num-batched-tokens"), ("max_num_seqs", "--max-num-seqs"),
                       ("block_size", "--block-size"), ("gpu_memory_utilization", "--gpu-memory-utilization")):
        args += [flag, _arg(_need(config, f"{eng}{knob}"), f"{eng}{knob}")]
    caching = _need(config, f"{eng}enable_prefix_caching")
    if not isinstance(caching, bool):
        raise InputError(f"{eng}enable_prefix_caching", f"must be true or false, got {caching!r}")
    args.append("--enable-prefix-caching" if caching else "--no-enable-prefix-caching")
    if config.get("context_length") is not None:
        args += ["--max-model-len", _arg(config["context_length"], "context_length")]
    if config.get("aic_nextn"):  # MTP: the model's next-n prediction layers draft
        args += ["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens":
                                                     _count(config, "aic_nextn")}, separators=(",", ":"))]
    if role_flag is not None:
        args.append(role_flag)
    return args


def _placement(gpus: int, per_node: int | None) -> tuple[int | None, int]:
    """(nodeCount or None, GPUs per pod) of a worker of ``gpus`` GPUs."""
    if per_node is None or gpus <= per_node:
        return None, gpus
    nodes = math.ceil(gpus / per_node)
    if gpus % nodes:
        raise InputError("dgd.num_gpus_per_node", f"a {gpus}-GPU worker needs {nodes} nodes of at most {per_node} "
                                                  f"GPUs, but {gpus} GPUs do not split evenly over {nodes} nodes; "
                                                  "use a node size that divides the worker")
    return nodes, gpus // nodes


def _service_head(name: str, component_type: str, sub: str | None, replicas: int,
                  override: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"dynamoNamespace": name, "componentType": component_type}
    if sub is not None:
        out["subComponentType"] = sub
    out["replicas"] = replicas
    if override is not None:
        out["runtimeVersionOverride"] = override
    return out


def _frontend(config: Mapping[str, Any], name: str, image: str, override: str | None) -> dict[str, Any]:
    mode = _need(config, "router_mode")
    if mode == "round_robin":
        args = ["--router-mode", "round-robin"]
    elif mode == "kv_router":
        args = ["--router-mode", "kv"]
        for key, flag in (("overlap_score_credit", "--router-kv-overlap-score-credit"),
                          ("prefill_load_scale", "--router-prefill-load-scale"),
                          ("router_temperature", "--router-temperature")):
            args += [flag, _arg(_need(config, key), key)]
        for key, flag in (("host_cache_hit_weight", "--router-host-cache-hit-weight"),
                          ("disk_cache_hit_weight", "--router-disk-cache-hit-weight")):
            if key in config:
                args += [flag, _arg(config[key], key)]
    else:
        raise InputError("router_mode", f"must be round_robin or kv_router, got {mode!r}")
    service = _service_head(name, "frontend", None, 1, override)
    service["extraPodSpec"] = {"mainContainer": {"image": image, "command": ["python3", "-m", "dynamo.frontend"],
                                                 "args": args}}
    return service


def _worker(config: Mapping[str, Any], name: str, image: str, override: str | None, per_node: int | None,
            sub: str | None, par: str, eng: str, role: str | None) -> dict[str, Any]:
    backend = config["backend"]
    service = _service_head(name, "worker", sub, _count(config, f"{par}replicas"), override)
    nodes, per_pod = _placement(_gpus_per_worker(config, par), per_node)
    if nodes is not None:
        service["multinode"] = {"nodeCount": nodes}
    service["resources"] = {"limits": {"gpu": str(per_pod)}}
    if backend == "trtllm":
        args = _trtllm_worker_args(config, par, eng, role)
    elif backend == "sglang":
        args = _sglang_worker_args(config, par, eng, role)
    else:
        args = _worker_args(config, par, eng, _VLLM_ROLE_FLAGS.get(role) if role else None)
    g2 = config.get("num_g2_blocks")
    if g2 and role != "decode":  # KVBM's host tier on aggregated and prefill workers (decode takes transferred KV)
        args += ["--connector", "kvbm"]
        service["envs"] = [{"name": "DYN_KVBM_CPU_CACHE_OVERRIDE_NUM_BLOCKS", "value": _arg(g2, "num_g2_blocks")}]
    service["extraPodSpec"] = {"mainContainer": {
        "image": image, "workingDir": WORKER_WORKDIRS[backend], "command": ["python3", "-m", f"dynamo.{backend}"],
        "args": args}}
    return service


def _planner_config(config: Mapping[str, Any], mode: str, planner_target: str | None,
                    sla: Mapping[str, Any] | None) -> dict[str, Any]:
    throughput = bool(_need(config, "enable_throughput_scaling"))
    load = bool(_need(config, "enable_load_scaling"))
    if planner_target is not None and planner_target not in PLANNER_TARGETS:
        raise InputError("planner_target", f"must be one of {', '.join(PLANNER_TARGETS)}, got {planner_target!r}")
    target = planner_target if planner_target is not None else ("sla" if throughput else None)
    if throughput and target != "sla":
        raise InputError("enable_throughput_scaling", f"throughput scaling needs the Planner target sla, got "
                                                      f"{target}: the search keeps those policies for goodput "
                                                      "targets only")
    out: dict[str, Any] = {"environment": "kubernetes", "backend": _need(config, "backend"), "mode": mode}
    if target is not None:
        out["optimization_target"] = target
    if target == "sla" and sla is not None:
        for key in ("ttft_ms", "itl_ms"):
            if sla.get(key) is not None:
                out[key] = sla[key]
    out["enable_throughput_scaling"] = throughput
    out["enable_load_scaling"] = load
    out.update({key: config[key] for key in PLANNER_FIELDS if key in config})
    out["max_gpu_budget"] = _need(config, "gpu_budget")
    for key in ("min_gpu_budget", "min_endpoint"):
        if config.get(key) is not None:
            out[key] = config[key]
    out["model_name"] = _need(config, "model_name")
    if mode == "disagg":
        out["prefill_engine_num_gpu"] = _gpus_per_worker(config, "prefill_")
        out["decode_engine_num_gpu"] = _gpus_per_worker(config, "decode_")
    else:
        out["decode_engine_num_gpu"] = _gpus_per_worker(config, "")
    return out


def _planner(config: Mapping[str, Any], mode: str, name: str, image: str, override: str | None,
             planner_target: str | None, sla: Mapping[str, Any] | None) -> dict[str, Any]:
    planner_config = _planner_config(config, mode, planner_target, sla)
    service = _service_head(name, "planner", None, 1, override)
    service["extraPodSpec"] = {"mainContainer": {
        "image": image, "command": ["python3", "-m", "dynamo.planner"],
        "args": ["--config", json.dumps(planner_config, separators=(",", ":"), allow_nan=False)]}}
    return service


# -- public API ---------------------------------------------------------------------------------
def render_manifest(config: Mapping[str, Any], dgd: Dgd | Mapping[str, Any], index: int | None = None, *,
                    planner_target: str | None = None, sla: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One DGD (a plain dict) for the candidate's flat ``config``; ``index`` fills ``{index}`` in
    the name (Pareto front members). ``planner_target`` / ``sla`` (``ttft_ms``, ``itl_ms``) feed
    the Planner's ``optimization_target`` and SLA (module docstring)."""
    if not isinstance(config, Mapping):
        raise InputError("config", f"must be the candidate's flat config mapping, not {type(config).__name__}")
    dgd = _dgd(dgd)
    _check_renderer(dgd)
    override = _version_override(dgd)
    name = _name(dgd, index)
    mode = _need(config, "deployment_mode")
    if mode not in ("agg", "disagg"):
        raise InputError("deployment_mode", f"must be agg or disagg, got {mode!r}")
    _check_supported(config)
    backend = config["backend"]
    image = _image(dgd, backend)

    services: dict[str, Any] = {"Frontend": _frontend(config, name, image, override)}
    for service, sub, par, eng, role in _WORKERS[backend][mode]:
        services[service] = _worker(config, name, image, override, dgd.num_gpus_per_node, sub, par, eng, role)
    if _need(config, "enable_throughput_scaling") or _need(config, "enable_load_scaling"):
        services["Planner"] = _planner(config, mode, name, image, override, planner_target, sla)

    metadata: dict[str, Any] = {"name": name}
    if dgd.namespace is not None:
        metadata["namespace"] = dgd.namespace
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": {"services": services}}


def manifest_yaml(manifest: Mapping[str, Any]) -> str:
    """The manifest as YAML, keys in the rendered order."""
    return yaml.safe_dump(manifest, sort_keys=False)


def _feasible(candidate: Mapping[str, Any]) -> bool:
    return candidate.get("status") == "feasible" and candidate.get("score") is not None


def _render_record(candidate: Mapping[str, Any], dgd: Dgd, index: int | None) -> dict[str, Any]:
    """The candidate record's manifest, its Planner target and SLA taken from its prediction config."""
    prediction = candidate.get("prediction_config") or {}
    planner = prediction.get("planner") or {}
    evaluation = prediction.get("evaluation") or {}
    target = planner.get("target") if planner.get("policy") == "enabled" else None
    return render_manifest(candidate.get("config") or {}, dgd, index, planner_target=target,
                           sla=evaluation.get("sla"))


def _kustomization(resources: Sequence[str]) -> str:
    return manifest_yaml({"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                          "resources": list(resources)})


def _write(path: Path, text: str, written: list[Path]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)
    written.append(path)


def write_dgd(output_dir: Path, candidates: Sequence[Mapping[str, Any]], dgd: Dgd | Mapping[str, Any], target: str,
              pareto_ids: Sequence[str]) -> list[Path]:
    """Render and write the deployment output (module docstring): the winner for a scalar
    ``target``, every ``pareto_ids`` member for ``pareto``. ``candidates``: ledger records in rank
    order. Returns the written paths (manifests first, then the index / kustomization)."""
    dgd = _dgd(dgd)
    _check_renderer(dgd)
    output_dir = Path(output_dir)
    pareto = target == "pareto"
    if pareto and "{index}" not in dgd.name:
        raise InputError("dgd.name", "target pareto renders every front member: put {index} in the name "
                                     "(e.g. spica-{index}, rendered 000, 001, ...)")
    if not pareto and "{index}" in dgd.name:
        raise InputError("dgd.name", f"target {target} renders one winner: remove {{index}} from the name")
    written: list[Path] = []

    if not pareto:
        winner = next((c for c in candidates if _feasible(c)), None)
        if winner is None:
            return written
        manifest = _render_record(winner, dgd, None)
        if dgd.output_dir is not None:
            directory = output_dir / dgd.output_dir
            file_name = f"{manifest['metadata']['name']}.yaml"
            _write(directory / file_name, manifest_yaml(manifest), written)
            _write(directory / KUSTOMIZATION_FILE, _kustomization([file_name]), written)
        else:
            _write(output_dir / (dgd.output_file or DEFAULT_OUTPUT_FILE), manifest_yaml(manifest), written)
        return written

    by_id = {c.get("candidate_id"): c for c in candidates}
    members = []
    for candidate_id in pareto_ids:
        candidate = by_id.get(candidate_id)
        if candidate is None or not _feasible(candidate):
            raise InputError("pareto_ids", f"{candidate_id!r} is not a feasible candidate of the ledger; pass "
                                           "the ids of views.pareto_front")
        members.append(candidate)
    if dgd.output_dir is not None:
        directory = output_dir / dgd.output_dir
        template = None
    else:
        template = Path(dgd.output_file or DEFAULT_OUTPUT_FILE)
        directory = (output_dir / template).parent
    index: dict[str, Any] = {}
    for i, candidate in enumerate(members):
        manifest = _render_record(candidate, dgd, i)
        name = manifest["metadata"]["name"]
        file_name = f"{name}.yaml" if template is None else f"{template.stem}-{i:03d}{template.suffix}"
        _write(directory / file_name, manifest_yaml(manifest), written)
        index[f"{i:03d}"] = {"candidate_id": candidate["candidate_id"], "name": name, "file": file_name,
                             "score": candidate.get("score")}
    if template is None:
        _write(directory / KUSTOMIZATION_FILE, _kustomization([entry["file"] for entry in index.values()]), written)
    _write(directory / INDEX_FILE, canonical_json(index) + "\n", written)
    return written
