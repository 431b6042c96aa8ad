"""``aisim validate -c CONFIG``: validate a predict, recommend (Spica search) or capacity config,
resolve its defaults and report the effective deployment and the traffic, without replaying.

    from aisim.validate import validate_config_file, render
    report = validate_config_file(Path("configs/quickstart.yaml"), ["engine.context_length=2048"])
    print(render(report))           # human-readable; json.dumps(report) is the machine form

The kind of config is told by its top-level keys (after ``--set`` overrides): ``search_space`` ->
``recommend`` (``search.spica.config.load_search_config``); ``benchmark_base`` and ``jobs`` ->
``capacity`` (``search.capacity.config.load_capacity_config``); anything else -> ``predict``
(``simulator.config.loading.load_config`` then ``simulator.plan.plan_from_config``, which sizes the
KV caches and reads the trace). A bad config raises the loaders' one-line ``InputError`` (exit 2).

The predict report's numbers are the ones a run reports:

- ``pools[i]["provenance"]`` holds exactly the keys and values of a run's
  ``summary.prediction_provenance[role]`` (``simulator.run._build_actors``);
- ``deployment`` equals a run's ``summary.deployment`` (the router as it starts);
- ``traffic["rejection_reasons"]`` is what a run's ``summary.rejection_reasons`` will be, by the
  engine's admission rule (``actors.engine.scheduler.RankScheduler._never_fits``), checked in its
  order on the entry pool, then (disaggregated) on the decode pool for the rows the entry admits:
  ``context_length`` when the prompt (input tokens) >= the context length, else ``kv_capacity``
  when ceil(prompt / block_size) > KV blocks per rank, else ``max_batched_tokens`` when chunked
  prefill is off and the prompt > max batched tokens. A row whose prompt fits but whose
  input + output exceeds the context length is not rejected: its generation stops at the context
  length (``truncated_by_context``). ``kv_overflow_rows``: admitted rows whose prompt + output (cut
  at the context length) needs more KV blocks than one rank of the decoding pool holds; they
  cannot finish, the replay stalls and later rows end incomplete rather than rejected, so a run
  then rejects fewer rows than ``rejected_rows`` (the count is exact when this is 0). Counts cover every row of the workload; a
  ``traffic.stop.max_virtual_time_seconds`` may end a replay before every row is offered.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from aisim.simulator.errors import InputError

__all__ = ["validate_config_file", "render", "detect_kind"]

# how each capacity policy schedules (docs/schedulers.md)
SCHEDULER_LABELS = {"vllm": "vllm (admit by current blocks; recompute preemption)",
                    "guaranteed_no_evict": "trtllm GUARANTEED_NO_EVICT (reserve prompt + max output; no preemption)"}


def scheduler_label(sched) -> str:
    """How a pool's scheduler works, with its settings (``SchedulerConfig``)."""
    k = sched.sglang
    if k is None:
        return SCHEDULER_LABELS[sched.capacity_policy]
    return (f"sglang ({k.schedule_policy}; prefill passes of {k.chunked_prefill_size:,}-token chunks, max prefill "
            f"{k.max_prefill_tokens:,} tokens (max_batched_tokens sizes KV only); admit by new_token_ratio x "
            f"outputs clipped at {k.clip_max_new_tokens:,}, conservativeness {k.schedule_conservativeness:g}; "
            f"prefill_decode_interval {k.prefill_decode_interval}; retraction)")


# -- entry point -------------------------------------------------------------------------------
def detect_kind(data: dict) -> str:
    """``recommend``, ``capacity`` or ``predict`` from a config mapping's top-level keys."""
    if "search_space" in data or "optimization" in data or "optimizer" in data:
        return "recommend"  # the seed's search_space form, or the reference's (search.spica.reference_form)
    if "benchmark_base" in data and "jobs" in data:
        return "capacity"
    return "predict"


def validate_config_file(path: Path, overrides: list[str] | None = None) -> dict:
    """Validate the config at ``path`` (``overrides``: ``--set PATH=YAML`` strings), resolve its
    defaults and return a JSON-able report ``{"kind": "predict"|"recommend"|"capacity", ...}``.
    Raises ``InputError`` (one line) for a bad config; nothing is replayed or written."""
    from aisim.simulator.config.loading import apply_overrides, read_yaml_mapping

    path = Path(path)
    overrides = list(overrides or [])
    data = read_yaml_mapping(path)
    if not isinstance(data, dict):
        raise InputError(str(path), "a config is a mapping of sections")
    kind = detect_kind(apply_overrides(data, overrides))
    if kind == "recommend":
        return _recommend_report(path, overrides)
    if kind == "capacity":
        if overrides:
            raise InputError("--set", "capacity configs take no --set overrides (aisim capacity has none); "
                                      "edit the file or a job's benchmark_overrides")
        return _capacity_report(path)
    from aisim.simulator.config.loading import load_config

    cfg, config_dir = load_config(path, overrides)
    return {"kind": "predict", "config": str(path), **predict_summary(cfg, config_dir)}


# -- predict -----------------------------------------------------------------------------------
def predict_summary(cfg, config_dir: Path | None) -> dict:
    """The effective deployment and traffic statistics of a validated predict config."""
    from aisim.simulator.plan import plan_from_config

    return plan_summary(plan_from_config(cfg, config_dir))


def plan_summary(plan) -> dict:
    """What a ``ReplayPlan`` will run: pools (with the run's provenance), deployment, traffic."""
    from aisim.simulator.builders import build_decode_router, build_router, build_timing
    from aisim.simulator.run import deployment_summary, pool_provenance

    pools = []
    for pool in plan.pools:
        sched = pool.scheduler
        timing = build_timing(pool, f"engine.workers.{pool.role}.timing")
        provenance = pool_provenance(pool, timing)  # what the run reports in prediction_provenance[role]
        pools.append({
            "role": pool.role,
            "replicas": pool.replicas,
            "gpus_per_worker": pool.gpus_per_worker,
            "gpus": pool.replicas * pool.gpus_per_worker,
            "planner_gpus_per_replica": pool.shape.planner_gpus_per_replica,
            "kv_blocks_per_rank": sched.num_gpu_blocks,
            "block_size": sched.block_size,
            "context_length": sched.context_length,
            "max_batched_tokens": sched.max_batched_tokens,
            "max_sequences": sched.max_sequences,
            "scheduler": scheduler_label(sched),
            "prefix_caching": sched.enable_prefix_caching,
            "timing_estimator": provenance.get("estimator"),
            "timing_source": provenance.get("timing_source"),
            "model_source": provenance["model_source"],
            "provenance": provenance,
        })
    entry, decode = plan.pools[0], (plan.pools[1] if len(plan.pools) > 1 else None)
    entry_router = build_router(plan.router, entry, plan.seed)
    decode_router = build_decode_router(decode.route_block_size, plan.seed) if decode else None
    deployment = deployment_summary(plan, entry_router.describe(),  # what the run reports
                                    decode_router.describe() if decode_router else None)
    planner = None
    if plan.planner is not None:
        planner = {"enabled": True, "retune": plan.planner.retune is not None}
    return {
        "pools": pools,
        "deployment": deployment,
        "planner": planner or {"enabled": False, "retune": False},
        "sla": plan.sla.model_dump(exclude_none=True) if plan.sla is not None else None,
        "execution_backend": plan.execution.backend,
        "traffic": traffic_summary(plan),
    }


def _never_fits(prompt: np.ndarray, sched) -> np.ndarray:
    """Per row the engine's admission rejection code ('' when admitted) on a pool whose ranks run
    the ``SchedulerConfig`` ``sched``."""
    from aisim.actors.engine.request import REJECT_BATCH_TOKENS, REJECT_CONTEXT_LENGTH, REJECT_KV_CAPACITY

    limit = sched.context_length if sched.context_length is not None else 1 << 62
    blocks = -(-prompt // sched.block_size)
    return np.select(
        [prompt >= limit, blocks > sched.num_gpu_blocks,
         np.full(prompt.shape, not sched.enable_chunked_prefill) & (prompt > sched.max_batched_tokens)],
        [REJECT_CONTEXT_LENGTH, REJECT_KV_CAPACITY, REJECT_BATCH_TOKENS], default="")


def traffic_summary(plan) -> dict:
    """Rows, token totals, span and the rows the engine will reject (see the module docs)."""
    t = plan.traffic
    w = t.workload
    prompt = np.asarray(w.input_len, dtype=np.int64)
    output = np.asarray(w.output_len, dtype=np.int64)
    codes = _never_fits(prompt, plan.pools[0].scheduler)
    if len(plan.pools) > 1:
        later = _never_fits(prompt, plan.pools[1].scheduler)
        codes = np.where(codes == "", later, codes)
    reasons = {str(k): int(n) for k, n in zip(*np.unique(codes[codes != ""], return_counts=True))}
    context = plan.pools[0].scheduler.context_length
    truncated = 0
    if context is not None:
        truncated = int(((codes == "") & (prompt + output > context)).sum())
    # rows admitted whose whole sequence (prompt + output, cut at the context length) needs more KV
    # blocks than one rank of the pool that decodes holds: they preempt themselves and never finish
    # (the replay stalls; they end incomplete and hold up the rows queued behind them)
    last = plan.pools[-1].scheduler
    full = prompt + output if last.context_length is None else np.minimum(prompt + output, last.context_length)
    overflow = int(((codes == "") & (-(-full // last.block_size) > last.num_gpu_blocks)).sum())
    ts = np.asarray(w.timestamp_ms, dtype=np.float64)
    finite = ts[np.isfinite(ts)]
    arrivals = getattr(t.arrivals, "_initial_times", None)
    arrival_span = None
    if arrivals is not None and len(arrivals) and not t.arrivals.follows_terminal:
        arrival_span = float(arrivals.max() - arrivals.min()) / 1000.0
    return {
        "description": t.description,
        "unit": t.unit,
        "rows": int(w.num_requests),
        "total_input_tokens": int(prompt.sum()),
        "total_output_tokens": int(output.sum()),
        "max_input_tokens": int(prompt.max()) if len(prompt) else 0,
        "max_input_plus_output_tokens": int((prompt + output).max()) if len(prompt) else 0,
        "context_length": context,
        "rejected_rows": int(sum(reasons.values())),
        "rejection_reasons": dict(sorted(reasons.items())),
        "rejected_context_length": reasons.get("context_length", 0),
        "truncated_by_context": truncated,
        "kv_overflow_rows": overflow,
        "trace_span_seconds": float(finite.max() - finite.min()) / 1000.0 if len(finite) else None,
        "arrival_span_seconds": arrival_span,
        "stop_seconds": t.stop_ms / 1000.0 if t.stop_ms is not None else None,
    }


# -- recommend (Spica) ---------------------------------------------------------------------------
def _recommend_report(path: Path, overrides: list[str]) -> dict:
    from aisim.search.spica import load_search_config, plan_branches
    from aisim.search.spica.domains import Range, has_range
    from aisim.search.spica.reference_form import is_reference_form
    from aisim.simulator.config.loading import apply_overrides, read_yaml_mapping

    cfg, config_dir = load_search_config(path, overrides)
    form = "reference" if is_reference_form(apply_overrides(read_yaml_mapping(path, "search config"), overrides)) \
        else "search_space"
    space = cfg.search_space
    ratio = cfg.kv_load_ratio_range
    branches = []
    for b in plan_branches(cfg):
        knobs = {k: ("continuous" if isinstance(v, Range) else len(v)) for k, v in b.choices.items()}
        continuous = ratio is not None or has_range(b.choices)
        branches.append({
            "mode": b.mode,
            "worker_shapes": len(b.shapes),
            "knob_choices": knobs,
            "searched_knobs": sorted(k for k, n in knobs.items() if n == "continuous" or n > 1),
            "kv_load_ratio": list(ratio) if ratio is not None else None,
            "grid_size": b.grid_size(ratio is not None),
            "continuous": continuous,
            "skipped": b.skipped,
        })
    workload = (cfg.workload.model_dump(exclude_none=True) if cfg.workload is not None
                else {"traffic": cfg.traffic.model_dump(exclude_none=True, mode="json")} if cfg.traffic is not None
                else None)
    return {
        "kind": "recommend",
        "config": str(path),
        "form": form,  # the seed's search_space form, or the reference's recommend form (lowered to it)
        "model": cfg.model_name,
        "hardware": cfg.hardware_sku,
        "gpu_budget": space.gpu_budget,
        "timing": cfg.engine.timing.model_dump(exclude_none=True, mode="json"),
        "branches": branches,
        "target": cfg.optimization.target,
        "planner_target": cfg.planner_target,
        "sampler": cfg.optimizer.algorithm,
        "max_trials": cfg.optimizer.max_trials,
        "seed": cfg.optimizer.seed,
        "pruner": cfg.optimizer.pruner or "none",
        "parallelism": cfg.optimizer.parallelism,
        "candidate_timeout_seconds": cfg.optimizer.candidate_timeout_seconds,
        "study": cfg.study.name,
        "workload": workload,
        "sla": cfg.evaluation.sla.model_dump(exclude_none=True) if cfg.evaluation.sla is not None else None,
    }


# -- capacity ------------------------------------------------------------------------------------
def _capacity_report(path: Path) -> dict:
    from aisim.search.capacity.config import job_config, job_qps_list, load_capacity_config
    from aisim.simulator.config.loading import validate_config

    cfg, config_dir = load_capacity_config(path)
    jobs = []
    for job in cfg.jobs:
        qps = job_qps_list(cfg, job)
        jobs.append({"name": job.name, "mode": "adaptive" if qps is None else "linear",
                     "start_qps": job.start_qps, "qps_list": qps,
                     "overrides": sorted(job.benchmark_overrides)})
    first = cfg.jobs[0]
    try:
        base = predict_summary(validate_config(job_config(cfg, first)), config_dir)
    except InputError as exc:
        raise type(exc)(f"jobs.0.{exc.where}", exc.message, category=exc.category) from None
    s = cfg.search
    return {
        "kind": "capacity",
        "config": str(path),
        "jobs": jobs,
        "sla": [r.model_dump() for r in cfg.sla],
        "search": {"max_iterations": s.max_iterations, "min_search_granularity_pct": s.min_search_granularity_pct,
                   "max_qps_cap": s.max_qps_cap},
        "benchmark_timeout_seconds": cfg.benchmark_timeout_s,
        "first_job": first.name,
        # the first job's merged predict config as written (each trial replaces traffic.load by its QPS)
        "base": base,
    }


# -- rendering ------------------------------------------------------------------------------------
def _n(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.6g}"
    return str(v)


def _tier_text(t: dict, blocks_key: str, unit: str, links: tuple[str, str], names: str) -> str:
    """A KV tier's settings (``prediction_provenance[role]["host_offload"]`` or ``["g3_offload"]``) in a line."""
    shared = t["scope"] == "cluster_shared"
    out, into = (f"{links[0]}_bandwidth_gbps", f"{links[1]}_bandwidth_gbps")
    text = (f"{_n(t[blocks_key])} blocks {'in one pool' if shared else 'per ' + unit} ({t['scope']}) of "
            f"{t['block_bytes'] / 1e6:,.1f} MB; links {names} {_n(t[out])} / {_n(t[into])} GB/s per {unit}")
    if shared:
        text += f", {_n(t['shared_' + out])} / {_n(t['shared_' + into])} GB/s shared"
    return text + f"; first byte {_n(t['latency_to_first_byte_ms'])} ms"


def _render_predict(r: dict, indent: str = "") -> list[str]:
    d = r["deployment"]
    lines = [f"{indent}deployment: {d['mode']}, {_n(d['gpus'])} GPUs, seed {d['seed']}"]
    for p in r["pools"]:
        pv = p["provenance"]
        lines.append(
            f"{indent}  {p['role']}: {p['replicas']} x {p['gpus_per_worker']} GPU = {p['gpus']} GPUs; "
            f"KV {_n(p['kv_blocks_per_rank'])} blocks/rank x {p['block_size']} tokens "
            f"({pv['kv_sizing']['type'] if pv.get('kv_sizing') else '-'}); context {_n(p['context_length'])}; "
            f"batch {_n(p['max_batched_tokens'])} tokens / {_n(p['max_sequences'])} seqs")
        lines.append(f"{indent}    scheduler {p['scheduler']}; prefix caching {'on' if p['prefix_caching'] else 'off'}")
        lines.append(f"{indent}    timing {p['timing_estimator']} (source {p['timing_source']}); "
                     f"model {pv['model']} ({p['model_source']}) on {pv['hardware']}, backend {pv['backend']}")
        if pv.get("host_offload"):
            lines.append(f"{indent}    host tier (G2): " + _tier_text(pv["host_offload"], "num_host_blocks", "rank",
                                                                     ("d2h", "h2d"), "G1->G2 / G2->G1"))
        if pv.get("g3_offload"):
            lines.append(f"{indent}    disk tier (G3): " + _tier_text(pv["g3_offload"], "num_g3_blocks", "worker",
                                                                     ("write", "read"), "write / read"))
        if p["planner_gpus_per_replica"] != p["gpus_per_worker"]:
            lines.append(f"{indent}    the Planner counts {p['planner_gpus_per_replica']} GPUs per replica "
                         "(tensor x attention_data, the seed's rule; docs/architecture.md)")
    router = dict(d["router"] or {})
    policy = router.pop("policy", "-")
    knobs = ", ".join(f"{k}={v}" for k, v in router.items())
    lines.append(f"{indent}router: {policy}{f' ({knobs})' if knobs else ''}"
                 + (f"; decode router {d['decode_router']['policy']}" if d["decode_router"] else ""))
    if d["kv_transfer"]:
        kt = d["kv_transfer"]
        lines.append(f"{indent}kv transfer: {kt['bandwidth_gb_per_second']} GB/s, {_n(kt['bytes_per_token'])} B/token")
    pl = r["planner"]
    lines.append(f"{indent}planner: {'on' if pl['enabled'] else 'off'}{' (retune)' if pl['retune'] else ''}")
    if r.get("sla"):
        lines.append(f"{indent}sla: " + ", ".join(f"{k}={v}" for k, v in r["sla"].items()))
    t = r["traffic"]
    lines.append(f"{indent}traffic: {t['description']}")
    lines.append(f"{indent}  rows {_n(t['rows'])}; input tokens {_n(t['total_input_tokens'])}; "
                 f"output tokens {_n(t['total_output_tokens'])}; max input {_n(t['max_input_tokens'])}")
    span = t["trace_span_seconds"] if t["trace_span_seconds"] is not None else t["arrival_span_seconds"]
    lines.append(f"{indent}  span {_n(span)} s" + (f"; stop at {_n(t['stop_seconds'])} s" if t["stop_seconds"] else ""))
    why = ", ".join(f"{k} {_n(v)}" for k, v in t["rejection_reasons"].items())
    lines.append(f"{indent}  rejected at admission: {_n(t['rejected_rows'])}{f' ({why})' if why else ''}; "
                 f"generation cut at context {_n(t['context_length'])}: {_n(t['truncated_by_context'])}")
    if t["kv_overflow_rows"]:
        lines.append(f"{indent}  WARNING: {_n(t['kv_overflow_rows'])} rows need more KV blocks than one rank holds "
                     "(prompt + output): they cannot finish and the replay may stall")
    return lines


def render(report: dict) -> str:
    """The report as human-readable lines (no trailing newline)."""
    kind = report["kind"]
    lines = [f"{report.get('config', '')}: valid {kind} config"]
    if kind == "predict":
        lines += _render_predict(report)
    elif kind == "recommend":
        if report.get("form") == "reference":
            lines.append("written in the reference's recommend form (aisim recommend --print-search-space shows "
                         "its search_space form)")
        lines.append(f"model {report['model']} on {report['hardware']}; GPU budget {report['gpu_budget']}; "
                     f"timing {report['timing'].get('type', '-')}")
        lines.append(f"target {report['target']} (planner target {report['planner_target']}); sampler "
                     f"{report['sampler']}, max_trials {report['max_trials']}, seed {report['seed']}, pruner "
                     f"{report['pruner']}")
        for b in report["branches"]:
            if b["skipped"]:
                lines.append(f"  branch {b['mode']}: skipped ({b['skipped']})")
                continue
            cont = [k for k, n in b["knob_choices"].items() if n == "continuous"]
            cont += ["kv_load_ratio"] if b["kv_load_ratio"] is not None else []
            grid = f"continuous ({', '.join(cont)} searched)" if b["continuous"] else f"{_n(b['grid_size'])} points"
            searched = ", ".join(b["searched_knobs"]) or "none"
            lines.append(f"  branch {b['mode']}: {b['worker_shapes']} worker shapes; grid {grid}; "
                         f"searched knobs: {searched}")
        if report["workload"] is not None:
            lines.append("workload: " + ", ".join(f"{k}={v}" for k, v in report["workload"].items()))
    else:
        for j in report["jobs"]:
            qps = f"start_qps {_n(j['start_qps'])}" if j["mode"] == "adaptive" else f"qps_list {j['qps_list']}"
            lines.append(f"  job {j['name']}: {j['mode']}, {qps}"
                         + (f"; overrides {', '.join(j['overrides'])}" if j["overrides"] else ""))
        for rule in report["sla"]:
            lines.append(f"  sla: p{rule['quantile'] * 100:g} {rule['metric']} {rule['op']} {rule['threshold']}")
        s = report["search"]
        lines.append(f"search: max_iterations {s['max_iterations']}, granularity {s['min_search_granularity_pct']}%, "
                     f"max_qps_cap {_n(s['max_qps_cap'])}; trial timeout {_n(report['benchmark_timeout_seconds'])} s")
        lines.append(f"first job {report['first_job']} (traffic.load is replaced by each trial's QPS):")
        lines += _render_predict(report["base"], "  ")
    return "\n".join(lines)
