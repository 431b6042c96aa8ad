"""A worker's inter-token gaps: compact buffers while it runs, moved to a temporary file when
they grow large (docs/metrics.md, "Token gaps at scale").

A replay emits about one gap entry per pass (a pass's tokens share their gap), so a production
trace's gaps outgrow memory (51 million entries for a million requests). Past ``SPILL_ENTRIES``
buffered entries a sink writes them, as (value, weight) pairs, to an anonymous temporary file and
starts again; ``chunks()`` reads everything back a bounded piece at a time. The statistics over
them (``simulator.metrics.gap_stats``) are exact either way.
"""

from __future__ import annotations

import tempfile
from array import array

import numpy as np

#: buffered entries (pooled, run ends and individual gaps) past which a sink writes them out
SPILL_ENTRIES = 1 << 16
#: (value, weight) pairs read back from a sink's file at a time
READ_ENTRIES = 1 << 20


class GapSink:
    """Collects inter-token gaps: pooled (one value shared by many tokens) and individual.

    Compact buffers (8 bytes a value): a replay has about one pooled gap per pass. A decode
    run's passes give their gaps as *segments* of consecutive pass end times: the gaps of a
    segment are the differences of its neighbouring ends (taken when the gaps are read, at C
    speed: the same subtractions), each shared by the segment's weight of tokens. ``spilled``:
    the pairs written out so far (float64 values, then int64 weights, a block at a time)."""

    __slots__ = ("pooled_values", "pooled_weights", "run_ends", "run_starts", "run_weights", "individual",
                 "spilled", "num_spilled")
    _BUFFERS = ("pooled_values", "pooled_weights", "run_ends", "run_starts", "run_weights", "individual")

    def __init__(self) -> None:
        self.pooled_values = array("d")
        self.pooled_weights = array("q")
        self.run_ends = array("d")  # the segments' end times, one segment after another
        self.run_starts = array("q")  # where each segment starts in run_ends
        self.run_weights = array("q")  # tokens sharing each gap of the segment
        self.individual = array("d")
        self.spilled = None  # a temporary file once the buffers were written out
        self.num_spilled = 0  # (value, weight) pairs in it

    def add_segment(self, ends_ms: list, weight: int) -> None:
        """Gaps ``ends_ms[i + 1] - ends_ms[i]`` (two ends at least), each shared by ``weight`` tokens."""
        self.run_starts.append(len(self.run_ends))
        self.run_weights.append(weight)
        self.run_ends.extend(ends_ms)
        if len(self.run_ends) > SPILL_ENTRIES:
            self.check()

    def check(self) -> None:
        """Write the buffers out when they hold more than ``SPILL_ENTRIES`` entries."""
        if len(self.run_ends) + len(self.pooled_values) + len(self.individual) > SPILL_ENTRIES:
            values, weights = self.buffered()
            if self.spilled is None:
                self.spilled = tempfile.TemporaryFile(prefix="aisim-gaps-")
            self._write(values, weights)
            for name in self._BUFFERS:
                setattr(self, name, array(getattr(self, name).typecode))

    def _write(self, values: np.ndarray, weights: np.ndarray) -> None:
        f = self.spilled
        f.seek(0, 2)
        f.write(np.int64(len(values)).tobytes())
        f.write(np.ascontiguousarray(values, dtype=np.float64).tobytes())
        f.write(np.ascontiguousarray(weights, dtype=np.int64).tobytes())
        self.num_spilled += len(values)

    def buffered(self) -> tuple[np.ndarray, np.ndarray]:
        """The buffered gaps as (value, weight) arrays, entries of weight 0 left out (the buffers'
        order: pooled, run segments, individual)."""
        values = []
        weights = []
        if len(self.pooled_values):
            values.append(np.frombuffer(self.pooled_values, dtype=np.float64))
            weights.append(np.frombuffer(self.pooled_weights, dtype=np.int64))
        if len(self.run_ends):
            # consecutive differences over all segments; the one across two segments weighs 0
            ends = np.frombuffer(self.run_ends, dtype=np.float64)
            starts = np.frombuffer(self.run_starts, dtype=np.int64)
            per_end = np.repeat(np.frombuffer(self.run_weights, dtype=np.int64), np.diff(starts, append=len(ends)))
            per_end[starts] = 0
            values.append(np.diff(ends))
            weights.append(per_end[1:])
        if len(self.individual):
            values.append(np.frombuffer(self.individual, dtype=np.float64))
            weights.append(np.ones(len(self.individual), dtype=np.int64))
        if not values:
            return np.zeros(0), np.zeros(0, dtype=np.int64)
        v, w = (np.concatenate(values), np.concatenate(weights)) if len(values) > 1 else (values[0], weights[0])
        keep = w > 0
        return (v, w) if keep.all() else (v[keep], w[keep])

    def num_entries(self) -> int:
        """Gap entries held (buffered and written out), an upper bound of the (value, weight) pairs."""
        return self.num_spilled + len(self.pooled_values) + len(self.run_ends) + len(self.individual)

    def chunks(self):
        """Every (value, weight) pair, as arrays of at most ``READ_ENTRIES`` pairs (those written
        out first, then the buffered ones); readable any number of times."""
        f = self.spilled
        if f is not None:
            size = f.seek(0, 2)
            pos = 0
            while pos < size:  # (blocks: their length, values, weights)
                f.seek(pos)
                n = int(np.frombuffer(f.read(8), dtype=np.int64)[0])
                at_v = pos + 8
                at_w = at_v + 8 * n
                for a in range(0, n, READ_ENTRIES):
                    k = min(READ_ENTRIES, n - a)
                    f.seek(at_v + 8 * a)
                    v = np.frombuffer(f.read(8 * k), dtype=np.float64)
                    f.seek(at_w + 8 * a)
                    yield v, np.frombuffer(f.read(8 * k), dtype=np.int64)
                pos = at_w + 8 * n
        v, w = self.buffered()
        for a in range(0, len(v), READ_ENTRIES):
            yield v[a:a + READ_ENTRIES], w[a:a + READ_ENTRIES]

    def to_wire(self) -> tuple:
        """The buffers and what was written out as bytes (``from_wire`` rebuilds the sink)."""
        out = tuple(getattr(self, name).tobytes() for name in self._BUFFERS)
        if self.spilled is None:
            return out
        self.spilled.seek(0)
        data = self.spilled.read()
        return out + (data, self.num_spilled)

    @classmethod
    def from_wire(cls, data: tuple) -> "GapSink":
        g = cls()
        for name, raw in zip(cls._BUFFERS, data[:len(cls._BUFFERS)], strict=True):
            getattr(g, name).frombytes(raw)
        if len(data) > len(cls._BUFFERS):
            g.spilled = tempfile.TemporaryFile(prefix="aisim-gaps-")
            g.spilled.write(data[len(cls._BUFFERS)])
            g.num_spilled = data[len(cls._BUFFERS) + 1]
        return g
