"""Retune's score and keep rule with exact expectations."""

from __future__ import annotations

import math

from aisim.search.retune.scoring import improvement_pct, score, should_switch


def test_the_score_is_goodput_output_tokens_per_gpu_hour():
    assert score({"goodput_output_tokens": 90_000, "gpu_hours": 0.5}) == 180_000.0
    assert score({"goodput_output_tokens": 0, "gpu_hours": 0.5}) == 0.0
    assert score({"gpu_hours": 0.0}) == 0.0  # no SLA set or nothing ran


def test_the_keep_rule_switches_only_above_the_threshold():
    assert math.isclose(improvement_pct(100.0, 103.0), 3.0) and improvement_pct(0.0, 5.0) == math.inf
    assert not should_switch(100.0, 103.0, 3.0)  # exactly 3 %: keep
    assert not should_switch(200.0, 206.0, 3.0)  # exactly 3 %: keep
    assert should_switch(200.0, 206.2, 3.0)
    assert not should_switch(200.0, 150.0, 3.0)
    assert should_switch(0.0, 1.0, 3.0) and not should_switch(0.0, 0.0, 3.0)  # any positive best beats 0


def test_a_replay_summary_carries_its_goodput_output_tokens():
    from aisim import run_synthetic_trace_replay

    r = run_synthetic_trace_replay(512, 8, 20, replay_concurrency=4, sla_ttft_ms=10_000, sla_itl_ms=1_000,
                                   extra_engine_args={"num_gpu_blocks": 2000})
    s = r.summary
    assert s["goodput_completed_requests"] == 20 and s["goodput_output_tokens"] == 20 * 8
    assert score(s) == 160 / s["gpu_hours"]
