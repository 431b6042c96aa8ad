"""The full Mooncake conversation trace (slow; run with ``-m slow``). Skipped when the trace
is not next to the checkout (../shared/traces)."""

from __future__ import annotations

import pytest

from simulator.config.loading import load_config
from simulator.metrics.output import canonical_json
from simulator.replay import run_config
from tests.conftest import ROOT, SHARED_TRACES
from tests.helpers import without_wall

TRACE = SHARED_TRACES / "conversation_trace.jsonl"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not TRACE.is_file(), reason="full trace not available")]


def test_aggregated_baseline_runs_the_whole_hour_deterministically():
    cfg, cdir = load_config(ROOT / "configs" / "aggregated-baseline.yaml", [f"traffic.source.paths=[{TRACE}]"])
    a = run_config(cfg, cdir)
    s = a.summary
    assert s["num_requests"] == s["completed_requests"] == 12031
    assert 3.5e6 < s["duration_ms"] < 3.7e6
    assert 0 < s["prefix_cache_reused_ratio"] < 1 and s["num_preemptions"] == 0
    b = run_config(cfg, cdir)
    assert canonical_json(without_wall(a.to_dict())) == canonical_json(without_wall(b.to_dict()))


def test_full_trace_fast_forward_equals_stepping():
    cfg, cdir = load_config(ROOT / "configs" / "aggregated-baseline.yaml",
                            [f"traffic.source.paths=[{TRACE}]", "engine.workers.aggregated.kv_cache.capacity.blocks=6000"])
    fast = run_config(cfg, cdir, fast_forward=True)
    step = run_config(cfg, cdir, fast_forward=False)
    assert fast.summary["num_preemptions"] > 0
    assert canonical_json(without_wall(fast.to_dict())) == canonical_json(without_wall(step.to_dict()))
