"""Fast-forwarded decode runs are indistinguishable from stepping pass by pass."""

from __future__ import annotations

import itertools
import json

import pytest

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


def test_preemption_case_really_preempts(trace):
    rep = run_trace_replay(str(trace), **CASES["tiny cache, preemptions"])
    assert rep.summary["num_preemptions"] > 0
