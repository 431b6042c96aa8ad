#!/usr/bin/env python
"""Benchmark: what the terminal progress display costs a replay.

The same plan replayed in one process, alternating without and with the progress display
(``aisim.progress.Progress`` drawing to a terminal-like stream that discards its output, so the
drawing itself is paid), median of N each; prints the ratio and checks the two summaries agree.

    python scripts/bench_progress.py                      # the full conversation trace, 2 workers
    python scripts/bench_progress.py --config configs/quickstart.yaml --repeat 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from _bench import offline_home

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, help="a predict config (default: bench_replay's full-trace scenario)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    home = offline_home()
    config = args.config
    if config is None:
        import bench_replay

        ns = argparse.Namespace(trace=bench_replay.DEFAULT_TRACE, workers=2, blocks=29249, timing="polynomial",
                                router="round_robin", disaggregated=None, transfer_gb_s=50.0, planner=False)
        if not ns.trace.is_file():
            raise SystemExit(f"trace not found: {ns.trace} (pass --config)")
        config = home / "bench.yaml"
        config.write_text(bench_replay.render_config(ns))

    from rich.console import Console

    import aisim.progress as progress_mod
    from aisim import plan_from_config, run_plan
    from aisim.simulator.config.loading import load_config

    cfg, cdir = load_config(config, [])
    sink = open(os.devnull, "w")
    times = {"without": [], "with": []}
    summaries = {}
    for _ in range(args.repeat):
        for name in ("without", "with"):
            plan = plan_from_config(cfg, cdir)
            t0 = time.perf_counter()
            if name == "with":
                p = progress_mod.Progress(active=True, console=Console(file=sink, force_terminal=True, width=100))
                with p:
                    report = run_plan(plan, on_progress=p.replay)
            else:
                report = run_plan(plan)
            times[name].append(time.perf_counter() - t0)
            summaries[name] = {k: v for k, v in report.summary.items() if "wall" not in k and "per_s" not in k}
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{config.name}: median replay without progress {med['without']:.3f} s, with {med['with']:.3f} s, "
          f"ratio {med['with'] / med['without']:.3f} ({args.repeat} alternating repeats each)")
    same = summaries["with"] == summaries["without"]
    print("summaries: " + ("identical" if same else "DIFFER"))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
