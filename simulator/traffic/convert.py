"""Trace conversion: mooncake JSONL -> ``dynamo.request.trace.v1`` (``aisim trace convert``).

One mooncake row becomes one ``request_end`` record::

    {"schema": "dynamo.request.trace.v1", "event_type": "request_end", "event_time_unix_ms": 3052,
     "request": {"request_id": "mooncake-2", "model": "mooncake", "output_tokens": 794,
                 "request_received_ms": 3052,
                 "replay": {"trace_block_size": 512, "input_length": 7234, "input_sequence_hashes": [0, 28, ...]}}}

Format decisions (what a mooncake row does not record, and how the record fills it):

- Time: ``request_received_ms`` is the row's ``timestamp`` (or ``created_time``) unchanged, an
  integer when it is one. Timestamps stay on the mooncake trace's own clock (milliseconds from its
  origin, not the Unix epoch) and are never re-based per file, so a history file and its replay
  file share one absolute time line (the history ends before the first replayed request).
- Completion: a mooncake row has no recorded latency, so ``request.total_time_ms`` is omitted
  (the schema makes it optional; readers place the request by ``request_received_ms``). Without
  it, a retune window cannot exclude requests that completed after its sweep launched; a recorded
  trace carries each request's latency. ``event_time_unix_ms`` (an integer the schema requires)
  is the arrival time rounded up to the millisecond: the only time known, and never before it.
- Identity: ``input_sequence_hashes`` are the row's ``hash_ids`` as unsigned 64-bit values (the
  same mapping the readers use), cut to the blocks the input covers (ceil(input_length /
  block_size), the recorded format's invariant). Prompts sharing leading hash ids still share
  prefixes after conversion. ``input_length`` is always written (a row without one gets the
  hash ids' capacity, as the mooncake reader does). ``trace_block_size`` is ``block_size``.
- ``request_id``: the row's ``request_id`` when it has one, else ``mooncake-<n>`` (``n``: the
  row's 0-based position in the input). Ids must be unique (the dynamo reader rejects duplicates).
- ``model``: the placeholder ``"mooncake"`` (the trace names no model; the replay ignores it).
- Rows are written in input order; every other mooncake field (``priority``,
  ``output_token_ids``, ...) is dropped.

Not convertible (one-line ``InputError`` naming ``file:line``): rows without a timestamp (a dynamo
record places every request at an absolute time) and multi-turn rows (``session_id``): a
non-agentic dynamo trace has no turns that wait for the previous answer. Every other row check is
the mooncake reader's own (``read_mooncake``), with its messages.

Split (``split_at_seconds=S``): a request at ``t`` ms after the trace's earliest request goes to
``history_out`` when ``t < S * 1000`` and to ``out_path`` otherwise: history ``[0, S)``, replay
``[S, end]``; a request exactly at ``S`` is replayed. Both parts must hold a request.

Writing: every output goes to a temporary file next to it (fsynced); only when all are complete
are they renamed into place, back to back, with SIGINT/SIGTERM held off between the renames, so an
interrupted or failed conversion leaves the previous files as they were.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import threading
from collections.abc import Callable
from pathlib import Path

from aisim.simulator.errors import InputError, NotSupportedError
from aisim.simulator.metrics.output import discard, fsync_dir, write_temp
from aisim.simulator.traffic.traces import DYNAMO_SCHEMA, MASK64, _rows, read_mooncake, resolve_trace_paths

#: ``model`` of a converted record (a mooncake trace names none)
MODEL_PLACEHOLDER = "mooncake"


def mooncake_to_dynamo(in_path, out_path, block_size: int = 512, split_at_seconds: float | None = None,
                       history_out=None, *, on_commit: Callable[[], None] | None = None) -> dict:
    """Convert the mooncake trace ``in_path`` (a file, a directory of .jsonl/.jsonl.gz shards or a
    glob) to ``dynamo.request.trace.v1`` at ``out_path``; with ``split_at_seconds`` (and
    ``history_out``) the requests before that second go to ``history_out`` instead.

    ``on_commit`` is called once every file is complete, just before they are renamed into place
    (the CLI uses it to stop signals from changing the outcome). Returns the counts:
    ``{"requests", "out", "history", "block_size", "split_at_ms", "span_ms"}``.
    """
    block_size = _block_size(block_size)
    split_ms = _split_ms(split_at_seconds, history_out)
    sources = resolve_trace_paths([str(in_path)], "in_path")
    out_path = Path(out_path)
    history_path = Path(history_out) if history_out is not None else None
    targets = [("out_path", out_path)] + ([("history_out", history_path)] if history_path is not None else [])
    _check_targets(targets, sources)

    try:
        w = read_mooncake(sources, block_size)  # every row check of the mooncake reader, with its messages
    except InputError as exc:
        raise _for_conversion(exc, block_size) from None
    records = list(_records(sources, w, block_size))
    t0 = min(t for t, _ in records)
    span = max(t for t, _ in records) - t0
    if split_ms is None:
        parts = {"out_path": [line for _, line in records]}
    else:
        parts = {"history_out": [line for t, line in records if t - t0 < split_ms],
                 "out_path": [line for t, line in records if t - t0 >= split_ms]}
        for name, what, part in (("history_out", "before", "history"), ("out_path", "at or after", "replay")):
            if not parts[name]:
                raise InputError("split_at_seconds", f"no request {what} {split_at_seconds:g} s, so the {part} would "
                                                     f"be empty (the trace spans {span / 1000:g} s from its first "
                                                     "request)")
    _write_all([(path, parts[name]) for name, path in targets], on_commit)
    return {"requests": len(records), "out": len(parts["out_path"]), "history": len(parts.get("history_out", [])),
            "block_size": block_size, "split_at_ms": None if split_ms is None else _number(split_ms),
            "span_ms": _number(span)}


# -- checks -------------------------------------------------------------------------------
def _block_size(block_size) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise InputError("block_size", f"must be an integer >= 1 (tokens per trace hash id), got {block_size!r}")
    return block_size


def _split_ms(split_at_seconds, history_out) -> float | None:
    if (split_at_seconds is None) != (history_out is None):
        given, missing = ("split_at_seconds", "history_out") if history_out is None else ("history_out", "split_at_seconds")
        raise InputError(given, f"needs {missing}: give both (history before the split, replay from it) or neither")
    if split_at_seconds is None:
        return None
    s = split_at_seconds
    if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s <= 0:
        raise InputError("split_at_seconds", f"must be a number of seconds > 0, got {s!r}")
    return float(s) * 1000.0


def _check_targets(targets: list[tuple[str, Path]], sources: list[Path]) -> None:
    """Each output: a writable place that is no directory, not an input and not another output."""
    seen: dict[str, str] = {}
    inputs = {os.path.realpath(p) for p in sources}
    for name, path in targets:
        real = os.path.realpath(path)
        if real in inputs:
            raise InputError(name, f"{path} is the input trace; write the conversion to another file")
        if real in seen:
            raise InputError(name, f"{path} is given for both outputs; give two different files")
        seen[real] = name
        if path.name.endswith(".gz"):
            raise InputError(name, f"{path}: gzip output is not supported; give a .jsonl path")
        if os.path.isdir(path):
            raise InputError(name, f"{path} is a directory; give a file path")
        parent = path.parent if str(path.parent) else Path(".")
        if not parent.is_dir():
            raise InputError(name, f"directory {parent} does not exist")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise InputError(name, f"cannot write in {parent} (permission denied)")


_REPLAY_BLOCK_SIZE_HINT = re.compile(r"set traffic\.source\.block_size .*$")


def _for_conversion(exc: InputError, block_size: int) -> InputError:
    """The mooncake reader's error, its block-size hint (a config key) pointed at the converter's."""
    message = _REPLAY_BLOCK_SIZE_HINT.sub(f"convert with the block size the trace was made with (now {block_size})",
                                          exc.message)
    return exc if message == exc.message else type(exc)(exc.where, message, category=exc.category)


# -- records ------------------------------------------------------------------------------
def _number(x: float):
    """An integral float as an int (``3052.0`` -> ``3052``), anything else unchanged."""
    return int(x) if float(x).is_integer() else x


def _records(sources: list[Path], w, block_size: int):
    """(arrival ms, JSON line) per row, in input order; rows already passed ``read_mooncake``."""
    ids_seen: dict[str, str] = {}
    for i, (row, where) in enumerate(_rows(sources)):
        if row.get("session_id") is not None:
            raise NotSupportedError(where, "multi-turn rows (session_id) cannot be converted: a non-agentic dynamo "
                                           "trace has no turns that wait for the previous answer; drop session_id "
                                           "to replay the rows as independent requests")
        t = float(w.timestamp_ms[i])
        if math.isnan(t):
            raise InputError(where, "field 'timestamp' (or 'created_time') is required to convert: a dynamo record "
                                    "places every request at an absolute time")
        if not math.isfinite(t):
            raise InputError(where, f"field 'timestamp' must be a finite number of milliseconds, got {t!r}")
        rid = row.get("request_id")
        rid = f"mooncake-{i}" if rid is None else str(rid)
        if rid in ids_seen:
            raise InputError(where, f"duplicate request_id {rid!r} (first at {ids_seen[rid]}); request ids must be "
                                    "unique in a dynamo trace")
        ids_seen[rid] = where
        inp = int(w.input_len[i])
        n = -(-inp // block_size) if inp > 0 else 0
        hashes = [h & MASK64 for h in row["hash_ids"][:n]]
        rec = {
            "schema": DYNAMO_SCHEMA,  # first, so a reader sniffing the head of the file finds it
            "event_type": "request_end",
            "event_time_unix_ms": math.ceil(t),
            "request": {
                "request_id": rid,
                "model": MODEL_PLACEHOLDER,
                "output_tokens": int(w.output_len[i]),
                "request_received_ms": _number(t),
                "replay": {"trace_block_size": block_size, "input_length": inp, "input_sequence_hashes": hashes},
            },
        }
        yield t, json.dumps(rec, allow_nan=False)


# -- writing ------------------------------------------------------------------------------
def _write_all(files: list[tuple[Path, list[str]]], on_commit: Callable[[], None] | None) -> None:
    """Every file to a temporary sibling first; then all renamed into place back to back."""
    temps: list[tuple[Path, Path]] = []
    current = files[0][0]
    try:
        for current, lines in files:
            temps.append((write_temp(current, (line + "\n" for line in lines)), current))
        if on_commit is not None:
            on_commit()
        with _signals_held():
            for tmp, current in temps:
                os.replace(tmp, current)
            temps = []
    except OSError as exc:
        raise InputError(str(current), f"cannot write: {exc.strerror or exc}") from None
    finally:
        for tmp, _ in temps:
            discard(tmp)
    for parent in {os.path.realpath(p.parent if str(p.parent) else ".") for p, _ in files}:
        fsync_dir(parent)


class _signals_held:
    """Hold SIGINT/SIGTERM off (main thread only) so the renames finish together; a signal that
    arrives meanwhile is delivered right after."""

    SIGNALS = {signal.SIGINT, signal.SIGTERM}

    def __enter__(self):
        self.old = None
        if hasattr(signal, "pthread_sigmask") and threading.current_thread() is threading.main_thread():
            self.old = signal.pthread_sigmask(signal.SIG_BLOCK, self.SIGNALS)
        return self

    def __exit__(self, *exc) -> None:
        if self.old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self.old)


