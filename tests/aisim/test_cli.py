"""The command line as a user runs it: exit codes, one-line errors, outputs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT, SLICE


def aisim(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "aisim", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def one_line_error(p, code=2):
    assert p.returncode == code, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    return p.stderr.strip()


def test_predict_without_arguments_runs_the_bundled_quickstart(tmp_path):
    p = aisim("predict", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "LLM Metrics" in p.stdout and "Time to First Token (ms)" in p.stdout
    assert list(tmp_path.iterdir()) == []  # nothing written without --output-dir


def test_outputs_json_format_and_overwrite(tmp_path):
    out = tmp_path / "out"
    p = aisim("predict", "--output-dir", str(out), "--format", "json", "--capture-per-request")
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    pred = json.loads((out / "prediction.json").read_text())
    assert pred["summary"]["completed_requests"] == summary["completed_requests"] == 1000
    assert pred["coverage"]["per_request_records"] == 1000
    assert pred["per_request"] == {"path": "requests.jsonl", "records": 1000}  # the records live in requests.jsonl
    rows = (out / "requests.jsonl").read_text().splitlines()
    assert len(rows) == 1000 and list(json.loads(rows[0])) == sorted(json.loads(rows[0]))
    assert json.loads((out / "resource-runtime.json").read_text())["status"] == "completed"
    assert not [f for f in out.iterdir() if f.name.endswith(".tmp")]
    assert sorted(f.name for f in out.parent.iterdir()) == ["out"]  # no staging directory, no lock left
    err = one_line_error(aisim("predict", "--output-dir", str(out)))
    assert "not empty" in err and "--overwrite" in err
    assert aisim("predict", "--output-dir", str(out), "--overwrite").returncode == 0
    assert not (out / "requests.jsonl").exists()  # --overwrite removed the old known outputs


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--set", "engine.workers.aggregated.schedulr.max_batched_tokens=5"], "Extra inputs are not permitted"),
        (["--set", "engine.workers.aggregated.parallelism.replicas=two"], "engine.workers.aggregated.parallelism.replicas"),
        (["--set", "traffic.source.paths=[/nonexistent/trace.jsonl]"], "not found"),
        (["--set", "traffic.source.paths.0=x"], "list indexes are not supported"),
        (["--set", "router.host_cache_hit_weight=0.5"], "set router.policy: kv_router or remove it"),
        (["--config", "/nonexistent.yaml"], "not found"),
        (["--bogus-flag"], "unrecognized arguments"),
        (["--format", "xml"], "invalid choice"),
        (["--capture-per-request"], "needs --output-dir"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, needle):
    err = one_line_error(aisim("predict", *args))
    assert needle in err


def test_malformed_trace_row_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(SLICE.read_text().splitlines()[0] + "\n" + '{"timestamp": 1, "hash_ids": [1]}\n')
    out = tmp_path / "out"
    err = one_line_error(aisim("predict", "--set", f"traffic.source.paths=[{bad}]", "--output-dir", str(out)))
    assert f"{bad}:2" in err and "output_length" in err
    assert not out.exists()  # nothing half-written


def test_resource_limit_exits_3_and_records_why(tmp_path):
    out = tmp_path / "out"
    err = one_line_error(aisim("predict", "--set", "execution.resources.memory_limit_gb=0.001", "--output-dir", str(out)), code=3)
    assert "memory_limit" in err
    rt = json.loads((out / "resource-runtime.json").read_text())
    assert rt["status"] == "resource_limited" and rt["exit_code"] == 3
    assert not (out / "prediction.json").exists()



def test_a_run_at_its_resource_limit_leaves_a_previous_runs_outputs_alone(tmp_path):
    out = tmp_path / "out"
    assert aisim("predict", "--set", "traffic.stop={max_virtual_time_seconds: 5}", "--output-dir", str(out)).returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    one_line_error(aisim("predict", "--set", "execution.resources.memory_limit_gb=0.001", "--output-dir", str(out),
                         "--overwrite"), code=3)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def _clock_after_import(monkeypatch, step_s: float, start_s: float = 0.0):
    """From now on ``time.perf_counter`` reads ``start_s`` later than the real clock, plus ``step_s``
    more on every read: simulated time, no sleeping."""
    import time

    real, reads = time.perf_counter, []

    def fake():
        reads.append(None)
        return real() + start_s + step_s * len(reads)

    monkeypatch.setattr(time, "perf_counter", fake)


def _small_predict(tmp_path, timeout_s):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(SLICE.read_text().splitlines()[:20]) + "\n")
    return ["predict", "--format", "json", "--set", f"traffic.source.paths=[{trace}]",
            "--set", f"execution.resources.initialization_timeout_seconds={timeout_s}"]


def test_initialisation_timeout_counts_from_the_command_not_the_import(tmp_path, monkeypatch, capsys):
    from aisim import cli  # imported early, as a test session or a long-lived host process does

    _clock_after_import(monkeypatch, step_s=0.0, start_s=3600.0)  # an hour passes before the command runs
    assert cli.main(_small_predict(tmp_path, 30)) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["completed_requests"] == 20


def test_slow_initialisation_still_times_out(tmp_path, monkeypatch, capsys):
    from aisim import cli

    _clock_after_import(monkeypatch, step_s=100.0)  # every clock read is 100 s after the previous one
    assert cli.main(_small_predict(tmp_path, 30)) == 124
    err = capsys.readouterr().err
    assert "initialisation took" in err and "initialization_timeout_seconds" in err and len(err.strip().splitlines()) == 1


def test_the_setup_runs_without_garbage_collection_and_the_replay_with_it(tmp_path, monkeypatch, capsys):
    import gc

    import aisim.simulator.plan
    import aisim.simulator.run
    from aisim import cli

    seen = {}
    plan_from_config, run_plan = aisim.simulator.plan.plan_from_config, aisim.simulator.run.run_plan

    def plan(*a, **k):
        seen["plan"] = gc.isenabled()
        return plan_from_config(*a, **k)

    def run(*a, **k):
        seen["run"] = gc.isenabled()
        return run_plan(*a, **k)

    monkeypatch.setattr(aisim.simulator.plan, "plan_from_config", plan)
    monkeypatch.setattr(aisim.simulator.run, "run_plan", run)
    assert gc.isenabled()
    assert cli.main(_small_predict(tmp_path, 30)) == 0, capsys.readouterr().err
    assert seen == {"plan": False, "run": True} and gc.isenabled()
    # a failing setup leaves the collector as it found it
    assert cli.main(["predict", "--set", "traffic.source.paths=[missing.jsonl]"]) == 2
    assert gc.isenabled()


def test_worker_timeline_csv_covers_every_worker_and_needs_an_output_dir(tmp_path):
    out = tmp_path / "out"
    p = aisim("predict", "--output-dir", str(out), "--capture-worker-timeline",
              "--set", "traffic.stop={max_virtual_time_seconds: 20}")
    assert p.returncode == 0, p.stderr
    lines = (out / "worker_timeline.csv").read_text().splitlines()
    assert lines[0] == "worker_id,role,start_s,duration_s,queue_depth_waiting,queue_depth_running,kv_blocks_used,kv_usage"
    rows = [line.split(",") for line in lines[1:]]
    assert {r[0] for r in rows} == {"0", "1"}  # the quickstart's two workers
    for wid in ("0", "1"):
        mine = [r for r in rows if r[0] == wid]
        assert float(mine[0][2]) == 0.0 and all(float(r[3]) > 0 for r in mine)
        # intervals tile the worker's time: each starts where the previous ended
        for a, b in zip(mine, mine[1:]):
            assert abs(float(a[2]) + float(a[3]) - float(b[2])) < 1e-9
    assert "worker_timeline.csv" in one_line_error(aisim("predict", "--capture-worker-timeline"))


RETUNE_SETS = ["--set", "traffic.source.format=dynamo", "--set", "traffic.source.paths=[data/conversation_slice_dynamo.jsonl]",
               "--set", "router={policy: kv_router, temperature: 1.0}",
               "--set", "planner={policy: enabled, enable_load_scaling: false, enable_throughput_scaling: false, "
                        "retune: {interval_seconds: 120, grace_seconds: 10, max_parallel: 1, "
                        "router: {overlap_score_credit: 1.0, prefill_load_scale: 1.0, temperature: [0.0, 1.0]}}}"]


def test_predict_retunes_and_shows_a_progress_line_per_window_only_on_a_terminal(tmp_path):
    import pty

    p = aisim("predict", *RETUNE_SETS, "--output-dir", str(tmp_path / "out"), "--format", "json")
    assert p.returncode == 0, p.stderr
    assert "retune window" not in p.stderr  # not a terminal
    events = json.loads((tmp_path / "out" / "prediction.json").read_text())["planner"]["retune_events"]
    assert [e["decided_at_s"] for e in events] == [135.0, 255.0] and all(len(e["candidates"]) == 2 for e in events)
    master, slave = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "aisim", "predict", *RETUNE_SETS], stdout=subprocess.DEVNULL,
                            stderr=slave, env=env, cwd=tmp_path)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=120) == 0
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode())  # the live display's control codes
    lines = [ln for ln in re.split(r"[\r\n]+", text) if ln.startswith("retune window")]
    assert len(lines) == 2 and lines[0].startswith("retune window 1/2: 2 candidates on ")
    assert all(" -> " in ln for ln in lines)


def test_recommend_rejects_a_bad_search_config_in_one_line(tmp_path):
    cfg = tmp_path / "s.yaml"
    cfg.write_text("engine: {model: meta-llama/Llama-3.1-8B-Instruct, hardware: h200_sxm}\n"
                   "workload: {isl: 128, osl: 8, request_rate: 1, request_count: 4}\n"
                   "search_space: {deployment_mode: [agg], agg_max_num_seqs: 12}\n")
    err = one_line_error(aisim("recommend", "-c", str(cfg), "--output-dir", str(tmp_path / "out")))
    assert "search_space.agg_max_num_seqs" in err
    err = one_line_error(aisim("recommend", "-c", str(tmp_path / "missing.yaml"), "--output-dir", str(tmp_path / "o")))
    assert "missing.yaml" in err
    err = one_line_error(aisim("recommend", "-c", str(cfg), "--output-dir", str(tmp_path / "o"), "--parallelism", "0"))
    assert "--parallelism" in err


def test_version():
    from aisim import __version__

    p = aisim("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"aisim {__version__}"


def test_validate_prints_the_resolved_config_and_fails_in_one_line(tmp_path):
    p = aisim("validate", "-c", str(ROOT / "configs" / "quickstart.yaml"), "--format", "json")
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["kind"] == "predict" and report["pools"][0]["provenance"]["kv_capacity_blocks_per_rank"] == 29249
    err = one_line_error(aisim("validate", "-c", str(ROOT / "configs" / "quickstart.yaml"), "--set", "router.policy=x"))
    assert "router.policy" in err


def test_compare_runs_side_by_side_and_rejects_a_missing_directory(tmp_path):
    for name in ("a", "b"):
        p = aisim("predict", "--output-dir", str(tmp_path / name), "--format", "json", cwd=tmp_path)
        assert p.returncode == 0, p.stderr
    p = aisim("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--format", "json")
    assert p.returncode == 0, p.stderr
    rows = {r["metric"]: r for r in json.loads(p.stdout)["rows"]}
    assert rows["gpu_hours"]["deltas"] == [None, 0] or rows["gpu_hours"]["deltas"] == [None, 0.0]
    err = one_line_error(aisim("compare", str(tmp_path / "a"), str(tmp_path / "missing")))
    assert "missing" in err


# -- the process's exit (aisim.cli.run) ----------------------------------------------------------
_EXIT_PROBE = """
import atexit, sys, threading, time
from pathlib import Path
atexit.register(lambda: sys.stdout.write("exit handler ran\\n"))
if sys.argv[1] == "thread":  # a non-daemon thread still working when the command returns
    started = threading.Event()
    def late(path=Path(sys.argv[2])):
        started.set()
        time.sleep(3.0)
        path.write_text("done")
    threading.Thread(target=late).start()
    started.wait()
sys.argv = ["aisim", *sys.argv[3:]]
from aisim.cli import run
run()
"""


def _probe(tmp_path, mode, *args, full=False):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("AISIM_FULL_EXIT", None)
    if full:
        env["AISIM_FULL_EXIT"] = "1"
    return subprocess.run([sys.executable, "-c", _EXIT_PROBE, mode, str(tmp_path / "late.txt"), *args],
                          capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("full", [False, True])
def test_the_process_exit_runs_exit_handlers_flushes_and_keeps_the_code(tmp_path, full):
    p = _probe(tmp_path, "plain", "predict", "--format", "json", full=full)
    assert p.returncode == 0, p.stderr
    assert p.stdout.rstrip("\n").endswith("exit handler ran")
    summary = json.loads(p.stdout[: p.stdout.rindex("exit handler ran")])
    assert summary["completed_requests"] > 0
    bad = _probe(tmp_path, "plain", "predict", "-c", str(tmp_path / "missing.yaml"), full=full)
    assert bad.returncode == 2 and "config file not found" in bad.stderr
    assert bad.stdout == "exit handler ran\n"


def test_the_process_exit_waits_for_a_running_thread(tmp_path):
    p = _probe(tmp_path, "thread", "predict", "--format", "json")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "late.txt").read_text() == "done"
    assert p.stdout.rstrip("\n").endswith("exit handler ran")
