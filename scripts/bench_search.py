#!/usr/bin/env python
"""Benchmark: a Spica random search vs its trials replayed one by one.

Runs a ``--trials``-trial random search (``configs/spica-agg-vs-disagg.yaml`` by default, a
synthetic workload) with ``--parallelism`` workers (default: the CPU count), then replays every
candidate of its ledger alone in this process, and prints the search's whole wall time, trials/s,
the mean replay time of one trial alone and the ratio wall / (trials x single-replay time): 1/N
is perfect use of N CPUs with no per-trial start-up. Target: <= 0.65 on 2 CPUs, <= 0.35 on 4.

``--compare REV``: the whole ``aisim recommend`` process of this tree against commit REV (each
installed from its wheel in a fresh venv), interleaved, ``--repeats`` times, with the rankings
compared (the config's own optimizer settings; ``--trials`` and ``--parallelism`` not applied).

    python scripts/bench_search.py [--config PATH] [--trials 32] [--parallelism N] [--backend local|ray]
    python scripts/bench_search.py --compare REV [--config PATH] [--repeats 5]
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

from aisim.search.spica.loop import run_search  # noqa: E402
from aisim.search.trial import plan_with_overrides, run_trial  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "spica-agg-vs-disagg.yaml")
    ap.add_argument("--trials", type=int, default=32)
    ap.add_argument("--parallelism", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--backend", choices=("local", "ray"), default="local")
    ap.add_argument("--compare", metavar="REV", help="this tree against commit REV, whole process, interleaved")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if args.compare:
        return compare_commit(args.config, args.compare, args.repeats)
    with tempfile.TemporaryDirectory(prefix="aisim-bench-search-") as out:
        t0 = time.perf_counter()
        result = run_search(args.config, out, backend=args.backend, parallelism=args.parallelism,
                            overrides=["optimizer.algorithm=random", f"optimizer.max_trials={args.trials}"])
        wall = time.perf_counter() - t0
    cands = [c for c in result.recommendation["candidates"] if c.get("prediction_config")]
    singles = []
    for c in cands:  # each trial alone, in this process (imports and tables already loaded)
        t = time.perf_counter()
        run_trial(plan_with_overrides(c["prediction_config"], {}, args.config.parent))
        singles.append(time.perf_counter() - t)
    n = result.counts["evaluated"]
    mean = statistics.mean(singles) if singles else float("nan")
    print(f"config {args.config.name}, backend {args.backend}, parallelism {args.parallelism}, {os.cpu_count()} CPUs")
    print(f"search: {n} trials in {wall:.2f} s whole ({n / wall:.2f} trials/s), counts {result.counts}")
    print(f"one trial alone: mean {mean:.3f} s (median {statistics.median(singles):.3f} s over {len(singles)})")
    print(f"ratio wall / (trials x single-replay time): {wall / (n * mean):.2f} "
          f"(1/{args.parallelism} = {1 / args.parallelism:.2f} would be perfect)")
    return 0


def compare_commit(config: Path, rev: str, repeats: int) -> int:
    from bench_replay import compare_command

    config = config.resolve()  # (each side runs in its own directory)
    return compare_command(
        rev, repeats, lambda out: ["recommend", "-c", str(config), "--output-dir", out], "recommendation.json",
        lambda doc: [(c.get("candidate_id"), c.get("status"), c.get("score")) for c in doc["candidates"]], home,
        f"config {config.name}")


if __name__ == "__main__":
    sys.exit(main())
