"""ITL and per-user throughput statistics of the token gaps: pooled in memory, or read a chunk at a
time over a few passes (a production trace) with the same order statistics."""

import math
import random

import pytest

from aisim.actors.engine import gaps
from aisim.actors.engine.gaps import GapSink
from aisim.simulator.metrics import gap_stats
from aisim.simulator.metrics.gap_stats import gap_statistics

ORDER = ("min", "max", "median", "p75", "p90", "p95", "p99")


def _sink(pooled=(), segments=(), individual=()):
    g = GapSink()
    for v, w in pooled:
        g.pooled_values.append(v)
        g.pooled_weights.append(w)
    for ends, w in segments:
        g.add_segment(ends, w)
    g.individual.extend(individual)
    g.check()
    return g


def _chunked(monkeypatch, collect=3):
    monkeypatch.setattr(gap_stats, "IN_MEMORY_ENTRIES", 0)
    monkeypatch.setattr(gap_stats, "COLLECT_ENTRIES", collect)


@pytest.mark.parametrize("chunked", [False, True])
def test_hand_computed_statistics(monkeypatch, chunked):
    # gaps 10 ms (3 tokens) and 20 ms (1 token): mean 12.5; p75 at rank 2.25 -> 10 + 0.25 x 10;
    # std sqrt((3 x 2.5^2 + 7.5^2) / 4); per user 100/s (3) and 50/s (1)
    if chunked:
        _chunked(monkeypatch, collect=1)
    itl, per_user, n = gap_statistics([_sink(pooled=[(10.0, 3)]), _sink(individual=[20.0])])
    assert n == 4
    assert (itl["min"], itl["median"], itl["p75"], itl["max"], itl["mean"]) == (10.0, 10.0, 12.5, 20.0, 12.5)
    assert itl["std"] == pytest.approx(math.sqrt(18.75), rel=1e-15)
    assert (per_user["min"], per_user["median"], per_user["max"], per_user["mean"]) == (50.0, 100.0, 100.0, 87.5)
    assert per_user["p75"] == 100.0


@pytest.mark.parametrize("seed,collect", [(1, 3), (2, 1 << 30), (3, 50)])
def test_chunked_passes_give_the_order_statistics_of_the_pooled_multiset(monkeypatch, seed, collect):
    """Random gaps (zeros, ties, many copies of one value: a bucket refined down to one value,
    values across many octaves), written out by the sinks and read back in chunks: the same
    minimum, maximum and percentiles bit for bit; mean and std to the last few bits."""
    rng = random.Random(seed)
    sinks = []
    for _ in range(4):
        pooled = [(rng.choice([0.0, 12.5, rng.uniform(0.01, 5e3)]), rng.randint(0, 40)) for _ in range(300)]
        segments = []
        for _ in range(20):
            t = rng.uniform(0, 1e6)
            ends = [t]
            for _ in range(rng.randint(1, 60)):
                t += rng.choice([10.0, rng.uniform(1, 80)])
                ends.append(t)
            segments.append((ends, rng.randint(1, 200)))
        individual = [rng.expovariate(0.05) for _ in range(200)] + [7.0] * 500
        sinks.append((pooled, segments, individual))
    memory = gap_statistics([_sink(*s) for s in sinks])
    monkeypatch.setattr(gaps, "SPILL_ENTRIES", 97)
    monkeypatch.setattr(gaps, "READ_ENTRIES", 61)
    written = [_sink(*s) for s in sinks]
    assert all(g.spilled is not None for g in written)
    assert gap_statistics(written) == memory  # (few entries: read back into memory, the same bits)
    _chunked(monkeypatch, collect)
    chunked = gap_statistics(written)
    assert chunked[2] == memory[2]
    for got, want in zip(chunked[:2], memory[:2]):
        assert {k: got[k] for k in ORDER} == {k: want[k] for k in ORDER}
        assert got["mean"] == pytest.approx(want["mean"], rel=1e-13)
        assert got["std"] == pytest.approx(want["std"], rel=1e-11)


def test_no_gaps_either_way(monkeypatch):
    empty = gap_statistics([GapSink()])
    _chunked(monkeypatch)
    assert gap_statistics([GapSink()]) == empty
    assert empty[2] == 0 and empty[0]["median"] is None and empty[1]["mean"] is None


def test_only_zero_gaps_have_no_per_user_throughput(monkeypatch):
    _chunked(monkeypatch)
    itl, per_user, n = gap_statistics([_sink(pooled=[(0.0, 5)])])
    assert (n, itl["max"], itl["mean"], per_user["median"]) == (5, 0.0, 0.0, None)
