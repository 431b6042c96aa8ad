#!/usr/bin/env python
"""Benchmark: what a host (G2) KV tier costs a replay (issue 34).

The full Mooncake conversation trace (12,031 requests, 1 h) through 2 vLLM workers of 8,000 GPU
blocks of 64 tokens (a tight GPU cache), polynomial timing: without a host tier, with 60,000 host
blocks per rank at 32 and at 8 GB/s, and with one 120,000-block pool for the cluster; round robin,
and the KV router without a tier, with one per rank and with the shared pool. Each replay runs in this process (``run_plan``: the
replay alone, no interpreter start or report writing), the variants interleaved repeat by repeat so
that a change in the machine's load hits all alike. Prints each variant's median replay time, its
ratio to the same router without a tier (the issue's bound: 1.5x), the engine passes it simulated
and its time per pass against the no-tier replay's (a tier that serves more reuse makes shorter
prefills, so more and shorter passes over the same hour), and the summary numbers the tier moves.

    python scripts/bench_offload.py                  # 3 repeats
    python scripts/bench_offload.py --repeat 5 --json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import bench_meta, offline_home, print_head  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"

HOST = {
    "none": None,
    "g2": {"num_host_blocks": 60000},
    "g2_8gbps": {"num_host_blocks": 60000, "d2h_bandwidth_gbps": 8, "h2d_bandwidth_gbps": 8},
    "shared": {"scope": "cluster_shared", "num_host_blocks": 120000},
}
VARIANTS = [("none", "round_robin"), ("g2", "round_robin"), ("g2_8gbps", "round_robin"), ("shared", "round_robin"),
            ("none", "kv_router"), ("g2", "kv_router"), ("shared", "kv_router")]


def config(trace: Path, host: str, router: str) -> dict:
    kv = {"block_size": 64, "capacity": {"type": "fixed", "blocks": 8000}}
    if HOST[host] is not None:
        kv["host_offload"] = HOST[host]
    return {"traffic": {"source": {"type": "trace", "format": "mooncake", "paths": [str(trace)], "block_size": 512},
                        "load": {"type": "trace_timestamps"}},
            "engine": {"mode": "aggregated", "model": "nvidia/Llama-3.1-8B-Instruct-FP8", "hardware": "h200_sxm",
                       "backend": "vllm",
                       "workers": {"aggregated": {"parallelism": {"replicas": 2},
                                                  "scheduler": {"max_batched_tokens": 8192, "max_sequences": 256},
                                                  "kv_cache": kv, "timing": {"type": "polynomial"}}}},
            "router": {"policy": router},
            "evaluation": {"sla": {"ttft_ms": 2000, "itl_ms": 50}}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    offline_home()
    from aisim import plan_from_config, run_plan
    from aisim.simulator.config.loading import validate_config

    plans = {v: plan_from_config(validate_config(config(args.trace, *v))) for v in VARIANTS}
    times: dict = {v: [] for v in VARIANTS}
    summaries = {}
    passes = {}
    for _ in range(args.repeat):
        for v in VARIANTS:
            t = time.perf_counter()
            rep = run_plan(plans[v])
            times[v].append(time.perf_counter() - t)
            summaries[v] = rep.summary
            passes[v] = rep.diagnostics["num_passes"]
    rows = []
    for host, router in VARIANTS:
        med = statistics.median(times[(host, router)])
        base = statistics.median(times[("none", router)])
        s = summaries[(host, router)]
        tiers = s.get("kv_tiers")
        n, n0 = passes[(host, router)], passes[("none", router)]
        rows.append({"tier": host, "router": router, "replay_s": round(med, 3), "vs_no_tier": round(med / base, 2),
                     "engine_passes": n, "per_pass_vs_no_tier": round((med / n) / (base / n0), 2),
                     "mean_ttft_ms": round(s["mean_ttft_ms"], 1), "reuse": round(s["prefix_cache_reused_ratio"], 4),
                     "host_reuse": round(tiers["reuse"]["first_admission_host_ratio"], 4) if tiers else 0.0,
                     "onboarded_gb": round(tiers["host"]["onboard"]["bytes"] / 1e9, 1) if tiers else 0.0})
    if print_head(bench_meta(args.repeat), rows, args.json):
        return 0
    print(f"{'tier':10s} {'router':12s} {'replay s':>9s} {'vs none':>8s} {'passes':>8s} {'per pass':>9s} "
          f"{'mean TTFT':>10s} {'reuse':>7s} {'host':>7s} {'onboarded GB':>13s}")
    for r in rows:
        print(f"{r['tier']:10s} {r['router']:12s} {r['replay_s']:9.2f} {r['vs_no_tier']:7.2f}x {r['engine_passes']:8d} "
              f"{r['per_pass_vs_no_tier']:8.2f}x {r['mean_ttft_ms']:10.1f} {r['reuse']:7.4f} {r['host_reuse']:7.4f} "
              f"{r['onboarded_gb']:13.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
