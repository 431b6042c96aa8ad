#!/usr/bin/env python
"""Benchmark: the Planner in the loop over the full conversation trace (the seed workflow).

Runs configs/planner-aggregated.yaml and planner-disaggregated.yaml (and the aggregated one
without a Planner) in process and prints replay wall time, the Planner's share of it (time in
its ticks: snapshot + decisions), GPU hours, goodput and latency.

    python scripts/bench_planner.py [--trace PATH] [--predictor kalman|constant|arima]
    python scripts/bench_planner.py --workflow fp8   # planner-{aggregated,disaggregated}-fp8.yaml
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from _bench import offline_home  # noqa: E402

home = offline_home()
os.environ.setdefault("AISIM_CACHE_DIR", str(Path(tempfile.gettempdir()) / "aisim-bench-cache"))

from aisim import run_config  # noqa: E402
from aisim.simulator.config.loading import load_config  # noqa: E402

DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--predictor", default=None, help="override planner.load_predictor")
    ap.add_argument("--workflow", choices=("seed", "fp8"), default="seed",
                    help="seed: planner-{aggregated,disaggregated}.yaml; fp8: the -fp8 pair checked against "
                         "the live Planner")
    args = ap.parse_args()
    suffix = "" if args.workflow == "seed" else "-fp8"
    runs = [("aggregated, no Planner", f"planner-aggregated{suffix}.yaml", ["planner={policy: disabled}"]),
            ("aggregated + Planner", f"planner-aggregated{suffix}.yaml", []),
            ("disaggregated + Planner", f"planner-disaggregated{suffix}.yaml", [])]
    # build the measured-timing tables once so that no run pays for them
    load_config(ROOT / "configs" / runs[0][1])
    print(f"{'run':26} {'replay s':>9} {'planner s':>10} {'share':>6} {'GPU h':>6} {'goodput/s':>9} "
          f"{'TTFT ms':>8} {'p90 ms':>8} {'ITL ms':>7} {'events':>6}")
    for name, config, sets in runs:
        sets = [f"traffic.source.paths=[{args.trace.resolve()}]", *sets]
        if args.predictor and "disabled" not in " ".join(sets):
            sets.append(f"planner.load_predictor={args.predictor}")
        cfg, cdir = load_config(ROOT / "configs" / config, sets)
        run_config(cfg, cdir) if name.startswith("aggregated, no") else None  # warm caches once
        t0 = time.perf_counter()
        rep = run_config(cfg, cdir)
        wall = time.perf_counter() - t0
        s = rep.summary
        pw = rep.diagnostics.get("planner_wall_s") or 0.0
        events = len(rep.planner["scaling_events"]) if rep.planner else 0
        print(f"{name:26} {wall:9.2f} {pw:10.2f} {pw / wall:6.1%} {s['gpu_hours']:6.2f} "
              f"{s['goodput_request_throughput_rps']:9.3f} {s['mean_ttft_ms']:8.0f} {s['p90_ttft_ms']:8.0f} "
              f"{s['mean_itl_ms']:7.2f} {events:6d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
