"""One retune sweep over the first minute of the bundled dynamo slice: the current point and the
candidates replayed on the window, scored, kept or switched; identical for any max_parallel."""

from __future__ import annotations

import dataclasses

import pytest

from aisim.actors.planner.retune import SweepRequest
from aisim.search.fanout import fanout
from aisim.search.retune.sweep import candidate_plan, sweep, window_plan
from aisim.search.trial import TrialResult
from aisim.simulator.builders import RouterSpec
from aisim.simulator.config import models as m
from aisim.simulator.config.loading import load_config
from aisim.simulator.config.retune import Domain
from aisim.simulator.plan import plan_from_config
from tests.conftest import ROOT

SLA = m.Sla(ttft_ms=600, itl_ms=30)
DOMAINS = {"overlap_score_credit": Domain(values=(1.0,)), "prefill_load_scale": Domain(values=(1.0, 4.0)),
           "temperature": Domain(values=(0.0, 1.0))}


@pytest.fixture(scope="module")
def base():
    cfg, cdir = load_config(ROOT / "configs" / "quickstart.yaml", [
        "traffic.source.format=dynamo", "traffic.source.paths=[data/conversation_slice_dynamo.jsonl]",
        "router={policy: kv_router}", "engine.workers.aggregated.parallelism.replicas=2"])
    plan = plan_from_config(cfg, cdir)
    return window_plan(plan, SweepRequest(0, 0.0, 60_000.0, 70_000.0, {"aggregated": 2}, {}, {}), SLA, planner_on=False)


def test_the_window_replay_holds_the_windows_requests_at_the_window_start(base):
    w = base.traffic.workload
    assert 0 < w.num_requests < 1000 and w.timestamp_ms.max() < 60_000
    assert base.planner is None and base.sla == SLA and base.pools[0].replicas == 2


def test_a_sweep_scores_every_candidate_and_the_current_point_exactly(base):
    with fanout("local", max_parallel=2) as fan:
        two = sweep(base, DOMAINS, fan, min_improvement_percentage=3.0)
    with fanout("local", max_parallel=1) as fan:
        one = sweep(base, DOMAINS, fan, min_improvement_percentage=3.0)
    assert [c["point"] for c in two.candidates] == [c["point"] for c in one.candidates]
    assert [c["score"] for c in two.candidates] == [c["score"] for c in one.candidates]
    assert len(two.candidates) == 4 and all(c["status"] == "ok" for c in two.candidates)
    current = two.current["point"]
    assert current == {"overlap_score_credit": 1.0, "prefill_load_scale": 1.0, "temperature": 0.0}
    same = next(c for c in two.candidates if c["point"] == current)
    assert same["score"] == two.current["score"] > 0  # the candidate equal to the current point
    top = max(c["score"] for c in two.candidates)
    if two.outcome == "applied":
        assert two.chosen != current and two.improvement_pct > 3.0
    else:
        assert two.outcome == "kept" and (top <= two.current["score"] * 1.03)


def test_the_keep_rule_holds_at_the_threshold(base):
    with fanout("local", max_parallel=2) as fan:
        r = sweep(base, DOMAINS, fan, min_improvement_percentage=1e9)
    assert r.outcome == "kept" and r.chosen is None


def test_a_candidate_that_fails_is_recorded_and_never_wins(base, monkeypatch):
    import aisim.search.retune.sweep as sweep_module

    real = sweep_module.candidate_plan

    def broken(plan, point):
        out = real(plan, point)
        if point["temperature"] == 1.0:  # an impossible router temperature: the replay fails
            out = dataclasses.replace(out, router=RouterSpec("no_such_policy"))
        return out

    monkeypatch.setattr(sweep_module, "candidate_plan", broken)
    with fanout("local", max_parallel=2) as fan:
        r = sweep(base, DOMAINS, fan)
    failed = [c for c in r.candidates if c["status"] == "failed"]
    assert len(failed) == 2 and all(c["score"] is None for c in failed)
    assert r.chosen is None or r.chosen["temperature"] == 0.0


def test_candidate_plans_change_only_their_knobs(base):
    p = candidate_plan(base, {"temperature": 0.5, "prefill_load_scale": 2.0})
    assert (p.router.temperature, p.router.prefill_load_scale, p.router.overlap_score_credit) == (0.5, 2.0, 1.0)
    assert p.traffic is base.traffic and isinstance(TrialResult, type)
