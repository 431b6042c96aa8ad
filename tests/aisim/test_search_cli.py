"""The command line around searches and runs, as a user meets it: each command refuses another
command's config naming the right one, capacity takes --set, compare warns when the runs replayed
different traffic, --csv writes the Planner's events and replica counts, a tensor split the model
cannot take is refused under every timing model, and off a terminal the table honours COLUMNS."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from aisim.compare import traffic_warning
from tests.conftest import ROOT

ENV = dict(os.environ, PYTHONPATH=str(ROOT))
CONFIGS = ROOT / "configs"


def aisim(*args, env=None, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "aisim", *args], env=env or ENV, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("command, config, kind", [
    ("predict", "capacity-search.yaml", "capacity"), ("predict", "spica-grid-16.yaml", "recommend"),
    ("recommend", "quickstart.yaml", "predict"), ("capacity", "spica-agg-vs-disagg.yaml", "recommend"),
    ("recommend", "capacity-search.yaml", "capacity"), ("capacity", "quickstart.yaml", "predict")])
def test_a_config_of_another_kind_names_the_command_that_runs_it(tmp_path, command, config, kind):
    path = f"configs/{config}"
    extra = ["--output-dir", str(tmp_path / "o")] if command != "predict" else []
    p = aisim(command, "-c", path, *extra, cwd=ROOT)
    tail = " --output-dir DIR" if kind != "predict" else ""
    assert p.returncode == 2 and p.stderr == (f"aisim {command}: error: --config: {path} is a {kind} config, not a "
                                              f"{command} one: run `aisim {kind} -c {path}{tail}`\n")
    assert not (tmp_path / "o").exists()


def test_capacity_takes_set_and_an_sla_change_reuses_the_cache(tmp_path):
    from aisim.search.capacity import run_capacity_search

    cache = tmp_path / "cache"
    first = run_capacity_search(CONFIGS / "capacity-search.yaml", tmp_path / "a", cache_dir=cache,
                                overrides=["jobs=[{name: rr, qps_list: [10, 40]}]"])
    assert [j.job_name for j in first.jobs] == ["rr"] and first.jobs[0].max_qps_under_sla == 10
    assert first.jobs[0].search_trace[1]["decided_early"]  # 40 QPS: proved p90 TTFT > 1000 ms
    # a stricter p90 TTFT: 10 QPS re-judged from its cached rows, 40 QPS answered by its proof
    strict = run_capacity_search(CONFIGS / "capacity-search.yaml", tmp_path / "b", cache_dir=cache,
                                 overrides=["jobs=[{name: rr, qps_list: [10, 40]}]",
                                            "sla=[{metric: ttft_ms, quantile: 0.9, threshold: 0.001, op: \"<=\"}]"])
    trace = strict.jobs[0].search_trace
    assert strict.jobs[0].max_qps_under_sla is None and all(t["cached"] for t in trace)
    assert [t.get("decided_early", False) for t in trace] == [False, True]
    p = aisim("capacity", "-c", "configs/capacity-search.yaml", "--output-dir", str(tmp_path / "c"),
              "--set", "search.nope=1", cwd=ROOT)
    assert p.returncode == 2 and "search.nope" in p.stderr and p.stderr.count("\n") == 1


def test_compare_warns_when_the_runs_replayed_different_traffic(tmp_path):
    runs = [{"name": "a", "summary": {"num_requests": 10, "traffic_digest": "x"}},
            {"name": "b", "summary": {"num_requests": 10, "traffic_digest": "x"}}]
    assert traffic_warning(runs) is None
    runs[1]["summary"]["traffic_digest"] = "y"
    assert traffic_warning(runs) == ("the runs replayed different traffic: a and b offered 10 requests each, but not "
                                     "the same ones (traffic_digest x vs y); the deltas compare different workloads")
    runs[1]["summary"] = {"num_requests": 12}  # an older run without a digest: by count
    assert traffic_warning(runs).startswith("the runs replayed different traffic: a offered 10 requests, b 12;")
    for name, sets in (("one", []), ("same", []), ("fast", ["--set", "traffic.load.speedup=2"])):
        assert aisim("predict", "--output-dir", str(tmp_path / name), *sets).returncode == 0
    same = aisim("compare", str(tmp_path / "one"), str(tmp_path / "same"))
    assert same.returncode == 0 and same.stderr == ""
    diff = aisim("compare", str(tmp_path / "one"), str(tmp_path / "fast"))
    assert diff.returncode == 0 and diff.stderr.startswith("aisim compare: warning: the runs replayed different")
    assert diff.stderr.count("\n") == 1 and str(tmp_path / "fast") in diff.stdout  # the deltas stay


def test_csv_writes_the_planners_events_and_replica_counts(tmp_path):
    p = aisim("predict", "-c", "configs/planner-aggregated.yaml", "--output-dir", str(tmp_path / "o"), "--csv",
              "--set", "traffic.stop={max_virtual_time_seconds: 600}", cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr
    planner = json.loads((tmp_path / "o" / "prediction.json").read_text())["planner"]
    events = list(csv.DictReader(open(tmp_path / "o" / "planner_events.csv")))
    assert events and len(events) == len(planner["scaling_events"])
    for row, e in zip(events, planner["scaling_events"]):
        assert (float(row["time_s"]), row["component"], int(row["from_count"]), int(row["to_count"]),
                row["reason"]) == (e["at_s"], e["component"], e["from_count"], e["to_count"], e["reason"])
    replicas = list(csv.DictReader(open(tmp_path / "o" / "planner_replicas.csv")))
    ops = planner["lifecycle_operations"]
    assert len(replicas) == len(ops)
    assert [(float(r["time_s"]), int(r["active"])) for r in replicas] == \
        [(op["at_ms"] / 1000, op["state_after_batch"]["active"]) for op in ops]


@pytest.mark.parametrize("timing", ["polynomial", "fixed", "roofline"])
def test_a_tensor_split_the_model_cannot_take_is_refused_under_every_timing_model(timing):
    p = aisim("predict", "--set", "engine.workers.aggregated.parallelism.tensor=3",
              "--set", f"engine.workers.aggregated.timing={{type: {timing}}}" if timing != "fixed" else
              "engine.workers.aggregated.timing={type: fixed, prefill_ms: 10, decode_ms: 1}")
    assert p.returncode == 2
    assert p.stderr == ("aisim predict: error: engine.workers.aggregated.parallelism.tensor: 3 does not divide "
                        "meta-llama/Llama-3.1-8B-Instruct's 32 attention heads; use 1, 2, 4 or 8\n")


def test_off_a_terminal_the_table_honours_columns():
    wide = aisim("predict", env={k: v for k, v in ENV.items() if k != "COLUMNS"})
    narrow = aisim("predict", env={**ENV, "COLUMNS": "100"})
    assert max(map(len, wide.stdout.splitlines())) > 120
    assert max(map(len, narrow.stdout.splitlines())) <= 100


def _processes_marked(mark: str) -> list[int]:
    """Live processes whose environment holds ``AISIM_TEST_MARK=mark``."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/environ", "rb") as fh:
                    if f"AISIM_TEST_MARK={mark}".encode() in fh.read().split(b"\0"):
                        out.append(int(d))
            except OSError:
                pass
    return out


@pytest.mark.parametrize("flags", [[], ["--max-parallel", "1"], ["--backend", "local"], ["--help"]])
def test_a_capacity_run_leaves_no_process_behind(tmp_path, flags):
    """The zygote starts before the flags are parsed and the process ends without the
    interpreter's teardown: still nothing of it (zygote, workers) outlives the command."""
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc")
    mark = f"{os.getpid()}-{len(flags)}-{tmp_path.name}"
    env = dict(ENV, AISIM_TEST_MARK=mark)
    p = aisim("capacity", "-c", str(CONFIGS / "capacity-search.yaml"), "--output-dir", str(tmp_path / "o"),
              "--no-cache", *flags, env=env)
    assert p.returncode == 0, p.stderr
    assert ("max QPS under SLA 37" in p.stdout) != ("--help" in flags)
    assert _processes_marked(mark) == []
