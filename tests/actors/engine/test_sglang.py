"""SGLang scheduling scenarios (docs/dev/reference-sglang-trtllm.md §9): fixed timing, prefill
10 ms, decode 1 ms, one-token pages; every expectation is the installed reference's."""

from __future__ import annotations

import pytest

from tests.helpers import by_uuid, replay_rows

SGL = {"timing_model": {"type": "fixed", "prefill_ms": 10, "decode_ms": 1}, "engine_type": "sglang",
       "block_size": 1, "num_gpu_blocks": 1_000_000}


def row(t, inp, out, rid, ids=None):
    ids = ids if ids is not None else list(range(1000 * rid + 1, 1000 * rid + 1 + -(-inp // 512)))
    return {"timestamp": t, "input_length": inp, "output_length": out, "hash_ids": ids, "request_id": f"r{rid}"}


def run(tmp_path, rows, **engine):
    return by_uuid(replay_rows(tmp_path, rows, {**SGL, **engine}))


def admissions(r):
    return [(a["at_ms"], a["reused_input_tokens"]) for a in r["admission_history"]]


@pytest.mark.parametrize(("prompt", "ttft"), [(8192, 10.0), (8193, 20.0), (10000, 20.0), (20000, 30.0)])
def test_a_prompt_is_prefilled_in_8192_token_chunks(tmp_path, prompt, ttft):
    assert run(tmp_path, [row(0, prompt, 2, 1)])["r1"]["ttft_ms"] == ttft


def test_max_batched_tokens_does_not_limit_sglang_chunks(tmp_path):
    assert run(tmp_path, [row(0, 10000, 2, 1)], max_num_batched_tokens=512)["r1"]["ttft_ms"] == 20.0
    r = run(tmp_path, [row(0, 1000, 2, i) for i in range(1, 5)], max_num_batched_tokens=512)
    assert [r[f"r{i}"]["ttft_ms"] for i in range(1, 5)] == [10.0] * 4  # one batch


def test_a_request_is_truncated_to_the_chunk_budget_left(tmp_path):
    r = run(tmp_path, [row(0, 3000, 3, 1), row(0, 3000, 3, 2), row(0, 3000, 3, 3)])
    assert [r[f"r{i}"]["ttft_ms"] for i in (1, 2, 3)] == [10.0, 10.0, 20.0]
    # the third's 2192-token partial chunk stalls the first two's decode: tokens at 10, 21, 22
    assert r["r1"]["last_token_ms"] == 22.0 and r["r1"]["itl_ms"] == 6.0
    r = run(tmp_path, [row(0, 3000, 3, 1), row(0, 3000, 3, 2), row(0, 10000, 3, 3)])
    assert r["r3"]["ttft_ms"] == 20.0  # 2192 tokens, then 7808


def test_a_prefill_pass_stalls_the_running_decodes(tmp_path):
    r = run(tmp_path, [row(0, 100, 10, 1), row(5, 100, 3, 2)])
    assert r["r1"]["first_token_ms"] == 10.0 and r["r1"]["last_token_ms"] == 29.0
    assert r["r2"]["first_token_ms"] == 20.0 and r["r2"]["last_token_ms"] == 22.0 and r["r2"]["ttft_ms"] == 15.0


def test_prefill_decode_interval_holds_prefills_back_for_three_rounds(tmp_path):
    r = run(tmp_path, [row(0, 100, 10, 1), row(5, 100, 3, 2)], prefill_decode_interval=3)
    assert r["r2"]["first_token_ms"] == 23.0 and r["r2"]["last_token_ms"] == 25.0
    assert r["r1"]["last_token_ms"] == 29.0
    # idle rounds take no time: B is admitted as soon as A ends
    r = run(tmp_path, [row(0, 100, 2, 1), row(5, 100, 3, 2)], prefill_decode_interval=3)
    assert r["r1"]["last_token_ms"] == 11.0 and r["r2"]["first_token_ms"] == 21.0


def test_max_sequences_caps_the_running_batch(tmp_path):
    r = run(tmp_path, [row(0, 100, 3, i) for i in range(1, 5)], max_num_seqs=2)
    assert [r[f"r{i}"]["ttft_ms"] for i in range(1, 5)] == [10.0, 10.0, 22.0, 22.0]
    assert [r[f"r{i}"]["last_token_ms"] for i in range(1, 5)] == [12.0, 12.0, 24.0, 24.0]


def test_admission_waits_until_the_decaying_ratio_leaves_room_then_retracts(tmp_path):
    # KV 1050: R2 needs 100 + 500 x ratio; after two decode passes the reserve of R1's 497
    # remaining tokens is 497 x (0.7 - 2 x 0.0010033) and 1050 - 103 - it = 600.097 > 600
    r = run(tmp_path, [row(0, 100, 500, 1), row(0, 100, 500, 2)], num_gpu_blocks=1050)
    assert admissions(r["r1"]) == [(0.0, 0)]
    # R2 is retracted when the pages run out, keeps its 350 tokens cached, comes back when R1 ends
    assert admissions(r["r2"]) == [(12.0, 0), (519.0, 450)]
    assert r["r1"]["last_token_ms"] == 519.0
    assert r["r2"]["first_token_ms"] == 22.0 and r["r2"]["last_token_ms"] == 604.0


def test_a_retraction_takes_the_oldest_of_the_requests_with_fewest_tokens(tmp_path):
    r = run(tmp_path, [row(0, 100, 500, 1), row(0, 100, 500, 2)], num_gpu_blocks=1060)
    assert admissions(r["r2"]) == [(10.0, 0)]
    assert r["r2"]["last_token_ms"] == 519.0
    # R1 (first in the batch at equal output) went back; R2's finish evicted 70 of its 530 tokens
    assert admissions(r["r1"]) == [(0.0, 0), (519.0, 460)]
    assert r["r1"]["last_token_ms"] == 598.0


def test_a_retracted_request_rejoins_the_back_of_the_queue(tmp_path):
    rows = [row(0, 100, 500, 1), row(0, 100, 500, 2), row(5, 300, 600, 3)]
    r = run(tmp_path, rows, num_gpu_blocks=1060)
    assert admissions(r["r3"]) == [(519.0, 0)]
    assert admissions(r["r1"]) == [(0.0, 0), (1128.0, 0)]  # its cached tokens were evicted meanwhile
    assert r["r1"]["last_token_ms"] == 1207.0


@pytest.mark.parametrize(("out", "page", "blocks", "prompt", "admitted"),
                         [(99, 1, 1000, 900, True), (100, 1, 1000, 900, False),
                          (95, 4, 250, 902, True), (96, 4, 250, 902, False)])
def test_the_memory_test_is_strict(tmp_path, out, page, blocks, prompt, admitted):
    # pages of the prompt plus its output must stay below the free tokens: 904 + 95 < 1000
    rep = replay_rows(tmp_path, [row(0, prompt, out, 1)], {**SGL, "block_size": page, "num_gpu_blocks": blocks})
    r = by_uuid(rep)["r1"]
    assert (r["terminal_status"] == "completed") is admitted
    if not admitted:  # (the reference stalls; aisim refuses the request at once, saying why)
        assert r["rejection_reason"] == "kv_capacity"
        assert rep.summary["rejection_reasons"] == {"kv_capacity": 1}


@pytest.mark.parametrize(("page", "repeat", "shorter"), [(1, 1023, 999), (4, 1020, 996)])
def test_a_prefix_match_leaves_one_token_to_compute_in_whole_pages(tmp_path, page, repeat, shorter):
    rows = [row(0, 1024, 2, 1, ids=[5, 6]), row(100, 1024, 2, 2, ids=[5, 6]), row(200, 1000, 2, 3, ids=[5, 6])]
    r = run(tmp_path, rows, block_size=page)
    assert r["r2"]["reused_input_tokens"] == repeat and r["r3"]["reused_input_tokens"] == shorter


def test_the_ratio_does_not_reset_when_the_engine_goes_idle(tmp_path):
    rows = [row(0, 100, 700, 1), row(2000, 100, 500, 2), row(2000, 100, 500, 3)]
    r = run(tmp_path, rows, num_gpu_blocks=1050)
    assert admissions(r["r3"])[0] == (2010.0, 0)  # a fresh ratio would wait until 2012


def test_disaggregated_sglang_reserves_the_destination_before_the_prefill(tmp_path):
    # decode KV 150 tokens: R2's prompt fits only when R1 ends on the decode worker (at 40); its
    # prefill starts then, and the decode worker produces every output token
    from aisim import run_trace_replay
    from tests.helpers import write_trace

    eng = {**SGL, "num_gpu_blocks": 150}
    trace = write_trace(tmp_path / "t.jsonl", [row(0, 100, 30, 1), row(0, 100, 30, 2)])
    rep = run_trace_replay(str(trace), prefill_engine_args={**SGL, "max_num_seqs": 1}, decode_engine_args=eng,
                           capture_per_request=True)
    r = by_uuid(rep)
    assert (r["r1"]["prefill_admit_ms"], r["r1"]["first_token_ms"], r["r1"]["last_token_ms"]) == (0.0, 11.0, 40.0)
    r2 = r["r2"]
    assert (r2["prefill_admit_ms"], r2["destination_reserved_ms"]) == (40.0, 40.0)
    assert (r2["decode_admit_ms"], r2["first_token_ms"], r2["last_token_ms"]) == (50.0, 51.0, 80.0)
    assert r2["kv_transfer_tokens"] == 100


@pytest.mark.parametrize(("policy", "r1_first", "r2_first"), [("fifo", 89.0, 100.0), ("lpm", 100.0, 89.0)])
def test_lpm_admits_the_longest_cached_prefix_first(tmp_path, policy, r1_first, r2_first):
    # R0 caches prompt [1, 2]; while R_busy holds the only slot, R1 (nothing cached) and R2 (R0's
    # prompt again) queue; at 79 FIFO admits R1, LPM admits R2 (a 1,024-token match) first
    from aisim import run_config
    from aisim.simulator.config.loading import validate_config
    from tests.helpers import write_trace

    rows = [row(0, 1024, 1, 0, ids=[1, 2]), row(20, 100, 50, 9), row(40, 1000, 2, 1, ids=[70, 71]),
            row(50, 1024, 2, 2, ids=[1, 2])]
    trace = write_trace(tmp_path / "t.jsonl", rows)
    cfg = validate_config({
        "traffic": {"source": {"type": "trace", "format": "mooncake", "paths": [str(trace)], "block_size": 512},
                    "load": {"type": "trace_timestamps"}},
        "engine": {"backend": "sglang", "workers": {"aggregated": {
            "scheduler": {"max_sequences": 1, "sglang": {"schedule_policy": policy}},
            "kv_cache": {"capacity": {"type": "fixed", "blocks": 100_000}},
            "timing": {"type": "fixed", "prefill_ms": 10, "decode_ms": 1}}}}})
    r = by_uuid(run_config(cfg, capture_per_request=True))
    assert r["r9"]["last_token_ms"] == 79.0
    assert (r["r1"]["first_token_ms"], r["r2"]["first_token_ms"]) == (r1_first, r2_first)
    assert r["r2"]["reused_input_tokens"] == 1023


def test_attention_dp_ranks_share_the_prefill_decode_interval(tmp_path):
    # A prefills on rank 0 (0-10); B (rank 1) waits three rounds although its own rank never
    # prefilled, then prefills 13-23 while A decodes in the same (10 ms) group pass
    from aisim import run_config
    from aisim.simulator.config.loading import validate_config
    from tests.helpers import write_trace

    trace = write_trace(tmp_path / "t.jsonl", [row(0, 100, 10, 1), row(5, 100, 3, 2)])
    cfg = validate_config({
        "traffic": {"source": {"type": "trace", "format": "mooncake", "paths": [str(trace)], "block_size": 512},
                    "load": {"type": "trace_timestamps"}},
        "engine": {"backend": "sglang", "workers": {"aggregated": {
            "parallelism": {"attention_data": 2}, "scheduler": {"prefill_decode_interval": 3},
            "kv_cache": {"block_size": 1, "capacity": {"type": "fixed", "blocks": 100_000}},
            "timing": {"type": "fixed", "prefill_ms": 10, "decode_ms": 1}}}}})
    r = by_uuid(run_config(cfg, capture_per_request=True))
    assert (r["r1"]["first_token_ms"], r["r1"]["last_token_ms"]) == (10.0, 28.0)
    assert (r["r2"]["dp_rank"], r["r2"]["first_admit_ms"], r["r2"]["first_token_ms"], r["r2"]["last_token_ms"]) == (
        1, 13.0, 23.0, 25.0)
