"""Exact early decisions of capacity trials: the counts each rule needs, the exact request at which
hand-made streams are decided, soundness against the full quantile on random streams, the search
giving the same answers as full replays (the bundled config and random SLA sets), the cache, and
a monitored replay that is never stopped being the same replay."""

from __future__ import annotations

import copy
import json
import random

import pytest
import yaml

from aisim.search.capacity.early import SlaMonitor, needed
from aisim.search.capacity.runner import run_capacity_search
from aisim.search.capacity.sla import SlaRule, quantile
from tests.conftest import ROOT

EXAMPLE = ROOT / "configs" / "capacity-search.yaml"


def record(i: int, ttft: float | None = None, *, status: str = "completed", itl: float | None = None,
           e2e: float | None = None) -> dict:
    """A per-request record whose request_metrics.csv row has these values (arrival at 0)."""
    first = ttft if ttft is not None else 10.0
    n = 2 if itl is not None else 1
    last = first + (itl if itl is not None else 0.0)
    if e2e is not None:
        last, n = e2e, max(n, 2)
    return {"uuid": str(i), "terminal_status": status, "arrival_time_ms": 0.0, "first_admit_ms": 0.0,
            "first_token_ms": first if status == "completed" else None, "last_token_ms": last, "output_length": n,
            "itl_ms": itl}


def feed(monitor: SlaMonitor, records) -> int | None:
    """The 1-based position of the record after which the monitor decided (None: never)."""
    for k, rec in enumerate(records, 1):
        monitor.observe(rec)
        if monitor.decided() is not None:
            return k
    return None


def test_the_counts_each_rule_needs():
    assert needed("<=", 0.9, 1000) == 101  # 1000 - floor(999 x 0.9) = 1000 - 899
    assert needed("<", 0.5, 1000) == 501  # 1000 - floor(499.5)
    assert needed(">=", 0.1, 1000) == 101  # ceil(99.9) + 1
    assert needed(">", 0.0, 10) == 1 and needed("<=", 1.0, 10) == 1  # the minimum / the maximum
    assert needed("==", 0.5, 10) is None


def test_a_p90_rule_is_decided_at_the_exact_request_that_proves_it():
    # N = 10, p90 TTFT <= 100 ms: h = 8.1, so the 9th smallest of 10 must stay <= 100; two values
    # above 100 make it > 100 whatever the other eight are
    m = SlaMonitor([SlaRule("ttft_ms", 0.9, 100.0, "<=")], 10)
    assert feed(m, [record(0, 50.0), record(1, 150.0), record(2, 90.0), record(3, 100.0), record(4, 200.0),
                    record(5, 300.0)]) == 5
    assert m.decision["bound"] == {"metric": "ttft_ms", "quantile": 0.9, "op": "<=", "threshold": 100.0,
                                   "proved": "q0.9 ttft_ms > 100", "values_beyond": 2, "needed": 2,
                                   "num_requests": 10}


def test_a_value_equal_to_the_threshold_never_counts():
    m = SlaMonitor([SlaRule("ttft_ms", 0.5, 100.0, "<=")], 3)  # needs 2 values > 100
    assert feed(m, [record(0, 100.0), record(1, 100.0), record(2, 100.000001)]) is None


def test_a_rejection_fails_every_request_rule_at_once_but_not_a_queue_only_sla():
    m = SlaMonitor([SlaRule("e2e_latency_ms", 0.99, 1e9, "<=")], 100)
    assert feed(m, [record(0, 5.0), record(1, status="rejected")]) == 2
    assert m.decision["bound"] is None and "rejected" in m.decision["reason"]
    q = SlaMonitor([SlaRule("queue_depth_waiting", 0.95, 8.0, "<=")], 100)
    assert feed(q, [record(0, status="rejected")]) is None


def test_lower_bound_rules_and_equality():
    m = SlaMonitor([SlaRule("itl_ms", 0.2, 5.0, ">=")], 6)  # ceil(5 x 0.2) + 1 = 2 values < 5 fail it
    assert feed(m, [record(0, itl=7.0), record(1, itl=4.0), record(2, itl=6.0), record(3, itl=3.0)]) == 4
    eq = SlaMonitor([SlaRule("ttft_ms", 0.5, 1.0, "==")], 4)
    assert feed(eq, [record(i, 50.0) for i in range(4)]) is None


def test_a_one_token_request_has_no_itl_and_never_counts():
    m = SlaMonitor([SlaRule("itl_ms", 0.5, 5.0, "<=")], 3)
    assert feed(m, [record(0), record(1), record(2)]) is None  # (no itl: left out, as the CSV leaves it)


@pytest.mark.parametrize("seed", range(40))
def test_a_decision_is_always_the_full_quantiles_verdict(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 60)
    op = rng.choice(["<=", "<", ">=", ">"])
    q = rng.choice([0.0, 0.1, 0.5, 0.9, 0.95, 0.99, 1.0])
    values = [float(rng.randint(0, 20)) for _ in range(n)]
    threshold = float(rng.randint(0, 20))
    rule = SlaRule("ttft_ms", q, threshold, op)
    m = SlaMonitor([rule], n)
    at = feed(m, [record(i, v) for i, v in enumerate(values)])
    if at is not None:
        assert not rule.check(quantile(values, q)), (values, rule)


# -- the search -------------------------------------------------------------------------------
def _trace(result) -> list:
    return [(j.job_name, j.max_qps_under_sla, [(t["qps"], t["passed"], t["timed_out"]) for t in j.search_trace])
            for j in result.jobs]


def _run(cfg: dict, out, early: bool, cache=None):
    cfg = copy.deepcopy(cfg)
    cfg.setdefault("search", {})["early_decisions"] = early
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    base = cfg["benchmark_base"]
    assert "config" not in base
    return run_capacity_search(path, out, use_cache=cache is not None, cache_dir=cache, max_parallel=1)


def test_the_bundled_search_gives_the_same_answers_with_early_decisions(tmp_path):
    cfg = yaml.safe_load(EXAMPLE.read_text())
    early = _run(cfg, tmp_path / "early", True)
    full = _run(cfg, tmp_path / "full", False)
    assert _trace(early) == _trace(full)
    decided = [t for j in early.jobs for t in j.search_trace if t.get("decided_early")]
    assert decided and all(t["passed"] is False for t in decided)
    t = decided[0]
    doc = json.loads((tmp_path / "early").joinpath(*_run_dir(early, t["qps"]), "trial_result.json").read_text())
    assert doc["decided_early"] is True and doc["bound"]["proved"] == "q0.9 ttft_ms > 1000"
    assert doc["checkpoint"]["ended_requests"] < 1000
    pred = json.loads((tmp_path / "early").joinpath(*_run_dir(early, t["qps"]), "prediction.json").read_text())
    assert pred["summary"]["stopped_early"]["reason"].startswith("q0.9 ttft_ms > 1000")


def _run_dir(result, qps) -> tuple:
    job = result.jobs[0]
    return ("jobs", f"{job.job_name}_{job.job_key}", "runs", f"{qps:.6g}")


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_random_sla_sets_give_the_same_answers_with_early_decisions(tmp_path, seed):
    rng = random.Random(seed)
    cfg = yaml.safe_load(EXAMPLE.read_text())
    cfg["jobs"] = [{"name": "grid", "qps_list": [10, 30, 45, 60]}]
    rules = []
    for _ in range(rng.randint(1, 3)):
        metric = rng.choice(["ttft_ms", "e2e_latency_ms", "itl_ms", "request_scheduling_delay", "queue_depth_waiting"])
        scale = {"ttft_ms": 2000, "e2e_latency_ms": 5000, "itl_ms": 30, "request_scheduling_delay": 2,
                 "queue_depth_waiting": 40}[metric]
        rules.append({"metric": metric, "quantile": rng.choice([0.5, 0.9, 0.99]),
                      "threshold": round(rng.uniform(0.05, 1.0) * scale, 3), "op": rng.choice(["<=", "<", ">="])})
    cfg["sla"] = rules
    assert _trace(_run(cfg, tmp_path / "early", True)) == _trace(_run(cfg, tmp_path / "full", False))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_disaggregated_trials_give_the_same_answers_with_early_decisions(tmp_path, seed):
    # a request in flight on a decode worker carries its first token (TTFT final) and its first
    # admission, the prefill's: the bounds read the times its row will report
    rng = random.Random(seed)
    cfg = yaml.safe_load(EXAMPLE.read_text())
    dis = yaml.safe_load((ROOT / "configs" / "disaggregated-1p1d.yaml").read_text())
    cfg["benchmark_base"]["engine"], cfg["benchmark_base"]["router"] = dis["engine"], dis["router"]
    cfg["benchmark_base"]["traffic"]["stop"] = {"requests": 400}
    cfg["jobs"] = [{"name": "grid", "qps_list": [4, 12, 16, 24]}]
    metric = rng.choice(["ttft_ms", "request_scheduling_delay"])
    cfg["sla"] = [{"metric": metric, "quantile": rng.choice([0.5, 0.9, 0.99]), "op": rng.choice(["<=", "<"]),
                   "threshold": round(rng.uniform(0.05, 1.0) * {"ttft_ms": 2000, "request_scheduling_delay": 1}[metric], 3)}]
    early = _run(cfg, tmp_path / "early", True)
    assert _trace(early) == _trace(_run(cfg, tmp_path / "full", False))
    decided = [t for t in early.jobs[0].search_trace if t.get("decided_early")]
    assert decided and decided[0]["bound"]["in_flight_beyond"] > 0  # (24 QPS, with requests in flight)


def test_a_trial_decided_early_is_replayed_when_the_sla_no_longer_holds_its_rule(tmp_path):
    cfg = yaml.safe_load(EXAMPLE.read_text())
    cfg["jobs"] = [{"name": "grid", "qps_list": [64]}]
    cache = tmp_path / "cache"
    first = _run(cfg, tmp_path / "a", True, cache)
    [t] = first.jobs[0].search_trace
    assert t["decided_early"] and not t["cached"]
    again = _run(cfg, tmp_path / "b", True, cache)  # the same SLA: the cached decision answers
    [t] = again.jobs[0].search_trace
    assert t["cached"] and t["decided_early"] and t["passed"] is False
    cfg["sla"][0]["threshold"] = 500  # stricter: the proved p90 TTFT > 1000 fails it too, no replay
    stricter = _run(cfg, tmp_path / "s", True, cache)
    [t] = stricter.jobs[0].search_trace
    assert t["cached"] and t["decided_early"] and t["passed"] is False
    assert t["sla_results"][0]["passed"] is False and t["sla_results"][0]["decided_early"]
    cfg["sla"][0]["threshold"] = 1e7  # the proved rule is gone: a full verdict needs the replay
    third = _run(cfg, tmp_path / "c", True, cache)
    [t] = third.jobs[0].search_trace
    assert not t["cached"] and not t.get("decided_early")
    assert t["sla_results"][0]["passed"] is True and t["passed"] is False  # (the queue rule still fails)


def test_a_monitored_replay_that_is_never_stopped_is_the_same_replay():
    from aisim.search.capacity.config import job_config, load_capacity_config, trial_config
    from aisim.search.trial import plan_with_overrides
    from aisim.simulator.checkpoints import Monitor
    from aisim.simulator.metrics.summary import WALL_TIME_FIELDS
    from aisim.simulator.run import run_plan

    cfg, d = load_capacity_config(EXAMPLE)
    reports = []
    never = SlaMonitor([SlaRule("ttft_ms", 0.9, 1e12, "<="), SlaRule("e2e_latency_ms", 0.5, 1e12, "<")], 1000)
    for monitor in (None, Monitor(1000), never):  # (the SLA monitor asks the hosts what is in flight)
        plan = plan_with_overrides(trial_config(job_config(cfg, cfg.jobs[0]), 48.0, None), {}, str(d),
                                   capture_per_request=True, capture_worker_timeline=True)
        r = run_plan(plan, monitor=monitor)
        summary = {k: v for k, v in r.summary.items() if k not in WALL_TIME_FIELDS}
        reports.append((summary, r.per_request, [t.to_plain() for t in r.timelines]))
    assert monitor.checkpoints > 10  # the run-out was stepped in slices, the monitor asked after each
    assert never.decision is None
    assert reports[0] == reports[1] == reports[2]


def test_requests_in_flight_count_once_their_elapsed_time_passes_the_threshold():
    m = SlaMonitor([SlaRule("ttft_ms", 0.9, 100.0, "<=")], 10)  # needs 2 values > 100
    assert feed(m, [record(0, 150.0)]) is None
    held = [(450.0, None, 420.0), (300.0, 320.0, 310.0)]  # (arrival, first token, first admission)
    # at 500 ms: the first has waited 50 ms without a token, the second has its token (TTFT 20 ms)
    assert m.check(500.0, 1, lambda: held) is None and m.checkpoints == 1
    m._next = 0  # the next call is a checkpoint
    assert m.check(560.0, 1, lambda: held) == "q0.9 ttft_ms > 100: 1 ended and 1 in flight of at most 10 requests"
    assert m.decision["bound"]["in_flight_beyond"] == 1 and m.at_ms == 560.0
    e2e = SlaMonitor([SlaRule("e2e_latency_ms", 0.5, 200.0, "<=")], 4)  # needs 4 - floor(1.5) = 3
    e2e._next = 0
    assert e2e.check(600.0, 0, lambda: [(300.0, 320.0, 310.0), (350.0, None, None), (500.0, None, None)]) is None
    e2e._next = 0
    assert e2e.check(720.0, 0, lambda: [(300.0, 320.0, 310.0), (350.0, None, None), (500.0, None, None)]) \
        == "q0.5 e2e_latency_ms > 200: 0 ended and 3 in flight of at most 4 requests"


def test_requests_in_flight_with_their_first_token_count_their_final_ttft_and_delay():
    m = SlaMonitor([SlaRule("ttft_ms", 0.9, 100.0, "<=")], 10)  # needs 2 values > 100
    assert feed(m, [record(0, 150.0)]) is None
    # decoding: TTFT 320 - 100 = 220 ms, final although the request has not ended; the other's
    # TTFT is 80 ms (not counted, however long it has been in flight since)
    held = [(100.0, 320.0, 110.0), (400.0, 480.0, 410.0)]
    m._next = 0
    assert m.check(5000.0, 1, lambda: held) == "q0.9 ttft_ms > 100: 1 ended and 1 in flight of at most 10 requests"
    held = [(100.0, 200.0, 110.0), (400.0, 480.0, 410.0)]  # TTFT exactly 100: never counts
    m = SlaMonitor([SlaRule("ttft_ms", 0.9, 100.0, "<=")], 10)
    feed(m, [record(0, 150.0)])
    m._next = 0
    assert m.check(5000.0, 1, lambda: held) is None
    # the scheduling delay (seconds) of an admitted request: (admission - arrival) / 1000
    d = SlaMonitor([SlaRule("request_scheduling_delay", 0.5, 0.25, "<=")], 2)  # needs 2 - floor(0.5) = 2
    d._next = 0
    assert d.check(900.0, 0, lambda: [(0.0, None, 300.0), (100.0, None, 340.0)]) is None  # 0.3 s, 0.24 s
    d._next = 0
    assert d.check(900.0, 0, lambda: [(0.0, None, 300.0), (100.0, None, 360.0)]) \
        == "q0.5 request_scheduling_delay > 0.25: 0 ended and 2 in flight of at most 2 requests"


def test_a_proved_bound_fails_the_same_rule_and_stricter_ones_on_its_side():
    from aisim.search.capacity.early import proves

    def bound(op, t, metric="ttft_ms", q=0.9):
        return {"metric": metric, "quantile": q, "op": op, "threshold": t}

    upper = bound("<=", 1000.0)  # proved: p90 TTFT > 1000
    assert proves(upper, SlaRule("ttft_ms", 0.9, 1000.0, "<="))
    assert proves(upper, SlaRule("ttft_ms", 0.9, 150.0, "<="))
    assert proves(upper, SlaRule("ttft_ms", 0.9, 1000.0, "<"))  # (> 1000 is >= 1000)
    assert not proves(upper, SlaRule("ttft_ms", 0.9, 1500.0, "<="))  # a looser threshold needs the quantile
    assert not proves(upper, SlaRule("ttft_ms", 0.95, 150.0, "<="))  # another quantile
    assert not proves(upper, SlaRule("e2e_latency_ms", 0.9, 150.0, "<="))
    assert not proves(upper, SlaRule("ttft_ms", 0.9, 150.0, ">="))  # the other side
    assert not proves(upper, SlaRule("queue_depth_waiting", 0.9, 1.0, "<="))
    strict = bound("<", 1000.0)  # proved: p90 >= 1000, which does not fail "<= 1000"
    assert proves(strict, SlaRule("ttft_ms", 0.9, 1000.0, "<")) and proves(strict, SlaRule("ttft_ms", 0.9, 999.0, "<="))
    assert not proves(strict, SlaRule("ttft_ms", 0.9, 1000.0, "<="))
    lower = bound(">=", 50.0, "tpot_ms", 0.1)  # proved: the quantile < 50
    assert proves(lower, SlaRule("tpot_ms", 0.1, 60.0, ">=")) and proves(lower, SlaRule("tpot_ms", 0.1, 50.0, ">"))
    assert not proves(lower, SlaRule("tpot_ms", 0.1, 40.0, ">="))
    assert not proves(bound(">", 50.0, "tpot_ms", 0.1), SlaRule("tpot_ms", 0.1, 50.0, ">="))
    assert proves(None, SlaRule("ttft_ms", 0.9, 1.0, "<=")) and not proves(None, SlaRule("queue_depth_waiting", 0.9, 1.0, "<="))


def test_time_checkpoints_see_a_queue_that_ends_no_request():
    """An overloaded replay ends few requests: besides one checkpoint per 2% of the requests ended
    (here 1 of 50), the monitor checks at the first check past each fiftieth of the arrival span."""
    m = SlaMonitor([SlaRule("ttft_ms", 0.9, 1000.0, "<=")], 50)  # needs 50 - floor(44.1) = 6
    m.begin(5000.0)  # arrivals over 5 s: a time checkpoint every 100 ms
    held = [(float(a), None, None) for a in range(0, 600, 100)]  # six requests, no first token yet
    assert m.check(50.0, 0, lambda: held) is None and m.checkpoints == 0  # before the first 100 ms
    assert m.check(1450.0, 0, lambda: held) is None and m.checkpoints == 1  # 1450 - 500 = 950 ms: 5 past
    assert m.check(1499.0, 0, lambda: held) is None and m.checkpoints == 1  # still in the same tenth of a second
    assert m.check(1500.0, 0, lambda: held) is None and m.checkpoints == 2  # the sixth at 1000 ms: not past
    assert m.check(1550.0, 0, lambda: held) is None and m.checkpoints == 2  # past, but no checkpoint before 1600
    assert m.check(1600.0, 0, lambda: held) == "q0.9 ttft_ms > 1000: 0 ended and 6 in flight of at most 50 requests"
    assert m.checkpoints == 3 and m.at_ms == 1600.0
    plain = SlaMonitor([SlaRule("ttft_ms", 0.9, 1000.0, "<=")], 50)  # never begun: request checkpoints only
    assert plain.check(1500.0, 0, lambda: held) is None and plain.checkpoints == 0
