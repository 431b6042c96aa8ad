"""Inter-token gaps as workers collect them (GapSink): buffers, what is written out, the wire."""

import random

import numpy as np
import pytest

from aisim.actors.engine import gaps
from aisim.actors.engine.gaps import GapSink
from aisim.simulator.metrics.stats import distinct_sorted


def _plain(sinks_spec):
    """The same gaps listed one by one: (value, weight) pairs, subtractions done in Python."""
    out = []
    for pooled, segments, individual in sinks_spec:
        out.extend(pooled)
        for ends, w in segments:
            out.extend((b - a, w) for a, b in zip(ends, ends[1:]))
        out.extend((v, 1) for v in individual)
    return out


def _sinks(spec):
    sinks = []
    for pooled, segments, individual in spec:
        g = GapSink()
        for v, w in pooled:
            g.pooled_values.append(v)
            g.pooled_weights.append(w)
            g.check()
        for ends, w in segments:
            g.add_segment(ends, w)
        g.individual.extend(individual)
        g.check()
        sinks.append(g)
    return sinks


def _random_spec(seed: int, sinks: int = 3):
    rng = random.Random(seed)
    spec = []
    for _ in range(sinks):
        pooled = [(rng.uniform(1, 50), rng.randint(0, 9)) for _ in range(rng.randint(0, 5))]
        segments = []
        for _ in range(rng.randint(0, 6)):
            t = rng.uniform(0, 1e6)
            ends = [t]
            for _ in range(rng.randint(1, 40)):
                t += rng.uniform(5, 40)  # accumulated like pass ends, so the differences round
                ends.append(t)
            segments.append((ends, rng.randint(1, 64)))
        individual = [rng.uniform(1, 500) for _ in range(rng.randint(0, 5))]
        spec.append((pooled, segments, individual))
    spec.append(([], [], []))  # an idle worker
    return spec


def _all(sinks):
    parts = [c for g in sinks for c in g.chunks()]
    if not parts:
        return distinct_sorted(np.zeros(0), np.zeros(0, dtype=np.int64))
    return distinct_sorted(np.concatenate([v for v, _ in parts]), np.concatenate([w for _, w in parts]))


def test_segments_give_the_differences_of_neighbouring_ends_only():
    # two segments: the difference across them (30.5 - 12.0) is no gap
    g = GapSink()
    g.add_segment([10.0, 11.0, 12.0], 3)
    g.add_segment([30.5, 31.0], 2)
    values, weights = distinct_sorted(*g.buffered())
    assert values.tolist() == [0.5, 1.0]
    assert weights.tolist() == [2, 6]


@pytest.mark.parametrize("spill", [None, 7])
def test_the_gaps_read_back_equal_the_gaps_one_by_one_bit_for_bit(monkeypatch, spill):
    """Buffered, or written out every 7 entries and read back 5 pairs at a time: the same multiset
    (weight-0 pooled entries left out)."""
    if spill is not None:
        monkeypatch.setattr(gaps, "SPILL_ENTRIES", spill)
        monkeypatch.setattr(gaps, "READ_ENTRIES", 5)
    spec = _random_spec(7)
    sinks = _sinks(spec)
    assert any(g.spilled is not None for g in sinks) is (spill is not None)
    if spill is not None:
        assert all(len(v) <= 5 for g in sinks for v, _ in g.chunks())
    got = _all(sinks)
    plain = [(v, w) for v, w in _plain(spec) if w > 0]
    want = distinct_sorted(np.array([v for v, _ in plain]), np.array([w for _, w in plain], dtype=np.int64))
    assert got[0].tobytes() == want[0].tobytes()
    assert got[1].tolist() == want[1].tolist()
    assert sum(g.num_entries() for g in sinks) >= len(plain)


def test_a_sink_writes_out_past_its_limit_and_keeps_collecting(monkeypatch):
    monkeypatch.setattr(gaps, "SPILL_ENTRIES", 4)
    g = GapSink()
    g.add_segment([0.0, 1.0, 3.0], 2)  # 3 ends: kept
    assert g.spilled is None
    g.add_segment([10.0, 14.0, 15.0], 1)  # 6 ends > 4: written out as 4 pairs (2 x 1.0 ... )
    assert g.spilled is not None and g.num_spilled == 4 and len(g.run_ends) == 0
    g.individual.append(9.0)
    assert g.num_entries() == 5
    assert [(v.tolist(), w.tolist()) for v, w in g.chunks()] == [([1.0, 2.0, 4.0, 1.0], [2, 2, 1, 1]), ([9.0], [1])]


@pytest.mark.parametrize("spill", [None, 7])
def test_wire_form_round_trips(monkeypatch, spill):
    if spill is not None:
        monkeypatch.setattr(gaps, "SPILL_ENTRIES", spill)
    g = _sinks(_random_spec(3, sinks=1))[0]
    back = GapSink.from_wire(g.to_wire())
    for name in GapSink._BUFFERS:
        assert getattr(back, name) == getattr(g, name)
    assert back.num_spilled == g.num_spilled
    assert [(v.tobytes(), w.tobytes()) for v, w in back.chunks()] == [(v.tobytes(), w.tobytes()) for v, w in g.chunks()]


def test_no_gaps():
    values, weights = GapSink().buffered()
    assert len(values) == 0 and len(weights) == 0
    assert list(GapSink().chunks()) == []
