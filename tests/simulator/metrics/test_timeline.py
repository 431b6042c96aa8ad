"""WorkerTimeline: intervals, the duration-weighted quantile, worst worker, CSV."""

from __future__ import annotations

import csv
from array import array

import msgpack
import numpy as np
import pytest

from aisim.simulator.metrics.timeline import (
    CSV_COLUMNS,
    Interval,
    WorkerTimeline,
    weighted_quantile,
    worst_worker_quantile,
    write_csv,
)


def timeline(wid, samples, end_ms, total=10, role="aggregated", start_ms=0.0):
    t, w, r, k = zip(*samples) if samples else ((), (), (), ())
    return WorkerTimeline(wid, role, list(t), list(w), list(r), list(k), total, end_ms, start_ms)


# waiting 0 for 3 s then 4 for 1 s
SIMPLE = [(0.0, 0, 1, 2), (3000.0, 4, 2, 5)]


def test_intervals_up_to_end():
    tl = timeline(0, SIMPLE, 4000.0)
    assert tl.intervals() == [Interval(0.0, 3.0, 0, 1, 0.2), Interval(3000.0, 1.0, 4, 2, 0.5)]


def test_idle_before_first_sample_and_window_clipping():
    tl = timeline(0, [(1000.0, 2, 0, 0), (2000.0, 0, 1, 3)], 5000.0)
    assert tl.intervals() == [Interval(0.0, 1.0, 0, 0, 0.0), Interval(1000.0, 1.0, 2, 0, 0.0),
                              Interval(2000.0, 3.0, 0, 1, 0.3)]
    # a window starting between samples takes the state of the last sample before it;
    # samples at or after the end never hold
    assert tl.window(1500.0, 2000.0).intervals() == [Interval(1500.0, 0.5, 2, 0, 0.0)]
    assert tl.window(2000.0, 2000.0).intervals() == []


def test_weighted_quantile_linear_on_cumulative_weight():
    tl = timeline(0, SIMPLE, 4000.0)
    assert tl.weighted_quantile("waiting", 0.0) == 0.0
    assert tl.weighted_quantile("waiting", 0.5) == 0.0
    assert tl.weighted_quantile("waiting", 0.75) == 0.0
    assert tl.weighted_quantile("waiting", 0.875) == 2.0  # halfway from p=0.75 to p=1
    assert tl.weighted_quantile("waiting", 0.95) == pytest.approx(3.2)
    assert tl.weighted_quantile("waiting", 1.0) == 4.0
    assert tl.weighted_quantile("kv_usage", 0.875) == pytest.approx(0.35)
    assert tl.weighted_quantile("kv_blocks_used", 0.5) == 2.0
    assert tl.time_weighted_mean("waiting") == 1.0


def test_weighted_quantile_is_numpy_type_4_for_distinct_values_of_equal_weight():
    values = np.random.default_rng(0).permutation(np.arange(30) * 1.5)
    for q in (0.0, 0.01, 0.1, 0.33, 0.5, 0.9, 0.95, 0.99, 1.0):
        assert weighted_quantile(values, np.full(30, 2.0), q) == pytest.approx(
            np.quantile(values, q, method="interpolated_inverted_cdf"))


def test_only_the_time_at_each_value_matters():
    a = weighted_quantile([0, 4], [3, 1], 0.9)
    b = weighted_quantile([4, 0, 4, 0], [0.5, 1, 0.5, 2], 0.9)
    assert a == b == pytest.approx(2.4)
    # three values: F = (0.5, 0.75, 1) at (1, 2, 6)
    assert weighted_quantile([2, 6, 1, 1], [1, 1, 1, 1], 0.875) == pytest.approx(4.0)
    assert weighted_quantile([2, 6, 1, 1], [1, 1, 1, 1], 0.625) == pytest.approx(1.5)
    assert weighted_quantile([2, 6, 1, 1], [1, 1, 1, 1], 0.5) == 1.0


def test_zero_duration_and_bad_inputs():
    assert timeline(0, SIMPLE, 0.0).weighted_quantile("waiting", 0.5) is None
    assert timeline(0, [], 0.0).intervals() == []
    assert weighted_quantile([1.0], [0.0], 0.5) is None
    assert timeline(0, [], 100.0).weighted_quantile("waiting", 0.99) == 0.0  # idle throughout
    with pytest.raises(ValueError):
        timeline(0, SIMPLE, 4000.0).weighted_quantile("nope", 0.5)
    with pytest.raises(ValueError):
        weighted_quantile([1.0], [1.0], 1.5)
    with pytest.raises(ValueError):
        timeline(0, [(2.0, 1, 0, 0), (1.0, 0, 0, 0)], 4.0)


def test_worst_worker_is_the_max():
    a = timeline(0, SIMPLE, 4000.0)  # q=0.95 -> 3.2
    b = timeline(1, [(0.0, 1, 0, 0)], 4000.0)  # always 1
    c = timeline(2, SIMPLE, 0.0)  # no duration: skipped
    assert worst_worker_quantile([a, b, c, None], "waiting", 0.95) == pytest.approx(3.2)
    assert worst_worker_quantile([a, b], "waiting", 0.5) == 1.0
    assert worst_worker_quantile([c, None], "waiting", 0.5) is None
    assert worst_worker_quantile([], "waiting", 0.5) is None


def test_plain_round_trip_bytes_lists_arrays():
    tl = timeline(3, SIMPLE, 4000.0, role="decode", start_ms=10.0)
    plain = msgpack.unpackb(msgpack.packb(tl.to_plain(), use_bin_type=True), raw=False)
    back = WorkerTimeline.from_plain(plain)
    assert (back.worker_id, back.role, back.kv_blocks_total) == (3, "decode", 10)
    assert (back.start_ms, back.end_ms) == (10.0, 4000.0)
    assert back.intervals() == tl.intervals()
    as_lists = {**plain, "times_ms": [0.0, 3000.0], "waiting": [0, 4], "running": [1, 2], "kv_blocks_used": [2, 5]}
    assert WorkerTimeline.from_plain(as_lists).intervals() == tl.intervals()
    as_arrays = {**plain, "times_ms": array("d", [0.0, 3000.0]), "waiting": array("q", [0, 4]),
                 "running": array("q", [1, 2]), "kv_blocks_used": array("q", [2, 5])}
    assert WorkerTimeline.from_plain(as_arrays).intervals() == tl.intervals()
    assert WorkerTimeline.from_plain({**plain, "end_ms": None}, end_ms=3500.0).end_ms == 3500.0
    with pytest.raises(ValueError):
        WorkerTimeline.from_plain({**plain, "end_ms": None})


def test_csv(tmp_path):
    a = timeline(1, SIMPLE, 4000.0)
    b = timeline(0, [(500.0, 1, 1, 1)], 1000.0, role=None)
    path = tmp_path / "timeline.csv"
    write_csv(path, [a, None, b])
    rows = list(csv.reader(path.open()))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert rows[0] == ["worker_id", "role", "start_s", "duration_s", "queue_depth_waiting", "queue_depth_running",
                       "kv_blocks_used", "kv_usage"]
    assert rows[1:] == [
        ["0", "", "0.0", "0.5", "0", "0", "0", "0.0"],
        ["0", "", "0.5", "0.5", "1", "1", "1", "0.1"],
        ["1", "aggregated", "0.0", "3.0", "0", "1", "2", "0.2"],
        ["1", "aggregated", "3.0", "1.0", "4", "2", "5", "0.5"],
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["timeline.csv"]  # no temporary file left
    assert a.to_rows() == [(1, "aggregated", 0.0, 3.0, 0, 1, 2, 0.2), (1, "aggregated", 3.0, 1.0, 4, 2, 5, 0.5)]


def spooled(wid, samples, end_ms, limit, total=10, start_ms=0.0):
    """The timeline as a worker with a spool of ``limit`` samples exports it: the samples past
    the limit handed over as they come (all but the last two), the rest at the end."""
    from aisim.simulator.metrics.timeline import TimelineSpool

    spool = TimelineSpool(limit)
    held = (array("d"), array("q"), array("q"), array("q"))
    for s in samples:
        for col, x in zip(held, s):
            col.append(x)
        if len(held[0]) >= spool.limit:
            cut = len(held[0]) - 2
            spool.append(*(col[:cut] for col in held))
            for col in held:
                del col[:cut]
    cols = spool.columns(*held)
    assert spool.spilled == (len(samples) >= spool.limit)
    return WorkerTimeline(wid, "aggregated", *cols, total, end_ms, start_ms)


@pytest.mark.parametrize("window", [None, (1234.5, 8000.0), (0.0, 50.0), (9000.0, 9999.0)])
def test_a_spooled_timeline_gives_the_same_rows_read_a_chunk_at_a_time(window, monkeypatch):
    import aisim.simulator.metrics.timeline as tlmod

    rng = np.random.default_rng(5)
    times = np.cumsum(rng.integers(0, 40, 300)).astype(float)  # (zero steps: intervals of no duration)
    samples = [(float(t), int(w), int(r), int(k)) for t, w, r, k in
               zip(times, rng.integers(0, 9, 300), rng.integers(0, 5, 300), rng.integers(0, 10, 300))]
    end = float(times[-1]) + 10.0
    whole = timeline(3, samples, end)
    spilled = spooled(3, samples, end, limit=16)
    assert spilled.spilled and not whole.spilled
    if window is not None:
        whole, spilled = whole.window(*window), spilled.window(*window)
    monkeypatch.setattr(tlmod, "READ_ELEMENTS", 7)  # rows a few samples at a time
    assert spilled.to_rows() == whole.to_rows()
    for metric in ("waiting", "kv_usage"):
        assert spilled.weighted_quantile(metric, 0.95) == whole.weighted_quantile(metric, 0.95)
    assert spilled.to_plain() == whole.to_plain()


def test_a_short_timeline_is_not_spooled_and_stays_in_memory():
    tl = spooled(0, SIMPLE, 4000.0, limit=3)
    assert not tl.spilled and tl.intervals() == timeline(0, SIMPLE, 4000.0).intervals()


@pytest.mark.parametrize("wire", [False, True])
def test_a_replay_whose_timelines_spill_writes_the_same_worker_timeline_csv(wire, tmp_path, monkeypatch):
    """The quickstart with timelines spooled past 8 samples a worker (in process, and through the
    msgpack wire form a Ray host uses): the same worker_timeline.csv, the same summary."""
    import dataclasses

    import aisim.simulator.metrics.timeline as tlmod
    from aisim import plan_from_config, run_plan
    from aisim.cli import QUICKSTART
    from aisim.simulator.config.loading import load_config

    cfg, config_dir = load_config(None, [], default_path=QUICKSTART)
    plan = plan_from_config(cfg, config_dir, capture_worker_timeline=True)
    if wire:
        plan = dataclasses.replace(plan, execution=dataclasses.replace(plan.execution, wire=True))
    held = run_plan(plan)
    monkeypatch.setattr(tlmod, "SPILL_SAMPLES", 8)
    monkeypatch.setattr(tlmod, "READ_ELEMENTS", 50)
    spilled = run_plan(plan)
    assert any(tl.spilled for tl in spilled.timelines) != wire  # (the wire carries them whole)
    assert max(len(tl.times_ms) for tl in held.timelines) > 50  # (several chunks a worker)
    write_csv(tmp_path / "held.csv", held.timelines)
    write_csv(tmp_path / "spilled.csv", spilled.timelines)
    assert (tmp_path / "held.csv").read_bytes() == (tmp_path / "spilled.csv").read_bytes()
    strip = ("wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s")
    assert {k: v for k, v in spilled.summary.items() if k not in strip} == \
        {k: v for k, v in held.summary.items() if k not in strip}
