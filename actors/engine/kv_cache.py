"""KV block manager of one rank: active blocks with reference counts, an LRU pool of
cached inactive blocks, and private blocks.

Semantics (vLLM v1 / the reference mocker):

- A full block is identified by its chained hash. Blocks a request will have filled by the
  end of a pass are registered (made visible to prefix lookups) when that pass is scheduled.
- A partial block is private to its request. A block that fills while an identical block is
  already cached stays a private copy: it uses capacity while its request runs and is freed,
  not cached, when the request releases it.
- Releasing a request decrements its shared blocks; those reaching zero join the LRU pool
  tail-first (the last block of the sequence first), so leaves are evicted before parents.
- A new slot takes a free block or evicts the least recently released cached block.

Representation (chosen for speed, see BENCHMARKS.md): one dict ``refs`` maps a cached hash to
``1`` (active) or to ``-stamp`` (inactive; ``stamp`` numbers the release batch that made it
inactive). Holders beyond the first of an active block are counted in the small dict
``extra`` (only concurrently shared blocks, e.g. a common system prompt), so releasing a
request is one write per block. Release batches sit in a deque in LRU order; a block that is
reactivated leaves a stale entry there, and eviction checks entries only in batches that have
one (``_stale``). Every hot operation is a C-level bulk call over the request's hash list.
"""

from __future__ import annotations

from collections import deque
from itertools import compress, islice, repeat, takewhile

try:  # C helper behind Counter.update: counts an iterable into a dict at C speed
    from collections import _count_elements  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - every CPython has it

    def _count_elements(mapping, iterable):
        get = mapping.get
        for elem in iterable:
            mapping[elem] = get(elem, 0) + 1


# KV event kinds (published to routers at pass end)
STORED = 1
REMOVED = 2

_ONE_EQ = (1).__eq__
_ZERO_LT = (0).__lt__
_ZERO_GT = (0).__gt__


class KVCache:
    """Per-rank block pool. Capacity misses are return values, never exceptions."""

    __slots__ = (
        "capacity",
        "block_size",
        "prefix_caching",
        "refs",
        "num_active_shared",
        "num_inactive",
        "num_private",
        "events",
        "num_evicted",
        "extra",
        "_batches",
        "_batch_entries",
        "_stamp",
        "_stale",
    )

    def __init__(self, capacity_blocks: int, block_size: int, prefix_caching: bool = True, record_events: bool = False):
        self.capacity = int(capacity_blocks)
        self.block_size = int(block_size)
        self.prefix_caching = bool(prefix_caching)
        self.refs: dict[int, int] = {}  # 1 = active, -stamp = cached inactive
        self.extra: dict[int, int] = {}  # active blocks with more than one holder: holders - 1
        self.num_active_shared = 0
        self.num_inactive = 0
        self.num_private = 0
        self.events: list[tuple[int, list[int]]] | None = [] if record_events else None
        self.num_evicted = 0
        self._batches: deque[list] = deque()  # [neg_stamp, keys (eviction order), next position]
        self._batch_entries = 0
        self._stamp = 0
        self._stale: set[int] = set()  # batches (by -stamp) holding reactivated entries

    # -- capacity -----------------------------------------------------------------
    @property
    def num_active(self) -> int:
        """Blocks held by live requests (shared + private)."""
        return self.num_active_shared + self.num_private

    @property
    def num_free(self) -> int:
        return self.capacity - self.num_active_shared - self.num_private - self.num_inactive

    @property
    def num_reclaimable(self) -> int:
        """Blocks a new allocation could obtain (free + evictable)."""
        return self.capacity - self.num_active_shared - self.num_private

    # -- prefix lookup --------------------------------------------------------------
    def match_prefix(self, hashes: list[int], limit_blocks: int) -> tuple[list[int], int]:
        """Longest resident chain among the first ``limit_blocks`` hashes.

        Returns the hit hashes and how many of them are currently active.
        """
        if limit_blocks <= 0 or not self.prefix_caching:
            return [], 0
        refs = self.refs
        hits = list(takewhile(refs.__contains__, islice(hashes, limit_blocks)))
        if not hits:
            return hits, 0
        return hits, sum(map(_ZERO_LT, map(refs.__getitem__, hits)))

    def acquire(self, req, hits: list[int]) -> None:
        """Make ``hits`` (a resident prefix) held by ``req``; takes ownership of the list."""
        if hits:
            refs = self.refs
            vals = list(map(refs.__getitem__, hits))
            n_active = vals.count(1)
            if n_active:
                _count_elements(self.extra, compress(hits, map(_ONE_EQ, vals)))
            if n_active != len(hits):
                inactive = list(compress(hits, map(_ZERO_GT, vals)))
                self._stale.update(compress(vals, map(_ZERO_GT, vals)))
                refs.update(zip(inactive, repeat(1)))
                self.num_inactive -= len(inactive)
                self.num_active_shared += len(inactive)
        req.held = hits
        req.num_full_registered = len(hits)

    # -- allocation -----------------------------------------------------------------
    def grow(self, req, target_tokens: int, hashes: list[int] | None) -> bool:
        """Give ``req`` slots for ``target_tokens`` computed tokens and register its full blocks.

        Returns False (changing nothing) when free + evictable blocks do not suffice.
        """
        bs = self.block_size
        need = -(-target_tokens // bs) - len(req.held) - req.num_private
        if need > 0:
            if not self.reserve(need):
                return False
            req.num_private += need
        full = target_tokens // bs
        if full > req.num_full_registered and self.prefix_caching:
            self.register(req, hashes[req.num_full_registered : full])
            req.num_full_registered = full
        return True

    def reserve(self, num_blocks: int) -> bool:
        """Take ``num_blocks`` private slots, evicting LRU blocks as needed."""
        free = self.capacity - self.num_active_shared - self.num_private - self.num_inactive
        if num_blocks > free:
            evict = num_blocks - free
            if evict > self.num_inactive:
                return False
            self._evict(evict)
        self.num_private += num_blocks
        return True

    def register(self, req, new: list[int]) -> None:
        """Turn ``req``'s private slots for the full blocks ``new`` into shared cached blocks."""
        refs = self.refs
        if refs.keys().isdisjoint(new):
            refs.update(zip(new, repeat(1)))
            req.held.extend(new)
            stored = new
        else:
            stored = []
            for h in new:
                if h in refs:
                    continue  # identical block already cached: this copy stays private
                refs[h] = 1
                req.held.append(h)
                stored.append(h)
        n = len(stored)
        req.num_private -= n
        self.num_private -= n
        self.num_active_shared += n
        if self.events is not None and stored:
            self.events.append((STORED, list(stored)))

    def _evict(self, count: int) -> None:
        refs = self.refs
        batches = self._batches
        stale = self._stale
        victims: list[int] = []
        while len(victims) < count:
            batch = batches[0]
            stamp, keys, pos = batch
            need = count - len(victims)
            chunk = keys[pos : pos + need] if pos or need < len(keys) else keys
            batch[2] = pos + len(chunk)
            if stamp in stale:
                victims.extend(compress(chunk, map(stamp.__eq__, map(refs.get, chunk))))
            else:
                victims.extend(chunk)
            if batch[2] >= len(keys):
                batches.popleft()
                stale.discard(stamp)
                self._batch_entries -= len(keys)
        deque(map(refs.__delitem__, victims), 0)
        self.num_inactive -= count
        self.num_evicted += count
        if self.events is not None:
            self.events.append((REMOVED, victims))

    # -- release --------------------------------------------------------------------
    def release(self, req) -> None:
        """Free everything ``req`` holds (completion or preemption)."""
        held = req.held
        if held:
            extra = self.extra
            if not extra:
                zeros = held[::-1]  # tail first: leaves are evicted before their parents
            else:
                # Blocks other live requests also hold are usually a prefix of ``held`` (others
                # got them as a prefix hit); a request that filled a block while an identical one
                # was cached holds a gapped chain, which the general path below handles.
                k = len(list(takewhile(extra.__contains__, held)))
                if extra.keys().isdisjoint(islice(held, k, None)):
                    shared = held[:k]
                    zeros = held[: k - 1 : -1] if k else held[::-1]
                else:
                    flags = list(map(extra.__contains__, held))
                    shared = list(compress(held, flags))
                    zeros = [h for h, f in zip(reversed(held), reversed(flags)) if not f]
                for h in shared:
                    c = extra[h] - 1
                    if c:
                        extra[h] = c
                    else:
                        del extra[h]
            if zeros:
                self._stamp += 1
                neg = -self._stamp
                self.refs.update(zip(zeros, repeat(neg)))
                self._batches.append([neg, zeros, 0])
                n = len(zeros)
                self._batch_entries += n
                self.num_inactive += n
                self.num_active_shared -= n
                if self._batch_entries > 2 * self.num_inactive + 4096:
                    self._compact()
            req.held = []
        self.num_private -= req.num_private
        req.num_private = 0
        req.num_full_registered = 0

    def _compact(self) -> None:
        """Drop stale LRU entries (blocks reactivated or re-released since)."""
        refs = self.refs
        kept: deque[list] = deque()
        total = 0
        for stamp, keys, pos in self._batches:
            live = list(compress(islice(keys, pos, None), map(stamp.__eq__, map(refs.get, islice(keys, pos, None)))))
            if live:
                kept.append([stamp, live, 0])
                total += len(live)
        self._batches = kept
        self._batch_entries = total
        self._stale.clear()

    # -- warm start (retune window replays) ----------------------------------------------
    def contents(self) -> list[int]:
        """Every resident block, next eviction first: the cached inactive ones in LRU order, then
        the active ones (released later, so evicted later)."""
        return self.lru_order() + [h for h, c in self.refs.items() if c > 0]

    def preload(self, hashes: list[int]) -> None:
        """Start from ``hashes`` cached and inactive (``contents()`` of another cache, next eviction
        first; the most recent ``capacity`` of them fit). Only on an empty cache; no KV events."""
        if self.refs:
            raise RuntimeError("preload needs an empty KV cache")
        if not self.prefix_caching:
            return
        keep = list(dict.fromkeys(hashes))[-self.capacity:] if self.capacity > 0 else []
        if not keep:
            return
        self._stamp += 1
        neg = -self._stamp
        self.refs.update(zip(keep, repeat(neg)))
        self._batches.append([neg, keep, 0])
        self._batch_entries += len(keep)
        self.num_inactive += len(keep)

    # -- introspection (tests, planner) ----------------------------------------------
    def lru_order(self) -> list[int]:
        """Cached inactive blocks, next eviction first."""
        refs = self.refs
        out = []
        for stamp, keys, pos in self._batches:
            out.extend(h for h in keys[pos:] if refs.get(h) == stamp)
        return out

    def check_invariants(self) -> None:
        active = sum(1 for c in self.refs.values() if c > 0)
        inactive = sum(1 for c in self.refs.values() if c < 0)
        assert set(self.refs.values()) <= {1} | {v for v in self.refs.values() if v < 0}
        assert all(self.refs.get(h) == 1 and c > 0 for h, c in self.extra.items())
        assert active == self.num_active_shared, (active, self.num_active_shared)
        assert inactive == self.num_inactive, (inactive, self.num_inactive)
        assert len(self.lru_order()) == inactive
        assert self.num_private >= 0
        assert self.num_active + self.num_inactive <= self.capacity
