"""Plans are values: a workload is loaded and validated once, every run of the plan starts its
own arrival state, so one plan run N times gives N identical reports (what a search replaying
one workload under many configurations relies on)."""

from __future__ import annotations

import pickle

import pytest

from aisim import plan_from_config, run_plan
from aisim.simulator.config.loading import load_config
from aisim.simulator.metrics.output import canonical_json
from tests.conftest import ROOT
from tests.helpers import without_wall

QUICKSTART = ROOT / "configs" / "quickstart.yaml"
SESSIONS = ("traffic.source={type: synthetic-session, new_input_tokens_per_turn: 700, output_tokens_per_turn: 90, "
            "session: {turns: 3}, shared_prefix_ratio: 0.3, prefix_groups: 4, inter_turn_delay_ms: 500}")
SYNTHETIC = "traffic.source={type: synthetic, input_tokens: 1500, output_tokens: 100, cached_prefix_tokens: 512}"

# name -> overrides of quickstart.yaml; each a few hundred requests
CASES = {
    "closed_loop": [SYNTHETIC, "traffic.load={type: concurrency, concurrency: 24}", "traffic.stop={requests: 200}",
                    "router={policy: kv_router}"],
    "sessions_closed_loop": [SESSIONS, "traffic.load={type: concurrency, concurrency: 8}", "traffic.stop={sessions: 40}"],
    "sessions_poisson": [SESSIONS, "traffic.load={type: poisson, sessions_per_second: 6}", "traffic.stop={sessions: 40}",
                         "router={policy: kv_router}"],
    "poisson": [SYNTHETIC, "traffic.load={type: poisson, requests_per_second: 20, seed: 3}",
                "traffic.stop={requests: 200}"],
    "trace_timestamps": ["traffic.stop={max_virtual_time_seconds: 45}"],  # quickstart's own trace slice
}


def plan_of(name: str):
    cfg, cdir = load_config(QUICKSTART, CASES[name])
    return plan_from_config(cfg, cdir, capture_per_request=True)


def report_bytes(report) -> str:
    return canonical_json(without_wall(report.to_dict()))


@pytest.mark.parametrize("name", list(CASES))
def test_one_plan_run_three_times_gives_three_identical_reports(name):
    plan = plan_of(name)
    reports = [run_plan(plan) for _ in range(3)]
    assert reports[0].summary["completed_requests"] > 50
    first = report_bytes(reports[0])
    assert all(report_bytes(r) == first for r in reports[1:])


@pytest.mark.parametrize("name", ["closed_loop", "sessions_poisson"])
def test_a_run_leaves_the_plan_unchanged(name):
    plan = plan_of(name)
    before = pickle.dumps(plan)
    run_plan(plan)
    assert pickle.dumps(plan) == before


def test_a_run_of_a_shipped_copy_matches_the_original():
    plan = plan_of("closed_loop")
    shipped = pickle.loads(pickle.dumps(plan))
    assert report_bytes(run_plan(shipped)) == report_bytes(run_plan(plan))


def test_plans_ship_by_reference_to_a_process_holding_the_workload(monkeypatch):
    import dataclasses

    from aisim.simulator import plan as plan_module
    from aisim.simulator.builders import RouterSpec

    plan = plan_of("trace_timestamps")
    full = plan_module.dump_plan(plan)
    by_ref = plan_module.dump_plan(plan, by_reference=True)
    assert len(by_ref) * 5 < len(full)  # the workload (the trace's token pieces) stays behind
    monkeypatch.setattr(plan_module, "_WORKLOADS", {})  # a fresh receiving process
    with pytest.raises(LookupError, match="register_workload"):
        plan_module.load_plan(by_ref)
    shipped_once = pickle.loads(pickle.dumps(plan.traffic.workload))  # what the worker received, once
    assert plan_module.register_workload(shipped_once) == plan.traffic.workload.digest
    other = dataclasses.replace(plan, router=RouterSpec("kv_router"))
    for original in (plan, other):
        received = plan_module.load_plan(plan_module.dump_plan(original, by_reference=True))
        assert received.traffic.workload is shipped_once
        assert report_bytes(run_plan(received)) == report_bytes(run_plan(original))


def test_the_workload_digest_follows_the_content():
    a = plan_of("poisson").traffic.workload
    b = plan_of("poisson").traffic.workload
    c = plan_of("closed_loop").traffic.workload
    assert a is not b and a.digest == b.digest
    assert plan_of("trace_timestamps").traffic.workload.digest != a.digest
    assert c.digest == a.digest  # same synthetic requests: only the arrivals differ
