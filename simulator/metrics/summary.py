"""The flat ``summary`` map of prediction.json (reference key names and definitions).

Per request: TTFT = first token - arrival; TTST = second token - first token; TPOT (= the
request's ITL) = (last - first) / (output - 1); E2E = last token - arrival. ITL and output
tokens/s per user are pooled over every individual inter-token gap of every request.
Throughputs divide by ``duration_ms`` = the last completed request's terminal time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from aisim.simulator.metrics.collector import STATUS_COMPLETED, STATUS_INCOMPLETE, STATUS_REJECTED, RequestLog
from aisim.simulator.metrics.gap_stats import gap_statistics
from aisim.simulator.metrics.stats import STAT_NAMES, plain_stats

#: fields that depend on the host's wall clock (excluded from determinism checks)
WALL_TIME_FIELDS = ("wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s")


@dataclass
class PoolAccounting:
    role: str  # "prefill" or "decode" (aggregated workers are accounted under decode)
    gpus_per_worker: int
    replicas: int = 0  # a static pool: provisioned for the whole duration
    worker_seconds: float | None = None  # or measured (the integral of provisioned workers)


@dataclass
class RunCounters:
    committed_prefill_tokens: int = 0
    generated_tokens: int = 0
    num_preemptions: int = 0
    num_passes: int = 0
    num_offered: int = 0
    provenance: dict = field(default_factory=dict)


def completed_duration_ms(log: RequestLog) -> float:
    """Terminal time of the last completed request (0 when none completed)."""
    if not len(log):
        return 0.0
    status = log.column("status")
    done = status == STATUS_COMPLETED
    return float(log.column("terminal")[done].max()) if done.any() else 0.0


def _family(out: dict, name: str, stats: dict, unit: str = "_ms") -> None:
    for s in STAT_NAMES:
        out[f"{s}_{name}{unit}"] = stats[s]


def traffic_digest(log: RequestLog) -> str:
    """16 hex digits of sha256 over the offered requests in index order (arrival ms, input tokens,
    requested output tokens): two runs that replayed the same traffic have the same digest."""
    import hashlib

    if not len(log):
        return hashlib.sha256(b"").hexdigest()[:16]
    order = np.argsort(log.column("index"), kind="stable")
    h = hashlib.sha256()
    for name in ("arrival", "input_len", "requested"):  # (float64, int64, int64 bytes)
        h.update(np.ascontiguousarray(log.column(name)[order]).tobytes())
    return h.hexdigest()[:16]


def summarize(
    log: RequestLog,
    gap_sinks: list,
    pools: list[PoolAccounting],
    counters: RunCounters,
    sla=None,
    wall_time_ms: float = 0.0,
    planner_total_ticks: int | None = None,
    kv_tier_reports: list | None = None,
) -> dict:
    # (a column at a time, each let go of once used: a ten-million-request log's columns are 80 MB each)
    status = log.column("status")
    done = status == STATUS_COMPLETED
    completed = int(done.sum())
    num_rejected = int((status == STATUS_REJECTED).sum())
    num_incomplete = int((status == STATUS_INCOMPLETE).sum())
    del status
    duration_ms = float(log.column("terminal")[done].max()) if completed else 0.0
    duration_s = duration_ms / 1000.0
    total_in = int(log.column("input_len")[done].sum())
    reused_in = int(log.column("reused")[done].sum())
    first_reused_in = int(log.column("first_reused")[done].sum())
    out_len = log.column("output_len")
    total_out = int(out_len[done].sum())

    def rate(x: float) -> float | None:
        return x / duration_s if duration_s > 0 else None

    s: dict = {}
    s["num_requests"] = counters.num_offered
    s["completed_requests"] = completed
    s["rejected_requests"] = num_rejected
    s["incomplete_requests"] = num_incomplete
    # why requests were rejected at admission: code -> count, and code -> the detail of its
    # lowest-index request (e.g. "prompt of 41,000 tokens >= context length 40,960"); {} when none
    s["rejection_reasons"] = {k: log.rejection_counts[k] for k in sorted(log.rejection_counts)}
    s["rejection_examples"] = {k: log.rejection_examples[k][1] for k in sorted(log.rejection_examples)}
    s["total_input_tokens"] = total_in
    s["total_output_tokens"] = total_out
    s["duration_ms"] = duration_ms
    s["wall_time_ms"] = wall_time_ms
    s["request_throughput_rps"] = rate(completed)
    s["input_throughput_tok_s"] = rate(total_in)
    s["output_throughput_tok_s"] = rate(total_out)
    s["total_throughput_tok_s"] = rate(total_in + total_out)

    seconds = [(p, p.worker_seconds if p.worker_seconds is not None else p.replicas * duration_s) for p in pools]
    prefill_ws = sum(ws for p, ws in seconds if p.role == "prefill")
    decode_ws = sum(ws for p, ws in seconds if p.role == "decode")
    prefill_g = max((p.gpus_per_worker for p in pools if p.role == "prefill"), default=0)
    decode_g = max((p.gpus_per_worker for p in pools if p.role == "decode"), default=0)
    s["prefill_worker_seconds"] = prefill_ws
    s["decode_worker_seconds"] = decode_ws
    s["prefill_gpus_per_worker"] = prefill_g
    s["decode_gpus_per_worker"] = decode_g
    s["gpu_hours"] = sum(ws * p.gpus_per_worker for p, ws in seconds) / 3600.0

    # per-request latencies (``ok``: the requests within every SLA limit, per request; the
    # percentile rule decides for all of them at once below)
    per_request_sla = sla is not None and sla.is_set and sla.percentile == "mean"
    ok = done.copy() if per_request_sla else None
    # (each metric's statistics taken as soon as it is made, and the metric let go of)
    stats: dict = {}
    num_samples: dict = {}

    def take(name: str, values: np.ndarray) -> None:
        stats[name] = plain_stats(values)
        num_samples[name] = len(values)

    first = log.column("first_token")
    arrival = log.column("arrival")
    t = first - arrival
    take("ttft", t[done & ~np.isnan(first)])
    if per_request_sla and sla.ttft_ms is not None:
        ok &= ~np.isnan(t) & (t <= sla.ttft_ms)
    last = log.column("last_token")
    t = last - arrival
    del arrival
    take("e2e_latency", t[done & ~np.isnan(last)])
    if per_request_sla and sla.e2e_ms is not None:
        ok &= ~np.isnan(t) & (t <= sla.e2e_ms)
    del t
    tpot_mask = done & (out_len >= 2) & ~np.isnan(first)
    tpot = ((last - first)[tpot_mask]) / (out_len[tpot_mask] - 1)
    del last
    take("tpot", tpot)
    if per_request_sla and sla.itl_ms is not None:
        per_req_itl = np.full(len(done), -np.inf)
        per_req_itl[tpot_mask] = tpot
        ok &= per_req_itl <= sla.itl_ms  # a single-token request has no ITL and passes
        del per_req_itl
    del tpot_mask, tpot
    second = log.column("second_token")
    take("ttst", (second - first)[done & (out_len >= 2) & ~np.isnan(second)])
    del second
    activated = log.column("activated")
    handed = done & ~np.isnan(activated) & ~np.isnan(first)
    handoff_ms = float(np.mean(np.sort((first - activated)[handed]))) if handed.any() else None
    del activated, handed, first
    if sla is not None and sla.is_set:
        if not per_request_sla:
            # the deployment meets the SLA when the P-th percentile of every limited metric is within it
            # (DistServe's attainment); its goodput is then every completed request's, else 0
            q = sla.percentile
            name = "median" if q == 50 else f"p{q}"
            met = all(stats[k][name] is not None and stats[k][name] <= limit
                      for limit, k in ((sla.ttft_ms, "ttft"), (sla.itl_ms, "tpot"), (sla.e2e_ms, "e2e_latency"))
                      if limit is not None)
            ok = done.copy() if met else np.zeros(len(done), dtype=bool)
            s["sla_percentile"] = q
            s["sla_met"] = bool(met)
        good = int(ok.sum())
        s["goodput_completed_requests"] = good
        s["goodput_request_throughput_rps"] = rate(good)
        s["goodput_output_tokens"] = int(out_len[ok].sum())
        s["goodput_output_throughput_tok_s"] = rate(int(out_len[ok].sum()))
        del ok
    del out_len

    processed = counters.committed_prefill_tokens + counters.generated_tokens
    wall_s = wall_time_ms / 1000.0
    s["processed_tokens"] = processed
    s["processed_tokens_per_s"] = processed / wall_s if wall_s > 0 else None
    s["processed_output_tokens_per_s"] = counters.generated_tokens / wall_s if wall_s > 0 else None
    s["committed_prefill_tokens"] = counters.committed_prefill_tokens
    s["num_preemptions"] = counters.num_preemptions
    s["prefix_cache_reused_ratio"] = float(reused_in) / total_in if total_in else 0.0
    s["first_admission_prefix_cache_reused_ratio"] = float(first_reused_in) / total_in if total_in else 0.0
    s["kv_eviction_policy"] = "lru"
    if kv_tier_reports:
        from aisim.simulator.metrics.kv_tiers import kv_tier_summary

        host = log.column("host_reused")
        s["kv_tiers"] = kv_tier_summary(kv_tier_reports, first_reused_in, int(host[done].sum()), total_in)
        del host

    s["num_ttft_samples"] = num_samples["ttft"]
    s["num_tpot_samples"] = num_samples["tpot"]
    s["num_e2e_latency_samples"] = num_samples["e2e_latency"]
    _family(s, "ttft", stats["ttft"])
    _family(s, "ttst", stats["ttst"])
    _family(s, "tpot", stats["tpot"])
    itl, per_user, num_itl = gap_statistics(gap_sinks)
    _family(s, "itl", itl)
    _family(s, "output_token_throughput_per_user", per_user, unit="")
    s["num_itl_samples"] = num_itl
    _family(s, "e2e_latency", stats["e2e_latency"])
    if handoff_ms is not None:
        s["mean_handoff_to_first_token_ms"] = handoff_ms
    s["traffic_digest"] = traffic_digest(log)
    s["prediction_provenance"] = counters.provenance
    s["power_w"] = None
    s["power_coverage"] = None
    if planner_total_ticks is not None:
        s["planner_total_ticks"] = planner_total_ticks
    return s
