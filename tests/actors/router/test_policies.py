"""Router contract suite (every policy) and the KV router's cost model."""

from __future__ import annotations

import numpy as np
import pytest

from aisim.actors.engine.kv_cache import REMOVED, STORED
from aisim.actors.router.policies import KvRouter, RandomRouter, RoundRobinRouter, _CachedBlocks


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


def drive(router, eligible, ranks_of, n=60, seed=0):
    """Route n requests (some sharing prefixes), completing some; return the decisions."""
    r = np.random.default_rng(seed)
    out = []
    live = []
    cached = {}  # (worker, rank) -> blocks stored there (as an engine publishes them: each once)
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
    first = drive(router, [0, 1, 2], [1, 1, 1], n=30)
    later = drive(router, [0, 2], [1, 1, 1], n=30, seed=1)  # worker 1 starts draining
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
        active = router._cands[(0, 0)].active
        assert active.holders() == dict(holders)
        assert active.num_blocks == len(holders) == router.load_view(0)["active_blocks"]
        probe = chain()
        assert active.depth(probe) == len(list(takewhile(holders.__contains__, probe)))


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
    view = _CachedBlocks()
    view.store([1, 2, 3, 4])
    view.store([5, 6])
    assert 1 in view and 5 in view and 3 not in view  # (only run starts: a chain's first block starts one)
    assert view.prefix_len([1, 2, 5, 6, 7]) == 4  # A's run agrees on 1 2, B's run goes on
    assert view.prefix_len([1, 2, 3, 9]) == 3 and view.prefix_len([9, 1]) == 0
    view.remove([4, 3, 6])  # A's tail, then B's leaf: two stretches in one event
    assert view.blocks() == {1, 2, 5} and view.num_blocks == 3
    assert view.prefix_len([1, 2, 3]) == 2 and view.prefix_len([1, 2, 5, 6]) == 3
    with pytest.raises(RuntimeError, match="removed block 1 is not the end"):
        view.remove([1])  # a parent before its children: not an engine's event stream
    view.remove([5, 2, 1])
    assert view.blocks() == set() and view.num_blocks == 0 and view.prefix_len([1]) == 0
