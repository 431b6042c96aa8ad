#!/usr/bin/env python
"""Benchmark: the capacity-search example (configs/capacity-search.yaml), no cache.

Prints the whole search's wall time and trials/s with its two jobs in parallel (2 lanes), the
same jobs run one after another (1 lane), and, for one trial, the replay alone (run_plan, with
the per-request and timeline capture the SLA needs) vs the whole trial in a worker's shoes (config
materialisation + replay + formatting the two CSVs and prediction.json): the per-trial overhead as
a share of the replay (worker processes start once per lane, so no process or import cost per
trial). A fully cached rerun is timed too. ``--early`` compares early decisions (the default)
with full replays (``search.early_decisions: false``), interleaved: the wall time of the whole
search and the requests its trials replayed to their end (completed or rejected), and checks
that both find the same answers.

``--compare REV``: this tree against commit REV, each installed from its wheel in a fresh venv,
the whole ``aisim capacity`` process interleaved (no cache), with the answers compared.

    python scripts/bench_capacity.py [--config PATH] [--repeats 3] [--early] [--compare REV]
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
    ap.add_argument("--early", action="store_true", help="early decisions vs full replays, side by side")
    ap.add_argument("--compare", metavar="REV", help="this tree against commit REV, whole process, interleaved")
    args = ap.parse_args()
    if args.compare:
        return compare_commit(args.config, args.compare, args.repeats)
    if args.early:
        return compare_early(args.config, args.repeats)
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


def _replayed(out: Path) -> int:
    import json

    total = 0
    for p in out.glob("jobs/*/runs/*/prediction.json"):  # requests that ended before the trial did
        s = json.loads(p.read_text())["summary"]
        total += s["completed_requests"] + s.get("rejected_requests", 0)
    return total


def compare_early(config: Path, repeats: int) -> int:
    import json

    walls: dict[str, list[float]] = {"early": [], "full": []}
    replayed, answers = {}, {}
    for _ in range(repeats):
        for mode in ("early", "full"):  # interleaved: the machine's drift hits both
            with tempfile.TemporaryDirectory() as tmp:
                sets = [f"search.early_decisions={'true' if mode == 'early' else 'false'}"]
                t = time.perf_counter()
                r = run_capacity_search(config, Path(tmp) / "o", use_cache=False, max_parallel=2, overrides=sets)
                walls[mode].append(time.perf_counter() - t)
                replayed[mode] = _replayed(Path(tmp) / "o")
                answers[mode] = json.dumps([(j.job_name, j.max_qps_under_sla, [(t["qps"], t["passed"])
                                                                               for t in j.search_trace])
                                            for j in r.jobs])
    e, f = statistics.median(walls["early"]), statistics.median(walls["full"])
    print(f"config {config.name}, {os.cpu_count()} CPUs, median of {repeats}, 2 lanes, no cache")
    print(f"full replays: {f:.2f} s, {replayed['full']} requests replayed")
    print(f"early decisions: {e:.2f} s, {replayed['early']} requests replayed")
    print(f"-> wall {f / e:.2f}x, requests {replayed['full'] / max(1, replayed['early']):.2f}x fewer; "
          f"same answers: {answers['early'] == answers['full']}")
    return 0 if answers["early"] == answers["full"] else 1


def compare_commit(config: Path, rev: str, repeats: int) -> int:
    from bench_replay import compare_command

    config = config.resolve()  # (each side runs in its own directory)
    return compare_command(
        rev, repeats, lambda out: ["capacity", "-c", str(config), "--output-dir", out, "--no-cache", "--format", "json"],
        "capacity_search_results.json",
        lambda doc: [(j["job_name"], j["max_qps_under_sla"], [(t["qps"], t["passed"]) for t in j["search_trace"]])
                     for j in doc["jobs"]], home, f"config {config.name}, no cache")


if __name__ == "__main__":
    sys.exit(main())
