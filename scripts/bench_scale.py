#!/usr/bin/env python
"""Benchmark: production-size traces through `aisim predict`, whole process (issue 36).

The workload is the Mooncake conversation trace repeated: copy k (k = 0, 1, ...) shifted by k x the
trace's span, its hash ids offset by k x (largest id + 1) (each copy its own prefixes), every
timestamp x 0.27 (~12 requests/s), cut at ``--requests``. It is written once as JSONL under
``--data-dir`` and reused. The replay: aggregated vLLM workers of Llama-3.1-8B on H200, polynomial
timing, block 64, 29,249 KV blocks per worker, ``--router`` over ``--workers``.

Each repeat runs `python -m aisim predict` in a fresh child process and reports its wall time, CPU
time (user + system), peak RSS and requests/s; ``--outputs`` also writes prediction.json,
requests.jsonl, request_metrics.csv and worker_timeline.csv (``--output-dir --capture-per-request
--csv``).

    python scripts/bench_scale.py --requests 200000
    python scripts/bench_scale.py --requests 1000000 --router kv_router --workers 64
    python scripts/bench_scale.py --requests 200000 --compare HEAD~3   # side by side, interleaved
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_replay import DEFAULT_TRACE, interleaved, summary_differences  # noqa: E402
from bench_replay import run_once as replay_once  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCALE = 0.27  # timestamp factor: the 1-hour trace's 3.3 requests/s -> ~12

CONFIG = """traffic:
  source: {{type: trace, format: mooncake, paths: [{trace}], block_size: 512}}
  load: {{type: trace_timestamps}}
engine:
  mode: aggregated
  model: meta-llama/Llama-3.1-8B-Instruct
  hardware: h200_sxm
  backend: vllm
  workers:
    aggregated:
      parallelism: {{replicas: {workers}}}
      scheduler: {{max_batched_tokens: 8192, max_sequences: 256}}
      kv_cache: {{block_size: 64, capacity: {{type: fixed, blocks: 29249}}}}
      timing: {{type: polynomial}}
router: {{policy: {router}}}
evaluation:
  sla: {{ttft_ms: 1500, itl_ms: 50}}
execution:
  resources: {{initialization_timeout_seconds: 3600}}  # (ten million rows take ~50 s to read)
  router_sync_ms: {window}
"""

def repeated_trace(source: Path, requests: int, out: Path) -> Path:
    """Write the first ``requests`` rows of the repeated trace to ``out`` (once: an existing file of
    that name is reused)."""
    if out.is_file():
        return out
    rows = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
    ts = [int(r["timestamp"]) for r in rows]
    span = max(ts) - min(ts)
    id_step = max(max(r["hash_ids"], default=0) for r in rows) + 1
    tmp = out.with_suffix(".partial")
    written = 0
    with open(tmp, "w") as f:
        k = 0
        while written < requests:
            shift, off = k * span, k * id_step
            lines = []
            for r in rows[: requests - written]:
                ids = ", ".join(str(h + off) for h in r["hash_ids"])
                lines.append(f'{{"timestamp": {int((r["timestamp"] + shift) * SCALE)}, "input_length": '
                             f'{r["input_length"]}, "output_length": {r["output_length"]}, "hash_ids": [{ids}]}}\n')
            f.write("".join(lines))
            written += len(lines)
            k += 1
    tmp.replace(out)  # (whole or not at all: an interrupted write leaves no truncated trace)
    return out


def run_once(config: Path, env: dict, extra: list[str], side: tuple[Path, str] | None = None) -> dict:
    """One whole-process predict (``bench_replay.run_once``), with its requests/s."""
    r = replay_once(config, env, side, tuple(extra))
    r["requests_per_s"] = r["summary"]["num_requests"] / r["wall_s"]
    return r


def line(r: dict) -> str:
    return (f"wall {r['wall_s']:.1f} s, cpu {r['cpu_s']:.1f} s, peak RSS {r['peak_rss_mb']:.0f} MB, "
            f"{r['requests_per_s']:,.0f} requests/s (replay {r['summary']['wall_time_ms'] / 1000:.1f} s)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200_000)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--router", default="round_robin", choices=("round_robin", "random", "kv_router"))
    ap.add_argument("--router-sync-ms", type=float, default=0.0,
                    help="execution.router_sync_ms (default 0: exact lockstep)")
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "aisim-bench-scale",
                    help="where the repeated traces are written and kept (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--outputs", action="store_true",
                    help="also write prediction.json, requests.jsonl, request_metrics.csv and worker_timeline.csv")
    ap.add_argument("--compare", metavar="REV", help="run this tree and git revision REV side by side, interleaved")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.requests < 1 or args.workers < 1:
        ap.error("--requests and --workers must be positive")
    if not args.trace.is_file():
        raise SystemExit(f"trace not found: {args.trace} (pass --trace)")
    args.data_dir.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    trace = repeated_trace(args.trace, args.requests, args.data_dir / f"conversation_x{args.requests}.jsonl")
    made_s = time.perf_counter() - t
    with tempfile.TemporaryDirectory(prefix="aisim-bench-home-") as home:
        home = Path(home)
        (home / "ray_bootstrap_config.yaml").write_text("")
        env = dict(os.environ, HOME=str(home), RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1")
        config = home / "scale.yaml"
        config.write_text(CONFIG.format(trace=json.dumps(str(trace.resolve())), workers=args.workers,
                                        router=args.router, window=args.router_sync_ms))
        extra = ["--output-dir", str(home / "out"), "--overwrite", "--capture-per-request", "--csv"] \
            if args.outputs else []
        scenario = (f"{args.requests:,} requests (conversation trace repeated, x{SCALE}), {args.workers} aggregated "
                    f"workers, {args.router}, polynomial timing"
                    + (f", router_sync_ms {args.router_sync_ms:g}" if args.router_sync_ms else "")
                    + (", outputs written" if args.outputs else ""))
        meta = {"scenario": scenario, "date": time.strftime("%Y-%m-%d"), "repeat": args.repeat,
                "machine": f"{platform.machine()} {os.cpu_count()} cpu, Python {platform.python_version()}",
                "trace_file_mb": round(trace.stat().st_size / 2**20, 1), "trace_written_s": round(made_s, 1)}
        if args.compare:
            runs = interleaved(args.compare, args.repeat, lambda side: run_once(config, env, extra, side),
                               None if args.json else line)
        else:
            runs = {"this": []}
            for i in range(args.repeat):
                r = run_once(config, env, extra)
                runs["this"].append(r)
                if not args.json:
                    print(f"repeat {i + 1}: {line(r)}", flush=True)
    result = dict(meta)
    for name, rs in runs.items():
        result[name] = {"wall_s": statistics.median(r["wall_s"] for r in rs),
                        "cpu_s": statistics.median(r["cpu_s"] for r in rs),
                        "peak_rss_mb": max(r["peak_rss_mb"] for r in rs),
                        "replay_s": statistics.median(r["summary"]["wall_time_ms"] / 1000 for r in rs)}
        result[name]["requests_per_s"] = rs[0]["summary"]["num_requests"] / result[name]["wall_s"]
        result[name]["kb_per_request"] = result[name]["peak_rss_mb"] * 1024 / rs[0]["summary"]["num_requests"]
    if args.compare:
        a, b = runs["baseline"][0]["summary"], runs["this"][0]["summary"]
        result["differing_summary_fields"] = {k: [a[k], b[k]] for k in summary_differences(a, b)}
        result["wall_ratio_this_to_baseline"] = result["this"]["wall_s"] / result["baseline"]["wall_s"]
        result["rss_ratio_this_to_baseline"] = result["this"]["peak_rss_mb"] / result["baseline"]["peak_rss_mb"]
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(scenario)
    print(f"({meta['machine']}, {meta['date']}, median of {args.repeat}; trace {meta['trace_file_mb']} MB)")
    for name in runs:
        r = result[name]
        print(f"{name:8s}: wall {r['wall_s']:.1f} s, cpu {r['cpu_s']:.1f} s, peak RSS {r['peak_rss_mb']:.0f} MB "
              f"({r['kb_per_request']:.2f} KB/request), {r['requests_per_s']:,.0f} requests/s, "
              f"replay {r['replay_s']:.1f} s")
    if args.compare:
        print(f"this / {args.compare}: wall {result['wall_ratio_this_to_baseline']:.3f}, "
              f"peak RSS {result['rss_ratio_this_to_baseline']:.3f}; summaries "
              + ("identical (wall time aside)" if not result["differing_summary_fields"]
                 else "DIFFER in " + ", ".join(f"{k} ({x!r} vs {y!r})"
                                               for k, (x, y) in result["differing_summary_fields"].items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
