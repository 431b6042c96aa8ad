"""Scratch-file columns: a large trace's pieces and a long request log, read back a slice at a time."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from aisim import run_trace_replay
from aisim.simulator import spill
from aisim.simulator.spill import ColumnFile, SpilledArray
from aisim.simulator.traffic import traces
from aisim.simulator.traffic.traces import read_mooncake
from aisim.simulator.traffic.workload import BlockHashStore
from tests.conftest import SLICE
from tests.helpers import without_wall


def spilled(values, dtype, parts=3) -> SpilledArray:
    f = ColumnFile(dtype)
    for part in np.array_split(np.asarray(values), parts):
        f.append(part)
    return f.freeze()


def test_spilled_array_reads_what_was_written(monkeypatch):
    monkeypatch.setattr(spill, "READ_ELEMENTS", 7)  # (ranges and whole reads cross several reads)
    values = np.arange(100, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    col = spilled(values, np.uint64)
    assert len(col) == 100 and col.shape == (100,) and col.dtype == np.uint64 and col.nbytes == 800
    assert np.array_equal(col[10:31], values[10:31]) and not col[10:31].flags.writeable
    assert np.array_equal(col[:], values) and np.array_equal(np.asarray(col), values)
    assert col[99] == values[99] and col[-1] == values[99] and col[5:5].size == 0
    idx = np.array([93, 4, 4, 50, 0, 99, 17, 18, 61])  # any order, repeats, spread over many ranges
    assert np.array_equal(col[idx], values[idx])
    assert np.array_equal(np.concatenate(list(col.chunks(9))), values)
    back = pickle.loads(pickle.dumps(col))
    assert isinstance(back, np.ndarray) and np.array_equal(back, values)
    with pytest.raises(IndexError):
        col[100]
    with pytest.raises(IndexError):
        col[np.array([3, 100])]


@pytest.fixture
def both():
    """The slice read in memory, and read again with its pieces spilled past 3,000 pieces."""
    whole = read_mooncake([SLICE])
    mp = pytest.MonkeyPatch()
    mp.setattr(spill, "SPILL_PIECES", 3000)
    mp.setattr(traces, "CHUNK_ROWS", 100)  # (spilled chunk by chunk while reading)
    try:
        part = read_mooncake([SLICE])
    finally:
        mp.undo()
    return whole, part


def test_a_spilled_trace_is_the_same_workload(both):
    whole, part = both
    assert isinstance(part.piece_src, SpilledArray) and isinstance(part.piece_len, SpilledArray)
    assert isinstance(whole.piece_src, np.ndarray) and whole.piece_len.dtype == part.piece_len.dtype
    assert part.digest == whole.digest
    assert np.array_equal(np.asarray(part.piece_src), whole.piece_src)
    assert np.array_equal(np.asarray(part.piece_len), whole.piece_len)
    rows = [0, 3, 100, 517, 999]
    assert part.subset(rows, shift_ms=5.0).digest == whole.subset(rows, shift_ms=5.0).digest
    shipped = pickle.loads(pickle.dumps(part))  # (to another process: in memory, the same values)
    assert isinstance(shipped.piece_src, np.ndarray) and shipped.digest == whole.digest


def test_a_spilled_trace_gives_the_same_hashes_and_tokens(both):
    whole, part = both
    a, b = BlockHashStore(whole), BlockHashStore(part)
    for i in range(0, 1000, 37):
        for bs in (16, 64):
            assert bytes(a.block_hashes(i, bs)) == bytes(b.block_hashes(i, bs))
        ta, tb = a.token_pieces(i), b.token_pieces(i)
        assert (ta.src, ta.ends) == (tb.src, tb.ends)


def test_a_spilled_trace_replays_byte_identically(monkeypatch):
    def run():
        return run_trace_replay(str(SLICE), extra_engine_args={"num_gpu_blocks": 4000}, num_workers=2,
                                max_sim_time_ms=120_000).to_dict()

    whole = run()
    monkeypatch.setattr(spill, "SPILL_PIECES", 2000)
    assert without_wall(run()) == without_wall(whole)


@pytest.mark.parametrize("sla", [{"sla_ttft_ms": 2000.0, "sla_itl_ms": 30.0}, {"sla_e2e_ms": 60_000.0}, {}])
def test_a_request_log_written_out_gives_the_same_report(monkeypatch, sla):
    from aisim.simulator.metrics import collector

    def run():
        return run_trace_replay(str(SLICE), extra_engine_args={"num_gpu_blocks": 4000}, num_workers=2,
                                max_sim_time_ms=120_000, **sla).to_dict()

    whole = run()
    assert whole["summary"]["completed_requests"] > 100 and whole["summary"]["incomplete_requests"] > 0
    monkeypatch.setattr(collector, "SPILL_ROWS", 64)
    assert without_wall(run()) == without_wall(whole)
