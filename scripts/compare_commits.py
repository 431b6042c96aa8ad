#!/usr/bin/env python
"""Same outputs before and after a change: every bundled config run at two commits, compared byte for byte.

    python scripts/compare_commits.py BEFORE              # BEFORE vs the working tree
    python scripts/compare_commits.py BEFORE AFTER        # two commits
    python scripts/compare_commits.py BEFORE --configs quickstart.yaml spica-grid-16.yaml

Each side is built the way a user gets it: a wheel of that tree (``pip wheel --no-deps``, offline)
unpacked into a fresh virtual environment that borrows this environment's dependencies, so the
two sides never share a module whatever their package layout. Every ``configs/*.yaml`` (or the
names given) runs on both sides from its own tree, in a fresh HOME and output directory:

- predict configs: ``aisim predict --capture-per-request --csv`` (prediction.json, requests.jsonl,
  request_metrics.csv, worker_timeline.csv and the Planner CSVs; retune configs write their sweep
  ledger into prediction.json's planner section);
- search configs (``search_space:``): ``aisim recommend`` (recommendation.json/.csv, every
  recommended YAML and DGD, the Optuna journal);
- capacity configs (``benchmark_base:``): ``aisim capacity`` (results, job summaries, every trial's
  prediction.json and trial_result.json).

Files are compared after dropping what is wall time or identity of the run, not of the model
(an Optuna journal as the multiset of its operations: candidates are told as they finish):
wall-time fields (``wall_time_ms`` ...), creation stamps, the journal's worker ids, datetimes and
study claims (the claim ops themselves: their heartbeats follow the wall clock), and
``resource-runtime.json``; each side's tree and output paths read as ``<tree>`` and ``<out>``.
``--allow-new-keys`` additionally ignores keys only the after side has
(a field added on purpose). Exit 0 when every file matches, 1 otherwise (each difference
named), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _trees import WORKTREE, installed, is_commit  # noqa: E402

#: keys that hold wall time or the identity of one run, at any depth of a JSON document
VOLATILE_KEYS = {"processed_tokens_per_s", "processed_output_tokens_per_s",  # tokens per wall second
                 "created_at", "datetime_start", "datetime_complete", "worker_id",
                 "aisim_claim"}  # a study's claim: which process holds it, its heartbeat


def volatile(key: str) -> bool:
    """Wall time (any key naming it: wall_time_ms, planner_wall_s, sweep_wall_s ...) or run identity."""
    return key in VOLATILE_KEYS or "wall" in key
SKIP_FILES = {"resource-runtime.json"}


def kind_of(config: Path) -> str:
    import yaml

    doc = yaml.safe_load(config.read_text()) or {}
    if "search_space" in doc or "optimization" in doc or "optimizer" in doc:
        return "recommend"  # (either form of a search, as aisim.validate.detect_kind tells them)
    if "benchmark_base" in doc:
        return "capacity"
    return "predict"


def run_config(py: str, tree: Path, name: str, out: Path, home: Path) -> tuple[int, str]:
    config = tree / "configs" / name
    kind = kind_of(config)
    extra = ["--capture-per-request", "--csv"] if kind == "predict" else []
    home.mkdir(parents=True, exist_ok=True)
    (home / "ray_bootstrap_config.yaml").write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1", COLUMNS="200")
    p = subprocess.run([py, "-m", "aisim", kind, "-c", str(config), "--output-dir", str(out), *extra],
                       capture_output=True, text=True, cwd=home, env=env)
    return p.returncode, p.stderr[-1500:]


def _strip(x, new_keys: set[str] | None = None):
    if isinstance(x, dict):
        return {k: _strip(v, new_keys) for k, v in x.items() if not volatile(k) and k not in (new_keys or ())}
    if isinstance(x, list):
        return [_strip(v, new_keys) for v in x]
    return x


def _keys(x, into: set[str]) -> set[str]:
    if isinstance(x, dict):
        for k, v in x.items():
            into.add(k)
            _keys(v, into)
    elif isinstance(x, list):
        for v in x:
            _keys(v, into)
    return into


def normalized(path: Path, text: str, new_keys: set[str] | None) -> object:
    if path.suffix == ".json":
        return _strip(json.loads(text), new_keys)
    if path.suffix == ".journal":  # candidates are told as they finish: the ops as a multiset
        ops = [_strip(json.loads(line), new_keys) for line in text.splitlines() if line.strip()]
        # an op left with nothing once the volatile keys are gone (a study claim's heartbeat,
        # written once a wall-clock minute: a longer run writes more of them) says nothing either
        ops = [op for op in ops if not (isinstance(op.get("system_attr"), dict) and not op["system_attr"])]
        return sorted(ops, key=lambda op: json.dumps(op, sort_keys=True))
    if path.suffix == ".jsonl":
        return [_strip(json.loads(line), new_keys) for line in text.splitlines() if line.strip()]
    if path.suffix == ".csv":
        rows = list(csv.reader(io.StringIO(text)))
        if not rows:
            return rows
        keep = [i for i, h in enumerate(rows[0]) if not volatile(h) and h not in (new_keys or ())]
        return [[r[i] for i in keep if i < len(r)] for r in rows]
    return text


def first_difference(a, b, where: str = "") -> str:
    if type(a) is not type(b):
        return f"{where or '.'}: {a!r:.80} != {b!r:.80}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{where}.{k}: only {'after' if k not in a else 'before'}"
            if a[k] != b[k]:
                return first_difference(a[k], b[k], f"{where}.{k}")
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{where}: {len(a)} items != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return first_difference(x, y, f"{where}[{i}]")
    return f"{where or '.'}: {a!r:.80} != {b!r:.80}"


def compare_dirs(before: Path, after: Path, allow_new_keys: bool, trees: tuple[Path, Path] | None = None) -> list[str]:
    """The differences between two output directories; ``trees``: each side's tree, whose path a
    file may name (a study records its config's directory) and which is compared as ``<tree>``."""
    files_a = {p.relative_to(before) for p in before.rglob("*") if p.is_file() and p.name not in SKIP_FILES}
    files_b = {p.relative_to(after) for p in after.rglob("*") if p.is_file() and p.name not in SKIP_FILES}
    problems = [f"{f}: only before" for f in sorted(files_a - files_b)]
    problems += [f"{f}: only after" for f in sorted(files_b - files_a)]
    for rel in sorted(files_a & files_b):
        ta, tb = (before / rel).read_text(), (after / rel).read_text()
        ta, tb = ta.replace(str(before), "<out>"), tb.replace(str(after), "<out>")  # (a study records it)
        if trees is not None:
            ta, tb = ta.replace(str(trees[0]), "<tree>"), tb.replace(str(trees[1]), "<tree>")
        if ta == tb:
            continue
        new = None
        if allow_new_keys and rel.suffix in (".json", ".jsonl", ".journal"):
            load = json.loads if rel.suffix == ".json" else (lambda t: [json.loads(x) for x in t.splitlines() if x])
            new = _keys(load(tb), set()) - _keys(load(ta), set())
        elif allow_new_keys and rel.suffix == ".csv":
            new = set(tb.partition("\n")[0].split(",")) - set(ta.partition("\n")[0].split(","))
        na, nb = normalized(rel, ta, new), normalized(rel, tb, new)
        if na != nb:
            problems.append(f"{rel}: {first_difference(na, nb)}")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", help="a commit (anything git rev-parse takes)")
    ap.add_argument("after", nargs="?", default=WORKTREE, help="a commit (default: the working tree)")
    ap.add_argument("--configs", nargs="+", help="config file names under configs/ (default: every *.yaml)")
    ap.add_argument("--allow-new-keys", action="store_true", help="ignore keys that only the after side writes")
    ap.add_argument("--keep", type=Path, help="keep both sides' outputs here")
    args = ap.parse_args()
    for rev in (args.before, args.after):
        if not is_commit(rev):
            print(f"compare_commits: error: {rev} is not a commit; give a commit id or branch", file=sys.stderr)
            return 2
    work = Path(tempfile.mkdtemp(prefix="aisim-compare-"))
    try:
        with ExitStack() as stack:
            sides = {label: stack.enter_context(installed(rev)) for label, rev in (("before", args.before),
                                                                                 ("after", args.after))}
            return _compare(args, sides, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _compare(args, sides: dict, work: Path) -> int:
    """Run every config on both sides; print one line per config (and its first differences)."""
    names = args.configs or sorted(p.name for p in (sides["after"][0] / "configs").glob("*.yaml"))
    failed = 0
    for name in names:
        if not (sides["before"][0] / "configs" / name).exists():
            print(f"{name}: new (not in the baseline)")
            continue
        outs = {}
        for label, (tree, py) in sides.items():
            out = work / "out" / label / name.removesuffix(".yaml")
            rc, err = run_config(py, tree, name, out, work / "home" / label / name)
            if rc not in (0, 1):
                print(f"{name}: {label} exited {rc}: {err.strip().splitlines()[-1] if err.strip() else ''}")
            outs[label] = out
        problems = compare_dirs(outs["before"], outs["after"], args.allow_new_keys,
                                (sides["before"][0], sides["after"][0]))
        count = sum(1 for p in outs["after"].rglob("*") if p.is_file())
        print(f"{name}: {'identical' if not problems else 'DIFFERENT'} ({count} files)")
        for p in problems[:10]:
            print(f"  {p}")
        failed += bool(problems)
    if args.keep:
        shutil.copytree(work / "out", args.keep, dirs_exist_ok=True)
    print(f"{len(names) - failed} of {len(names)} configs identical")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
