"""Router contract suite (every policy) and the KV router's cost model."""

from __future__ import annotations

import numpy as np
import pytest

from aisim.actors.engine.kv_cache import REMOVED, STORED
from aisim.actors.hashing import hash_view
from aisim.actors.router.policies import KvRouter, RandomRouter, RoundRobinRouter, _CachedRuns


class Req:
    def __init__(self, index: int, hashes: list[int], prompt_len: int | None = None, bs: int = 4):
        self.index = index
        self._hashes = hashes
        self.prompt_len = prompt_len if prompt_len is not None else len(hashes) * bs

    def block_hashes(self, block_size: int) -> list[int]:
        return self._hashes


def rng(seed=7):
    return np.random.default_rng(seed)


POLICIES = {
    "round_robin": lambda seed: RoundRobinRouter(),
    "random": lambda seed: RandomRouter(rng(seed)),
    "kv_router": lambda seed: KvRouter(4, rng(seed)),
    "kv_router warm": lambda seed: KvRouter(4, rng(seed), temperature=0.7),
    "decode_load": lambda seed: KvRouter(4, rng(seed), overlap_score_credit=0.0, track_prefill_tokens=False),
}


def drive(router, eligible, ranks_of, n=60, seed=0, cached=None):
    """Route n requests (some sharing prefixes), completing some; return the decisions.
    ``cached``: (worker, rank) -> blocks stored there (as an engine publishes them: each once)."""
    r = np.random.default_rng(seed)
    out = []
    live = []
    cached = {} if cached is None else cached
    for i in range(n):
        fam = int(r.integers(3))
        hashes = [1000 * fam + j for j in range(int(r.integers(1, 8)))] + [10**6 + i]
        req = Req(i, hashes)
        w, k, _ = router.route(req, float(i), eligible, ranks_of)
        out.append((w, k))
        live.append(req)
        if router.needs_kv_events:
            have = cached.setdefault((w, k), set())
            router.on_kv_events(w, k, STORED, [h for h in hashes if h not in have])
            have.update(hashes)
        if i % 3 == 2:
            done = live.pop(0)
            router.on_first_token(done)
            router.on_release(done)
    return out


@pytest.mark.parametrize("name", list(POLICIES))
def test_chooses_a_valid_eligible_worker_and_rank(name):
    ranks_of = [1, 2, 1, 4]
    eligible = [0, 1, 3]  # worker 2 is draining
    for w, k in drive(POLICIES[name](1), eligible, ranks_of):
        assert w in eligible and 0 <= k < ranks_of[w]


@pytest.mark.parametrize("name", list(POLICIES))
def test_deterministic_under_a_seed(name):
    ranks_of = [2, 2, 2]
    a = drive(POLICIES[name](5), [0, 1, 2], ranks_of)
    b = drive(POLICIES[name](5), [0, 1, 2], ranks_of)
    assert a == b


@pytest.mark.parametrize("name", list(POLICIES))
def test_respects_draining_workers(name):
    router = POLICIES[name](3)
    cached = {}
    first = drive(router, [0, 1, 2], [1, 1, 1], n=30, cached=cached)
    later = drive(router, [0, 2], [1, 1, 1], n=30, seed=1, cached=cached)  # worker 1 starts draining
    assert {w for w, _ in first} >= {0, 2} and 1 not in {w for w, _ in later}


@pytest.mark.parametrize("name", list(POLICIES))
def test_no_eligible_worker_is_an_error(name):
    with pytest.raises(RuntimeError):
        POLICIES[name](1).route(Req(0, [1]), 0.0, [], [1])


def test_round_robin_cycles_workers_then_ranks():
    router = RoundRobinRouter()
    picks = [router.route(Req(i, [i]), 0.0, [0, 1], [2, 1])[:2] for i in range(6)]
    assert picks == [(0, 0), (1, 0), (0, 1), (1, 0), (0, 0), (1, 0)]


def test_kv_router_prefers_the_worker_holding_the_prefix_and_tracks_load():
    router = KvRouter(4, rng())
    prefix = [11, 12, 13, 14]
    router.on_kv_events(1, 0, STORED, prefix)
    req = Req(0, prefix + [99], prompt_len=20)
    w, k, info = router.route(req, 0.0, [0, 1], [1, 1])
    # worker 0: 20/4 = 5 prefill blocks + 5 new decode blocks = 10; worker 1: max(0, 5 - 4) + 5 = 6
    assert (w, k) == (1, 0) and info["cost"] == 6.0
    assert info["selected_overlap_blocks"] == 4 and info["overlap_regret_blocks"] == 0
    assert router.load_view(1) == {"prefill_tokens": 4, "active_blocks": 5, "requests": 1, "cached_blocks": 4}
    router.on_first_token(req)
    assert router.load_view(1)["prefill_tokens"] == 0
    router.on_release(req)
    assert router.load_view(1) == {"prefill_tokens": 0, "active_blocks": 0, "requests": 0, "cached_blocks": 4}
    router.on_kv_events(1, 0, REMOVED, [14, 13])  # (evicted leaves first, as an engine does)
    assert router.load_view(1)["cached_blocks"] == 2


def test_kv_router_prefill_load_scale_and_credit():
    # a long queue of prefill work on the prefix holder outweighs the cache with a large scale
    router = KvRouter(4, rng(), prefill_load_scale=4.0, overlap_score_credit=0.5, track_active_blocks=False)
    router.on_kv_events(0, 0, STORED, [1, 2, 3, 4])
    busy = Req(0, [50, 51, 52, 53], prompt_len=16)
    assert router.route(busy, 0.0, [0], [1])[0] == 0  # worker 0 now has 16 prefill tokens queued
    w, _, info = router.route(Req(1, [1, 2, 3, 4], prompt_len=16), 0.0, [0, 1], [1, 1])
    # worker 0: 4 x max(0, (16 + 16)/4 - 0.5 x 4) = 24; worker 1: 4 x 16/4 = 16
    assert w == 1 and info["cost"] == 16.0


def test_kv_router_dedups_active_blocks_of_shared_prefixes():
    router = KvRouter(4, rng(), track_prefill_tokens=False)
    a = Req(0, [1, 2, 3])
    router.route(a, 0.0, [0], [1])
    w, _, info = router.route(Req(1, [1, 2, 9]), 0.0, [0], [1])
    assert info["cost"] == 3 + 1  # three active blocks, only block 9 is new
    router.on_release(a)
    assert router.load_view(0)["active_blocks"] == 3  # 1 and 2 still held by the second request


@pytest.mark.parametrize("seed", range(20))
def test_kv_router_active_blocks_match_a_count_of_the_in_flight_chains(seed):
    """Requests sharing chain prefixes of random lengths (a chain may end inside another or
    diverge from it anywhere), released in random order: the active blocks with their holder
    counts, their number, the cost's depth of any chain and the decision's cost equal a plain
    count over the in-flight chains."""
    import random
    from collections import Counter
    from itertools import takewhile

    rnd = random.Random(seed)
    router = KvRouter(1, rng(), track_prefill_tokens=False)
    # chains branch off one another: a family's prefix, then a sub-family's, then a request's own
    families = [[rnd.getrandbits(40) for _ in range(12)] for _ in range(3)]
    branches = {(f, k): [rnd.getrandbits(40) for _ in range(6)] for f in range(3) for k in range(13)}

    def chain():
        f = rnd.randrange(3)
        k = rnd.randint(0, 12)
        out = families[f][:k]
        if rnd.random() < 0.5:
            out += branches[(f, k)][: rnd.randint(0, 6)]
        if rnd.random() < 0.7 or not out:
            out += [rnd.getrandbits(40) for _ in range(rnd.randint(1, 4))]
        return out

    live = {}
    for index in range(400):
        holders = Counter(h for req in live.values() for h in req.block_hashes(1))
        if live and rnd.random() < 0.45:
            router.on_release(live.pop(rnd.choice(sorted(live))))
        else:
            hashes = chain()
            depth = len(list(takewhile(holders.__contains__, hashes)))
            live[index] = Req(index, hashes, bs=1)
            _, _, info = router.route(live[index], 0.0, [0], [1])
            assert info["cost"] == len(holders) + len(hashes) - depth
        holders = Counter(h for req in live.values() for h in req.block_hashes(1))
        held = router._held
        assert held.holders(0) == dict(holders)
        assert held.held[0] == len(holders) == router.load_view(0)["active_blocks"]
        probe = chain()
        assert held.prefix_len(0, probe) == len(list(takewhile(holders.__contains__, probe)))


def test_zero_temperature_ties_are_seeded_and_uniform():
    picks = [KvRouter(4, rng(s)).route(Req(0, [1]), 0.0, [0, 1, 2, 3], [1] * 4)[0] for s in range(400)]
    counts = np.bincount(picks, minlength=4)
    assert counts.min() > 60  # each of four tied workers is picked about 100 times


def test_temperature_samples_cheaper_workers_more_often():
    picks = []
    for s in range(300):
        router = KvRouter(4, rng(s), temperature=0.5, track_prefill_tokens=False)
        router.route(Req(100, [7, 8, 9, 10]), 0.0, [0], [1, 1])  # worker 0 busy: 4 active blocks
        picks.append(router.route(Req(0, [1]), 0.0, [0, 1], [1, 1])[0])
    ones = sum(picks)
    assert 200 < ones < 300  # costs 5 vs 1: softmax of normalised costs favours worker 1 ~ e^2:1


def test_kv_router_knobs_change_from_a_retune_update_on():
    from aisim.actors.protocol import ParamsUpdate, RouteCall, UpdateKind
    from aisim.actors.router.host import RouterHost

    router = KvRouter(4, rng(), prefill_load_scale=1.0, overlap_score_credit=1.0, track_active_blocks=False)
    router.on_kv_events(0, 0, STORED, [1, 2, 3, 4])
    host = RouterHost({"aggregated": router})
    # worker 0 holds the prefix [1..4] and now has 16 prompt tokens queued
    assert host.step([], [RouteCall("aggregated", 0, 16, [50, 51, 52, 53], 0.0, 0)], [[0]], [1])[0].worker_id == 0
    assert router.parameters() == {"overlap_score_credit": 1.0, "prefill_load_scale": 1.0, "temperature": 0.0}
    # after the update (scale 4, credit 0.5) the busy prefix holder costs 4 x (32/4 - 0.5 x 4) = 24
    # and worker 1 costs 4 x 16/4 = 16
    knobs = {"prefill_load_scale": 4.0, "overlap_score_credit": 0.5}
    out = host.step([ParamsUpdate("aggregated", UpdateKind.PARAMS, knobs)],
                    [RouteCall("aggregated", 1, 16, [1, 2, 3, 4], 0.0, 0)], [[0, 1]], [1, 1])
    assert out[0].worker_id == 1 and out[0].info["cost"] == 16.0
    assert router.parameters() == {"overlap_score_credit": 0.5, "prefill_load_scale": 4.0, "temperature": 0.0}
    with pytest.raises(ValueError, match="host_cache_hit_weight"):
        router.set_parameters({"host_cache_hit_weight": 1.0})


def test_kv_router_cached_view_follows_stored_runs_branches_and_evictions():
    # chain A = 1 2 3 4 is stored, then chain B = 1 2 5 6 stores its new blocks 5 6 (branching off 2)
    view = _CachedRuns()
    view.store(0, [1, 2, 3, 4])
    view.store(0, [5, 6])
    assert 1 in view.heads and 5 in view.heads and 3 not in view.heads  # (node starts)
    assert view.prefix_len(0, [1, 2, 5, 6, 7]) == 4  # A's node agrees on 1 2, B's node goes on
    assert view.prefix_len(0, [1, 2, 3, 9]) == 3 and view.prefix_len(0, [9, 1]) == 0
    view.remove(0, [4, 3, 6])  # A's tail, then B's leaf: two stretches in one event
    assert view.blocks(0) == {1, 2, 5} and view.held[0] == 3
    assert view.prefix_len(0, [1, 2, 3]) == 2 and view.prefix_len(0, [1, 2, 5, 6]) == 3
    with pytest.raises(RuntimeError, match="removed block 1 is not the end"):
        view.remove(0, [1])  # a parent before its children: not an engine's event stream
    with pytest.raises(RuntimeError, match="stored block 5 is cached already"):
        view.store(0, [5])
    view.remove(0, [5, 2, 1])
    assert view.blocks(0) == set() and view.held[0] == 0 and view.prefix_len(0, [1]) == 0 and not view.heads


def test_kv_router_cached_view_shares_nodes_between_candidates():
    # slot 0 caches 1 2 3 4; slot 2 caches 1 2 then 7 (branching off 2); slot 1 caches 1 2 3
    view = _CachedRuns()
    view.store(0, [1, 2, 3, 4])
    view.store(2, [1, 2])
    view.store(2, [7])
    view.store(1, [1, 2, 3])
    # nodes: [1 2] held by 0 1 2, [3] by 0 1, [4] by 0, [7] by 2
    assert {n.keys[0]: (list(n.keys), n.mask) for n in view.heads.values()} == {
        1: ([1, 2], 0b111), 3: ([3], 0b011), 4: ([4], 0b001), 7: ([7], 0b100)}
    # one walk answers every candidate: (mask, depth) of those that stop there
    assert view.depths([1, 2, 3, 4, 5], 5, 0b111) == [(0b100, 2), (0b010, 3), (0b001, 4)]
    assert view.depths([1, 2, 7, 8], 4, 0b111) == [(0b011, 2), (0b100, 3)]
    assert view.depths([1, 2, 7, 8], 4, 0b011) == [(0b011, 2)]  # (only the candidates asked about)
    assert view.depths([9, 1], 2, 0b111) == []
    # slot 0 evicts 4 3: [3] stays with slot 1 only; slot 1 evicts 3 2 1: [1 2] splits no further
    view.remove(0, [4, 3])
    view.remove(1, [3, 2, 1])
    assert {n.keys[0]: (list(n.keys), n.mask) for n in view.heads.values()} == {
        1: ([1, 2], 0b101), 7: ([7], 0b100)}
    assert [view.prefix_len(s, [1, 2, 3]) for s in range(3)] == [2, 0, 2]
    assert list(view.held[:3]) == [2, 0, 3]
    with pytest.raises(RuntimeError, match="removed block 2 is not the end"):
        view.remove(1, [2])  # (slot 1 holds nothing)



class _CacheReq:
    """What a KV cache reads and writes on a request."""

    def __init__(self, hashes):
        self.hashes = hash_view(hashes)
        self.held, self.num_held, self.dup_tail, self.num_private, self.num_full_registered = [], 0, False, 0, 0


def _admitted(kv, hashes, tokens: int):
    """A request for ``hashes`` admitted to ``kv`` with ``tokens`` computed (its prefix reused), or
    None when the blocks do not suffice (nothing held)."""
    req = _CacheReq(hashes)
    _, _, hits = kv.match_prefix(req.hashes, (tokens - 1) // kv.block_size)
    kv.acquire(req, hits)
    if kv.grow(req, tokens, req.hashes):
        return req
    kv.release(req)
    return None
def test_kv_router_weighs_lower_tier_blocks_until_they_are_evicted():
    # one candidate, a 4-block prompt, nothing on its GPU: blocks 0-1 in its host tier and 2-3 on
    # its disk credit 0.75 x 2 + 0.25 x 2 = 2 blocks of the prompt's 4 (cost 4 - 2 + 4 active);
    # evicting the disk blocks, then the host ones, takes the credit back
    from aisim.actors.engine.offload import DISK_REMOVED, DISK_STORED, HOST_REMOVED, HOST_STORED

    router = KvRouter(4, rng(), host_cache_hit_weight=0.75, disk_cache_hit_weight=0.25)
    hashes = [101, 102, 103, 104]

    def cost(index):
        req = Req(index, hashes)
        decision = router.route(req, 0.0, [0], [1])
        router.on_release(req)
        return decision[2]["cost"]

    router.on_kv_events(0, 0, HOST_STORED, [1, 0, 101, 102])
    router.on_kv_events(0, 0, DISK_STORED, [103, 104])
    assert cost(0) == 6.0
    router.on_kv_events(0, 0, DISK_REMOVED, [103, 104])
    assert cost(1) == 6.5
    router.on_kv_events(0, 0, HOST_REMOVED, [1, 0, 2])
    assert cost(2) == 8.0


def _tier_scopes(shared: bool) -> dict:
    """The KV router's tier scopes: one pool and store for all candidates, or each its own."""
    if shared:
        return {"host_tier": "cluster_shared", "disk_tier": "cluster_shared"}
    return {"host_tier": "dp_rank_local", "disk_tier": "worker_local"}


def test_the_router_reports_the_weight_of_each_tier_its_candidates_have():
    assert "host_cache_hit_weight" not in KvRouter(4, rng()).describe()
    d = KvRouter(4, rng(), host_cache_hit_weight=0.5, host_tier="dp_rank_local").describe()
    assert d["host_cache_hit_weight"] == 0.5 and "disk_cache_hit_weight" not in d
    d = KvRouter(4, rng(), **_tier_scopes(True)).describe()
    assert (d["host_cache_hit_weight"], d["disk_cache_hit_weight"]) == (0.75, 0.25)


@pytest.mark.parametrize("listed", [True, False])
def test_a_shared_host_tier_is_one_view_that_a_candidate_joining_later_sees(listed):
    # a cluster-shared host pool publishes through one rank (worker 0's): worker 1, first seen
    # when R1 is routed (a worker the Planner added), is credited with the pool's blocks too.
    # R0 (4 other blocks, 16 tokens) went to worker 0 alone: 16 prefill tokens and 4 active blocks
    # there. R1, 4 blocks that the pool holds: credit 0.75 x 4 = 3 on either worker;
    # worker 0: (16 + 16) / 4 - 3 + 4 + 4 = 13, worker 1: 16 / 4 - 3 + 0 + 4 = 5 (reported overlap
    # 3). A view per candidate gives worker 1 nothing (16 / 4 + 4 = 8); once the pool evicts the
    # blocks, neither has credit.
    from aisim.actors.engine.offload import DISK_STORED, HOST_REMOVED, HOST_STORED

    def routed(shared):
        router = KvRouter(4, rng(), **_tier_scopes(shared))
        router.listed_candidates = 10**6 if listed else 0
        router.route(Req(0, [201, 202, 203, 204]), 0.0, [0], [1, 1])
        router.on_kv_events(0, 0, HOST_STORED, [1, 0, 101, 102, 103, 104])
        first = router.route(Req(1, [101, 102, 103, 104]), 0.0, [0, 1], [1, 1])
        router.on_release(Req(1, []))
        router.on_kv_events(0, 0, HOST_REMOVED, [1, 0, 4])
        router.on_kv_events(0, 0, DISK_STORED, [101, 102])  # (a shared disk: 0.25 x 2 for both)
        return first, router.route(Req(2, [101, 102, 103, 104]), 0.0, [0, 1], [1, 1])

    first, after = routed(shared=True)
    assert (first[0], first[2]["cost"], first[2]["selected_overlap_blocks"]) == (1, 5.0, 3)
    assert (after[0], after[2]["cost"], after[2]["selected_overlap_blocks"]) == (1, 7.5, 0)
    first, after = routed(shared=False)
    assert (first[0], first[2]["cost"], first[2]["selected_overlap_blocks"]) == (1, 8.0, 0)
    assert (after[0], after[2]["cost"]) == (1, 8.0)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_kv_router_prices_alike_one_by_one_and_with_numpy(seed, shared):
    """The same event stream (real KV caches, offloading evicted blocks to host and disk views:
    each candidate's own, or with ``shared`` one pool and store for all, published through the
    first candidate) and the same arrivals give the same decisions, costs and views whichever way
    candidates are priced."""
    import random

    from aisim.actors.engine.kv_cache import KVCache
    from aisim.actors.engine.offload import DISK_STORED, HOST_STORED

    rnd = random.Random(seed)
    bs = 4
    workers = 24
    ranks_of = [1 + (w % 5 == 0) for w in range(workers)]  # (some workers with two ranks: 29 candidates)
    knobs = dict(overlap_score_credit=rnd.choice([0.0, 0.5, 1.0]), prefill_load_scale=rnd.choice([0.5, 1.0, 3.0]),
                 temperature=rnd.choice([0.0, 0.0, 0.6]), track_prefill_tokens=seed % 4 != 3,
                 track_active_blocks=seed % 4 != 2, host_cache_hit_weight=0.75, disk_cache_hit_weight=0.25,
                 kv_events=True, **_tier_scopes(shared))
    listed, arrayed = KvRouter(bs, rng(seed), **knobs), KvRouter(bs, rng(seed), **knobs)
    listed.listed_candidates, arrayed.listed_candidates = 10**6, 0
    caches = {(w, r): KVCache(rnd.randint(6, 30), bs, record_events=True)
              for w in range(workers) for r in range(ranks_of[w])}
    families = [[rnd.getrandbits(62) for _ in range(12)] for _ in range(4)]
    offloaded = {key: set() for key in caches}
    seq = 0

    live = []
    for index in range(300):
        if live and rnd.random() < 0.4:
            key, kreq, req = live.pop(rnd.randrange(len(live)))
            caches[key].release(kreq)
            for router in (listed, arrayed):
                router.on_first_token(req)
                router.on_release(req)
            continue
        hashes = rnd.choice(families)[: rnd.randint(0, 12)] + [rnd.getrandbits(62) for _ in range(rnd.randint(0, 5))]
        req = Req(index, hashes, prompt_len=len(hashes) * bs + rnd.randint(0, bs - 1), bs=bs)
        eligible = sorted(rnd.sample(range(workers), rnd.randint(1, workers)))
        a, b = listed.route(req, 0.0, eligible, ranks_of), arrayed.route(req, 0.0, eligible, ranks_of)
        assert a == b
        key = (a[0], a[1])
        kv = caches[key]
        kreq = _admitted(kv, hashes, max(1, req.prompt_len))
        if kreq is None:
            for router in (listed, arrayed):
                router.on_release(req)
            continue
        live.append((key, kreq, req))
        for kind, hs in kv.events:
            for router in (listed, arrayed):
                router.on_kv_events(key[0], key[1], kind, hs)
            if kind == REMOVED:  # evicted blocks go to the host tier, every third also to disk
                tier, via = (offloaded[(0, 0)], (0, 0)) if shared else (offloaded[key], key)
                for h in hs:
                    if h not in tier:
                        tier.add(h)
                        seq += 1
                        for router in (listed, arrayed):
                            router.on_kv_events(via[0], via[1], HOST_STORED, [seq, 0, h])
                            if h % 3 == 0:
                                router.on_kv_events(via[0], via[1], DISK_STORED, [h])
        kv.events.clear()
    for key in caches:
        assert listed.load_view(*key) == arrayed.load_view(*key)


@pytest.mark.parametrize("seed", range(20))
def test_kv_router_shared_cached_view_matches_every_candidates_cache(seed):
    """Several KV caches sharing prefix families publish into one shared view: after every event
    batch each slot's blocks are its cache's resident blocks and one walk gives every slot's
    leading cached blocks."""
    import random
    from itertools import takewhile

    from aisim.actors.engine.kv_cache import KVCache

    rnd = random.Random(seed)
    bs = rnd.choice([1, 4])
    caches = [KVCache(rnd.randint(5, 40), bs, record_events=True) for _ in range(rnd.randint(2, 9))]
    view = _CachedRuns()
    families = [[rnd.getrandbits(62) for _ in range(20)] for _ in range(3)]

    live = []
    for step in range(250):
        if live and rnd.random() < 0.45:
            s, kreq = live.pop(rnd.randrange(len(live)))
            caches[s].release(kreq)
            continue
        s = rnd.randrange(len(caches))
        kv = caches[s]
        hashes = rnd.choice(families)[: rnd.randint(0, 20)] + [rnd.getrandbits(62) for _ in range(rnd.randint(1, 6))]
        kreq = _admitted(kv, hashes, rnd.randint(1, len(hashes) * bs))
        if kreq is not None:
            live.append((s, kreq))
        for kind, hs in kv.events:
            (view.store if kind == STORED else view.remove)(s, hs)
        kv.events.clear()
        everyone = (1 << len(caches)) - 1
        for s2, kv2 in enumerate(caches):
            resident = kv2.resident()
            assert view.blocks(s2) == resident and view.held[s2] == len(resident)
        for fam in families:
            query = fam[: rnd.randint(1, 20)] + [rnd.getrandbits(62)]
            want = [len(list(takewhile(kv2.resident().__contains__, query))) for kv2 in caches]
            got = [0] * len(caches)
            for mask, depth in view.depths(query, len(query), everyone):
                for s2 in range(len(caches)):
                    if mask >> s2 & 1:
                        assert got[s2] == 0 and depth > 0
                        got[s2] = depth
            assert got == want
