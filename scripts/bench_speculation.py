#!/usr/bin/env python
"""Benchmark: what speculative decoding costs a replay (issue 35).

The Mooncake conversation trace's first 20 minutes through 2 aggregated vLLM workers of
Llama-3.1-8B-Instruct-FP8 on H200 with measured timing (the side-by-side configuration of
docs/speculative-decoding.md): without speculation, with MTP (nextn 2, 1.4 accepted drafts a
pass) and with n-gram speculation (3 drafts, acceptance rates 0.8 / 0.6 / 0.4). Each replay runs in
this process (``run_plan``: the replay alone), the variants interleaved repeat by repeat so that a
change in the machine's load hits all alike. Prints each variant's median replay time, its ratio to
the replay without speculation (the issue's bound: 1.3x) and the numbers speculation moves.

    python scripts/bench_speculation.py                  # 3 repeats
    python scripts/bench_speculation.py --repeat 5 --json
    python scripts/bench_speculation.py --instructions   # one replay's instructions (callgrind)

Wall time on a shared 2-core machine moves by +-3% between runs; ``--instructions`` counts what one
replay executes instead (valgrind's callgrind, reproducible to ~0.01%: a process replaying three
times minus one replaying once, halved, so start-up and the first replay's warm-up cancel), the
variants two processes at a time. About 3 minutes per variant here.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import bench_meta, offline_home, print_head  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"

VARIANTS = {
    "none": {},
    "mtp": {"nextn": 2, "nextn_accepted": 1.4},
    "ngram": {"speculation": {"kind": "ngram", "num_speculative_tokens": 3, "acceptance_rates": [0.8, 0.6, 0.4]}},
}


def config(trace: Path, variant: str, minutes: float) -> dict:
    return {"traffic": {"source": {"type": "trace", "format": "mooncake", "paths": [str(trace)], "block_size": 512},
                        "load": {"type": "trace_timestamps"},
                        "stop": {"max_virtual_time_seconds": minutes * 60}},
            "engine": {"mode": "aggregated", "model": "nvidia/Llama-3.1-8B-Instruct-FP8", "hardware": "h200_sxm",
                       "backend": "vllm", **VARIANTS[variant],
                       "workers": {"aggregated": {"parallelism": {"replicas": 2}, "timing": {"type": "default"}}}},
            "evaluation": {"sla": {"ttft_ms": 2000, "itl_ms": 50}}}


def instructions(args) -> int:
    """Each variant's instructions per replay (see the module doc) and its ratio to ``none``."""
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    env = dict(os.environ, PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1")
    work = Path(tempfile.mkdtemp(prefix="aisim-bench-spec-"))

    def count(job: tuple[str, int]) -> int:
        variant, replays = job
        out = work / f"{variant}-{replays}.out"
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, __file__,
               "--trace", str(args.trace), "--minutes", str(args.minutes), "--replays", str(replays), variant]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode:
            raise SystemExit(f"callgrind run of {variant} failed: {p.stderr.strip()[-1500:]}")
        m = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.M)
        return int(m.group(1))

    try:
        jobs = [(v, n) for v in VARIANTS for n in (1, 3)]
        with ThreadPoolExecutor(2) as pool:
            counts = dict(zip(jobs, pool.map(count, jobs)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    per = {v: (counts[(v, 3)] - counts[(v, 1)]) // 2 for v in VARIANTS}
    rows = [{"variant": v, "instructions": per[v], "vs_none": round(per[v] / per["none"], 3)} for v in VARIANTS]
    meta = bench_meta(1)
    if args.json:
        print_head(meta, rows, True)
        return 0
    print(f"{meta['machine']}, {meta['date']}, one replay's instructions (callgrind: 3 replays - 1, halved)")
    print(f"{'variant':8s} {'instructions':>15s} {'vs none':>8s}")
    for r in rows:
        print(f"{r['variant']:8s} {r['instructions']:15,d} {r['vs_none']:7.3f}x")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--instructions", action="store_true", help="count instructions under callgrind instead")
    ap.add_argument("--replays", type=int, help=argparse.SUPPRESS)  # (a counted child: replay N times)
    ap.add_argument("variant", nargs="?", choices=list(VARIANTS), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    offline_home()
    if args.instructions:
        return instructions(args)
    from aisim import plan_from_config, run_plan
    from aisim.simulator.config.loading import validate_config

    if args.replays:
        plan = plan_from_config(validate_config(config(args.trace, args.variant or "none", args.minutes)))
        for _ in range(args.replays):
            run_plan(plan)
        return 0

    plans = {v: plan_from_config(validate_config(config(args.trace, v, args.minutes))) for v in VARIANTS}
    for v in VARIANTS:  # (warm: measured tables loaded, code paths compiled)
        run_plan(plans[v])
    times: dict = {v: [] for v in VARIANTS}
    summaries = {}
    for _ in range(args.repeat):
        for v in VARIANTS:
            t = time.perf_counter()
            rep = run_plan(plans[v])
            times[v].append(time.perf_counter() - t)
            summaries[v] = (rep.summary, rep.diagnostics)
    base = statistics.median(times["none"])
    rows = []
    for v in VARIANTS:
        med = statistics.median(times[v])
        s, diag = summaries[v]
        rows.append({"variant": v, "replay_s": round(med, 3), "vs_none": round(med / base, 2),
                     "passes": diag.get("num_passes"), "mean_ttft_ms": round(s["mean_ttft_ms"], 1),
                     "mean_itl_ms": round(s["mean_itl_ms"], 2), "mean_e2e_ms": round(s["mean_e2e_latency_ms"], 1)})
    if print_head(bench_meta(args.repeat), rows, args.json):
        return 0
    print(f"{'variant':8s} {'replay s':>9s} {'vs none':>8s} {'passes':>8s} {'mean TTFT':>10s} {'mean ITL':>9s} "
          f"{'mean E2E':>9s}")
    for r in rows:
        print(f"{r['variant']:8s} {r['replay_s']:9.3f} {r['vs_none']:7.2f}x {r['passes'] or 0:8d} "
              f"{r['mean_ttft_ms']:10.1f} {r['mean_itl_ms']:9.2f} {r['mean_e2e_ms']:9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
