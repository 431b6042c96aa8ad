"""Retune end to end with the real sweeper: windows replayed in worker processes (local pool or
Ray tasks), scored, decided; identical whatever the backend and max_parallel; a sweep past its
timeout is cancelled and leaves no process behind; warm start.

Fast scenarios use the bundled dynamo slice (1,000 requests, ~5 minutes) with 60 s windows and a
10 s grace (window k launches at 70 + 60 k s and decides at 75 + 60 k s); the slow one is the
seed's scenario 1 over the converted conversation trace (configs/retune-router.yaml).
"""

from __future__ import annotations

import copy
import functools
import json
import time

import pytest

from aisim.search.retune.sweep import RetuneSweeper
from aisim.simulator.config.loading import load_config
from aisim.simulator.metrics.summary import WALL_TIME_FIELDS
from aisim.simulator.plan import plan_from_config
from aisim.simulator.run import run_plan
from tests.conftest import ROOT

QUICK = ROOT / "configs" / "quickstart.yaml"
SLICE = ROOT / "configs" / "data" / "conversation_slice_dynamo.jsonl"
ROUTER = {"overlap_score_credit": 1.0, "prefill_load_scale": [1.0, 4.0], "temperature": [0.0, 1.0]}


def slice_plan(*extra: str, retune: dict | None = None):
    section = {"interval_seconds": 60, "grace_seconds": 10, "router": ROUTER, "max_parallel": 2,
               "min_improvement_percentage": 0.5, **(retune or {})}
    planner = {"policy": "enabled", "enable_load_scaling": False, "enable_throughput_scaling": False,
               "retune": section}
    cfg, cdir = load_config(QUICK, ["traffic.source.format=dynamo", f"traffic.source.paths={json.dumps([str(SLICE)])}",
                                    "router={policy: kv_router, overlap_score_credit: 1.0, prefill_load_scale: 1.0, "
                                    "temperature: 1.0}", f"planner={json.dumps(planner)}", *extra])
    return plan_from_config(cfg, cdir)


def comparable(report) -> str:
    d = copy.deepcopy(report.to_dict())
    for k in WALL_TIME_FIELDS:
        d["summary"].pop(k, None)
    for e in d["planner"]["retune_events"]:
        e.pop("sweep_wall_s")
    return json.dumps(d, sort_keys=True)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def two_workers():
    return run_plan(slice_plan())


def test_each_window_replays_every_candidate_and_decides_one_tick_after_its_launch(two_workers):
    events = two_workers.planner["retune_events"]
    assert [e["decided_at_s"] for e in events] == [75 + 60 * k for k in range(len(events))] and len(events) >= 3
    for e in events:
        assert len(e["candidates"]) == 4 and all(c["status"] == "ok" for c in e["candidates"])
        current = next(c for c in e["candidates"] if c["point"] == e["current"]["point"])
        assert current["score"] == e["current"]["score"] > 0  # the current point, scored once
        assert e["outcome"] in ("applied", "kept") and e["num_requests"] > 0
        top = max(c["score"] for c in e["candidates"])
        if e["outcome"] == "applied":
            assert e["improvement_pct"] > 0.5 and e["chosen"]["router"] != e["current"]["point"]
        else:
            assert top <= e["current"]["score"] * 1.005
    assert any(e["outcome"] == "applied" for e in events)


def test_the_result_is_the_same_with_one_worker_and_on_a_second_run(two_workers):
    one = run_plan(slice_plan(retune={"max_parallel": 1}))
    assert comparable(one) == comparable(two_workers)
    assert comparable(run_plan(slice_plan())) == comparable(two_workers)


def test_ray_gives_the_same_result(ray_session, two_workers):
    report = run_plan(slice_plan("execution.backend=ray", "execution.engine_actors=1"))
    assert comparable(report).replace('"backend": "ray"', '"backend": "local"') == comparable(two_workers)


def _after_a_pause(fn, item):
    """``fn(item)`` half a second late (in the worker process)."""
    time.sleep(0.5)
    return fn(item)


class Watching(RetuneSweeper):
    """The real sweeper, noting the worker processes it ran; ``slow``: each candidate starts half a
    second late in its worker, so that a sweep outlasts a shorter timeout on any machine."""

    pids: set
    slow = False

    @property
    def fan(self):
        fan = super().fan
        if self.slow and "map" not in vars(fan):
            plain = type(fan).map

            def late(fn, items, *a, **k):  # (workers started first, so that their ids are noted)
                fan.start()
                self.pids = getattr(self, "pids", set()) | set(fan.worker_pids())
                return plain(fan, functools.partial(_after_a_pause, fn), items, *a, **k)

            fan.map = late
        return fan

    def sweep(self, req):
        out = super().sweep(req)
        self.pids = getattr(self, "pids", set()) | set(self.fan.worker_pids())
        return out


def test_a_sweep_past_its_timeout_is_cancelled_changes_nothing_and_leaves_no_process():
    # (the candidates start 0.5 s late in their workers: at 50 ms alone a quick window's sweep
    # sometimes finished in time on a fast machine and was applied)
    plan = slice_plan(retune={"timeout_seconds": 0.05})
    sweeper = Watching(plan)
    sweeper.slow = True
    report = run_plan(plan, sweeper=sweeper)
    events = report.planner["retune_events"]
    assert events and all(e["outcome"] == "timeout" and e["chosen"] is None for e in events)
    assert all(t["router_policies"]["agg"]["revision"] == 0 for t in report.planner["ticks"])
    deadline = time.monotonic() + 10
    while any(alive(p) for p in sweeper.pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sweeper.pids and not [p for p in sweeper.pids if alive(p)]  # (workers ran, none left)
    assert sweeper._fan is None  # closed with the run


def test_warm_start_starts_each_candidate_from_the_caches_at_the_window_start(two_workers):
    warm = run_plan(slice_plan(retune={"warm_start": True}))
    cold_events = two_workers.planner["retune_events"]
    warm_events = warm.planner["retune_events"]
    # window 0 starts with the replay (empty caches): the same sweep; later windows reuse prefixes
    assert warm_events[0]["current"] == cold_events[0]["current"]
    assert any(w["current"]["score"] != c["current"]["score"] for w, c in zip(warm_events[1:], cold_events[1:]))
    assert comparable(run_plan(slice_plan(retune={"warm_start": True}))) == comparable(warm)


@pytest.mark.slow
def test_scenario_1_decides_three_times_the_same_on_any_backend_and_max_parallel(ray_session):
    """configs/retune-router.yaml over the converted conversation trace (the last 40 minutes)."""
    def run(*sets: str) -> str:
        cfg, cdir = load_config(ROOT / "configs" / "retune-router.yaml", list(sets))
        report = run_plan(plan_from_config(cfg, cdir))
        events = report.planner["retune_events"]
        assert [e["decided_at_s"] for e in events] == [665, 1265, 1865]
        assert [len(e["candidates"]) for e in events] == [6, 6, 6]
        assert [e["num_requests"] for e in events] == [2066, 2140, 2179]
        return comparable(report).replace('"backend": "ray"', '"backend": "local"')

    first = run()
    assert run("planner.retune.max_parallel=1") == first
    assert run() == first
    assert run("execution.backend=ray", "execution.engine_actors=1") == first
