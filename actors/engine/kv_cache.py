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

Representation (chosen for speed, see BENCHMARKS.md): resident blocks live in *runs*
(``_Run``): consecutive blocks of one hash chain that share one state (held by the same
number of live requests, or cached inactive since the same release). Bookkeeping costs one
step per run, not per block: a prefill chunk registers as one run, a request's release moves
its runs to the LRU pool as one batch, and eviction takes whole runs (or the tail of one).
A run is split where a request's prefix hit ends inside it, and a request's new blocks start a
new run after one that is not a view of its own hashes.

A run's keys are a read-only view (``memoryview``, format ``Q``) of the hashes of the request
that registered them, never a copy: registering, splitting, growing and cutting a run make a
new view in O(1), and no Python int exists per block (indexing makes one on the fly; the hash
buffer is freed when the last run viewing it goes).

Only the first hash of each run is indexed (``_heads``). That suffices because hashes are
chained: a resident block whose parent is resident lies in its parent's run or starts a run,
so a prefix lookup goes run by run (one dict probe and one comparison of the run's last key
per run, a binary search where the prefix ends inside a run), and a block filled right
after a block its request holds is already cached only if its hash starts a run.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from aisim.actors.hashing import hash_view

# KV event kinds (published to routers at pass end). A STORED event is blocks that were not
# resident, consecutive in one chain (parent first); a REMOVED event is evicted blocks in
# eviction order: stretches of a chain, each from its last block back (a block is evicted with or
# after its descendants). An event's hashes are a read-only view (``actors.hashing.hash_view``;
# a STORED event's views the registering request's hashes, as the cache's runs do).
STORED = 1
REMOVED = 2

_NO_KEYS = hash_view(b"")  # a fully evicted run's keys
_NOT_LOOSE = object()
_LOW = -1  # the anchor of the loose runs below LOOSE_SPAN (no hash: they are unsigned)
LOOSE_SPAN = 16  # positions per anchor of the loose runs (``KVCache.mark_loose``; a power of two)


class _Run:
    """Consecutive blocks of one chain in one state.

    ``keys``: the chained hashes, parent first (a view of the registering request's hashes).
    ``holders``: live requests holding the run (0: cached inactive, in the release batch
    numbered ``stamp``). ``tail``: the run split off this one's end while requests held both (a
    holder's ``(run, n)`` record covers ``n`` blocks along this link). ``marks``: (offset,
    insertion number, index in that insertion) where the blocks from ``offset`` on were made
    resident (orders ``contents()``)."""

    __slots__ = ("keys", "holders", "stamp", "tail", "marks")

    def __init__(self, keys: memoryview, holders: int, marks: list) -> None:
        self.keys = keys
        self.holders = holders
        self.stamp = 0
        self.tail: _Run | None = None
        self.marks = marks


def _split_marks(marks: list, at: int) -> tuple[list, list]:
    """Marks of the blocks before ``at`` and of those from ``at`` on (offsets rebased)."""
    head = []
    tail = []
    for off, seq, idx in marks:
        if off < at:
            head.append((off, seq, idx))
        else:
            tail.append((off - at, seq, idx))
    if not tail or tail[0][0] != 0:
        off, seq, idx = head[-1]
        tail.insert(0, (0, seq, idx + at - off))
    return head, tail


def agreeing(keys: Sequence[int], off: int, hashes: Sequence[int], pos: int, end: int) -> int:
    """How many blocks ``keys[off:]`` and ``hashes[pos:end]`` share from the start, given that
    ``keys[off] == hashes[pos]``. Equal chained hashes mean equal prefixes, so agreement holds up
    to some point and never after it: compare the last candidate, else binary-search."""
    n = len(keys) - off
    if n > end - pos:
        n = end - pos
    if keys[off + n - 1] == hashes[pos + n - 1]:
        return n
    lo, hi = 1, n - 1  # keys[off + lo - 1] agrees, keys[off + hi] does not
    while lo < hi:
        mid = (lo + hi) >> 1
        if keys[off + mid] == hashes[pos + mid]:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _cut_tail(run: _Run, cut: int) -> None:
    """Keep the first ``cut`` (>= 1) blocks of ``run``."""
    run.keys = run.keys[:cut]
    marks = run.marks
    while marks[-1][0] >= cut:
        marks.pop()


class KVCache:
    """Per-rank block pool. Capacity misses are return values, never exceptions.

    A request's holdings live on the request: ``held`` (a list of ``(run, n)`` records, chain
    order: the first ``n`` blocks along the run and its split-off tails), ``num_held`` (shared
    blocks held), ``num_private`` (slots not shared: partial blocks and private copies),
    ``num_full_registered`` (full blocks accounted for, held or private) and ``dup_tail``
    (whether the last of those is a private copy)."""

    __slots__ = (
        "capacity",
        "block_size",
        "prefix_caching",
        "num_active_shared",
        "num_inactive",
        "num_private",
        "num_refs",
        "events",
        "num_evicted",
        "_heads",
        "_batches",
        "_batch_entries",
        "_stamp",
        "_seq",
        "_loose",
        "_loose_near",
        "_num_unplaced",
        "watch",
        "fenced",
        "removed_ids",
    )

    def __init__(self, capacity_blocks: int, block_size: int, prefix_caching: bool = True, record_events: bool = False):
        self.capacity = int(capacity_blocks)
        self.block_size = int(block_size)
        self.prefix_caching = bool(prefix_caching)
        self.num_active_shared = 0
        self.num_inactive = 0
        self.num_private = 0
        self.num_refs = 0  # blocks the live requests hold, each counted per holder (shared ones too)
        self.events: list[tuple[int, memoryview]] | None = [] if record_events else None
        self.num_evicted = 0
        self._heads: dict[int, _Run] = {}  # first hash of each resident run -> run
        self._batches: deque[list] = deque()  # [stamp, runs (eviction order), next position]
        self._batch_entries = 0
        self._stamp = 0
        self._seq = 0  # numbers insertions (contents() lists active blocks in insertion order)
        # first hash -> anchor (see ``mark_loose``) of the runs whose first block's parent may be
        # evicted before them (see ``_starts_run``); None: chain and position unknown (preloaded)
        self._loose: dict[int, int | None] = {}
        self._loose_near: dict[int, dict[int, int]] = {}  # anchor -> {first hash: chain position}
        self._num_unplaced = 0  # entries of ``_loose`` at None
        # host offload: the blocks stores are still copying to host memory; an eviction that
        # overwrites such a block appends its hash to ``fenced`` (the pass waits for the copy)
        self.watch: set | None = None
        self.fenced: list = []
        # a host tier's evictions by block identity (no REMOVED events): ``(seq, index, count)``
        # per evicted stretch, flat - the stretch's first block is the ``index``-th stored by
        # registration ``seq`` (the run's first mark; a host tier's runs have one mark each)
        self.removed_ids: list | None = None

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
    def match_prefix(self, hashes: Sequence[int], limit_blocks: int) -> tuple[int, int, list]:
        """Longest resident chain among the first ``limit_blocks`` hashes.

        Returns how many blocks hit, how many of them are currently active, and the hit as
        ``(run, n)`` pieces for ``acquire``.
        """
        if limit_blocks <= 0 or not self.prefix_caching:
            return 0, 0, []
        get = self._heads.get
        path = []
        pos = num_active = 0
        while pos < limit_blocks:
            run = get(hashes[pos])
            if run is None:
                break
            n = agreeing(run.keys, 0, hashes, pos, limit_blocks)
            path.append((run, n))
            if run.holders:
                num_active += n
            pos += n
        return pos, num_active, path

    def acquire(self, req, path: list) -> None:
        """Make the hit ``path`` (from ``match_prefix``, nothing changed since) held by ``req``."""
        held = []
        total = 0
        for run, n in path:
            if n < len(run.keys):
                run = self._split(run, n)
            if run.holders:
                run.holders += 1
            else:
                run.holders = 1
                self.num_inactive -= n
                self.num_active_shared += n
            held.append((run, n))
            total += n
        req.held = held
        req.num_held = total
        self.num_refs += total
        req.num_full_registered = total
        req.dup_tail = False

    def _split(self, run: _Run, at: int) -> _Run:
        """Split ``run`` after its first ``at`` blocks; returns the part holding them."""
        keys = run.keys
        head_marks, tail_marks = _split_marks(run.marks, at)
        if run.holders:
            # holders keep their records on ``run``: the tail part follows it by the link
            tail = _Run(keys[at:], run.holders, tail_marks)
            tail.stamp = run.stamp
            tail.tail = run.tail
            run.keys = keys[:at]
            run.marks = head_marks
            run.tail = tail
            self._heads[tail.keys[0]] = tail
            return run
        # cached inactive: the tail part keeps its place in its release batch
        head = _Run(keys[:at], 0, head_marks)
        run.keys = keys = keys[at:]
        run.marks = tail_marks
        self._heads[head.keys[0]] = head
        self._heads[keys[0]] = run
        return head

    def split_in_place(self, run: _Run, at: int) -> None:
        """Split ``run`` after its first ``at`` blocks, both parts keeping its place in eviction
        order (``_split`` leaves a cached inactive run's head out of the LRU, for a caller that
        holds the head at once; a host tier holds a tail instead): the head goes right after the
        tail in the run's release batch, as a release queues a chain's runs."""
        if run.holders:
            self._split(run, at)
            return
        head = self._split(run, at)
        stamp = run.stamp
        for batch in reversed(self._batches):  # (a recently touched run: its batch is near the end)
            if batch[0] == stamp:
                runs = batch[1]
                for j in range(len(runs) - 1, batch[2] - 1, -1):
                    if runs[j] is run:
                        runs.insert(j + 1, head)
                        head.stamp = stamp
                        self._batch_entries += 1
                        return
                break
        raise RuntimeError("split_in_place: an inactive run is not in its release batch")

    def touch(self, path: list) -> None:
        """Make the cached inactive blocks of the hit ``path`` (from ``match_prefix``, nothing
        changed since) the most recently released, the chain's tail first: what ``acquire`` and
        ``release`` by one request do, without the holding."""
        zeros = []
        for run, n in path:
            if n < len(run.keys):
                run = self._split(run, n)
            if not run.holders:
                zeros.append(run)
        if zeros:
            zeros.reverse()
            self._append_batch(zeros)
            if self._batch_entries > 2 * self.num_inactive + 4096:
                self._compact()

    def _append_batch(self, zeros: list) -> None:
        """Runs no request holds any more, eviction order: the most recent release batch."""
        self._stamp += 1
        stamp = self._stamp
        for run in zeros:
            run.stamp = stamp
        self._batches.append([stamp, zeros, 0])
        self._batch_entries += len(zeros)

    # -- allocation -----------------------------------------------------------------
    def grow(self, req, target_tokens: int, hashes: memoryview | None) -> bool:
        """Give ``req`` slots for ``target_tokens`` computed tokens and register its full blocks.

        Returns False (changing nothing) when free + evictable blocks do not suffice.
        """
        bs = self.block_size
        need = -(-target_tokens // bs) - req.num_held - req.num_private
        if need > 0:
            if not self.reserve(need):
                return False
            req.num_private += need
        full = target_tokens // bs
        if full > req.num_full_registered and self.prefix_caching:
            self.register(req, hashes, full)
        return True

    def grow_decode(self, items: list) -> bool | None:
        """``grow(req, target, req.hashes)`` for each ``(req, target)`` in order, as one eviction,
        when every registration is new blocks continuing its request's chain (decode steps: then
        the order cannot change what the evictions take). None (changing nothing) when some
        registration is not such blocks; False (changing nothing) when the blocks do not
        suffice for all. KV events: one REMOVED event for the whole eviction, then one STORED
        event per block (one by one, the REMOVED events would interleave with them; a reader
        of the events ends in the same state either way: an evicted block is inactive, a stored
        one active, so no block is both stored and then evicted here)."""
        bs = self.block_size
        heads = self._heads
        caching = self.prefix_caching
        total = 0
        for req, target in items:
            need = -(-target // bs) - req.num_held - req.num_private
            if need > 0:
                total += need
            if caching:
                full = target // bs
                pos = req.num_full_registered
                if full > pos and (req.dup_tail or req.hashes[pos] in heads
                                   or full > pos + 1 and self._starts_run(req.hashes, pos + 1, full)):
                    return None
        if total > 0 and not self.reserve(total):
            return False
        events = self.events
        num_single = 0  # one-block registrations done inline (below)
        for req, target in items:
            need = -(-target // bs) - req.num_held - req.num_private
            if need > 0:
                req.num_private += need
            if not caching:
                continue
            full = target // bs
            pos = req.num_full_registered
            if full != pos + 1 or req.hashes[pos] in heads:
                if full > pos:
                    self.register(req, req.hashes, full)
                continue
            # register()'s one-new-block case (no private copy behind it: checked above), its
            # counters added up once below
            req.num_full_registered = full
            self._seq += 1
            self._store(req, req.hashes, pos, full, self._seq, 0)
            req.num_held += 1
            req.num_private -= 1
            num_single += 1
            if events is not None:
                events.append((STORED, req.hashes[pos:full]))  # (its own list: the run's may grow)
        if num_single:
            self.num_private -= num_single
            self.num_active_shared += num_single
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
        self.num_refs += num_blocks
        return True

    def register(self, req, hashes: memoryview, full: int) -> None:
        """Turn ``req``'s private slots for its full blocks up to ``full`` into shared cached
        blocks (those not already cached elsewhere, which stay private copies)."""
        heads = self._heads
        pos = req.num_full_registered
        req.num_full_registered = full
        self._seq += 1
        seq = self._seq
        if full == pos + 1 and not req.dup_tail and hashes[pos] not in heads:
            # one new block right after one the request holds (a decode step filled it)
            self._store(req, hashes, pos, full, seq, 0)
            req.num_held += 1
            req.num_private -= 1
            self.num_private -= 1
            self.num_active_shared += 1
            if self.events is not None:
                self.events.append((STORED, hashes[pos:full]))
            return
        events = self.events
        num_stored = 0
        # Is hashes[pos] resident? It starts a run, unless the block before it is a private
        # copy of a cached block, whose run it may continue.
        run = heads.get(hashes[pos])
        off = 0
        if run is None and req.dup_tail:
            run, off = self._locate_next(hashes, pos)
        while pos < full:
            if run is not None:
                # an identical block is cached: a private copy, as long as the chains agree
                pos += agreeing(run.keys, off, hashes, pos, full)
                req.dup_tail = True
                run = heads.get(hashes[pos]) if pos < full else None
                off = 0
                continue
            # new blocks up to the next cached one (which can only start a run: its parent is new)
            end = full
            if pos + 1 < full and self._starts_run(hashes, pos + 1, full):
                end = pos + 1
                while hashes[end] not in heads:
                    end += 1
            if req.dup_tail:  # (a new run after a private copy: its parent is someone else's)
                self.mark_loose(hashes, pos)
            self._store(req, hashes, pos, end, seq, num_stored)
            if events is not None:  # one event per stretch of new blocks (each consecutive in the chain)
                events.append((STORED, hashes[pos:end]))
            num_stored += end - pos
            pos = end
            if pos < full:
                run = heads[hashes[pos]]
        req.num_held += num_stored
        req.num_private -= num_stored
        self.num_private -= num_stored
        self.num_active_shared += num_stored

    def _store(self, req, hashes: memoryview, pos: int, end: int, seq: int, index: int) -> None:
        """Make ``hashes[pos:end]`` (blocks nobody has cached, continuing ``req``'s chain from
        its ``pos`` full blocks) held by ``req`` alone: appended to its last run when it holds that
        run alone and the run is a view of the same hashes (so it ends at ``pos``: a chain's
        hashes sit at their chain positions), else a new run. (A new run instead of an appended
        one changes no outcome: the run is its parent run's child, held and released with it.)"""
        held = req.held
        if held and not req.dup_tail:
            own, n = held[-1]
            keys = own.keys
            if own.holders == 1 and own.tail is None and len(keys) == n and keys.obj is hashes.obj:
                own.marks.append((n, seq, index))
                own.keys = hashes[pos - n : end]
                held[-1] = (own, n + end - pos)
                return
        own = _Run(hashes[pos:end], 1, [(0, seq, index)])
        self._heads[hashes[pos]] = own
        held.append((own, end - pos))
        req.dup_tail = False

    def _starts_run(self, hashes: memoryview, lo: int, hi: int) -> bool:
        """Whether one of ``hashes[lo:hi]`` starts a resident run, given that ``hashes[lo - 1]``
        is not resident. Such a run's first block has no resident parent. A block's parent is
        evicted with or after it (leaves first: a holder holds the whole prefix, a release
        queues its runs tail first, a re-acquired prefix is released again later), unless the
        run was stored right after a private copy of a cached block (its parent was someone
        else's, which may go first), continues a host tier's chain (which does not evict leaves
        first) or was preloaded: only those (``_loose``) are checked, found by their anchors in
        ``hashes`` (``mark_loose``): one set below ``LOOSE_SPAN``, a lookup per ``LOOSE_SPAN``
        positions above, not one per block of the stretch."""
        loose = self._loose
        if not loose:
            return False
        if self._num_unplaced:
            return not self._heads.keys().isdisjoint(hashes[lo:hi])
        near = self._loose_near.get
        p = lo
        if p < LOOSE_SPAN:  # (the first positions' loose runs: one set, a hash's position is its own)
            p = hi if hi < LOOSE_SPAN else LOOSE_SPAN
            low = near(_LOW)
            if low is not None and not low.keys().isdisjoint(hashes[lo:p]):
                return True
        if p < hi:  # (anchored by the block before their span of LOOSE_SPAN positions)
            first = p & -LOOSE_SPAN
            if self._loose_near.keys().isdisjoint(hashes[first - 1 : hi - 1 : LOOSE_SPAN]):
                return False  # (no anchor of the stretch has a loose run: the usual case, one C call)
            for start in range(first, hi, LOOSE_SPAN):
                bucket = near(hashes[start - 1])
                if bucket is not None:
                    for h, i in bucket.items():
                        if lo <= i < hi and hashes[i] == h:
                            return True
        return False

    def mark_loose(self, hashes, pos: int) -> None:
        """The run starting at ``hashes[pos]`` (``pos`` >= 1) may outlive its parent. It is filed
        under an *anchor*: the hash before its span of ``LOOSE_SPAN`` positions (a chain holding
        it holds that anchor, so ``_starts_run`` finds it from the chain's own hashes), or all
        together below ``LOOSE_SPAN`` (where chains share their first blocks)."""
        h = hashes[pos]
        anchor = hashes[(pos & -LOOSE_SPAN) - 1] if pos >= LOOSE_SPAN else _LOW
        if h in self._loose:
            self._unloose(h)
        self._loose[h] = anchor
        bucket = self._loose_near.get(anchor)
        if bucket is None:
            self._loose_near[anchor] = {h: pos}
        else:
            bucket[h] = pos

    def _unloose(self, head: int) -> None:
        anchor = self._loose.pop(head, _NOT_LOOSE)
        if anchor is None:
            self._num_unplaced -= 1
        elif anchor is not _NOT_LOOSE:
            bucket = self._loose_near[anchor]
            del bucket[head]
            if not bucket:
                del self._loose_near[anchor]

    def _locate_next(self, hashes: memoryview, pos: int) -> tuple[_Run | None, int]:
        """The run and offset of ``hashes[pos]`` when it continues the run holding
        ``hashes[pos - 1]`` (a cached block the request has a private copy of)."""
        heads = self._heads
        parent = hashes[pos - 1]
        for q in range(pos - 1, -1, -1):
            run = heads.get(hashes[q])
            if run is None:
                continue
            off = pos - q
            keys = run.keys
            if off - 1 < len(keys) and keys[off - 1] == parent and off < len(keys) and keys[off] == hashes[pos]:
                return run, off
            return None, 0  # the run starting at q holds hashes[q], so no other run holds hashes[pos - 1]
        return None, 0

    def evicts_any(self, count: int, watch) -> bool:
        """Whether the next ``count`` evictions (``_evict``'s order: the LRU entries, each run's
        tail first; fewer when fewer are evictable) would take a block whose hash is in ``watch``
        (a set, or anything with its ``isdisjoint``). Changes nothing."""
        left = count
        for stamp, runs, i in self._batches:
            n = len(runs)
            while i < n:
                run = runs[i]
                keys = run.keys
                i += 1
                if run.holders or run.stamp != stamp or not keys:
                    continue  # (stale, as _evict skips it)
                k = len(keys)
                if k >= left:
                    return not watch.isdisjoint(keys[k - left :])
                if not watch.isdisjoint(keys):
                    return True
                left -= k
        return False

    def _evict(self, count: int) -> None:
        batches = self._batches
        watch = self.watch
        if self.events is None:
            # the common case: the next live run has more than ``count`` blocks; cut its tail
            stamp, runs, i = batches[0]
            run = runs[i]
            keys = run.keys
            cut = len(keys) - count
            if cut > 0 and not run.holders and run.stamp == stamp:
                if watch and not watch.isdisjoint(keys[cut:]):
                    self.fenced.extend([h for h in keys[cut:] if h in watch])
                ids = self.removed_ids
                if ids is not None:
                    _, seq, index = run.marks[0]
                    ids += (seq, index + cut, count)
                _cut_tail(run, cut)
                self.num_inactive -= count
                self.num_evicted += count
                return
        heads = self._heads
        victims = bytearray() if self.events is not None else None  # (the evicted hashes' bytes)
        fenced = self.fenced
        ids = self.removed_ids
        left = count
        while left:
            batch = batches[0]
            stamp, runs, i = batch
            n = len(runs)
            while i < n:
                run = runs[i]
                keys = run.keys
                if run.holders or run.stamp != stamp or not keys:
                    i += 1  # stale entry: held again, released again later, or gone
                    continue
                k = len(keys)
                if k <= left:
                    del heads[keys[0]]
                    if self._loose:
                        self._unloose(keys[0])
                    if victims is not None:
                        victims += keys[::-1].tobytes()
                    if watch and not watch.isdisjoint(keys):
                        fenced.extend([h for h in keys if h in watch])
                    if ids is not None:
                        _, seq, index = run.marks[0]
                        ids += (seq, index, k)
                    run.keys = _NO_KEYS
                    run.marks = []
                    left -= k
                    i += 1
                    if not left:
                        break
                else:
                    cut = k - left
                    if victims is not None:
                        victims += keys[cut:][::-1].tobytes()
                    if watch and not watch.isdisjoint(keys[cut:]):
                        fenced.extend([h for h in keys[cut:] if h in watch])
                    if ids is not None:
                        _, seq, index = run.marks[0]
                        ids += (seq, index + cut, left)
                    _cut_tail(run, cut)
                    left = 0
                    break
            batch[2] = i
            if i >= n:
                batches.popleft()
                self._batch_entries -= n
        self.num_inactive -= count
        self.num_evicted += count
        if victims is not None:
            self.events.append((REMOVED, hash_view(bytes(victims))))

    # -- release --------------------------------------------------------------------
    def release(self, req) -> None:
        """Free everything ``req`` holds (completion or preemption)."""
        self.num_refs -= req.num_held + req.num_private
        held = req.held
        if held:
            zeros = []  # runs no live request holds any more, tail first
            num_zero = 0
            for run, n in reversed(held):
                if n == len(run.keys):
                    run.holders -= 1
                    if not run.holders:
                        zeros.append(run)
                        num_zero += n
                    continue
                parts = []
                while n > 0:
                    parts.append(run)
                    n -= len(run.keys)
                    run = run.tail
                for run in reversed(parts):
                    run.holders -= 1
                    if not run.holders:
                        zeros.append(run)
                        num_zero += len(run.keys)
            if zeros:
                self._append_batch(zeros)
                self.num_inactive += num_zero
                self.num_active_shared -= num_zero
                if self._batch_entries > 2 * self.num_inactive + 4096:
                    self._compact()
            req.held = []
            req.num_held = 0
        self.num_private -= req.num_private
        req.num_private = 0
        req.num_full_registered = 0
        req.dup_tail = False

    def _compact(self) -> None:
        """Drop stale LRU entries (runs held again or released again since)."""
        kept: deque[list] = deque()
        total = 0
        for stamp, runs, pos in self._batches:
            live = [r for r in runs[pos:] if not r.holders and r.stamp == stamp and r.keys]
            if live:
                kept.append([stamp, live, 0])
                total += len(live)
        self._batches = kept
        self._batch_entries = total

    # -- warm start (retune window replays) ----------------------------------------------
    def contents(self) -> list[int]:
        """Every resident block, next eviction first: the cached inactive ones in LRU order, then
        the active ones (released later, so evicted later) in the order they became resident."""
        parts = []
        for run in self._heads.values():
            if run.holders:
                keys = run.keys
                marks = run.marks
                for j, (off, seq, idx) in enumerate(marks):
                    end = marks[j + 1][0] if j + 1 < len(marks) else len(keys)
                    parts.append((seq, idx, keys[off:end]))
        parts.sort(key=lambda p: (p[0], p[1]))
        out = self.lru_order()
        for _, _, keys in parts:
            out.extend(keys)
        return out

    def preload(self, hashes: list[int]) -> None:
        """Start from ``hashes`` cached and inactive (``contents()`` of another cache, next eviction
        first; the most recent ``capacity`` of them fit). Only on an empty cache; no KV events."""
        if self._heads or self.num_active:
            raise RuntimeError("preload needs an empty KV cache")
        if not self.prefix_caching:
            return
        keep = list(dict.fromkeys(hashes))[-self.capacity:] if self.capacity > 0 else []
        if not keep:
            return
        # one run per block: the chains behind a flat list are unknown (every block starts a run)
        self._seq += 1
        self._stamp += 1
        seq, stamp = self._seq, self._stamp
        runs = []
        keys = hash_view(keep)
        for i, h in enumerate(keep):
            run = _Run(keys[i : i + 1], 0, [(0, seq, i)])
            run.stamp = stamp
            self._heads[h] = run
            self._loose[h] = None  # (its chain and position are unknown)
            runs.append(run)
        self._batches.append([stamp, runs, 0])
        self._batch_entries += len(runs)
        self._num_unplaced += len(keep)
        self.num_inactive += len(keep)

    # -- introspection (tests, planner) ----------------------------------------------
    def lru_order(self) -> list[int]:
        """Cached inactive blocks, next eviction first."""
        out = []
        for stamp, runs, pos in self._batches:
            for run in runs[pos:]:
                if not run.holders and run.stamp == stamp and run.keys:
                    out.extend(reversed(run.keys))
        return out

    def resident(self) -> set[int]:
        """Hashes of every cached block (active or inactive)."""
        out: set[int] = set()
        for run in self._heads.values():
            out.update(run.keys)
        return out

    @staticmethod
    def held_hashes(req) -> list[int]:
        """The shared blocks ``req`` holds, chain order."""
        out = []
        for run, n in req.held:
            while n > 0:
                out.extend(run.keys[:n])
                n -= len(run.keys)
                run = run.tail
        return out

    def check_invariants(self) -> None:
        runs = list(self._heads.values())
        assert all(r.keys and self._heads.get(r.keys[0]) is r for r in runs)
        keys = [h for r in runs for h in r.keys]
        assert len(keys) == len(set(keys)), "a hash is resident twice"
        active = sum(len(r.keys) for r in runs if r.holders > 0)
        inactive = sum(len(r.keys) for r in runs if r.holders == 0)
        assert all(r.holders >= 0 for r in runs)
        assert active == self.num_active_shared, (active, self.num_active_shared)
        assert inactive == self.num_inactive, (inactive, self.num_inactive)
        assert len(self.lru_order()) == inactive
        assert all(len(r.marks) >= 1 and r.marks[0][0] == 0 for r in runs)
        assert self.num_private >= 0
        assert self.num_active + self.num_inactive <= self.capacity
