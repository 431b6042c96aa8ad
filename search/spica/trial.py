"""One Spica candidate replayed in a fan-out worker: a concrete ``aisim predict`` config mapping in,
a ``search.trial.TrialResult`` (as a dict) out.

The worker validates the mapping, builds the plan (the KV sizing happens here, so a candidate whose
weights leave no KV cache fails with category ``kv_capacity``) and replays it in process. Nothing
raises: every failure is a ``failed`` result with the error's category and one line.
"""

from __future__ import annotations

import time

from aisim.search.trial import TrialResult, plan_with_overrides, run_trial

__all__ = ["replay_candidate", "CANDIDATE_METRICS"]

# the summary fields a candidate keeps in the ledger (the rest of the summary stays in the replay)
CANDIDATE_METRICS = (
    "num_requests", "completed_requests", "rejected_requests", "incomplete_requests", "duration_ms",
    "output_throughput_tok_s", "request_throughput_rps", "goodput_output_throughput_tok_s",
    "goodput_request_throughput_rps", "goodput_completed_requests", "goodput_output_tokens", "gpu_hours",
    "total_output_tokens", "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "num_ttft_samples",
    "mean_tpot_ms", "num_tpot_samples", "mean_itl_ms", "p90_itl_ms", "p99_itl_ms", "mean_e2e_latency_ms",
    "p90_e2e_latency_ms", "p99_e2e_latency_ms", "num_e2e_latency_samples", "mean_output_token_throughput_per_user",
    "prefix_cache_reused_ratio",
)


def replay_candidate(item: dict) -> dict:
    """``item``: {"prediction_config": mapping, "config_dir": str | None, "extra_metrics": summary fields
    kept besides ``CANDIDATE_METRICS`` (optional), "prune": the pruning spec (optional,
    ``search.spica.pruning.PruneMonitor``)}. Returns ``TrialResult.to_dict()`` whose ``metrics`` hold
    the ``CANDIDATE_METRICS`` the summary has, plus ``pruning`` (the monitor's ``outcome``) when
    the item carries a spec."""
    t0 = time.perf_counter()
    prune = item.get("prune")
    monitor = None
    try:
        plan = plan_with_overrides(item["prediction_config"], {}, item.get("config_dir"),
                                   **({"capture_per_request": True} if prune else {}))
        if prune:
            from aisim.search.spica.pruning import PruneMonitor

            monitor = PruneMonitor(prune, plan.traffic.workload.num_requests)
    except Exception as exc:  # noqa: BLE001 - a trial classifies every failure
        return TrialResult.from_exception(exc, time.perf_counter() - t0).to_dict()
    result = run_trial(plan, **({"monitor": monitor, "request_rows": True} if monitor is not None else {}))
    if result.ok:
        keep = (*CANDIDATE_METRICS, *item.get("extra_metrics", ()), "stopped_early")
        metrics = {k: result.metrics[k] for k in keep if k in result.metrics}
        result = TrialResult("ok", None, None, metrics, result.wall_s)
    out = result.to_dict()
    if monitor is not None and result.ok:
        out["pruning"] = monitor.outcome()
    return out
