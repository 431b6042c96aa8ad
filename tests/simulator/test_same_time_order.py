"""Same-time order and pass timing, checked against hand-computed numbers.

The coordinator's written policy (simulator/coordinator.py):

    pass completion -> handoff placement -> worker ready -> transfer completion
    -> arrivals/admission -> planner tick

ties by stable identity (worker id, handoff ordinal, request index); once every event at a
time has settled, each idle worker with work starts its next pass (ascending worker id), so a
request arriving exactly at a pass end joins the pass that starts then, and one arriving
mid-pass joins the next pass.

Every scenario uses FixedTiming (actors/engine/timing.py): a pass costs
``prefill_ms`` (100) if it computes any prompt token, plus ``decode_ms`` (10) if any request in
it generates from an already computed sequence; so 100 (prefill only), 110 (prefill + decode)
or 10 (decode only). The pass that computes a prompt's last token emits its first token at the
pass end. Hash ids are distinct everywhere, so no prefix is ever reused.
"""

from __future__ import annotations

import pytest

from aisim import run_trace_replay
from tests.helpers import by_uuid, replay_rows, write_trace

FIXED = {"type": "fixed", "prefill_ms": 100, "decode_ms": 10}
AGG = {"timing_model": FIXED, "max_num_batched_tokens": 512, "num_gpu_blocks": 1000, "block_size": 64}
MULTI_HOST = {"backend": "local", "engine_actors": 3, "router_sync_ms": 0}


def row(t_ms, inp, out, ids, rid):
    return {"timestamp": t_ms, "input_length": inp, "output_length": out, "hash_ids": ids, "request_id": rid}


# -- aggregated ---------------------------------------------------------------------------

def test_baseline_1024_prompt_two_chunks_then_two_decode_passes(tmp_path):
    r = by_uuid(replay_rows(tmp_path, [row(0, 1024, 3, [1, 2], "a")], AGG))["a"]
    # pass 1 [0,100): 512 prompt tokens (budget 512); pass 2 [100,200): the last 512 -> token 1 at 200
    assert (r["first_admit_ms"], r["first_token_ms"], r["ttft_ms"]) == (0.0, 200.0, 200.0)
    # decode-only passes: token 2 at 200 + 10 = 210, token 3 at 210 + 10 = 220
    assert (r["last_token_ms"], r["e2e_latency_ms"], r["itl_ms"]) == (220.0, 220.0, 10.0)


def _a_then_b(tmp_path, b_at_ms):
    rows = [row(0, 512, 3, [1], "a"), row(b_at_ms, 256, 1, [2], "b")]
    return by_uuid(replay_rows(tmp_path, rows, AGG))


def test_arrival_exactly_at_a_pass_end_joins_the_pass_that_starts_then(tmp_path):
    r = _a_then_b(tmp_path, 100)
    a, b = r["a"], r["b"]
    # pass 1 [0,100): a's 512 prompt tokens -> a's token 1 at 100
    assert a["first_token_ms"] == 100.0
    # at 100: pass completion, then b's arrival, then the next pass starts -> b admitted at 100
    assert (b["arrival_time_ms"], b["dispatched_at_ms"], b["first_admit_ms"]) == (100.0, 100.0, 100.0)
    # pass 2 [100,210): a decodes 1 token + b's 256 prompt tokens (1 + 256 <= 512) = 100 + 10
    # -> b's only token at 210 (TTFT 210 - 100 = 110), a's token 2 at 210
    assert (b["first_token_ms"], b["ttft_ms"], b["e2e_latency_ms"]) == (210.0, 110.0, 110.0)
    # pass 3 [210,220): a alone, decode only -> a's token 3 at 220
    assert a["last_token_ms"] == 220.0


def test_arrival_mid_pass_joins_the_next_pass(tmp_path):
    r = _a_then_b(tmp_path, 50)
    a, b = r["a"], r["b"]
    # b arrives at 50 during pass 1 [0,100) and is routed then, but admitted only when pass 2 starts at 100
    assert (b["arrival_time_ms"], b["dispatched_at_ms"], b["first_admit_ms"]) == (50.0, 50.0, 100.0)
    # pass 2 [100,210) as above: b's token at 210, TTFT 210 - 50 = 160
    assert (b["first_token_ms"], b["ttft_ms"]) == (210.0, 160.0)
    # a: token 1 at 100, token 2 at 210, token 3 at 220
    assert (a["first_token_ms"], a["last_token_ms"]) == (100.0, 220.0)


def test_same_time_arrivals_queue_on_one_worker_in_request_index_order(tmp_path):
    engine = {**AGG, "max_num_batched_tokens": 384}
    r = by_uuid(replay_rows(tmp_path, [row(0, 256, 2, [1], "a"), row(0, 256, 1, [2], "b")], engine))
    a, b = r["a"], r["b"]
    # both admitted at 0 (FCFS by request index): pass 1 [0,100) = a's 256 + b's first 384 - 256 = 128
    assert (a["first_admit_ms"], b["first_admit_ms"]) == (0.0, 0.0)
    # a's prompt done at 100 -> token 1 at 100
    assert a["first_token_ms"] == 100.0
    # pass 2 [100,210): a decodes (1) + b's last 128 prompt tokens = 100 + 10 -> b's token and a's token 2 at 210
    # (b first would instead give b 100 and a 210)
    assert (b["first_token_ms"], a["last_token_ms"]) == (210.0, 210.0)


ROUND_ROBIN_ROWS = [row(0, 512, 1, [1], "a"), row(0, 512, 1, [2], "b"), row(0, 512, 1, [3], "c")]


def _check_round_robin(r):
    # same timestamp: routed in request index order, round robin 0, 1, 0
    assert [r[u]["decode_worker_idx"] for u in "abc"] == [0, 1, 0]
    # a on worker 0 and b on worker 1 each prefill 512 in [0,100) -> token at 100
    assert [r[u]["first_token_ms"] for u in "ab"] == [100.0, 100.0]
    # c waits behind a (budget 512 used by a): admitted when worker 0 starts pass 2 at 100,
    # prefill 512 in [100,200) -> token at 200
    assert (r["c"]["dispatched_at_ms"], r["c"]["first_admit_ms"], r["c"]["first_token_ms"]) == (0.0, 100.0, 200.0)


def test_round_robin_ties_follow_request_index(tmp_path):
    _check_round_robin(by_uuid(replay_rows(tmp_path, ROUND_ROBIN_ROWS, AGG, num_workers=2)))


def test_closed_loop_next_request_arrives_and_starts_at_the_previous_completion(tmp_path):
    rows = [row(0, 512, 3, [1], "a"), row(0, 512, 3, [2], "b"), row(0, 512, 3, [3], "c")]
    r = by_uuid(replay_rows(tmp_path, rows, AGG, replay_concurrency=1))
    # each request: prefill pass 100 (token 1) + 2 decode passes of 10 = 120 end to end
    # a: [0, 120]; b arrives at 120 and starts then: [120, 240]; c: [240, 360]
    expected = {"a": (0.0, 100.0, 120.0), "b": (120.0, 220.0, 240.0), "c": (240.0, 340.0, 360.0)}
    for u, (arrive, first, last) in expected.items():
        x = r[u]
        assert (x["arrival_time_ms"], x["dispatched_at_ms"], x["first_admit_ms"]) == (arrive, arrive, arrive), u
        assert (x["first_token_ms"], x["last_token_ms"], x["e2e_latency_ms"]) == (first, last, 120.0), u
    assert r["b"]["arrival_time_ms"] == r["a"]["arrival_time_ms"] + r["a"]["e2e_latency_ms"]
    assert r["c"]["arrival_time_ms"] == r["b"]["arrival_time_ms"] + r["b"]["e2e_latency_ms"]


# -- disaggregated ------------------------------------------------------------------------

# 1 GB/s and 1e6 bytes per token: the transfer takes 1 ms per prompt token (full prompt)
PREFILL = {"timing_model": FIXED, "num_gpu_blocks": 11, "block_size": 16, "kv_transfer_bandwidth": 1.0,
           "kv_transfer_bytes_per_token": 1_000_000, "kv_transfer_timing_mode": "full_prompt"}
DECODE = {"timing_model": FIXED, "block_size": 16, "num_gpu_blocks": 1000}
DISAGG_ROWS = [row(0, 128, 5, [1], "r1"), row(0, 48, 2, [2], "r2"), row(0, 128, 2, [3], "r3")]


def _disagg(tmp_path, rows, prefill, decode, **kw):
    trace = write_trace(tmp_path / "d.jsonl", rows)
    return by_uuid(run_trace_replay(str(trace), prefill_engine_args=prefill, decode_engine_args=decode,
                                    capture_per_request=True, **kw))


def _check_disagg(r):
    r1, r2, r3 = r["r1"], r["r2"], r["r3"]
    # prefill worker 0 (max_num_seqs 1 for prefill), decode worker 1
    assert [r[u]["prefill_worker_idx"] for u in ("r1", "r2", "r3")] == [0, 0, 0]
    assert [r[u]["decode_worker_idx"] for u in ("r1", "r2", "r3")] == [1, 1, 1]
    # r1: prefill [0,100); transfer 128 tokens x 1 ms = 128 -> 228: released, activated, admitted at 228
    assert r1["kv_transfer_ms"] == 128.0
    assert (r1["prefill_admit_ms"], r1["source_released_ms"], r1["destination_activated_ms"],
            r1["decode_admit_ms"]) == (0.0, 228.0, 228.0, 228.0)
    # r1 decodes alone from 228: tokens at 238, 248, 258, 268, 278
    assert (r1["first_token_ms"], r1["last_token_ms"]) == (238.0, 278.0)
    # r2 (3 blocks of 16) fits beside r1's 8 held blocks (8 + 3 <= 11): prefill [100,200);
    # transfer 48 x 1 ms -> 248 = the end of r1's pass [238,248): transfer completion comes before the
    # next pass starts, so r2 is admitted at 248 and joins pass [248,258) with r1 (decode only, 10)
    assert r2["kv_transfer_ms"] == 48.0
    assert (r2["prefill_admit_ms"], r2["source_released_ms"], r2["destination_activated_ms"],
            r2["decode_admit_ms"]) == (100.0, 248.0, 248.0, 248.0)
    # r2: token 1 at 258, token 2 at 268
    assert (r2["first_token_ms"], r2["ttft_ms"], r2["last_token_ms"]) == (258.0, 258.0, 268.0)
    # r3 (8 blocks) waits on the prefill worker: 8 (r1) + 3 (r2) + 8 > 11 until r1's source release at 228;
    # the release (transfer completion) precedes admission at 228 -> 3 + 8 <= 11, r3 admitted at 228
    # prefill [228,328); transfer 128 -> 456; tokens at 466, 476
    assert (r3["prefill_admit_ms"], r3["source_released_ms"], r3["destination_activated_ms"],
            r3["decode_admit_ms"]) == (228.0, 456.0, 456.0, 456.0)
    assert (r3["first_token_ms"], r3["last_token_ms"]) == (466.0, 476.0)


def test_disaggregated_transfer_completion_admits_at_prefill_end_plus_transfer(tmp_path):
    _check_disagg(_disagg(tmp_path, DISAGG_ROWS, PREFILL, DECODE))


# r1 (256 tokens) outputs R1_OUT tokens on decode worker X; r2 (64 tokens, 20 tokens out) decodes on Y;
# r3's handoff is placed at 300. Decode placement is a load router (fewest active blocks).
P_PLACE = {"timing_model": FIXED, "block_size": 64}
D_PLACE = {"timing_model": FIXED, "block_size": 64, "num_gpu_blocks": 1000}


def _placement_rows(r1_out):
    return [row(0, 256, r1_out, [1], "r1"), row(0, 64, 20, [2], "r2"), row(0, 64, 2, [3], "r3")]


def _check_placement(r, r1_ends_at_300: bool):
    r1, r2, r3 = r["r1"], r["r2"], r["r3"]
    # one prefill worker, one prompt at a time: r1 [0,100), r2 [100,200), r3 [200,300); no transfer delay
    assert [r[u]["decode_admit_ms"] for u in ("r1", "r2", "r3")] == [100.0, 200.0, 300.0]
    # r1 takes an empty decode worker X (either); r2 at 200 goes to the other one, Y (X holds r1)
    assert {r1["decode_worker_idx"], r2["decode_worker_idx"]} == {1, 2}
    # r1: token k at 100 + 10k; r2: token k at 200 + 10k -> last at 400; r3: tokens at 310, 320
    assert (r2["last_token_ms"], r3["first_token_ms"], r3["last_token_ms"]) == (400.0, 310.0, 320.0)
    if r1_ends_at_300:
        # 20 tokens -> r1's last at 100 + 200 = 300: that pass completion (r1 released from X) comes
        # before r3's placement at 300, so X holds nothing and r3 goes to X, not to Y (r2 active)
        assert r1["last_token_ms"] == 300.0
        assert r3["decode_worker_idx"] == r1["decode_worker_idx"]
    else:
        # 21 tokens -> r1 ends at 310, still on X at 300 with 256+ tokens vs r2's 64+ on Y -> r3 to Y
        assert r1["last_token_ms"] == 310.0
        assert r3["decode_worker_idx"] == r2["decode_worker_idx"]


@pytest.mark.parametrize("r1_out", [20, 21])
def test_handoff_placement_sees_releases_of_passes_ending_at_the_same_time(tmp_path, r1_out):
    r = _disagg(tmp_path, _placement_rows(r1_out), P_PLACE, D_PLACE, num_decode_workers=2)
    _check_placement(r, r1_out == 20)


# -- several in-process hosts ------------------------------------------------------------

def test_three_hosts_round_robin_identical_records(tmp_path):
    one = replay_rows(tmp_path, ROUND_ROBIN_ROWS, AGG, num_workers=2)
    three = replay_rows(tmp_path, ROUND_ROBIN_ROWS, AGG, num_workers=2, **MULTI_HOST)
    _check_round_robin(by_uuid(three))
    assert three.per_request == one.per_request


def test_three_hosts_disaggregated_identical_records(tmp_path):
    one = _disagg(tmp_path, DISAGG_ROWS, PREFILL, DECODE)
    three = _disagg(tmp_path, DISAGG_ROWS, PREFILL, DECODE, **MULTI_HOST)  # source and destination on different hosts
    _check_disagg(three)
    assert three == one


def test_three_hosts_handoff_placement_identical_records(tmp_path):
    # workers 0 (prefill), 1 and 2 (decode): one per host
    one = _disagg(tmp_path, _placement_rows(20), P_PLACE, D_PLACE, num_decode_workers=2)
    three = _disagg(tmp_path, _placement_rows(20), P_PLACE, D_PLACE, num_decode_workers=2, **MULTI_HOST)
    _check_placement(three, True)
    assert three == one
