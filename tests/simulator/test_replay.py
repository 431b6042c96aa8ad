"""Python API, report shape, determinism and summary definitions."""

from __future__ import annotations

import pytest

from aisim import run_config, run_synthetic_trace_replay, run_trace_replay
from aisim.simulator.config.loading import load_config
from aisim.simulator.errors import InputError
from aisim.simulator.metrics.output import canonical_json
from tests.conftest import ROOT, SLICE
from tests.helpers import WALL, without_wall

STATS = ("mean", "min", "max", "median", "p75", "p90", "p95", "p99", "std")


@pytest.fixture(scope="module")
def quick():
    cfg, cdir = load_config(ROOT / "configs" / "quickstart.yaml")
    return cfg, cdir


def test_report_shape_and_summary_keys(quick):
    rep = run_config(*quick)
    d = rep.to_dict()
    assert set(d) == {"summary", "per_request", "coverage", "planner"}
    assert d["planner"] is None and d["per_request"] is None
    assert d["coverage"] == {"capture_per_request": False, "capture_planner_details": False, "per_request_records": 0}
    s = rep.summary
    for fam in ("ttft", "ttst", "tpot", "itl", "e2e_latency"):
        for st in STATS:
            assert f"{st}_{fam}_ms" in s
    for st in STATS:
        assert f"{st}_output_token_throughput_per_user" in s
    for k in ("num_requests", "completed_requests", "total_input_tokens", "total_output_tokens", "duration_ms",
              "request_throughput_rps", "input_throughput_tok_s", "output_throughput_tok_s", "total_throughput_tok_s",
              "prefill_worker_seconds", "decode_worker_seconds", "prefill_gpus_per_worker", "decode_gpus_per_worker",
              "gpu_hours", "goodput_completed_requests", "goodput_request_throughput_rps",
              "goodput_output_throughput_tok_s", "prefix_cache_reused_ratio", "first_admission_prefix_cache_reused_ratio",
              "processed_tokens", "committed_prefill_tokens", "kv_eviction_policy", "prediction_provenance", *WALL):
        assert k in s, k
    assert s["completed_requests"] == s["num_requests"] == 1000
    assert (s["rejected_requests"], s["incomplete_requests"]) == (0, 0)
    assert s["rejection_reasons"] == {} and s["rejection_examples"] == {}
    assert s["prediction_provenance"]["aggregated"]["kv_capacity_blocks_per_rank"] == 29249
    # static pools: worker seconds = replicas x duration; aggregated is accounted under decode
    assert s["decode_worker_seconds"] == pytest.approx(2 * s["duration_ms"] / 1000)
    assert s["prefill_worker_seconds"] == 0 and s["decode_gpus_per_worker"] == 1
    assert s["gpu_hours"] == pytest.approx(s["decode_worker_seconds"] / 3600)
    assert s["request_throughput_rps"] == pytest.approx(1000 / (s["duration_ms"] / 1000))


def test_same_config_twice_is_byte_identical_apart_from_wall_time(quick):
    a = run_config(*quick, capture_per_request=True)
    b = run_config(*quick, capture_per_request=True)
    assert canonical_json(without_wall(a.to_dict())) == canonical_json(without_wall(b.to_dict()))
    assert a.summary["wall_time_ms"] > 0


def test_per_request_records_and_definitions():
    rep = run_synthetic_trace_replay(1024, 4, 2, replay_concurrency=2, capture_per_request=True,
                                     extra_engine_args={"timing_model": {"type": "fixed", "prefill_ms": 100, "decode_ms": 10}},
                                     sla_ttft_ms=100, sla_itl_ms=10)
    r = rep.per_request[0]
    assert r["ttft_ms"] == 100.0 and r["ttst_ms"] == 10.0 and r["itl_ms"] == 10.0 and r["e2e_latency_ms"] == 130.0
    assert r["terminal_status"] == "completed" and r["decode_worker_idx"] == 0 and r["admission_count"] == 1
    s = rep.summary
    assert s["mean_itl_ms"] == 10.0 and s["num_itl_samples"] == 6
    assert s["mean_output_token_throughput_per_user"] == 100.0
    assert s["goodput_completed_requests"] == 2
    assert s["total_output_tokens"] == 8 and s["duration_ms"] == 130.0


def test_goodput_rule_is_inclusive_and_checks_each_bound():
    common = dict(replay_concurrency=1, extra_engine_args={"timing_model": {"type": "fixed", "prefill_ms": 100, "decode_ms": 10}})
    assert run_synthetic_trace_replay(100, 3, 1, sla_ttft_ms=99.9, **common).summary["goodput_completed_requests"] == 0
    assert run_synthetic_trace_replay(100, 3, 1, sla_ttft_ms=100, sla_itl_ms=9.99, **common).summary["goodput_completed_requests"] == 0
    assert run_synthetic_trace_replay(100, 3, 1, sla_e2e_ms=120, **common).summary["goodput_completed_requests"] == 1
    assert "goodput_completed_requests" not in run_synthetic_trace_replay(100, 3, 1, **common).summary


def test_soft_stop_reports_in_flight_requests_incomplete():
    rep = run_trace_replay(str(SLICE), extra_engine_args={"num_gpu_blocks": 29249}, num_workers=2, max_sim_time_ms=60_000)
    s = rep.summary
    assert s["incomplete_requests"] > 0 and s["completed_requests"] + s["incomplete_requests"] == s["num_requests"]
    assert s["duration_ms"] <= 60_000 and s["num_requests"] < 1000


def test_api_errors_name_the_argument(tmp_path):
    with pytest.raises(InputError) as info:
        run_trace_replay(str(SLICE), extra_engine_args={"num_gpu_block": 5})
    assert info.value.where == "extra_engine_args.num_gpu_block"
    with pytest.raises(InputError) as info:
        run_trace_replay(str(SLICE), planner_config={"mode": "agg", "retune": {"interval_seconds": 600}})
    assert info.value.where == "planner_config.retune" and "trace_format='dynamo'" in info.value.message
    with pytest.raises(InputError) as info:
        run_trace_replay(str(SLICE), planner_config={"mode": "agg", "optimization_targt": "sla"})
    assert info.value.where == "planner_config.optimization_targt"
    with pytest.raises(InputError) as info:
        run_trace_replay(str(SLICE), router_mode="kv_router", router_config={"overlap_credit": 1})
    assert info.value.where == "router_config.overlap_credit"
    with pytest.raises(InputError) as info:
        run_trace_replay(str(SLICE), router_mode="least_loaded")
    assert info.value.where == "router_mode"
    with pytest.raises(InputError, match="exactly one"):
        run_synthetic_trace_replay(10, 1, 1)
