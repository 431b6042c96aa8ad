#!/usr/bin/env python
"""Side by side with the reference simulator: one predict config through aisim and through the
reference's `aisimulate predict`, and their summary metrics with aisim's relative difference.

    python scripts/compare_reference.py -c my.yaml                  # --stack dynamo (router, Planner)
    python scripts/compare_reference.py -c my.yaml --stack engine   # engine only (no router section)
    python scripts/compare_reference.py -c my.yaml --set engine.backend=trtllm --json

The reference installs into its own venv (../shared/reference/anchor/README.md); ``--reference``
names its `aisimulate` executable (default ``$AISIM_REFERENCE``, else ``~/.cache/aisim-ref/bin/aisimulate``). Both runs get
the same YAML (after ``--set``), a fresh output directory and HF_HUB_OFFLINE=1. Exit 1 when a
metric differs by more than ``--tolerance`` percent (default: none checked).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

DEFAULT_REFERENCE = Path(os.environ.get("AISIM_REFERENCE", Path.home() / ".cache" / "aisim-ref" / "bin" / "aisimulate"))
METRICS = ("completed_requests", "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "mean_itl_ms",
           "p90_itl_ms", "mean_e2e_latency_ms", "p90_e2e_latency_ms", "output_throughput_tok_s",
           "goodput_output_throughput_tok_s", "num_preemptions", "prefix_cache_reused_ratio")


def _set(doc: dict, path: str, raw: str) -> None:
    keys = path.split(".")
    node = doc
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = yaml.safe_load(raw)


def run(cmd: list[str], cwd: Path, what: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"{what} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    return json.loads((cwd / "out" / "prediction.json").read_text())


def compare(config: Path, overrides: list[str], stack: str, reference: Path) -> dict:
    doc = yaml.safe_load(config.read_text())
    for item in overrides:
        path, _, raw = item.partition("=")
        _set(doc, path, raw)
    out = {}
    with tempfile.TemporaryDirectory(prefix="aisim-vs-ref-") as tmp:
        for side in ("aisim", "reference"):
            d = Path(tmp) / side
            d.mkdir()
            (d / "config.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
            if side == "aisim":
                cmd = [sys.executable, "-m", "aisim", "predict", "-c", "config.yaml", "--output-dir", "out", "--overwrite",
                       "--format", "json"]
            else:
                cmd = [str(reference), "predict", "--stack", stack, "--config", "config.yaml", "--output-dir", "out",
                       "--overwrite"]
            # relative trace and model paths resolve against the config's own folder
            for rel in _relative_paths(doc):
                src = (config.parent / rel).resolve()
                if src.exists() and not (d / rel).exists():
                    (d / rel).parent.mkdir(parents=True, exist_ok=True)
                    (d / rel).symlink_to(src)
            pred = run(cmd, d, side)
            out[side] = pred.get("summary", pred)  # (the reference's engine stack writes the summary flat)
    return out


def _relative_paths(doc: dict) -> list[str]:
    paths = list((doc.get("traffic", {}).get("source", {}) or {}).get("paths") or [])
    model = (doc.get("engine") or {}).get("model")
    if isinstance(model, str) and (model.startswith(".") or "/" in model and not model.startswith("/")):
        paths.append(model)
    return [p for p in paths if isinstance(p, str) and not Path(p).is_absolute()]


def table(sums: dict) -> list[dict]:
    rows = []
    for k in METRICS:
        a, r = sums["aisim"].get(k), sums["reference"].get(k)
        diff = None
        if isinstance(a, (int, float)) and isinstance(r, (int, float)) and r:
            diff = (a - r) / abs(r) * 100.0
        rows.append({"metric": k, "aisim": a, "reference": r, "diff_pct": diff})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-c", "--config", type=Path, required=True)
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=YAML")
    ap.add_argument("--stack", default="dynamo", choices=("dynamo", "engine"))
    ap.add_argument("--reference", type=Path, default=DEFAULT_REFERENCE)
    ap.add_argument("--tolerance", type=float, default=None, help="percent; exit 1 when any metric differs more")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if not args.reference.exists():
        raise SystemExit(f"--reference: {args.reference} not found; install the reference as "
                         "../shared/reference/anchor/README.md says")
    rows = table(compare(args.config, args.overrides, args.stack, args.reference))
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for r in rows:
            d = "" if r["diff_pct"] is None else f"{r['diff_pct']:+7.2f}%"
            print(f"{r['metric']:32} {r['aisim']!s:>22} {r['reference']!s:>22} {d}")
    bad = [r for r in rows if args.tolerance is not None and r["diff_pct"] is not None
           and abs(r["diff_pct"]) > args.tolerance]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
