"""Routing policies: pick the (worker, rank) that serves a request.

Every policy implements the same small interface (tested by one contract suite):

- ``route(req, now_ms, eligible, ranks_of) -> (worker, rank, info)``: ``eligible`` are the
  workers that may take new work (ready, not draining), ascending; ``info`` describes the
  decision for the per-request record (or None);
- ``on_first_token(req)`` / ``on_release(req)``: the request produced its first token in this
  pool / left it (completed, rejected, or handed off to decode);
- ``on_kv_events(worker, rank, kind, hashes)``: blocks stored/removed on a worker, as
  published at pass end;
- flags telling the coordinator what the policy reads: ``needs_worker_state`` (sync every
  worker to ``now`` before routing), ``needs_kv_events``, ``tracks_first_tokens``,
  ``tracks_requests`` (False: ``on_first_token`` / ``on_release`` change nothing, so the
  coordinator does not send them).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from itertools import islice, takewhile

import numpy as np

from aisim.actors.engine.kv_cache import REMOVED, STORED, agreeing
from aisim.actors.engine.offload import DISK_REMOVED, DISK_STORED, HOST_REMOVED, HOST_STORED
from aisim.actors.protocol import RouteDecision

_new = tuple.__new__  # builds a RouteDecision without its Python-level __new__ (hot loop)

#: the KV router's per-candidate arrays grow this many slots at a time (a multiple of 8: a slot
#: mask's bytes cover them)
SLOTS_AT_A_TIME = 64


def _zeros(n: int) -> array:
    """``n`` zero int64 counters (an ``array``: fast to update one at a time, a numpy view at once)."""
    return array("q", bytes(8 * n))


class RoundRobinRouter:
    """Cycle over eligible workers, then over the chosen worker's ranks; ignores cache and load."""

    name = "round_robin"
    needs_worker_state = False
    needs_kv_events = False
    tracks_first_tokens = False
    tracks_requests = False  # on_first_token / on_release change nothing (the coordinator sends neither)

    def __init__(self) -> None:
        self._next_worker = 0
        self._next_rank: dict[int, int] = {}

    def _rank(self, w: int, nranks: int) -> int:
        if nranks <= 1:
            return 0
        r = self._next_rank.get(w, 0)
        self._next_rank[w] = (r + 1) % nranks
        return r

    def route(self, req, now_ms: float, eligible: list[int], ranks_of: list[int]):
        if not eligible:
            raise RuntimeError("no eligible worker to route to")
        w = eligible[self._next_worker % len(eligible)]
        self._next_worker += 1
        return _new(RouteDecision, (w, self._rank(w, ranks_of[w]), None))

    def on_first_token(self, req) -> None:
        pass

    def on_release(self, req) -> None:
        pass

    def on_kv_events(self, worker: int, rank: int, kind: int, hashes: Sequence[int]) -> None:
        pass

    def describe(self) -> dict:
        return {"policy": self.name}


class RandomRouter(RoundRobinRouter):
    """Uniform choice among eligible workers from a seeded generator; ranks in round robin."""

    name = "random"

    def __init__(self, rng: np.random.Generator) -> None:
        super().__init__()
        self.rng = rng

    def route(self, req, now_ms: float, eligible: list[int], ranks_of: list[int]):
        if not eligible:
            raise RuntimeError("no eligible worker to route to")
        w = eligible[int(self.rng.integers(len(eligible)))]
        return _new(RouteDecision, (w, self._rank(w, ranks_of[w]), None))


class _Node:
    """Consecutive blocks of one chain (``keys``) and the candidates that hold all of them (``mask``:
    bit s for slot s); a held-chains node also counts each holder's requests (``counts``)."""

    __slots__ = ("keys", "mask", "counts")

    def __init__(self, keys: Sequence[int], mask: int, counts: dict | None = None) -> None:
        self.keys = keys  # (a view of an event's or a request's hashes: split by slicing, never copied)
        self.mask = mask
        self.counts = counts


class _SharedRuns:
    """Blocks every candidate holds, in one structure shared by the candidates: a trie of runs.

    A node is consecutive blocks of one chain and the candidates holding *all* of them (a bitmask
    of slots). Chained hashes give equal prefixes to equal hashes, and every candidate's holdings
    are prefix-closed (a block is held only with its parent), so a block lies in one node, a node
    is split where a candidate's holdings start, end or branch inside it, and a prefix lookup for
    all candidates at once walks the prompt node by node (one dict probe and one comparison per
    node, ``agreeing``): the candidates drop out where they stop holding the prompt
    (``depths``). Nodes split and never merge; a node no candidate holds is dropped. See
    docs/scale.md ("The KV router at many workers")."""

    __slots__ = ("heads", "held")

    def __init__(self) -> None:
        self.heads: dict[int, _Node] = {}  # first hash of each node -> node
        self.held = _zeros(SLOTS_AT_A_TIME)  # slot -> distinct blocks it holds

    def grow(self, slots: int) -> None:
        """Room for ``slots`` candidates."""
        if slots > len(self.held):
            self.held.extend(_zeros(slots - len(self.held)))

    def _split(self, node: _Node, a: int) -> _Node:
        """Cut ``node`` after its first ``a`` blocks; returns the new node of the rest."""
        keys = node.keys
        tail = _Node(keys[a:], node.mask, dict(node.counts) if node.counts is not None else None)
        node.keys = keys[:a]
        self.heads[keys[a]] = tail
        return tail

    def depths(self, hashes: Sequence[int], n: int, alive: int) -> list[tuple[int, int]]:
        """``(mask, depth)`` pairs: the candidates of ``alive`` that hold exactly the first ``depth``
        of ``hashes[:n]`` (those holding none are left out)."""
        heads = self.heads
        out = []
        pos = 0
        while pos < n:
            node = heads.get(hashes[pos])
            if node is None:
                break
            m = alive & node.mask
            if m != alive:
                if pos:
                    out.append((alive ^ m, pos))
                if not m:
                    return out
                alive = m
            pos += agreeing(node.keys, 0, hashes, pos, n)  # (past a divergence, another node may go on)
        if pos:
            out.append((alive, pos))
        return out

    def prefix_len(self, slot: int, hashes: Sequence[int]) -> int:
        """How many leading ``hashes`` the candidate in ``slot`` holds (tests, diagnostics)."""
        got = self.depths(hashes, len(hashes), 1 << slot)
        return got[0][1] if got else 0

    def blocks(self, slot: int) -> set[int]:
        """Every block the candidate in ``slot`` holds (tests, diagnostics)."""
        return {h for node in self.heads.values() if node.mask >> slot & 1 for h in node.keys}


class _CachedRuns(_SharedRuns):
    """The router's view of the candidates' cached blocks, as their KV events tell them.

    A STORED event is consecutive blocks of one chain that the candidate did not hold; its parent
    is held (or it starts a chain), so its first block starts a node or is new. A REMOVED event
    evicts leaves first (each block before its parent): a candidate's evicted block ends the
    candidate's holdings along its chain, so it ends a node (found by its last hash); a stretch
    ending inside a node splits it. An event costs one step per node it touches, not one per
    block. The events must be the KV cache's (``actors.engine.kv_cache``); a broken stream raises."""

    __slots__ = ("tails",)

    def __init__(self) -> None:
        super().__init__()
        self.tails: dict[int, _Node] = {}  # last hash of each node -> node

    def _split(self, node: _Node, a: int) -> _Node:
        tail = super()._split(node, a)
        self.tails[node.keys[-1]] = node
        self.tails[tail.keys[-1]] = tail
        return tail

    def store(self, slot: int, hashes: Sequence[int]) -> None:
        """The candidate in ``slot`` cached consecutive blocks of one chain (none of them was)."""
        n = len(hashes)
        bit = 1 << slot
        heads = self.heads
        pos = 0
        while pos < n:
            node = heads.get(hashes[pos])
            if node is None:
                node = _Node(hashes[pos:], bit)
                heads[hashes[pos]] = node
                self.tails[hashes[n - 1]] = node
                break
            if node.mask & bit:
                raise RuntimeError(f"KV event: stored block {hashes[pos]} is cached already")
            a = agreeing(node.keys, 0, hashes, pos, n)
            if a < len(node.keys):
                self._split(node, a)
            node.mask |= bit
            pos += a
        self.held[slot] += n

    def remove(self, slot: int, victims: Sequence[int]) -> None:
        """The candidate in ``slot`` evicted ``victims`` (in eviction order: stretches of a chain,
        each from its last block back)."""
        heads = self.heads
        tails = self.tails
        bit = 1 << slot
        i = 0
        n = len(victims)
        while i < n:
            node = tails.get(victims[i])
            if node is None or not node.mask & bit:
                raise RuntimeError(f"KV event: removed block {victims[i]} is not the end of a cached run")
            keys = node.keys
            num = len(keys)
            t = n - i if n - i < num else num
            if victims[i + t - 1] != keys[num - t]:
                # the stretch ends inside the node: the blocks agree up to some point, never after
                lo, hi = 1, t - 1  # victims[i + lo - 1] agrees, victims[i + hi] does not
                while lo < hi:
                    mid = (lo + hi) >> 1
                    if victims[i + mid] == keys[num - 1 - mid]:
                        lo = mid + 1
                    else:
                        hi = mid
                t = lo
            # (the ends agree, so the blocks between do: equal hashes, equal prefixes)
            if node.mask == bit:  # (its only holder: the node is cut or dropped, not split)
                del tails[victims[i]]
                if t < num:
                    node.keys = keys = keys[: num - t]
                    tails[keys[-1]] = node
                else:
                    del heads[keys[0]]
            else:
                if t < num:
                    node = self._split(node, num - t)
                node.mask ^= bit
            i += t
        self.held[slot] -= n


class _HeldChains(_SharedRuns):
    """The prompt chains of the candidates' in-flight requests, with per-candidate holder counts.

    A chain is added and removed whole, from its first block, so every node along it is found
    from the node before (one step per node); a node is split where a chain ends or diverges
    inside it. ``held``: the distinct blocks of each candidate's in-flight requests."""

    __slots__ = ()

    def add(self, slot: int, hashes: Sequence[int]) -> None:
        """One more in-flight request on the candidate in ``slot`` holds the chain ``hashes``."""
        heads = self.heads
        bit = 1 << slot
        n = len(hashes)
        pos = 0
        new = 0
        while pos < n:
            node = heads.get(hashes[pos])
            if node is None:
                heads[hashes[pos]] = _Node(hashes[pos:], bit, {slot: 1})
                new += n - pos
                break
            a = agreeing(node.keys, 0, hashes, pos, n)
            if a < len(node.keys):
                self._split(node, a)
            counts = node.counts
            k = counts.get(slot, 0)
            counts[slot] = k + 1
            if not k:
                node.mask |= bit
                new += a
            pos += a
        if new:
            self.held[slot] += new

    def remove(self, slot: int, hashes: Sequence[int]) -> None:
        """A request on the candidate in ``slot`` holding ``hashes`` (added before) left."""
        heads = self.heads
        n = len(hashes)
        pos = 0
        gone = 0
        while pos < n:
            h = hashes[pos]
            node = heads[h]
            k = len(node.keys)
            counts = node.counts
            c = counts[slot] - 1
            if c:
                counts[slot] = c
            else:
                del counts[slot]
                node.mask ^= 1 << slot
                gone += k
                if not counts:
                    del heads[h]
            pos += k
        if gone:
            self.held[slot] -= gone

    def holders(self, slot: int) -> dict[int, int]:
        """Every block the candidate's in-flight requests hold and how many of them (tests, diagnostics)."""
        return {h: node.counts[slot] for node in self.heads.values() if slot in node.counts for h in node.keys}


def _by_slot(pairs) -> dict[int, int]:
    """``(slots mask, depth)`` pairs as slot -> depth."""
    out = {}
    for mask, depth in pairs:
        while mask:
            low = mask & -mask
            out[low.bit_length() - 1] = depth
            mask ^= low
    return out


def _run_in(tier: set, hashes: Sequence[int], pos: int) -> int:
    """How many of ``hashes[pos:]`` are in ``tier``, consecutively from ``pos``."""
    return len(list(takewhile(tier.__contains__, islice(hashes, pos, None))))


# a lower tier's KV event kind -> (the host tier's, not the disk's; blocks stored, not removed)
_LOWER_TIER_EVENTS = {HOST_STORED: (True, True), HOST_REMOVED: (True, False),
                      DISK_STORED: (False, True), DISK_REMOVED: (False, False)}


class _DiskBlocks(set):
    """The router's view of a candidate's disk (G3) tier: its blocks, as its DISK_* events tell
    them (the tier view's ``store`` / ``remove``)."""

    __slots__ = ()
    store = set.update
    remove = set.difference_update


class _Stretch:
    """Resident blocks of one host-tier registration: ``keys`` (chain order), the first being the
    ``index``-th block registration ``seq`` stored."""

    __slots__ = ("keys", "seq", "index")

    def __init__(self, keys: Sequence[int], seq: int, index: int) -> None:
        self.keys = keys
        self.seq = seq
        self.index = index


class _TierRuns:
    """The router's view of a candidate's host (G2) tier, as its HOST_* events tell them.

    The tier (``actors.engine.offload.HostTier``) publishes each stretch of new blocks it stored
    with an identity - registration ``seq``, index of its first block - and names evicted stretches
    by identity and count, so an event costs one step per stretch, not one per block, whatever the
    eviction order (a tier can evict a chain's head while a transfer pins its tail). Resident
    blocks are kept as stretches indexed by first hash (and by ``seq``, to find an evicted one);
    a resident block whose parent is resident lies in its parent's stretch or starts one (a hash is
    resident once), so a lookup goes stretch by stretch (``run_from``)."""

    __slots__ = ("heads", "by_seq", "num_blocks")

    def __init__(self) -> None:
        self.heads: dict[int, _Stretch] = {}
        self.by_seq: dict[int, _Stretch | list[_Stretch]] = {}  # seq -> its stretch(es)
        self.num_blocks = 0

    def __bool__(self) -> bool:
        return self.num_blocks > 0

    def store(self, payload: Sequence[int]) -> None:
        """``[seq, index, *hashes]``: new resident blocks (none of them was)."""
        keys = payload[2:]
        if keys:
            st = _Stretch(keys, payload[0], payload[1])
            self.heads[keys[0]] = st
            self._file(st)
            self.num_blocks += len(keys)

    def _file(self, st: _Stretch) -> None:
        """Index ``st`` by its ``seq`` (the stretch itself, or a list when a seq has several)."""
        by_seq = self.by_seq
        had = by_seq.get(st.seq)
        if had is None:
            by_seq[st.seq] = st
        elif had.__class__ is list:
            had.append(st)
        else:
            by_seq[st.seq] = [had, st]

    def remove(self, payload: Sequence[int]) -> None:
        """``[seq, index, count, ...]``: evicted stretches, each ``count`` blocks from the
        ``index``-th of registration ``seq`` (within one resident stretch)."""
        heads = self.heads
        by_seq = self.by_seq
        vals = payload.tolist() if isinstance(payload, memoryview) else payload
        for j in range(0, len(vals), 3):
            seq = vals[j]
            index = vals[j + 1]
            count = vals[j + 2]
            found = by_seq.get(seq)
            st = None
            if found.__class__ is _Stretch:
                off = index - found.index
                if 0 <= off < len(found.keys):
                    st = found
            else:
                for cand in found or ():
                    off = index - cand.index
                    if 0 <= off < len(cand.keys):
                        st = cand
                        break
            if st is None:
                raise RuntimeError(f"host KV event: evicted blocks {seq}:{index} are not resident")
            keys = st.keys
            end = off + count
            if end > len(keys):
                raise RuntimeError(f"host KV event: evicted blocks {seq}:{index}+{count} are not resident")
            self.num_blocks -= count
            if off == 0:
                del heads[keys[0]]
                if end == len(keys):
                    if found is st:
                        del by_seq[seq]
                    else:
                        found.remove(st)
                        if not found:
                            del by_seq[seq]
                    continue
                st.keys = keys = keys[end:]
                st.index += end
                heads[keys[0]] = st
            elif end == len(keys):
                st.keys = keys[:off]
            else:  # (the middle: a hold pinned the tail, the head was looked up since)
                st.keys = keys[:off]
                rest = _Stretch(keys[end:], seq, index + count)
                heads[rest.keys[0]] = rest
                self._file(rest)

    def run_from(self, hashes: Sequence[int], pos: int) -> int:
        """How many of ``hashes[pos:]`` are resident, consecutively from ``pos`` (as the tier's
        ``span`` finds them: along the chain from its first block, else back from ``pos`` to the
        stretch holding it)."""
        heads = self.heads
        n = len(hashes)
        if pos >= n:
            return 0
        p = 0
        while p <= pos:  # (from the first block)
            st = heads.get(hashes[p])
            if st is None:
                break
            a = agreeing(st.keys, 0, hashes, p, n)
            p += a
        if p <= pos:  # (a gap: the stretch holding ``pos`` starts after it, if any)
            q = pos
            while q > p:
                st = heads.get(hashes[q])
                if st is not None:
                    break
                q -= 1
            else:  # (none after ``p``, which is not resident: it ended the walk)
                return 0
            keys = st.keys
            off = pos - q
            if off >= len(keys) or keys[off] != hashes[pos]:
                return 0
            p = q + agreeing(keys, 0, hashes, q, n)
        while p < n:  # (past ``pos``: the next stretches)
            st = heads.get(hashes[p])
            if st is None:
                break
            p += agreeing(st.keys, 0, hashes, p, n)
        return p - pos

    def blocks(self) -> set[int]:
        """Every resident block (tests, diagnostics)."""
        return {h for st in self.heads.values() for h in st.keys}


class KvRouter:
    """Cost-based routing over (worker, rank) candidates (Dynamo's KV router).

    cost = prefill_load_scale x max(0, (active_prefill_tokens + ISL) / B - credit x overlap)
           + active_decode_blocks + (request_blocks - active_overlap_depth)

    ``overlap``: leading request blocks cached on the candidate (the router's prefix index);
    ``active_decode_blocks``: distinct blocks of the candidate's in-flight requests;
    ``active_overlap_depth``: leading request blocks already among them. Temperature 0 takes
    the lowest cost (ties: a seeded uniform pick); T > 0 samples a softmax of min-max
    normalised costs. ``track_prefill_tokens=False`` drops the prefill term (decode pools),
    ``track_active_blocks=False`` the decode term (disaggregated prefill pools). Both depths come
    from structures shared by all candidates (``_CachedRuns``, ``_HeldChains``), each walked once
    per prompt for every candidate (docs/scale.md, "The KV router at many workers").
    """

    needs_worker_state = True
    tracks_first_tokens = True
    tracks_requests = True
    #: up to this many candidates they are priced one by one, past it with numpy (the same numbers)
    listed_candidates = 16

    def __init__(
        self,
        block_size: int,
        rng: np.random.Generator,
        overlap_score_credit: float = 1.0,
        prefill_load_scale: float = 1.0,
        temperature: float = 0.0,
        track_prefill_tokens: bool = True,
        track_active_blocks: bool = True,
        name: str = "kv_router",
        kv_events: bool = False,
        host_cache_hit_weight: float = 0.75,
        disk_cache_hit_weight: float = 0.25,
        host_tier: str | None = None,
        disk_tier: str | None = None,
    ) -> None:
        """``kv_events``: keep the prefix index (workers publish KV events) even at credit 0, for a
        router whose credit may rise later (retune). ``host_tier`` / ``disk_tier``: the scope of the
        candidates' host (disk) tier, None without one (``describe`` reports a weight only for a
        tier there is). ``cluster_shared``: the candidates share one tier, so the router keeps one
        view for all of them, fed by the tier's events once (``actors.engine.offload.OffloadRegistry``
        publishes a shared tier through one rank), and a candidate that joins later sees the whole
        pool."""
        self.block_size = block_size
        self.rng = rng
        self.credit = overlap_score_credit
        self.scale = prefill_load_scale
        self.temperature = temperature
        self.track_prefill_tokens = track_prefill_tokens
        self.track_active_blocks = track_active_blocks
        self.name = name
        # blocks past the device-cached prefix that the candidate's host (disk) tier holds count
        # this much each in the overlap (the tiers publish events only when configured)
        self.host_weight = host_cache_hit_weight
        self.disk_weight = disk_cache_hit_weight
        self._weighs = (host_tier is not None, disk_tier is not None)
        self.needs_kv_events = (overlap_score_credit > 0 or kv_events) and track_prefill_tokens
        # candidates by slot (bit ``slot`` of the shared structures' masks), in the order first seen
        self._slot_of: dict[tuple[int, int], int] = {}
        self._prefill = _zeros(SLOTS_AT_A_TIME)  # slot -> prompt tokens routed there, first token not out
        self._requests: list[int] = []  # slot -> requests in flight there
        self._cached = _CachedRuns()  # the router's view of every candidate's cached blocks
        self._held = _HeldChains()  # the blocks of every candidate's in-flight requests
        self._host: dict[int, _TierRuns] = {}  # slot -> its host (G2) tier's blocks (HOST_* events)
        self._disk: dict[int, _DiskBlocks] = {}  # slot -> its disk (G3) tier's blocks (DISK_* events)
        # the one view of a tier every candidate shares (None: a view per candidate, as above)
        self._shared_host = _TierRuns() if host_tier == "cluster_shared" else None
        self._shared_disk = _DiskBlocks() if disk_tier == "cluster_shared" else None
        self._for: list[int] | None = None  # the eligible workers of the cached selection
        # (slots in candidate order, as a list, their keys, their mask, position by slot, and how an
        # array over the slots is taken in candidate order: a slice when they are 0, 1, ...)
        self._sel = None
        self._routed: dict[int, tuple[int, int, Sequence[int]]] = {}  # request -> (slot, tokens added, chain)

    def parameters(self) -> dict:
        """The knobs retune may change (as the report names them)."""
        return {"overlap_score_credit": self.credit, "prefill_load_scale": self.scale,
                "temperature": self.temperature}

    def set_parameters(self, params: dict) -> None:
        """Change knobs from now on (retune). Whether KV events flow stays as built: a router that
        may gain overlap credit later must be built with a positive credit or KV events recorded."""
        unknown = set(params) - {"overlap_score_credit", "prefill_load_scale", "temperature"}
        if unknown:
            raise ValueError(f"unknown router parameter(s) {sorted(unknown)}")
        self.credit = params.get("overlap_score_credit", self.credit)
        self.scale = params.get("prefill_load_scale", self.scale)
        self.temperature = params.get("temperature", self.temperature)

    def _slot(self, key: tuple[int, int]) -> int:
        s = self._slot_of.get(key)
        if s is None:
            s = self._slot_of[key] = len(self._requests)
            self._requests.append(0)
            if s >= len(self._prefill):
                self._prefill.extend(_zeros(SLOTS_AT_A_TIME))
            self._cached.grow(len(self._prefill))
            self._held.grow(len(self._prefill))
        return s

    def _selection(self, eligible: list[int], ranks_of: list[int]):
        """The candidates of ``eligible`` (ascending workers, then ranks): their slots (an array),
        keys, slot mask and position by slot; kept while the eligible workers do not change."""
        if eligible != self._for:
            keys = [(w, r) for w in eligible for r in range(ranks_of[w])]
            slots = [self._slot(key) for key in keys]
            mask = 0
            for s in slots:
                mask |= 1 << s
            take = slice(0, len(slots)) if slots == list(range(len(slots))) else np.array(slots, np.intp)
            self._sel = (np.array(slots, np.intp), slots, keys, mask, {s: j for j, s in enumerate(slots)}, take)
            self._for = list(eligible)
        return self._sel

    def route(self, req, now_ms: float, eligible: list[int], ranks_of: list[int]):
        if not eligible:
            raise RuntimeError("no eligible worker to route to")
        bs = self.block_size
        isl = req.prompt_len
        hashes = req.block_hashes(bs)[: isl // bs]
        n = len(hashes)
        slots, listed, keys, alive, position, take = self._selection(eligible, ranks_of)
        use_cache = self.needs_kv_events and n > 0
        # leading blocks each candidate holds cached, and among its in-flight requests' blocks: one
        # walk for all candidates each, as (slots, depth) pairs
        cached = self._cached.depths(hashes, n, alive) if use_cache else ()
        held = self._held.depths(hashes, n, alive) if self.track_active_blocks and n else ()
        tiered = use_cache and bool(self._host or self._disk or self._shared_host or self._shared_disk)
        if len(slots) > self.listed_candidates:
            costs, overlaps = self._costs_array(hashes, n, isl, slots, take, position, cached, held, tiered)
            i = self._select_array(costs)
            best = int(overlaps.max())
        else:
            costs, overlaps = self._costs_listed(hashes, n, isl, listed, cached, held, tiered)
            i = self._select(costs)
            best = max(overlaps)
        s = listed[i]
        chosen = int(overlaps[i])
        added = isl - chosen * bs if self.track_prefill_tokens else 0
        if added:
            self._prefill[s] += added
        if self.track_active_blocks and n:
            self._held.add(s, hashes)
        self._requests[s] += 1
        self._routed[req.index] = (s, added, hashes if self.track_active_blocks else ())
        info = {
            "selected_overlap_blocks": chosen,
            "best_available_overlap_blocks": best,
            "overlap_regret_blocks": best - chosen,
            "reported_overlap_tokens": chosen * bs,
            "cost": float(costs[i]),
        }
        key = keys[i]
        return _new(RouteDecision, (key[0], key[1], info))

    def _costs_listed(self, hashes, n: int, isl: int, slots, cached, held, tiered: bool):
        """Each candidate's cost and reported overlap (lists), candidate by candidate: for a few
        candidates, cheaper than ``_costs_array``'s numpy calls (the same numbers, tested)."""
        overlap_of = _by_slot(cached)
        depth_of = _by_slot(held)
        bs, scale, credit = self.block_size, self.scale, self.credit
        prefill, active = self.track_prefill_tokens, self.track_active_blocks
        tokens = list(map(self._prefill.__getitem__, slots))
        blocks = list(map(self._held.held.__getitem__, slots))
        extras: dict = {}  # (shared tiers: the extra depends on the device overlap only)
        costs = []
        overlaps = []
        for j, s in enumerate(slots):
            overlap = overlap_of.get(s, 0)
            cost = 0.0
            if prefill:
                credited = credit * overlap
                if tiered and overlap < n:
                    extra = self._tier_extra(s, hashes, n, overlap, extras)
                    if extra:
                        credited += extra
                        overlap = int(overlap + extra)  # (reported: the effective overlap's floor)
                cost = scale * max(0.0, (tokens[j] + isl) / bs - credited)
            if active:
                cost += blocks[j] + (n - depth_of.get(s, 0))
            costs.append(cost)
            overlaps.append(overlap)
        return costs, overlaps

    def _costs_array(self, hashes, n: int, isl: int, slots, take, position: dict, cached, held, tiered: bool):
        """``_costs_listed`` with numpy over the candidates (the same operations, element by element);
        ``take`` indexes an array over the slots in candidate order."""
        overlaps = self._by_slot_array(cached)[take]
        if self.track_prefill_tokens:
            credited = self.credit * overlaps
            if tiered:
                extras: dict = {}
                if self._tiers_shared():  # (one credit per device overlap value, not per candidate)
                    device = overlaps.copy()
                    for ov in np.unique(device).tolist():
                        if ov < n:
                            extra = self._tier_extra(-1, hashes, n, ov, extras)
                            if extra:
                                sel = device == ov
                                credited[sel] += extra
                                overlaps[sel] = int(ov + extra)
                else:
                    for j in self._tiered_positions(position):
                        ov = int(overlaps[j])
                        if ov < n:
                            extra = self._tier_extra(int(slots[j]), hashes, n, ov, extras)
                            if extra:
                                credited[j] += extra
                                overlaps[j] = int(ov + extra)
            tokens = np.frombuffer(self._prefill, np.int64)[take]
            cost = self.scale * np.maximum(0.0, (tokens + isl) / self.block_size - credited)
        else:
            cost = np.zeros(len(slots))
        if self.track_active_blocks:
            depth = self._by_slot_array(held)[take]
            cost = cost + (np.frombuffer(self._held.held, np.int64)[take] + (n - depth))
        return cost, overlaps

    def _by_slot_array(self, pairs) -> np.ndarray:
        """``(slots mask, depth)`` pairs as an array over the slots (0 where none)."""
        out = np.zeros(len(self._prefill), np.int64)
        nbytes = len(out) >> 3
        for mask, depth in pairs:
            bits = np.unpackbits(np.frombuffer(mask.to_bytes(nbytes, "little"), np.uint8), bitorder="little")
            out[bits.view(bool)] = depth
        return out

    def _tiered_positions(self, position: dict) -> range | list[int]:
        """Positions among the candidates of those whose lower tiers hold blocks, ascending."""
        if self._shared_host or self._shared_disk:
            return range(len(position))  # (every candidate sees the shared tier)
        return sorted(position[s] for s in set(self._host) | set(self._disk) if s in position)

    def _tiers_shared(self) -> bool:
        """Whether every candidate's lower tiers are the shared views (its tier credit then
        depends on its device overlap alone)."""
        return (self._shared_host is not None or not self._host) and (self._shared_disk is not None or not self._disk)

    def _tier_extra(self, s: int, hashes, n: int, overlap: int, extras: dict) -> float:
        """Blocks past the device-cached prefix (``overlap``) that slot ``s``'s host (disk) tier
        holds count ``host_weight`` (``disk_weight``) each in the credited overlap. ``extras``:
        the route's answers by device overlap, for candidates whose tiers are all shared."""
        host = self._shared_host
        disk = self._shared_disk
        shared = self._tiers_shared()
        if shared:
            got = extras.get(overlap)
            if got is not None:
                return got
        if host is None:
            host = self._host.get(s)
        if disk is None:
            disk = self._disk.get(s)
        h = host.run_from(hashes, overlap) if host else 0
        d = _run_in(disk, hashes, overlap + h) if disk else 0
        extra = self.host_weight * h + self.disk_weight * d if h or d else 0.0
        if shared:
            extras[overlap] = extra
        return extra

    def _select(self, costs: list[float]) -> int:
        lo = min(costs)
        hi = max(costs)
        if self.temperature <= 0.0 or hi == lo:
            ties = [i for i, c in enumerate(costs) if c == lo]
            return ties[0] if len(ties) == 1 else ties[int(self.rng.integers(len(ties)))]
        span = (hi - lo) * self.temperature
        weights = [math.exp(-(c - lo) / span) for c in costs]
        u = float(self.rng.random()) * sum(weights)
        acc = 0.0
        for i, w in enumerate(weights):
            acc += w
            if u < acc:
                return i
        return len(costs) - 1

    def _select_array(self, costs: np.ndarray) -> int:
        """``_select`` over an array (ties found at C speed)."""
        i = int(costs.argmin())  # (the first lowest: the first of the ties)
        lo = costs[i]
        if self.temperature <= 0.0 or costs.max() == lo:  # (max only with a temperature)
            ties = (costs == lo).nonzero()[0]
            return i if len(ties) == 1 else int(ties[int(self.rng.integers(len(ties)))])
        return self._select(costs.tolist())

    def on_first_token(self, req) -> None:
        st = self._routed.get(req.index)
        if st is not None and st[1]:
            self._prefill[st[0]] -= st[1]
            self._routed[req.index] = (st[0], 0, st[2])

    def on_release(self, req) -> None:
        st = self._routed.pop(req.index, None)
        if st is None:
            return
        s, added, hashes = st
        if added:
            self._prefill[s] -= added
        self._requests[s] -= 1
        if hashes:
            self._held.remove(s, hashes)

    def on_kv_events(self, worker: int, rank: int, kind: int, hashes: Sequence[int]) -> None:
        s = self._slot((worker, rank))
        if kind == STORED:
            self._cached.store(s, hashes)
        elif kind == REMOVED:
            self._cached.remove(s, hashes)
        else:  # a lower tier's: its view made at its first event
            host, stored = _LOWER_TIER_EVENTS[kind]
            view = self._shared_host if host else self._shared_disk
            if view is None:
                views = self._host if host else self._disk
                view = views.get(s)
                if view is None:
                    view = views[s] = _TierRuns() if host else _DiskBlocks()
            if stored:
                view.store(hashes)
            else:
                view.remove(hashes)

    def load_view(self, worker: int, rank: int = 0) -> dict:
        """The router's view of one candidate (tests, diagnostics)."""
        s = self._slot((worker, rank))
        return {"prefill_tokens": int(self._prefill[s]), "active_blocks": int(self._held.held[s]),
                "requests": self._requests[s], "cached_blocks": int(self._cached.held[s])}

    def describe(self) -> dict:
        out = {
            "policy": self.name,
            "overlap_score_credit": self.credit,
            "prefill_load_scale": self.scale,
            "temperature": self.temperature,
            "track_prefill_tokens": self.track_prefill_tokens,
            "track_active_blocks": self.track_active_blocks,
        }
        if self._weighs[0]:  # (the weights only where the candidates have the tier they weigh)
            out["host_cache_hit_weight"] = self.host_weight
        if self._weighs[1]:
            out["disk_cache_hit_weight"] = self.disk_weight
        return out
