"""WorkerHost: what a step tells its workers about the next input (it changes no result)."""

from __future__ import annotations

import pytest

from aisim.actors.engine.host import HostPool, WorkerHost
from aisim.actors.engine.request import Request
from aisim.actors.engine.scheduler import RankScheduler, SchedulerConfig
from aisim.actors.engine.timing import FixedTiming
from aisim.actors.engine.worker import EngineWorker
from aisim.actors.protocol import HostInput, Op, Phase

# budget 512, 16-token blocks, 400 blocks, no prefix caching (no hashes needed)
CFG = SchedulerConfig(max_batched_tokens=512, block_size=16, num_gpu_blocks=400, enable_prefix_caching=False)


def _host() -> WorkerHost:
    def spawn(wid):
        return EngineWorker(wid, [RankScheduler(CFG, FixedTiming(100, 10))])

    pools = {"aggregated": HostPool(spawn, False, False)}
    return WorkerHost(pools, None, [(0, "aggregated")], direct=True)


def _arrivals() -> list:
    # two 100-token prompts at 0, 300 and 200 tokens out: a 100 ms prefill pass, then a decode
    # run of 10 ms passes (299 planned)
    return [HostInput(0.0, Phase.ARRIVAL, i, Op.ENQUEUE, 0, Request(i, None, 0.0, 100, out), 0, False)
            for i, out in enumerate((300, 200))]


@pytest.mark.parametrize("stop_at_handoff", [False, True])
def test_a_step_bounds_run_end_times_by_its_end_unless_it_may_stop_early(stop_at_handoff):
    # No input comes before a step's end unless the step may stop early at a handoff (the
    # coordinator then places that request at once). So a run starting at 100 ms computes its
    # pass end times up to the pass in progress at the step's end, 1000 ms, at once: a first
    # chunk of 8 gives the pass rate, then about as many as reach it (8 + 90 passes: to
    # 1080 ms); in a step that may stop early the end is a hint only, the chunks grow
    # geometrically (32, 32) until capped at about it (34 more). Either way the step runs to its
    # end with the same results.
    host = _host()
    worker = host.workers[0]
    chunks = []
    extend = worker._extend

    def recording(run, *args):
        before = run.num_passes
        extend(run, *args)
        chunks.append(run.num_passes - before)

    worker._extend = recording
    out = host.step([], _arrivals(), 0.0, 1000.0, stop_at_handoff)
    assert chunks == ([32, 32, 34] if stop_at_handoff else [98])
    assert worker._run.ends[-1] == 100.0 + 98 * 10.0
    assert out.events == _host().step([], _arrivals(), 0.0, 1000.0).events
