"""Traffic plans: synthetic requests and sessions, loads, stop rules."""

from __future__ import annotations

import numpy as np
import pytest

from aisim import run_config, run_synthetic_trace_replay
from aisim.simulator.config import models as m
from aisim.simulator.config.loading import validate_config
from aisim.simulator.errors import InputError
from aisim.simulator.traffic.build import build_traffic

ENGINE = {
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "hardware": "h200_sxm",
    "workers": {"aggregated": {"kv_cache": {"capacity": {"type": "fixed", "blocks": 5000}},
                               "timing": {"type": "fixed", "prefill_ms": 10, "decode_ms": 1}}},
}


def plan(traffic: dict):
    return build_traffic(m.Traffic.model_validate(traffic), None)


def test_default_traffic_is_100_requests_1024_128_concurrency_10():
    cfg = validate_config({"engine": ENGINE})
    p = build_traffic(cfg.traffic, None)
    assert p.workload.num_requests == 100 and set(p.workload.input_len) == {1024} and set(p.workload.output_len) == {128}
    times, idx = p.arrivals.start().initial()
    assert len(idx) == 10 and set(times) == {0.0}


def test_closed_loop_stamps_arrival_when_a_slot_frees():
    rep = run_synthetic_trace_replay(100, 2, 3, replay_concurrency=1, capture_per_request=True,
                                     extra_engine_args={"timing_model": {"type": "fixed", "prefill_ms": 10, "decode_ms": 1}})
    assert [r["arrival_time_ms"] for r in rep.per_request] == [0.0, 11.0, 22.0]


def test_poisson_is_seeded_and_starts_at_zero():
    a = plan({"source": {"type": "synthetic"}, "load": {"type": "poisson", "requests_per_second": 5, "seed": 7}, "stop": {"requests": 50}})
    b = plan({"source": {"type": "synthetic"}, "load": {"type": "poisson", "requests_per_second": 5, "seed": 7}, "stop": {"requests": 50}})
    c = plan({"source": {"type": "synthetic"}, "load": {"type": "poisson", "requests_per_second": 5, "seed": 8}, "stop": {"requests": 50}})
    ta, tb, tc = (p.arrivals.start().initial()[0] for p in (a, b, c))
    assert ta[0] == 0.0 and np.array_equal(ta, tb) and not np.array_equal(ta, tc)
    assert 5_000 < ta[-1] < 15_000  # ~49 gaps of 200 ms


def test_constant_rate_and_per_load_unit_counts():
    p = plan({"source": {"type": "synthetic"}, "load": {"type": "constant_rate", "requests_per_second": 4},
              "stop": {"requests_per_load_unit": 2.6}})
    times, _ = p.arrivals.start().initial()
    assert times.tolist() == [0.0, 250.0, 500.0, 750.0, 1000.0, 1250.0, 1500.0, 1750.0, 2000.0, 2250.0]


def test_synthetic_cached_prefix_is_shared_and_the_first_request_is_cold():
    rep = run_synthetic_trace_replay(1024, 2, 3, replay_concurrency=1, cached_prefix_tokens=512, capture_per_request=True)
    assert [r["reused_input_tokens"] for r in rep.per_request] == [0, 512, 512]


def test_sessions_carry_prompts_and_outputs_into_later_turns():
    traffic = {"source": {"type": "synthetic-session", "new_input_tokens_per_turn": 100, "output_tokens_per_turn": 10,
                          "session": {"turns": 3}, "inter_turn_delay_ms": 5},
               "load": {"type": "concurrency", "concurrency": 1}, "stop": {"sessions": 1}}
    p = plan(traffic)
    assert p.workload.input_len.tolist() == [100, 210, 320]
    kv = {"block_size": 10, "capacity": {"type": "fixed", "blocks": 500}}
    cfg = validate_config({"engine": {**ENGINE, "workers": {"aggregated": {**ENGINE["workers"]["aggregated"], "kv_cache": kv}}},
                           "traffic": traffic})
    rep = run_config(cfg, capture_per_request=True)
    turns = sorted(rep.per_request, key=lambda r: r["turn_index"])
    # turn 2 reuses turn 1's prompt and its output except the last (never computed) token: 100 + 9 -> 10 blocks
    assert [r["reused_input_tokens"] for r in turns] == [0, 100, 210]
    assert turns[1]["arrival_time_ms"] == turns[0]["last_token_ms"] + 5


@pytest.mark.parametrize(
    "traffic,where",
    [
        ({"source": {"type": "synthetic"}}, "traffic.stop"),
        ({"source": {"type": "synthetic"}, "stop": {"sessions": 3}}, "traffic.stop.sessions"),
        ({"source": {"type": "trace", "paths": ["x"]}, "stop": {"requests": 3}}, "traffic.stop.requests"),
        ({"source": {"type": "synthetic"}, "load": {"type": "trace_timestamps"}, "stop": {"requests": 3}}, "traffic.load.type"),
        ({"source": {"type": "synthetic"}, "load": {"type": "poisson", "sessions_per_second": 3}, "stop": {"requests": 3}},
         "traffic.load.sessions_per_second"),
        ({"source": {"type": "synthetic"}, "load": {"type": "kv_capacity_fraction", "fraction": 0.5}, "stop": {"requests": 3}},
         "traffic.load.type"),
    ],
)
def test_traffic_rules(traffic, where):
    with pytest.raises(InputError) as info:
        plan(traffic)
    assert info.value.where == where


def test_a_subset_keeps_each_requests_tokens_and_identity():
    from aisim.simulator.traffic.traces import read_mooncake
    from aisim.simulator.traffic.workload import BlockHashStore
    from tests.conftest import SLICE

    w = read_mooncake([SLICE], 512)
    idx = [3, 4, 10, 999]
    sub = w.subset(idx, shift_ms=1000.0)
    assert sub.num_requests == 4 and sub.input_len.tolist() == w.input_len[idx].tolist()
    assert (sub.timestamp_ms == w.timestamp_ms[idx] - 1000.0).all()
    assert [sub.request_uuid(i) for i in range(4)] == [w.request_uuid(i) for i in idx]
    full, part = BlockHashStore(w), BlockHashStore(sub)
    for k, i in enumerate(idx):  # the same prompt block hashes: shared prefixes stay shared
        n = int(w.input_len[i]) // 64
        assert part.block_hashes(k, 64)[:n] == full.block_hashes(i, 64)[:n]


@pytest.mark.parametrize("bs", [64, 48, 16, 512, 100])
def test_chunked_block_hashes_equal_each_requests_own_sequence(bs):
    """The store hashes 512 requests at once (finding each block's piece by counting); each
    request's hashes equal those of its own pieces hashed alone (found by a search)."""
    import numpy as np

    from aisim.actors import hashing
    from aisim.simulator.traffic.traces import read_mooncake
    from aisim.simulator.traffic.workload import BlockHashStore
    from tests.conftest import SLICE

    w = read_mooncake([SLICE], 512)
    store = BlockHashStore(w)
    out_src = hashing.unique_sources(0x0_0777, np.arange(w.num_requests, dtype=np.int64))
    for i in range(0, w.num_requests, 7):
        lo, hi = int(w.piece_ptr[i]), int(w.piece_ptr[i + 1])
        out_len = int(w.output_len[i])
        src = np.append(w.piece_src[lo:hi], out_src[i])
        lens = np.append(w.piece_len[lo:hi], max(out_len, 1))
        n = max(int(w.input_len[i]) + out_len - 1, 0) // bs
        assert list(store.block_hashes(i, bs)) == hashing.sequence_hashes(src, lens, bs, n).tolist(), i
