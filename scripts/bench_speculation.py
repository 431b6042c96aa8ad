#!/usr/bin/env python
"""Benchmark: what speculative decoding costs a replay (issue 35).

The Mooncake conversation trace's first 20 minutes through 2 aggregated vLLM workers of
Llama-3.1-8B-Instruct-FP8 on H200 with measured timing (the side-by-side configuration of
docs/speculative-decoding.md): without speculation, with MTP (nextn 2, 1.4 accepted drafts a
pass) and with n-gram speculation (3 drafts, acceptance rates 0.8 / 0.6 / 0.4). Each replay runs in
this process (``run_plan``: the replay alone), the variants interleaved repeat by repeat so that a
change in the machine's load hits all alike. Prints each variant's median replay time, its ratio to
the replay without speculation (the issue's bound: 1.3x) and the numbers speculation moves.

    python scripts/bench_speculation.py                  # 3 repeats
    python scripts/bench_speculation.py --repeat 5 --json
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

VARIANTS = {
    "none": {},
    "mtp": {"nextn": 2, "nextn_accepted": 1.4},
    "ngram": {"speculation": {"kind": "ngram", "num_speculative_tokens": 3, "acceptance_rates": [0.8, 0.6, 0.4]}},
}


def config(trace: Path, variant: str, minutes: float) -> dict:
    return {"traffic": {"source": {"type": "trace", "format": "mooncake", "paths": [str(trace)], "block_size": 512},
                        "load": {"type": "trace_timestamps"},
                        "stop": {"max_virtual_time_seconds": minutes * 60}},
            "engine": {"mode": "aggregated", "model": "nvidia/Llama-3.1-8B-Instruct-FP8", "hardware": "h200_sxm",
                       "backend": "vllm", **VARIANTS[variant],
                       "workers": {"aggregated": {"parallelism": {"replicas": 2}, "timing": {"type": "default"}}}},
            "evaluation": {"sla": {"ttft_ms": 2000, "itl_ms": 50}}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    offline_home()
    from aisim import plan_from_config, run_plan
    from aisim.simulator.config.loading import validate_config

    plans = {v: plan_from_config(validate_config(config(args.trace, v, args.minutes))) for v in VARIANTS}
    for v in VARIANTS:  # (warm: measured tables loaded, code paths compiled)
        run_plan(plans[v])
    times: dict = {v: [] for v in VARIANTS}
    summaries = {}
    for _ in range(args.repeat):
        for v in VARIANTS:
            t = time.perf_counter()
            rep = run_plan(plans[v])
            times[v].append(time.perf_counter() - t)
            summaries[v] = (rep.summary, rep.diagnostics)
    base = statistics.median(times["none"])
    rows = []
    for v in VARIANTS:
        med = statistics.median(times[v])
        s, diag = summaries[v]
        rows.append({"variant": v, "replay_s": round(med, 3), "vs_none": round(med / base, 2),
                     "passes": diag.get("num_passes"), "mean_ttft_ms": round(s["mean_ttft_ms"], 1),
                     "mean_itl_ms": round(s["mean_itl_ms"], 2), "mean_e2e_ms": round(s["mean_e2e_latency_ms"], 1)})
    if print_head(bench_meta(args.repeat), rows, args.json):
        return 0
    print(f"{'variant':8s} {'replay s':>9s} {'vs none':>8s} {'passes':>8s} {'mean TTFT':>10s} {'mean ITL':>9s} "
          f"{'mean E2E':>9s}")
    for r in rows:
        print(f"{r['variant']:8s} {r['replay_s']:9.3f} {r['vs_none']:7.2f}x {r['passes'] or 0:8d} "
              f"{r['mean_ttft_ms']:10.1f} {r['mean_itl_ms']:9.2f} {r['mean_e2e_ms']:9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
