"""Fast-forwarded decode runs are indistinguishable from stepping pass by pass."""

from __future__ import annotations

import itertools
import json

import pytest

from aisim import run_trace_replay
from aisim.actors.engine.kv_cache import REMOVED, STORED
from aisim.actors.engine.request import Request
from aisim.actors.engine.scheduler import RankScheduler, SchedulerConfig
from aisim.actors.engine.timing import FixedTiming
from aisim.actors.engine.worker import EngineWorker
from aisim.actors.hashing import hash_view
from aisim.simulator.metrics.output import canonical_json
from tests.conftest import SLICE
from tests.helpers import without_wall, write_trace

CASES = {
    "polynomial, roomy cache": dict(extra_engine_args={"num_gpu_blocks": 29249}, num_workers=2),
    "tiny cache, preemptions": dict(extra_engine_args={"num_gpu_blocks": 700, "max_num_batched_tokens": 4096}, num_workers=2),
    "fifo preemption": dict(extra_engine_args={"num_gpu_blocks": 700, "preemption_mode": "fifo"}, num_workers=1),
    "attention-data ranks": dict(extra_engine_args={"dp_size": 2, "num_gpu_blocks": 2000,
                                                    "timing_model": {"type": "fixed", "prefill_ms": 40, "decode_ms": 7}}),
    "context limit": dict(extra_engine_args={"max_model_len": 9000, "block_size": 16, "num_gpu_blocks": 9000}, num_workers=2),
    "closed loop": dict(extra_engine_args={"num_gpu_blocks": 3000, "max_num_seqs": 6}, replay_concurrency=12),
    "roofline": dict(extra_engine_args={"model": "meta-llama/Llama-3.1-8B-Instruct", "hardware": "h100_sxm",
                                        "timing_model": {"type": "roofline"}, "num_gpu_blocks": 4000}, num_workers=2),
    "disaggregated 1P1D": dict(prefill_engine_args={"num_gpu_blocks": 6000}, decode_engine_args={"num_gpu_blocks": 6000}),
    "disaggregated, tight decode": dict(prefill_engine_args={"num_gpu_blocks": 6000},
                                        decode_engine_args={"num_gpu_blocks": 1200, "max_num_seqs": 6,
                                                            "max_model_len": 9000},
                                        num_decode_workers=2),
    "measured (default) timing": dict(extra_engine_args={"model": "meta-llama/Llama-3.1-8B-Instruct", "hardware": "h200_sxm",
                                                         "timing_model": {"type": "default"}, "num_gpu_blocks": 3000},
                                      num_workers=2),
}


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    rows = [json.loads(line) for line in itertools.islice(SLICE.open(), 400)]
    return write_trace(tmp_path_factory.mktemp("ff") / "slice.jsonl", rows)


@pytest.mark.parametrize("name", list(CASES))
def test_fast_forward_equals_stepping(trace, name):
    if "default" in name:
        pytest.importorskip("aiconfigurator_core")
    kw = dict(CASES[name], capture_per_request=True, sla_ttft_ms=2000, sla_itl_ms=40)
    fast = run_trace_replay(str(trace), fast_forward=True, **kw)
    step = run_trace_replay(str(trace), fast_forward=False, **kw)
    assert fast.diagnostics["num_fast_forward_runs"] > 0
    assert step.diagnostics["num_fast_forward_runs"] == 0
    assert fast.diagnostics["num_passes"] == step.diagnostics["num_passes"]
    assert canonical_json(without_wall(fast.to_dict())) == canonical_json(without_wall(step.to_dict()))


@pytest.mark.parametrize("name", ["disaggregated 1P1D", "disaggregated, tight decode"])
def test_transferred_requests_join_decode_runs(trace, name, monkeypatch):
    """The disaggregated cases above exercise EngineWorker._join: most transferred requests join
    the decode run in flight, some cannot (a full batch, no room, two at once)."""
    outcomes = []
    join = EngineWorker._join

    def counted(self, *a):
        outcomes.append(join(self, *a))
        return outcomes[-1]

    monkeypatch.setattr(EngineWorker, "_join", counted)
    run_trace_replay(str(trace), **CASES[name])
    assert outcomes.count(True) > 20 and outcomes.count(False) > 0


def test_preemption_case_really_preempts(trace):
    rep = run_trace_replay(str(trace), **CASES["tiny cache, preemptions"])
    assert rep.summary["num_preemptions"] > 0


# -- how far ahead a run computes its pass end times (never changes a result) ----------------

def _run_worker():
    cfg = SchedulerConfig(max_batched_tokens=512, block_size=16, num_gpu_blocks=100, enable_prefix_caching=False)
    return EngineWorker(0, [RankScheduler(cfg, FixedTiming(100, 10))], fast_forward=True)


def _drive(hint_ms, late_ms=None, bounds=True):
    """Two requests at 0 (100-token prompts, 300 and 200 tokens out: one prefill pass of 100 ms,
    then a decode run of 10 ms passes), a third arriving at ``late_ms`` (unknown to the worker
    until then); every start and pass end is told ``hint_ms`` (and ``bounds``). Returns the completions
    (index, end) and the number of pass end times the first run had computed when it started."""
    w = _run_worker()
    for i, out in enumerate((300, 200)):
        w.enqueue(Request(i, None, 0.0, 100, out), 0, 0.0)
    end, _ = w.start_if_idle(0.0, None, hint_ms, bounds)
    first_chunk = None
    done = []
    late = None if late_ms is None else Request(2, None, late_ms, 100, 20)
    while end is not None:
        if late is not None and late.arrival_ms <= end:
            cut = w.enqueue(late, 0, late.arrival_ms)
            late = None
            end = cut if cut is not None else end
            continue
        done.extend(w.finish(end, None, hint_ms, bounds))
        if w.busy:
            end = w.pass_end_ms
            continue
        t = end
        end, _ = w.start_if_idle(t, None, hint_ms, bounds)
        if w._run is not None and first_chunk is None:
            first_chunk = w._run.num_passes
    return [(r.index, r.terminal_ms) for r in done], first_chunk


def test_a_run_computes_its_end_times_up_to_the_hint_else_in_growing_chunks():
    # a hint that bounds the inputs not known yet (the end of a step that cannot stop early)
    # bounds the run like a known input: every pass up to the one in progress then is kept, so
    # they are computed at once (a short first chunk of 8 gives the pass rate, then about as
    # many as reach the hint: here all 299 passes, the run ends before 5 s; 8 cover a hint at
    # 150 ms); a hint only (a step may stop early) or none: a first chunk of 32, chunks growing
    # geometrically (with a hint, no further than about it); the completions never change
    far, chunk_far = _drive(hint_ms=5_000.0)
    none, chunk_none = _drive(hint_ms=None)
    near, chunk_near = _drive(hint_ms=150.0)
    soft, chunk_soft = _drive(hint_ms=5_000.0, bounds=False)
    assert (chunk_far, chunk_near, chunk_soft, chunk_none) == (299, 8, 32, 32)
    assert far == none == near == soft == [(1, 100.0 + 199 * 10.0), (0, 100.0 + 299 * 10.0)]
    # an input the worker did not know of cuts the run wherever its end times were computed to
    # (even one breaking the hint's promise)
    cut_far, _ = _drive(hint_ms=5_000.0, late_ms=455.0)
    cut_none, _ = _drive(hint_ms=None, late_ms=455.0)
    assert cut_far == cut_none and len(cut_far) == 3


# -- a sync for the router left for later (EngineWorker.router_unchanged) ---------------------


class _Blocks:
    """Request i's block hashes: i * 1000, i * 1000 + 1, ... (its prompt's, then its output's)."""

    def block_hashes(self, index: int, block_size: int):
        return hash_view([index * 1000 + j for j in range(64)])


def test_a_sync_for_the_router_waits_until_a_watched_block_would_be_evicted():
    # 12 blocks of 4 tokens. A (prompt blocks 1000, 1001, one token out) and B (one prompt block
    # 2000, 40 out) prefill together in a 100 ms pass; A completes, its blocks cached inactive
    # (1001 evicted first), 9 blocks free. B's decode run (10 ms passes, the n-th ending at 110 +
    # 10 n) takes a block at passes 0, 4, ..., 36: the tenth, taken as pass 36 starts (460 ms),
    # evicts 1001. The router hears a pass's evictions once it ended: at 470 ms.
    cfg = SchedulerConfig(max_batched_tokens=512, block_size=4, num_gpu_blocks=12)
    w = EngineWorker(0, [RankScheduler(cfg, FixedTiming(100, 10), record_kv_events=True)])
    for i, (prompt, out) in enumerate([(8, 1), (4, 40)], start=1):
        w.enqueue(Request(i, _Blocks(), 0.0, prompt, out), 0, 0.0)
    w.start_if_idle(0.0)
    assert [r.index for r in w.finish(100.0)] == [1]
    w.start_if_idle(100.0, None, 1_000.0, True)  # (every pass end computed: the hint bounds the inputs)
    w.take_kv_events()
    follow_up = {1000, 1001}  # a prompt continuing A's
    # (a bound: 36 passes take at most 9 blocks, one per 4 passes, and 9 are free)
    assert w.router_unchanged(465.0, follow_up)
    assert not w.router_unchanged(475.0, follow_up)  # pass 36 ended: 1001 evicted
    assert w.router_unchanged(475.0, {1000, 3000})  # (1000 is still there)
    # synced at 465 ms: the blocks B filled by then (40 tokens); pass 36's eviction is held
    # until the pass ends
    w.sync(465.0, blocks_only=True)
    assert [(kind, list(h)) for _, kind, h in w.take_kv_events()] == [(STORED, list(range(2001, 2010)))]
    assert w.router_unchanged(468.0, follow_up)
    assert not w.router_unchanged(475.0, follow_up)
    w.sync(475.0, blocks_only=True)
    assert [(kind, list(h)) for _, kind, h in w.take_kv_events()] == [(REMOVED, [1001])]


# -- a transferred request joining a decode run (EngineWorker._join) --------------------------


def _transferred(index: int, prompt: int, out: int, at_ms: float) -> Request:
    """A request as a decode worker receives it: its prompt's KV transferred, its last token to go."""
    req = Request(index, None, at_ms, prompt, out)
    req.materialized = True
    req.prefill_done = True
    return req


def _drive_transfers(fast: bool, inputs: list, known: bool) -> list:
    """Two requests decoding from 0 on one worker (fixed timing: a 100 ms prefill pass, then 10 ms
    decode passes), then ``inputs`` (time, request), host fashion: at each instant the pass ends
    first, then the inputs, then a start. ``known``: each input is known ahead (the horizon);
    otherwise it is delivered only at its time, after the pass ends of that instant, which may
    send more (the hint: the instant itself). Returns (index, first token, completion) per request."""
    cfg = SchedulerConfig(max_batched_tokens=512, block_size=16, num_gpu_blocks=400, enable_prefix_caching=False)
    w = EngineWorker(0, [RankScheduler(cfg, FixedTiming(100, 10))], fast_forward=fast)
    reqs = [Request(0, None, 0.0, 100, 300), Request(1, None, 0.0, 100, 200)] + [r for _, r in inputs]
    for r in reqs[:2]:
        w.enqueue(r, 0, 0.0)
    pending = sorted(inputs, key=lambda x: x[0])
    end, _ = w.start_if_idle(0.0)
    while end is not None or pending:
        t = end if end is not None and (not pending or end <= pending[0][0]) else pending[0][0]
        if end is not None and end <= t:
            w.finish(t, pending[0][0] if pending and known else None, None if not pending else t)
            end = w.pass_end_ms if w.busy else None
        while pending and pending[0][0] <= t:
            cut = w.enqueue(pending.pop(0)[1], 0, t)
            if cut is not None:
                end = cut
            if end is not None and end <= t:  # a run cut short at t ends now
                w.finish(t, pending[0][0] if pending and known else None, None if not pending else t)
                end = w.pass_end_ms if w.busy else None
        if end is None:
            end, _ = w.start_if_idle(t, pending[0][0] if pending and known else None)
    return [(r.index, r.first_token_ms, r.terminal_ms) for r in reqs]


@pytest.mark.parametrize("known", [True, False])
def test_a_transferred_request_joins_a_decode_run_as_stepping_admits_it(known):
    # 455: mid-pass (the run is cut at 460); 460: exactly at that pass end, delivered after it
    # ended when not known ahead (a join there would admit it a pass late); 702.5: alone, later
    inputs = [(455.0, _transferred(2, 120, 40, 455.0)), (460.0, _transferred(3, 90, 30, 460.0)),
              (702.5, _transferred(4, 200, 50, 702.5))]
    fast = _drive_transfers(True, inputs, known)
    inputs = [(t, _transferred(r.index, r.prompt_len, r.max_output, t)) for t, r in inputs]
    assert fast == _drive_transfers(False, inputs, known)
    assert fast[3][1] == 470.0  # admitted with the request of 455 in the pass starting at 460
