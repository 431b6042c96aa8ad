"""``aisim validate``: the resolved numbers equal what a run reports (provenance, deployment,
rejections), and search/capacity configs validate without replaying."""

from __future__ import annotations

import json

import pytest

from aisim.simulator.config.loading import load_config
from aisim.simulator.errors import InputError
from aisim.simulator.plan import plan_from_config
from aisim.simulator.run import run_plan
from aisim.validate import detect_kind, render, validate_config_file
from tests.conftest import ROOT

CONFIGS = ROOT / "configs"
QUICKSTART = CONFIGS / "quickstart.yaml"


def _run(path, overrides=()):
    cfg, config_dir = load_config(path, list(overrides))
    return run_plan(plan_from_config(cfg, config_dir)).summary


@pytest.fixture(scope="module")
def quickstart_run():
    return _run(QUICKSTART)


def test_quickstart_report_equals_a_runs_provenance(quickstart_run):
    report = validate_config_file(QUICKSTART)
    assert report["kind"] == "predict"
    json.dumps(report)  # JSON-able (the CLI's --format json)
    s = quickstart_run
    assert report["deployment"] == s["deployment"]
    for pool in report["pools"]:
        prov = s["prediction_provenance"][pool["role"]]
        assert pool["provenance"] == prov
        assert pool["kv_blocks_per_rank"] == prov["kv_capacity_blocks_per_rank"] == 29249
        assert pool["block_size"] == prov["kv_block_size"] == 64
        assert pool["context_length"] == prov["context_length"] == 131072
        assert pool["gpus_per_worker"] == prov["gpus_per_worker"]
        assert pool["timing_estimator"] == prov["estimator"] == "polynomial"
        assert pool["model_source"] == prov["model_source"] == "bundled:aisim"
    assert sum(p["gpus"] for p in report["pools"]) == s["deployment"]["gpus"] == 2
    t = report["traffic"]
    assert t["rows"] == s["num_requests"] == 1000
    assert t["rejected_rows"] == s["rejected_requests"] == 0
    assert t["total_input_tokens"] > 0 and t["total_output_tokens"] > 0
    assert 300 < t["trace_span_seconds"] < 400  # ~5 minutes of the trace
    assert report["planner"]["enabled"] is False
    text = render(report)
    assert "29,249 blocks/rank" in text and "rows 1,000" in text and "planner: off" in text


def test_context_length_rejections_equal_the_replays():
    overrides = ["engine.context_length=2048"]
    report = validate_config_file(QUICKSTART, overrides)
    t = report["traffic"]
    s = _run(QUICKSTART, overrides)
    assert t["context_length"] == 2048 == s["prediction_provenance"]["aggregated"]["context_length"]
    assert t["rejected_rows"] > 0 and t["kv_overflow_rows"] == 0
    assert t["rejected_context_length"] == t["rejected_rows"] == s["rejected_requests"]
    assert t["rejection_reasons"] == s["rejection_reasons"] == {"context_length": t["rejected_rows"]}
    assert t["truncated_by_context"] > 0  # prompt fits, prompt + output does not: generation cut, not rejected
    assert s["completed_requests"] == t["rows"] - t["rejected_rows"]
    assert f"context_length {t['rejected_rows']}" in render(report)


def test_kv_capacity_rejections_and_overflow():
    overrides = ["engine.workers.aggregated.kv_cache.capacity={type: fixed, blocks: 40}"]
    report = validate_config_file(QUICKSTART, overrides)
    t = report["traffic"]
    s = _run(QUICKSTART, overrides)
    assert report["pools"][0]["provenance"] == s["prediction_provenance"]["aggregated"]
    assert set(t["rejection_reasons"]) == set(s["rejection_reasons"]) == {"kv_capacity"}
    # rows that fit at admission but outgrow the cache stall the replay: the static count is an upper bound
    assert t["kv_overflow_rows"] > 0 and s["incomplete_requests"] > 0
    assert 0 < s["rejected_requests"] <= t["rejected_rows"]
    assert "WARNING" in render(report)
    assert validate_config_file(QUICKSTART)["traffic"]["kv_overflow_rows"] == 0


def test_disaggregated_deployment_equals_a_runs():
    path = CONFIGS / "disaggregated-1p1d.yaml"
    overrides = ["traffic.stop={max_virtual_time_seconds: 20}"]
    report = validate_config_file(path, overrides)
    s = _run(path, overrides)
    assert report["deployment"] == s["deployment"]
    assert {p["role"]: p["provenance"] for p in report["pools"]} == s["prediction_provenance"]
    assert report["traffic"]["stop_seconds"] == 20


def test_kv_tiers_and_their_router_weights_are_reported_as_a_run_reports_them():
    # a shared G2 pool, a G3 store per worker, the KV router weighing host blocks 0.6 (disk: the
    # default 0.25); Llama-3.1-8B keeps 131,072 bytes of KV per token: 64-token blocks of 8,388,608 B
    sets = ["traffic.stop={max_virtual_time_seconds: 20}", "router={policy: kv_router, host_cache_hit_weight: 0.6}",
            "engine.workers.aggregated.kv_cache={block_size: 64, capacity: {type: fixed, blocks: 3000}, "
            "host_offload: {scope: cluster_shared, num_host_blocks: 20000, h2d_bandwidth_gbps: 16}, "
            "g3_offload: {scope: worker_local, num_g3_blocks: 50000, latency_to_first_byte_ms: 0.5}}"]
    report = validate_config_file(QUICKSTART, sets)
    s = _run(QUICKSTART, sets)
    prov = report["pools"][0]["provenance"]
    assert prov == s["prediction_provenance"]["aggregated"] and report["deployment"] == s["deployment"]
    assert prov["host_offload"] == {"scope": "cluster_shared", "num_host_blocks": 20000, "block_bytes": 8388608,
                                    "d2h_bandwidth_gbps": 32.0, "h2d_bandwidth_gbps": 16.0,
                                    "shared_d2h_bandwidth_gbps": 80.0, "shared_h2d_bandwidth_gbps": 80.0,
                                    "latency_to_first_byte_ms": 0.0}
    assert prov["g3_offload"] == {"scope": "worker_local", "num_g3_blocks": 50000, "block_bytes": 8388608,
                                  "read_bandwidth_gbps": 10.0, "write_bandwidth_gbps": 10.0,
                                  "latency_to_first_byte_ms": 0.5}  # (no shared caps: a store per worker)
    router = s["deployment"]["router"]
    assert router["host_cache_hit_weight"] == 0.6 and router["disk_cache_hit_weight"] == 0.25
    text = render(report)
    assert ("host tier (G2): 20,000 blocks in one pool (cluster_shared) of 8.4 MB; links G1->G2 / G2->G1 32 / 16 GB/s "
            "per rank, 80 / 80 GB/s shared; first byte 0 ms") in text
    assert ("disk tier (G3): 50,000 blocks per worker (worker_local) of 8.4 MB; links write / read 10 / 10 GB/s per "
            "worker; first byte 0.5 ms") in text
    assert "host_cache_hit_weight=0.6, disk_cache_hit_weight=0.25" in text
    # without tiers nothing of them is reported (the bundled configs' outputs stay as they were)
    plain = validate_config_file(QUICKSTART, ["router={policy: kv_router}"])
    assert "host_offload" not in plain["pools"][0]["provenance"] and "tier" not in render(plain)
    assert "host_cache_hit_weight" not in plain["deployment"]["router"]


@pytest.mark.parametrize(("backend", "says"), [
    ("vllm", "scheduler vllm (admit by current blocks; recompute preemption)"),
    ("trtllm", "scheduler trtllm GUARANTEED_NO_EVICT (reserve prompt + max output; no preemption)"),
    ("sglang", "scheduler sglang (lpm; prefill passes of 4,096-token chunks, max prefill 16,384 tokens"),
])
def test_the_backend_and_its_scheduler_settings_are_printed(backend, says):
    sets = [f"engine.backend={backend}"]
    if backend == "sglang":  # (its own knobs; attention-data ranks split the chunk budget)
        sets += ["engine.workers.aggregated.scheduler.sglang={schedule_policy: lpm}",
                 "engine.workers.aggregated.parallelism.attention_data=2"]
    text = render(validate_config_file(QUICKSTART, sets))
    assert says in text and f"backend {backend}" in text


def test_spica_example(tmp_path):
    path = CONFIGS / "spica-agg-vs-disagg.yaml"
    report = validate_config_file(path)
    assert report["kind"] == "recommend"
    assert report["sampler"] == "random" and report["max_trials"] == 32 and report["target"] == "goodput_per_gpu"
    assert report["pruner"] == "none"
    assert [b["mode"] for b in report["branches"]] == ["agg", "disagg"]
    # the grid the search itself builds (its Optuna studies in a journal under tmp_path)
    from aisim.search.spica.config import load_search_config
    from aisim.search.spica.loop import _Search

    cfg, config_dir = load_search_config(path)
    search = _Search(cfg, config_dir, tmp_path, resume=False, storage=None, fan=None, progress=None)
    built = search.branches(search.location.open())
    assert [(b["mode"], b["worker_shapes"], b["grid_size"]) for b in report["branches"]] == \
        [(b.mode, len(b.shapes), b.size()) for b in built]
    assert all(b["grid_size"] > 0 for b in report["branches"])
    over = validate_config_file(path, ["optimizer.max_trials=7"])
    assert over["max_trials"] == 7
    assert "branch disagg" in render(report)


def test_capacity_example():
    report = validate_config_file(CONFIGS / "capacity-search.yaml")
    assert report["kind"] == "capacity"
    assert [j["name"] for j in report["jobs"]] == ["round_robin", "kv_router_grid"]
    assert [j["mode"] for j in report["jobs"]] == ["adaptive", "linear"]
    assert report["jobs"][0]["start_qps"] == 4 and report["jobs"][1]["qps_list"] == [20, 30, 40]
    assert [r["metric"] for r in report["sla"]] == ["ttft_ms", "queue_depth_waiting"]
    assert report["benchmark_timeout_seconds"] == 300
    base = report["base"]
    assert base["deployment"]["gpus"] == 2 and base["pools"][0]["kv_blocks_per_rank"] == 29249
    assert base["traffic"]["rows"] == 1000 and base["traffic"]["total_input_tokens"] == 2048 * 1000
    assert "job kv_router_grid: linear" in render(report)


def test_detect_kind():
    assert detect_kind({"search_space": {}}) == "recommend"
    assert detect_kind({"benchmark_base": {}, "jobs": []}) == "capacity"
    assert detect_kind({"benchmark_base": {}}) == "predict"
    assert detect_kind({"engine": {}}) == "predict"


@pytest.mark.parametrize("text,overrides", [
    ("engine: {mode: aggregated, nonsense: 1}\n", []),
    (None, ["router.policy=nope"]),
    (None, ["traffic.source.paths=[missing.jsonl]"]),
    ("search_space: {deployment_mode: [agg]}\n", []),
    ("benchmark_base: {engine: {}}\njobs: [{name: a, start_qps: 1}]\n", []),
], ids=["unknown_key", "bad_override", "missing_trace", "bad_search", "bad_capacity"])
def test_bad_config_raises_one_line_input_error(tmp_path, text, overrides):
    path = QUICKSTART
    if text is not None:
        path = tmp_path / "bad.yaml"
        path.write_text(text)
    with pytest.raises(InputError) as exc:
        validate_config_file(path, overrides)
    assert "\n" not in str(exc.value)


def test_missing_file_raises_input_error(tmp_path):
    with pytest.raises(InputError):
        validate_config_file(tmp_path / "nope.yaml")
