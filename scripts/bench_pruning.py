#!/usr/bin/env python
"""Benchmark: Spica searches with and without a pruner, side by side in one run.

For each config (default: the 64-point grid over the full conversation trace,
``configs/spica-conversation-64.yaml``, and the bundled ``spica-grid-16.yaml`` and
``spica-agg-vs-disagg.yaml``) runs the whole ``aisim recommend`` process without a pruner and with
each of ``--pruners`` (interleaved, ``--repeats`` times), and prints per search: wall time (median),
the requests its candidates replayed to their end (completed or rejected; a pruned candidate's up
to its checkpoint), candidates pruned, and the winner with its score against the unpruned
search's (same candidate, or the score gap in %).

    python scripts/bench_pruning.py [--configs A.yaml B.yaml] [--pruners median successive_halving hyperband]
                                    [--parallelism 2] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from _bench import bench_meta, offline_home  # noqa: E402

home = offline_home()

DEFAULT_CONFIGS = ("spica-conversation-64.yaml", "spica-grid-16.yaml", "spica-agg-vs-disagg.yaml")


def replayed(rec: dict) -> int:
    """Requests the search's candidates replayed to their end (completed or rejected)."""
    total = 0
    for c in rec["candidates"]:
        if c.get("pruned"):
            total += c["pruned"]["ended_requests"]
        elif c.get("metrics"):
            total += c["metrics"]["completed_requests"] + c["metrics"]["rejected_requests"]
    return total


def run_once(config: Path, pruner: str, parallelism: int) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory(prefix="aisim-bench-pruning-") as tmp:
        cmd = [sys.executable, "-m", "aisim", "recommend", "-c", str(config), "--output-dir", tmp,
               "--parallelism", str(parallelism), "--format", "json", "--set", f"optimizer.pruner={pruner}"]
        t = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        wall = time.perf_counter() - t
        if p.returncode != 0:
            raise SystemExit(f"{config.name} pruner {pruner}: exit {p.returncode}: {p.stderr.strip()[-400:]}")
        return wall, json.loads((Path(tmp) / "recommendation.json").read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=[str(ROOT / "configs" / c) for c in DEFAULT_CONFIGS])
    ap.add_argument("--pruners", nargs="+", default=["median", "successive_halving", "hyperband"])
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    meta = bench_meta(args.repeats)
    print(f"{meta['machine']}, {meta['date']}, {os.cpu_count()} CPUs, parallelism {args.parallelism}, "
          f"median of {args.repeats}")
    for cfg in map(Path, args.configs):
        walls: dict[str, list] = {}
        recs: dict[str, dict] = {}
        for _ in range(args.repeats):
            for pruner in ("none", *args.pruners):
                wall, rec = run_once(cfg, pruner, args.parallelism)
                walls.setdefault(pruner, []).append(wall)
                recs[pruner] = rec
        base = recs["none"]
        base_best = _best(base)
        base_wall = statistics.median(walls["none"])
        print(f"\n{cfg.name}: {base['counts']['evaluated']} candidates")
        print("| pruner | wall s | vs none | replayed requests | fewer | pruned | winner | score vs none |")
        print("|---|---|---|---|---|---|---|---|")
        for pruner in ("none", *args.pruners):
            rec = recs[pruner]
            wall = statistics.median(walls[pruner])
            best = _best(rec)
            if best is None or base_best is None:
                same = "no winner"
            elif best["candidate_id"] == base_best["candidate_id"]:
                same = "same"
            else:
                same = f"{100.0 * (best['score'] - base_best['score']) / abs(base_best['score']):+.2f}%"
            print(f"| {pruner} | {wall:.1f} | {base_wall / wall:.2f}x | {replayed(rec):,} | "
                  f"{replayed(base) / max(1, replayed(rec)):.2f}x | {rec['counts'].get('pruned', 0)} | "
                  f"{best['candidate_id'] if best else '-'} | {same} |")
    return 0


def _best(rec: dict) -> dict | None:
    top = rec["views"]["top_n"]
    return next(c for c in rec["candidates"] if c["candidate_id"] == top[0]) if top else None


if __name__ == "__main__":
    sys.exit(main())
