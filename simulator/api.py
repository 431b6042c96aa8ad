"""Public Python API: replay a trace (or synthetic traffic) and get a ``ReplayReport``.

    from aisim.simulator.api import run_trace_replay
    report = run_trace_replay("trace.jsonl", extra_engine_args={"num_gpu_blocks": 29249}, num_workers=2)
    report.summary["mean_ttft_ms"]; report.to_dict()  # == prediction.json

``run_config`` runs a validated ``predict`` config (what ``aisim predict`` runs). The trace and
synthetic functions build the same plan a config builds: their traffic arguments become a
``traffic`` section (``simulator.traffic.build``), their router and execution arguments the
``router`` and ``execution`` sections, and their engine arguments (``extra_engine_args``: the
reference's names, with its defaults: polynomial timing, 16,384 blocks) the ``engine`` section
(``simulator.config.engine_args.engine_section``), lowered by the same ``pool_plan`` a config's is.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from aisim.simulator.config import models as m
from aisim.simulator.config.engine_args import EngineArgs, engine_section
from aisim.simulator.config.loading import format_validation_error
from aisim.simulator.config.planner_config import api_name, parse_planner_config, planner_section
from aisim.simulator.config.rules import check_engine, check_retune_api_arguments
from aisim.simulator.errors import InputError, NotSupportedError
from aisim.simulator.plan import ReplayPlan, execution_plan, lower_engine, plan_from_config, retune_router, router_spec
from aisim.simulator.planning import lower_planner
from aisim.simulator.run import ReplayReport, run_plan
from aisim.simulator.traffic.build import TrafficPlan, build_traffic
from aisim.simulator.traffic.history import check_history
from aisim.simulator.traffic.traces import resolve_trace_paths

__all__ = ["run_config", "run_trace_replay", "run_synthetic_trace_replay"]


def run_config(cfg: m.PredictConfig, config_dir: Path | None = None, capture_per_request: bool = False,
               fast_forward: bool = True, resource_guard=None) -> ReplayReport:
    return run_plan(plan_from_config(cfg, config_dir, capture_per_request, fast_forward), resource_guard)


# -- programmatic entry points ----------------------------------------------------------
def _engine_args(raw: dict | EngineArgs | None, name: str = "extra_engine_args") -> EngineArgs:
    if isinstance(raw, EngineArgs):
        return raw
    try:
        return EngineArgs.model_validate(raw or {})
    except ValidationError as exc:
        err = format_validation_error(exc)
        raise InputError(f"{name}.{err.where}", err.message, category=err.category) from None


def _engine(roles: dict) -> m.Engine:
    """The ``engine`` section of the API's pools, validated as a config's is."""
    try:
        return m.Engine.model_validate(engine_section(roles))
    except ValidationError as exc:
        err = format_validation_error(exc)
        names = " / ".join(name for _, _, name in roles.values())
        raise InputError(f"{names} (engine.{err.where})", err.message, category=err.category) from None


def _sla(ttft, itl, e2e) -> m.Sla | None:
    if ttft is None and itl is None and e2e is None:
        return None
    try:
        return m.Sla(ttft_ms=ttft, itl_ms=itl, e2e_ms=e2e)
    except ValidationError as exc:
        err = format_validation_error(exc)
        raise InputError(f"sla_{err.where}", err.message, category=err.category) from None


def _router_spec(router_mode: str, router_config: dict | None):
    cfg = dict(router_config or {})
    if "router_temperature" in cfg:
        cfg["temperature"] = cfg.pop("router_temperature")
    unknown = set(cfg) - {"overlap_score_credit", "prefill_load_scale", "temperature"}
    if unknown:
        raise InputError(f"router_config.{sorted(unknown)[0]}", "unknown router knob; use overlap_score_credit, "
                                                               "prefill_load_scale or temperature")
    try:
        r = m.Router(policy=router_mode, **cfg)
    except ValidationError as exc:
        err = format_validation_error(exc)
        raise InputError(f"router_config.{err.where}" if err.where != "policy" else "router_mode", err.message,
                         category=err.category) from None
    return router_spec(r)


def _execution(backend: str, router_sync_ms: float, ray_address: str | None, engine_actors: int | None):
    try:
        x = m.Execution(backend=backend, router_sync_ms=router_sync_ms, ray_address=ray_address,
                        engine_actors="auto" if engine_actors is None else engine_actors)
    except ValidationError as exc:
        err = format_validation_error(exc)
        raise InputError(err.where or "backend", err.message, category=err.category) from None
    return execution_plan(x)


# the keyword arguments both replay functions share (everything but their traffic)
_DEPLOYMENT_ARGS = ("extra_engine_args", "prefill_engine_args", "decode_engine_args", "num_workers",
                    "num_prefill_workers", "num_decode_workers", "router_mode", "router_config", "planner_config",
                    "sla_ttft_ms", "sla_itl_ms", "sla_e2e_ms", "capture_per_request", "capture_planner_details",
                    "fast_forward", "seed", "backend", "router_sync_ms", "ray_address", "engine_actors",
                    "planner_report_dir")


def _api_plan(traffic: TrafficPlan, *, extra_engine_args, prefill_engine_args, decode_engine_args, num_workers: int,
              num_prefill_workers: int, num_decode_workers: int, router_mode: str, router_config, planner_config,
              sla_ttft_ms, sla_itl_ms, sla_e2e_ms, capture_per_request: bool, capture_planner_details: bool,
              fast_forward: bool, seed: int, backend: str, router_sync_ms: float, ray_address, engine_actors,
              planner_report_dir, trace_format: str | None = None) -> ReplayPlan:
    """The plan the API's arguments describe (the same plan types a config gives); ``trace_format``:
    run_trace_replay's (None: synthetic traffic)."""
    extra_args, prefill_args, decode_args = extra_engine_args, prefill_engine_args, decode_engine_args
    num_prefill, num_decode = num_prefill_workers, num_decode_workers
    execution = _execution(backend, router_sync_ms, ray_address, engine_actors)
    planner = parse_planner_config(planner_config) if planner_config is not None else None
    if planner is not None and planner.retune is not None:
        check_retune_api_arguments(planner.retune, trace_format=trace_format, traffic=traffic, router_mode=router_mode)
    router = _router_spec(router_mode, router_config)
    if prefill_args is not None or decode_args is not None:
        if prefill_args is None or decode_args is None or extra_args is not None:
            raise InputError("prefill_engine_args", "disaggregated replay needs prefill_engine_args and "
                                                    "decode_engine_args (and no extra_engine_args)")
        pa = _engine_args({"worker_type": "prefill", "max_num_seqs": 1, **prefill_args}, "prefill_engine_args")
        da = _engine_args({"worker_type": "decode", **decode_args}, "decode_engine_args")
        for name, n in (("num_prefill_workers", num_prefill), ("num_decode_workers", num_decode)):
            if n < 1:
                raise InputError(name, f"must be >= 1, got {n}")
        roles = {"prefill": (num_prefill, pa, "prefill_engine_args"), "decode": (num_decode, da, "decode_engine_args")}
    else:
        if num_workers < 1:
            raise InputError("num_workers", f"must be >= 1, got {num_workers}")
        args = _engine_args(extra_args)
        if args.worker_type != "aggregated":
            raise InputError("extra_engine_args.worker_type", "must be aggregated; pass prefill_engine_args and "
                                                              "decode_engine_args for a disaggregated replay")
        roles = {"aggregated": (num_workers, args, "extra_engine_args")}
    engine = _engine(roles)
    check_engine(engine)
    pools, transfer = lower_engine(engine)
    sla = _sla(sla_ttft_ms, sla_itl_ms, sla_e2e_ms)
    html = None
    if planner is not None:  # PlannerConfig -> the YAML planner section -> the one lowering
        html = str(planner_report_dir) if planner_report_dir is not None and planner.wants_report_page else None
        planner = lower_planner(planner_section(planner, engine.mode, engine.backend), pools, sla,
                                field="planner_config", name=api_name)
        if planner.retune is not None:
            check_history(planner, traffic.workload, "planner_config")  # the recorded history (throughput scaling)
            router = retune_router(router, planner.retune)
    return ReplayPlan(traffic, pools, router, sla, capture_per_request, fast_forward, transfer, seed, planner,
                      capture_planner_details, html, "planner_config", execution)


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000.0


def _traffic(source: dict, load: dict, stop: dict, names: dict[str, str]) -> TrafficPlan:
    """The API's traffic arguments as a ``traffic`` section, built as a config's is; an invalid
    value is reported under the API argument's name (``names``: section path -> argument)."""
    try:
        section = m.Traffic.model_validate({"source": source, "load": load,
                                            "stop": {k: v for k, v in stop.items() if v is not None}})
    except ValidationError as exc:
        err = format_validation_error(exc)
        where = err.where
        for path in sorted(names, key=len, reverse=True):
            if where == path or where.startswith(path + "."):
                where = names[path]
                break
        else:
            if where.startswith("stop.max_virtual_time_seconds"):
                where = "max_sim_time_ms"
        raise InputError(where, err.message, category=err.category) from None
    return build_traffic(section, None)


def run_trace_replay(
    trace_files,
    *,
    extra_engine_args: dict | EngineArgs | None = None,
    prefill_engine_args: dict | None = None,
    decode_engine_args: dict | None = None,
    num_workers: int = 1,
    num_prefill_workers: int = 1,
    num_decode_workers: int = 1,
    router_mode: str = "round_robin",
    router_config: dict | None = None,
    replay_concurrency: int | None = None,
    arrival_speedup_ratio: float = 1.0,
    trace_format: str = "mooncake",
    trace_block_size: int = 512,
    max_sim_time_ms: float | None = None,
    sla_ttft_ms: float | None = None,
    sla_itl_ms: float | None = None,
    sla_e2e_ms: float | None = None,
    planner_config=None,
    capture_per_request: bool = False,
    capture_planner_details: bool = True,
    fast_forward: bool = True,
    seed: int = 42,
    backend: str = "local",
    router_sync_ms: float = 0.0,
    ray_address: str | None = None,
    engine_actors: int | None = None,
    planner_report_dir: str | Path | None = None,
) -> ReplayReport:
    """Replay a mooncake or dynamo trace through ``num_workers`` aggregated workers, or through
    ``num_prefill_workers`` + ``num_decode_workers`` given ``prefill_engine_args`` and
    ``decode_engine_args`` (KV transfer: ``kv_transfer_bandwidth`` GB/s, ``kv_transfer_bytes_per_token``,
    ``kv_transfer_timing_mode`` in the prefill arguments). ``router_mode``: round_robin, random or
    kv_router with ``router_config`` {overlap_score_credit, prefill_load_scale, temperature}.

    ``replay_concurrency=None`` paces arrivals by the trace timestamps (divided by
    ``arrival_speedup_ratio``); an int runs a closed loop with that many requests in flight.

    ``backend="ray"`` hosts the workers, router and Planner as Ray actors (``ray_address``:
    join a running cluster; ``engine_actors``: how many actors hold the workers);
    ``router_sync_ms`` lets the router see worker state up to that old (0: exact lockstep).

    Nothing is written to disk unless asked: ``planner_report_dir`` writes the Planner's HTML
    diagnostics page there (when the Planner config keeps ``report_interval_hours`` or
    ``live_dashboard_port``) and ``planner["html_report_path"]`` names it.
    """
    paths = [trace_files] if isinstance(trace_files, (str, Path)) else list(trace_files)
    resolved = resolve_trace_paths([str(p) for p in paths], "trace_files")
    if trace_format not in ("mooncake", "dynamo"):
        raise NotSupportedError("trace_format", f"trace format {trace_format!r} is not supported yet; use mooncake or dynamo")
    if replay_concurrency is not None:
        load: dict = {"type": "concurrency", "concurrency": replay_concurrency}
    else:
        load = {"type": "trace_timestamps", "speedup": arrival_speedup_ratio}
    traffic = _traffic({"type": "trace", "paths": [str(p) for p in resolved], "format": trace_format,
                        "block_size": trace_block_size}, load, {"max_virtual_time_seconds": _seconds(max_sim_time_ms)},
                       {"source.block_size": "trace_block_size", "load.concurrency": "replay_concurrency",
                        "load.speedup": "arrival_speedup_ratio"})
    given = locals()
    return run_plan(_api_plan(traffic, trace_format=trace_format, **{k: given[k] for k in _DEPLOYMENT_ARGS}))


def run_synthetic_trace_replay(
    input_tokens: int,
    output_tokens: int,
    request_count: int,
    *,
    extra_engine_args: dict | EngineArgs | None = None,
    prefill_engine_args: dict | None = None,
    decode_engine_args: dict | None = None,
    num_workers: int = 1,
    num_prefill_workers: int = 1,
    num_decode_workers: int = 1,
    router_mode: str = "round_robin",
    router_config: dict | None = None,
    replay_concurrency: int | None = None,
    request_rate: float | None = None,
    arrival_interval_ms: float | None = None,
    arrival_seed: int = 42,
    cached_prefix_tokens: int = 0,
    max_sim_time_ms: float | None = None,
    sla_ttft_ms: float | None = None,
    sla_itl_ms: float | None = None,
    sla_e2e_ms: float | None = None,
    planner_config=None,
    capture_per_request: bool = False,
    capture_planner_details: bool = True,
    fast_forward: bool = True,
    seed: int = 42,
    backend: str = "local",
    router_sync_ms: float = 0.0,
    ray_address: str | None = None,
    engine_actors: int | None = None,
    planner_report_dir: str | Path | None = None,
) -> ReplayReport:
    """Fixed-length synthetic requests: exactly one of ``replay_concurrency`` (closed loop),
    ``request_rate`` (Poisson, first at t = 0, seeded by ``arrival_seed``) or ``arrival_interval_ms``."""
    given = [x is not None for x in (replay_concurrency, request_rate, arrival_interval_ms)]
    if sum(given) != 1:
        raise InputError("replay_concurrency", "give exactly one of replay_concurrency, request_rate or arrival_interval_ms")
    if replay_concurrency is not None:
        load: dict = {"type": "concurrency", "concurrency": replay_concurrency}
    elif request_rate is not None:
        load = {"type": "poisson", "requests_per_second": request_rate, "seed": arrival_seed}
    else:
        if arrival_interval_ms <= 0:
            raise InputError("arrival_interval_ms", f"must be > 0, got {arrival_interval_ms}")
        load = {"type": "constant_rate", "requests_per_second": 1000.0 / arrival_interval_ms}
    traffic = _traffic({"type": "synthetic", "input_tokens": input_tokens, "output_tokens": output_tokens,
                        "cached_prefix_tokens": cached_prefix_tokens}, load,
                       {"requests": request_count, "max_virtual_time_seconds": _seconds(max_sim_time_ms)},
                       {"source.input_tokens": "input_tokens", "source.output_tokens": "output_tokens",
                        "source.cached_prefix_tokens": "cached_prefix_tokens", "source": "cached_prefix_tokens",
                        "stop.requests": "request_count", "load.concurrency": "replay_concurrency",
                        "load.requests_per_second": "request_rate", "load.seed": "arrival_seed"})
    given = locals()
    return run_plan(_api_plan(traffic, **{k: given[k] for k in _DEPLOYMENT_ARGS}))
