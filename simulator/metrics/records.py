"""Per-request records written as the replay goes (docs/scale.md, "Per-request records").

A request's record (a ``requests.jsonl`` row) is serialised the moment the request ends: its
canonical JSON line goes to a buffer, and past ``SPILL_BYTES`` to an anonymous temporary file, so
a million-request replay captured with ``--capture-per-request`` or ``--csv`` keeps about 40 bytes
a request in memory (its arrival, index and the line's place) instead of a dict. At the end the
lines are put in the report's order (arrival, then uuid) without reading them: ``Records`` reads
each back when iterated (a ``Sequence`` of dicts, as the JSON line gives them: NaN as None, lists
for tuples; parsed by orjson), and ``Records.lines()`` gives the lines themselves, so ``requests.jsonl`` is written
byte for byte as serialised. Pickled (a report crossing processes) it becomes a plain list.
"""

from __future__ import annotations

import os
import tempfile
from array import array
from collections.abc import Iterator, Sequence

import numpy as np
import orjson

from aisim.simulator.metrics.output import canonical_json

#: buffered bytes of serialised records past which they are written to the temporary file
SPILL_BYTES = 1 << 22
#: lines joined into one chunk when the records are written out (``Records.lines``)
LINES_PER_CHUNK = 1024


class RecordSpool:
    """Records as they end: canonical JSON lines (a buffer, then a temporary file) and, per
    record, its arrival, request index and where its line starts."""

    def __init__(self, uuid_of=None, rows: bool = False) -> None:
        self.uuid_of = uuid_of
        # ``rows``: each record kept only as its request_metrics.csv row (``csv_out.row_of``, ``add_row``),
        # no JSON line: what a capacity trial reads (``records()`` is then a list of rows)
        self.rows: list | None = [] if rows else None
        self.arrival = array("d")
        self.index = array("q")
        self.start = array("q")  # where each line starts, in the order the records ended
        self._buf = bytearray()
        self._file = None  # an anonymous temporary file once the buffer outgrew SPILL_BYTES
        self._written = 0  # bytes in the file (the buffer holds those after it)

    def add_row(self, index: int, arrival_ms: float, row: tuple) -> None:
        """A record kept as its request_metrics.csv row (``rows`` only)."""
        self.arrival.append(arrival_ms)
        self.index.append(index)
        self.rows.append(row)

    def add(self, index: int, arrival_ms: float, record: dict) -> None:
        """A record kept as its JSON line (not ``rows``: those keep rows, ``add_row``)."""
        self.arrival.append(arrival_ms)
        self.index.append(index)
        self.start.append(self._written + len(self._buf))
        self._buf += (canonical_json(record, indent=None) + "\n").encode()
        if len(self._buf) > SPILL_BYTES:
            if self._file is None:
                self._file = tempfile.TemporaryFile(prefix="aisim-records-")
            self._file.write(self._buf)
            self._file.flush()
            self._written += len(self._buf)
            self._buf = bytearray()

    def _uuid(self, index: int) -> str:
        return self.uuid_of(index) if self.uuid_of is not None else str(index)

    def records(self) -> Records | list:
        """The records in the report's order: by arrival, then uuid (as a string); with ``rows``,
        their request_metrics.csv rows in that order."""
        arrival = np.frombuffer(self.arrival, dtype=np.float64) if len(self.arrival) else np.zeros(0)
        order = np.argsort(arrival, kind="stable")
        ranked = arrival[order]
        ties = np.flatnonzero(ranked[1:] == ranked[:-1])  # (equal arrivals: ordered by uuid)
        if len(ties):
            index = self.index
            starts = ties[np.r_[True, ties[1:] != ties[:-1] + 1]]  # first of each run of ties
            ends = ties[np.r_[ties[1:] != ties[:-1] + 1, True]] + 2
            for a, b in zip(starts.tolist(), ends.tolist()):
                group = order[a:b].tolist()
                group.sort(key=lambda k: self._uuid(index[k]))
                order[a:b] = group
        if self.rows is not None:
            return [self.rows[k] for k in order.tolist()]
        return Records(self, order)

    def _line(self, k: int) -> bytes:
        """The ``k``-th record's line (in the order the records ended)."""
        a = self.start[k]
        b = self.start[k + 1] if k + 1 < len(self.start) else self._written + len(self._buf)
        if a >= self._written:
            return bytes(self._buf[a - self._written:b - self._written])
        return os.pread(self._file.fileno(), b - a, a)


class Records(Sequence):
    """A replay's per-request records in order (``ReplayReport.per_request``), read back one at a
    time from the spool; compares equal to any sequence of the same dicts."""

    def __init__(self, spool: RecordSpool, order: np.ndarray) -> None:
        self._spool = spool
        self._order = order

    def __len__(self) -> int:
        return len(self._order)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [orjson.loads(self._spool._line(k)) for k in self._order[i].tolist()]
        return orjson.loads(self._spool._line(int(self._order[i])))

    def __iter__(self) -> Iterator[dict]:
        line = self._spool._line
        for k in self._order.tolist():
            yield orjson.loads(line(k))

    def lines(self) -> Iterator[str]:
        """The records' JSON lines (with their newlines), joined a chunk at a time."""
        line = self._spool._line
        order = self._order.tolist()
        for a in range(0, len(order), LINES_PER_CHUNK):
            yield b"".join([line(k) for k in order[a:a + LINES_PER_CHUNK]]).decode()

    def __eq__(self, other) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None

    def __repr__(self) -> str:
        return f"<Records: {len(self)} per-request records>"

    def __reduce__(self):
        return list, (list(self),)


def jsonl_chunks(records) -> Iterator[str]:
    """``requests.jsonl``'s text for ``records`` (``Records``: its lines as serialised; any other
    sequence of dicts: each serialised now, the same way)."""
    if isinstance(records, Records):
        return records.lines()
    return (canonical_json(r, indent=None) + "\n" for r in records)
