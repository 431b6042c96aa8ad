"""Capacity-search SLA rules over hand-made request_metrics.csv / worker_timeline.csv rows."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from aisim.search.capacity.sla import (
    KNOWN_METRICS,
    OPS,
    QUEUE_METRICS,
    REQUEST_METRICS,
    SlaRule,
    evaluate_rules,
    quantile,
    queue_metric_value,
    request_metric_values,
)


def req(i: int, status: str = "completed", delay: str = "", ttft: str = "", itl: str = "") -> dict:
    """A request_metrics.csv row as csv.DictReader gives it (strings; empty = missing)."""
    done = status == "completed"
    return {"request_id": str(i), "status": status, "arrival_time_s": str(float(i)),
            "first_admit_time_s": "", "first_token_time_s": "", "last_token_time_s": "",
            "input_tokens": "100", "output_tokens": "10" if done else "",
            "request_scheduling_delay": delay, "ttft_ms": ttft, "tpot_ms": "", "itl_ms": itl,
            "e2e_latency_ms": ""}


def tl(worker: int, start: float, duration: float, waiting: int, running: int = 0, kv: float = 0.0) -> dict:
    """A worker_timeline.csv row."""
    return {"worker_id": str(worker), "role": "aggregated", "start_s": str(start), "duration_s": str(duration),
            "queue_depth_waiting": str(waiting), "queue_depth_running": str(running),
            "kv_blocks_used": "0", "kv_usage": str(kv)}


# worker 0: waiting 0 for 3 s then 4 for 1 s       -> C = (0.75 at 0, 1 at 4)
# worker 1: 0 for 1 s, 1 for 1 s, 2 for 1 s, 0 for 1 s (0 held 2 s in all) -> C = (0.5 at 0, 0.75 at 1, 1 at 2)
TIMELINE = [
    tl(0, 0.0, 3.0, 0, running=2, kv=0.25), tl(0, 3.0, 1.0, 4, running=8, kv=0.5),
    tl(1, 0.0, 1.0, 0, running=1, kv=0.1), tl(1, 1.0, 1.0, 1, running=3, kv=0.3),
    tl(1, 2.0, 1.0, 2, running=3, kv=0.9), tl(1, 3.0, 1.0, 0, running=1, kv=0.1),
    tl(1, 4.0, 0.0, 9, running=9, kv=1.0),  # zero duration: never held
]


# -- rules ---------------------------------------------------------------------------------------

def test_rule_validation_and_unknown_metric_lists_the_known_ones():
    rule = SlaRule("request_scheduling_delay", 0.5, 2, "<=")
    assert (rule.quantile, rule.threshold, rule.kind) == (0.5, 2.0, "request")
    assert SlaRule("queue_depth_waiting", 1, 4, "<").kind == "queue"
    with pytest.raises(ValueError) as err:
        SlaRule("p99_latency", 0.5, 1.0, "<=")
    for name in KNOWN_METRICS:
        assert name in str(err.value)
    assert "p99_latency" in str(err.value)
    with pytest.raises(ValueError, match="known ops: <=, <, >=, >, =="):
        SlaRule("ttft_ms", 0.5, 1.0, "=<")


@pytest.mark.parametrize("q", [-0.1, 1.1, float("nan"), True, "0.5"])
def test_quantile_outside_unit_interval_is_rejected(q):
    with pytest.raises(ValueError, match=r"quantile must be a number in \[0, 1\]"):
        SlaRule("ttft_ms", q, 1.0, "<=")


def test_threshold_must_be_a_number():
    for bad in (float("nan"), "2", None):
        with pytest.raises(ValueError, match="threshold"):
            SlaRule("ttft_ms", 0.5, bad, "<=")


@pytest.mark.parametrize(("op", "at_2", "at_2_5", "at_1_5"), [
    ("<=", True, False, True),
    ("<", False, False, True),
    (">=", True, True, False),
    (">", False, True, False),
    ("==", True, False, False),
])
def test_each_op(op, at_2, at_2_5, at_1_5):
    rule = SlaRule("request_scheduling_delay", 0.5, 2.0, op)
    assert (rule.check(2.0), rule.check(2.5), rule.check(1.5), rule.check(None)) == (at_2, at_2_5, at_1_5, False)
    # through evaluate_rules: delays 1, 2, 3 -> median 2; delays 2, 3 -> median 2.5
    for delays, expected in (((1, 2, 3), at_2), ((2, 3), at_2_5)):
        rows = [req(i, delay=str(d)) for i, d in enumerate(delays)]
        ok, results = evaluate_rules([rule], rows, [])
        assert ok is expected
        assert results == [{"metric": "request_scheduling_delay", "quantile": 0.5, "op": op, "threshold": 2.0,
                            "value": 2.0 if len(delays) == 3 else 2.5, "passed": expected}]
    assert set(OPS) == {"<=", "<", ">=", ">", "=="}


# -- quantiles -----------------------------------------------------------------------------------

def test_quantile_linear_interpolation():
    x = [4.0, 1.0, 3.0, 2.0]  # sorted 1 2 3 4; h = 3 q
    assert quantile(x, 0.0) == 1.0
    assert quantile(x, 0.5) == 2.5
    assert quantile(x, 0.9) == pytest.approx(3.7)  # h = 2.7: 3 + 0.7 * (4 - 3)
    assert quantile(x, 1.0) == 4.0
    assert quantile([5.0], 0.3) == 5.0
    assert quantile([0.0, 10.0], 0.25) == 2.5
    with pytest.raises(ValueError):
        quantile([], 0.5)


def test_quantile_matches_numpy_bit_for_bit():
    rng = random.Random(7)
    for _ in range(200):
        x = [rng.uniform(0, 100) for _ in range(rng.randint(1, 30))]
        for q in (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0, rng.random()):
            assert quantile(x, q) == float(np.quantile(np.array(x), q))


def test_quantile_with_infinite_values():
    x = [1.0, 2.0, 3.0, math.inf]  # h = 3 q
    assert quantile(x, 0.5) == 2.5
    assert quantile(x, 2 / 3) == 3.0  # h = 2 exactly: no interpolation towards inf
    assert quantile(x, 0.7) == math.inf
    assert quantile(x, 1.0) == math.inf
    assert quantile([math.inf, math.inf], 0.5) == math.inf


def test_request_metric_values_split_completed_and_never_completed():
    rows = [req(0, delay="0.1", ttft="50"), req(1, delay="0.2", ttft="60", itl=""),
            req(2, "rejected"), req(3, "incomplete", delay="0.5"), req(4, delay="0.4", ttft="", itl="7.5")]
    assert request_metric_values(rows, "request_scheduling_delay") == ([0.1, 0.2, 0.4], 2)
    assert request_metric_values(rows, "ttft_ms") == ([50.0, 60.0], 2)  # an empty value is left out
    assert request_metric_values(rows, "itl_ms") == ([7.5], 2)
    assert request_metric_values([], "ttft_ms") == ([], 0)
    assert request_metric_values([{"status": "completed", "ttft_ms": 12}], "ttft_ms") == ([12.0], 0)
    with pytest.raises(ValueError, match="queue metric"):
        request_metric_values(rows, "queue_depth_waiting")
    with pytest.raises(ValueError, match="known metrics"):
        request_metric_values(rows, "goodput")
    with pytest.raises(ValueError, match="status"):
        request_metric_values([{"ttft_ms": "1"}], "ttft_ms")
    with pytest.raises(ValueError, match="'tpot_ms' column"):
        request_metric_values([{"status": "completed", "ttft_ms": "1"}], "tpot_ms")


def test_an_incomplete_request_fails_every_latency_rule():
    rows = [req(i, delay=str(d), ttft=str(t)) for i, (d, t) in enumerate(((0.1, 10), (0.2, 20), (0.3, 30), (0.4, 40)))]
    rules = [SlaRule("request_scheduling_delay", 0.5, 2.0, "<="), SlaRule("ttft_ms", 1.0, 100.0, "<")]
    ok, results = evaluate_rules(rules, rows, [])
    assert ok is True
    assert [(r["value"], r["passed"]) for r in results] == [(pytest.approx(0.25), True), (40.0, True)]
    # one request never completes: it enters the quantile as +inf and fails the rule regardless
    ok, results = evaluate_rules(rules, rows + [req(9, "incomplete")], [])
    assert ok is False
    assert results[0] == {"metric": "request_scheduling_delay", "quantile": 0.5, "op": "<=", "threshold": 2.0,
                          "value": 0.3, "passed": False}  # median of 0.1 0.2 0.3 0.4 inf
    assert (results[1]["value"], results[1]["passed"]) == (math.inf, False)
    # a rejected request too, even for a rule whose value would pass
    ok, results = evaluate_rules([SlaRule("ttft_ms", 0.0, 100.0, "<=")], rows + [req(9, "rejected")], [])
    assert (ok, results[0]["value"], results[0]["passed"]) == (False, 10.0, False)


def test_no_completed_request_is_value_none_and_failed():
    ok, results = evaluate_rules([SlaRule("ttft_ms", 0.5, 1e9, "<=")], [req(0, "rejected"), req(1, "rejected")], [])
    assert ok is False
    assert (results[0]["value"], results[0]["passed"]) == (None, False)
    ok, results = evaluate_rules([SlaRule("ttft_ms", 0.5, 1e9, "<=")], [], None)
    assert (ok, results[0]["value"]) == (False, None)


# -- queue metrics -------------------------------------------------------------------------------

def test_queue_metric_is_the_worst_workers_weighted_quantile():
    # the interpolated weighted quantile of simulator.metrics.timeline (the one the project uses):
    # worker 0: 0 (3 s), 4 (1 s): F = (0.75, 1) -> 0 up to q = 0.75, then 4 (q - 0.75) / 0.25
    # worker 1: 0 (2 s), 1 (1 s), 2 (1 s): F = (0.5, 0.75, 1) -> 0, then 1 at 0.75, then 2 at 1
    expected = {0.0: 0.0, 0.5: 0.0, 0.6: 0.4, 0.75: 1.0, 0.8: 1.2, 1.0: 4.0}
    for q, value in expected.items():
        assert queue_metric_value(TIMELINE, "queue_depth_waiting", q) == pytest.approx(value), q
    # running: worker 0 = 2 (3 s), 8 (1 s); worker 1 = 1 (2 s), 3 (2 s)
    assert queue_metric_value(TIMELINE, "queue_depth_running", 0.5) == 2.0
    assert queue_metric_value(TIMELINE, "queue_depth_running", 0.6) == 2.0  # worker 1: 1.4
    assert queue_metric_value(TIMELINE, "queue_depth_running", 0.9) == pytest.approx(5.6)  # worker 0: 2 + 6 x 0.6
    # kv_usage: worker 0 = 0.25 (3 s), 0.5 (1 s); worker 1 = 0.1 (2 s), 0.3, 0.9 (1 s each)
    assert queue_metric_value(TIMELINE, "kv_usage", 0.75) == pytest.approx(0.3)
    assert queue_metric_value(TIMELINE, "kv_usage", 1.0) == pytest.approx(0.9)


def test_queue_metric_reads_the_predict_timeline_column_names():
    rows = [{"worker_id": "0", "role": "", "start_s": "0", "duration_s": "3", "queue_depth_waiting": "0",
             "queue_depth_running": "1", "kv_blocks_used": "10", "kv_usage": "0.1"},
            {"worker_id": "0", "role": "", "start_s": "3", "duration_s": "1", "queue_depth_waiting": "4",
             "queue_depth_running": "2", "kv_blocks_used": "20", "kv_usage": "0.2"}]
    assert queue_metric_value(rows, "queue_depth_waiting", 0.75) == 0.0
    assert queue_metric_value(rows, "queue_depth_waiting", 0.8) == pytest.approx(0.8)  # 4 x (0.8 - 0.75) / 0.25
    assert queue_metric_value(rows, "queue_depth_running", 0.8) == pytest.approx(1.2)


def test_queue_metric_edge_cases():
    assert queue_metric_value([], "queue_depth_waiting", 0.5) is None
    assert queue_metric_value([tl(0, 0.0, 0.0, 3)], "queue_depth_waiting", 0.5) is None
    with pytest.raises(ValueError, match="request metric"):
        queue_metric_value(TIMELINE, "ttft_ms", 0.5)
    with pytest.raises(ValueError, match="known metrics"):
        queue_metric_value(TIMELINE, "queue_depth", 0.5)
    with pytest.raises(ValueError, match="no queue_depth_waiting column"):
        queue_metric_value([{"worker_id": "0", "duration_s": "1"}], "queue_depth_waiting", 0.5)
    with pytest.raises(ValueError):
        queue_metric_value(TIMELINE, "queue_depth_waiting", 2.0)


def test_evaluate_rules_mixes_request_and_queue_rules_in_rule_order():
    rows = [req(i, delay=str(d)) for i, d in enumerate((0.5, 1.0, 1.5, 3.0))]
    rules = [SlaRule("queue_depth_waiting", 1.0, 4, "<="),
             SlaRule("request_scheduling_delay", 0.5, 2.0, "<="),
             SlaRule("queue_depth_waiting", 0.75, 1, "<")]
    ok, results = evaluate_rules(rules, rows, TIMELINE)
    assert ok is False
    assert results == [
        {"metric": "queue_depth_waiting", "quantile": 1.0, "op": "<=", "threshold": 4.0, "value": 4.0, "passed": True},
        {"metric": "request_scheduling_delay", "quantile": 0.5, "op": "<=", "threshold": 2.0, "value": 1.25,
         "passed": True},
        {"metric": "queue_depth_waiting", "quantile": 0.75, "op": "<", "threshold": 1.0, "value": 1.0, "passed": False},
    ]
    # queue rules look at the timeline only: an incomplete request fails latency rules, not queue rules
    ok, results = evaluate_rules(rules[:1], rows + [req(9, "incomplete")], TIMELINE)
    assert ok is True
    # no timeline -> value None, failed
    ok, results = evaluate_rules(rules[:1], rows, None)
    assert (ok, results[0]["value"], results[0]["passed"]) == (False, None, False)
    assert evaluate_rules([], rows, TIMELINE) == (True, [])
    assert set(REQUEST_METRICS) | set(QUEUE_METRICS) == set(KNOWN_METRICS)
