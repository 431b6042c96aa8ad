"""Columnar request set of one replay and the block-hash store the engine reads from.

Rows are kept as numpy columns (a million-request trace stays small); the token content of
a request is a run of pieces (see ``actors.hashing``): its prompt pieces, then one output
piece private to the request. Block hashes are computed lazily, a chunk of consecutive
requests at a time, for each engine block size in use.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field, fields
from functools import cached_property

import numpy as np

from aisim.actors import hashing
from aisim.actors.engine.radix_cache import TokenSeq
from aisim.simulator.spill import SpilledArray

OUTPUT_TAG = 0x0_0777  # generated-output pieces
UNIQUE_PROMPT_TAG = 0x0_0888  # prompt tokens private to one request (synthetic traffic)


def _read_only(fields: dict) -> None:
    for v in fields.values():
        if isinstance(v, np.ndarray):
            v.setflags(write=False)


@dataclass(frozen=True)
class Workload:
    """Requests of a replay, in stable order (index = stable id for same-time ties).

    A value: frozen, and its columns are made read-only, so one workload can back any number
    of runs (and be shipped to engine hosts) without any run changing what the next one sees."""

    input_len: np.ndarray  # int64
    output_len: np.ndarray  # int64 (requested output tokens)
    timestamp_ms: np.ndarray  # float64: trace timestamp / authored arrival (NaN if none)
    piece_ptr: np.ndarray  # int64, n+1: prompt pieces of request i are [ptr[i], ptr[i+1])
    piece_src: np.ndarray  # uint64
    piece_len: np.ndarray  # int64 (int32 from a trace: block-sized pieces)
    session_index: np.ndarray | None = None  # int64 per request, -1 = no session
    turn_index: np.ndarray | None = None  # int64 per request
    delay_ms: np.ndarray | None = None  # float64: delay after the previous turn completes
    session_names: list[str] = field(default_factory=list)
    request_ids: list[str] | None = None
    description: str = ""
    # recorded traces (dynamo): each request's recorded total time (NaN: not recorded) and the
    # absolute time of t = 0 (timestamps are relative to it), for windows of the recorded run
    recorded_total_ms: np.ndarray | None = None
    origin_ms: float = 0.0

    def __post_init__(self) -> None:
        _read_only(self.__dict__)

    def __setstate__(self, state: dict) -> None:  # unpickled arrays come back writable
        _read_only(state)
        self.__dict__.update(state)

    def __len__(self) -> int:
        return len(self.input_len)

    @property
    def num_requests(self) -> int:
        return len(self.input_len)

    def has_sessions(self) -> bool:
        return self.session_index is not None and bool((self.session_index >= 0).any())

    def session_name(self, i: int) -> str | None:
        if self.session_index is None:
            return None
        s = int(self.session_index[i])
        return self.session_names[s] if s >= 0 else None

    def subset(self, indices, shift_ms: float = 0.0) -> "Workload":
        """The requests at ``indices`` (ascending), as a workload of their own: the same prompt
        content (so shared prefixes stay shared; each output is private to its request, as
        before), timestamps less ``shift_ms``, request ids kept (a request keeps its uuid in
        reports). Session traces cannot be cut into windows."""
        if self.has_sessions():
            raise ValueError("a workload with sessions cannot be subset")
        idx = np.asarray(indices, dtype=np.int64)
        start = self.piece_ptr[idx]
        counts = self.piece_ptr[idx + 1] - start
        ptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        # the pieces of every selected request, in order: start + 0 .. count - 1
        pieces = np.repeat(start - ptr[:-1], counts) + np.arange(int(ptr[-1]), dtype=np.int64)
        ids = self.request_ids if self.request_ids is not None else [self.request_uuid(int(i)) for i in range(len(self))]
        return Workload(
            input_len=self.input_len[idx].copy(),
            output_len=self.output_len[idx].copy(),
            timestamp_ms=self.timestamp_ms[idx] - shift_ms,
            piece_ptr=ptr,
            piece_src=self.piece_src[pieces],
            piece_len=self.piece_len[pieces],
            request_ids=[ids[int(i)] for i in idx],
            description=f"{self.description} [{len(idx)} of {len(self)} requests]",
            recorded_total_ms=None if self.recorded_total_ms is None else self.recorded_total_ms[idx].copy(),
            origin_ms=self.origin_ms + shift_ms,
        )

    @cached_property
    def digest(self) -> str:
        """A content digest (sha256 of every column): equal digests, equal workloads."""
        h = hashlib.sha256()
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, SpilledArray):  # (the same bytes, read a range at a time)
                h.update(f"{f.name}:{v.dtype.str}:{v.shape}".encode())
                for part in v.chunks():
                    h.update(part.tobytes())
            elif isinstance(v, np.ndarray):
                h.update(f"{f.name}:{v.dtype.str}:{v.shape}".encode())
                h.update(np.ascontiguousarray(v).tobytes())
            else:
                h.update(f"{f.name}:{v!r}".encode())
        return h.hexdigest()

    def request_uuid(self, i: int) -> str:
        if self.request_ids is not None and self.request_ids[i] is not None:
            return self.request_ids[i]
        return f"req-{i:07d}"


def output_sources(lo: int, hi: int) -> np.ndarray:
    """The sources of the output pieces of requests ``lo .. hi - 1`` (one private piece each)."""
    return hashing.unique_sources(OUTPUT_TAG, np.arange(lo, hi, dtype=np.int64))


class BlockHashStore:
    """Implements ``HashSource``: chained hashes of prompt + output blocks per request.

    Per run (or per engine host), never part of a plan: its chunk cache is pure memoisation
    (a chunk's hashes depend only on the workload and the block size), bounded to ``max_chunks``."""

    CHUNK = 512

    def __init__(self, workload: Workload, max_chunks: int = 8) -> None:
        self.w = workload
        self.max_chunks = max_chunks
        # (chunk, block size) -> (the chunk's hashes as bytes, byte offset of each request's)
        self._chunks: OrderedDict[tuple[int, int], tuple[bytes, list[int]]] = OrderedDict()

    def block_hashes(self, index: int, block_size: int) -> memoryview:
        """The request's hashes as ``actors.hashing.hash_view`` gives them (its own buffer)."""
        c = index // self.CHUNK
        key = (c, block_size)
        got = self._chunks.get(key)
        if got is None:
            hashes, starts = self._compute(c, block_size)
            got = self._chunks[key] = (hashes.tobytes(), (starts * hashes.itemsize).tolist())
            if len(self._chunks) > self.max_chunks:
                self._chunks.popitem(last=False)
        else:
            self._chunks.move_to_end(key)
        raw, starts = got
        j = index - c * self.CHUNK
        return hashing.hash_view(raw[starts[j] : starts[j + 1]])  # (a copy: the chunk is not kept alive)

    def token_pieces(self, index: int) -> TokenSeq:
        """The request's tokens as pieces (its prompt's, then its output's): what an SGLang radix
        cache compares."""
        w = self.w
        p0, p1 = w.piece_ptr[index : index + 2].tolist()
        src = w.piece_src[p0:p1].tolist()
        ends = np.cumsum(w.piece_len[p0:p1], dtype=np.int64).tolist()
        src.append(int(output_sources(index, index + 1)[0]))
        ends.append((ends[-1] if ends else 0) + max(int(w.output_len[index]), 1))
        return TokenSeq(src, ends)

    def _compute(self, c: int, bs: int) -> tuple[np.ndarray, np.ndarray]:
        w = self.w
        lo = c * self.CHUNK
        hi = min(w.num_requests, lo + self.CHUNK)
        ptr = w.piece_ptr
        p0, p1 = int(ptr[lo]), int(ptr[hi])
        counts = np.diff(ptr[lo : hi + 1])  # prompt pieces per request
        nreq = hi - lo
        # interleave each request's prompt pieces with its output piece
        total = (p1 - p0) + nreq
        out_pos = np.cumsum(counts + 1) - 1  # position of each output piece
        is_out = np.zeros(total, dtype=bool)
        is_out[out_pos] = True
        src = np.empty(total, dtype=np.uint64)
        lens = np.empty(total, dtype=np.int64)
        src[~is_out] = w.piece_src[p0:p1]
        lens[~is_out] = w.piece_len[p0:p1]
        src[out_pos] = output_sources(lo, hi)
        out_len = w.output_len[lo:hi]
        lens[out_pos] = np.maximum(out_len, 1)
        seq_len = w.input_len[lo:hi] + out_len
        # the KV never holds the last generated token
        nblocks = np.maximum(seq_len - 1, 0) // bs
        tok_base = np.concatenate(([0], np.cumsum(w.input_len[lo:hi] + np.maximum(out_len, 1))[:-1]))
        block_ptr = np.concatenate(([0], np.cumsum(nblocks)))
        nb_total = int(block_ptr[-1])
        local = np.arange(nb_total, dtype=np.int64) - np.repeat(block_ptr[:-1], nblocks)
        starts_tok = np.repeat(tok_base, nblocks) + local * bs
        # the piece each block starts in, counted per piece (the blocks of a request start at
        # multiples of bs from its first token): what a search of the piece ends would find
        piece_req = np.repeat(np.arange(nreq), counts + 1)
        piece_end = np.cumsum(lens) - np.repeat(tok_base, counts + 1)  # request-local
        first = -(-(piece_end - lens) // bs)
        last = np.minimum(-(-piece_end // bs), nblocks[piece_req])
        piece = np.repeat(np.arange(total), np.maximum(last - first, 0))
        keys = hashing.block_keys(src, lens, starts_tok, bs, piece)
        hashes = hashing.chain_hashes(keys, block_ptr[:-1][nblocks > 0], local) if nb_total else keys
        return hashes, block_ptr
