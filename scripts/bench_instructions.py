#!/usr/bin/env python
"""Benchmark: instructions executed by one whole-process `aisim predict`, this tree vs a commit.

Wall time on a shared 2-core machine moves by +-3% from run to run, more than the changes worth
measuring; the number of instructions a process executes (valgrind's callgrind) does not: the
same tree, config and seed give the same count within ~0.2% on any load. Each side is the tree
installed from its wheel into a fresh venv (``scripts/_trees.py``, as ``bench_replay --compare``),
run once untimed (bytecode caches), then once under callgrind; the two callgrind runs go in
parallel. The scenario flags are bench_replay's.

    python scripts/bench_instructions.py --compare aefbc5f --workers 4 --router kv_router
    python scripts/bench_instructions.py --compare aefbc5f --disaggregated 1 1

Needs valgrind (Debian's package). About 50x a plain run: ~2 minutes per scenario here.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_replay  # noqa: E402
from _trees import WORKTREE, installed, is_commit  # noqa: E402

CHILD = r"""
import runpy, sys
sys.argv = ["aisim", "predict", "-c", sys.argv[1], "--format", "json", "--output-dir", sys.argv[2], "--overwrite"]
runpy.run_module("aisim", run_name="__main__")
"""


def count(side: tuple[Path, str], config: Path, work: Path, name: str) -> int:
    tree, python = side
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONHASHSEED": "0"}
    subprocess.run([python, "-c", CHILD, str(config), str(work / f"warm-{name}")], cwd=tree.parent, env=env,
                   capture_output=True, check=True)
    out = work / f"callgrind-{name}.out"
    p = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", python, "-c", CHILD,
                        str(config), str(work / f"out-{name}")], cwd=tree.parent, env=env, capture_output=True,
                       text=True)
    m = re.search(r"Collected : (\d+)", p.stderr)
    if p.returncode != 0 or m is None:
        raise SystemExit(f"callgrind run of {name} failed: {p.stderr.strip()[-1500:]}")
    return int(m.group(1))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare", metavar="REV", required=True, help="the baseline commit")
    ap.add_argument("--trace", type=Path, default=bench_replay.DEFAULT_TRACE)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=29249)
    ap.add_argument("--timing", default="polynomial", choices=("polynomial", "default", "roofline"))
    ap.add_argument("--router", default="round_robin", choices=("round_robin", "random", "kv_router"))
    ap.add_argument("--engine-backend", default="vllm", choices=("vllm", "trtllm"))
    ap.add_argument("--disaggregated", nargs=2, type=int, metavar=("PREFILL", "DECODE"))
    ap.add_argument("--transfer-gb-s", type=float, default=50.0)
    ap.add_argument("--planner", action="store_true")
    args = ap.parse_args(argv)
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    if not is_commit(args.compare):
        raise SystemExit(f"{args.compare} is not a commit")
    keep = os.environ.get("AISIM_BENCH_IR_KEEP")  # a folder: keep the callgrind outputs there
    with tempfile.TemporaryDirectory(prefix="aisim-bench-ir-") as tmp:
        work = Path(keep) if keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        config = work / "config.yaml"
        config.write_text(bench_replay.render_config(args))
        with installed(args.compare, "aisim-ir-base-") as base, installed(WORKTREE, "aisim-ir-this-") as this:
            with ThreadPoolExecutor(2) as ex:
                b, t = ex.map(lambda a: count(*a), [(base, config, work, "base"), (this, config, work, "this")])
    print(f"instructions: {args.compare} {b:,}, this {t:,}, ratio {t / b:.4f}")


if __name__ == "__main__":
    main()
