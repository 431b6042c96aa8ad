"""Spica pruning: the intermediate target by hand, Optuna's median and successive-halving bars on
hand-made histories (the exact value at which a candidate is pruned), the rounds a candidate is
judged against, and a pruned search end to end (ledger, journal, counts, the same decisions twice
and on Ray, the unpruned search's winner)."""

from __future__ import annotations

import json

import optuna
import pytest

from aisim.search.spica.loop import STUDY_FILE, run_search
from aisim.search.spica.pruning import CHECKPOINTS, PruneMonitor, snapshot
from aisim.simulator.errors import InputError
from tests.search.spica.test_loop import config, ledger


def _row(i, status="completed", out=100, ttft=100.0, tpot=10.0, e2e=1000.0):
    """A request_metrics.csv row (REQUEST_CSV_COLUMNS order)."""
    return (f"r{i}", status, 0, 0.0, 0.0, 0.1, 1.0, 512, out, 0, 0.0, ttft, tpot, tpot, e2e)


def _spec(target="goodput_per_gpu", pruner="median", snap=(), gpus=1, sla=None, number=None):
    snap = list(snap)
    return {"pruner": pruner, "study_name": "s-agg", "number": len(snap) if number is None else number,
            "snapshot": snap, "target": target, "sla": sla or {}, "used_gpus": gpus}


def _completed(number, values):
    """A COMPLETE trial of an earlier round with intermediate values at steps 1..len(values)."""
    return {"number": number, "state": "COMPLETE", "value": values[-1],
            "intermediate": [[s + 1, v] for s, v in enumerate(values)], "rungs": {}}


def test_the_intermediate_value_is_the_target_on_the_requests_ended_so_far():
    m = PruneMonitor(_spec(gpus=2, sla={"ttft_ms": 500.0, "itl_ms": 50.0}), num_requests=100)
    m.observe({}, _row(0, out=100, ttft=400.0, tpot=20.0))  # within both limits: good
    m.observe({}, _row(1, out=60, ttft=600.0, tpot=20.0))  # TTFT over: completed, not good
    m.observe({}, _row(2, out=1, ttft=100.0, tpot=""))  # one token: no TPOT, passes the ITL limit
    m.observe({}, _row(3, status="rejected", out=0, ttft="", tpot="", e2e=""))
    # goodput per GPU: (100 + 1) good tokens / 2 s / 2 GPUs
    assert m.value(2000.0) == pytest.approx(101 / 2 / 2)
    t = PruneMonitor(_spec(target="throughput"), 100)
    t.observe({}, _row(0, out=100))
    t.observe({}, _row(1, out=60))
    assert t.value(4000.0) == pytest.approx(160 / 4)
    lat = PruneMonitor(_spec(target="ttft"), 100)
    assert lat.value(1000.0) is None  # nothing completed: nothing to report yet
    lat.observe({}, _row(0, ttft=100.0))
    lat.observe({}, _row(1, ttft=300.0))
    assert lat.value(1000.0) == -200.0  # negated: higher is better, as the final score
    user = PruneMonitor(_spec(target="throughput_per_user"), 100)
    user.observe({}, _row(0, tpot=10.0))
    user.observe({}, _row(1, tpot=20.0))
    assert user.value(1000.0) == pytest.approx((100 + 50) / 2)


def _decide(spec, tokens, now_ms=1000.0, num_requests=CHECKPOINTS):
    """A candidate whose first request (``tokens`` output tokens) ends at ``now_ms``: checkpoint 1
    of ``num_requests`` = CHECKPOINTS (one request a step)."""
    m = PruneMonitor(spec, num_requests)
    m.observe({}, _row(0, out=tokens))
    return m, m.check(now_ms, 1)


def test_the_median_pruner_prunes_below_the_median_of_earlier_completed_trials():
    # five completed trials of earlier rounds at step 1: 100..500 per s, median 300
    snap = [_completed(n, [100.0 * (n + 1), 1.0]) for n in range(5)]
    m, why = _decide(_spec(target="throughput", snap=snap), 299)
    assert why == "pruned by the median pruner at checkpoint 1/10: throughput so far 299"
    assert m.pruned == {"step": 1, "checkpoints": CHECKPOINTS, "at_s": 1.0, "ended_requests": 1, "value": 299.0}
    m, why = _decide(_spec(target="throughput", snap=snap), 300)  # at the median: not below it
    assert why is None and m.pruned is None and m.outcome()["values"] == [[1, 300.0]]
    # four completed trials are fewer than the pruner's n_startup_trials (5): nothing is pruned
    _, why = _decide(_spec(target="throughput", snap=snap[:4]), 1)
    assert why is None


def test_successive_halving_keeps_the_top_third_of_the_rung():
    # five trials that completed rung 0 (step 1) with 10..50; with the candidate, six compete and
    # the top 6 // 3 = 2 are promoted: 40 is the second best, so 40 stays and 39.9 goes
    snap = [{"number": n, "state": "PRUNED", "value": None, "intermediate": [[1, 10.0 * (n + 1)]],
             "rungs": {"completed_rung_0": 10.0 * (n + 1)}} for n in range(5)]
    m, why = _decide(_spec(target="throughput", pruner="successive_halving", snap=snap), 40)
    assert why is None and m.outcome()["rungs"] == {"completed_rung_0": 40.0}
    m, why = _decide(_spec(target="throughput", pruner="successive_halving", snap=snap), 399, now_ms=10_000.0)
    assert why == "pruned by the successive_halving pruner at checkpoint 1/10: throughput so far 39.9"
    assert m.outcome()["rungs"] == {"completed_rung_0": 39.9}


def test_a_step_an_edge_jumps_over_is_reported_with_the_value_of_that_edge():
    m = PruneMonitor(_spec(target="throughput"), 20)  # a step every 2 requests
    for i in range(7):
        m.observe({}, _row(i, out=10))
    assert m.check(1000.0, 7) is None  # 7 ended at once: steps 1, 2 and 3
    assert m.values == [[1, 70.0], [2, 70.0], [3, 70.0]]
    m.observe({}, _row(7, out=10))
    m.check(2000.0, 8)
    assert m.values[-1] == [4, 40.0]


def test_a_candidate_is_judged_against_the_rounds_before_its_own():
    study = optuna.create_study(direction="maximize")
    for r, value in ((0, 1.0), (1, 2.0), (2, 3.0)):
        t = study.ask()
        t.set_user_attr("round", r)
        t.report(value, 1)
        study.tell(t, value)
    running = study.ask()
    running.set_user_attr("round", 1)
    assert [s["value"] for s in snapshot(study, 2)] == [1.0, 2.0]
    assert [s["intermediate"] for s in snapshot(study, 1)] == [[(1, 1.0)]]
    assert snapshot(study, 0) == []


def test_a_pruner_is_refused_where_nothing_can_be_pruned_and_none_changes_nothing():
    with pytest.raises(InputError, match="optimizer.pruner: cannot prune a pareto search"):
        config(optimization__target="pareto", optimizer__algorithm="nsga2", optimizer__pruner="median")
    with pytest.raises(InputError, match="optimizer.pruner: cannot prune a min_gpus search"):
        config(optimization__target="min_gpus", optimizer__pruner="hyperband",
               optimization__constraints={"min_goodput_rps": 1})
    with pytest.raises(InputError, match="optimizer.pruner"):
        config(optimizer__pruner="asha")
    assert config(optimizer__pruner="none").fingerprint() == config().fingerprint()
    assert "pruner" in config(optimizer__pruner="median").dump()["optimizer"]


PRUNED = {"optimizer__pruner": "successive_halving", "workload__request_count": 400, "workload__request_rate": 30}


@pytest.fixture(scope="module")
def pruned(tmp_path_factory):
    return run_search(config(**PRUNED), tmp_path_factory.mktemp("pruned"), parallelism=2)


def test_a_pruned_search_records_its_pruned_candidates_and_finds_the_full_searchs_winner(pruned, tmp_path):
    full = run_search(config(workload__request_count=400, workload__request_rate=30), tmp_path, parallelism=2)
    r = pruned
    cands = {c["candidate_id"]: c for c in r.recommendation["candidates"]}
    gone = [c for c in cands.values() if c["status"] == "pruned"]
    assert len(gone) == r.counts["pruned"] >= 8 and r.counts["evaluated"] == 16
    assert r.counts["feasible"] + r.counts["pruned"] == 16
    for c in gone:
        assert c["score"] is None and c["metrics"] is None and c["reason_category"] == "pruned"
        assert c["reason"].startswith(f"pruned by the successive_halving pruner at checkpoint {c['pruned']['step']}/10")
        assert c["pruned"]["ended_requests"] < 400
        assert c["candidate_id"] not in r.recommendation["views"]["top_n"]
    assert r.best["candidate_id"] == full.best["candidate_id"] and r.best["score"] == full.best["score"]
    assert r.best["metrics"] == full.best["metrics"]  # a survivor's replay is the full replay
    assert "pruned" not in full.counts and "pruned" not in full.recommendation["counts"]


def test_pruned_trials_are_pruned_in_the_journal_with_their_intermediate_values(pruned):
    from optuna.storages.journal import JournalFileBackend

    storage = optuna.storages.JournalStorage(JournalFileBackend(str(pruned.output_dir / STUDY_FILE)))
    trials = optuna.load_study(study_name="t-agg", storage=storage).trials
    states = {t.user_attrs["candidate_id"]: t for t in trials}
    for c in pruned.recommendation["candidates"]:
        t = states[c["candidate_id"]]
        if c["status"] == "pruned":
            assert t.state == optuna.trial.TrialState.PRUNED
            assert t.user_attrs["pruned_at"] == c["pruned"]
            assert max(t.intermediate_values) == c["pruned"]["step"]
        else:
            assert t.state == optuna.trial.TrialState.COMPLETE and len(t.intermediate_values) >= 1
        assert t.user_attrs["round"] == int(c["candidate_id"][-6:]) // 2  # rounds of one candidate per worker


def test_the_pruning_decisions_are_the_same_again_and_on_ray(pruned, tmp_path, ray_session):
    again = run_search(config(**PRUNED), tmp_path / "again", parallelism=2)
    assert ledger(again) == ledger(pruned)
    ray = run_search(config(**PRUNED), tmp_path / "ray", backend="ray", parallelism=2)
    assert ledger(ray) == ledger(pruned)
    assert [c.get("pruned") for c in ray.recommendation["candidates"]] == \
        [c.get("pruned") for c in pruned.recommendation["candidates"]]


def test_a_resumed_pruned_search_decides_as_an_uninterrupted_one(pruned, tmp_path):
    from aisim.search.spica.loop import resume_search

    run_search(config(**{**PRUNED, "optimizer__max_trials": 6}), tmp_path, parallelism=2)
    resumed = resume_search("t", output_dir=tmp_path, parallelism=2, max_trials=16)
    assert ledger(resumed) == ledger(pruned)
    assert json.loads((tmp_path / "recommendation.json").read_text())["counts"] == pruned.recommendation["counts"]
