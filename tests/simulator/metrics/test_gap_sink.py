"""Inter-token gaps as workers collect them (GapSink) and as the summary reads them."""

import random

import numpy as np

from aisim.actors.engine.scheduler import GapSink
from aisim.simulator.metrics.stats import distinct_sorted
from aisim.simulator.metrics.summary import _pooled_gaps


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
        for ends, w in segments:
            g.add_segment(ends, w)
        g.individual.extend(individual)
        sinks.append(g)
    return sinks


def test_segments_give_the_differences_of_neighbouring_ends_only():
    # two segments: the difference across them (30.5 - 12.0) is no gap
    g = GapSink()
    g.add_segment([10.0, 11.0, 12.0], 3)
    g.add_segment([30.5, 31.0], 2)
    values, weights = distinct_sorted(*_pooled_gaps([g]))
    assert values.tolist() == [0.5, 1.0]
    assert weights.tolist() == [2, 6]


def test_pooled_gaps_equal_the_gaps_one_by_one_bit_for_bit():
    rng = random.Random(7)
    spec = []
    for _ in range(3):
        pooled = [(rng.uniform(1, 50), rng.randint(1, 9)) for _ in range(rng.randint(0, 5))]
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
    got = distinct_sorted(*_pooled_gaps(_sinks(spec)))
    plain = _plain(spec)
    want = distinct_sorted(np.array([v for v, _ in plain]), np.array([w for _, w in plain], dtype=np.int64))
    assert got[0].tobytes() == want[0].tobytes()
    assert got[1].tolist() == want[1].tolist()


def test_wire_form_round_trips():
    g = _sinks([([(2.5, 4)], [([1.0, 2.0, 4.0], 5)], [7.25])])[0]
    back = GapSink.from_wire(g.to_wire())
    for name in GapSink.__slots__:
        assert getattr(back, name) == getattr(g, name)


def test_no_gaps():
    values, weights = _pooled_gaps([GapSink()])
    assert len(values) == 0 and len(weights) == 0
