"""Speculative decoding (MTP ``engine.nextn``, n-gram ``engine.speculation``): the acceptance streams,
a lone request's token times, the draft tokens' budget, runs against stepping, the rules."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from aisim import plan_from_config, run_plan
from aisim.actors.engine import speculation as sp
from aisim.actors.engine.request import Request
from aisim.actors.engine.scheduler import GapSink, RankScheduler, SchedulerConfig
from aisim.actors.engine.timing import FixedTiming
from aisim.simulator.config.loading import validate_config
from aisim.simulator.errors import InputError, NotSupportedError
from aisim.simulator.metrics.output import canonical_json
from tests.helpers import without_wall, write_trace

# -- the acceptance stream, written out from docs/speculative-decoding.md ----------------------------
M64 = (1 << 64) - 1
G = 0x9E3779B97F4A7C15


def splitmix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def uniforms(seed: int, index: int, n: int) -> list[float]:
    """The first n uniform numbers of request ``index``'s stream."""
    state = splitmix((splitmix(seed) + (index + 1) * G) & M64)
    return [(splitmix((state + (p + 1) * G) & M64) >> 11) / 2.0 ** 53 for p in range(n)]


def accepted_by_hand(rates: list[float], u: float) -> int:
    """Draft t accepted with probability rates[t] given the ones before it were: the thresholds
    P(accepted >= t) are the running products; u below t of them accepts t drafts."""
    a, p = 0, 1.0
    for r in rates:
        p *= r
        if u < p:
            a += 1
        else:
            break
    return a


NGRAM = sp.Speculation("ngram", 3, sp.thresholds([0.8, 0.6, 0.4]), 1.0, 7)


def test_the_n_gram_acceptance_sequence_from_a_seed():
    u = uniforms(7, 3, 12)
    expected = [accepted_by_hand([0.8, 0.6, 0.4], x) for x in u]
    assert expected == [0, 3, 0, 3, 2, 1, 3, 2, 0, 2, 0, 0]  # (request 3 of seed 7, passes 0-11)
    state = sp.stream_seed(7, 3)
    assert [sp.accepted(NGRAM, state, p) for p in range(12)] == expected
    # a block of passes for several requests (what a decode run draws) holds the same numbers
    states = [sp.stream_seed(7, i) for i in (1, 3, 8)]
    block = sp.accepted_block(NGRAM, states, [5, 0, 2], 12)
    assert block[:, 1].tolist() == expected
    assert block[:, 0].tolist() == [accepted_by_hand([0.8, 0.6, 0.4], x) for x in uniforms(7, 1, 17)[5:]]
    assert (sp.accepted_block(NGRAM, states, [0, 0, 0], 12, plus=1)[:, 1] == np.array(expected) + 1).all()
    # a speculative lead's requests drawn ahead (their bursts, 1 + accepted, for the next passes)
    reqs = [SimpleNamespace(index=i, spec_stream=None, spec_passes=p) for i, p in ((1, 5), (3, 0), (8, 2))]
    sp.draw_ahead(NGRAM, reqs, 12)
    assert reqs[1].spec_ahead == [a + 1 for a in expected]
    assert (reqs[1].spec_ahead_at, reqs[1].spec_ahead_end) == (0, 12) and reqs[0].spec_ahead_end == 17
    assert reqs[0].spec_ahead == (block[:, 0] + 1).tolist()


def test_the_conditional_rates_give_the_documented_mean_burst():
    # [0.8, 0.6, 0.4]: 1 + 0.8 + 0.8 x 0.6 + 0.8 x 0.6 x 0.4 = 2.472 tokens a pass
    assert 1 + NGRAM.mean_accepted == pytest.approx(2.472)
    states = [sp.stream_seed(7, i) for i in range(200)]
    draws = sp.accepted_block(NGRAM, states, [0] * 200, 200)
    assert 1 + draws.mean() == pytest.approx(2.472, abs=0.01)
    assert [round(float((draws >= t).mean()), 2) for t in (1, 2, 3)] == [0.80, 0.48, 0.19]


def test_mtp_accepts_floor_of_the_mean_and_one_more_with_its_fraction():
    spec = sp.Speculation("mtp", 2, sp.thresholds(sp.rates_from_mean(1.4, 2)), 1.0, 42)
    assert spec.thresholds == (1.0, pytest.approx(0.4))
    states = [sp.stream_seed(42, i) for i in range(100)]
    draws = sp.accepted_block(spec, states, [0] * 100, 300)
    assert set(np.unique(draws)) == {1, 2} and float((draws == 2).mean()) == pytest.approx(0.4, abs=0.01)
    assert sp.rates_from_mean(2.0, 3) == [1.0, 1.0, 0.0] and sp.rates_from_mean(0.0, 1) == [0.0]


# -- a lone request -----------------------------------------------------------------------------------
def lone(tmp_path, engine: dict, out: int = 11, fast_forward: bool = True, **worker):
    """One 100-token prompt at t=0 producing ``out`` tokens; prefill 50 ms, a decode pass 10 ms."""
    trace = write_trace(tmp_path / "lone.jsonl", [{"timestamp": 0, "input_length": 100, "output_length": out,
                                                   "hash_ids": [1]}])
    cfg = {"traffic": {"source": {"type": "trace", "format": "mooncake", "paths": [str(trace)], "block_size": 128},
                       "load": {"type": "trace_timestamps"}},
           "engine": {"mode": "aggregated", "backend": "vllm", **engine,
                      "workers": {"aggregated": {"kv_cache": {"block_size": 16, "capacity": {"type": "fixed",
                                                                                               "blocks": 100}},
                                                 "timing": {"type": "fixed", "prefill_ms": 50, "decode_ms": 10},
                                                 **worker}}}}
    plan = plan_from_config(validate_config(cfg), capture_per_request=True, fast_forward=fast_forward)
    rep = run_plan(plan)
    return rep, rep.per_request[0]


@pytest.mark.parametrize("fast_forward", [True, False])
def test_a_lone_request_with_two_drafts_always_accepted(tmp_path, fast_forward):
    # 10 tokens after the first: bursts of 3, 3, 3 and the last clipped to 1 -> passes end at 60, 70, 80, 90
    rep, r = lone(tmp_path, {"nextn": 2, "nextn_accepted": 2.0}, fast_forward=fast_forward)
    assert (r["first_token_ms"], r["last_token_ms"], r["ttst_ms"]) == (50.0, 90.0, 10.0)
    assert r["output_length"] == 11 and r["itl_ms"] == 4.0  # (90 - 50) / 10
    s = rep.summary
    # per-token gaps: 10 0 0 | 10 0 0 | 10 0 0 | 10 -> 10 samples, mean 4, median 0
    assert (s["num_itl_samples"], s["mean_itl_ms"], s["median_itl_ms"], s["max_itl_ms"]) == (10, 4.0, 0.0, 10.0)
    # the 0 ms gaps inside a burst are no throughput samples: every positive gap is 10 ms
    assert s["mean_output_token_throughput_per_user"] == 100.0


def test_a_lone_request_with_one_draft_always_accepted_and_with_none(tmp_path):
    _, r = lone(tmp_path, {"nextn": 1, "nextn_accepted": 1.0})
    assert r["last_token_ms"] == 100.0  # 5 passes of 2 tokens
    _, r = lone(tmp_path, {"nextn": 2, "nextn_accepted": 0.0})
    assert r["last_token_ms"] == 150.0  # 10 passes of 1 token (each still verifies 2 drafts)
    _, r = lone(tmp_path, {"speculation": {"kind": "ngram", "num_speculative_tokens": 3,
                                           "acceptance_rates": [1.0, 1.0, 0.0]}})
    assert r["last_token_ms"] == 50.0 + 4 * 10.0  # bursts 3, 3, 3, 1


@pytest.mark.parametrize("fast_forward", [True, False])
def test_a_lone_request_with_a_fractional_acceptance_follows_its_stream(tmp_path, fast_forward):
    # nextn 1, 0.5 accepted: request 0 of the root seed 42 accepts its draft when u < 0.5
    def passes(seed: int) -> int:
        """Decode passes for 40 tokens when each accepts its draft while u < 0.5 (the last clipped)."""
        left, n = 40, 0
        for u in uniforms(seed, 0, 40):
            if not left:
                break
            left -= min(2 if u < 0.5 else 1, left)
            n += 1
        return n

    _, r = lone(tmp_path, {"nextn": 1, "nextn_accepted": 0.5}, out=41, fast_forward=fast_forward)
    assert r["last_token_ms"] == 50.0 + 10.0 * passes(42) and 20 < passes(42) < 40
    # the section's own seed replaces the root seed
    _, r = lone(tmp_path, {"speculation": {"kind": "ngram", "num_speculative_tokens": 1, "acceptance_rates": [0.5],
                                           "seed": 5}}, out=41, fast_forward=fast_forward)
    assert r["last_token_ms"] == 50.0 + 10.0 * passes(5)


def test_the_draft_tokens_count_against_the_batch_budget():
    # 2 decoding requests, 3 tokens verified each, a budget of 5: the second verifies only 2
    cfg = SchedulerConfig(max_batched_tokens=5, max_sequences=4, block_size=4, num_gpu_blocks=100,
                          speculation=sp.Speculation("mtp", 2, (1.0, 1.0), 1.0, 42))
    rank = RankScheduler(cfg, FixedTiming(50, 10))

    class Src:
        def block_hashes(self, index, block_size):
            return [index * 100 + b for b in range(50)]

    reqs = [Request(i, Src(), 0.0, 2, 20) for i in range(2)]
    for r in reqs:
        rank.enqueue(r)
    gaps, done = GapSink(), []
    rp = rank.schedule(0.0)
    assert [(r.index, n) for r, n in rp.items] == [(0, 2), (1, 2)]  # both prompts in one pass
    rank.finish(rp, 0.0, 50.0, gaps, done)
    rp = rank.schedule(50.0)
    assert [(r.index, n) for r, n in rp.items] == [(0, 3), (1, 2)]  # bursts of 3 and (budget-clipped) 2
    assert rp.shape.num_decode == 2 and rp.shape.decode_kv_tokens == 6
    rank.finish(rp, 50.0, 60.0, gaps, done)
    assert [(r.num_generated, r.num_computed, r.spec_passes, r.spec_tokens) for r in reqs] == [(4, 5, 1, 3),
                                                                                              (3, 4, 1, 2)]


# -- runs and stepping -----------------------------------------------------------------------------------
def busy(tmp_path, engine: dict, **worker) -> dict:
    rows = [{"timestamp": t * 9, "input_length": 40 + t % 5 * 30, "output_length": 15 + t * 7 % 90,
             "hash_ids": [t % 6, 100 + t]} for t in range(80)]
    trace = write_trace(tmp_path / "busy.jsonl", rows)
    wk = {"kv_cache": {"block_size": 16, "capacity": {"type": "fixed", "blocks": 40}},
          "scheduler": {"max_batched_tokens": 256, "max_sequences": 12},
          "timing": {"type": "fixed", "prefill_ms": 30, "decode_ms": 5}, "parallelism": {"replicas": 2}}
    for k, v in worker.items():
        wk[k] = {**wk.get(k, {}), **v}
    return {"traffic": {"source": {"type": "trace", "format": "mooncake", "paths": [str(trace)], "block_size": 128},
                        "load": {"type": "trace_timestamps"}},
            "engine": {"mode": "aggregated", "backend": "vllm", **engine, "workers": {"aggregated": wk}},
            "router": {"policy": "kv_router"}}


SPECS = {"mtp": {"nextn": 2, "nextn_accepted": 1.4},
         "ngram": {"speculation": {"kind": "ngram", "num_speculative_tokens": 3, "acceptance_rates": [0.8, 0.6, 0.4]}}}


@pytest.mark.parametrize("spec", list(SPECS))
@pytest.mark.parametrize("worker", [{}, {"parallelism": {"attention_data": 2}}, {"scheduler": {"preemption_mode": "fifo"}}],
                         ids=["one_rank", "two_ranks", "fifo"])
def test_fast_forwarded_runs_equal_stepping_pass_by_pass(tmp_path, spec, worker, monkeypatch):
    from aisim.simulator.metrics.collector import RequestLog

    ended = []  # (each request's speculative counters as it ends: the Planner's accept length reads them)
    add = RequestLog.add

    def logged(log, req, *args):
        ended.append((req.index, req.spec_passes, req.spec_tokens))
        return add(log, req, *args)

    monkeypatch.setattr(RequestLog, "add", logged)
    plan = plan_from_config(validate_config(busy(tmp_path, SPECS[spec], **worker)), capture_per_request=True)
    on = run_plan(plan)
    counters, ended = sorted(ended), []
    off = run_plan(dataclasses.replace(plan, fast_forward=False))
    assert on.diagnostics["num_fast_forward_runs"] > 10 and off.diagnostics["num_fast_forward_runs"] == 0
    assert canonical_json(without_wall(on.to_dict())) == canonical_json(without_wall(off.to_dict()))
    assert len(counters) == 80 and counters == sorted(ended)
    s = on.summary
    assert s["num_preemptions"] > 0  # (a tight cache: blocks run out mid-burst too)
    assert s["completed_requests"] == 80 and s["median_itl_ms"] == 0.0  # (most gaps are inside bursts)
    assert sum(r["output_length"] for r in on.per_request) == s["total_output_tokens"]


def test_mtp_on_tensorrt_llm_workers_runs_as_stepped(tmp_path):
    # (TensorRT-LLM's admission reserves the prompt and the whole output: bursts never preempt)
    plan = plan_from_config(validate_config(busy(tmp_path, {**SPECS["mtp"], "backend": "trtllm"})),
                            capture_per_request=True)
    on, off = run_plan(plan), run_plan(dataclasses.replace(plan, fast_forward=False))
    assert on.diagnostics["num_fast_forward_runs"] > 10 and on.summary["num_preemptions"] == 0
    assert on.summary["completed_requests"] == 80 and on.summary["median_itl_ms"] == 0.0
    assert canonical_json(without_wall(on.to_dict())) == canonical_json(without_wall(off.to_dict()))


def test_the_same_config_twice_gives_the_same_report(tmp_path):
    cfg = validate_config(busy(tmp_path, SPECS["mtp"]))
    a = run_plan(plan_from_config(cfg, capture_per_request=True))
    b = run_plan(plan_from_config(cfg, capture_per_request=True))
    assert canonical_json(without_wall(a.to_dict())) == canonical_json(without_wall(b.to_dict()))


def test_speculation_speeds_decoding_up_by_the_accepted_drafts(tmp_path):
    base = run_plan(plan_from_config(validate_config(busy(tmp_path, {})))).summary
    mtp = run_plan(plan_from_config(validate_config(busy(tmp_path, SPECS["mtp"])))).summary
    # a pass costs the same (fixed timing) and emits 2.4 tokens on average (passes that also carry
    # a prefill chunk cost 35 ms either way)
    assert mtp["mean_tpot_ms"] < 0.65 * base["mean_tpot_ms"]
    assert mtp["total_output_tokens"] == base["total_output_tokens"]


def test_a_spec_lead_schedules_exactly_as_one_request_at_a_time():
    from tests.actors.engine.test_scheduler import _step_rank

    spec = sp.Speculation("mtp", 2, (1.0, 0.4), 1.0, 42)
    (one, gaps_one), (led, gaps_led) = _step_rank(False, spec), _step_rank(True, spec)
    assert len(one) > 100 and any(x[3] for x in one)  # (preemptions happen too)
    assert led == one and gaps_led == gaps_one


# -- the Planner's accept length -----------------------------------------------------------------------------
def test_the_traffic_window_reports_tokens_per_decode_pass():
    from aisim.simulator.coordinator import TrafficAccumulator

    acc = TrafficAccumulator()
    for i, (passes, tokens) in enumerate([(10, 24), (30, 66), (0, 0)]):
        r = Request(i, None, 0.0, 100, tokens + 1)
        r.first_token_ms, r.last_token_ms, r.num_generated = 50.0, 150.0, tokens + 1
        r.spec_passes, r.spec_tokens = passes, tokens
        acc.complete(r)
    assert acc.peek(1000.0).avg_accept_length == 90 / 40
    assert TrafficAccumulator().peek(1000.0).avg_accept_length == 1.0


# -- rules ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("engine", "where", "message"), [
    ({"nextn": 2}, "engine.nextn_accepted", "Field required with engine.nextn 2"),
    ({"nextn": 2, "nextn_accepted": 2.5}, "engine.nextn_accepted", "must be within [0, nextn=2]"),
    ({"nextn_accepted": 1.0}, "engine.nextn_accepted", "needs engine.nextn > 0"),
    ({"nextn": 6, "nextn_accepted": 1.0}, "engine.nextn", "must be between 0 and 5"),
    ({"nextn": 1, "nextn_accepted": 1.0, "speculation": {"kind": "ngram", "num_speculative_tokens": 1,
                                                         "acceptance_rates": [0.5]}},
     "engine.speculation", "cannot be combined with MTP"),
    ({"speculation": {"kind": "ngram", "num_speculative_tokens": 2, "acceptance_rates": [0.5]}},
     "engine.speculation.acceptance_rates", "one rate per speculative token: 2, got 1"),
    ({"speculation": {"kind": "ngram", "num_speculative_tokens": 1, "acceptance_rates": [1.5]}},
     "engine.speculation.acceptance_rates[0]", "must be within [0, 1]"),
    ({"speculation": {"kind": "ngram", "num_speculative_tokens": 1, "acceptance_rates": [0.5]}, "backend": "trtllm"},
     "engine.speculation", "only for vLLM language workers"),
    ({"speculation": {"kind": "ngram", "num_speculative_tokens": 1, "acceptance_rates": [0.5]},
      "host": {"num_host_blocks": 10}}, "engine.workers.aggregated.kv_cache.host_offload",
     "does not support speculative decoding"),
    ({"nextn": 1, "nextn_accepted": 0.5, "host": {"num_host_blocks": 10}},
     "engine.workers.aggregated.kv_cache.host_offload", "does not support speculative decoding"),
    ({"speculation": {"kind": "mtp"}}, "engine.speculation.kind", "ngram"),
    ({"nextn": 1, "nextn_accepted": 0.5, "timing": {"type": "polynomial"}}, "engine.workers.aggregated.timing.type",
     "default (measured) or fixed"),
])
def test_bad_speculation_input_names_the_field_and_the_fix(engine, where, message):
    engine = dict(engine)
    kv = {"block_size": 16, "bytes_per_token": 1024, "capacity": {"type": "fixed", "blocks": 100}}
    if "host" in engine:
        kv["host_offload"] = engine.pop("host")
    timing = engine.pop("timing", {"type": "fixed", "prefill_ms": 10, "decode_ms": 1})
    cfg = {"traffic": {"source": {"type": "synthetic", "input_tokens": 64, "output_tokens": 2},
                       "load": {"type": "concurrency", "concurrency": 1}, "stop": {"requests": 1}},
           "engine": {"mode": "aggregated", "backend": "vllm", **engine,
                      "workers": {"aggregated": {"kv_cache": kv, "timing": timing}}}}
    with pytest.raises(InputError) as err:
        plan_from_config(validate_config(cfg))
    assert err.value.where == where and message in str(err.value) and "\n" not in str(err.value)


def test_sglang_ranks_refuse_mtp_as_not_supported():
    cfg = {"traffic": {"source": {"type": "synthetic", "input_tokens": 64, "output_tokens": 2},
                       "load": {"type": "concurrency", "concurrency": 1}, "stop": {"requests": 1}},
           "engine": {"mode": "aggregated", "backend": "sglang", "nextn": 1, "nextn_accepted": 0.5,
                      "workers": {"aggregated": {"timing": {"type": "fixed", "prefill_ms": 10, "decode_ms": 1},
                                                 "kv_cache": {"capacity": {"type": "fixed", "blocks": 100}}}}}}
    with pytest.raises(NotSupportedError) as err:
        plan_from_config(validate_config(cfg))
    assert err.value.where == "engine.nextn" and "SGLang" in str(err.value)


@pytest.mark.parametrize("name", ["mtp_kv_router_dp", "ngram_2p2d"])
def test_fast_forwarded_runs_change_nothing_on_the_conversation_slice(name):
    from aisim.simulator.config.loading import load_config
    from tests.simulator.test_coordinator import CASES, CONFIGS, same

    cfg, cdir = load_config(CONFIGS / CASES[name][0], CASES[name][1])
    plan = plan_from_config(cfg, cdir, capture_per_request=True)
    on, off = run_plan(plan), run_plan(dataclasses.replace(plan, fast_forward=False))
    assert on.diagnostics["num_fast_forward_runs"] > 0 and off.diagnostics["num_fast_forward_runs"] == 0
    assert same(on, off)
