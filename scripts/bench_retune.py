#!/usr/bin/env python
"""Benchmark: retune scenario 1 (configs/retune-router.yaml) against the same replay without retune.

Runs, interleaved and whole-process (``aisim predict ... --format json``), the retune config and the
same config with ``planner={policy: disabled}``, N rounds each, and prints the median wall time of
each, their ratio, and the peak RSS of the whole process tree (the replay plus its sweep workers,
summed while they run; sampled from /proc every 20 ms). The 18 window replays are about 4.6 plain
replays of work, so on 2 cores the floor is about 3.3x the plain replay.

    python scripts/bench_retune.py [--rounds 3] [--max-parallel 2] [--config configs/retune-router.yaml]
                                   [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _bench import offline_home

ROOT = Path(__file__).resolve().parents[1]
PAGE = os.sysconf("SC_PAGE_SIZE")


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().rsplit(b")", 1)[1].split()
            kids.setdefault(int(stat[1]), []).append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return kids


def _tree_rss(pid: int) -> int:
    kids = _children()
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm") as fh:
                total += int(fh.read().split()[1]) * PAGE
        except (OSError, ValueError, IndexError):
            pass
        todo.extend(kids.get(p, []))
    return total


def run_once(config: Path, sets: list[str], env: dict) -> tuple[float, int]:
    """(wall seconds, peak tree RSS bytes) of one whole ``aisim predict`` process."""
    with tempfile.TemporaryDirectory(prefix="aisim-bench-retune-") as out:
        cmd = [sys.executable, "-m", "aisim", "predict", "-c", str(config), "--format", "json",
               "--output-dir", str(Path(out) / "run")]
        for s in sets:
            cmd += ["--set", s]
        peak = 0
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT)
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, _tree_rss(proc.pid))
                done.wait(0.02)

        th = threading.Thread(target=sample, daemon=True)
        th.start()
        _, err = proc.communicate()
        wall = time.perf_counter() - t0
        done.set()
        th.join()
        if proc.returncode not in (0, 1):
            raise SystemExit(f"aisim predict failed ({proc.returncode}): {err.decode(errors='replace')[-2000:]}")
        return wall, peak


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "retune-router.yaml")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-parallel", type=int, default=None, help="planner.retune.max_parallel")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="extra --set for both runs")
    args = ap.parse_args()
    env = dict(os.environ)
    offline_home(env)
    retune_sets = list(args.sets)
    if args.max_parallel is not None:
        retune_sets.append(f"planner.retune.max_parallel={args.max_parallel}")
    plain_sets = [*args.sets, "planner={policy: disabled}"]
    run_once(args.config, plain_sets, env)  # warm the file cache
    walls: dict[str, list[float]] = {"plain": [], "retune": []}
    peaks: dict[str, int] = {"plain": 0, "retune": 0}
    for _ in range(args.rounds):
        for name, sets in (("plain", plain_sets), ("retune", retune_sets)):
            wall, peak = run_once(args.config, sets, env)
            walls[name].append(wall)
            peaks[name] = max(peaks[name], peak)
    med = {k: statistics.median(v) for k, v in walls.items()}
    print(f"config {args.config.name}, {args.rounds} interleaved rounds, {os.cpu_count()} CPUs")
    for name in ("plain", "retune"):
        print(f"{name:7} median {med[name]:7.2f} s  (runs {', '.join(f'{w:.2f}' for w in walls[name])})  "
              f"peak tree RSS {peaks[name] / 2**20:7.0f} MiB")
    print(f"ratio retune / plain: {med['retune'] / med['plain']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
