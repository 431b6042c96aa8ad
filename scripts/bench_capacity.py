#!/usr/bin/env python
"""Benchmark: the capacity-search example (configs/capacity-search.yaml), no cache.

Prints the whole search's wall time and trials/s with its two jobs in parallel (2 lanes), the
same jobs run one after another (1 lane), and, for one trial, the replay alone (run_plan, with
the per-request and timeline capture the SLA needs) vs the whole trial in a worker's shoes (config
materialisation + replay + formatting the two CSVs and prediction.json): the per-trial overhead as
a share of the replay (worker processes start once per lane, so no process or import cost per
trial). A fully cached rerun is timed too.

    python scripts/bench_capacity.py [--config PATH] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from _bench import offline_home  # noqa: E402

home = offline_home()

from aisim.search.capacity.config import job_config, load_capacity_config, trial_config  # noqa: E402
from aisim.search.capacity.runner import run_capacity_search, run_capacity_trial  # noqa: E402
from aisim.search.trial import plan_with_overrides  # noqa: E402
from aisim.simulator.run import run_plan  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "capacity-search.yaml")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    walls = {"2 lanes": [], "1 lane": [], "cached": []}
    trials = 0
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            r = run_capacity_search(args.config, Path(tmp) / "a", use_cache=False, max_parallel=2)
            walls["2 lanes"].append(time.perf_counter() - t)
            trials = sum(j.num_trials for j in r.jobs)
            t = time.perf_counter()
            run_capacity_search(args.config, Path(tmp) / "b", use_cache=False, max_parallel=1)
            walls["1 lane"].append(time.perf_counter() - t)
            run_capacity_search(args.config, Path(tmp) / "c", cache_dir=Path(tmp) / "cache", max_parallel=2)
            t = time.perf_counter()
            run_capacity_search(args.config, Path(tmp) / "d", cache_dir=Path(tmp) / "cache", max_parallel=2)
            walls["cached"].append(time.perf_counter() - t)
    cfg, cdir = load_capacity_config(args.config)
    mapping = trial_config(job_config(cfg, cfg.jobs[0]), cfg.jobs[0].start_qps or 4.0, None)
    replay, whole = [], []
    for _ in range(5):  # warm, in this process
        t = time.perf_counter()
        run_plan(plan_with_overrides(mapping, {}, cdir, capture_per_request=True, capture_worker_timeline=True))
        replay.append(time.perf_counter() - t)
        t = time.perf_counter()
        run_capacity_trial({"config": mapping, "config_dir": str(cdir)})
        whole.append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in walls.items()}
    r_med, w_med = statistics.median(replay), statistics.median(whole)
    print(f"config {args.config.name}: {len(cfg.jobs)} jobs, {trials} trials, {os.cpu_count()} CPUs, "
          f"median of {args.repeats}")
    print(f"search, 2 lanes: {med['2 lanes']:.2f} s ({trials / med['2 lanes']:.1f} trials/s)")
    print(f"search, 1 lane (jobs one after another): {med['1 lane']:.2f} s -> 2 lanes take "
          f"{med['2 lanes'] / med['1 lane']:.2f} of it")
    print(f"fully cached rerun: {med['cached']:.2f} s ({med['cached'] / med['2 lanes']:.0%} of the first run)")
    print(f"one trial: replay alone {r_med * 1000:.0f} ms, whole trial {w_med * 1000:.0f} ms -> overhead "
          f"{(w_med - r_med) / r_med:.0%} of the replay")
    return 0


if __name__ == "__main__":
    sys.exit(main())
