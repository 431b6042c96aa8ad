"""KV block manager: prefix reuse, LRU order, sharing, duplicates, capacity; checked against a
plain per-block reference model under random operation sequences."""

from __future__ import annotations

import random
from collections import OrderedDict
from itertools import takewhile

import pytest

from aisim.actors.engine.kv_cache import REMOVED, STORED, KVCache
from aisim.actors.hashing import hash_view
from aisim.actors.router.policies import _CachedRuns


class Req:
    """The attributes KVCache reads and writes on a request."""

    def __init__(self, hashes):
        self.hashes = hash_view(hashes)  # (as a request's hash source gives them)
        self.held = []
        self.num_held = 0
        self.dup_tail = False
        self.num_private = 0
        self.num_full_registered = 0


def admit(kv: KVCache, req: Req, tokens: int) -> int:
    k, _, hits = kv.match_prefix(req.hashes, (tokens - 1) // kv.block_size)
    kv.acquire(req, hits)
    assert kv.grow(req, tokens, req.hashes)
    return k


def test_fully_cached_prompt_reuses_all_but_the_last_partial_block():
    # 1500 tokens at block 64: 23 full blocks; at least one token is always computed
    kv = KVCache(100, 64)
    hashes = list(range(1000, 1023))
    a = Req(hashes)
    admit(kv, a, 1500)
    kv.release(a)
    b = Req(hashes)
    assert admit(kv, b, 1500) * 64 == 1472


def test_release_then_evict_is_lru_and_tail_first():
    kv = KVCache(6, 4)
    a, b = Req([1, 2, 3]), Req([11, 12, 13])
    admit(kv, a, 12)
    admit(kv, b, 12)
    kv.release(a)  # a's blocks become inactive first (least recently used)
    kv.release(b)
    assert kv.lru_order() == [3, 2, 1, 13, 12, 11]
    # the next evictions' blocks, without taking them: 3, 2 | 1, 13 | 12
    assert not kv.evicts_any(2, {1, 12}) and kv.evicts_any(3, {1, 12})
    assert not kv.evicts_any(4, {12, 99}) and kv.evicts_any(5, {12, 99})
    assert not kv.evicts_any(9, {99})  # (more than are evictable: the six there)
    c = Req([21, 22, 23, 24])
    assert kv.grow(c, 16, c.hashes)  # 4 new blocks: evicts 3, 2, 1, 13
    assert kv.lru_order() == [12, 11]
    assert 1 not in kv.resident() and 12 in kv.resident()
    kv.check_invariants()


def test_reactivated_block_moves_to_most_recent():
    kv = KVCache(8, 4)
    a, b = Req([1, 2]), Req([5, 6])
    admit(kv, a, 8)
    admit(kv, b, 8)
    kv.release(a)
    kv.release(b)
    c = Req([1, 2, 7])  # hits a's prefix: 1, 2 active again
    assert admit(kv, c, 12) == 2
    assert kv.lru_order() == [6, 5]
    kv.release(c)
    assert kv.lru_order() == [6, 5, 7, 2, 1]
    kv.check_invariants()


def test_shared_active_block_needs_every_holder_to_release():
    kv = KVCache(10, 4)
    a, b = Req([1, 2, 3]), Req([1, 2, 9])
    admit(kv, a, 12)
    assert admit(kv, b, 12) == 2
    kv.release(a)
    assert kv.lru_order() == [3]  # 1 and 2 still held by b
    kv.release(b)
    assert kv.lru_order() == [3, 9, 2, 1]
    kv.check_invariants()


def test_runs_view_the_registering_requests_hashes_and_a_continuation_of_anothers_run_starts_one():
    kv = KVCache(10, 2)
    a = Req([1, 2, 3])
    admit(kv, a, 6)  # blocks 1, 2, 3: one run, a view of a's hashes (no copy)
    (run, n), = a.held
    assert n == 3 and run.keys.obj is a.hashes.obj
    kv.release(a)
    b = Req([1, 2, 3, 4, 5])
    assert admit(kv, b, 10) == 3  # b holds a's run alone now; its new blocks 4, 5 start a run of b's
    assert [(list(r.keys), m) for r, m in b.held] == [([1, 2, 3], 3), ([4, 5], 2)]
    assert b.held[1][0].keys.obj is b.hashes.obj
    kv.release(b)
    assert kv.lru_order() == [5, 4, 3, 2, 1]  # as one run would be: the last block first
    c = Req([9, 8, 7, 6, 11, 12, 13, 14, 15])
    admit(kv, c, 18)  # nine new blocks, five free: evicts b's run, then the tail of a's
    assert kv.lru_order() == [1] and kv.num_evicted == 4
    kv.check_invariants()


def test_identical_block_computed_twice_stays_private_and_is_freed():
    kv = KVCache(10, 4)
    a, b = Req([1, 2]), Req([1, 2])
    assert kv.grow(a, 8, a.hashes)
    assert kv.grow(b, 8, b.hashes)  # nothing cached for b at its admission; fills the same hashes
    assert kv.held_hashes(a) == [1, 2] and kv.held_hashes(b) == [] and b.num_private == 2
    assert kv.num_active == 4
    kv.release(b)
    assert kv.num_active == 2 and kv.num_free == 8
    kv.check_invariants()


def test_a_run_stored_after_a_private_copy_is_found_after_its_parent_is_evicted():
    # b computes 1, 2 while a holds them (private copies), then stores 3, 4 after them: that run's
    # parent is a's block 2, which is evicted once a releases; d then stores the chain again
    kv = KVCache(10, 4)
    a, b = Req([1, 2]), Req([1, 2, 3, 4])
    assert kv.grow(a, 8, a.hashes)
    assert kv.grow(b, 16, b.hashes)
    assert kv.held_hashes(b) == [3, 4] and b.num_private == 2
    kv.release(a)
    c = Req([21, 22, 23, 24, 25, 26])
    assert kv.grow(c, 24, c.hashes)  # evicts 2 then 1: 3 and 4 stay (b holds them)
    assert kv.resident() == {3, 4, 21, 22, 23, 24, 25, 26}
    kv.release(c)
    d = Req([1, 2, 3, 4, 5])
    assert admit(kv, d, 21) == 0  # 1 is gone: nothing to reuse
    # 1, 2 and 5 are new; 3, 4 are cached (b's): private copies
    assert kv.held_hashes(d) == [1, 2, 5] and d.num_private == 3  # (and its partial sixth block)
    kv.check_invariants()


@pytest.mark.parametrize("k, first", [(5, 0), (15, 0), (16, 0), (40, 20), (40, 33), (47, 21)])
def test_a_run_outliving_its_parent_is_found_at_any_chain_position(k, first):
    # as above, one block per position and the loose run (the m blocks b stored after its private
    # copies) at chain position k: d registers the chain in two steps (up to ``first``, then on),
    # so the second registration starts mid-stretch and must find that run from its own hashes
    m = 3
    chain = list(range(1000, 1000 + k + m + 2))
    kv = KVCache(2 * k + 2 * m + 2, 1)
    a, b = Req(chain[:k]), Req(chain[: k + m])
    assert kv.grow(a, k, a.hashes)
    assert kv.grow(b, k + m, b.hashes)
    assert kv.held_hashes(b) == chain[k : k + m] and b.num_private == k
    kv.release(a)
    c = Req(list(range(5000, 5000 + k + m + 2)))
    assert kv.grow(c, k + m + 2, c.hashes)  # evicts all of a's blocks: b's run outlives its parent
    assert not kv.resident() & set(chain[:k])
    kv.release(c)
    d = Req(chain)
    if first:
        assert kv.grow(d, first, d.hashes)
    assert kv.grow(d, len(chain), d.hashes)
    # b's blocks are cached: d's are private copies; the rest of the chain is d's
    assert kv.held_hashes(d) == chain[:k] + chain[k + m :] and d.num_private == m
    kv.check_invariants()


def test_allocation_miss_is_a_return_value():
    kv = KVCache(2, 4)
    a = Req([1, 2, 3])
    assert not kv.grow(a, 12, a.hashes)
    assert kv.num_active == 0 and kv.held_hashes(a) == []


def test_events_report_stored_and_removed_blocks():
    kv = KVCache(2, 4, record_events=True)
    a, b = Req([1, 2]), Req([3])
    kv.grow(a, 8, a.hashes)
    kv.release(a)
    kv.grow(b, 4, b.hashes)
    assert [(k, list(h)) for k, h in kv.events] == [(STORED, [1, 2]), (REMOVED, [2]), (STORED, [3])]


class RefModel:
    """Per-block reference: refcounts + an OrderedDict LRU (eviction from the front)."""

    def __init__(self, capacity, bs):
        self.cap, self.bs = capacity, bs
        self.ref = {}
        self.lru = OrderedDict()
        self.private = 0
        self.held = {}
        self.priv = {}
        self.reg = {}

    def free(self):
        return self.cap - sum(1 for c in self.ref.values() if c > 0) - len(self.lru) - self.private

    def match(self, hashes, limit):
        k = 0
        for h in hashes[:limit]:
            if h in self.ref:
                k += 1
            else:
                break
        return k

    def acquire(self, rid, hashes, k):
        for h in hashes[:k]:
            if self.ref[h] == 0:
                del self.lru[h]
            self.ref[h] += 1
        self.held[rid] = list(hashes[:k])
        self.priv[rid] = 0
        self.reg[rid] = k

    def grow(self, rid, hashes, target):
        need = -(-target // self.bs) - len(self.held[rid]) - self.priv[rid]
        if need > 0:
            if need > self.free() + len(self.lru):
                return False
            while need > self.free():
                h, _ = self.lru.popitem(last=False)
                del self.ref[h]
            self.private += need
            self.priv[rid] += need
        for h in hashes[self.reg[rid] : target // self.bs]:
            if h in self.ref:
                continue
            self.ref[h] = 1
            self.held[rid].append(h)
            self.priv[rid] -= 1
            self.private -= 1
        self.reg[rid] = max(self.reg[rid], target // self.bs)
        return True

    def release(self, rid):
        for h in reversed(self.held.pop(rid)):
            self.ref[h] -= 1
            if self.ref[h] == 0:
                self.lru[h] = None
        self.private -= self.priv.pop(rid)


@pytest.mark.parametrize("max_cut", [10, 30])
@pytest.mark.parametrize("seed", range(60))
def test_random_operations_match_the_reference_model(seed, max_cut):
    """max_cut 30: long shared prefixes, so runs split, are held by several requests at once and
    are computed twice (private copies that continue a cached run)."""
    rnd = random.Random(seed)
    bs = rnd.choice([1, 2, 4])
    cap = rnd.randint(8, 60)
    kv, ref = KVCache(cap, bs, record_events=seed % 2 == 0), RefModel(cap, bs)
    mirror: set[int] = set()  # the resident blocks as a reader of the KV events sees them
    view = _CachedRuns()  # the same as the KV router keeps it (one candidate, slot 0)
    # a few shared prefix families so hits, sharing and duplicates all happen
    families = [[rnd.getrandbits(62) for _ in range(30)] for _ in range(4)]
    live: dict[int, tuple[Req, list[int], int]] = {}
    for step in range(400):
        op = rnd.random()
        if op < 0.45 or not live:
            fam = rnd.choice(families)
            cut = rnd.randint(0, max_cut)
            hashes = fam[:cut] + [rnd.getrandbits(62) for _ in range(25)]
            tokens = rnd.randint(1, 12 * bs)
            limit = (tokens - 1) // bs
            req = Req(hashes)
            k, n_active, hits = kv.match_prefix(req.hashes, limit)
            assert k == ref.match(hashes, limit)
            assert n_active == sum(1 for h in hashes[:k] if ref.ref[h] > 0)
            kv.acquire(req, hits)
            ref.acquire(step, hashes, k)
            target = max(tokens, k * bs)
            ok = kv.grow(req, target, req.hashes)
            assert ok == ref.grow(step, hashes, target)
            live[step] = (req, hashes, target)
        elif op < 0.6:
            rid = rnd.choice(list(live))
            req, hashes, t = live[rid]
            t2 = min(t + rnd.randint(1, 3 * bs), 25 * bs)
            if kv.grow(req, t2, req.hashes):
                assert ref.grow(rid, hashes, t2)
                live[rid] = (req, hashes, t2)
            else:
                assert not ref.grow(rid, hashes, t2)
        elif op < 0.75:
            # several requests grow at once (as decode runs do): one eviction for all when every
            # registration is new blocks continuing the request's chain, else one by one
            rids = rnd.sample(sorted(live), min(len(live), rnd.randint(1, 4)))
            items = [(live[rid][0], min(live[rid][2] + rnd.randint(1, 2 * bs), 25 * bs)) for rid in rids]
            got = kv.grow_decode(items)
            if got is None:
                for rid, (req, t2) in zip(rids, items):
                    if kv.grow(req, t2, req.hashes):
                        assert ref.grow(rid, req.hashes, t2)
                        live[rid] = (req, req.hashes, t2)
                    else:
                        assert not ref.grow(rid, req.hashes, t2)
            elif got:
                for rid, (req, t2) in zip(rids, items):
                    assert ref.grow(rid, req.hashes, t2)
                    live[rid] = (req, req.hashes, t2)
            else:  # not enough blocks for all of them: nothing changed
                need = sum(max(0, -(-t2 // bs) - len(ref.held[rid]) - ref.priv[rid]) for rid, (_, t2) in zip(rids, items))
                assert need > ref.free() + len(ref.lru)
        else:
            rid = rnd.choice(list(live))
            kv.release(live.pop(rid)[0])
            ref.release(rid)
        assert kv.lru_order() == list(ref.lru)
        assert kv.num_free == ref.free()
        # whether the next evictions would take a watched block (EngineWorker.router_unchanged)
        order = list(ref.lru)
        count = rnd.randint(1, len(order) + 2)
        watch = set(rnd.sample(order, min(len(order), rnd.randint(0, 2)))) | {rnd.getrandbits(62)}
        assert kv.evicts_any(count, watch) == any(h in watch for h in order[:count])
        if kv.events is not None:
            for kind, hs in kv.events:
                if kind == STORED:
                    assert mirror.isdisjoint(hs) and len(set(hs)) == len(hs)  # stored once while resident
                    mirror.update(hs)
                    view.store(0, hs)
                else:
                    mirror.difference_update(hs)
                    view.remove(0, hs)
            kv.events.clear()
            assert mirror == kv.resident() == view.blocks(0)
            assert view.held[0] == len(mirror)
            # the router's run view answers prefix lookups as the set of resident blocks does
            for fam in families:
                for query in (fam, fam[: rnd.randint(1, 30)] + [rnd.getrandbits(62)]):
                    assert view.prefix_len(0, query) == len(list(takewhile(mirror.__contains__, query)))
            for req, hashes, _ in live.values():
                assert view.prefix_len(0, hashes) == len(list(takewhile(mirror.__contains__, hashes)))
        assert kv.resident() == set(ref.ref)
        # active blocks in the order they became resident (a dict's insertion order)
        assert kv.contents() == list(ref.lru) + [h for h, c in ref.ref.items() if c > 0]
        for rid, (req, _, _) in live.items():
            assert kv.held_hashes(req) == ref.held[rid]
            assert req.num_private == ref.priv[rid]
        kv.check_invariants()


def test_a_published_stored_event_keeps_its_blocks_when_the_run_grows_later():
    # a reader may apply an event after later passes: its list is its own, not the run's
    kv = KVCache(10, 2, record_events=True)
    a, b = Req(list(range(100, 106))), Req([100, 200])
    admit(kv, a, 2)  # one full block (100)
    assert admit(kv, b, 3) == 1  # b shares it: a's next block starts a run of its own
    assert kv.grow_decode([(a, 4)])  # a decode step fills block 101
    first = kv.events[-1]
    assert first[0] == STORED and list(first[1]) == [101]
    assert kv.grow_decode([(a, 6)])  # the next fills 102, continuing 101's run
    assert kv.grow(a, 8, a.hashes)  # and a chunk registers 103
    assert first[0] == STORED and list(first[1]) == [101]
    assert [(k, list(h)) for k, h in kv.events] == [(STORED, [100]), (STORED, [101]), (STORED, [102]), (STORED, [103])]


def test_a_cache_preloaded_with_anothers_contents_evicts_in_the_same_order():
    kv = KVCache(6, 4, record_events=True)
    a, b = Req([1, 2, 3]), Req([11, 12])
    admit(kv, a, 12)
    admit(kv, b, 8)
    kv.release(a)
    assert kv.contents() == [3, 2, 1, 11, 12]  # cached inactive (LRU first), then the active ones
    warm = KVCache(6, 4, record_events=True)
    warm.preload(kv.contents())
    assert warm.lru_order() == [3, 2, 1, 11, 12] and warm.num_inactive == 5 and warm.events == []
    warm.check_invariants()
    c = Req([11, 12, 40])
    assert admit(warm, c, 12) == 2  # the prefix hits the preloaded blocks
    small = KVCache(2, 4)
    small.preload([3, 2, 1, 11, 12])  # the most recent ones that fit
    assert small.lru_order() == [11, 12]
    with pytest.raises(RuntimeError, match="empty"):
        warm.preload([99])
