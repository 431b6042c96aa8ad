"""Columns kept in an anonymous scratch file and read back a slice at a time (docs/scale.md,
"Reading the trace" and "The replay").

Two users: the trace reader and the request log (``simulator.metrics.collector.RequestLog``,
whose blocks of rows go to one file per column). A production trace's prompt content (its
pieces: ~24 per request, 12 bytes each) is most of a workload's size: ~2.9 GB for ten million
requests. Past ``SPILL_PIECES`` pieces the trace reader writes them, a chunk at a time as it
reads, to unnamed temporary files (deleted when closed, in ``$TMPDIR``), and the replay reads
back only the slices it reaches (``BlockHashStore`` takes 512 requests at a time). Reads are
``os.pread``: no file position is shared, so a forked worker reads the same file safely, and
nothing is mapped, so the column never counts towards the process's resident memory. Pickled (a
workload shipped to another process or machine) a spilled column becomes a plain in-memory array
with the same values.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

#: pieces a trace may hold in memory; past this the reader spills them (tests lower it)
SPILL_PIECES = 1 << 24
#: elements read at a time when a column is walked whole (digest, fancy indexing)
READ_ELEMENTS = 1 << 20


class ColumnFile:
    """An append-only 1-D column in an anonymous temporary file; ``freeze`` gives its reader."""

    def __init__(self, dtype) -> None:
        self.dtype = np.dtype(dtype)
        self._file = tempfile.TemporaryFile(prefix="aisim-column-")
        self.length = 0

    def append(self, values) -> None:
        arr = np.ascontiguousarray(values, dtype=self.dtype)
        if arr.size:
            self._file.write(arr.data)
            self.length += arr.size

    def freeze(self) -> SpilledArray:
        self._file.flush()
        return SpilledArray(self._file, self.dtype, self.length)


class SpilledArray:
    """A read-only 1-D array whose values live in a scratch file.

    Indexing reads from the file: a slice (step 1) gives a read-only ``ndarray`` of that range,
    an integer array gives the values at those positions (read in ranges of ``READ_ELEMENTS``), an
    integer gives one value. ``np.asarray`` and pickling give the whole column in memory."""

    ndim = 1

    def __init__(self, file, dtype: np.dtype, length: int) -> None:
        self._file = file  # (kept: the file lives as long as a reader does)
        self._fd = file.fileno()
        self.dtype = dtype
        self.length = length

    @property
    def shape(self) -> tuple[int]:
        return (self.length,)

    @property
    def size(self) -> int:
        return self.length

    @property
    def nbytes(self) -> int:
        return self.length * self.dtype.itemsize

    def __len__(self) -> int:
        return self.length

    def _read(self, lo: int, hi: int) -> np.ndarray:
        n = max(hi - lo, 0)
        if n > READ_ELEMENTS:  # (one read call moves at most ~2 GB: a whole column in ranges)
            out = np.empty(n, dtype=self.dtype)
            for a in range(0, n, READ_ELEMENTS):
                out[a:a + READ_ELEMENTS] = self._read(lo + a, lo + min(a + READ_ELEMENTS, n))
            out.setflags(write=False)
            return out
        size = self.dtype.itemsize
        raw = os.pread(self._fd, n * size, lo * size) if n else b""
        if len(raw) != n * size:
            raise OSError(f"scratch column: read {len(raw)} of {n * size} bytes")
        return np.frombuffer(raw, dtype=self.dtype)

    def __getitem__(self, key):
        if isinstance(key, slice):
            lo, hi, step = key.indices(self.length)
            if step != 1:
                return self._read(0, self.length)[key]
            return self._read(lo, hi)
        if isinstance(key, (int, np.integer)):
            i = int(key)
            if i < 0:
                i += self.length
            if not 0 <= i < self.length:
                raise IndexError(f"index {int(key)} out of range for a column of {self.length}")
            return self._read(i, i + 1)[0]
        return self.take(np.asarray(key))

    def take(self, indices: np.ndarray) -> np.ndarray:
        """The values at ``indices`` (any order), reading each range of ``READ_ELEMENTS`` once."""
        idx = np.asarray(indices, dtype=np.int64)
        out = np.empty(idx.shape, dtype=self.dtype)
        if not idx.size:
            return out
        flat = idx.ravel()
        if flat.min() < 0 or flat.max() >= self.length:
            raise IndexError(f"index out of range for a column of {self.length}")
        order = np.argsort(flat, kind="stable")
        sorted_idx = flat[order]
        res = out.reshape(-1)
        lo = int(sorted_idx[0])
        top = int(sorted_idx[-1]) + 1
        while lo < top:
            hi = min(lo + READ_ELEMENTS, top)
            a, b = np.searchsorted(sorted_idx, [lo, hi])
            if b > a:
                res[order[a:b]] = self._read(lo, hi)[sorted_idx[a:b] - lo]
            lo = int(sorted_idx[b]) if b < len(sorted_idx) else top
        return out

    def chunks(self, size: int = READ_ELEMENTS):
        """The column in consecutive pieces of at most ``size`` values."""
        for lo in range(0, self.length, size):
            yield self._read(lo, min(lo + size, self.length))

    def __array__(self, dtype=None, copy=None):
        whole = self._read(0, self.length)
        return whole if dtype is None else whole.astype(dtype)

    def __reduce__(self):
        return self._read(0, self.length).__reduce__()

    def __repr__(self) -> str:
        return f"SpilledArray(dtype={self.dtype}, length={self.length})"
