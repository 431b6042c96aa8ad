#!/usr/bin/env python
"""Benchmark: this checkout against a baseline commit, side by side in one run.

Machines differ by 2x and more, so speed is stated as a ratio measured here and now: the
baseline commit and this working tree are each installed from their own wheel into a fresh venv
(``scripts/_trees.py``), and each repeat runs the same scenario in a fresh child process on both
(interleaved, so drift in the machine's load hits both alike). The child times the replay
alone (plan built beforehand) with ``time.perf_counter`` around ``run_plan``.

Scenario ``kv_router_64`` (bench_actors.py's): a synthetic Poisson trace, 64 aggregated workers,
KV router, exact lockstep (``router_sync_ms: 0``), in process. (The full-trace scenarios, whole
process, are ``bench_replay.py --compare REV``; both install the two trees the same way.)

    python scripts/bench_compare.py --baseline fad994a --requests 30000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
from pathlib import Path
try:
    from aisim import load_config, plan_from_config, run_plan
except ImportError:  # a tree from before the one aisim namespace
    from simulator.config.loading import load_config
    from simulator.replay import plan_from_config, run_plan
cfg, cdir = load_config(Path(sys.argv[1]))
plan = plan_from_config(cfg, cdir)
t0 = time.perf_counter()
rep = run_plan(plan)
wall = time.perf_counter() - t0
s = rep.summary
print(json.dumps({"replay_s": wall, "mean_ttft_ms": s["mean_ttft_ms"], "mean_itl_ms": s["mean_itl_ms"],
                  "completed": s["completed_requests"]}))
"""


def _run_child(side: tuple[Path, str], config: Path, env: dict) -> dict:
    tree, python = side
    t0 = time.perf_counter()
    p = subprocess.run([python, "-c", CHILD, str(config)], cwd=tree.parent,  # beside the tree: its folders would shadow
                       env={k: v for k, v in env.items() if k != "PYTHONPATH"}, capture_output=True, text=True,
                       timeout=3600)
    if p.returncode != 0:
        sys.exit(f"bench_compare: the child in {tree} failed: {p.stderr.strip().splitlines()[-1:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["process_s"] = time.perf_counter() - t0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="git revision to compare against (e.g. fad994a)")
    ap.add_argument("--scenario", choices=("kv_router_64",), default="kv_router_64")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--requests", type=int, default=30_000, help="kv_router_64: synthetic requests")
    ap.add_argument("--rate", type=float, default=1500.0, help="kv_router_64: arrivals per second")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="aisim-bench-compare-"))
    home = work / "home"
    home.mkdir()
    (home / "ray_bootstrap_config.yaml").write_text("")
    env = dict(os.environ, HOME=str(home), RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1")
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_actors
    from bench_replay import interleaved

    config = work / "bench.yaml"
    trace = work / "synthetic.jsonl"
    bench_actors.write_trace(trace, args.requests, args.rate)
    config.write_text(bench_actors.CONFIG.format(trace=json.dumps(str(trace)), workers=64))
    runs = interleaved(args.baseline, args.repeat, lambda side: _run_child(side, config, env),
                       None if args.json else lambda r: (f"replay {r['replay_s']:.2f} s, process {r['process_s']:.2f} s, "
                                                         f"mean TTFT {r['mean_ttft_ms']:.2f} ms"))
    med = {k: statistics.median(r["replay_s"] for r in v) for k, v in runs.items()}
    medp = {k: statistics.median(r["process_s"] for r in v) for k, v in runs.items()}
    result = {
        "scenario": args.scenario, "baseline": args.baseline, "repeat": args.repeat,
        "machine": f"{platform.machine()} {os.cpu_count()} cpu, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"),
        "median_replay_s": med, "median_process_s": medp,
        "ratio_this_to_baseline": med["this"] / med["baseline"],
        "same_results": all(a["mean_ttft_ms"] == b["mean_ttft_ms"] for a, b in zip(runs["baseline"], runs["this"])),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"median replay: baseline {med['baseline']:.2f} s, this {med['this']:.2f} s "
              f"(ratio {result['ratio_this_to_baseline']:.3f}); same mean TTFT: {result['same_results']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
