"""The predict table: every statistic in the full layout, a compact layout that fits the terminal,
counts, and the Planner's replica range, scaling events and retune decisions."""

from __future__ import annotations

import pytest

from aisim.simulator.metrics.table import render_table, replicas_over_time

STATS = {"mean": 949.34, "min": 35.72, "max": 5201.7, "p99": 3967.07, "p95": 2618.43, "p90": 2155.36,
         "p75": 1245.54, "median": 711.58, "std": 852.31}


def summary(**extra) -> dict:
    s = {f"{k}_ttft_ms": v for k, v in STATS.items()}
    s.update({f"{k}_itl_ms": v / 100 for k, v in STATS.items()})
    s.update(completed_requests=990, rejected_requests=7, incomplete_requests=3, output_throughput_tok_s=1038.07,
             request_throughput_rps=2.97, wall_time_ms=12.5, duration_ms=40000.0, gpu_hours=0.187,
             rejection_reasons={"context_length": 7},
             rejection_examples={"context_length": "prompt of 9,000 tokens >= context length 8,192"},
             deployment={"mode": "aggregated", "workers": {"aggregated": 2}, "gpus": 2,
                         "router": {"policy": "round_robin"}})
    s.update(extra)
    return s


def cells(text: str, label: str) -> list[str]:
    (line,) = [x for x in text.splitlines() if x.startswith(f"│ {label} ")]
    return [c.strip() for c in line.split("│")[1:-1]]


def test_the_full_layout_shows_every_statistic_of_the_summary():
    text = render_table(summary())
    header = [c.strip() for c in next(x for x in text.splitlines() if x.startswith("┃ Metric")).split("┃")[1:-1]]
    assert header == ["Metric", "avg", "min", "max", "p99", "p95", "p90", "p75", "p50", "std"]
    assert cells(text, "Time to First Token (ms)")[1:] == ["949.34", "35.72", "5,201.70", "3,967.07", "2,618.43",
                                                           "2,155.36", "1,245.54", "711.58", "852.31"]
    assert cells(text, "Completed Requests (requests)")[1] == "990"
    assert cells(text, "Rejected Requests (requests)")[1] == "7"
    assert cells(text, "Incomplete Requests (requests)")[1] == "3"
    assert "Rejected (context_length): 7 requests, e.g. prompt of 9,000 tokens >= context length 8,192" in text
    assert "Time to Second Token" not in text  # a family the summary lacks gets no row


@pytest.mark.parametrize("width", [80, 99])
def test_a_narrow_terminal_gets_the_compact_layout_within_its_width(width):
    text = render_table(summary(), width=width)
    table = [x for x in text.splitlines() if x[:1] in "┏┃┡│└"]
    assert table and all(len(x) <= width for x in table)
    header = [c.strip() for c in table[1].split("┃")[1:-1]]
    assert header == ["Metric", "avg", "p50", "p90", "p95", "p99", "max"]
    assert cells(text, "TTFT (ms)")[1:] == ["949", "712", "2,155", "2,618", "3,967", "5,202"]
    assert cells(text, "ITL (ms)")[1:] == ["9.49", "7.12", "21.6", "26.2", "39.7", "52.0"]
    assert "Requests: 990 completed, 7 rejected, 3 incomplete" in text
    assert "Throughput: 1,038.07 output tokens/s, 2.97 requests/s" in text


def test_a_wide_terminal_keeps_the_full_layout():
    assert render_table(summary(), width=300) == render_table(summary())


PLANNER = {"total_ticks": 8, "retune_events": None, "scaling_events": [
    {"at_s": 10.0, "component": "agg", "from_count": 2, "to_count": 3, "reason": "scale_up"},
    {"at_s": 30.0, "component": "agg", "from_count": 3, "to_count": 1, "reason": "scale_down"}]}


def test_replicas_over_time_is_the_time_weighted_count_per_slice():
    got = replicas_over_time(PLANNER, {"duration_ms": 40000.0}, buckets=4)
    # slices of 10 s: 2, 3, 3, 1 replicas -> levels round((n - 1) * 7 / 2) of 0..7 (half to even)
    assert got == {"agg": {"start": 2, "min": 1, "max": 3, "end": 1, "events": 2, "sparkline": "▅██▁"}}
    half = replicas_over_time(PLANNER, {"duration_ms": 40000.0}, buckets=2)["agg"]["sparkline"]
    assert half == "▆▅"  # (2*10 + 3*10) / 20 = 2.5 -> level 5.25 -> 5; (3*10 + 1*10) / 20 = 2 -> 3.5 -> 4


def test_a_planner_run_shows_its_scaling_and_retune_decisions():
    text = render_table(summary(), planner=PLANNER, width=80)
    assert "Deployment: aggregated, 2 aggregated workers at the start (2 GPUs), router round_robin" in text
    assert "Planner: 2 scaling events (1 up, 1 down), 8 ticks" in text
    assert "  agg: 2 -> 1 replicas, 1-3 over the run  " in text
    assert "Retune" not in text
    retuned = dict(PLANNER, retune_events=[{"outcome": "applied"}, {"outcome": "kept"}, {"outcome": "applied"}])
    assert "Retune: 3 decisions, 2 applied" in render_table(summary(), planner=retuned)
    assert "Planner" not in render_table(summary())
