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
from collections.abc import Sequence
from itertools import islice, takewhile

import numpy as np

from aisim.actors.engine.kv_cache import REMOVED, STORED, agreeing
from aisim.actors.engine.offload import DISK_REMOVED, DISK_STORED, HOST_REMOVED, HOST_STORED
from aisim.actors.protocol import RouteDecision

_new = tuple.__new__  # builds a RouteDecision without its Python-level __new__ (hot loop)


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


class _Run:
    """Consecutive blocks of one chain held by the same number of in-flight requests."""

    __slots__ = ("keys", "holders")

    def __init__(self, keys, holders: int) -> None:
        self.keys = keys  # (a view of a request's hashes: split by slicing, never copied)
        self.holders = holders


class _ActiveChains:
    """The blocks of a candidate's in-flight requests (their prompt chains), with holder counts.

    Two chains share a block only together with all the blocks before it (chained hashes), so
    the blocks a request shares with others are a prefix of its chain. The blocks are kept as
    *runs* (the KV cache's representation): consecutive blocks of one chain held by the same
    requests. A run starts where some chain diverges from another or ends, so a resident block
    whose parent is resident lies in its parent's run or starts a run: only runs' first hashes
    are indexed, and adding, matching or dropping a chain costs one step per run along it, not
    one per block. Runs split where a new chain diverges or ends inside them and never merge."""

    __slots__ = ("heads", "num_blocks")

    def __init__(self) -> None:
        self.heads: dict[int, _Run] = {}  # first hash of each run -> run
        self.num_blocks = 0  # distinct blocks held

    def _walk(self, hashes: Sequence[int], hold: bool) -> int:
        """How many leading ``hashes`` are held; with ``hold``, they get one more holder (a run
        is split where the chain diverges or ends inside it)."""
        heads = self.heads
        n = len(hashes)
        pos = 0
        while pos < n:
            run = heads.get(hashes[pos])
            if run is None:
                break
            keys = run.keys
            a = agreeing(keys, 0, hashes, pos, n)
            if a < len(keys):
                if not hold:
                    return pos + a
                tail = _Run(keys[a:], run.holders)
                run.keys = keys[:a]
                heads[tail.keys[0]] = tail
            if hold:
                run.holders += 1
            pos += a
        return pos

    def depth(self, hashes: Sequence[int]) -> int:
        """How many leading ``hashes`` are held."""
        return self._walk(hashes, False)

    def add(self, hashes: Sequence[int]) -> None:
        """One more in-flight request holds the chain ``hashes``."""
        n = len(hashes)
        pos = self._walk(hashes, True)
        if pos < n:
            self.heads[hashes[pos]] = _Run(hashes[pos:], 1)
            self.num_blocks += n - pos

    def remove(self, hashes: Sequence[int]) -> None:
        """A request holding the chain ``hashes`` (added before) is no longer in flight."""
        heads = self.heads
        n = len(hashes)
        pos = 0
        while pos < n:
            h = hashes[pos]
            run = heads[h]
            k = len(run.keys)
            run.holders -= 1
            if not run.holders:
                del heads[h]
                self.num_blocks -= k
            pos += k

    def holders(self) -> dict[int, int]:
        """Every held block and how many in-flight requests hold it (tests, diagnostics)."""
        return {h: run.holders for run in self.heads.values() for h in run.keys}


class _CachedBlocks:
    """The router's view of one candidate's cached blocks, as its KV events tell them.

    Kept as *runs* (as the KV cache keeps them): each STORED event is consecutive blocks of one
    chain and becomes a run; a REMOVED event (blocks evicted, leaves first: each block before its
    parent) cuts runs from their ends. So an event costs one step per run it touches, not one per
    block, and only a run's first and last hashes are indexed. A resident block whose parent is
    resident lies in its parent's run or starts a run (a block is stored once while resident), so a
    prefix lookup goes run by run: one dict probe and one comparison per run (``agreeing``).

    The events must be the KV cache's (``actors.engine.kv_cache``): a stored block is not resident
    already, a removed one is resident, and a block is removed with or after its descendants. A
    removed stretch is found by its two ends (equal hashes, equal prefixes: the blocks between
    agree); a removed block that ends no run raises (a broken event stream)."""

    __slots__ = ("heads", "tails", "num_blocks")

    def __init__(self) -> None:
        self.heads: dict[int, Sequence[int]] = {}  # first hash of each run -> its keys (chain order)
        self.tails: dict[int, Sequence[int]] = {}  # last hash of each run -> the same keys
        self.num_blocks = 0

    def __contains__(self, h: int) -> bool:
        """Whether ``h`` is cached, for the first block of a chain (which can only start a run)."""
        return h in self.heads

    def store(self, hashes: Sequence[int]) -> None:
        """Consecutive blocks of one chain were cached (none of them was); the sequence is kept
        (never changed: a removal keeps a slice of it)."""
        if hashes:
            self.heads[hashes[0]] = hashes
            self.tails[hashes[-1]] = hashes
            self.num_blocks += len(hashes)

    def remove(self, victims: Sequence[int]) -> None:
        """Blocks were evicted: ``victims`` in eviction order (stretches of a chain, each from its
        last block back)."""
        heads = self.heads
        tails = self.tails
        i = 0
        n = len(victims)
        while i < n:
            keys = tails.pop(victims[i], None)  # (an evicted block has no cached child: a run's last)
            if keys is None:
                raise RuntimeError(f"KV event: removed block {victims[i]} is not the end of a cached run")
            num = len(keys)
            t = n - i if n - i < num else num
            if victims[i + t - 1] != keys[num - t]:
                # the stretch ends inside the run: the blocks agree up to some point, never after
                lo, hi = 1, t - 1  # victims[i + lo - 1] agrees, victims[i + hi] does not
                while lo < hi:
                    mid = (lo + hi) >> 1
                    if victims[i + mid] == keys[num - 1 - mid]:
                        lo = mid + 1
                    else:
                        hi = mid
                t = lo
            # (the ends agree, so the blocks between do: equal hashes, equal prefixes)
            cut = num - t
            if cut:
                keys = keys[:cut]  # (a view when the event's hashes are: cut, not freed block by block)
                heads[keys[0]] = keys
                tails[keys[-1]] = keys
            else:
                del heads[keys[0]]
            self.num_blocks -= t
            i += t

    def prefix_len(self, hashes: Sequence[int]) -> int:
        """How many leading ``hashes`` are cached."""
        heads = self.heads
        n = len(hashes)
        pos = 0
        while pos < n:
            keys = heads.get(hashes[pos])
            if keys is None:
                break
            pos += agreeing(keys, 0, hashes, pos, n)  # (past a divergence, another run may go on)
        return pos

    def blocks(self) -> set[int]:
        """Every cached block (tests, diagnostics)."""
        return {h for keys in self.heads.values() for h in keys}


class _Candidate:
    """The router's view of one (worker, rank)."""

    __slots__ = ("prefill_tokens", "active", "requests", "cached", "host", "disk")

    def __init__(self) -> None:
        self.prefill_tokens = 0
        self.active = _ActiveChains()  # the blocks of the in-flight requests
        self.requests = 0
        self.cached = _CachedBlocks()  # the router's view of the rank's cached blocks
        self.host = _TierRuns()  # blocks its host (G2) tier holds (HOST_* events)
        self.disk: set[int] = set()  # blocks its disk (G3) tier holds (DISK_* events)


def _run_in(tier: set, hashes: Sequence[int], pos: int) -> int:
    """How many of ``hashes[pos:]`` are in ``tier``, consecutively from ``pos``."""
    return len(list(takewhile(tier.__contains__, islice(hashes, pos, None))))


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
        self.by_seq: dict[int, list[_Stretch]] = {}
        self.num_blocks = 0

    def __bool__(self) -> bool:
        return self.num_blocks > 0

    def store(self, payload: Sequence[int]) -> None:
        """``[seq, index, *hashes]``: new resident blocks (none of them was)."""
        st = _Stretch(payload[2:], payload[0], payload[1])
        if st.keys:
            self.heads[st.keys[0]] = st
            self.by_seq.setdefault(st.seq, []).append(st)
            self.num_blocks += len(st.keys)

    def remove(self, payload: Sequence[int]) -> None:
        """``[seq, index, count, ...]``: evicted stretches, each ``count`` blocks from the
        ``index``-th of registration ``seq`` (within one resident stretch)."""
        heads = self.heads
        by_seq = self.by_seq
        it = iter(payload.tolist() if isinstance(payload, memoryview) else payload)
        for seq, index, count in zip(it, it, it):
            group = by_seq.get(seq, ())
            for st in group:
                off = index - st.index
                if 0 <= off < len(st.keys):
                    break
            else:
                raise RuntimeError(f"host KV event: evicted blocks {seq}:{index} are not resident")
            keys = st.keys
            end = off + count
            if end > len(keys):
                raise RuntimeError(f"host KV event: evicted blocks {seq}:{index}+{count} are not resident")
            self.num_blocks -= count
            if off == 0:
                del heads[keys[0]]
                if end == len(keys):
                    group.remove(st)
                    if not group:
                        del by_seq[seq]
                    continue
                st.keys = keys[end:]
                st.index += end
                heads[st.keys[0]] = st
            elif end == len(keys):
                st.keys = keys[:off]
            else:  # (the middle: a hold pinned the tail, the head was looked up since)
                st.keys = keys[:off]
                rest = _Stretch(keys[end:], seq, index + count)
                heads[rest.keys[0]] = rest
                group.append(rest)

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
    ``track_active_blocks=False`` the decode term (disaggregated prefill pools).
    """

    needs_worker_state = True
    tracks_first_tokens = True
    tracks_requests = True

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
    ) -> None:
        """``kv_events``: keep the prefix index (workers publish KV events) even at credit 0, for a
        router whose credit may rise later (retune)."""
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
        self.needs_kv_events = (overlap_score_credit > 0 or kv_events) and track_prefill_tokens
        self._cands: dict[tuple[int, int], _Candidate] = {}
        self._routed: dict[int, tuple[tuple[int, int], int, Sequence[int]]] = {}

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

    def _cand(self, key: tuple[int, int]) -> _Candidate:
        c = self._cands.get(key)
        if c is None:
            c = self._cands[key] = _Candidate()
        return c

    def route(self, req, now_ms: float, eligible: list[int], ranks_of: list[int]):
        if not eligible:
            raise RuntimeError("no eligible worker to route to")
        bs = self.block_size
        isl = req.prompt_len
        hashes = req.block_hashes(bs)[: isl // bs]
        keys = [(w, r) for w in eligible for r in range(ranks_of[w])]
        costs = []
        overlaps = []
        n = len(hashes)
        first = hashes[0] if n else None
        use_cache = self.needs_kv_events and n > 0
        prefill, active = self.track_prefill_tokens, self.track_active_blocks
        scale, credit = self.scale, self.credit
        cand = self._cand
        for key in keys:
            c = cand(key)
            # leading blocks found; most candidates hold none or all of a prompt's prefix
            overlap = c.cached.prefix_len(hashes) if use_cache and first in c.cached else 0
            credited = credit * overlap
            if (c.host or c.disk) and use_cache and overlap < n:  # (the lower tiers continue the prefix)
                h = c.host.run_from(hashes, overlap) if c.host else 0
                d = _run_in(c.disk, hashes, overlap + h) if c.disk else 0
                if h or d:
                    extra = self.host_weight * h + self.disk_weight * d
                    credited += extra
                    overlap = int(overlap + extra)  # (reported: the effective overlap's floor)
            cost = 0.0
            if prefill:
                raw = (c.prefill_tokens + isl) / bs
                cost = scale * max(0.0, raw - credited)
            if active:
                chains = c.active
                depth = chains.depth(hashes) if n and first in chains.heads else 0
                cost += chains.num_blocks + (n - depth)
            costs.append(cost)
            overlaps.append(overlap)
        i = self._select(costs)
        key = keys[i]
        c = self._cands[key]
        added = isl - overlaps[i] * bs if self.track_prefill_tokens else 0
        c.prefill_tokens += added
        if self.track_active_blocks and n:
            c.active.add(hashes)
        c.requests += 1
        self._routed[req.index] = (key, added, hashes if self.track_active_blocks else [])
        best = max(overlaps)
        info = {
            "selected_overlap_blocks": overlaps[i],
            "best_available_overlap_blocks": best,
            "overlap_regret_blocks": best - overlaps[i],
            "reported_overlap_tokens": overlaps[i] * bs,
            "cost": costs[i],
        }
        return _new(RouteDecision, (key[0], key[1], info))

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

    def on_first_token(self, req) -> None:
        st = self._routed.get(req.index)
        if st is not None and st[1]:
            self._cands[st[0]].prefill_tokens -= st[1]
            self._routed[req.index] = (st[0], 0, st[2])

    def on_release(self, req) -> None:
        st = self._routed.pop(req.index, None)
        if st is None:
            return
        key, added, hashes = st
        c = self._cands[key]
        c.prefill_tokens -= added
        c.requests -= 1
        if hashes:
            c.active.remove(hashes)

    def on_kv_events(self, worker: int, rank: int, kind: int, hashes: Sequence[int]) -> None:
        c = self._cand((worker, rank))
        if kind == STORED:
            c.cached.store(hashes)
        elif kind == REMOVED:
            c.cached.remove(hashes)
        elif kind == HOST_STORED:
            c.host.store(hashes)
        elif kind == HOST_REMOVED:
            c.host.remove(hashes)
        elif kind == DISK_STORED:
            c.disk.update(hashes)
        elif kind == DISK_REMOVED:
            c.disk.difference_update(hashes)

    def load_view(self, worker: int, rank: int = 0) -> dict:
        """The router's view of one candidate (tests, diagnostics)."""
        c = self._cand((worker, rank))
        return {"prefill_tokens": c.prefill_tokens, "active_blocks": c.active.num_blocks, "requests": c.requests,
                "cached_blocks": c.cached.num_blocks}

    def describe(self) -> dict:
        return {
            "policy": self.name,
            "overlap_score_credit": self.credit,
            "prefill_load_scale": self.scale,
            "temperature": self.temperature,
            "track_prefill_tokens": self.track_prefill_tokens,
            "track_active_blocks": self.track_active_blocks,
        }
