"""Admission rejections are counted, explained and shown: reason codes on the requests, in the
summary (``rejection_reasons``, ``rejection_examples``), in requests.jsonl and in the table."""

from __future__ import annotations

import pytest

from aisim import run_config
from aisim.simulator.config.loading import load_config
from aisim.simulator.metrics.table import render_table
from tests.conftest import ROOT
from tests.helpers import by_uuid, replay_rows

FIXED = {"timing_model": {"type": "fixed", "prefill_ms": 100, "decode_ms": 10}}


def row(t, inp, out, rid):
    return {"timestamp": t, "input_length": inp, "output_length": out, "request_id": f"r{rid}",
            "hash_ids": list(range(1000 * rid + 1, 1000 * rid + 1 + -(-inp // 512)))}


def table_lines(summary: dict) -> list[str]:
    return render_table(summary).splitlines()


def count_row(lines: list[str], label: str) -> str:
    (line,) = [x for x in lines if x.startswith(f"│ {label} ")]
    return line.split("│")[2].strip()


def test_context_length_rejection_is_counted_and_explained(tmp_path):
    rows = [row(0, 16, 2, 1), row(0, 20, 2, 2), row(0, 33, 2, 3)]
    rep = replay_rows(tmp_path, rows, {**FIXED, "max_model_len": 20, "block_size": 4})
    s = rep.summary
    counts = (s["num_requests"], s["completed_requests"], s["rejected_requests"], s["incomplete_requests"])
    assert counts == (3, 1, 2, 0)
    assert s["rejection_reasons"] == {"context_length": 2}
    assert s["rejection_examples"] == {"context_length": "prompt of 20 tokens >= context length 20"}
    r = by_uuid(rep)
    assert (r["r1"]["terminal_status"], r["r1"]["rejection_reason"], r["r1"]["rejection_detail"]) == (
        "completed", None, None)
    assert (r["r2"]["terminal_status"], r["r2"]["rejection_reason"], r["r2"]["rejection_detail"]) == (
        "rejected", "context_length", "prompt of 20 tokens >= context length 20")
    assert r["r3"]["rejection_detail"] == "prompt of 33 tokens >= context length 20"
    assert r["r3"]["terminal_time_ms"] == 0.0 and r["r3"]["first_token_ms"] is None
    lines = table_lines(s)
    assert [count_row(lines, k) for k in ("Completed Requests (requests)", "Rejected Requests (requests)",
                                          "Incomplete Requests (requests)")] == ["1", "2", "0"]
    assert not any(x.startswith("│ Request Count") for x in lines)
    assert [x for x in lines if x.startswith("Rejected")] == [
        "Rejected (context_length): 2 requests, e.g. prompt of 20 tokens >= context length 20"]


def test_kv_capacity_rejection_is_counted_and_explained(tmp_path):
    # 4 blocks of 4 tokens: a 16-token prompt fits exactly, a 17-token one never can
    rows = [row(0, 17, 3, 1), row(0, 16, 1, 2)]
    rep = replay_rows(tmp_path, rows, {**FIXED, "num_gpu_blocks": 4, "block_size": 4})
    s = rep.summary
    assert (s["completed_requests"], s["rejected_requests"], s["incomplete_requests"]) == (1, 1, 0)
    detail = "prompt of 17 tokens needs 5 KV blocks, the cache holds 4 (block size 4)"
    assert s["rejection_reasons"] == {"kv_capacity": 1} and s["rejection_examples"] == {"kv_capacity": detail}
    r = by_uuid(rep)
    assert (r["r1"]["rejection_reason"], r["r1"]["rejection_detail"]) == ("kv_capacity", detail)
    assert r["r2"]["terminal_status"] == "completed" and r["r2"]["ttft_ms"] == 100.0
    lines = table_lines(s)
    assert count_row(lines, "Rejected Requests (requests)") == "1"
    assert [x for x in lines if x.startswith("Rejected")] == [f"Rejected (kv_capacity): 1 request, e.g. {detail}"]


def test_mixed_reasons_sorted_keys_table_most_frequent_first(tmp_path):
    rows = [row(0, 100, 1, 1), row(0, 600, 1, 2), row(0, 4000, 1, 3), row(1, 5000, 1, 4), row(2, 700, 1, 5)]
    eng = {**FIXED, "max_model_len": 3000, "num_gpu_blocks": 16, "block_size": 64,
           "max_num_batched_tokens": 512, "enable_chunked_prefill": False}
    rep = replay_rows(tmp_path, rows, eng)
    s = rep.summary
    assert s["rejection_reasons"] == {"context_length": 2, "max_batched_tokens": 2}
    assert list(s["rejection_reasons"]) == sorted(s["rejection_reasons"])
    assert s["rejection_examples"] == {
        "context_length": "prompt of 4,000 tokens >= context length 3,000",
        "max_batched_tokens": "prompt of 600 tokens > max batched tokens 512 with chunked prefill off"}
    assert {k: v["rejection_reason"] for k, v in by_uuid(rep).items()} == {
        "r1": None, "r2": "max_batched_tokens", "r3": "context_length", "r4": "context_length",
        "r5": "max_batched_tokens"}
    assert [x for x in table_lines(s) if x.startswith("Rejected")] == [
        "Rejected (context_length): 2 requests, e.g. prompt of 4,000 tokens >= context length 3,000",
        "Rejected (max_batched_tokens): 2 requests, e.g. prompt of 600 tokens > max batched tokens 512 "
        "with chunked prefill off"]


def test_reasons_survive_the_wire_between_hosts(tmp_path):
    rows = [row(0, 16, 2, 1), row(0, 20, 2, 2), row(0, 18, 2, 3), row(0, 40, 2, 4)]
    eng = {**FIXED, "max_model_len": 20, "block_size": 4}
    direct = replay_rows(tmp_path, rows, eng, num_workers=2)
    wired = replay_rows(tmp_path, rows, eng, num_workers=2, engine_actors=2)
    assert direct.diagnostics["runtime"]["num_hosts"] == 1 and wired.diagnostics["runtime"]["num_hosts"] == 2
    for rep in (direct, wired):
        assert rep.summary["rejection_reasons"] == {"context_length": 2}
        assert rep.summary["rejection_examples"] == {"context_length": "prompt of 20 tokens >= context length 20"}
        assert by_uuid(rep)["r4"]["rejection_detail"] == "prompt of 40 tokens >= context length 20"
    assert wired.per_request == direct.per_request


def test_no_rejections_no_reason_lines(tmp_path):
    rep = replay_rows(tmp_path, [row(0, 16, 2, 1)], FIXED)
    assert rep.summary["rejection_reasons"] == {} and rep.summary["rejection_examples"] == {}
    assert by_uuid(rep)["r1"]["rejection_reason"] is None
    lines = table_lines(rep.summary)
    assert count_row(lines, "Completed Requests (requests)") == "1"
    assert count_row(lines, "Rejected Requests (requests)") == "0"
    assert not [x for x in lines if x.startswith("Rejected")]


@pytest.mark.parametrize("override,code", [
    ("engine.workers.aggregated.kv_cache.capacity={type: fixed, blocks: 1}", "kv_capacity"),
    ("engine.context_length=100", "context_length"),
])
def test_quickstart_that_rejects_everything_says_so(override, code):
    cfg, cdir = load_config(ROOT / "configs" / "quickstart.yaml", [override])
    s = run_config(cfg, cdir).summary
    assert (s["num_requests"], s["completed_requests"], s["rejected_requests"], s["incomplete_requests"]) == (
        1000, 0, 1000, 0)
    assert s["rejection_reasons"] == {code: 1000}
    lines = table_lines(s)
    assert count_row(lines, "Completed Requests (requests)") == "0"
    assert count_row(lines, "Rejected Requests (requests)") == "1,000"
    (reason,) = [x for x in lines if x.startswith("Rejected (")]
    assert reason.startswith(f"Rejected ({code}): 1,000 requests, e.g. prompt of ")
    expected = ("the cache holds 1 (block size 64)" if code == "kv_capacity" else ">= context length 100")
    assert reason.endswith(expected) and s["rejection_examples"][code] in reason


def test_disaggregated_decode_pool_too_small_names_its_cache():
    cfg, cdir = load_config(ROOT / "configs" / "disaggregated-1p1d.yaml",
                            ["engine.workers.decode.kv_cache.capacity={type: fixed, blocks: 1}"])
    s = run_config(cfg, cdir).summary
    assert (s["completed_requests"], s["rejected_requests"], s["rejection_reasons"]) == (0, 1000, {"kv_capacity": 1000})
    assert s["rejection_examples"]["kv_capacity"].endswith(" KV blocks, the decode cache holds 1 (block size 64)")
