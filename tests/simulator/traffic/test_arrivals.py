"""Arrival processes are values: ``start()`` gives each run its own state, the process never changes."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from aisim.simulator.config import models as m
from aisim.simulator.traffic.arrivals import ArrivalProcess, ClosedLoop
from aisim.simulator.traffic.build import session_workload, synthetic_workload


def sessions(n: int, turns: int = 3, delay_ms: float = 5.0):
    src = m.SyntheticSessionSource.model_validate({
        "type": "synthetic-session", "new_input_tokens_per_turn": 10, "output_tokens_per_turn": 2,
        "session": {"turns": turns}, "inter_turn_delay_ms": delay_ms})
    return session_workload(src, n)


def drive(run, order: list[int] | None = None) -> list:
    """Play a run to the end, finishing requests in arrival order (or in ``order`` of a
    request's position among those pending) at 10 ms steps; record everything it returns."""
    times, idx = run.initial()
    seen = [("initial", times.tolist(), idx.tolist())]
    pending = list(idx.tolist())
    now = 0.0
    step = 0
    while pending:
        pick = order[step % len(order)] % len(pending) if order else 0
        i = pending.pop(pick)
        now += 10.0
        step += 1
        follow = run.on_terminal(i, now)
        seen.append((i, now, follow))
        pending.extend(j for _, j in follow)
    return seen


def snapshot(p) -> bytes:
    return pickle.dumps(p)


def test_two_closed_loop_runs_give_the_same_independent_sequences():
    loop = ClosedLoop(synthetic_workload(20, 8, 2), concurrency=3)
    before = snapshot(loop)
    a, b = loop.start(), loop.start()
    assert a is not b
    # interleave the two runs: one advancing must not move the other
    ta, ia = a.initial()
    tb, ib = b.initial()
    assert ia.tolist() == ib.tolist() == [0, 1, 2] and ta.tolist() == tb.tolist() == [0.0, 0.0, 0.0]
    assert a.on_terminal(0, 10.0) == [(10.0, 3)]
    assert a.on_terminal(1, 11.0) == [(11.0, 4)]
    assert b.on_terminal(2, 12.0) == [(12.0, 3)]  # b starts its queue from the beginning
    assert a.follows_terminal and b.follows_terminal
    # two full runs from fresh starts agree, and a third after them still does
    full = [drive(loop.start()) for _ in range(3)]
    assert full[0] == full[1] == full[2]
    assert sorted(i for i, *_ in full[0][1:]) == list(range(20))  # every request arrives once
    assert snapshot(loop) == before


def test_closed_loop_sessions_keep_their_slot_and_restart_identically():
    loop = ClosedLoop(sessions(4, turns=3, delay_ms=5.0), concurrency=2)
    run = loop.start()
    times, idx = run.initial()
    assert idx.tolist() == [0, 3]  # first turns of sessions 0 and 1
    assert run.on_terminal(0, 10.0) == [(15.0, 1)]  # next turn after the inter-turn delay
    assert run.on_terminal(1, 30.0) == [(35.0, 2)]
    assert run.on_terminal(2, 50.0) == [(50.0, 6)]  # session done: its slot takes session 2
    assert run.on_terminal(3, 60.0) == [(65.0, 4)]
    fresh = loop.start()
    assert fresh.initial()[1].tolist() == [0, 3]
    assert fresh.on_terminal(2, 50.0) == [(50.0, 6)]  # the same first hand-out, whatever the other run did
    orders = [1, 0, 2]
    assert drive(loop.start(), orders) == drive(loop.start(), orders)


@pytest.mark.parametrize("delay_scale", [1.0, 2.0])
def test_open_loop_runs_are_identical_and_follow_session_turns(delay_scale):
    w = sessions(3, turns=2, delay_ms=8.0)
    first = np.zeros(w.num_requests)
    first[[0, 2, 4]] = [30.0, 0.0, 30.0]
    p = ArrivalProcess(w, first, delay_scale=delay_scale)
    before = snapshot(p)
    run = p.start()
    times, idx = run.initial()
    assert times.tolist() == [0.0, 30.0, 30.0] and idx.tolist() == [2, 0, 4]  # ties by index
    assert run.on_terminal(2, 100.0) == [(100.0 + 8.0 / delay_scale, 3)]
    assert run.on_terminal(3, 200.0) == []
    assert run.follows_terminal
    assert drive(p.start()) == drive(p.start())
    assert snapshot(p) == before


def test_open_loop_without_sessions_never_follows():
    p = ArrivalProcess(synthetic_workload(4, 8, 2), np.array([3.0, 1.0, 2.0, 1.0]))
    run = p.start()
    assert not p.follows_terminal and not run.follows_terminal
    times, idx = run.initial()
    assert times.tolist() == [1.0, 1.0, 2.0, 3.0] and idx.tolist() == [1, 3, 2, 0]
    assert run.on_terminal(1, 5.0) == []


def test_processes_are_immutable_and_their_arrays_read_only():
    w = synthetic_workload(5, 8, 2)
    times = np.arange(5, dtype=np.float64)
    p = ArrivalProcess(w, times)
    loop = ClosedLoop(w, 2)
    for proc in (p, loop):
        assert not hasattr(proc, "initial") and not hasattr(proc, "on_terminal")  # a run's, not the plan's
        with pytest.raises(AttributeError):
            proc.concurrency = 7
        with pytest.raises(ValueError):
            proc.start().initial()[1][0] = 4
    times[0] = 99.0  # the caller's array is copied, not aliased
    assert p.start().initial()[0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    with pytest.raises(ValueError):
        w.input_len[0] = 1
    with pytest.raises(AttributeError):
        w.description = "changed"


def test_processes_pickle_and_stay_values():
    loop = ClosedLoop(sessions(5), concurrency=2)
    copy = pickle.loads(pickle.dumps(loop))
    assert drive(copy.start(), [1, 0]) == drive(loop.start(), [1, 0])
    with pytest.raises(AttributeError):
        copy.concurrency = 3
    with pytest.raises(ValueError):
        copy.w.input_len[0] = 1  # unpickled columns are read-only too
