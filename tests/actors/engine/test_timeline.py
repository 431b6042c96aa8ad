"""Worker timelines: exact samples of hand-computed scenarios; recording never changes results."""

from __future__ import annotations

import itertools
import json

import msgpack
import pytest

import aisim.simulator.builders as builders
from aisim import run_trace_replay
from aisim.actors.engine.host import HostPool, WorkerHost
from aisim.actors.engine.request import Request, request_to_wire
from aisim.actors.engine.scheduler import RankScheduler, SchedulerConfig
from aisim.actors.engine.timing import FixedTiming
from aisim.actors.engine.worker import EngineWorker
from aisim.actors.protocol import HostInput, Op, Phase
from aisim.simulator.metrics.output import canonical_json
from aisim.simulator.metrics.timeline import Interval, WorkerTimeline
from tests.conftest import SLICE
from tests.helpers import without_wall, write_trace

# budget 512, 16-token blocks, 100 blocks, no prefix caching (no hashes needed)
CFG = SchedulerConfig(max_batched_tokens=512, block_size=16, num_gpu_blocks=100, enable_prefix_caching=False)


def worker(record=True, fast_forward=True, ranks=1):
    return EngineWorker(0, [RankScheduler(CFG, FixedTiming(100, 10)) for _ in range(ranks)],
                        fast_forward=fast_forward, record_timeline=record)


def req(i, prompt, out, t=0.0):
    return Request(i, None, t, prompt, out)


def columns(w):
    tl = w.timeline
    return list(tl.times_ms), list(tl.waiting), list(tl.running), list(tl.kv_blocks_used)


def drive(w, arrivals):
    """A minimal event loop: pass ends first, then arrivals at that time, then start if idle."""
    pending = sorted(arrivals, key=lambda a: (a[0], a[1].index))
    end = None
    done = []
    while pending or end is not None:
        t = min(x for x in (end, pending[0][0] if pending else None) if x is not None)
        if end is not None and end == t:
            done.extend(w.finish(t))
            end = None
        while pending and pending[0][0] == t:
            _, r = pending.pop(0)
            cut = w.enqueue(r, 0, t)
            if cut is not None:
                end = cut
        if end is None:
            end, rejected = w.start_if_idle(t)
            assert not rejected
    return done


def test_off_by_default_and_export_none():
    w = EngineWorker(0, [RankScheduler(CFG, FixedTiming(100, 10))])
    assert w.timeline is None and w.export_timeline("aggregated", 10.0) is None
    drive(w, [(0.0, req(0, 100, 3))])
    assert w.timeline is None


def test_two_requests_at_zero_then_one_mid_pass():
    # A (100 tokens, 3 out) and B (300, 2) at 0; C (200, 1) at 50 while the first pass runs.
    # 0: both admitted in one pass (7 + 19 blocks; the queue state of t=0 is overwritten by the
    #    start at t=0), 50: C waits, 100-210: A, B decode + C's prompt (13 blocks) = 110 ms,
    # 210: B and C complete (A keeps 7 blocks), 220: A completes.
    w = worker()
    a, b, c = req(0, 100, 3), req(1, 300, 2), req(2, 200, 1, 50.0)
    done = drive(w, [(0.0, a), (0.0, b), (50.0, c)])
    assert [r.index for r in done] == [1, 2, 0] and [r.terminal_ms for r in done] == [210.0, 210.0, 220.0]
    assert columns(w) == ([0.0, 50.0, 100.0, 210.0, 220.0], [0, 1, 0, 0, 0], [2, 2, 3, 1, 0], [26, 26, 39, 7, 0])
    tl = WorkerTimeline.from_plain(w.export_timeline("aggregated", 300.0))
    assert (tl.worker_id, tl.role, tl.kv_blocks_total, tl.start_ms, tl.end_ms) == (0, "aggregated", 100, 0.0, 300.0)
    assert tl.intervals() == [
        Interval(0.0, 0.05, 0, 2, 0.26),
        Interval(50.0, 0.05, 1, 2, 0.26),
        Interval(100.0, 0.11, 0, 3, 0.39),
        Interval(210.0, 0.01, 0, 1, 0.07),
        Interval(220.0, 0.08, 0, 0, 0.0),
    ]
    # waiting: 0 for 250 ms, 1 for 50 ms -> p = (5/6, 1)
    assert tl.weighted_quantile("waiting", 0.5) == 0.0
    assert tl.weighted_quantile("waiting", 0.9) == pytest.approx(0.4)
    assert tl.weighted_quantile("waiting", 1.0) == 1.0
    assert tl.weighted_quantile("running", 1.0) == 3.0


def test_same_instant_overwrites_and_equal_states_coalesce():
    w = worker()
    w.enqueue(req(0, 100, 1), 0, 5.0)
    w.enqueue(req(1, 100, 1), 0, 5.0)
    assert columns(w) == ([5.0], [2], [0], [0])  # the last state at an instant wins
    w.ranks[0].waiting.clear()
    w._sample(5.0)  # back to the idle state before the first sample: nothing left
    assert columns(w) == ([], [], [], [])
    w.enqueue(req(2, 100, 1), 0, 6.0)
    w._sample(7.0)  # unchanged: skipped
    assert columns(w) == ([6.0], [1], [0], [0])


@pytest.mark.parametrize("fast_forward", [True, False])
def test_decode_run_samples_at_start_enqueue_and_end(fast_forward):
    # A (16 tokens, 10 out) at 0: prefill [0, 100] in 1 block; decode from 100 needs a 2nd block.
    # D (16, 1) arrives at 135 during the pass [130, 140]; [140, 250]: A decodes + D's prompt
    # (1 block); D completes at 250; A decodes 4 more passes to 290.
    w = worker(fast_forward=fast_forward)
    done = drive(w, [(0.0, req(0, 16, 10)), (135.0, req(1, 16, 1))])
    assert [(r.index, r.terminal_ms) for r in done] == [(1, 250.0), (0, 290.0)]
    if fast_forward:
        assert w.num_runs == 2
        # the run planned at 100 allocates lazily: its 2nd block shows at the enqueue at 135
        assert columns(w) == ([0.0, 135.0, 140.0, 250.0, 290.0], [0, 1, 0, 0, 0], [1, 1, 2, 1, 0], [1, 2, 3, 2, 0])
    else:
        assert w.num_runs == 0
        assert columns(w) == ([0.0, 100.0, 135.0, 140.0, 250.0, 290.0], [0, 0, 1, 0, 0, 0], [1, 1, 1, 2, 1, 0],
                              [1, 2, 2, 3, 2, 0])


def test_ranks_are_summed():
    w = worker(ranks=2)
    w.enqueue(req(0, 100, 2), 0, 0.0)
    w.enqueue(req(1, 300, 2), 1, 0.0)
    w.start(0.0)
    assert columns(w) == ([0.0], [0], [2], [26])
    assert w.export_timeline()["kv_blocks_total"] == 200


def test_release_source_samples_when_given_a_time():
    cfg = SchedulerConfig(max_batched_tokens=512, block_size=16, num_gpu_blocks=100, enable_prefix_caching=False,
                          prefill_only=True)
    w = EngineWorker(0, [RankScheduler(cfg, FixedTiming(100, 10))], record_timeline=True)
    r = req(0, 100, 5)
    w.enqueue(r, 0, 0.0)
    w.start(0.0)
    w.finish(100.0)
    assert w.take_handoffs() == [r]
    w.release_source(r, 130.0)
    assert columns(w) == ([0.0, 100.0, 130.0], [0, 0, 0], [1, 0, 0], [7, 7, 0])


@pytest.mark.parametrize("direct", [True, False])
def test_host_finish_reports_timelines_by_worker_id(direct):
    def spawn(wid):
        return EngineWorker(wid, [RankScheduler(CFG, FixedTiming(100, 10))], record_timeline=wid == 1)

    pools = {"aggregated": HostPool(spawn, False, False)}
    host = WorkerHost(pools, None, [(1, "aggregated"), (0, "aggregated")], direct=direct)
    enc = (lambda r: r) if direct else request_to_wire
    inputs = [HostInput(t, Phase.ARRIVAL, i, Op.ENQUEUE, 1, enc(req(i, p, o, t)), 0, False)
              for i, (t, p, o) in enumerate([(0.0, 100, 3), (0.0, 300, 2), (50.0, 200, 1)])]
    host.step([], inputs, 0.0, 1000.0)
    out = host.finish(1000.0)
    assert out.timelines[0] is None
    data = out.timelines[1]
    if not direct:
        data = msgpack.unpackb(msgpack.packb(data, use_bin_type=True), raw=False)  # msgpack-safe
    tl = WorkerTimeline.from_plain(data)
    assert (tl.worker_id, tl.role, tl.end_ms) == (1, "aggregated", 1000.0)
    assert tl.times_ms.tolist() == [0.0, 50.0, 100.0, 210.0, 220.0]
    assert tl.waiting.tolist() == [0, 1, 0, 0, 0] and tl.running.tolist() == [2, 2, 3, 1, 0]
    assert tl.kv_blocks_used.tolist() == [26, 26, 39, 7, 0]


# -- recording changes nothing in a whole replay ------------------------------------------------------
@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    rows = [json.loads(line) for line in itertools.islice(SLICE.open(), 200)]
    return write_trace(tmp_path_factory.mktemp("timeline") / "slice.jsonl", rows)


@pytest.mark.parametrize("engine", [
    {"num_gpu_blocks": 700, "max_num_batched_tokens": 4096},  # preemptions
    {"dp_size": 2, "num_gpu_blocks": 2000, "timing_model": {"type": "fixed", "prefill_ms": 40, "decode_ms": 7}},
])
def test_recording_does_not_change_the_replay(trace, monkeypatch, engine):
    kw = dict(extra_engine_args=engine, num_workers=2, capture_per_request=True, sla_ttft_ms=2000, sla_itl_ms=40)
    plain = run_trace_replay(str(trace), **kw)
    built: list[EngineWorker] = []

    def recording(*args, **kwargs):
        kwargs["record_timeline"] = True
        w = EngineWorker(*args, **kwargs)
        built.append(w)
        return w

    monkeypatch.setattr(builders, "EngineWorker", recording)
    rec = run_trace_replay(str(trace), **kw)
    assert built and all(len(w.timeline.times_ms) > 10 for w in built)
    assert canonical_json(without_wall(rec.to_dict())) == canonical_json(without_wall(plain.to_dict()))
    for w in built:
        tl = w.timeline
        assert list(tl.times_ms) == sorted(tl.times_ms)
        assert (tl.waiting[-1], tl.running[-1], tl.kv_blocks_used[-1]) == (0, 0, 0)  # everything completed
        assert max(tl.kv_blocks_used) <= w.kv_blocks_total
