#!/usr/bin/env python
"""Compare prediction.json files side by side (GPU time, goodput, latency, Planner activity).

    python scripts/compare_runs.py out/planner/aggregated out/planner/disaggregated
    python scripts/compare_runs.py out/planner/startup-*        # the startup_seconds sweep

Each argument is an output directory (holding prediction.json) or a prediction.json path.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

COLUMNS = (
    ("GPU h", lambda s, p: s.get("gpu_hours")),
    ("goodput req/s", lambda s, p: s.get("goodput_request_throughput_rps")),
    ("TTFT mean ms", lambda s, p: s.get("mean_ttft_ms")),
    ("TTFT p90 ms", lambda s, p: s.get("p90_ttft_ms")),
    ("ITL mean ms", lambda s, p: s.get("mean_itl_ms")),
    ("scale ups", lambda s, p: sum(e["reason"] == "scale_up" for e in p["scaling_events"]) if p else None),
    ("scale downs", lambda s, p: sum(e["reason"] == "scale_down" for e in p["scaling_events"]) if p else None),
    ("starting", lambda s, p: sum(t["transition"] == "worker_starting" for o in p.get("lifecycle_operations") or []
                                  for t in o["transitions"]) if p else None),
)


def load(arg: str) -> tuple[str, dict]:
    path = Path(arg)
    if path.is_dir():
        path = path / "prediction.json"
    return str(path.parent if path.name == "prediction.json" else path), json.loads(path.read_text())


def fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if isinstance(v, int) or abs(v) >= 100 else f"{v:,.3f}"


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    rows = [load(a) for a in argv]
    width = max(len(name) for name, _ in rows)
    print(f"{'run':<{width}}  " + "  ".join(f"{c:>13}" for c, _ in COLUMNS))
    for name, pred in rows:
        s, p = pred["summary"], pred.get("planner")
        print(f"{name:<{width}}  " + "  ".join(f"{fmt(f(s, p)):>13}" for _, f in COLUMNS))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
