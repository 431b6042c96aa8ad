"""SGLang's radix cache and rank at the level of pages (the reference mocker's unit scenarios)."""

from __future__ import annotations

import random

from aisim.actors.engine.radix_cache import RadixCache, TokenSeq, common_tokens
from aisim.actors.engine.request import Request
from aisim.actors.engine.scheduler import GapSink, SchedulerConfig
from aisim.actors.engine.sglang import SGLangKnobs, SGLangRank
from aisim.actors.engine.timing import FixedTiming


class Tokens:
    """Hash source whose request i holds ``tokens[i]`` (one piece per token) then a private output."""

    def __init__(self, tokens: dict[int, list[int]]) -> None:
        self.tokens = tokens

    def token_pieces(self, index: int) -> TokenSeq:
        t = list(self.tokens[index]) + [1_000_000 + index]
        return TokenSeq(t, list(range(1, len(t))) + [len(t) + 4096])


def rank(page: int, pages: int, chunk: int = 8192) -> SGLangRank:
    cfg = SchedulerConfig(block_size=page, num_gpu_blocks=pages, sglang=SGLangKnobs(chunked_prefill_size=chunk))
    return SGLangRank(cfg, FixedTiming(10, 1))


def step(r: SGLangRank, t: float) -> tuple:
    """One pass at ``t``: (what it scheduled as (index, tokens), its end)."""
    rp = r.schedule(t)
    if rp is None:
        return None, t
    end = t + rp.duration_ms
    r.finish(rp, t, end, GapSink(), [])
    r.check()
    return [(q.index, n) for q, n in rp.items], end


def test_a_partial_last_page_is_owned_whole():
    r = rank(page=4, pages=100, chunk=8)
    req = Request(0, Tokens({0: list(range(6))}), 0.0, 6, 5)
    r.enqueue(req)
    assert r.schedule(0.0).items == [(req, 6)]
    assert req.num_computed == 6 and req.lease.own_pages == 2  # 8 tokens allocated


def test_a_prompt_longer_than_the_chunk_is_cut_to_it():
    r = rank(page=1, pages=20, chunk=8)
    req = Request(0, Tokens({0: list(range(16))}), 0.0, 16, 1)
    r.enqueue(req)
    assert r.schedule(0.0).items == [(req, 8)]


def test_a_request_charged_the_whole_chunk_budget_ends_admission():
    r = rank(page=4, pages=1000, chunk=8)
    a = Request(0, Tokens({0: list(range(7)), 1: list(range(100, 108))}), 0.0, 7, 2)
    b = Request(1, a.source, 0.0, 8, 2)
    r.enqueue(a)
    r.enqueue(b)
    assert [q.index for q, _ in r.schedule(0.0).items] == [0]  # 7 tokens are charged 2 pages: 8


def test_decode_takes_a_new_page_at_each_boundary():
    r = rank(page=4, pages=100, chunk=8)
    req = Request(0, Tokens({0: list(range(6))}), 0.0, 6, 10)
    r.enqueue(req)
    t = 0.0
    allocated = []
    for _ in range(4):
        _, t = step(r, t)
        allocated.append((req.lease.cached // 4 + req.lease.own_pages) * 4)
    # prefill (6 tokens + the first token's slot = 7), then 8, 9 (a new page), 10
    assert allocated == [8, 8, 12, 12]


def test_a_shared_prefix_leaves_only_the_new_tokens_to_prefill():
    src = Tokens({0: list(range(12)), 1: list(range(10)) + [50, 51, 52, 53]})
    r = rank(page=1, pages=1000, chunk=6)
    r.enqueue(Request(0, src, 0.0, 12, 1))
    t = 0.0
    while r.has_work:
        _, t = step(r, t)
    r.enqueue(Request(1, src, t, 14, 1))
    items, _ = step(r, t)
    assert items == [(1, 4)]  # one 4-token prefill


def test_a_fully_cached_prompt_computes_its_last_token():
    src = Tokens({0: list(range(5)), 1: list(range(5))})
    r = rank(page=1, pages=1000)
    r.enqueue(Request(0, src, 0.0, 5, 1))
    t = 0.0
    while r.has_work:
        _, t = step(r, t)
    r.enqueue(Request(1, src, t, 5, 1))
    items, _ = step(r, t)
    assert items == [(1, 1)]


def test_spans_compare_a_piece_at_a_time():
    a = TokenSeq([7, 8, 9], [512, 1024, 1300])
    b = TokenSeq([7, 8, 5], [512, 1024, 1500])
    assert common_tokens(a, b, 0, 2000) == 1024
    assert common_tokens(a, b, 600, 2000) == 424
    c = TokenSeq([7, 8], [512, 1000])  # the same pieces, one cut shorter: equal up to the cut
    assert common_tokens(a, c, 0, 2000) == 1000


def test_eviction_cuts_the_least_recently_used_leaf_newest_pages_first():
    tree = RadixCache(num_pages=10, page_size=2)
    old = TokenSeq([1], [8])
    new = TokenSeq([2], [8])
    for seq, t in ((old, 1.0), (new, 2.0)):
        assert tree.take_pages(4)
        node, dup = tree.insert(tree.root, seq, 8, t)
        assert dup == 0
        tree.release_leaf(node)
    assert tree.free_pages == 2 and tree.evictable_tokens == 16
    assert tree.take_pages(3)  # one page evicted: the older leaf's last
    assert tree.peek(old, 8) == 6 and tree.peek(new, 8) == 8
    assert tree.take_pages(4)  # the rest of the older leaf, then the newer one's last page
    assert tree.peek(old, 8) == 0 and tree.peek(new, 8) == 6


def test_random_traffic_keeps_every_page_accounted_for():
    rng = random.Random(5)
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(1, 40))] for _ in range(6)]
    tokens = {i: prefixes[rng.randrange(6)] + [rng.randrange(50) for _ in range(rng.randrange(0, 30))]
              for i in range(120)}
    src = Tokens(tokens)
    for page in (1, 2, 4):
        r = rank(page=page, pages=240 // page, chunk=16)
        reqs = [Request(i, src, 0.0, len(tokens[i]), rng.randrange(1, 40)) for i in range(120)]
        t = 0.0
        done = 0
        while reqs or r.has_work:
            if reqs and rng.random() < 0.3:
                r.enqueue(reqs.pop(0))
            rp = r.schedule(t)
            if rp is None:
                t += 1.0
                continue
            out = []
            r.finish(rp, t, t + rp.duration_ms, GapSink(), out)
            t += rp.duration_ms
            done += len(out) + len(r.rejected)
            r.rejected.clear()
            r.check()
        assert done == 120
        assert r.num_retractions > 0  # the pool is small enough to retract
