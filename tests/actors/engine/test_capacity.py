"""Capacity policies (actors.engine.capacity): TensorRT-LLM's GUARANTEED_NO_EVICT against vLLM's
recompute policy, on replays with fixed timing (prefill 10 ms, decode 1 ms a pass; a pass with
both costs 11 ms). The expected times were derived by hand and agree with the reference
simulator's (docs/schedulers.md, "TensorRT-LLM")."""

from __future__ import annotations

from tests.helpers import by_uuid, replay_rows

FIXED = {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 1.0}


def row(t, inp, out, ids, rid):
    return {"timestamp": t, "input_length": inp, "output_length": out, "hash_ids": ids, "request_id": f"r{rid}"}


def trtllm(tmp_path, rows, blocks, block_size=32, **engine):
    args = {"engine_type": "trtllm", "block_size": block_size, "num_gpu_blocks": blocks, "timing_model": FIXED,
            **engine}
    return replay_rows(tmp_path, rows, args)


def test_a_request_that_does_not_fit_waits_in_fifo_order_instead_of_preempting(tmp_path):
    # 10 blocks of 32 tokens. R1 (100 + 100) reserves ceil(200/32) = 7 blocks, R2 (32 + 32) 2:
    # both are admitted at 0. R3 (64 + 64) needs 4 > the 1 left and waits; R4 (10 + 10) would
    # fit in 1 block but stays behind R3 (FIFO, no skip-ahead). R2 completes at 41 (prefill
    # 0-11 with the first decode of nobody: 10 ms, first token at 10, then 31 decode passes of
    # 1 ms... its 32nd token at 41), freeing 2 blocks: R3 still needs 4 - 3 = ... it waits for
    # R1, whose 100th token comes at 109. Then R3 and R4 are prefilled together (10 ms): first
    # tokens at 119; R4's 10th token at 128, R3's 64th at 182.
    rows = [row(0, 100, 100, [1], 1), row(0, 32, 32, [2], 2), row(0, 64, 64, [3], 3), row(0, 10, 10, [4], 4)]
    rep = trtllm(tmp_path, rows, blocks=10)
    r = by_uuid(rep)
    assert [r[f"r{i}"]["admission_history"][0]["at_ms"] for i in (1, 2, 3, 4)] == [0.0, 0.0, 109.0, 109.0]
    assert (r["r3"]["first_token_ms"], r["r3"]["last_token_ms"]) == (119.0, 182.0)
    assert (r["r4"]["first_token_ms"], r["r4"]["last_token_ms"]) == (119.0, 128.0)
    assert rep.summary["num_preemptions"] == 0 and rep.summary["completed_requests"] == 4


def test_the_same_requests_under_vllm_are_admitted_by_what_they_hold_now(tmp_path):
    # vLLM admits by the prompt's blocks: R3 (2 blocks) and R4 (1 block) fit beside R1 (4) and
    # R2 (1) at 0
    rows = [row(0, 100, 100, [1], 1), row(0, 32, 32, [2], 2), row(0, 64, 64, [3], 3), row(0, 10, 10, [4], 4)]
    rep = replay_rows(tmp_path, rows, {"block_size": 32, "num_gpu_blocks": 10, "timing_model": FIXED})
    r = by_uuid(rep)
    assert [r[f"r{i}"]["admission_history"][0]["at_ms"] for i in (1, 2, 3, 4)] == [0.0, 0.0, 0.0, 0.0]


def test_decode_growth_that_would_preempt_under_vllm_never_does_under_trtllm(tmp_path):
    # 8 blocks of 32: two 96-token prompts asking 100 outputs each. vLLM admits both (3 blocks
    # each) and preempts when their growth exceeds the pool; TRT-LLM reserves ceil(196/32) = 7
    # blocks for the first, so the second waits for its completion (the first's 100th token at
    # 10 + 99 = 109) and is prefilled then: first token at 119, 100th at 218
    rows = [row(0, 96, 100, [1], 1), row(0, 96, 100, [2], 2)]
    vllm = replay_rows(tmp_path, rows, {"block_size": 32, "num_gpu_blocks": 8, "timing_model": FIXED})
    assert vllm.summary["num_preemptions"] > 0
    rep = trtllm(tmp_path, rows, blocks=8)
    r = by_uuid(rep)
    assert rep.summary["num_preemptions"] == 0
    assert r["r2"]["admission_history"][0]["at_ms"] == 109.0
    assert (r["r2"]["first_token_ms"], r["r2"]["last_token_ms"]) == (119.0, 218.0)


def test_the_maximum_output_is_clamped_to_the_pool_and_a_prompt_it_cannot_hold_is_refused(tmp_path):
    # 320 tokens (10 blocks of 32): a 100-token prompt keeps room for 220 outputs of its 1000;
    # a 320-token prompt leaves no room and is rejected without blocking the next request
    rows = [row(0, 100, 1000, [1], 1), row(1000, 320, 5, [2], 2), row(1000, 10, 3, [3], 3)]
    rep = trtllm(tmp_path, rows, blocks=10)
    r = by_uuid(rep)
    assert r["r1"]["output_length"] == 220 and r["r1"]["terminal_status"] == "completed"
    assert r["r2"]["terminal_status"] == "rejected"
    assert rep.summary["rejection_reasons"] == {"kv_capacity": 1}
    assert r["r3"]["terminal_status"] == "completed" and r["r3"]["first_token_ms"] == 1010.0


def test_every_full_cached_block_is_reused_and_a_fully_cached_prompt_only_decodes(tmp_path):
    # 1024 tokens = 32 blocks of 32, two trace blocks of 512: the repeat reuses all 1024 (vLLM
    # keeps the last block to compute: 992) and its first token comes from a 1 ms decode pass
    rows = [row(0, 1024, 2, [7, 8], 1), row(100, 1024, 2, [7, 8], 2), row(200, 1000, 2, [7, 9], 3)]
    rep = trtllm(tmp_path, rows, blocks=1000)
    r = by_uuid(rep)
    assert r["r2"]["admission_history"][0]["reused_input_tokens"] == 1024
    assert r["r2"]["ttft_ms"] == 1.0
    # a 1000-token prompt sharing the first trace block (512 tokens = 16 blocks)
    assert r["r3"]["admission_history"][0]["reused_input_tokens"] == 512
    vllm = replay_rows(tmp_path, rows, {"block_size": 32, "num_gpu_blocks": 1000, "timing_model": FIXED})
    assert by_uuid(vllm)["r2"]["admission_history"][0]["reused_input_tokens"] == 992


def test_a_pass_with_prefill_and_decode_costs_both(tmp_path):
    # A decodes from 10; B arrives at 5 and is prefilled in the pass starting at 10 beside A's
    # decode: 11 ms, B's first token at 21 (SGLang would run that pass as prefill only)
    rows = [row(0, 100, 10, [1], 1), row(5, 100, 3, [2], 2)]
    rep = trtllm(tmp_path, rows, blocks=1000)
    r = by_uuid(rep)
    assert r["r2"]["first_token_ms"] == 21.0 and r["r1"]["last_token_ms"] == 29.0


def test_a_trtllm_destination_reserves_before_its_transfer_and_the_source_holds_until_then(tmp_path):
    # decode pool of 75 blocks of 2 tokens (150): two 100 + 30 requests need 65 blocks each. R1
    # is prefilled 0-10 and reserved at 10 (zero-time transfer), decodes 11..40; R2, prefilled
    # 10-20, waits with its KV held on the prefill worker until R1 completes at 40, then reserves,
    # transfers and decodes 41..70 (vLLM would have moved its KV at 20)
    from aisim import run_trace_replay
    from tests.helpers import write_trace

    trace = write_trace(tmp_path / "t.jsonl", [row(0, 100, 30, [1], 1), row(0, 100, 30, [2], 2)])
    engine = {"engine_type": "trtllm", "block_size": 2, "timing_model": FIXED}
    rep = run_trace_replay(str(trace), prefill_engine_args={**engine, "num_gpu_blocks": 1000},
                           decode_engine_args={**engine, "num_gpu_blocks": 75}, capture_per_request=True)
    r = by_uuid(rep)["r2"]
    assert (r["prefill_admit_ms"], r["source_held_ms"], r["destination_reserved_ms"]) == (10.0, 20.0, 40.0)
    assert (r["source_released_ms"], r["decode_admit_ms"]) == (40.0, 40.0)
    assert (r["first_token_ms"], r["last_token_ms"]) == (41.0, 70.0)
