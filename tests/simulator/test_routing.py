"""Routing on the real conversation trace: the KV router beats round robin."""

from __future__ import annotations

import pytest

from aisim import run_trace_replay
from aisim.simulator.metrics.output import canonical_json
from tests.conftest import SLICE
from tests.helpers import without_wall


@pytest.fixture(scope="module")
def runs():
    out = {}
    for mode in ("round_robin", "kv_router"):
        out[mode] = run_trace_replay(str(SLICE), extra_engine_args={"num_gpu_blocks": 29249}, num_workers=4,
                                     router_mode=mode, capture_per_request=True)
    return out


def test_kv_router_reuses_more_prefix_and_lowers_ttft_than_round_robin(runs):
    rr, kv = runs["round_robin"].summary, runs["kv_router"].summary
    assert kv["prefix_cache_reused_ratio"] > rr["prefix_cache_reused_ratio"]
    assert kv["mean_ttft_ms"] < rr["mean_ttft_ms"]
    assert kv["completed_requests"] == rr["completed_requests"] == 1000


def test_kv_router_records_its_decisions(runs):
    recs = runs["kv_router"].per_request
    hits = [r for r in recs if r["routing_history"][0]["selected_overlap_blocks"]]
    assert hits and all(r["routing_history"][0]["overlap_regret_blocks"] >= 0 for r in recs)
    assert runs["kv_router"].summary["deployment"]["router"] == {
        "policy": "kv_router", "overlap_score_credit": 1.0, "prefill_load_scale": 1.0, "temperature": 0.0,
        "track_prefill_tokens": True, "track_active_blocks": True}


@pytest.mark.parametrize("mode,config", [("random", None), ("kv_router", {"temperature": 0.5})])
def test_seeded_routing_is_reproducible_and_the_seed_matters(mode, config):
    kw = dict(extra_engine_args={"num_gpu_blocks": 29249}, num_workers=3, router_mode=mode, router_config=config,
              max_sim_time_ms=60_000)
    a = run_trace_replay(str(SLICE), seed=1, **kw)
    b = run_trace_replay(str(SLICE), seed=1, **kw)
    c = run_trace_replay(str(SLICE), seed=2, **kw)
    assert canonical_json(without_wall(a.to_dict())) == canonical_json(without_wall(b.to_dict()))
    assert canonical_json(without_wall(a.to_dict())) != canonical_json(without_wall(c.to_dict()))


def test_kv_router_fast_forward_equals_stepping():
    kw = dict(extra_engine_args={"num_gpu_blocks": 2500, "dp_size": 2}, num_workers=2, router_mode="kv_router",
              capture_per_request=True, max_sim_time_ms=100_000)
    fast = run_trace_replay(str(SLICE), fast_forward=True, **kw)
    step = run_trace_replay(str(SLICE), fast_forward=False, **kw)
    assert fast.summary["num_preemptions"] > 0
    assert canonical_json(without_wall(fast.to_dict())) == canonical_json(without_wall(step.to_dict()))
