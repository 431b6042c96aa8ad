"""Disaggregated prefill/decode: handoff, KV transfer, TTFT composition, accounting."""

from __future__ import annotations

import pytest

from aisim import run_config, run_trace_replay
from aisim.simulator.config.loading import validate_config
from aisim.simulator.metrics.output import canonical_json
from tests.conftest import SLICE
from tests.helpers import by_uuid, without_wall, write_trace

FIXED = {"type": "fixed", "prefill_ms": 100, "decode_ms": 10}


def row(t, inp, out, ids, rid):
    return {"timestamp": t, "input_length": inp, "output_length": out, "hash_ids": ids, "request_id": f"r{rid}"}


def disagg(tmp_path, rows, prefill=None, decode=None, **kw):
    trace = write_trace(tmp_path / "t.jsonl", rows)
    return run_trace_replay(str(trace), prefill_engine_args=prefill or {}, decode_engine_args=decode or {},
                            capture_per_request=True, **kw)


def test_128_token_prompt_at_1e6_bytes_per_token_over_1_gb_s_adds_a_128_ms_transfer(tmp_path):
    pre = {"timing_model": FIXED, "kv_transfer_bandwidth": 1.0, "kv_transfer_bytes_per_token": 1_000_000}
    rep = disagg(tmp_path, [row(0, 128, 3, [1], 1)], pre, {"timing_model": FIXED})
    r = by_uuid(rep)["r1"]
    assert r["kv_transfer_ms"] == 128.0 and r["kv_transfer_tokens"] == 128
    # TTFT = prefill 100 + transfer 128 + the decode worker's first pass 10
    assert r["ttft_ms"] == 238.0 and r["e2e_latency_ms"] == 258.0
    assert (r["source_held_ms"], r["destination_activated_ms"], r["source_released_ms"]) == (100.0, 228.0, 228.0)
    assert (r["prefill_admit_ms"], r["decode_admit_ms"]) == (0.0, 228.0)
    assert (r["prefill_worker_idx"], r["decode_worker_idx"]) == (0, 1)
    assert [h["pool"] for h in r["admission_history"]] == ["prefill", "decode"]
    assert [h["pool"] for h in r["routing_history"]] == ["prefill", "decode"]
    assert r["output_length"] == 3 and r["readmission_count"] == 0
    assert rep.summary["mean_handoff_to_first_token_ms"] == 10.0


def test_destination_missing_charges_only_blocks_the_decode_worker_lacks(tmp_path):
    pre = {"timing_model": FIXED, "kv_transfer_bandwidth": 1.0, "kv_transfer_bytes_per_token": 1_000_000,
           "kv_transfer_timing_mode": "destination_missing", "block_size": 16}
    dec = {"timing_model": FIXED, "block_size": 16}
    rows = [row(0, 128, 2, [1], 1), row(5_000, 128, 2, [1], 2)]  # the same prompt again, later
    r = by_uuid(disagg(tmp_path, rows, pre, dec))
    assert r["r1"]["kv_transfer_tokens"] == 128 and r["r1"]["kv_transfer_ms"] == 128.0
    # the decode worker still caches r1's prompt: only the last block (never reused) moves
    assert r["r2"]["kv_transfer_tokens"] == 16 and r["r2"]["kv_transfer_ms"] == 16.0
    assert r["r2"]["decode_reused_input_tokens"] == 112
    full = by_uuid(disagg(tmp_path, rows, {**pre, "kv_transfer_timing_mode": "full_prompt"}, dec))
    assert full["r2"]["kv_transfer_ms"] == 128.0


def test_reference_lone_2048_prompt_polynomial_zero_transfer_ttft_55_208(tmp_path):
    rep = disagg(tmp_path, [row(0, 2048, 2, [1, 2, 3, 4], 1)])
    assert round(by_uuid(rep)["r1"]["ttft_ms"], 3) == 55.208  # 49.363 prefill + 5.845 first decode pass


def test_gpu_hours_and_worker_seconds_cover_both_pools(tmp_path):
    rep = disagg(tmp_path, [row(0, 512, 4, [1], 1)], {"tensor_parallel_size": 2, "timing_model": FIXED},
                 {"tensor_parallel_size": 4, "timing_model": FIXED}, num_prefill_workers=2, num_decode_workers=3)
    s = rep.summary
    d = s["duration_ms"] / 1000
    assert s["prefill_worker_seconds"] == pytest.approx(2 * d) and s["decode_worker_seconds"] == pytest.approx(3 * d)
    assert (s["prefill_gpus_per_worker"], s["decode_gpus_per_worker"]) == (2, 4)
    assert s["gpu_hours"] == pytest.approx((2 * d * 2 + 3 * d * 4) / 3600)
    assert s["deployment"]["mode"] == "disaggregated" and s["deployment"]["workers"] == {"prefill": 2, "decode": 3}


def test_prefill_kv_is_held_until_the_transfer_completes(tmp_path):
    # one prefill block pool of 10 blocks: r2 cannot start until r1's KV has been transferred out
    pre = {"timing_model": FIXED, "num_gpu_blocks": 10, "block_size": 16, "kv_transfer_bandwidth": 1.0,
           "kv_transfer_bytes_per_token": 1_000_000}
    rows = [row(0, 128, 2, [1], 1), row(0, 128, 2, [2], 2)]
    r = by_uuid(disagg(tmp_path, rows, pre, {"timing_model": FIXED}))
    assert r["r1"]["source_released_ms"] == 228.0
    assert r["r2"]["prefill_admit_ms"] == 228.0  # 8 + 8 blocks do not fit in 10 while r1's are held


def test_config_disaggregated_with_kv_router_and_determinism(tmp_path):
    cfg = validate_config({
        "traffic": {"source": {"type": "trace", "paths": [str(SLICE)]}, "load": {"type": "trace_timestamps"},
                    "stop": {"max_virtual_time_seconds": 120}},
        "engine": {"mode": "disaggregated", "model": "meta-llama/Llama-3.1-8B-Instruct", "hardware": "h200_sxm",
                   "kv_transfer": {"bandwidth_gb_per_second": 25},
                   "workers": {"prefill": {"parallelism": {"replicas": 2}, "timing": {"type": "polynomial"},
                                           "kv_cache": {"capacity": {"type": "fixed", "blocks": 8000}}},
                               "decode": {"parallelism": {"replicas": 2}, "timing": {"type": "polynomial"},
                                          "kv_cache": {"capacity": {"type": "fixed", "blocks": 8000}}}}},
        "router": {"policy": "kv_router"},
    })
    a = run_config(cfg, capture_per_request=True)
    b = run_config(cfg, capture_per_request=True)
    assert canonical_json(without_wall(a.to_dict())) == canonical_json(without_wall(b.to_dict()))
    s = a.summary
    assert s["completed_requests"] > 300 and s["prefix_cache_reused_ratio"] > 0
    assert s["deployment"]["router"]["policy"] == "kv_router" and s["deployment"]["decode_router"]["policy"] == "decode_load"
    assert s["deployment"]["kv_transfer"]["bytes_per_token"] == 131_072  # auto: the prefill role's KV bytes per token
    assert s["prediction_provenance"]["prefill"]["kv_capacity_blocks_per_rank"] == 8000
    rec = a.per_request[0]
    assert rec["kv_transfer_ms"] == pytest.approx(rec["kv_transfer_tokens"] * 131_072 / 25e9 * 1000)


@pytest.mark.parametrize("router", ["round_robin", "kv_router"])
def test_disaggregated_fast_forward_equals_stepping(tmp_path, router):
    kw = dict(prefill_engine_args={"num_gpu_blocks": 3000, "kv_transfer_bandwidth": 50.0,
                                   "kv_transfer_bytes_per_token": 131_072},
              decode_engine_args={"num_gpu_blocks": 1200}, num_prefill_workers=2, num_decode_workers=2,
              router_mode=router, capture_per_request=True, max_sim_time_ms=90_000)
    fast = run_trace_replay(str(SLICE), fast_forward=True, **kw)
    step = run_trace_replay(str(SLICE), fast_forward=False, **kw)
    assert fast.summary["num_preemptions"] > 0  # decode workers recompute after preemption
    assert canonical_json(without_wall(fast.to_dict())) == canonical_json(without_wall(step.to_dict()))


@pytest.mark.parametrize("backend", ["ray", "local"])
def test_trtllm_destinations_reserve_before_the_transfer_and_fast_forward_equals_stepping(tmp_path, backend,
                                                                                           request):
    # TRT-LLM decode workers short of KV: handed-off requests wait on the prefill workers (their
    # KV held) until a decode worker reserves prompt + maximum output, then transfer
    if backend == "ray":
        request.getfixturevalue("ray_session")
    engine = {"engine_type": "trtllm", "block_size": 32, "kv_transfer_bandwidth": 50.0,
              "kv_transfer_bytes_per_token": 131_072}
    kw = dict(prefill_engine_args={**engine, "num_gpu_blocks": 20000},
              decode_engine_args={**engine, "num_gpu_blocks": 4000}, num_prefill_workers=2, num_decode_workers=2,
              capture_per_request=True, max_sim_time_ms=90_000)
    fast = run_trace_replay(str(SLICE), fast_forward=True, **kw)
    step = run_trace_replay(str(SLICE), fast_forward=False, **kw)
    assert canonical_json(without_wall(fast.to_dict())) == canonical_json(without_wall(step.to_dict()))
    waited = [r for r in fast.per_request if r.get("destination_reserved_ms") is not None
              and r["destination_reserved_ms"] > r["source_held_ms"]]
    assert waited  # some reservations waited for completions on the decode workers
    for r in waited:  # the source holds the KV until the transfer that starts at the reservation ends
        assert r["source_released_ms"] == pytest.approx(r["destination_reserved_ms"] + r["kv_transfer_ms"])
    assert fast.summary["num_preemptions"] == 0
    if backend == "ray":  # the same report when the workers live in Ray actors
        ray = run_trace_replay(str(SLICE), fast_forward=True, backend="ray", engine_actors=2, **kw)
        assert canonical_json(without_wall(ray.to_dict())) == canonical_json(without_wall(fast.to_dict()))
