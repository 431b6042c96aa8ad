#!/usr/bin/env python
"""Side by side with the reference simulator: one predict config through aisim and through the
reference's `aisimulate predict`, and their summary metrics with aisim's relative difference.

    python scripts/compare_reference.py -c my.yaml                  # --stack dynamo (router, Planner)
    python scripts/compare_reference.py -c my.yaml --stack engine   # engine only (no router section)
    python scripts/compare_reference.py -c my.yaml --set engine.backend=trtllm --json
    python scripts/compare_reference.py -c configs/recommend-reference-form.yaml --recommend \
        --reference-set engine.model=../shared/reference/anchor/models/nvidia--Llama-3.1-8B-Instruct-FP8

``--recommend`` runs a search in the reference's recommend form through ``aisim recommend`` and
``aisimulate recommend``, matches the candidates by deployment point (mode, each role's parallelism
and batching limits, the router and its knobs) and prints each point's score on both sides with
aisim's difference, then both rankings. ``--reference-set`` changes the reference's copy only (the
reference reads FP8 Llama from a local directory).

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
import time
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


def compare_recommend(config: Path, overrides: list[str], ref_overrides: list[str], stack: str,
                      reference: Path) -> dict:
    """Both ledgers' candidates, keyed by deployment point: {point: {"aisim": score, "reference": score}}."""
    doc = yaml.safe_load(config.read_text())
    for item in overrides:
        path, _, raw = item.partition("=")
        _set(doc, path, raw)
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="aisim-vs-ref-") as tmp:
        for side in ("aisim", "reference"):
            d = Path(tmp) / side
            d.mkdir()
            mine = json.loads(json.dumps(doc))
            for item in ref_overrides if side == "reference" else []:
                path, _, raw = item.partition("=")
                _set(mine, path, raw)
            (d / "config.yaml").write_text(yaml.safe_dump(mine, sort_keys=False))
            if side == "aisim":
                cmd = [sys.executable, "-m", "aisim", "recommend", "-c", "config.yaml", "--output-dir", "out",
                       "--overwrite", "--format", "json"]
            else:
                cmd = [str(reference), "recommend", "--stack", stack, "-c", "config.yaml", "--output-dir", "out",
                       "--overwrite"]
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
            t0 = time.perf_counter()
            p = subprocess.run(cmd, cwd=d, capture_output=True, text=True, env=env)
            out.setdefault("_wall_s", {})[side] = time.perf_counter() - t0
            if p.returncode not in (0, 1):
                raise SystemExit(f"{side} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
            rec = json.loads((d / "out" / "recommendation.json").read_text())
            for c in rec["candidates"]:
                out.setdefault(_point(c["prediction_config"]), {})[side] = c["score"]
    return out


def _point(pred: dict) -> tuple:
    """A candidate's deployment point from its concrete predict config."""
    engine, router = pred["engine"], pred.get("router") or {}
    roles = []
    for role in sorted(engine["workers"]):
        w = engine["workers"][role]
        par, sched = w.get("parallelism", {}), w.get("scheduler", {})
        roles.append((role, *(par.get(k, 1) for k in ("replicas", "tensor", "pipeline", "attention_data")),
                      sched.get("max_batched_tokens"), sched.get("max_sequences")))
    knobs = tuple(round(float(router[k]), 6) for k in ("overlap_score_credit", "prefill_load_scale", "temperature")
                  if router.get("policy") == "kv_router" and router.get(k) is not None)
    return (engine.get("mode", "aggregated"), engine.get("backend", "vllm"), *roles, router.get("policy", "round_robin"),
            knobs)


def recommend_table(points: dict) -> tuple[list[dict], list, list]:
    rows = []
    for point, sides in sorted(points.items(), key=lambda kv: str(kv[0])):
        a, r = sides.get("aisim"), sides.get("reference")
        diff = (a - r) / abs(r) * 100.0 if isinstance(a, (int, float)) and isinstance(r, (int, float)) and r else None
        rows.append({"point": point, "aisim": a, "reference": r, "diff_pct": diff})
    rank = {side: [p for p, s in sorted(points.items(), key=lambda kv: -(kv[1].get(side) or float("-inf")))]
            for side in ("aisim", "reference")}
    return rows, rank["aisim"], rank["reference"]


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
    ap.add_argument("--recommend", action="store_true", help="a recommend config: compare every candidate's score")
    ap.add_argument("--reference-set", dest="ref_overrides", action="append", default=[], metavar="PATH=YAML",
                    help="change the reference's copy of the config only (e.g. a local model directory)")
    args = ap.parse_args(argv)
    if not args.reference.exists():
        raise SystemExit(f"--reference: {args.reference} not found; install the reference as "
                         "../shared/reference/anchor/README.md says")
    if args.recommend:
        points = compare_recommend(args.config, args.overrides, args.ref_overrides, args.stack, args.reference)
        wall = points.pop("_wall_s")
        rows, mine, theirs = recommend_table(points)
        if args.json:
            print(json.dumps({"points": rows, "rank_aisim": mine, "rank_reference": theirs, "wall_s": wall}, indent=1,
                             default=str))
        else:
            for r in rows:
                d = "" if r["diff_pct"] is None else f"{r['diff_pct']:+7.2f}%"
                print(f"{r['point']!s:90} {r['aisim']!s:>20} {r['reference']!s:>20} {d}")
            worst = max((abs(r["diff_pct"]) for r in rows if r["diff_pct"] is not None), default=None)
            print(f"worst difference: {worst:.2f}%" if worst is not None else "no point on both sides")
            print(f"whole process: aisim {wall['aisim']:.1f} s, reference {wall['reference']:.1f} s "
                  f"({wall['reference'] / wall['aisim']:.1f}x)")
        bad = [r for r in rows if args.tolerance is not None and (r["diff_pct"] is None
                                                                   or abs(r["diff_pct"]) > args.tolerance)]
        return 1 if bad else 0
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
