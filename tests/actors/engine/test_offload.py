"""Host (G2) and disk (G3) KV tiers, scenario by scenario, with hand-derived times.

Every scenario: vLLM, fixed timing (a prefill pass 10 ms, a decode pass 1 ms), 16-token blocks of
62,500 bytes per token, so one block is 1,000,000 bytes and 1 GB/s moves a block per millisecond.
A = blocks [1, 2, 3, 4], B = [5, 6, 7, 8]; each request is 64 prompt tokens (4 full blocks) and 2
output tokens unless it says otherwise. vLLM reuses at most the prompt's first 3 blocks (its last
token is always computed). The same scenarios ran through the reference simulator give the same
times (docs/dev/reference-kv-offload.md section 13).
"""

from __future__ import annotations

import gc

import pytest

from aisim import run_config
from aisim.simulator.config.loading import validate_config
from aisim.simulator.errors import InputError
from tests.helpers import write_trace

A, B = [1, 2, 3, 4], [5, 6, 7, 8]


def row(t, ids, inp=64, out=2):
    return {"timestamp": t, "input_length": inp, "output_length": out, "hash_ids": ids}


def replay(tmp_path, rows, host=None, g1=6, replicas=1, g3=None, scheduler=None, router=None, attention_data=1):
    kv = {"block_size": 16, "bytes_per_token": 62500, "capacity": {"type": "fixed", "blocks": g1}}
    if host is not None:
        kv["host_offload"] = host
    if g3 is not None:
        kv["g3_offload"] = g3
    worker = {"parallelism": {"replicas": replicas, "attention_data": attention_data}, "kv_cache": kv,
              "scheduler": scheduler or {}, "timing": {"type": "fixed", "prefill_ms": 10, "decode_ms": 1}}
    cfg = {"traffic": {"source": {"type": "trace", "format": "mooncake", "block_size": 16,
                                  "paths": [str(write_trace(tmp_path / "t.jsonl", rows))]},
                       "load": {"type": "trace_timestamps"}},
           "engine": {"mode": "aggregated", "backend": "vllm", "workers": {"aggregated": worker}}}
    if router is not None:
        cfg["router"] = router
    rep = run_config(validate_config(cfg), capture_per_request=True)
    reqs = sorted(rep.per_request, key=lambda r: int(r["uuid"].split("-")[-1]))
    return rep.summary, reqs


def times(r):
    """(admitted, first token, reused tokens, of which onboarded from the host tiers)"""
    return (r["first_admit_ms"], r["first_token_ms"], r["reused_input_tokens"],
            r["first_admission_host_reused_input_tokens"])


HOST = {"num_host_blocks": 100, "d2h_bandwidth_gbps": 1.0, "h2d_bandwidth_gbps": 1.0}


def test_an_evicted_prefix_is_onboarded_and_the_ttft_includes_the_transfer(tmp_path):
    # R1 (A) stores its 4 blocks: prepared at 0, sent at its pass end 10, in host memory at 14.
    # R2 (B) at 100 evicts 4 of A's 5 GPU blocks (6 blocks: block 0 of A survives). R3 (A) at 200
    # finds block 0 on the GPU and blocks 1-3 in host memory: 3 ms of transfer, admitted at 203
    # with 48 tokens reused (16 from the GPU, 32 onboarded), first token 213: TTFT 13.
    summary, r = replay(tmp_path, [row(0, A), row(100, B), row(200, A)], HOST)
    assert [times(x) for x in r] == [(0.0, 10.0, 0, 0), (100.0, 110.0, 0, 0), (203.0, 213.0, 48, 32)]
    assert r[2]["ttft_ms"] == 13.0 and r[2]["first_admission_g1_reused_input_tokens"] == 16
    t = summary["kv_tiers"]
    assert t["host"]["offload"] == {"jobs": 2, "blocks": 8, "bytes": 8_000_000, "transfer_ms": 8.0, "busy_ms": 8.0}
    assert t["host"]["onboard"] == {"jobs": 1, "blocks": 3, "bytes": 3_000_000, "transfer_ms": 3.0, "busy_ms": 3.0}
    assert (t["host"]["hit_lookups"], t["host"]["hit_blocks"], t["host"]["resident_blocks"]) == (1, 3, 8)
    assert t["reuse"]["first_admission_host_tokens"] == 32 and t["reuse"]["first_admission_device_tokens"] == 16
    assert summary["prefix_cache_reused_ratio"] == 48 / 192


def test_finished_transfers_leave_no_reference_cycle_behind(tmp_path):
    # a request keeps its latest store (here ended long before the request: 20 output tokens);
    # once a transfer ends, nothing of it waits for the cyclic collector (with it off, the replay
    # leaves no transfer job unreachable)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        _, r = replay(tmp_path, [row(0, A, out=20), row(100, B, out=20), row(200, A, out=20)], HOST)
        assert times(r[2])[3] > 0  # (an onboarding happened)
        gc.collect()
        left = [type(o).__name__ for o in gc.garbage if type(o).__name__ in ("Job", "_Hold", "RequestOffload")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left == []


def test_without_a_host_tier_the_evicted_prefix_is_recomputed(tmp_path):
    summary, r = replay(tmp_path, [row(0, A), row(100, B), row(200, A)])
    assert times(r[2]) == (200.0, 210.0, 16, 0)
    assert "kv_tiers" not in summary


def test_first_byte_latency_delays_the_store_and_the_onboarding(tmp_path):
    # 5 ms before each transfer: R3's 3-block load runs 205-208, TTFT 18
    _, r = replay(tmp_path, [row(0, A), row(100, B), row(200, A)], {**HOST, "latency_to_first_byte_ms": 5})
    assert times(r[2]) == (208.0, 218.0, 48, 32)


def test_two_onboards_queue_on_a_rank_s_fifo_lane(tmp_path):
    # 10 GPU blocks. At 200, A and B both need 4 blocks from host memory: A's load runs 200-204,
    # B's 204-208. A is admitted at 204 (first token 214); B's load ends during A's pass, so B is
    # admitted at its end, 214, and its first token comes at 225 (a prefill pass with A decoding).
    rows = [row(0, A), row(0, B), row(100, [9, 10, 11, 12]), row(100, [13, 14, 15, 16]), row(200, A), row(200, B)]
    summary, r = replay(tmp_path, rows, HOST, g1=10)
    assert [times(x) for x in r[4:]] == [(204.0, 214.0, 48, 48), (214.0, 225.0, 48, 48)]
    assert summary["kv_tiers"]["host"]["onboard"]["busy_ms"] == 8.0


def test_two_onboards_share_a_cluster_shared_link_equally(tmp_path):
    # the same, one shared pool: the two loads share the rank's 1 GB/s link (0.5 GB/s each) and
    # both end at 208
    rows = [row(0, A), row(0, B), row(100, [9, 10, 11, 12]), row(100, [13, 14, 15, 16]), row(200, A), row(200, B)]
    summary, r = replay(tmp_path, rows, {**HOST, "scope": "cluster_shared"}, g1=10)
    assert [times(x) for x in r[4:]] == [(208.0, 218.0, 48, 48), (208.0, 218.0, 48, 48)]
    assert summary["kv_tiers"]["host"]["scope"] == "cluster_shared"
    assert summary["kv_tiers"]["host"]["used_blocks"] == 16


def test_a_shared_pool_serves_a_prefix_another_worker_stored(tmp_path):
    # two workers (round robin), one pool with a 1.5 GB/s aggregate read cap: worker 0 stores A,
    # worker 1 stores B; at 200 worker 0 gets B and worker 1 gets A, both onboarded from the pool at
    # the same time: each moves at min(1 GB/s, 1.5 / 2) = 0.75 GB/s, 4 MB in 5.333 ms
    rows = [row(0, A), row(0, B), row(100, [9, 10, 11, 12]), row(100, [13, 14, 15, 16]), row(200, B), row(200, A)]
    shared = {**HOST, "scope": "cluster_shared", "shared_d2h_bandwidth_gbps": 1.5, "shared_h2d_bandwidth_gbps": 1.5}
    _, r = replay(tmp_path, rows, shared, replicas=2)
    end = 200 + 4 / 0.75
    assert [(x["decode_worker_idx"], *times(x)) for x in r[4:]] == [(0, end, end + 10, 48, 48),
                                                                    (1, end, end + 10, 48, 48)]
    # per rank pools (dp_rank_local): the other worker's blocks are not there
    _, r = replay(tmp_path, rows, HOST, replicas=2)
    assert [times(x) for x in r[4:]] == [(200.0, 210.0, 0, 0), (200.0, 210.0, 0, 0)]


def test_a_full_host_pool_evicts_its_least_recent_blocks(tmp_path):
    # 4 host blocks: B's store evicts all of A's, so R3 finds only A's first block (on the GPU)
    _, r = replay(tmp_path, [row(0, A), row(100, B), row(200, A)], {**HOST, "num_host_blocks": 4})
    assert times(r[2]) == (200.0, 210.0, 16, 0)
    # 6 blocks: B's store evicts A's two least recent (its last two), so one block comes back
    # (201), reuse 32 = 16 + 16
    _, r = replay(tmp_path, [row(0, A), row(100, B), row(200, A)], {**HOST, "num_host_blocks": 6})
    assert times(r[2]) == (201.0, 211.0, 32, 16)
    # 3 blocks: a 4-block prompt never fits, so nothing is ever stored
    summary, r = replay(tmp_path, [row(0, A), row(100, B), row(200, A)], {**HOST, "num_host_blocks": 3})
    assert times(r[2]) == (200.0, 210.0, 16, 0)
    assert summary["kv_tiers"]["host"]["offload"]["blocks"] == 0


def test_each_prefill_chunk_stores_its_own_blocks(tmp_path):
    # 32-token passes: the chunks' 2-block stores are sent at 10 and 20, in host memory at 12 and 22
    summary, r = replay(tmp_path, [row(0, A)], HOST, scheduler={"max_batched_tokens": 32})
    assert r[0]["ttft_ms"] == 20.0
    assert summary["kv_tiers"]["host"]["offload"]["jobs"] == 2
    assert summary["kv_tiers"]["host"]["offload"]["transfer_ms"] == 4.0


def test_a_pass_that_overwrites_blocks_still_being_copied_waits_for_the_copy(tmp_path):
    # 0.1 GB/s: A's store runs 10-50. B at 12 takes GPU blocks A released, whose copy is still
    # running: its pass computes from 50, first token 60 (TTFT 48)
    _, r = replay(tmp_path, [row(0, A), row(12, B)], {**HOST, "d2h_bandwidth_gbps": 0.1})
    assert times(r[1]) == (12.0, 60.0, 0, 0)


def test_onboarding_holds_no_batch_slot(tmp_path):
    # 10 GPU blocks. At 200 the first request onboards A's blocks 1-3 (200-203) while the one
    # behind it (a new prefix) is admitted at once; the first is admitted at that pass's end (210)
    rows = [row(0, A), row(100, list(range(5, 13)), inp=128), row(200, A), row(200, [20, 21, 22, 23])]
    _, r = replay(tmp_path, rows, HOST, g1=10)
    assert [times(x) for x in r[2:]] == [(210.0, 221.0, 48, 32), (200.0, 210.0, 0, 0)]
    # with one sequence slot the new prefix runs 200-211, then A
    _, r = replay(tmp_path, rows, HOST, g1=10, scheduler={"max_sequences": 1})
    assert [times(x) for x in r[2:]] == [(211.0, 221.0, 48, 32), (200.0, 210.0, 0, 0)]


def test_a_lookup_waits_for_a_load_of_the_same_blocks(tmp_path):
    # 12 GPU blocks keep A's first 3 blocks; the first A at 200 onboards block 3 (200-201, no reuse:
    # the last block is recomputed), the second waits for that load and reuses the GPU's 3 blocks
    rows = [row(0, A), row(100, list(range(5, 13)), inp=128), row(200, A), row(200, A)]
    _, r = replay(tmp_path, rows, HOST, g1=12)
    assert [times(x) for x in r[2:]] == [(201.0, 211.0, 48, 0), (201.0, 211.0, 48, 0)]


def test_a_disk_tier_behind_the_host_tier(tmp_path):
    # 4 host blocks, a G3 store written through from G2 (1 GB/s, 0.1 ms to first byte). B's store
    # evicts A from G2; R3 reads A's blocks 1-3 back from G3 (200-203.1) into G2, then onboards them
    # (203.1-206.1): TTFT 16.1, the onboarded tokens count as host reuse
    g3 = {"scope": "worker_local", "num_g3_blocks": 100, "read_bandwidth_gbps": 1.0, "write_bandwidth_gbps": 1.0}
    summary, r = replay(tmp_path, [row(0, A), row(100, B), row(200, A)], {**HOST, "num_host_blocks": 4}, g3=g3)
    assert times(r[2]) == (pytest.approx(206.1), pytest.approx(216.1), 48, 32)
    d = summary["kv_tiers"]["disk"]
    assert (d["lookup_probes"], d["lookup_hits"], d["resident_blocks"]) == (5, 3, 8)
    assert (d["read"]["jobs"], d["read"]["bytes"], d["read"]["transfer_ms"]) == (1, 3_000_000, pytest.approx(3.1))
    assert (d["write"]["jobs"], d["write"]["bytes"], d["write"]["transfer_ms"]) == (2, 8_000_000, pytest.approx(8.2))


def test_a_cluster_shared_disk_tier_serves_another_worker(tmp_path):
    # two workers; worker 1 reads A (written by worker 0) from the shared G3: 4.1 ms, then 4 ms of
    # onboarding: admitted at 108.1
    g3 = {"scope": "cluster_shared", "num_g3_blocks": 100, "read_bandwidth_gbps": 1.0, "write_bandwidth_gbps": 1.0,
          "shared_read_bandwidth_gbps": 1.0, "shared_write_bandwidth_gbps": 1.0}
    summary, r = replay(tmp_path, [row(0, A), row(100, A)], HOST, g3=g3, replicas=2)
    assert times(r[1]) == (pytest.approx(108.1), pytest.approx(118.1), 48, 48)
    assert summary["kv_tiers"]["disk"]["cross_worker_read_blocks"] == 4
    assert summary["kv_tiers"]["disk"]["write"]["jobs"] == 1


def test_attention_data_ranks_keep_their_own_pools(tmp_path):
    # 8 host blocks per rank; ranks alternate: A r0, B r1, C r0, D r1, A r0, B r1 - each finds its
    # prefix in its own rank's pool
    C, D = [9, 10, 11, 12], [13, 14, 15, 16]
    rows = [row(0, A), row(100, B), row(200, C), row(300, D), row(400, A), row(500, B)]
    _, r = replay(tmp_path, rows, {**HOST, "num_host_blocks": 8}, attention_data=2)
    assert [times(x)[2:] for x in r[4:]] == [(48, 32), (48, 32)]


def test_the_kv_router_credits_host_blocks(tmp_path):
    # one worker, the KV router: R3's prompt has block 0 on the GPU and blocks 1-3 in host memory:
    # overlap 1 + 0.75 x 3 = 3.25, reported as 3 blocks (48 tokens); a weight of 0 gives 1 block
    rows = [row(0, A), row(100, list(range(5, 13)), inp=128), row(300, A)]
    _, r = replay(tmp_path, rows, HOST, g1=10, router={"policy": "kv_router"})
    assert r[2]["routing_history"][0]["selected_overlap_blocks"] == 3
    assert r[2]["routing_history"][0]["reported_overlap_tokens"] == 48
    _, r = replay(tmp_path, rows, HOST, g1=10, router={"policy": "kv_router", "host_cache_hit_weight": 0.0})
    assert r[2]["routing_history"][0]["selected_overlap_blocks"] == 1


def test_fast_forward_changes_nothing(tmp_path):
    rows = [row(t * 37, [t % 5 * 10 + k for k in range(4 + t % 3)], inp=64 + t % 3 * 16, out=20 + t % 7)
            for t in range(40)]
    host = {**HOST, "num_host_blocks": 12}
    on = run_config(validate_config(_cfg(tmp_path, rows, host)), capture_per_request=True)
    off = run_config(validate_config(_cfg(tmp_path, rows, host)), capture_per_request=True, fast_forward=False)
    assert on.per_request == off.per_request
    assert {k: v for k, v in on.summary.items() if "wall" not in k and "processed" not in k} == \
        {k: v for k, v in off.summary.items() if "wall" not in k and "processed" not in k}


def _cfg(tmp_path, rows, host):
    kv = {"block_size": 16, "bytes_per_token": 62500, "capacity": {"type": "fixed", "blocks": 12}, "host_offload": host}
    return {"traffic": {"source": {"type": "trace", "format": "mooncake", "block_size": 16,
                                   "paths": [str(write_trace(tmp_path / "ff.jsonl", rows))]},
                        "load": {"type": "trace_timestamps"}},
            "engine": {"mode": "aggregated", "backend": "vllm",
                       "workers": {"aggregated": {"kv_cache": kv, "parallelism": {"replicas": 2},
                                                  "timing": {"type": "fixed", "prefill_ms": 10, "decode_ms": 1}}}}}


@pytest.mark.parametrize(("change", "field", "message"), [
    ({"backend": "sglang"}, "aggregated.kv_cache.host_offload", "host_offload is supported only for backend=vllm"),
    ({"prefix_caching": False}, "aggregated.kv_cache.host_offload", "host_offload requires prefix_caching=true"),
    ({"g3_only": True}, "aggregated.kv_cache.g3_offload", "g3_offload requires host_offload"),
    ({"g3": True, "attention_data": 2}, "aggregated.kv_cache.g3_offload",
     "supported only for the aggregated worker with attention_data=1"),
    ({"scope": "worker_local"}, "host_offload", "is a G3 scope; use `dp_rank_local`"),
])
def test_invalid_offload_configs_name_the_field_and_the_fix(change, field, message):
    kv = {"block_size": 16, "bytes_per_token": 62500, "capacity": {"type": "fixed", "blocks": 12},
          "prefix_caching": change.get("prefix_caching", True)}
    host = {"num_host_blocks": 10}
    if "scope" in change:
        host["scope"] = change["scope"]
    if not change.get("g3_only"):
        kv["host_offload"] = host
    if change.get("g3") or change.get("g3_only"):
        kv["g3_offload"] = {"scope": "worker_local", "num_g3_blocks": 10}
    worker = {"kv_cache": kv, "parallelism": {"attention_data": change.get("attention_data", 1)},
              "timing": {"type": "fixed", "prefill_ms": 10, "decode_ms": 1}}
    cfg = {"traffic": {"source": {"type": "synthetic", "input_tokens": 64, "output_tokens": 2},
                       "load": {"type": "concurrency", "concurrency": 1}, "stop": {"requests": 1}},
           "engine": {"mode": "aggregated", "backend": change.get("backend", "vllm"),
                      "workers": {"aggregated": worker}}}
    with pytest.raises(InputError) as err:
        run_config(validate_config(cfg))
    assert field in err.value.where and message in str(err.value)


def test_a_router_weight_needs_the_tier_it_weighs(tmp_path):
    with pytest.raises(InputError) as err:
        replay(tmp_path, [row(0, A)], None, router={"policy": "kv_router", "host_cache_hit_weight": 1.0})
    assert err.value.where == "router.host_cache_hit_weight" and "host_offload" in str(err.value)


@pytest.mark.parametrize("name", ["offload_kv_router", "offload_shared", "offload_2p2d"])
def test_fast_forwarded_runs_change_nothing_on_the_conversation_slice(name):
    import dataclasses

    from aisim import plan_from_config, run_plan
    from aisim.simulator.config.loading import load_config
    from tests.simulator.test_coordinator import CASES, CONFIGS, same

    cfg, cdir = load_config(CONFIGS / CASES[name][0], CASES[name][1])
    plan = plan_from_config(cfg, cdir, capture_per_request=True)
    on, off = run_plan(plan), run_plan(dataclasses.replace(plan, fast_forward=False))
    assert on.diagnostics["num_fast_forward_runs"] > 0 and off.diagnostics["num_fast_forward_runs"] == 0
    assert on.summary["kv_tiers"]["host"]["hit_lookups"] > 0
    assert same(on, off)


def test_the_python_api_takes_the_reference_engine_arguments(tmp_path):
    from aisim import run_trace_replay

    trace = write_trace(tmp_path / "api.jsonl", [row(0, A), row(100, B), row(200, A)])
    engine = {"block_size": 16, "num_gpu_blocks": 6, "kv_cache_bytes_per_token": 62500,
              "timing_model": {"type": "fixed", "prefill_ms": 10, "decode_ms": 1},
              "native_host_offload": {"num_host_blocks": 100, "d2h_bandwidth_gbps": 1.0, "h2d_bandwidth_gbps": 1.0}}
    rep = run_trace_replay(str(trace), trace_block_size=16, extra_engine_args=engine, capture_per_request=True)
    r = sorted(rep.per_request, key=lambda x: x["arrival_time_ms"])[2]
    assert times(r) == (203.0, 213.0, 48, 32)


def test_a_shared_tier_publishes_through_one_rank():
    # a cluster-shared pool (and disk) sends its KV events to the first rank that records them
    # (the router keeps one view of it); private pools to their own rank
    from aisim.actors.engine.offload import G3Spec, HostOffloadSpec, OffloadRegistry

    reg = OffloadRegistry()
    shared = HostOffloadSpec(100, 1000, scope="cluster_shared")
    disk = G3Spec("cluster_shared", 100, 1000)
    sinks = [[], [], []]
    ranks = [reg.rank(shared, disk, 16, wid, sink) for wid, sink in enumerate(sinks)]
    assert ranks[0].tier is ranks[2].tier and ranks[0].g3 is ranks[2].g3
    (g2_sink,), (g3_sink,) = ranks[0].tier.subscribers, ranks[0].g3.subscribers
    assert g2_sink is sinks[0] and g3_sink is sinks[0]
    private = HostOffloadSpec(100, 1000)
    mine = [reg.rank(private, None, 16, wid, sink) for wid, sink in enumerate(sinks)]
    assert all(len(r.tier.subscribers) == 1 and r.tier.subscribers[0] is s for r, s in zip(mine, sinks))
