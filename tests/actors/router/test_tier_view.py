"""The KV router's view of a host (G2) tier, kept from the tier's HOST_* events.

A ``HostTier`` publishes stored stretches with their identities and evicted stretches by identity;
the router's ``_TierRuns`` must hold exactly the tier's resident (stored, not pending) blocks, and
find a prompt's resident blocks from a position as the tier does - including when the tier evicts
a chain's head or middle while a transfer pins the rest.
"""

from __future__ import annotations

import random

from aisim.actors.engine.offload import HOST_REMOVED, HOST_STORED, HostTier
from aisim.actors.hashing import hash_view
from aisim.actors.router.policies import _TierRuns

A = hash_view([11, 12, 13, 14, 15, 16])  # one chain (hashes are opaque here: chain positions count)
B = hash_view([21, 22, 23, 24])


def _tier(capacity: int) -> tuple[HostTier, list, _TierRuns]:
    tier = HostTier(capacity, 1)
    events: list = []
    tier.subscribe(events)
    return tier, events, _TierRuns()


def _apply(events: list, view: _TierRuns) -> None:
    for kind, payload in events:
        if kind == HOST_STORED:
            view.store(payload)
        else:
            assert kind == HOST_REMOVED
            view.remove(payload)
    events.clear()


def _store(tier: HostTier, hashes, lo: int, hi: int):
    """A store of ``hashes[lo:hi]`` that ends at once: resident, the most recent."""
    hold = tier.reserve_new(hashes, lo, hi)
    assert hold is not None
    tier.stored(hold)
    tier.release(hold, hi - lo)


def test_a_stored_chain_is_found_from_any_position():
    tier, events, view = _tier(8)
    _store(tier, A, 0, 4)
    _apply(events, view)
    assert view.blocks() == {11, 12, 13, 14}
    assert [view.run_from(A, p) for p in range(6)] == [4, 3, 2, 1, 0, 0]


def test_the_head_evicted_while_an_onboarding_pins_the_tail():
    # A[0:4] stored; an onboarding holds A[2:4]; storing B's 4 blocks in a pool of 6 evicts the
    # two unpinned ones: A[0:2], the head of the stored stretch
    tier, events, view = _tier(6)
    _store(tier, A, 0, 4)
    load = tier.hold_range(A, 2, 4)
    _store(tier, B, 0, 4)
    _apply(events, view)
    assert view.blocks() == {13, 14, 21, 22, 23, 24}
    assert view.run_from(A, 0) == 0
    assert view.run_from(A, 2) == 2  # (a gap before it: found back from the position)
    assert view.run_from(A, 3) == 1
    tier.release(load)
    assert view.num_blocks == 6


def test_the_middle_evicted_between_a_looked_up_head_and_a_pinned_tail():
    # A[0:6] stored; a lookup of A[0:2] makes them the most recent; an onboarding holds A[4:6];
    # storing 2 new blocks of B in a pool of 6 evicts A[2:4], the middle of the stretch
    tier, events, view = _tier(6)
    _store(tier, A, 0, 6)
    _, path = tier.prefix(A, 2)
    tier.touch(path)
    load = tier.hold_range(A, 4, 6)
    _store(tier, B, 0, 2)
    _apply(events, view)
    assert view.blocks() == {11, 12, 15, 16, 21, 22}
    assert [view.run_from(A, p) for p in range(6)] == [2, 1, 0, 0, 2, 1]
    tier.release(load)  # (A[4:6] the most recent now: after A[0:2] and B[0:2])
    _store(tier, hash_view([31, 32, 33, 34]), 0, 4)  # evicts A[0:2] and B[0:2]
    _apply(events, view)
    assert view.blocks() == {15, 16, 31, 32, 33, 34}
    assert [view.run_from(A, p) for p in range(6)] == [0, 0, 0, 0, 2, 1]
    _store(tier, hash_view([41, 42]), 0, 2)  # evicts A[4:6]: the last piece of A's stretch
    _apply(events, view)
    assert view.blocks() == {31, 32, 33, 34, 41, 42}
    filed = [g if isinstance(g, list) else [g] for g in view.by_seq.values()]
    assert sorted(list(st.keys) for group in filed for st in group) == [[31, 32, 33, 34], [41, 42]]


def _resident(tier: HostTier, pending: set) -> set:
    return {h for run in tier.kv._heads.values() for h in run.keys} - pending


def test_random_traffic_keeps_the_view_equal_to_the_tier():
    # chains sharing prefixes, stores that overlap what the pool holds, onboardings pinning
    # stretches, lookups reordering recency and a small pool: after every step the view holds the
    # tier's resident blocks and finds the same consecutive blocks from every position
    rng = random.Random(7)
    roots = [[rng.getrandbits(40) for _ in range(12)] for _ in range(3)]
    chains = []
    for r in roots:
        for cut in (4, 8, 12):
            tail = [rng.getrandbits(40) for _ in range(4)]
            chains.append(hash_view(r[:cut] + tail))
    tier, events, view = _tier(30)
    loads: list = []
    stores: list = []  # (hold, its pending blocks)
    for _step in range(600):
        op = rng.random()
        hashes = rng.choice(chains)
        if op < 0.45:
            lo = rng.randrange(len(hashes))
            hi = rng.randrange(lo + 1, len(hashes) + 1)
            # what the pool lacks from ``lo`` on, as a store cohort finds it (``prepare_store``)
            n, _ = tier.prefix(hashes, hi)
            start = n
            if n < lo:
                e, _, _ = tier.span(hashes, lo, hi)
                start = e if e > lo else lo
            if start < hi:
                hold = tier.reserve_new(hashes, start, hi)
                if hold is not None:
                    new = {h for payload in hold.stretches for h in payload[2:]}
                    stores.append((hold, new, hi - start))
        elif op < 0.65 and stores:
            hold, _, n = stores.pop(rng.randrange(len(stores)))
            tier.stored(hold)
            tier.release(hold, n)
        elif op < 0.8:
            n, _ = tier.prefix(hashes, len(hashes))
            if n >= 2 and len(loads) < 3:
                lo = rng.randrange(n - 1)
                loads.append(tier.hold_range(hashes, lo, n))
        elif op < 0.9 and loads:
            tier.release(loads.pop(rng.randrange(len(loads))))
        else:
            n, path = tier.prefix(hashes, rng.randrange(1, len(hashes) + 1))
            tier.touch(path)
        _apply(events, view)
        pending = set().union(*(p for _, p, _ in stores)) if stores else set()
        assert view.blocks() == _resident(tier, pending)
        for hashes in chains:
            for p in range(len(hashes)):
                n = 0
                while p + n < len(hashes) and hashes[p + n] in view.blocks() and hashes[p + n] not in pending:
                    n += 1
                assert view.run_from(hashes, p) == n
    assert tier.num_evictions > 100
