#!/usr/bin/env python
"""Benchmark: the actor runtimes, in process vs Ray, for router_sync_ms windows 0, 10 and 100.

Scenario (issue 6): 64 aggregated workers (Llama-3.1-8B on H200, polynomial timing, block 64,
29,249 blocks), KV router, >= 100k synthetic requests written as a mooncake trace: Poisson
arrivals, prompts of a shared system prefix (one of 32 groups) plus private blocks, outputs
of 64-256 tokens. The KV router reads worker state, so the window decides how often the
coordinator must synchronise the workers (exact lockstep: at every arrival).

Each run replays the same trace; the report gives wall time, edges, calls and messages per
call, and how TTFT, ITL and prefix reuse move with the window. Ray is started once (its
start-up time is reported apart); ``local`` runs the coordinator over one in-process engine
host called directly. The local runs go first, before Ray's daemons start.

    python scripts/bench_actors.py                         # the issue's six runs
    python scripts/bench_actors.py --requests 20000 --backends local --json
    python scripts/bench_actors.py --windows 10 100 --engine-actors 2 --ray-address 127.0.0.1:6379  # a cluster

On Ray the driver steps a share of the workers itself while the actors step theirs
(``execution.driver_hosts_workers``; ``--no-driver-share``: the actors hold them all). Each run
also prints how long the driver worked on its own (coordinator, router, the wire) and how long
each engine host worked, the driver's share first: the terms of the cost model in BENCHMARKS.md
("Ray at scale").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from _bench import offline_home

ROOT = Path(__file__).resolve().parents[1]

CONFIG = """
traffic:
  source: {{type: trace, format: mooncake, paths: [{trace}], block_size: 512}}
  load: {{type: trace_timestamps}}
engine:
  mode: aggregated
  model: meta-llama/Llama-3.1-8B-Instruct
  hardware: h200_sxm
  workers:
    aggregated:
      parallelism: {{replicas: {workers}}}
      scheduler: {{max_batched_tokens: 8192, max_sequences: 256}}
      kv_cache: {{block_size: 64, capacity: {{type: fixed, blocks: 29249}}}}
      timing: {{type: polynomial}}
router: {{policy: kv_router}}
execution: {{seed: 7}}
"""


def write_trace(path: Path, n: int, rate: float, seed: int = 7) -> None:
    """Poisson arrivals; each prompt = a group's system prefix (2-6 blocks of 512) + 1-4 private blocks."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1000.0 / rate, n))
    groups = rng.integers(0, 32, n)
    prefix = rng.integers(2, 7, 32)
    private = rng.integers(1, 5, n)
    out_len = rng.integers(64, 257, n)
    next_id = 32 * 8
    with path.open("w") as fh:
        for i in range(n):
            g = int(groups[i])
            ids = [g * 8 + k for k in range(int(prefix[g]))] + list(range(next_id, next_id + int(private[i])))
            next_id += int(private[i])
            inp = len(ids) * 512 - int(rng.integers(0, 512))
            fh.write(json.dumps({"timestamp": int(t[i]), "input_length": inp, "output_length": int(out_len[i]),
                                 "hash_ids": ids}) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--rate", type=float, default=400.0, help="arrivals per second (default: %(default)s)")
    ap.add_argument("--windows", type=float, nargs="+", default=[0.0, 10.0, 100.0], help="router_sync_ms values")
    ap.add_argument("--backends", nargs="+", default=["local", "ray"], choices=("local", "ray"))
    ap.add_argument("--engine-actors", type=int, default=None, help="Ray actors holding the workers (default: one per CPU, less one "
                    "for the driver's share)")
    ap.add_argument("--no-driver-share", action="store_true",
                    help="Ray: the actors hold every worker (execution.driver_hosts_workers: false)")
    ap.add_argument("--ray-address", default=None,
                    help="join this Ray cluster (HOST:PORT) instead of starting a local Ray")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = ap.parse_args()

    home = offline_home()
    from aisim import ExecutionPlan, plan_from_config, run_plan
    from aisim.simulator.config.loading import load_config

    trace = home / "synthetic.jsonl"
    write_trace(trace, args.requests, args.rate)
    config = home / "bench.yaml"
    config.write_text(CONFIG.format(trace=json.dumps(str(trace)), workers=args.workers))
    cfg, cdir = load_config(config)
    plan = plan_from_config(cfg, cdir)

    ray_start_s = None
    rows = []
    for backend in args.backends:
        if backend == "ray" and ray_start_s is None:  # started only now: its daemons would slow the local runs
            import ray

            t0 = time.perf_counter()
            if args.ray_address:
                ray.init(address=args.ray_address, log_to_driver=False, configure_logging=False)
            else:
                ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
                         configure_logging=False)
            ray_start_s = time.perf_counter() - t0
        for w in args.windows:
            ex = ExecutionPlan(backend=backend, router_sync_ms=w, engine_actors=args.engine_actors,
                               driver_hosts_workers=not args.no_driver_share)
            t0 = time.perf_counter()
            rep = run_plan(dataclasses.replace(plan, execution=ex))
            wall = time.perf_counter() - t0
            s, rt = rep.summary, rep.diagnostics["runtime"]
            row = {"backend": backend, "router_sync_ms": w, "wall_s": wall,
                   "engine_hosts": rt.get("num_hosts"), "nodes": rt.get("num_nodes"), "edges": rt.get("num_edges"),
                   "calls": rt.get("num_calls"),
                   "messages_per_call": rt.get("messages_per_call"), "requests": s["num_requests"],
                   "mean_ttft_ms": s["mean_ttft_ms"], "p90_ttft_ms": s["p90_ttft_ms"], "mean_itl_ms": s["mean_itl_ms"],
                   "prefix_cache_reused_ratio": s["prefix_cache_reused_ratio"],
                   "simulated_s": s["duration_ms"] / 1000}
            if rt.get("host_busy_s") is not None:  # (Ray: the driver's own seconds, each host's)
                row["host_busy_s"] = rt["host_busy_s"]  # (the driver's share first, when it holds one)
                row["driver_share"] = bool(rt.get("driver_hosts_workers"))
                # the driver's own work: coordinator, router, the wire (not its share of the workers)
                row["driver_busy_s"] = wall - rt["driver_wait_s"] - (rt["host_busy_s"][0] if row["driver_share"] else 0)
            rows.append(row)
            if not args.json:
                calls = f"{row['calls']:,} calls, {row['messages_per_call']:.1f} msg/call, {row['edges']:,} edges"
                print(f"{backend:5} W={w:>5g} ms: {wall:7.2f} s  ({calls})  TTFT mean {row['mean_ttft_ms']:.1f} "
                      f"p90 {row['p90_ttft_ms']:.1f} ms  ITL {row['mean_itl_ms']:.2f} ms  reuse "
                      f"{row['prefix_cache_reused_ratio']:.4f}", flush=True)
                if "host_busy_s" in row:
                    busy = [f"{b:.2f}" for b in row["host_busy_s"]]
                    if row["driver_share"]:
                        busy[0] += " (the driver's share)"
                    print(f"      {row['nodes']} node(s), driver busy {row['driver_busy_s']:.2f} s, hosts busy "
                          f"{', '.join(busy)} s", flush=True)
    if ray_start_s is not None:
        import ray

        ray.shutdown()
    result = {
        "scenario": f"{args.requests:,} synthetic requests at {args.rate:g}/s, {args.workers} aggregated workers, "
                    "kv_router, polynomial timing",
        "machine": f"{platform.machine()} {os.cpu_count()} cpu, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"),
        "ray_start_s": ray_start_s,
        "runs": rows,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    elif ray_start_s is not None:
        print(f"(Ray start-up, once: {ray_start_s:.1f} s; {result['machine']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
