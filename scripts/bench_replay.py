#!/usr/bin/env python
"""Benchmark: the full Mooncake conversation trace through `aisim predict`, whole process.

Scenario (issue 2): 12,031 requests over 1 h, aggregated, 2 workers, polynomial timing,
block 64, fixed capacity 29,249 blocks per worker, round robin. Each repeat runs
`python -m aisim predict` in a fresh child process, so the wall time includes interpreter
start, imports, trace loading, the replay and the report, and the peak RSS is the child's.

    python scripts/bench_replay.py                       # 3 repeats, prints a summary line per run
    python scripts/bench_replay.py --trace PATH --repeat 5 --json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"

CONFIG = """
traffic:
  source: {{type: trace, format: mooncake, paths: [{trace}], block_size: 512}}
  load: {{type: trace_timestamps}}
engine:
  mode: {mode}
  model: meta-llama/Llama-3.1-8B-Instruct
  hardware: h200_sxm
{transfer}  workers:
{workers}
router: {{policy: {router}}}
"""

ROLE = """    {role}:
      parallelism: {{replicas: {replicas}}}
      scheduler: {{max_batched_tokens: 8192, max_sequences: {seqs}}}
      kv_cache: {{block_size: 64, capacity: {{type: fixed, blocks: {blocks}}}}}
      timing: {{type: {timing}}}
"""


def render_config(args) -> str:
    common = dict(blocks=args.blocks, timing=args.timing)
    if args.disaggregated:
        p, d = args.disaggregated
        workers = ROLE.format(role="prefill", replicas=p, seqs=1, **common) + ROLE.format(
            role="decode", replicas=d, seqs=256, **common)
        transfer = f"  kv_transfer: {{bandwidth_gb_per_second: {args.transfer_gb_s}}}\n"
        mode = "disaggregated"
    else:
        workers = ROLE.format(role="aggregated", replicas=args.workers, seqs=256, **common)
        transfer, mode = "", "aggregated"
    return CONFIG.format(trace=json.dumps(str(args.trace.resolve())), mode=mode, transfer=transfer,
                         workers=workers.rstrip("\n"), router=args.router)


def run_once(config: Path, env: dict) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "aisim", "predict", "-c", str(config), "--format", "json"],
                       capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"aisim predict failed ({p.returncode}): {p.stderr.strip()}")
    summary = json.loads(p.stdout)
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"wall_s": wall, "peak_rss_mb": max(peak_kb, before) / 1024, "summary": summary}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="conversation_trace.jsonl (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=29249, help="KV blocks per worker (default: %(default)s)")
    ap.add_argument("--timing", default="polynomial", choices=("polynomial", "default", "roofline"),
                    help="default = measured kernel data; its first run builds the timing tables (cold), "
                         "later runs load them from the cache (warm)")
    ap.add_argument("--router", default="round_robin", choices=("round_robin", "random", "kv_router"))
    ap.add_argument("--disaggregated", nargs=2, type=int, metavar=("PREFILL", "DECODE"),
                    help="disaggregated with this many prefill and decode workers (instead of --workers)")
    ap.add_argument("--transfer-gb-s", type=float, default=50.0, help="KV transfer bandwidth, disaggregated (GB/s)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = ap.parse_args()
    if not args.trace.is_file():
        raise SystemExit(f"trace not found: {args.trace} (pass --trace)")

    home = Path(tempfile.mkdtemp(prefix="aisim-bench-home-"))
    (home / "ray_bootstrap_config.yaml").write_text("")
    env = dict(os.environ, HOME=str(home), RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    config = home / "bench.yaml"
    config.write_text(render_config(args))

    runs = []
    for i in range(args.repeat):
        # RUSAGE_CHILDREN's max RSS is a running max over children: run each repeat in its own
        # grandchild-free process and report the max, which is what we want for a peak anyway.
        r = run_once(config, env)
        runs.append(r)
        s = r["summary"]
        if not args.json:
            print(f"run {i + 1}: wall {r['wall_s']:.2f} s  {s['num_requests'] / r['wall_s']:,.0f} requests/s  "
                  f"peak RSS {r['peak_rss_mb']:.0f} MB  (replay {s['wall_time_ms'] / 1000:.2f} s)")
    walls = [r["wall_s"] for r in runs]
    warm = walls[1:] if args.timing == "default" and len(walls) > 1 else walls
    s = runs[0]["summary"]
    result = {
        "scenario": (f"conversation trace, {'%dP%dD disaggregated' % tuple(args.disaggregated) if args.disaggregated else '%d aggregated workers' % args.workers}, "
                     f"{args.timing}, block 64, {args.blocks} blocks/worker, {args.router}"),
        "machine": f"{platform.machine()} {os.cpu_count()} cpu, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"),
        "requests": s["num_requests"],
        "wall_s_min": min(walls),
        "wall_s_median": statistics.median(warm),
        "wall_s_first_run": walls[0],
        "requests_per_s": s["num_requests"] / statistics.median(warm),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
        "replay_wall_s_median": statistics.median(r["summary"]["wall_time_ms"] for r in runs) / 1000,
        "mean_ttft_ms": s["mean_ttft_ms"],
        "mean_itl_ms": s["mean_itl_ms"],
        "prefix_cache_reused_ratio": s["prefix_cache_reused_ratio"],
        "gpu_hours": s["gpu_hours"],
        "p90_ttft_ms": s["p90_ttft_ms"],
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        cold = f" (first run, building the timing tables: {walls[0]:.2f} s)" if warm is not walls else ""
        print(f"median wall {result['wall_s_median']:.2f} s, {result['requests_per_s']:,.0f} requests/s, "
              f"peak RSS {result['peak_rss_mb']:.0f} MB ({result['machine']}){cold}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
