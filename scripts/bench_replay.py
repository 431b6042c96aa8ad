#!/usr/bin/env python
"""Benchmark: the full Mooncake conversation trace through `aisim predict`, whole process.

Scenario (issue 2): 12,031 requests over 1 h, aggregated, 2 workers, polynomial timing,
block 64, fixed capacity 29,249 blocks per worker, round robin. Each repeat runs
`python -m aisim predict` in a fresh child process, so the wall time includes interpreter
start, imports, trace loading, the replay and the report, and the peak RSS is the child's.

    python scripts/bench_replay.py                       # 3 repeats, prints a summary line per run
    python scripts/bench_replay.py --trace PATH --repeat 5 --json
    python scripts/bench_replay.py --compare fad994a --repeat 5   # this tree vs a commit, interleaved

``--compare REV`` installs REV and this working tree, each from its own wheel into a fresh venv
(``scripts/_trees.py``), and for each repeat runs the same config on both next to each other,
alternating which goes first
(interleaved, so a change in the machine's load hits both alike). It reports both medians, their
ratio (this / REV), the median and range of each repeat's own ratio (robust when the machine's
speed drifts between repeats), the ratio of the children's median CPU time (user + system: not
stretched while another process holds the core, though a busy sibling core still slows it) and
whether the two summaries agree on every field they share, wall-time fields aside.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"

CONFIG = """
traffic:
  source: {{type: trace, format: mooncake, paths: [{trace}], block_size: 512}}
  load: {{type: trace_timestamps}}
engine:
  mode: {mode}
  model: meta-llama/Llama-3.1-8B-Instruct
  hardware: h200_sxm
  backend: {engine_backend}
{transfer}  workers:
{workers}
router: {{policy: {router}}}
{planner}"""

PLANNER = """planner:
  policy: enabled
  target: sla
  enable_throughput_scaling: true
  enable_load_scaling: true
  max_num_gpus: 4
  min_workers: 1
  load_predictor: kalman
evaluation:
  sla: {ttft_ms: 1500, itl_ms: 50}
"""

ROLE = """    {role}:
      parallelism: {{replicas: {replicas}}}
      scheduler: {{max_batched_tokens: 8192, max_sequences: {seqs}}}
      kv_cache: {{block_size: {block_size}, capacity: {{type: fixed, blocks: {blocks}}}}}
      timing: {{type: {timing}}}
"""


def render_config(args) -> str:
    # SGLang's default page is one token (under the KV router, which needs 16 or more, vLLM's 64):
    # the same KV tokens in pages of --sglang-page tokens
    page = args.sglang_page or (64 if args.router == "kv_router" else 1) \
        if getattr(args, "engine_backend", "vllm") == "sglang" else 64
    common = dict(blocks=args.blocks * 64 // page, block_size=page, timing=args.timing)
    if args.disaggregated:
        p, d = args.disaggregated
        workers = ROLE.format(role="prefill", replicas=p, seqs=1, **common) + ROLE.format(
            role="decode", replicas=d, seqs=256, **common)
        transfer = f"  kv_transfer: {{bandwidth_gb_per_second: {args.transfer_gb_s}}}\n"
        mode = "disaggregated"
    else:
        workers = ROLE.format(role="aggregated", replicas=args.workers, seqs=256, **common)
        transfer, mode = "", "aggregated"
    return CONFIG.format(trace=json.dumps(str(args.trace.resolve())), mode=mode, transfer=transfer,
                         engine_backend=getattr(args, "engine_backend", "vllm"),
                         workers=workers.rstrip("\n"), router=args.router, planner=PLANNER if args.planner else "")


WALL_FIELDS = ("wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s")

# The child reports its own peak RSS (RUSAGE_CHILDREN is a running max over all children, so it
# cannot tell two trees apart when they alternate).
# (from an exit handler: the command may end its process without returning, aisim.cli.run)
CHILD = r"""
import atexit, resource, runpy, sys
sys.argv = ["aisim", "predict", "-c", sys.argv[1], "--format", "json", *sys.argv[2:]]
def _usage():
    u = resource.getrusage(resource.RUSAGE_SELF)
    sys.stderr.write("\nAISIM_BENCH_PEAK_KB=%d AISIM_BENCH_CPU_S=%.4f\n" % (u.ru_maxrss, u.ru_utime + u.ru_stime))
atexit.register(_usage)
runpy.run_module("aisim", run_name="__main__")
"""


def run_once(config: Path, env: dict, side: tuple[Path, str] | None = None, extra: tuple = ()) -> dict:
    """One whole-process predict; ``side``: ``(tree, python)`` of an installed tree (``_trees``),
    None: this environment; ``extra``: more predict arguments."""
    tree, python = side or (ROOT, sys.executable)
    t0 = time.perf_counter()
    # an installed side runs beside its tree, not in it (the tree's folders would shadow the install)
    p = subprocess.run([python, "-c", CHILD, str(config), *extra], capture_output=True, text=True,
                       env={k: v for k, v in env.items() if k != "PYTHONPATH"}, cwd=tree if side is None else tree.parent)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"aisim predict failed in {tree} ({p.returncode}): {p.stderr.strip()[-2000:]}")
    summary = json.loads(p.stdout)
    peak_kb = int(p.stderr.rsplit("AISIM_BENCH_PEAK_KB=", 1)[1].split()[0])
    cpu_s = float(p.stderr.rsplit("AISIM_BENCH_CPU_S=", 1)[1].split()[0])
    return {"wall_s": wall, "cpu_s": cpu_s, "peak_rss_mb": peak_kb / 1024, "summary": summary}


def summary_differences(a: dict, b: dict) -> list[str]:
    """Fields both summaries have whose values differ (wall-time fields aside)."""
    return sorted(k for k in a.keys() & b.keys() if k not in WALL_FIELDS and a[k] != b[k])


def interleaved(rev: str, repeat: int, run, line=None, warmup: bool = False) -> dict[str, list[dict]]:
    """``run(side)`` ``repeat`` times for REV and for this working tree, alternating; each side is
    its tree installed from its wheel in a fresh venv (``_trees.installed``: the same way for both,
    whatever their package layout). ``line(result)`` (when given) is printed after each.
    ``warmup``: one untimed run from each side first (Python writes its bytecode cache, the OS
    caches the files)."""
    from _trees import WORKTREE, installed, is_commit

    if not is_commit(rev):
        raise SystemExit(f"{rev} is not a commit; give a commit id or branch")
    runs: dict[str, list[dict]] = {"baseline": [], "this": []}
    with installed(rev, "aisim-bench-baseline-") as base, installed(WORKTREE, "aisim-bench-this-") as this:
        if warmup:
            for side in (base, this):
                run(side)
        for i in range(repeat):
            # adjacent in time, alternating which goes first (a drifting machine hits both alike)
            order = (("baseline", base), ("this", this))
            for name, side in (order if i % 2 == 0 else order[::-1]):
                r = run(side)
                runs[name].append(r)
                if line is not None:
                    print(f"repeat {i + 1} {name:8}: {line(r)}", flush=True)
    return runs


def compare_command(rev: str, repeats: int, argv, result_file: str, answers, home: Path, what: str) -> int:
    """One ``aisim`` command, whole process, for REV and this tree (``interleaved``, a warm-up
    first): ``argv(out_dir)`` its arguments, ``answers(doc)`` what must agree in the JSON
    ``result_file`` it writes under ``out_dir``. Prints the medians and their ratio; exit 1 when the
    answers differ."""
    # as Python runs by default (and as ``bench``'s default): the bytecode cache is written (the
    # warm-up run) and read, so each run times what a user's installed aisim does, not compiling
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["HOME"] = str(home)

    def run(side) -> dict:
        tree, python = side
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            p = subprocess.run([python, "-m", "aisim", *argv(f"{tmp}/o")], capture_output=True, text=True,
                               env=env, cwd=tmp)
            wall = time.perf_counter() - t
            if p.returncode != 0:
                raise SystemExit(f"{tree}: {p.stderr.strip()[-1000:]}")
            doc = json.loads((Path(tmp) / "o" / result_file).read_text())
        return {"wall_s": wall, "answers": answers(doc)}

    runs = interleaved(rev, repeats, run, lambda r: f"wall {r['wall_s']:.2f} s", warmup=True)
    b = statistics.median(r["wall_s"] for r in runs["baseline"])
    t = statistics.median(r["wall_s"] for r in runs["this"])
    same = all(r["answers"] == runs["baseline"][0]["answers"] for r in runs["baseline"] + runs["this"])
    pairs = [a["wall_s"] / c["wall_s"] for a, c in zip(runs["baseline"], runs["this"])]  # (run next to each other)
    print(f"{what}, {os.cpu_count()} CPUs, median of {repeats}, whole process")
    print(f"{rev}: {b:.2f} s; this tree: {t:.2f} s -> {b / t:.2f}x (each repeat's pair: median "
          f"{statistics.median(pairs):.2f}x, range {min(pairs):.2f}-{max(pairs):.2f}); same answers: {same}")
    return 0 if same else 1


def compare(args, config: Path, env: dict) -> int:
    """This tree against ``args.compare``, interleaved, median of ``args.repeat``."""
    runs = interleaved(args.compare, args.repeat, lambda side: run_once(config, env, side),
                       None if args.json else lambda r: (f"wall {r['wall_s']:.2f} s, cpu {r['cpu_s']:.2f} s, "
                                                         f"peak RSS {r['peak_rss_mb']:.0f} MB, "
                                                         f"replay {r['summary']['wall_time_ms'] / 1000:.2f} s"),
                       warmup=not args.no_bytecode_cache)
    med = {k: statistics.median(r["wall_s"] for r in v) for k, v in runs.items()}
    replay = {k: statistics.median(r["summary"]["wall_time_ms"] / 1000 for r in v) for k, v in runs.items()}
    cpu = {k: statistics.median(r["cpu_s"] for r in v) for k, v in runs.items()}
    diffs = sorted({d for a, b in zip(runs["baseline"], runs["this"]) for d in summary_differences(a["summary"], b["summary"])})
    this_self = sorted({d for r in runs["this"][1:] for d in summary_differences(runs["this"][0]["summary"], r["summary"])})
    result = {
        "scenario": scenario_name(args), "baseline": args.compare, "repeat": args.repeat,
        "machine": f"{platform.machine()} {os.cpu_count()} cpu, Python {platform.python_version()}",
        "bytecode_cache": not args.no_bytecode_cache,
        "date": time.strftime("%Y-%m-%d"),
        "median_wall_s": med, "median_replay_s": replay,
        "ratio_this_to_baseline": med["this"] / med["baseline"],
        # each repeat's pair (run next to each other): robust when the machine's speed drifts
        "pair_ratios": [b["wall_s"] / a["wall_s"] for a, b in zip(runs["baseline"], runs["this"])],
        "replay_ratio_this_to_baseline": replay["this"] / replay["baseline"],
        # the children's own CPU time (user + system): not stretched while another process has the core
        "median_cpu_s": cpu, "cpu_ratio_this_to_baseline": cpu["this"] / cpu["baseline"],
        "peak_rss_mb": {k: max(r["peak_rss_mb"] for r in v) for k, v in runs.items()},
        "differing_summary_fields": diffs,
        "nondeterministic_fields": this_self,
    }
    result["median_pair_ratio"] = statistics.median(result["pair_ratios"])
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        pairs = result["pair_ratios"]
        print(f"ratio of each repeat's pair: median {result['median_pair_ratio']:.3f} "
              f"(range {min(pairs):.3f}-{max(pairs):.3f})")
        print(f"median whole process: {args.compare} {med['baseline']:.2f} s, this {med['this']:.2f} s, "
              f"ratio {result['ratio_this_to_baseline']:.3f} (replay alone {result['replay_ratio_this_to_baseline']:.3f}, "
              f"CPU time {result['cpu_ratio_this_to_baseline']:.3f}); "
              f"peak RSS {result['peak_rss_mb']['baseline']:.0f} vs {result['peak_rss_mb']['this']:.0f} MB "
              f"({result['machine']})")
        print("summaries: " + ("identical on every shared field (wall time aside)" if not diffs
                               else "DIFFER in " + ", ".join(diffs)))
    return 0 if not diffs and not this_self else 1


def scenario_name(args) -> str:
    shape = ("%dP%dD disaggregated" % tuple(args.disaggregated) if args.disaggregated
             else "%d aggregated workers" % args.workers)
    return (f"conversation trace, {shape}, {args.timing}, block 64, {args.blocks} blocks/worker, {args.router}"
            + (", Planner" if args.planner else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="conversation_trace.jsonl (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=29249, help="KV blocks per worker (default: %(default)s)")
    ap.add_argument("--timing", default="polynomial", choices=("polynomial", "default", "roofline"),
                    help="default = measured kernel data; its first run builds the timing tables (cold), "
                         "later runs load them from the cache (warm)")
    ap.add_argument("--router", default="round_robin", choices=("round_robin", "random", "kv_router"))
    ap.add_argument("--engine-backend", default="vllm", choices=("vllm", "sglang", "trtllm"),
                    help="engine.backend: the scheduling semantics (default: %(default)s; sglang: as many KV "
                         "tokens as --blocks of 64, in pages of --sglang-page)")
    ap.add_argument("--sglang-page", type=int, default=None,
                    help="SGLang's page (kv_cache.block_size; default 1, 64 with the KV router)")
    ap.add_argument("--disaggregated", nargs=2, type=int, metavar=("PREFILL", "DECODE"),
                    help="disaggregated with this many prefill and decode workers (instead of --workers)")
    ap.add_argument("--transfer-gb-s", type=float, default=50.0, help="KV transfer bandwidth, disaggregated (GB/s)")
    ap.add_argument("--planner", action="store_true",
                    help="with the Planner in the loop (SLA 1,500/50 ms, kalman, up to 4 GPUs)")
    ap.add_argument("--compare", metavar="REV", help="time this tree against git revision REV, interleaved")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    ap.add_argument("--no-bytecode-cache", action="store_true",
                    help="compile every module in every run (as with PYTHONDONTWRITEBYTECODE set and no cache); "
                         "by default the children may write and read Python's bytecode cache, as Python does "
                         "unless told otherwise, and --compare warms both trees up with one untimed run")
    args = ap.parse_args()
    if not args.trace.is_file():
        raise SystemExit(f"trace not found: {args.trace} (pass --trace)")
    with tempfile.TemporaryDirectory(prefix="aisim-bench-home-") as home:  # removed afterwards
        return bench(args, Path(home))


def bench(args, home: Path) -> int:
    """Run the benchmark (or the comparison) with ``home`` as the children's HOME."""
    (home / "ray_bootstrap_config.yaml").write_text("")
    env = dict(os.environ, HOME=str(home), RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1")
    if args.no_bytecode_cache:  # no cache written, none found (an empty cache root)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["PYTHONPYCACHEPREFIX"] = str(home / "no-pycache")
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    config = home / "bench.yaml"
    config.write_text(render_config(args))
    if args.compare:
        return compare(args, config, env)

    runs = []
    for i in range(args.repeat):
        r = run_once(config, env)
        runs.append(r)
        s = r["summary"]
        if not args.json:
            print(f"run {i + 1}: wall {r['wall_s']:.2f} s  {s['num_requests'] / r['wall_s']:,.0f} requests/s  "
                  f"peak RSS {r['peak_rss_mb']:.0f} MB  (replay {s['wall_time_ms'] / 1000:.2f} s)")
    walls = [r["wall_s"] for r in runs]
    warm = walls[1:] if args.timing == "default" and len(walls) > 1 else walls
    s = runs[0]["summary"]
    result = {
        "scenario": scenario_name(args),
        "machine": f"{platform.machine()} {os.cpu_count()} cpu, Python {platform.python_version()}",
        "bytecode_cache": not args.no_bytecode_cache,
        "date": time.strftime("%Y-%m-%d"),
        "requests": s["num_requests"],
        "wall_s_min": min(walls),
        "wall_s_median": statistics.median(warm),
        "wall_s_first_run": walls[0],
        "requests_per_s": s["num_requests"] / statistics.median(warm),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
        "replay_wall_s_median": statistics.median(r["summary"]["wall_time_ms"] for r in runs) / 1000,
        "mean_ttft_ms": s["mean_ttft_ms"],
        "mean_itl_ms": s["mean_itl_ms"],
        "prefix_cache_reused_ratio": s["prefix_cache_reused_ratio"],
        "gpu_hours": s["gpu_hours"],
        "p90_ttft_ms": s["p90_ttft_ms"],
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        cold = f" (first run, building the timing tables: {walls[0]:.2f} s)" if warm is not walls else ""
        print(f"median wall {result['wall_s_median']:.2f} s, {result['requests_per_s']:,.0f} requests/s, "
              f"peak RSS {result['peak_rss_mb']:.0f} MB ({result['machine']}){cold}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
