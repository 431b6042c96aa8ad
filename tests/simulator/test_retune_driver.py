"""The outer replay's side of retune, with a scripted sweeper: when sweeps launch, what they are
asked, when decisions land (latency 0, fixed, measured), what changes from the decision tick on
(router knobs, Planner fields), advisory, and the records (retune_events, the ticks' router state).

The bundled dynamo slice (1,000 requests, ~5 minutes), windows of 60 s with a 10 s grace and 5 s
ticks: window k launches at 70 + 60 k s and, with latency 0, decides at the next tick, 75 + 60 k s.
"""

from __future__ import annotations

import json

import pytest

from aisim.actors.planner.retune import SweepAnswer
from aisim.simulator.config.loading import load_config
from aisim.simulator.metrics.summary import WALL_TIME_FIELDS
from aisim.simulator.plan import plan_from_config
from aisim.simulator.retune_driver import decision_tick_ms
from aisim.simulator.run import run_plan
from tests.conftest import ROOT

QUICK = ROOT / "configs" / "quickstart.yaml"
SLICE = ROOT / "configs" / "data" / "conversation_slice_dynamo.jsonl"
START = {"overlap_score_credit": 1.0, "prefill_load_scale": 1.0, "temperature": 1.0}


def make_plan(retune: dict | None = None, *extra: str, planner: dict | None = None, per_request: bool = False):
    section = {"policy": "enabled", "enable_load_scaling": False, "enable_throughput_scaling": False,
               **(planner or {})}
    if retune is not None:
        section["retune"] = {"interval_seconds": 60, "grace_seconds": 10,
                             "router": {"overlap_score_credit": 1.0, "prefill_load_scale": [1.0, 4.0],
                                        "temperature": [0.0, 1.0]}, **retune}
    cfg, cdir = load_config(QUICK, ["traffic.source.format=dynamo", f"traffic.source.paths={json.dumps([str(SLICE)])}",
                                    "router={policy: kv_router, overlap_score_credit: 1.0, prefill_load_scale: 1.0, "
                                    "temperature: 1.0}", f"planner={json.dumps(section)}", *extra])
    return plan_from_config(cfg, cdir, capture_per_request=per_request)


class Scripted:
    """A sweeper that answers from a script: window index -> SweepAnswer (default: kept)."""

    def __init__(self, script=None, wall_s: float = 0.0) -> None:
        self.script = script or {}
        self.wall_s = wall_s
        self.requests = []
        self.closed = False

    def sweep(self, req):
        self.requests.append(req)
        ans = self.script.get(req.window_index) or SweepAnswer("kept")
        ans.sweep_wall_s = self.wall_s
        return ans

    def close(self):
        self.closed = True


def applied(**router) -> SweepAnswer:
    return SweepAnswer("applied", router=router, chosen={"router": {**START, **router}, "planner": None})


def run(plan, sweeper):
    return run_plan(plan, sweeper=sweeper).to_dict()


def test_window_zero_of_600_s_decides_at_665_s_or_675_s_with_11_s_of_latency():
    assert decision_tick_ms(660_000.0, 0.0, 5_000.0) == 665_000.0
    assert decision_tick_ms(660_000.0, 11_000.0, 5_000.0) == 675_000.0
    assert decision_tick_ms(660_000.0, 5_000.0, 5_000.0) == 665_000.0  # ready exactly on the tick
    assert decision_tick_ms(662_500.0, 0.0, 5_000.0) == 665_000.0


@pytest.mark.parametrize("retune,wall_s,decided", [
    ({}, 0.0, [75, 135, 195, 255]),
    ({"decision_latency_seconds": 11}, 0.0, [85, 145, 205, 265]),
    ({"decision_latency_seconds": "measured"}, 4.9, [75, 135, 195, 255]),  # 70 + 4.9 -> the tick at 75
    ({"decision_latency_seconds": "measured", "decision_latency_scale": 2, "timeout_seconds": 30}, 7.0,
     [85, 145, 205, 265]),  # 70 + 2 x 7 = 84 -> 85
])
def test_sweeps_launch_after_each_window_and_decide_at_the_decision_tick(retune, wall_s, decided):
    sweeper = Scripted(wall_s=wall_s)
    d = run(make_plan(retune), sweeper)
    events = d["planner"]["retune_events"]
    assert [e["decided_at_s"] for e in events][:4] == decided
    assert [e["launched_at_s"] for e in events][:4] == [70, 130, 190, 250]
    assert [(e["window_start_s"], e["window_end_s"]) for e in events][:2] == [(0, 60), (60, 120)]
    assert all(e["outcome"] == "kept" and e["chosen"] is None for e in events)
    assert [r.window_index for r in sweeper.requests][:4] == [0, 1, 2, 3]
    assert sweeper.requests[0].router == START and sweeper.requests[0].replicas == {"aggregated": 2}
    assert sweeper.closed
    last_tick = d["planner"]["ticks"][-1]["at_ms"] / 1000.0
    assert all(e["decided_at_s"] <= last_tick for e in events)  # only decisions inside the replay


def test_an_applied_decision_changes_the_router_from_the_decision_tick_on():
    sweeper = Scripted({0: applied(temperature=0.0)})
    d = run(make_plan({}, per_request=True), sweeper)
    ev = d["planner"]["retune_events"][0]
    assert ev["outcome"] == "applied" and ev["router_changes"] == {"temperature": 0.0}
    assert ev["chosen"]["router"] == {**START, "temperature": 0.0} and ev["decided_at_s"] == 75
    assert sweeper.requests[1].router == {**START, "temperature": 0.0}  # the next sweep starts from it
    ticks = {t["at_ms"]: t for t in d["planner"]["ticks"]}
    before, at, after = ticks[70_000.0], ticks[75_000.0], ticks[80_000.0]
    assert before["router_policies"]["agg"]["revision"] == 0
    assert at["router_policies"]["agg"] == {"policy": "kv_router", "state": "active", "revision": 0,
                                            "parameters": START}  # before the tick's update
    assert at["runtime_decision"]["router_parameters"] == {"agg": {**START, "temperature": 0.0}}
    assert after["router_policies"]["agg"]["revision"] == 1
    assert after["router_policies"]["agg"]["parameters"]["temperature"] == 0.0
    # the same replay without the decision routes identically up to the decision tick, not after
    plain = run(make_plan({}, per_request=True), Scripted())
    workers = {r["uuid"]: (r["arrival_time_ms"], r["decode_worker_idx"]) for r in plain["per_request"]}
    same_before = [workers[r["uuid"]][1] == r["decode_worker_idx"] for r in d["per_request"] if r["arrival_time_ms"] <= 75_000]
    differ_after = [workers[r["uuid"]][1] != r["decode_worker_idx"] for r in d["per_request"] if r["arrival_time_ms"] > 75_000]
    assert all(same_before) and any(differ_after)


def test_advisory_records_the_decision_and_changes_nothing():
    d = run(make_plan({}, planner={"advisory": True}), Scripted({0: applied(temperature=0.0)}))
    ev = d["planner"]["retune_events"][0]
    assert ev["outcome"] == "advisory" and ev["chosen"]["router"]["temperature"] == 0.0
    assert ev["router_changes"] == {"temperature": 0.0} and ev["predictor_warmup"] is None
    ticks = d["planner"]["ticks"]
    assert all(t["runtime_decision"]["router_parameters"] is None for t in ticks)
    assert all(t["router_policies"]["agg"]["revision"] == 0 for t in ticks)
    plain = run(make_plan({}, planner={"advisory": True}), Scripted())
    assert d["summary"]["mean_ttft_ms"] == plain["summary"]["mean_ttft_ms"]


def test_a_winner_equal_to_the_running_point_is_kept_and_timeouts_change_nothing():
    d = run(make_plan({}), Scripted({0: applied(temperature=1.0), 1: SweepAnswer("timeout"),
                                     2: SweepAnswer("failed")}))
    assert [e["outcome"] for e in d["planner"]["retune_events"][:3]] == ["kept", "timeout", "failed"]
    assert all(t["router_policies"]["agg"]["revision"] == 0 for t in d["planner"]["ticks"])


def test_planner_fields_reach_the_planner_at_the_decision_tick():
    plan = make_plan({"router": None, "planner": {"load_scaling_down_sensitivity": [70, 90]}},
                     planner={"enable_load_scaling": True, "target": "throughput"})
    answer = SweepAnswer("applied", planner={"load_scaling_down_sensitivity": 70},
                         chosen={"router": None, "planner": {"load_scaling_down_sensitivity": 70}})
    sweeper = Scripted({0: answer})
    d = run(plan, sweeper)
    ev = d["planner"]["retune_events"][0]
    assert ev["outcome"] == "applied" and ev["planner_changes"] == {"load_scaling_down_sensitivity": 70}
    assert sweeper.requests[0].planner == {"load_scaling_down_sensitivity": 80}
    assert sweeper.requests[1].planner == {"load_scaling_down_sensitivity": 70}


def test_no_retune_records_null_and_a_short_replay_records_no_decision():
    from aisim.simulator.run import run_plan as plain_run

    assert plain_run(make_plan(None)).to_dict()["planner"]["retune_events"] is None
    d = run(make_plan({"interval_seconds": 600}), Scripted())
    assert d["planner"]["retune_events"] == []


def test_the_replay_is_deterministic_with_retune():
    a = run(make_plan({}), Scripted({0: applied(temperature=0.0)}))
    b = run(make_plan({}), Scripted({0: applied(temperature=0.0)}))
    for d in (a, b):
        for k in WALL_TIME_FIELDS:
            d["summary"].pop(k, None)
        for e in d["planner"]["retune_events"]:
            e.pop("sweep_wall_s")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
