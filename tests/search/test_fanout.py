"""search.fanout: the same results, in item order, on every backend and for every max_parallel;
failures and timeouts are records, not aborted batches; workers never outlive their parent."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from aisim.search.fanout import fanout
from aisim.search.trial import TrialResult, run_dumped_trial, run_trial
from aisim.simulator.config.loading import load_config
from aisim.simulator.plan import dump_plan, plan_from_config
from aisim.simulator.runtime.resources import descendants
from tests.conftest import ROOT
from tests.search import tasks

QUICKSTART = ROOT / "configs" / "quickstart.yaml"
STOP = "traffic.stop={max_virtual_time_seconds: 20}"
VARIANTS = (  # small plans over one workload: router policy and replicas differ
    ["router.policy=round_robin"],
    ["router.policy=kv_router"],
    ["router.policy=random", "engine.workers.aggregated.parallelism.replicas=3"],
    ["router.policy=kv_router", "engine.workers.aggregated.parallelism.replicas=1"],
)
SQUARES = [0, 1, 4,
           TrialResult("failed", "kv_capacity", "engine.workers.aggregated.kv_cache.capacity: holds no block", None),
           16, TrialResult("failed", "runtime", "ZeroDivisionError: five", None), 36]


@pytest.fixture(scope="module")
def plans():
    out = []
    for overrides in VARIANTS:
        cfg, cdir = load_config(QUICKSTART, [STOP, *overrides])
        out.append(plan_from_config(cfg, cdir))
    assert len({p.traffic.workload.digest for p in out}) == 1
    return out


@pytest.fixture(scope="module")
def expected(plans):
    results = [run_trial(p) for p in plans]
    assert all(r.ok for r in results)
    assert len({repr(sorted(r.metrics.items())) for r in results}) == len(results)  # the plans differ
    return results


@pytest.fixture(scope="module")
def local2(plans):
    with fanout("local", 2, workloads=[plans[0].traffic.workload]) as fo:
        yield fo


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its reaper is not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def wait_gone(pids, bound_s: float = 20.0) -> set[int]:
    """Poll until none of ``pids`` runs (at most ``bound_s``); the ones still running."""
    end = time.monotonic() + bound_s
    alive = {p for p in pids if running(p)}
    while alive and time.monotonic() < end:
        time.sleep(0.1)
        alive = {p for p in alive if running(p)}
    return alive


# -- same results everywhere, in item order ---------------------------------------------------------

def test_local_with_one_worker_gives_the_in_process_results(plans, expected):
    with fanout("local", 1, workloads=[plans[0].traffic.workload]) as fo:
        assert fo.run_trials(plans) == expected
        assert len(fo.worker_pids()) == 1
    assert fo.worker_pids() == []


def test_local_with_two_workers_gives_the_same_results_in_plan_order(local2, plans, expected):
    assert local2.run_trials(plans) == expected
    assert local2.run_trials(plans[::-1]) == expected[::-1]
    assert len(local2.worker_pids()) == 2


def test_plans_travel_by_reference_to_workers_that_registered_the_workload(local2, plans, expected):
    shipped = [local2.ship(p) for p in plans]
    assert shipped == [dump_plan(p, by_reference=True) for p in plans]
    assert all(len(s) * 5 < len(dump_plan(p)) for s, p in zip(shipped, plans))
    assert local2.map(run_dumped_trial, shipped) == expected
    with fanout("local", 1) as bare:  # given no workload: plans travel whole, and still run
        assert bare.ship(plans[0]) == dump_plan(plans[0])
        assert bare.run_trials(plans[:1]) == expected[:1]
        by_ref = bare.map(run_dumped_trial, shipped[:1])[0]  # a by-reference plan it cannot resolve
    assert (by_ref.status, by_ref.category) == ("failed", "runtime")
    assert by_ref.message.startswith("LookupError: plan refers to workload ")


def test_metrics_keys_reach_the_workers(local2, plans, expected):
    keys = ("completed_requests", "p90_ttft_ms")
    assert local2.run_trials(plans, metrics_keys=keys) == [
        TrialResult("ok", None, None, {k: r.metrics[k] for k in keys}) for r in expected]


def test_ray_gives_the_same_results_and_leaves_the_session_ray_running(ray_session, plans, expected):
    with fanout("ray", 2, workloads=[plans[0].traffic.workload]) as fo:
        assert fo.run_trials(plans) == expected
        assert fo.map(tasks.square_or_fail, range(7)) == SQUARES
    assert ray_session.is_initialized()  # the fixture's Ray: not this Fanout's to shut down


# -- failures are records ---------------------------------------------------------------------------

def test_a_task_that_raises_is_a_failed_record_and_the_others_still_run(local2):
    assert local2.map(tasks.square_or_fail, range(7)) == SQUARES
    assert local2.map(tasks.returns_none, [1, 2]) == [None, None]  # None is a result, not a failure
    assert local2.map(tasks.square, []) == []


def test_a_worker_that_dies_fails_its_item_only_and_is_replaced(local2):
    before = local2.worker_pids()
    [died] = local2.map(tasks.hard_exit, [0])
    assert (died.status, died.category) == ("failed", "runtime")
    assert died.message.endswith("exited with code 7 while running this item (out of memory, or killed from outside?)")
    assert local2.map(tasks.square, [1, 2, 3]) == [1, 4, 9]
    assert len(set(before) - set(local2.worker_pids())) == 1


def test_unpicklable_work_is_refused_before_anything_runs(local2):
    with pytest.raises((pickle.PicklingError, AttributeError)):
        local2.map(lambda x: x, [1])
    with pytest.raises(ValueError, match="max_parallel"):
        fanout("local", 0)
    with pytest.raises(ValueError, match="unknown fan-out backend"):
        fanout("dask", 2)


def test_abort_stops_a_map_running_in_another_thread_and_the_fanout_goes_on(local2):
    local2.map(tasks.square, [1, 2])  # both workers up
    workers = local2.worker_pids()
    out: list = []
    t = threading.Thread(target=lambda: out.extend(local2.map(tasks.sleep_for, [60.0])))
    t0 = time.monotonic()
    t.start()
    time.sleep(0.5)
    local2.abort()
    t.join(20)
    assert not t.is_alive() and time.monotonic() - t0 < 20  # not the 60 s the item asked for
    [r] = out
    assert (r.status, r.category) == ("failed", "runtime") and "killed by signal 9" in r.message
    assert wait_gone(workers) == set()  # the idle one too: killed and reaped
    assert local2.map(tasks.square, [1, 2, 3]) == [1, 4, 9]  # fresh workers


# -- timeouts ---------------------------------------------------------------------------------------

def test_a_timeout_returns_timeout_records_and_kills_the_workers_that_ran_them(local2, tmp_path):
    local2.map(tasks.square, [1, 2])  # both workers up
    workers = local2.worker_pids()
    assert len(workers) == 2
    files = [str(tmp_path / f"pid{i}") for i in range(3)]
    results = local2.map(tasks.record_pid_and_sleep, files, timeout_s=2)
    assert [(r.status, r.category, r.message, r.metrics) for r in results] == [
        ("timeout", "timeout", "did not finish within the 2 s limit", None)] * 3
    assert not os.path.exists(files[2])  # two workers, both busy: the third item never started
    ran = {int(open(f).read()) for f in files[:2] if os.path.exists(f)}
    assert ran <= set(workers)
    assert wait_gone(workers) == set()  # killed and reaped, not leaked
    assert local2.map(tasks.square, [1, 2, 3]) == [1, 4, 9]  # the next map starts fresh workers
    assert not set(local2.worker_pids()) & set(workers)


def test_a_ray_timeout_cancels_the_task_and_its_worker_process(ray_session, tmp_path):
    with fanout("ray", 1) as fo:
        assert fo.map(tasks.square, [2]) == [4]  # a warm Ray worker, so the task below starts at once
        files = [str(tmp_path / "ray0"), str(tmp_path / "ray1")]
        results = fo.map(tasks.record_pid_and_sleep, files, timeout_s=2)
        assert [(r.status, r.category) for r in results] == [("timeout", "timeout")] * 2
        if os.path.exists(files[0]):  # the task had started: its Ray worker process is killed
            assert wait_gone({int(open(files[0]).read())}) == set()
        assert fo.map(tasks.square, [2, 3]) == [4, 9]


# -- workers never outlive the parent --------------------------------------------------------------

CHILD = textwrap.dedent("""
    import sys, threading, time
    sys.path.insert(0, {root!r})
    from aisim.search.fanout import fanout
    from tests.search import tasks
    fo = fanout("local", 2)
    threading.Thread(target=fo.map, args=(tasks.record_pid_and_sleep, {files!r}), daemon=True).start()
    time.sleep(600)
""")


def test_a_killed_parent_leaves_no_worker_behind(tmp_path):
    files = [str(tmp_path / "w0"), str(tmp_path / "w1")]
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(root=str(ROOT), files=files)])
    try:
        end = time.monotonic() + 60
        while not all(os.path.exists(f) for f in files):  # both workers busy in a task
            assert child.poll() is None and time.monotonic() < end, "the child fan-out did not start"
            time.sleep(0.1)
        workers = {int(open(f).read()) for f in files}
        below = descendants(child.pid)
        assert workers <= below
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert wait_gone(below) == set()  # the workers, and anything else the child started


def test_workers_outlive_the_thread_that_first_used_them():
    with fanout("local", 2) as fo:
        out = []
        t = threading.Thread(target=lambda: out.append(fo.map(tasks.square, [1, 2])))
        t.start()
        t.join()
        assert out == [[1, 4]]
        pids = fo.worker_pids()  # started for a thread that has ended: PDEATHSIG must not fire
        assert len(pids) == 2 and all(running(p) for p in pids)
        assert set(fo.map(tasks.pid, [0, 1, 2, 3])) <= set(pids)
        assert fo.worker_pids() == pids


def test_importing_the_fanout_does_not_import_ray():
    code = "import sys; import aisim.search.fanout; assert 'ray' not in sys.modules, 'ray imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_an_item_past_its_own_limit_is_stopped_alone(backend, request):
    if backend == "ray":
        request.getfixturevalue("ray_session")
    with fanout(backend, max_parallel=1) as fo:
        # (8 s: an item after the late one waits for its replacement worker, which a loaded
        # 2-core machine may take seconds to start on Ray)
        out = fo.map(tasks.sleep_for, [0.05, 60.0, 0.05, 0.1], item_timeout_s=8.0)
    assert out[0] == 0.05 and out[2] == 0.05 and out[3] == 0.1  # the items after the late one still run
    assert isinstance(out[1], TrialResult) and out[1].status == "timeout" and "8 s" in out[1].message
    with pytest.raises(ValueError, match="item_timeout_s"):
        fanout("local").map(tasks.square, [1], item_timeout_s=0)
