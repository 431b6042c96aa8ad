"""Fast-forwarded decode runs are indistinguishable from stepping pass by pass."""

from __future__ import annotations

import itertools
import json

import pytest

from actors.engine.request import Request
from actors.engine.scheduler import RankScheduler, SchedulerConfig
from actors.engine.timing import FixedTiming
from actors.engine.worker import EngineWorker
from simulator.metrics.output import canonical_json
from simulator.replay import run_trace_replay
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


def _drive(hint_ms, late_ms=None):
    """Two requests at 0 (100-token prompts, 300 and 200 tokens out: one prefill pass of 100 ms,
    then a decode run of 10 ms passes), a third arriving at ``late_ms`` (unknown to the worker
    until then); every start and pass end is told ``hint_ms``. Returns the completions
    (index, end) and the number of pass end times the first run had computed when it started."""
    w = _run_worker()
    for i, out in enumerate((300, 200)):
        w.enqueue(Request(i, None, 0.0, 100, out), 0, 0.0)
    end, _ = w.start_if_idle(0.0, None, hint_ms)
    first_chunk = None
    done = []
    late = None if late_ms is None else Request(2, None, late_ms, 100, 20)
    while end is not None:
        if late is not None and late.arrival_ms <= end:
            cut = w.enqueue(late, 0, late.arrival_ms)
            late = None
            end = cut if cut is not None else end
            continue
        done.extend(w.finish(end, None, hint_ms))
        if w.busy:
            end = w.pass_end_ms
            continue
        t = end
        end, _ = w.start_if_idle(t, None, hint_ms)
        if w._run is not None and first_chunk is None:
            first_chunk = w._run.num_passes
    return [(r.index, r.terminal_ms) for r in done], first_chunk


def test_a_run_without_a_known_input_computes_its_end_times_in_growing_chunks():
    # a far hint (the earliest an input may come) is no horizon: a first chunk of 32 passes, as
    # without one, not the 299 up to the hint; the chunks grow geometrically; the completions
    # never change
    far, chunk_far = _drive(hint_ms=5_000.0)
    none, chunk_none = _drive(hint_ms=None)
    near, _ = _drive(hint_ms=150.0)
    assert chunk_far == chunk_none == 32
    assert far == none == near == [(1, 100.0 + 199 * 10.0), (0, 100.0 + 299 * 10.0)]
    # an input the worker did not know of cuts the run wherever its end times were computed to
    cut_far, _ = _drive(hint_ms=5_000.0, late_ms=455.0)
    cut_none, _ = _drive(hint_ms=None, late_ms=455.0)
    assert cut_far == cut_none and len(cut_far) == 3
