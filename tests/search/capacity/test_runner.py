"""Capacity search end to end: the example config, the verdicts replayed alone, determinism (and
local == Ray), the trial cache re-deciding a changed SLA without replaying, timeouts, a failing
job isolated, and one-line errors for bad configs."""

from __future__ import annotations

import copy
import csv
import json
import os
import subprocess
import sys

import pytest
import yaml

from aisim.search.capacity.runner import run_capacity_search
from aisim.search.capacity.sla import SlaRule, evaluate_rules
from tests.conftest import ROOT

EXAMPLE = ROOT / "configs" / "capacity-search.yaml"


def example() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def results(out) -> str:
    return (out / "capacity_search_results.json").read_text()


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    base = tmp_path_factory.mktemp("cap")
    return run_capacity_search(EXAMPLE, base / "out", cache_dir=base / "cache", max_parallel=2), base


def _rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _replay_alone(run_dir, tmp_path) -> bool:
    """Replay a trial's saved predict config with aisim predict --csv and judge it with the example's SLA."""
    out = tmp_path / run_dir.name
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "aisim", "predict", "-c", str(run_dir / "config.yaml"), "--csv",
                        "--output-dir", str(out), "--format", "json"], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    rules = [SlaRule(**r) for r in example()["sla"]]
    ok, _ = evaluate_rules(rules, _rows(out / "request_metrics.csv"), _rows(out / "worker_timeline.csv"))
    return ok


def test_the_example_finds_each_jobs_max_qps_and_the_verdicts_hold_when_replayed_alone(first, tmp_path):
    result, base = first
    adaptive, linear = result.jobs
    assert (adaptive.job_name, adaptive.mode, linear.job_name, linear.mode) == (
        "round_robin", "adaptive", "kv_router_grid", "linear")
    assert adaptive.error is None and linear.error is None
    trace = adaptive.search_trace
    assert [t["qps"] for t in trace[:5]] == [4.0, 8.0, 16.0, 32.0, 64.0]  # doubling until the first failure
    best = adaptive.max_qps_under_sla
    assert best == max(t["qps"] for t in trace if t["passed"])
    lowest_fail = min(t["qps"] for t in trace if t["passed"] is False)
    assert (lowest_fail - best) / best * 100 <= 5  # min_search_granularity_pct
    assert [t["qps"] for t in linear.search_trace] == [20.0, 30.0, 40.0]
    runs = result.output_dir / "jobs" / f"round_robin_{adaptive.job_key}" / "runs"
    assert _replay_alone(runs / f"{best:.6g}", tmp_path) is True
    assert _replay_alone(runs / f"{lowest_fail:.6g}", tmp_path) is False
    summary = json.loads((runs.parent / "job_summary.json").read_text())
    assert summary["max_qps_under_sla"] == best and summary["num_trials"] == len(trace)
    trial = json.loads((runs / f"{best:.6g}" / "trial_result.json").read_text())
    assert set(trial) == {"qps", "passed", "timed_out", "cached", "sla_results"} and trial["passed"] is True
    rows = list(csv.reader((result.output_dir / "capacity_search_results.csv").read_text().splitlines()))
    assert rows[0] == ["job_name", "job_key", "max_qps_under_sla", "num_trials", "error"]


def test_the_same_config_gives_the_same_results_cached_or_not_and_on_ray(first, tmp_path, ray_session):
    result, base = first
    again = run_capacity_search(EXAMPLE, tmp_path / "again", use_cache=False, max_parallel=1)
    strip = lambda text: text.replace('"cached": true', '"cached": false')  # noqa: E731
    assert strip(results(again.output_dir)) == strip(results(result.output_dir))
    cached = run_capacity_search(EXAMPLE, tmp_path / "cached", cache_dir=base / "cache")
    assert '"cached": false' not in results(cached.output_dir)
    assert strip(results(cached.output_dir)) == strip(results(result.output_dir))
    ray = run_capacity_search(EXAMPLE, tmp_path / "ray", use_cache=False, backend="ray", max_parallel=1)
    assert strip(results(ray.output_dir)) == strip(results(result.output_dir))


def test_a_changed_sla_is_re_decided_from_the_cache_without_replaying(first, tmp_path, monkeypatch):
    result, base = first
    cfg = example()
    cfg["sla"][0]["threshold"] = 150  # p90 TTFT <= 150 ms: 20 QPS (~111 ms) passes, 30 (~165 ms) does not
    cfg["benchmark_base"]["traffic"]["source"]["type"] = "synthetic"
    import aisim.search.capacity.runner as runner

    def no_replay(item):  # pragma: no cover - the cache must answer
        raise AssertionError("replayed")

    monkeypatch.setattr(runner, "run_capacity_trial", no_replay)
    os.chdir(EXAMPLE.parent)
    linear = run_capacity_search(_linear_only(cfg), tmp_path / "out", cache_dir=base / "cache")
    [job] = linear.jobs
    assert job.error is None and all(t["cached"] for t in job.search_trace)
    assert job.max_qps_under_sla == 20.0  # 30 and 40 QPS now miss the 150 ms TTFT
    assert [t["passed"] for t in job.search_trace] == [True, False, False]


def _linear_only(cfg: dict) -> dict:
    out = copy.deepcopy(cfg)
    out["jobs"] = [j for j in out["jobs"] if "qps_list" in j]
    return out


def test_a_trial_past_the_timeout_stops_its_job_and_a_failing_job_is_isolated(tmp_path):
    cfg = example()
    cfg["search"]["benchmark_timeout"] = 0.01
    cfg["jobs"] = [{"name": "slow", "start_qps": 4}]
    [job] = run_capacity_search(cfg, tmp_path / "t", use_cache=False).jobs
    assert job.stopped == "timed_out" and job.search_trace[0]["timed_out"] is True and job.max_qps_under_sla is None
    cfg = example()
    cfg["jobs"].append({"name": "too_small", "qps_list": [4],
                        "benchmark_overrides": {"engine": {"workers": {"aggregated": {
                            "kv_cache": {"capacity": {"type": "default", "blocks": None, "memory_fraction": 0.01}}}}}}})
    result = run_capacity_search(cfg, tmp_path / "f", use_cache=False)
    assert [j.error is None for j in result.jobs] == [True, True, False]
    assert "the trial at 4 QPS failed" in result.jobs[2].error and result.failed
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    path = tmp_path / "f.yaml"
    path.write_text(yaml.safe_dump(cfg))
    p = subprocess.run([sys.executable, "-m", "aisim", "capacity", "-c", str(path), "--output-dir",
                        str(tmp_path / "cli"), "--no-cache", "--format", "json"], capture_output=True, text=True,
                       env=env, timeout=300)
    assert p.returncode == 1 and "a job failed" in p.stderr


def test_linear_jobs_inherit_the_shared_list_and_run_every_qps_without_an_sla(tmp_path):
    cfg = example()
    cfg.pop("sla")
    cfg["jobs"] = [{"name": "shared"}, {"name": "own", "qps_list": [2]}]
    cfg["search"]["qps_list"] = [1, 3]
    shared, own = run_capacity_search(cfg, tmp_path, use_cache=False).jobs
    assert [t["qps"] for t in shared.search_trace] == [1.0, 3.0] and [t["qps"] for t in own.search_trace] == [2.0]
    assert shared.max_qps_under_sla is None and all(t["passed"] is None for t in shared.search_trace)


@pytest.mark.parametrize("change,where,needle", [
    (lambda c: c["jobs"][0].update(qps_list=[1]), "jobs.0", "exactly one of start_qps"),
    (lambda c: c["jobs"][1].pop("qps_list"), "jobs.1", "set one of start_qps"),
    (lambda c: c.pop("sla"), "jobs.0.start_qps", "needs sla"),
    (lambda c: c["sla"][0].update(op="=<"), "sla.0.op", "Input should be"),
    (lambda c: c["sla"][0].update(metric="ttft"), "sla.0.metric", "request_scheduling_delay"),
    (lambda c: c["sla"][0].update(quantile=1.5), "sla.0.quantile", "less than or equal to 1"),
    (lambda c: c["jobs"][0].update(start_qps=-1), "jobs.0.start_qps", "greater than 0"),
    (lambda c: c["benchmark_base"].update(launch_server=True), "benchmark_base.launch_server", "its own replay"),
    (lambda c: c["benchmark_base"]["engine"].update(mode="hybrid"), "benchmark_base.engine.mode", "Input should be"),
    (lambda c: c["jobs"][1]["benchmark_overrides"].update(router={"policy": "best"}),
     "jobs.1.benchmark_overrides.router.policy", "Input should be"),
])
def test_bad_configs_fail_in_one_line_naming_the_key(change, where, needle, tmp_path):
    cfg = example()
    change(cfg)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "aisim", "capacity", "--config-path", str(path), "--output-dir",
                        str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert f"{where}:" in p.stderr and needle in p.stderr, p.stderr


def test_a_base_may_be_a_predict_config_file_with_overrides(tmp_path):
    from aisim.search.capacity.config import job_config, load_capacity_config

    cfg = {"benchmark_base": {"config": str(ROOT / "configs" / "quickstart.yaml"),
                              "set": {"engine.workers.aggregated.parallelism.replicas": 3}},
           "jobs": [{"name": "q", "qps_list": [2]}]}
    loaded, config_dir = load_capacity_config(data=cfg)
    mapping = job_config(loaded, loaded.jobs[0])
    assert mapping["engine"]["workers"]["aggregated"]["parallelism"]["replicas"] == 3
    assert config_dir == ROOT / "configs"  # the base's trace paths resolve next to it
    assert loaded.benchmark_timeout_s == 900.0


def test_every_shipped_search_config_loads():
    from aisim.search.capacity.config import load_capacity_config
    from aisim.search.spica.config import load_search_config

    for path in sorted((ROOT / "configs").glob("capacity-*.yaml")):
        load_capacity_config(path)
    for path in sorted((ROOT / "configs").glob("spica-*.yaml")):
        load_search_config(path)


def test_a_trial_returns_rows_and_its_files_are_those_rows_as_predict_writes_them(first):
    """A trial answers with data (its prediction and rows), not file text; the run directory's files
    are those rows rendered, and the SLA judged on the rows equals the SLA judged on the files."""
    from aisim.search.capacity.runner import TrialRows, run_capacity_trial

    _, base = first
    run_dir = sorted((base / "out" / "jobs").glob("*/runs/*"))[0]
    mapping = yaml.safe_load((run_dir / "config.yaml").read_text())
    rows = run_capacity_trial({"config": mapping, "config_dir": str(EXAMPLE.parent)})
    assert isinstance(rows, TrialRows)
    from aisim.simulator.metrics.summary import WALL_TIME_FIELDS

    files = rows.files()
    for name in ("request_metrics.csv", "worker_timeline.csv"):
        assert (run_dir / name).read_text() == files[name], name
    written, replayed = json.loads((run_dir / "prediction.json").read_text()), json.loads(files["prediction.json"])
    for doc in (written, replayed):
        for key in WALL_TIME_FIELDS:
            doc["summary"].pop(key)
    assert written == replayed
    rules = [SlaRule(**r) for r in example()["sla"]]
    on_files = evaluate_rules(rules, _rows(run_dir / "request_metrics.csv"), _rows(run_dir / "worker_timeline.csv"))
    assert rows.sla(rules) == on_files
    cached = TrialRows.from_cache(json.loads(json.dumps(rows.to_cache())))  # as the disk cache holds it
    assert cached.files() == rows.files() and cached.sla(rules) == on_files


def _tree(out) -> dict:
    """Every output file's text, trial wall times aside."""
    return {str(p.relative_to(out)): p.read_text() for p in sorted(out.rglob("*")) if p.is_file()
            and p.name != "prediction.json"}


@pytest.mark.parametrize("kind", ["start_qps", "qps_list"])
def test_idle_lanes_run_a_jobs_next_trials_and_change_no_output(kind, tmp_path, monkeypatch):
    import aisim.search.capacity.runner as runner

    cfg = example()
    cfg["jobs"] = [j for j in cfg["jobs"] if kind in j]  # one job: the second lane helps it
    calls: list[float] = []
    lanes: set[int] = set()
    replay = runner._Job.replay

    def counted(self, lane, qps):
        calls.append(qps)
        lanes.add(id(lane))
        return replay(self, lane, qps)

    monkeypatch.setattr(runner._Job, "replay", counted)
    monkeypatch.chdir(EXAMPLE.parent)
    two = run_capacity_search(cfg, tmp_path / "two", use_cache=False, max_parallel=2)
    ahead = list(calls)
    assert len(lanes) == 2  # the job's own lane and the idle one
    calls.clear()
    one = run_capacity_search(cfg, tmp_path / "one", use_cache=False, max_parallel=1)
    [job] = one.jobs
    assert calls == [t["qps"] for t in job.search_trace]  # one lane: each trial the search needs, in order
    if kind == "start_qps":  # two: trials ahead too, some never used
        assert len(ahead) > len(calls) and set(calls) <= set(ahead)
    else:  # a sweep needs every QPS: the same trials, two at a time
        assert sorted(ahead) == sorted(calls)
    assert _tree(two.output_dir) == _tree(one.output_dir)  # recorded only when used, in the search's order
    runs = {p.name for p in (tmp_path / "two" / "jobs").glob("*/runs/*")}
    assert len(runs) == len(job.search_trace)


def test_a_growing_adaptive_chain_takes_the_lanes_before_a_sweep(tmp_path, monkeypatch):
    """Two lanes, an adaptive job and a sweep: the first two trials started are the adaptive
    job's first and the one it needs if that passes (its chain), not the sweep's first."""
    import threading

    import aisim.search.capacity.runner as runner

    started: list[tuple[str, float]] = []
    lock = threading.Lock()
    replay = runner._Job.replay

    def counted(self, lane, qps):
        with lock:
            started.append((self.job.name, qps))
        return replay(self, lane, qps)

    monkeypatch.setattr(runner._Job, "replay", counted)
    monkeypatch.chdir(EXAMPLE.parent)
    r = run_capacity_search(example(), tmp_path / "o", use_cache=False, max_parallel=2)
    assert set(started[:2]) == {("round_robin", 4.0), ("round_robin", 8.0)}
    assert {q for name, q in started if name == "kv_router_grid"} == {20.0, 30.0, 40.0}
    assert [j.max_qps_under_sla for j in r.jobs] == [37.0, 30.0]


def test_a_lane_that_cannot_start_stops_the_search_with_its_error(tmp_path, monkeypatch):
    """No worker, no search: the lane's error reaches the caller (as before lanes were shared),
    rather than each job recording it."""
    import aisim.search.capacity.runner as runner

    def broken(self, backend, ray_address):
        raise RuntimeError("no workers here")

    monkeypatch.setattr(runner._Lane, "__init__", broken)
    with pytest.raises(RuntimeError, match="no workers here"):
        run_capacity_search(example(), tmp_path / "o", use_cache=False, max_parallel=2)



def test_a_trial_ahead_still_running_when_every_search_is_done_is_stopped(monkeypatch):
    """The dispatcher with two lanes and a job that needs trial 1 and starts trial 2 ahead: once
    the job is done, trial 2's lane is aborted rather than waited for."""
    import threading
    import time

    import aisim.search.capacity.runner as runner

    class Fan:
        def __init__(self):
            self.aborted = threading.Event()

        def abort(self):
            self.aborted.set()

        def close(self):
            pass

    class Lane:
        def __init__(self, backend, ray_address):
            self.fan = Fan()

        def close(self):
            pass

    class Plan:
        done = False

        def next_qps(self):
            return None if self.done else 1.0

    class Job:
        index = 0

        def begin(self):
            self.sequencer, self.running, self.ready, self.result = Plan(), set(), {}, None
            self.ahead_lane = None

        def candidates(self, lanes):
            todo = [] if self.result is not None else [q for q in (1.0, 2.0) if q not in self.running | set(self.ready)]
            return [((0 if q == 1.0 else 3, 0, 0), q) for q in todo]

        def advance(self):
            if 1.0 in self.ready:
                self.sequencer.done = True
                self.result = "done"

        def finish(self, out, exc):
            self.result = exc

        def replay(self, lane, qps):
            if qps == 2.0:  # a long trial ahead: ends only when its lane is aborted
                self.ahead_lane = lane
                assert lane.fan.aborted.wait(30)
                return "stopped"
            time.sleep(0.2)
            return "used"

    monkeypatch.setattr(runner, "_Lane", Lane)
    job = Job()
    t0 = time.monotonic()
    runner._dispatch([job], 2, "local", None)
    assert time.monotonic() - t0 < 10 and job.result == "done"
    assert job.ahead_lane is not None and job.ahead_lane.fan.aborted.is_set()
