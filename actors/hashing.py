"""Chained 64-bit block hashes shared by engine workers and routers.

A request's token sequence is described by *pieces*: ``(source, length)`` pairs. Token ``o``
of a piece is the pair ``(source, o)``: two pieces with the same source hold the same tokens
at the same offsets. A trace ``hash_id`` becomes one piece of one trace block (the last one
may be partial); a request's generated output is one piece with a request-unique source.

An engine block of ``block_size`` tokens gets a *content key*: ``mix(source, offset)`` when it
lies inside one piece, a fold over its parts when it straddles pieces. Block ``j``'s chained
hash is the polynomial ``H_j = H_{j-1} * P + key_j (mod 2**64)`` with ``H_{-1} = 0``, so equal
hashes mean equal prefixes (up to 64-bit collisions). The polynomial form lets numpy hash many
sequences at once: ``H_j = P**j * sum_{i<=j} key_i * P**-i``.
"""

from __future__ import annotations

from array import array

import numpy as np

MASK64 = (1 << 64) - 1
CHAIN_P = 0x9E3779B97F4A7C15  # odd: invertible modulo 2**64
CHAIN_P_INV = pow(CHAIN_P, -1, 1 << 64)
_FOLD_INIT = 0x243F6A8885A308D3
_FOLD_MUL = 0x100000001B3

# Namespaces keep trace hash ids and generated sources apart.
NS_TRACE = 0x5EED000000000001
NS_UNIQUE = 0x0DD5000000000002

_U64 = np.uint64


def hash_view(hashes) -> memoryview:
    """Block hashes as engines and routers take them: a read-only ``memoryview`` (format ``Q``,
    unsigned 64-bit) over its own buffer. Indexing gives Python ints, slicing gives views (no
    copy), so KV runs view the hashes instead of holding one int object per block. Accepts such
    a view (returned as it is), the bytes of one (as msgpack carries a view across processes), a
    uint64 array or an iterable of ints."""
    if isinstance(hashes, memoryview):
        return hashes
    if isinstance(hashes, bytes):
        return memoryview(hashes).cast("Q")
    if isinstance(hashes, np.ndarray):
        return memoryview(np.ascontiguousarray(hashes, dtype=_U64).tobytes()).cast("Q")
    return memoryview(array("Q", hashes).tobytes()).cast("Q")


def splitmix64(x: int) -> int:
    """Scalar splitmix64 finaliser on Python ints (64-bit wrap)."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def splitmix64_array(x: np.ndarray) -> np.ndarray:
    """Vectorised splitmix64 over a uint64 array (wrapping arithmetic)."""
    x = x + _U64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> _U64(27))) * _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))


def trace_sources(hash_ids: np.ndarray) -> np.ndarray:
    """Source ids of trace block ids (uint64 view of the 64-bit ids, never truncated)."""
    return splitmix64_array(hash_ids.astype(_U64, copy=False) ^ _U64(NS_TRACE))


def unique_sources(tag: int, indices: np.ndarray) -> np.ndarray:
    """Sources private to generated pieces: ``tag`` separates kinds, ``indices`` instances."""
    base = splitmix64((tag & MASK64) ^ NS_UNIQUE)
    return splitmix64_array(indices.astype(_U64) ^ _U64(base))


def _part_key(source: int, offset: int) -> int:
    return splitmix64(source ^ splitmix64(offset))


_offset_mix: dict[str, np.ndarray] = {}


def _mixed_offsets(offsets: np.ndarray) -> np.ndarray:
    """``splitmix64_array(offsets)``: looked up in a table of the first offsets (grown by
    doubling, a pure function like ``_powers``) when they are small, as block offsets are."""
    top = int(offsets.max()) if len(offsets) else 0
    if top >= 1 << 20:
        return splitmix64_array(offsets.astype(_U64))
    table = _offset_mix.get("t")
    if table is None or len(table) <= top:
        size = 4096
        while size <= top:
            size *= 2
        table = _offset_mix["t"] = splitmix64_array(np.arange(size, dtype=_U64))
    return table[offsets]


def _part_keys(sources: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    return splitmix64_array(sources ^ _mixed_offsets(offsets))


def _fold(acc, part_key, take):
    """One step of the straddling-block fold (works on ints and uint64 arrays alike)."""
    if isinstance(acc, np.ndarray):
        return splitmix64_array(acc ^ part_key ^ (take.astype(_U64) * _U64(_FOLD_MUL)))
    return splitmix64(acc ^ part_key ^ ((take * _FOLD_MUL) & MASK64))


def block_keys(sources: np.ndarray, lengths: np.ndarray, block_starts: np.ndarray, block_size: int,
               piece: np.ndarray | None = None) -> np.ndarray:
    """Content keys of full blocks starting at token positions ``block_starts``.

    ``sources``/``lengths`` describe pieces laid end to end (one global token axis); each block
    must lie inside the pieces' total length. ``piece``: the piece each block starts in, when
    the caller knows it (else found by a search of the piece ends).
    """
    if len(block_starts) == 0:
        return np.zeros(0, dtype=_U64)
    ends = np.cumsum(lengths)
    if piece is None:
        piece = np.searchsorted(ends, block_starts, side="right")
    length = lengths[piece]
    offset = block_starts - (ends - lengths)[piece]
    keys = _part_keys(sources[piece], offset)
    straddle = np.nonzero(offset + block_size > length)[0]
    if len(straddle):
        p = piece[straddle]
        off = offset[straddle]
        take1 = lengths[p] - off
        take2 = block_size - take1
        q = np.minimum(p + 1, len(lengths) - 1)
        two = (p + 1 < len(lengths)) & (take2 <= lengths[q])
        s2 = straddle[two]
        if len(s2):
            acc = _fold(np.full(len(s2), _FOLD_INIT, dtype=_U64), _part_keys(sources[p[two]], off[two]), take1[two])
            acc = _fold(acc, _part_keys(sources[q[two]], np.zeros(len(s2), dtype=np.int64)), take2[two])
            keys[s2] = acc
        for j in straddle[~two].tolist():  # three or more parts: rare, scalar fold
            keys[j] = _straddle_key(sources, lengths, int(piece[j]), int(offset[j]), block_size)
    return keys


def _straddle_key(sources, lengths, p: int, offset: int, block_size: int) -> int:
    acc = _FOLD_INIT
    left = block_size
    while left > 0:
        take = min(int(lengths[p]) - offset, left)
        acc = _fold(acc, _part_key(int(sources[p]), offset), take)
        left -= take
        p += 1
        offset = 0
    return acc


_pow_cache: dict[str, np.ndarray] = {}


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``P**i`` and ``P**-i`` for ``i < n`` (grown by doubling; pure function of ``n``)."""
    have = _pow_cache.get("p")
    if have is None or len(have) < n:
        size = 1024
        while size < n:
            size *= 2
        p = np.full(size, CHAIN_P, dtype=_U64)
        p[0] = 1
        pinv = np.full(size, CHAIN_P_INV, dtype=_U64)
        pinv[0] = 1
        _pow_cache["p"] = np.cumprod(p, dtype=_U64)
        _pow_cache["pinv"] = np.cumprod(pinv, dtype=_U64)
    return _pow_cache["p"], _pow_cache["pinv"]


def chain_hashes(keys: np.ndarray, seq_starts: np.ndarray | None = None, local: np.ndarray | None = None) -> np.ndarray:
    """Chained hashes of one sequence of block keys, or of many laid end to end.

    ``seq_starts``: start offsets of the sequences in ``keys`` (ascending, first 0);
    ``local``: each key's position in its sequence, when the caller has it.
    """
    total = len(keys)
    if total == 0:
        return keys.copy()
    if seq_starts is None:
        pw, pinv = _powers(total)
        return pw[:total] * np.cumsum(keys * pinv[:total], dtype=_U64)
    counts = np.diff(np.append(seq_starts, total))
    if local is None:
        local = np.arange(total, dtype=np.int64) - np.repeat(seq_starts, counts)
    pw, pinv = _powers(int(local.max()) + 1)
    acc = np.cumsum(keys * pinv[local], dtype=_U64)
    before = np.zeros(len(seq_starts), dtype=_U64)
    nz = seq_starts > 0
    before[nz] = acc[seq_starts[nz] - 1]
    acc -= np.repeat(before, counts)  # wrapping subtraction: per-sequence prefix sums
    return pw[local] * acc


def sequence_hashes(sources: np.ndarray, lengths: np.ndarray, block_size: int, num_blocks: int) -> np.ndarray:
    """Chained hashes of the first ``num_blocks`` full blocks of one piece sequence."""
    starts = np.arange(num_blocks, dtype=np.int64) * block_size
    return chain_hashes(block_keys(sources, lengths, starts, block_size))
