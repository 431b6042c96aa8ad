"""Trace readers: mooncake JSONL and dynamo.request.trace.v1 (JSONL or .gz; files, shard
directories, globs). Both lower to a columnar ``Workload``.

A malformed row fails with ``file:line`` and the field. Unknown row fields are ignored (traces
from production carry extra columns).
"""

from __future__ import annotations

import glob
import gzip
import math
import os
import stat
from contextlib import contextmanager
from contextvars import ContextVar
from itertools import chain, repeat
from operator import itemgetter, le, mul
from pathlib import Path

import numpy as np
import orjson

from aisim.actors import hashing
from aisim.simulator import spill
from aisim.simulator.errors import InputError, NotSupportedError
from aisim.simulator.traffic.workload import Workload

MASK64 = (1 << 64) - 1
DYNAMO_SCHEMA = "dynamo.request.trace.v1"


# -- paths ------------------------------------------------------------------------------
_GIVE = "give an existing file, a directory of .jsonl/.jsonl.gz shards or a glob"
_KINDS = ((stat.S_ISREG, "a regular file"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def resolve_trace_paths(paths: list[str], field: str, config_dir: Path | None = None) -> list[Path]:
    """Expand files, directories of .jsonl/.jsonl.gz shards and globs.

    A relative path is looked up in the working directory first, then next to the config file.
    A path that gives no trace file fails under ``field`` with what was found there instead (an
    empty directory, a directory of other files, a FIFO, a device, a glob that matched nothing).
    Nothing is opened here, so a FIFO never blocks.
    """
    out: list[Path] = []
    for raw in paths:
        raw = str(raw)
        bases = [Path.cwd()]
        if config_dir is not None and not os.path.isabs(raw):
            bases.append(config_dir)
        found: list[Path] = []
        for base in bases:
            found = _expand_one(raw, base)
            if found:
                break
        if not found:
            why = next((d for d in (_why_no_trace(raw, base) for base in bases) if d is not None), None)
            if why is not None:
                raise InputError(field, f"{why}; {_GIVE}")
            looked = "" if os.path.isabs(raw) else f" (looked in {' and '.join(_base_names(bases))})"
            what = f"glob {raw!r} matched nothing" if _is_glob(raw) else f"trace {raw!r} not found"
            raise InputError(field, f"{what}{looked}; {_GIVE}")
        out.extend(found)
    return out


def _base_names(bases: list[Path]) -> list[str]:
    return ["the working directory"] + [str(b) for b in bases[1:]]


def _is_glob(raw: str) -> bool:
    return any(ch in raw for ch in "*?[")


def _is_shard(name: str) -> bool:
    return name.endswith(".jsonl") or name.endswith(".jsonl.gz")


def _expand_one(raw: str, base: Path) -> list[Path]:
    p = Path(raw) if os.path.isabs(raw) else base / raw
    if _is_glob(raw):
        return sorted(Path(m) for m in glob.glob(str(p)) if Path(m).is_file())
    if p.is_dir():
        try:
            return sorted(q for q in p.iterdir() if q.is_file() and _is_shard(q.name))
        except OSError:
            return []
    if p.is_file():
        return [p]
    return []


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _names(items: list[str], limit: int = 5) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _entry_kind(entry: os.DirEntry) -> str:
    try:
        return _kind(entry.stat().st_mode)
    except OSError:
        return "a broken symbolic link" if entry.is_symlink() else "cannot be accessed"


def _why_no_trace(raw: str, base: Path) -> str | None:
    """What ``raw`` (under ``base``) is, when it gave no trace file; None when nothing is there.
    Only stats and lists: never opens a file (a FIFO would block)."""
    p = Path(raw) if os.path.isabs(raw) else base / raw
    if _is_glob(raw):
        matches = sorted(glob.glob(str(p)))
        if not matches:
            return None
        kinds = []
        for m in matches:
            try:
                kinds.append(f"{m} ({_kind(os.stat(m).st_mode)})")
            except OSError as exc:
                kinds.append(f"{m} ({exc.strerror or exc})")
        n = f"{len(matches)} path" + ("s" if len(matches) != 1 else "")
        return f"glob {raw!r} matched {n} but no regular file: {_names(kinds)}"
    try:
        mode = os.stat(p).st_mode
    except (FileNotFoundError, NotADirectoryError):
        if os.path.islink(p):
            return f"{p} is a broken symbolic link (to {os.readlink(p)})"
        return None
    except OSError as exc:
        return f"{p} cannot be accessed ({exc.strerror or exc})"
    if stat.S_ISDIR(mode):
        try:
            with os.scandir(p) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            return f"{p} is a directory that cannot be listed ({exc.strerror or exc})"
        if not entries:
            return f"{p} is an empty directory"
        shards = [f"{e.name} ({_entry_kind(e)})" for e in entries if _is_shard(e.name)]
        if shards:  # named like shards but not regular files (FIFOs, directories, broken links)
            return f"{p} is a directory whose .jsonl/.jsonl.gz entries are not regular files: {_names(shards)}"
        names = [e.name + ("/" if e.is_dir() else "") for e in entries]
        what = "files" if all(e.is_file() for e in entries) else "entries"
        if len(entries) == 1:
            what = what[:-1] if what == "files" else "entry"
        return (f"{p} is a directory with no .jsonl or .jsonl.gz shards "
                f"(it holds {len(entries)} other {what}: {_names(names)})")
    return f"{p} is {_kind(mode)}, not a regular file"


#: who is told how many rows of each trace file have been read, a chunk at a time (``rows_read``);
#: None: nobody
_ROWS_READ: ContextVar = ContextVar("aisim_rows_read", default=None)

#: rows parsed at a time: a chunk's rows become compact columns before the next is read (a large
#: trace never exists as row objects all at once)
CHUNK_ROWS = 16384


@contextmanager
def rows_read(callback):
    """Within the block, ``callback(path, rows)`` is called as each chunk of ``rows`` rows of a trace
    file has been read (a terminal shows it while a large trace loads); reading never depends on it."""
    token = _ROWS_READ.set(callback)
    try:
        yield
    finally:
        _ROWS_READ.reset(token)


def _jsonl_chunks(path: Path):
    """The rows of a JSONL file (plain or gzipped) in file order, at most ``CHUNK_ROWS`` at a time,
    with their 1-based line numbers: ``(rows, linenos)``. Blank lines are skipped; a line that is not
    JSON fails with its ``file:line``."""
    size = CHUNK_ROWS
    tell = _ROWS_READ.get()
    line0 = 0  # (lines before the chunk)
    read_any = False
    try:
        with (gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")) as fh:
            while lines := fh.readlines(size * 256):  # (whole lines, about 256 bytes a row or more)
                for a in range(0, len(lines), size):  # (short lines: still at most ``size`` rows at a time)
                    rows, linenos = _parse_chunk(path, lines[a:a + size], line0 + a)
                    if rows:
                        read_any = True
                        if tell is not None:
                            tell(path, len(rows))
                        yield rows, linenos
                line0 += len(lines)
    except (OSError, EOFError) as exc:
        raise InputError(str(path), f"cannot read trace: {exc}") from None
    if tell is not None and not read_any:
        tell(path, 0)


def _parse_chunk(path: Path, lines: list[bytes], line0: int) -> tuple[list, range | list[int]]:
    """(rows, their line numbers) of ``lines`` (file lines ``line0 + 1`` on)."""
    try:
        return list(map(orjson.loads, lines)), range(line0 + 1, line0 + 1 + len(lines))
    except orjson.JSONDecodeError:
        pass
    rows: list = []
    linenos: list[int] = []
    for n, line in enumerate(lines, line0 + 1):
        if not line.strip():
            continue
        try:
            rows.append(orjson.loads(line))
        except orjson.JSONDecodeError as exc:
            raise InputError(f"{path}:{n}", f"invalid JSON ({exc.msg}); each line must be one JSON object") from None
        linenos.append(n)
    return rows, linenos


def _rows(paths: list[Path]):
    """(row, "file:line") for every row of every file; each row must be a JSON object."""
    for path in paths:
        for rows, linenos in _jsonl_chunks(path):
            yield from _checked_rows(path, rows, linenos)


def _checked_rows(path: Path, rows: list, linenos: list[int]):
    for row, n in zip(rows, linenos):
        where = f"{path}:{n}"
        if not isinstance(row, dict):
            raise InputError(where, "each line must be a JSON object")
        yield row, where


def _int_field(row: dict, names: tuple[str, ...], where: str, required: bool, minimum: int = 0):
    for name in names:
        if name in row:
            v = row[name]
            if isinstance(v, bool) or not isinstance(v, int):
                if isinstance(v, float) and v.is_integer():
                    v = int(v)
                else:
                    raise InputError(where, f"field {name!r} must be an integer, got {v!r}")
            if v < minimum:
                raise InputError(where, f"field {name!r} must be >= {minimum}, got {v}")
            return v
    if required:
        raise InputError(where, f"missing field {' or '.join(repr(n) for n in names)}")
    return None


def _num_field(row: dict, names: tuple[str, ...], where: str):
    for name in names:
        if name in row:
            v = row[name]
            if v is None:
                return None
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0:
                raise InputError(where, f"field {name!r} must be a non-negative number, got {v!r}")
            return float(v)
    return None


def _hash_ids(row: dict, name: str, where: str) -> list[int]:
    ids = row.get(name)
    if not isinstance(ids, list):
        raise InputError(where, f"field {name!r} must be a list of integer block ids, got {type(ids).__name__}"
                         if name in row else f"missing field {name!r} (one id per trace block)")
    if ids and not set(map(type, ids)) <= {int}:  # C-speed check; bool is its own type
        bad = next(h for h in ids if type(h) is not int)
        if type(bad) is float and bad.is_integer() and not -2.0 ** 63 <= bad < 2.0 ** 64:
            # (the JSON parser reads an integer beyond 64 bits as a float)
            raise InputError(where, f"field {name!r} holds an id beyond 64 bits ({bad:.0f}); give ids in "
                                    "[-2^63, 2^64), as 64-bit hashes are")
        raise InputError(where, f"field {name!r} must hold integers, got {bad!r}")
    return ids


def _u64(ids: list[int]) -> np.ndarray:
    try:
        return np.array(ids, dtype=np.int64).view(np.uint64)
    except OverflowError:
        return np.array([h & MASK64 for h in ids], dtype=np.uint64)


class _Builder:
    """Accumulates rows into workload columns: the rows added since the last ``flush`` as Python
    lists, the ones before as compact numpy chunks (a large trace never exists as Python objects
    all at once; ``flush`` after each chunk of rows)."""

    # (name, dtype, the value of a row without a session: a chunk without any is kept as its length)
    _SESSION_COLUMNS = (("sessions", np.int64, -1), ("turns", np.int64, 0), ("delays", np.float64, float("nan")))
    _COLUMNS = (("inputs", np.int64), ("outputs", np.int64), ("times", np.float64), ("counts", np.int64),
                ("last_len", np.int64))

    def __init__(self, block: int) -> None:
        self.block = block  # (trace block size: every piece is one block, a request's last shorter)
        self.inputs: list[int] = []
        self.outputs: list[int] = []
        self.times: list[float] = []
        self.ids: list[int] = []
        self.counts: list[int] = []
        self.last_len: list[int] = []
        self.sessions: list[int] = []  # (session columns: filled only while ``_special``)
        self.turns: list[int] = []
        self.delays: list[float] = []
        self.request_ids: list[str | None] | None = None  # (None until a row has one: then one a row)
        self.session_names: dict[str, int] = {}
        self.turn_of: dict[int, int] = {}
        self.any_session = False
        self.num_rows = 0
        self._special = False  # a row since the last flush had a session or a delay
        self._chunks: dict[str, list] = {name: [] for name in ("ids", *(c[0] for c in self._COLUMNS),
                                                               *(c[0] for c in self._SESSION_COLUMNS))}
        # past spill.SPILL_PIECES pieces: the pieces in scratch files, written as the rows are read
        self._spill: tuple[spill.ColumnFile, spill.ColumnFile] | None = None
        self._pieces_held = 0  # pieces in the "ids" chunks
        self._spilled_rows = 0  # "counts" chunks whose pieces are in the scratch files

    def add(self, ids: list[int], input_len: int, output_len: int, t_ms: float | None,
            session=None, delay: float | None = None, request_id=None) -> None:
        block = self.block
        n = -(-input_len // block) if input_len > 0 else 0
        self.ids.extend(ids[:n])
        self.counts.append(n)
        self.last_len.append(input_len - (n - 1) * block if n else 0)
        self.inputs.append(input_len)
        self.outputs.append(output_len)
        self.times.append(float("nan") if t_ms is None else t_ms)
        if (session is not None or delay is not None) and not self._special:
            self._special = True  # (the rows before it since the last flush: no session, no delay)
            pending = len(self.inputs) - 1
            for name, _, default in self._SESSION_COLUMNS:
                getattr(self, name).extend([default] * pending)
        if session is not None:
            self.any_session = True
            key = str(session)
            s = self.session_names.setdefault(key, len(self.session_names))
            turn = self.turn_of.get(s, 0)
            self.turn_of[s] = turn + 1
            self.sessions.append(s)
            self.turns.append(turn)
        elif self._special:
            self.sessions.append(-1)
            self.turns.append(0)
        if self._special:
            self.delays.append(float("nan") if delay is None else delay)
        if request_id is not None and self.request_ids is None:
            self.request_ids = [None] * self.num_rows
        if self.request_ids is not None:
            self.request_ids.append(None if request_id is None else str(request_id))
        self.num_rows += 1

    def add_plain(self, inputs: list[int], outputs: list[int], times: list[float], counts: list[int],
                  ids: list[int]) -> None:
        """Rows without sessions, delays or request ids, given as columns (``counts``: prompt blocks
        each, ``ids``: their hash ids one after another)."""
        block = self.block
        self.inputs.extend(inputs)
        self.outputs.extend(outputs)
        self.times.extend(times)
        self.counts.extend(counts)
        self.ids.extend(ids)
        self.last_len.extend([n - (k - 1) * block if k else 0 for n, k in zip(inputs, counts)])
        if self._special:
            for name, _, default in self._SESSION_COLUMNS:
                getattr(self, name).extend([default] * len(inputs))
        if self.request_ids is not None:
            self.request_ids.extend([None] * len(inputs))
        self.num_rows += len(inputs)

    def add_arrays(self, inputs: np.ndarray, outputs: np.ndarray, times: np.ndarray, counts: np.ndarray,
                   sources: np.ndarray, last_len: np.ndarray) -> None:
        """Rows without sessions or delays as numpy columns (``sources``: their prompt blocks' piece
        sources, one row's after another; ``last_len``: each row's last block's tokens)."""
        self.flush()
        for name, values in (("inputs", inputs), ("outputs", outputs), ("times", times), ("counts", counts),
                             ("last_len", last_len)):
            self._chunks[name].append(values)
        self._chunks["ids"].append(sources)
        self._pieces_held += len(sources)
        for name, _, _ in self._SESSION_COLUMNS:
            self._chunks[name].append(len(inputs))
        if self.request_ids is not None:
            self.request_ids.extend([None] * len(inputs))
        self.num_rows += len(inputs)

    def flush(self) -> None:
        """The rows added since the last flush become compact chunks (session columns: the rows'
        own values when one of them had a session or a delay, else just their count)."""
        n = len(self.inputs)
        if self.ids:  # (as the workload's piece sources: hashed chunk by chunk, no whole-trace temporaries)
            self._chunks["ids"].append(hashing.trace_sources(_u64(self.ids)))
            self._pieces_held += len(self.ids)
            self.ids = []
        for name, dtype in self._COLUMNS:
            values = getattr(self, name)
            if values:
                self._chunks[name].append(np.array(values, dtype=dtype))
                setattr(self, name, [])
        for name, dtype, _ in self._SESSION_COLUMNS:
            if n:
                self._chunks[name].append(np.array(getattr(self, name), dtype=dtype) if self._special else n)
            setattr(self, name, [])
        self._special = False
        if self._spill is not None or self._pieces_held > spill.SPILL_PIECES:
            self._spill_pieces()

    def _piece_lengths(self, counts: np.ndarray, last_len: np.ndarray) -> np.ndarray:
        """The pieces' lengths of rows with ``counts`` pieces each: one block, each row's last
        ``last_len`` (int32 holds any piece, at half the bytes)."""
        ends = np.cumsum(counts)
        lens = np.full(int(ends[-1]) if len(ends) else 0, self.block, dtype=np.int32)
        has = counts > 0
        lens[ends[has] - 1] = last_len[has]
        return lens

    def _spill_pieces(self) -> None:
        """The pieces held so far go to the scratch files (opened the first time)."""
        if self._spill is None:
            self._spill = (spill.ColumnFile(np.uint64), spill.ColumnFile(np.int32))
        src_file, len_file = self._spill
        for ids in self._chunks["ids"]:
            src_file.append(ids)
        self._chunks["ids"] = []
        self._pieces_held = 0
        counts, last = self._chunks["counts"], self._chunks["last_len"]
        for k in range(self._spilled_rows, len(counts)):
            len_file.append(self._piece_lengths(counts[k], last[k]))
            last[k] = None  # (no longer needed: the lengths are written)
        self._spilled_rows = len(counts)

    def _column(self, name: str, dtype) -> np.ndarray:
        """The column's chunks as one array (the chunks let go of as it is made)."""
        parts = self._chunks[name]
        self._chunks[name] = []
        if not parts:
            return np.zeros(0, dtype=dtype)
        return np.concatenate(parts) if len(parts) != 1 else parts[0]

    def _session_column(self, name: str, dtype, default) -> np.ndarray:
        parts = [np.full(p, default, dtype=dtype) if isinstance(p, int) else p for p in self._chunks[name]]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)

    def build(self, description: str, recorded_total_ms: list[float] | None = None,
              origin_ms: float = 0.0) -> Workload:
        self.flush()
        if self._spill is not None:
            self._chunks["last_len"] = []  # (the flush wrote every row's pieces)
        col = {name: self._column(name, dtype)
               for name, dtype in (*self._COLUMNS, ("ids", np.uint64)) if name != "last_len" or self._spill is None}
        counts = col["counts"]
        ptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        if self._spill is None:
            src, lens = col["ids"], self._piece_lengths(counts, col["last_len"])
        else:
            src, lens = (f.freeze() for f in self._spill)
        session = {name: self._session_column(name, dtype, default) if self.any_session else None
                   for name, dtype, default in self._SESSION_COLUMNS}
        return Workload(
            input_len=col["inputs"],
            output_len=col["outputs"],
            timestamp_ms=col["times"],
            piece_ptr=ptr,
            piece_src=src,
            piece_len=lens,
            session_index=session["sessions"],
            turn_index=session["turns"],
            delay_ms=session["delays"],
            session_names=list(self.session_names),
            request_ids=self.request_ids,
            description=description,
            recorded_total_ms=None if recorded_total_ms is None else np.array(recorded_total_ms, dtype=np.float64),
            origin_ms=origin_ms,
        )


# -- mooncake -----------------------------------------------------------------------------
def _over_capacity(row: dict, inp: int, ids: list[int], block_size: int, where: str) -> None:
    """A row whose input needs more blocks than it has hash ids: the trace was made with a larger
    block size than ``block_size`` (or the row is broken). Never clamp: that silently cuts prompts."""
    name = "input_length" if "input_length" in row else "input_tokens"
    if not ids:
        raise InputError(where, f"{name} {inp} exceeds hash_ids capacity 0 (hash_ids is empty); give one "
                                f"hash id per {block_size}-token block, or leave {name} out")
    need = -(-inp // len(ids))
    raise InputError(where, f"{name} {inp} exceeds hash_ids capacity {len(ids) * block_size} ({len(ids)} ids x "
                            f"block size {block_size}); the trace's block size is probably larger (at least "
                            f"{need}): set traffic.source.block_size (now {block_size}; trace_block_size in "
                            "the Python API) to the one the trace was made with")


_PLAIN_MOONCAKE = ("timestamp", "input_length", "output_length", "hash_ids")


def _plain_mooncake_columns(rows: list, block_size: int, b: _Builder) -> bool:
    """Fill ``b`` from rows that all have exactly the plain Mooncake fields (timestamp,
    input_length, output_length, hash_ids) with valid values, checked column by column at C
    speed. False (``b`` untouched) when any row is otherwise: the row-by-row reader then says
    which row and field are wrong."""
    if not rows or set(map(type, rows)) != {dict} or set(map(len, rows)) != {4}:
        return False
    try:  # (one column at a time: zip(*rows) would zip thousands of iterators)
        ts, inp, out, ids = (list(map(itemgetter(name), rows)) for name in _PLAIN_MOONCAKE)
    except KeyError:
        return False
    if set(map(type, inp)) != {int} or set(map(type, out)) != {int} or min(inp) < 0 or min(out) < 0:
        return False
    kinds = set(map(type, ts))
    if not kinds <= {int, float} or min(ts) < 0 or (float in kinds and any(map(math.isnan, ts))):
        return False
    if set(map(type, ids)) != {list} or not set(map(type, chain.from_iterable(ids))) <= {int}:
        return False
    if not all(map(le, inp, map(mul, map(len, ids), repeat(block_size)))):
        return False  # an input longer than its hash ids hold
    counts = [-(-n // block_size) for n in inp]
    b.add_plain(inp, out, list(map(float, ts)), counts,
                list(chain.from_iterable(map(list.__getitem__, ids, map(slice, counts)))))
    return True


def read_mooncake(paths: list[Path], block_size: int = 512, need_timestamps: bool = False) -> Workload:
    """Mooncake JSONL rows: timestamp|created_time (ms), input_length|input_tokens, output_length|
    output_tokens, hash_ids (one id per trace block; shared leading ids = shared prefix),
    optional session_id (turns in file order), delay|delay_ms, request_id."""
    b = _Builder(block_size)
    description = f"mooncake:{','.join(p.name for p in paths)}"
    sessions_seen: set = set()
    for path in paths:
        for rows, linenos in _jsonl_chunks(path):
            # the plain format, checked by column (row by row otherwise, which says what is wrong)
            if not _plain_mooncake_columns(rows, block_size, b):
                for row, where in _checked_rows(path, rows, linenos):
                    _mooncake_row(b, row, where, block_size, need_timestamps, sessions_seen)
            b.flush()
    if not b.num_rows:
        raise InputError(", ".join(str(p) for p in paths), "trace holds no requests")
    return b.build(description)


def _mooncake_row(b: _Builder, row: dict, where: str, block_size: int, need_timestamps: bool,
                  sessions_seen: set) -> None:
    ids = _hash_ids(row, "hash_ids", where)
    cap = len(ids) * block_size
    inp = _int_field(row, ("input_length", "input_tokens"), where, required=False)
    if inp is None:
        inp = cap
    elif inp > cap:
        _over_capacity(row, inp, ids, block_size, where)
    out = _int_field(row, ("output_length", "output_tokens"), where, required=True)
    ts = _num_field(row, ("timestamp", "created_time"), where)
    session = row.get("session_id")
    delay = _num_field(row, ("delay", "delay_ms"), where)
    first_turn = session is None or session not in sessions_seen
    if session is not None:
        sessions_seen.add(session)
    if need_timestamps and first_turn and ts is None:
        raise InputError(where, "field 'timestamp' is required on a request's (or session's first) row "
                                "for traffic.load.type trace_timestamps")
    if delay is not None and delay > 0 and first_turn:
        raise InputError(where, "field 'delay' is only allowed on later turns of a session")
    b.add(ids, inp, out, ts, session, delay, row.get("request_id"))


# -- dynamo.request.trace.v1 --------------------------------------------------------------
def read_dynamo(paths: list[Path]) -> Workload:
    """``request_end`` records; start = request_received_ms, else end - total_time_ms;
    timestamps normalised to the earliest start; one embedded block size for all records."""
    # the records as columns, in file order (their hash ids as piece sources a chunk at a time)
    starts: list[float] = []
    totals: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    counts: list[int] = []
    rids: list[str] = []
    sources: list[np.ndarray] = []
    pending: list[int] = []
    block: int | None = None
    seen: dict[str, str] = {}
    for row, where in _rows(paths):
        if row.get("schema") != DYNAMO_SCHEMA:
            raise InputError(where, f"field 'schema' must be {DYNAMO_SCHEMA!r}, got {row.get('schema')!r}")
        if row.get("event_type") != "request_end":
            continue
        if row.get("agent_context") is not None:
            raise NotSupportedError(where, "agentic dynamo traces (agent_context) are not supported yet; "
                                            "drop agent_context rows or use a non-agentic trace")
        req = row.get("request")
        if not isinstance(req, dict):
            raise InputError(where, "missing object field 'request'")
        rid = req.get("request_id")
        if rid is None:
            raise InputError(where, "missing field 'request.request_id'")
        rid = str(rid)
        if rid in seen:
            raise InputError(where, f"duplicate request_id {rid!r} (first at {seen[rid]})")
        seen[rid] = where
        replay = req.get("replay")
        if not isinstance(replay, dict):
            raise InputError(where, "missing object field 'request.replay'")
        bs = _int_field(replay, ("trace_block_size",), where + " request.replay", required=True, minimum=1)
        if block is None:
            block = bs
        elif bs != block:
            raise InputError(where, f"field 'request.replay.trace_block_size' is {bs} but earlier records use "
                                    f"{block}; all records must share one block size")
        ids = _hash_ids(replay, "input_sequence_hashes", where + " request.replay")
        inp = _int_field(replay, ("input_length",), where + " request.replay", required=False)
        cap = len(ids) * bs
        inp = cap if inp is None else min(inp, cap)
        out = _int_field(req, ("output_tokens",), where + " request", required=True)
        start = _num_field(req, ("request_received_ms",), where)
        total = _num_field(req, ("total_time_ms",), where)
        if start is None:
            end = _num_field(row, ("event_time_unix_ms",), where)
            if end is None or total is None:
                raise InputError(where, "need 'request.request_received_ms', or 'event_time_unix_ms' and "
                                        "'request.total_time_ms', to place the request in time")
            start = end - total
        n = -(-inp // block) if inp > 0 else 0
        pending.extend(ids[:n])
        if len(pending) >= CHUNK_ROWS * 16:
            sources.append(hashing.trace_sources(_u64(pending)))
            pending = []
        counts.append(n)
        starts.append(start)
        totals.append(float("nan") if total is None else float(total))
        inputs.append(inp)
        outputs.append(out)
        rids.append(rid)
    if not starts:
        raise InputError(", ".join(str(p) for p in paths), "trace holds no request_end records")
    if pending:
        sources.append(hashing.trace_sources(_u64(pending)))
    # in (start, file order): each record's pieces gathered to its place
    start_ms = np.array(starts, dtype=np.float64)
    order = np.lexsort((np.arange(len(start_ms)), start_ms))
    count = np.array(counts, dtype=np.int64)
    first = np.concatenate(([0], np.cumsum(count)[:-1]))[order]
    count = count[order]
    ptr = np.concatenate(([0], np.cumsum(count)))
    src = np.concatenate(sources) if sources else np.zeros(0, dtype=np.uint64)
    src = src[np.repeat(first - ptr[:-1], count) + np.arange(int(ptr[-1]), dtype=np.int64)]
    inp_len = np.array(inputs, dtype=np.int64)[order]
    t0 = float(start_ms[order[0]])
    b = _Builder(block)
    b.add_arrays(inp_len, np.array(outputs, dtype=np.int64)[order], start_ms[order] - t0, count, src,
                 np.where(count > 0, inp_len - (count - 1) * block, 0))
    b.request_ids = [rids[i] for i in order.tolist()]
    return b.build(f"dynamo:{','.join(p.name for p in paths)}", np.array(totals)[order], t0)
