"""vLLM-style continuous-batching scheduler of one attention-data rank.

A pass (per rank):

1. ``budget = max_batched_tokens``.
2. Running requests first, in queue order: each asks for ``min(known - computed, budget)``
   tokens (1 for a decoding request, the next chunk for a prefilling one) and gets the blocks
   for them; when allocation fails the newest running request is preempted (recompute: it
   frees its blocks, ``num_computed = 0``, it goes to the front of the waiting queue) and the
   allocation is retried; preempting the request itself ends the loop.
3. Waiting requests next, FCFS with head-of-line blocking, only if nothing was preempted,
   while ``running < max_sequences`` and budget is left: reject requests that can never run
   (``Request.reject_reason``: ``context_length``, ``kv_capacity`` or ``max_batched_tokens``),
   look up the cached prefix (full blocks, up to the capacity policy's limit), admit when the
   capacity policy says the request fits, and schedule ``min(remaining, budget)`` tokens.

What a request needs to be admitted, how much of a prefix it may reuse and whether running
requests are preempted is the rank's capacity policy (``actors.engine.capacity``: vLLM's
recompute policy, or TensorRT-LLM's GUARANTEED_NO_EVICT, which never preempts).

The output is a plain ``RankPass``; effects are applied at pass end by ``finish``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from heapq import heapify, heappop, heappush
from operator import itemgetter, mul

from aisim.actors.engine.capacity import POLICIES
from aisim.actors.engine.gaps import GapSink
from aisim.actors.engine.kv_cache import KVCache
from aisim.actors.engine.offload import DEFER, RequestOffload
from aisim.actors.engine.request import (
    COMPLETED,
    HANDED_OFF,
    REJECT_BATCH_TOKENS,
    REJECT_CONTEXT_LENGTH,
    REJECT_KV_CAPACITY,
    REJECTED,
    RUNNING,
    WAITING,
    Request,
)
from aisim.actors.engine.speculation import accepted, draw_ahead, stream_of
from aisim.actors.engine.timing import PassShape, TimingModel

# speculative leads draw their requests' bursts ahead (``speculation.draw_ahead``): for this many
# passes, once at least AHEAD_BATCH of the lead have run out (the others then draw one by one),
# taking along those that run out within AHEAD_ALIGN passes (so the lead runs out together)
AHEAD_PASSES = 16
AHEAD_BATCH = 4
AHEAD_ALIGN = 8

_AGAIN = object()  # (RankScheduler._schedule: the pass only preempted; schedule again)


@dataclass(frozen=True)
class SchedulerConfig:
    max_batched_tokens: int = 8192
    max_sequences: int = 256
    block_size: int = 64
    num_gpu_blocks: int = 16384
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    context_length: int | None = None  # prompts >= this are rejected; generation stops at it
    preemption_mode: str = "lifo"  # or "fifo"
    prefill_schedule_interval: int = 1
    prefill_only: bool = False  # disaggregated prefill role: no decode, one hidden token
    capacity_policy: str = "vllm"  # actors.engine.capacity.POLICIES: vllm | guaranteed_no_evict (TRT-LLM)
    sglang: object = None  # SGLang's knobs (actors.engine.sglang.SGLangKnobs): an SGLang rank, not this one
    host_offload: object = None  # a host (G2) KV tier (actors.engine.offload.HostOffloadSpec)
    g3_offload: object = None  # a disk (G3) KV tier behind it (actors.engine.offload.G3Spec)
    speculation: object = None  # speculative decoding (actors.engine.speculation.Speculation)


@dataclass(slots=True)
class RankPass:
    """What one rank scheduled for one pass."""

    items: list  # [(request, num_new_tokens)]
    shape: PassShape
    duration_ms: float
    num_preempted: int
    var_prefill_length: float = 0.0  # of the chunks computed this pass
    var_decode_kv_tokens: float = 0.0  # of the decoding requests' sequence lengths
    num_lead: int = 0  # the first items are this many decoding requests (one token each, or a burst), nothing else


def queue_stats(waiting) -> tuple:
    """(prefill requests, their prompt tokens, variance; decode requests, their KV tokens, variance)
    of a waiting queue: fresh prompts queue for prefill; preempted and transferred requests wait to
    resume decoding."""
    np_ = tok = sq_t = nd = kv = sq_kv = 0
    for req in waiting:
        if req.num_generated == 0 and not req.materialized:
            np_ += 1
            tok += req.prompt_len
            sq_t += req.prompt_len * req.prompt_len
        else:
            k = req.prompt_len + req.num_generated
            nd += 1
            kv += k
            sq_kv += k * k
    var_t = sq_t / np_ - (tok / np_) ** 2 if np_ else 0.0
    var_kv = sq_kv / nd - (kv / nd) ** 2 if nd else 0.0
    return np_, tok, var_t, nd, kv, var_kv


def blocks_bound(computed: list[int], remaining: list[int], k: int, bs: int, avail: int) -> int:
    """At most ``k`` decode passes of requests with ``computed`` tokens (request i leaving after
    ``remaining[i]`` of them) before their blocks of ``bs`` tokens would need more than ``avail``
    new ones: pass j of a request with c tokens needs a new block when (c + j) % bs == 0."""
    # each request needs at most k // bs + 1 of them
    if len(computed) * (k // bs + 1) <= avail:
        return k
    ends = [r if r < k else k for r in remaining]
    if bs == 1:  # every pass takes one block per request still there: the first pass past avail
        ends.sort()
        n = len(ends)
        used = j = 0
        for i, e in enumerate(ends):  # passes j..e-1 take n - i blocks each
            if e > j:
                if used + (e - j) * (n - i) > avail:
                    return j + (avail - used) // (n - i)
                used += (e - j) * (n - i)
                j = e
        return k
    firsts = [(-c) % bs for c in computed]
    total = sum([(e - 1 - a) // bs + 1 for a, e in zip(firsts, ends) if a < e])
    if total > avail:
        k = sorted(j for a, e in zip(firsts, ends) for j in range(a, e, bs))[avail]
    return k


def _cut_path(path: list, limit: int) -> tuple[int, int, list]:
    """``KVCache.match_prefix``'s answer for ``limit`` blocks from its answer for more."""
    out = []
    pos = active = 0
    for run, n in path:
        if pos >= limit:
            break
        if n > limit - pos:
            n = limit - pos
        out.append((run, n))
        if run.holders:
            active += n
        pos += n
    return pos, active, out


def make_rank(config: "SchedulerConfig", timing: TimingModel, record_kv_events: bool = False):
    """The rank scheduler a config names: SGLang's when it carries SGLang knobs, else this module's."""
    if config.sglang is not None:
        from aisim.actors.engine.sglang import SGLangRank

        return SGLangRank(config, timing, record_kv_events)
    return RankScheduler(config, timing, record_kv_events)


class RankQueues:
    """What every rank scheduler answers of its ``running`` and ``waiting`` queues, and how it
    rejects a request."""

    __slots__ = ()
    offload = None  # host/disk KV tiers (actors.engine.offload.RankOffload; vLLM ranks: attach_offload)

    @property
    def has_work(self) -> bool:
        return bool(self.running) or bool(self.waiting) or (self.offload is not None and bool(self.offload.loading))

    @property
    def num_requests(self) -> int:
        off = self.offload
        return len(self.running) + len(self.waiting) + (len(off.loading) if off is not None else 0)

    def queue_stats(self) -> tuple:
        return queue_stats(self.waiting)

    def _reject(self, req: Request, now_ms: float, code: str) -> None:
        """``req`` can never run here (``code``: a ``REJECT_*``; the rank says why in a sentence)."""
        req.reject_reason = code
        req.reject_detail = self.rejection_detail(req, code)
        req.status = REJECTED
        req.terminal_ms = now_ms
        req.hashes = req.tokens = None
        self.rejected.append(req)


class RankScheduler(RankQueues):
    """Scheduler + KV cache of one rank."""

    joins_runs = True  # a transferred request may join a decode run (EngineWorker._join)

    def __init__(self, config: SchedulerConfig, timing: TimingModel, record_kv_events: bool = False) -> None:
        self.config = config
        self.timing = timing
        self.kv = KVCache(config.num_gpu_blocks, config.block_size, config.enable_prefix_caching, record_kv_events)
        self.running: list[Request] = []
        self.policy = policy = POLICIES[config.capacity_policy](config, self.kv)
        # (at most 29 instance attributes: CPython 3.11 keeps the fast shared-key attribute
        # layout only below 30; a test checks it)
        self._tracks = policy.tracks  # (its hooks are called only when it keeps state)
        self._max_prompt = policy.max_prompt_tokens(config)
        self._reuse_last = 0 if policy.reuses_whole_prompt else 1  # tokens a prefix hit leaves to compute
        self.waiting: deque[Request] = deque()
        self.total_kv_tokens = config.num_gpu_blocks * config.block_size
        self.num_preemptions = 0
        self.committed_prefill_tokens = 0
        self.num_generated_tokens = 0
        self.rejected: list[Request] = []
        self.handoffs: list[Request] = []  # prefill role: prompts done, KV held for the transfer
        self.first_tokens: list[Request] | None = None  # set to a list to be told of first tokens
        self.pool_label = "prefill" if config.prefill_only else "agg"  # "decode" for a decode pool
        # forward-pass metrics of the last pass: (wall_ms, prefill reqs, prefill tokens, prefill KV read,
        # var prefill length, decode reqs, decode KV tokens, var decode KV)
        self.last_pass: tuple | None = None
        self.pass_count = 0
        cl = config.context_length
        self.context_limit = cl if cl is not None else 1 << 62  # prompts >= it are rejected; generation stops at it
        self._lifo = config.preemption_mode == "lifo"
        # The lead of the last pass (its leading decode requests), kept for the next pass: when
        # that pass finished and nothing else ran since (``_lead_at`` is the pass count then) and
        # the running list still starts with the same requests, each of them is one token
        # further and holds the same blocks unless it grew, so the next pass takes them as they
        # are (see ``_cached_lead``): its sums follow from the last ones, and only the requests
        # due for a block (``_lead_due``: pass count -> [(lead position, request)], built on the
        # first reuse, with the next position under ``_NEXT_POSITION`` and ``_STALE`` once requests
        # of the lead completed) are looked at. Requests of the lead that complete in its pass
        # leave it; the others lead on.
        self._lead: list[Request] | None = None
        self._lead_items: list = []
        self._lead_kv = self._lead_sq = 0
        self._lead_due: dict[int, list] | None = None
        self._lead_pass: RankPass | None = None  # the pass that took the lead (finish() checks it)
        self._lead_at = -1

    # -- queue ------------------------------------------------------------------
    def enqueue(self, req: Request) -> None:
        req.status = WAITING
        if self._tracks:
            self.policy.prepare(req)
        if self.offload is not None:  # (its tier state is this rank's: a handed-off request starts afresh)
            req.offload = RequestOffload()
        self.waiting.append(req)

    # -- general pass ---------------------------------------------------------------
    def attach_offload(self, off) -> None:
        """Give this rank host (G2) / disk (G3) KV tiers (``actors.engine.offload.RankOffload``)."""
        self.offload = off
        self.kv.watch = off.sources
        self.joins_runs = False

    def schedule(self, now_ms: float, defer_prefill: bool = False) -> RankPass | None:
        """The rank's next pass (None: nothing to run); a pass that could only preempt is
        scheduled again at once, as the engine steps again (the preempted requests now wait)."""
        while True:
            rp = self._schedule(now_ms, defer_prefill)
            if rp is not _AGAIN:
                return rp

    def _schedule(self, now_ms: float, defer_prefill: bool):
        cfg = self.config
        off = self.offload
        if off is not None:
            off.domain.advance(now_ms)
        running = self.running
        waiting = self.waiting
        kv = self.kv
        bs = cfg.block_size
        budget = cfg.max_batched_tokens
        chunked = cfg.enable_chunked_prefill
        caching = kv.prefix_caching
        items: list = []
        num_preempted = 0
        # decode requests (one token each) are summed as they are scheduled
        num_decode = decode_kv = sq_kv = 0
        i = num_lead = 0
        num_running = len(running)
        lead = self._lead
        self._lead = None  # (kept below when this pass takes a lead)
        spec = cfg.speculation
        spent = None  # speculative decoding: request -> budget its decode step took (drafts count)
        if num_running and spec is not None:
            taken = self._spec_lead(budget)
            if taken is not None:
                items, decode_kv, sq_kv = taken
                i = num_lead = num_decode = len(items)
                budget -= i * spec.verify_tokens
        elif num_running:
            # the leading decode requests at once when they all fit and every block they need is
            # there (the same outcome as one by one: no allocation fails, so nobody is preempted)
            if lead is not None and self._lead_at == self.pass_count:
                if running[: len(lead)] == lead:
                    taken = self._cached_lead(lead, budget)
                else:  # (requests of the lead completed in its pass: the others lead on)
                    kept = [r for r in lead if r.status == RUNNING]
                    if running[: len(kept)] == kept and all([r.status == COMPLETED for r in lead if r.status != RUNNING]):
                        taken = self._cached_lead(kept, budget, len(lead) - len(kept))
                    else:
                        taken = self._new_lead(budget)
            else:
                taken = self._new_lead(budget)
            if taken is not None:
                items, decode_kv, sq_kv = taken
                d = len(items)
                budget -= d
                i = num_lead = num_decode = d
        while i < num_running and budget > 0:
            req = running[i]
            known = req.prompt_len + req.num_generated
            n = known - req.num_computed
            if defer_prefill and not req.prefill_done and n > 1:
                i += 1
                continue
            cost = n
            if n > budget:
                if not chunked:
                    break
                n = cost = budget
            elif spec is not None and req.prefill_done:  # a decode step verifying drafts: its burst
                cost = spec.verify_tokens if spec.verify_tokens < budget else budget
                n = self._burst(req, known, cost)
                if spent is None:
                    spent = {}
                spent[req] = cost
            target = req.num_computed + n
            # inline no-op check of kv.grow: most decode steps need no new block
            if target > (req.num_held + req.num_private) * bs or (
                caching and target >= (req.num_full_registered + 1) * bs
            ):
                can_schedule = True
                while not kv.grow(req, target, req.hashes):
                    if not self.policy.preempts:  # (its admission reserved the blocks: cannot happen)
                        can_schedule = False
                        break
                    victim = running.pop() if self._lifo else running.pop(0)
                    num_running -= 1
                    was_decode = victim.prefill_done
                    self._preempt(victim)
                    num_preempted += 1
                    if victim is req:
                        can_schedule = False
                        break
                    if not self._lifo:
                        # the oldest was ahead of us: undo its scheduled work if any
                        i -= 1
                        num_lead = 0
                        for k, (r, rn) in enumerate(items):
                            if r is victim:
                                del items[k]
                                budget += spent.get(r, rn) if spent else rn
                                if was_decode:
                                    vk = victim.prompt_len + victim.num_generated
                                    num_decode -= 1
                                    decode_kv -= vk
                                    sq_kv -= vk * vk
                                break
                if not can_schedule:
                    break
            items.append((req, n))
            budget -= cost
            i += 1
            if req.prefill_done:
                num_decode += 1
                decode_kv += known
                sq_kv += known * known

        if not num_preempted and not defer_prefill:
            max_seqs = cfg.max_sequences
            if off is not None and off.loading:
                for req, n in self._admit_loaded(now_ms, budget):
                    items.append((req, n))
                    budget -= n
            while waiting and budget > 0 and len(running) < max_seqs:
                req = waiting[0]
                known = req.prompt_len + req.num_generated
                if req.num_generated == 0:
                    why = self._never_fits(req)
                    if why:
                        waiting.popleft()
                        self._reject(req, now_ms, why)
                        continue
                fit = self._fit(req, known) if off is None else self._fit_offload(req, known, now_ms)
                if fit is None:
                    break
                if fit is False:  # (onboarding from host memory, or its lookup deferred: the next one)
                    continue
                hashes, reused, hits = fit
                if req.materialized or reused == known:
                    # transferred KV, or the whole sequence cached (a policy that reuses every
                    # full block): the prompt is computed but its last token, whose decode step
                    # emits the client-visible first token
                    start, n = known - 1, 1
                    req.prefill_done = True
                else:
                    start, n = reused, known - reused
                    if n > budget:
                        if not chunked:
                            break
                        n = budget
                if not self._admit(req, fit, start, n, now_ms):
                    break
                items.append((req, n))
                budget -= n
                if req.prefill_done:  # (a transferred request arrives with its prompt done)
                    num_decode += 1
                    decode_kv += known
                    sq_kv += known * known

        if not items:
            if num_preempted:
                # a pass that only preempted (the requests it could not grow, FIFO's oldest first):
                # the engine steps again at once, its waiting queue now considered (else the rank
                # idled with work until some other event woke it: a stalled replay)
                self.num_preemptions += num_preempted
                return _AGAIN
            return None
        num_prefill = new_tokens = sum_prefix = sq_new = 0
        if num_decode < len(items):
            for req, n in items[num_lead:] if num_lead else items:
                if not req.prefill_done:
                    num_prefill += 1
                    new_tokens += n
                    sq_new += n * n
                    sum_prefix += req.num_computed
        if cfg.prefill_only:
            num_decode = decode_kv = 0
        shape = PassShape(num_prefill, new_tokens, sum_prefix + new_tokens, sum_prefix, num_decode, decode_kv,
                          self.total_kv_tokens)
        duration = self.timing.pass_ms(shape)
        if off is not None:
            duration += self._offload_pass(items[num_lead:] if num_lead else items, now_ms)
        self.num_preemptions += num_preempted
        var_p = sq_new / num_prefill - (new_tokens / num_prefill) ** 2 if num_prefill else 0.0
        var_d = sq_kv / num_decode - (decode_kv / num_decode) ** 2 if num_decode else 0.0
        rp = RankPass(items, shape, duration, num_preempted, var_p, var_d, num_lead)
        if self._lead is not None:
            if num_lead == len(self._lead):
                self._lead_pass = rp
            else:  # (a FIFO preemption took a lead request back)
                self._lead = None
        return rp

    def _burst(self, req: Request, known: int, verify: int) -> int:
        """The tokens a decode step of ``req`` emits with speculative decoding: 1 + the drafts its
        acceptance stream accepts at this pass, at most the ``verify`` tokens it computes and what
        it may still generate (its output and the context length)."""
        spec = self.config.speculation
        b = 1 + accepted(spec, stream_of(spec, req), req.spec_passes)
        room = req.max_output - req.num_generated
        if self.context_limit - known < room:
            room = self.context_limit - known
        return min(b, verify, room)

    def _spec_lead(self, budget: int) -> tuple | None:
        """``_new_lead`` with speculative decoding: the leading decode requests, each with its
        burst (``_burst`` with all its drafts verified) and the blocks for it: (items, their KV
        tokens, sum of squares); None (changing nothing) when there are none, their verify
        tokens exceed ``budget`` or a block they need is not there."""
        running = self.running
        spec = self.config.speculation
        decoding = [r.prefill_done for r in running]
        d = len(running) if all(decoding) else decoding.index(False)
        if not d or d * spec.verify_tokens > budget:
            return None
        limit = self.context_limit
        bs = self.config.block_size
        caching = self.kv.prefix_caching
        lead = running[:d]
        need = [r for r in lead if r.spec_passes >= r.spec_ahead_end]
        if need:
            if len(need) >= AHEAD_BATCH:
                draw_ahead(spec, [r for r in lead if r.spec_passes + AHEAD_ALIGN >= r.spec_ahead_end], AHEAD_PASSES)
            else:  # (a few: one pass each, as they come)
                for r in need:
                    p = r.spec_passes
                    r.spec_ahead = [1 + accepted(spec, stream_of(spec, r), p)]
                    r.spec_ahead_at = p
                    r.spec_ahead_end = p + 1
        items = []
        grow = []
        kv = sq = 0
        for r in lead:
            b = r.spec_ahead[r.spec_passes - r.spec_ahead_at]
            g = r.num_generated
            known = r.prompt_len + g
            if r.max_output - g < b or limit - known < b:  # (near its end: what it may still emit)
                b = min(b, r.max_output - g, limit - known)
            items.append((r, b))
            c = r.num_computed + b
            if c > (r.num_held + r.num_private) * bs or (caching and c >= (r.num_full_registered + 1) * bs):
                grow.append((r, c))
            kv += known
            sq += known * known
        if grow and not self.kv.grow_decode(grow):
            return None
        return items, kv, sq

    def _new_lead(self, budget: int) -> tuple | None:
        """The leading decode requests of ``running``, their blocks grown for one more token:
        (items, their KV tokens, sum of squares), kept as ``_lead``; None (changing nothing)
        when there are none, they exceed ``budget`` or a block they need is not there."""
        running = self.running
        decoding = [r.prefill_done for r in running]
        d = len(running) if all(decoding) else decoding.index(False)
        if not 0 < d <= budget:
            return None
        lead = running[:d]
        grow = self._needing_blocks(lead)
        if grow and not self.kv.grow_decode(grow):
            return None
        known = [r.prompt_len + r.num_generated for r in lead]
        items = [(r, 1) for r in lead]
        self._lead = lead
        self._lead_items = items
        self._lead_kv = kv = sum(known)
        self._lead_sq = sq = sum(map(mul, known, known))
        self._lead_due = None
        return items[:], kv, sq

    def _cached_lead(self, lead: list, budget: int, num_gone: int = 0) -> tuple | None:
        """``_new_lead`` when the last pass's lead leads again, each request one token further
        (and any that finished their prompt in it appended; ``num_gone`` of it completed in it and
        left ``lead``): the same outcome from the kept sums and the requests due for a block."""
        running = self.running
        d0 = len(lead)
        d = d0
        n = len(running)
        while d < n and running[d].prefill_done:
            d += 1
        if d > budget:
            return self._new_lead(budget)
        q = self.pass_count
        items = self._lead_items
        # every request of the last lead generated one token since: k -> k + 1
        kv = self._lead_kv
        sq = self._lead_sq + 2 * kv + d0 + num_gone
        kv += d0 + num_gone
        due = self._lead_due
        if num_gone:  # (their sums go; their entries due for a block are dropped when due)
            known = [r.prompt_len + r.num_generated for r, _ in items if r.status != RUNNING]
            kv -= sum(known)
            sq -= sum(map(mul, known, known))
            items = [e for e in items if e[0].status == RUNNING]
            if due is not None:
                due[_STALE] = True
        if due is None:
            due = self._lead_due = {_NEXT_POSITION: d0}
            self._add_due(enumerate(lead), q)
        if d > d0:
            new = running[d0:d]
            known = [r.prompt_len + r.num_generated for r in new]
            kv += sum(known)
            sq += sum(map(mul, known, known))
            at = due[_NEXT_POSITION]
            self._add_due(enumerate(new, at), q)
            due[_NEXT_POSITION] = at + d - d0
            lead = lead + new
            items = items + [(r, 1) for r in new]
        self._lead_items = items
        now = due.pop(q, None)
        if now is not None:
            if _STALE in due:  # (not those that completed since they were filed)
                now = [e for e in now if e[1].status == RUNNING]
            now.sort()  # lead order: the order of the registrations (KV events, insertion order)
            grow = self._needing_blocks([r for _, r in now])
            if grow and not self.kv.grow_decode(grow):
                return None  # (the lead is dropped: the caller schedules one by one)
            self._add_due(now, q, after=True)
        self._lead = lead
        self._lead_kv = kv
        self._lead_sq = sq
        return self._lead_items[:], kv, sq

    def _needing_blocks(self, reqs: list) -> list:
        """``(request, tokens)`` for the decoding ``reqs`` whose next token needs a block grown:
        kv.grow's test for c + 1 tokens (ceil((c + 1) / bs) > held + private blocks, or
        (c + 1) // bs > registered full blocks with prefix caching) in integer form."""
        bs = self.config.block_size
        caching = self.kv.prefix_caching
        last = bs - 1
        return [(r, r.num_computed + 1) for r in reqs
                if r.num_computed >= (r.num_held + r.num_private) * bs
                or (caching and r.num_computed >= r.num_full_registered * bs + last)]

    def _add_due(self, entries, q: int, after: bool = False) -> None:
        """File lead requests ``(position, request)`` under the pass count at which each next
        needs a block (``q``: this pass's; ``after``: their blocks for it are there)."""
        due = self._lead_due
        bs = self.config.block_size
        caching = self.kv.prefix_caching
        first = q + 1 if after else q
        for e in entries:
            r = e[1]
            c = r.num_computed
            # the first pass (one token each) at which kv.grow's test above holds
            k = q + (r.num_held + r.num_private) * bs - c
            if caching:
                k2 = q + r.num_full_registered * bs + bs - 1 - c
                if k2 < k:
                    k = k2
            if k < first:
                k = first
            b = due.get(k)
            if b is None:
                due[k] = [e]
            else:
                b.append(e)

    def _fit(self, req: Request, known: int) -> tuple | None:
        """The waiting head's cached prefix when its whole sequence fits in the blocks not held
        by live requests (its active cached blocks aside): (hashes, reused tokens, hit); else None."""
        kv = self.kv
        bs = self.config.block_size
        hashes = req.block_hashes(bs) if self.config.enable_prefix_caching else None
        if hashes is not None:
            num_hits, active_hits, hits = kv.match_prefix(hashes, (known - self._reuse_last) // bs)
        else:
            num_hits, active_hits, hits = 0, 0, []
        return self._fit_match(req, known, hashes, num_hits, active_hits, hits)

    def _fit_match(self, req: Request, known: int, hashes, num_hits: int, active_hits: int, hits: list):
        """``_fit``'s answer for the prefix match ``(num_hits, active_hits, hits)``."""
        policy = self.policy
        if req.index not in policy.reserved_ids and not policy.fits(req, known, active_hits):
            return None
        return hashes, num_hits * self.config.block_size, hits

    def _admit(self, req: Request, fit: tuple, start: int, n: int, now_ms: float) -> bool:
        """Admit the waiting head with ``fit`` (``_fit``'s), ``start`` tokens computed and blocks
        for ``n`` more; False (changing nothing) if the blocks are not there."""
        hashes, reused, hits = fit
        kv = self.kv
        self.waiting.popleft()
        kv.acquire(req, hits)
        req.num_computed = start
        if not kv.grow(req, start + n, hashes):  # cannot happen after _fit's test
            kv.release(req)
            req.num_computed = 0
            self.waiting.appendleft(req)
            return False
        req.status = RUNNING
        reserved = self.policy.reserved_ids
        if req.index in reserved:  # (its blocks were reserved before its transfer)
            reserved.discard(req.index)
        elif self._tracks:
            self.policy.admitted(req)
        req.admissions.append((now_ms, reused, self.pool_label))
        if req.first_admit_ms is None:
            req.first_admit_ms = now_ms
        self.running.append(req)
        return True

    # -- host (G2) / disk (G3) KV tiers ---------------------------------------------------------
    def _fit_offload(self, req: Request, known: int, now_ms: float):
        """``_fit`` on a rank with KV tiers: when the GPU-cached prefix stops short of the prompt's
        complete blocks and G2 continues it, the request reserves GPU blocks for the whole hit and
        waits for its onboarding in the connector queue (False), or waits there until a transfer
        ends when a block it needs is in flight (False); else ``_fit``'s answer."""
        kv = self.kv
        bs = self.config.block_size
        if req.materialized or not kv.prefix_caching:
            return self._fit(req, known)
        hashes = req.block_hashes(bs)
        full = req.prompt_len // bs
        n1, active1, hits1 = kv.match_prefix(hashes, full)
        limit = (known - self._reuse_last) // bs
        if n1 >= full:
            if limit > full:
                return self._fit(req, known)
            return self._fit_match(req, known, hashes, *_cut_path(hits1, limit))  # (``_fit``'s match)
        off = self.offload
        state = req.offload
        n2, outcome, path = off.lookup(req, state, hashes, n1, full, now_ms)
        if outcome == DEFER:
            off.counted(0)
            self.waiting.popleft()
            state.gen = off.domain.generation
            off.loading.append(req)
            return False
        if not self.policy.fits(req, known, active1):
            return None  # (``_fit``'s answer too: the hit is the same below ``limit``)
        off.counted(n2)
        off.touch(state, path)
        if not n2:
            if n1 <= limit:  # (``_fit``'s match: the same blocks)
                return hashes, n1 * bs, hits1
            return self._fit_match(req, known, hashes, *_cut_path(hits1, limit))
        self.waiting.popleft()
        kv.acquire(req, hits1)
        mark = len(kv.fenced)  # (the running requests' evictions fence the pass; these the onboarding)
        if not kv.reserve(n2):
            kv.release(req)
            self.waiting.appendleft(req)
            return None
        req.num_private += n2
        fence = off.fence_ms(kv.fenced[mark:])
        del kv.fenced[mark:]
        state.g1_blocks = n1
        off.start_load(req, state, hashes, n1, n1 + n2, now_ms, fence)
        off.loading.append(req)
        return False

    def _admit_loaded(self, now_ms: float, budget: int) -> list:
        """The connector queue first: requests whose onboarding ended are admitted (a batch slot
        and budget allowing), their prefill starting after the loaded prefix; deferred lookups
        retry (back at the front of the waiting queue) once a transfer ended."""
        off = self.offload
        cfg = self.config
        bs = cfg.block_size
        kv = self.kv
        running = self.running
        gen = off.domain.generation
        idle = off.domain.next_event_ms() == float("inf")
        out = []
        retry = []
        kept = []
        blocked = False
        for req in off.loading:
            state = req.offload
            job = state.load
            if job is None:  # a deferred lookup
                if state.gen != gen or idle:
                    retry.append(req)
                else:
                    kept.append(req)
                continue
            if blocked or not job.ended or len(running) >= cfg.max_sequences or budget <= 0:
                blocked = blocked or job.ended
                kept.append(req)
                continue
            known = req.prompt_len + req.num_generated
            start = min((known - 1) // bs, state.g1_blocks + len(job.keys)) * bs
            n = known - start
            if n > budget:
                if not cfg.enable_chunked_prefill:
                    blocked = True
                    kept.append(req)
                    continue
                n = budget
            req.num_computed = start
            if not kv.grow(req, start + n, req.hashes):
                req.num_computed = 0
                blocked = True
                kept.append(req)
                continue
            state.load = None
            req.status = RUNNING
            if not req.admissions:
                req.host_reused = start - min(state.g1_blocks * bs, start)
            req.admissions.append((now_ms, start, self.pool_label))
            if req.first_admit_ms is None:
                req.first_admit_ms = now_ms
            state.cursor = max(state.cursor, start // bs)
            running.append(req)
            out.append((req, n))
            budget -= n
        off.loading.clear()
        off.loading.extend(kept)
        for req in reversed(retry):
            self.waiting.appendleft(req)
        return out

    def _offload_pass(self, items: list, now_ms: float) -> float:
        """Pass start on a rank with KV tiers: each scheduled request's store cohort (its complete
        prompt blocks computed by the pass's end that G2 lacks); returns how long the pass's
        compute waits for stores still copying GPU blocks this pass overwrites."""
        off = self.offload
        bs = self.config.block_size
        for req, n in items:
            state = req.offload
            upto = min(req.num_computed + n, req.prompt_len) // bs
            if upto > state.cursor and not state.stuck:
                off.prepare_store(req, state, upto)
        if off.lagging:  # decoding requests whose cohort found no room before: retried each pass
            for req in list(off.lagging):
                if req.status != RUNNING:
                    off.lagging.discard(req)
                elif not req.prefill_done or req.offload.cursor >= req.prompt_len // bs:
                    continue  # (scheduled above, or caught up)
                else:
                    off.prepare_store(req, req.offload, min(req.num_computed + 1, req.prompt_len) // bs)
        fenced = self.kv.fenced
        if not fenced:
            return 0.0
        fence = off.fence_ms(fenced)
        fenced.clear()
        return fence - now_ms if fence > now_ms else 0.0

    def _never_fits(self, req: Request) -> str | None:
        """The reason code (``REJECT_*``, truthy) when ``req`` can never run here, else None."""
        cfg = self.config
        if req.prompt_len >= self.context_limit:
            return REJECT_CONTEXT_LENGTH
        if req.prompt_len > self._max_prompt:
            return REJECT_KV_CAPACITY
        if not cfg.enable_chunked_prefill and req.prompt_len > cfg.max_batched_tokens:
            return REJECT_BATCH_TOKENS
        return None

    def rejection_detail(self, req: Request, code: str) -> str:
        """The sentence for a rejection (built only when one happens)."""
        cfg = self.config
        n = req.prompt_len
        if code == REJECT_CONTEXT_LENGTH:
            return f"prompt of {n:,} tokens >= context length {self.context_limit:,}"
        if code == REJECT_KV_CAPACITY:
            cache = "the cache" if self.pool_label == "agg" else f"the {self.pool_label} cache"
            return (f"prompt of {n:,} tokens needs {-(-n // cfg.block_size):,} KV blocks, "
                    f"{cache} holds {cfg.num_gpu_blocks:,} (block size {cfg.block_size})")
        if code == REJECT_BATCH_TOKENS:
            return f"prompt of {n:,} tokens > max batched tokens {cfg.max_batched_tokens:,} with chunked prefill off"
        return ""

    def _preempt(self, req: Request) -> None:
        if self._tracks:
            self.policy.left(req)
        off = self.offload
        if off is not None and req.offload is not None:  # (its blocks wait for its last store)
            store = req.offload.store
            if store is not None and not store.ended:
                self.kv.fenced.append(store)
            if off.stores:
                off.released(req)
        self.kv.release(req)
        req.num_computed = 0
        req.prefill_done = False
        req.status = WAITING
        self.waiting.appendleft(req)

    def finish(self, rp: RankPass, start_ms: float, end_ms: float, gaps: GapSink, completed: list) -> None:
        """Apply a pass's effects at its end: computed tokens, emitted tokens, completions."""
        if self.offload is not None and self.offload.cohorts:
            self.offload.submit_stores(end_ms)
        limit = self.context_limit
        pooled = 0
        any_done = False
        prefill_only = self.config.prefill_only
        sh = rp.shape
        self.last_pass = (end_ms - start_ms, sh.num_prefill, sh.prefill_new_tokens, sh.prefill_sum_prefix,
                          rp.var_prefill_length, sh.num_decode, sh.decode_kv_tokens, rp.var_decode_kv_tokens)
        self.pass_count += 1
        if rp is self._lead_pass:
            self._lead_at = self.pass_count
        items = rp.items
        lead = rp.num_lead
        spec = self.config.speculation
        zeros = 0  # tokens after the first of a speculative burst (0 ms gaps)
        if lead and spec is not None:
            # (the same for bursts: each computes and emits n tokens)
            individual = gaps.individual
            emitted = 0
            for req, n in items[:lead] if lead < len(items) else items:
                req.num_computed += n
                g0 = req.num_generated
                g = g0 + n
                req.num_generated = g
                req.spec_passes += 1
                req.spec_tokens += n
                last = req.last_token_ms
                if last == start_ms:
                    pooled += 1
                else:
                    individual.append(end_ms - last)
                if g0 == 1:
                    req.second_token_ms = end_ms
                req.last_token_ms = end_ms
                emitted += n
                if g >= req.max_output or req.prompt_len + g >= limit:
                    req.status = COMPLETED
                    req.terminal_ms = end_ms
                    any_done = True
            self.num_generated_tokens += emitted
            zeros += emitted - lead
            items = items[lead:] if lead < len(items) else ()
        elif lead:
            # the leading decoding requests: what the loop below does for them, without the
            # branches that cannot apply (each computes its one token and emits another)
            individual = gaps.individual
            for req, _ in items[:lead] if lead < len(items) else items:
                req.num_computed += 1
                g = req.num_generated + 1
                req.num_generated = g
                last = req.last_token_ms
                if last == start_ms:
                    pooled += 1
                else:
                    individual.append(end_ms - last)
                if g == 2:
                    req.second_token_ms = end_ms
                req.last_token_ms = end_ms
                if g >= req.max_output or req.prompt_len + g >= limit:
                    req.status = COMPLETED
                    req.terminal_ms = end_ms
                    any_done = True
            self.num_generated_tokens += lead
            if lead < len(items):
                items = items[lead:]
            else:
                items = ()
        for req, n in items:
            c = req.num_computed + n
            req.num_computed = c
            t = 1  # tokens emitted
            if req.prefill_done:
                t = n  # a decode step: 1, or a speculative burst
                if spec is not None and req.num_generated:
                    req.spec_passes += 1
                    req.spec_tokens += n
            elif c == req.prompt_len + req.num_generated:
                req.prefill_done = True
                self.committed_prefill_tokens += n
                if prefill_only:  # the hidden token: hand the request (and its KV) to a decode worker
                    req.status = HANDED_OFF
                    any_done = True
                    continue
                if req.max_output <= 0:  # nothing to generate: done without a token
                    req.status = COMPLETED
                    req.terminal_ms = end_ms
                    any_done = True
                    continue
            else:
                self.committed_prefill_tokens += n
                continue
            # emit t tokens
            g0 = req.num_generated
            g = g0 + t
            req.num_generated = g
            last = req.last_token_ms
            if g0 == 0:
                req.first_token_ms = end_ms
                if self.first_tokens is not None:
                    self.first_tokens.append(req)
            else:
                if g0 == 1:
                    req.second_token_ms = end_ms
                if last == start_ms:
                    pooled += 1
                else:
                    gaps.individual.append(end_ms - last)
                if t > 1:
                    zeros += t - 1
            req.last_token_ms = end_ms
            self.num_generated_tokens += t
            if g >= req.max_output or req.prompt_len + g >= limit:
                req.status = COMPLETED
                req.terminal_ms = end_ms
                any_done = True
        if pooled:
            gaps.pooled_values.append(end_ms - start_ms)
            gaps.pooled_weights.append(pooled)
        if zeros:
            gaps.pooled_values.append(0.0)
            gaps.pooled_weights.append(zeros)
        if any_done:
            self.reap_completed(completed)

    def reap_completed(self, completed: list) -> None:
        """Drop finished requests from the running list (in order): completed ones release
        their blocks, handed-off ones keep them until their transfer completes."""
        running = self.running
        left = [r for r in running if r.status != RUNNING]
        self.release_completed([r for r in left if r.status == COMPLETED], completed)
        for req in left:
            if req.status != COMPLETED:  # HANDED_OFF
                if self._tracks:
                    self.policy.left(req, True)
                self.handoffs.append(req)
                running.remove(req)

    def release_completed(self, reqs: list, completed: list) -> None:
        """Running requests ``reqs`` (in running order) completed: their blocks released, each
        dropped from the running list (found at C speed)."""
        kv = self.kv
        running = self.running
        left = self.policy.left if self._tracks else None
        off = self.offload
        for req in reqs:
            if left is not None:
                left(req)
            kv.release(req)
            if off is not None and off.stores:
                off.released(req)
            req.hashes = None
            completed.append(req)
            running.remove(req)

    def release_source(self, req: Request, now_ms: float | None = None, busy: bool = False) -> None:
        """The transfer of a handed-off request completed: free its blocks here."""
        if self._tracks:
            self.policy.source_released(req)
        self.kv.release(req)
        if self.offload is not None and self.offload.stores:
            self.offload.released(req)

    # -- fast-forward support -----------------------------------------------------------
    def plan_decode_run(self, max_passes: int):
        """If the next passes are pure decode of the running batch that cannot change on its
        own (no prefill, no admission possible until a request completes), return
        ``(k, batch, computed, generated, known, remaining)``: request i completes in the
        ``remaining[i]``-th pass; ``k`` passes run until every request completed when nothing
        waits (a completion then frees blocks nobody asks for), else until the first completion
        (inclusive), and never up to an allocation that would need a preemption (exclusive).
        Otherwise None."""
        running = self.running
        cfg = self.config
        n = len(running)
        if not n or cfg.prefill_only or n > cfg.max_batched_tokens or not running[-1].prefill_done:
            return None  # (the newest request is the one most likely still prefilling)
        off = self.offload
        if off is not None and not off.quiet_for_run(self):
            return None
        if not all([r.prefill_done for r in running]):
            return None
        if not self._admission_blocked(n):
            return None
        g0 = [r.num_generated for r in running]
        known = [r.prompt_len + r.num_generated for r in running]
        limit = self.context_limit
        remaining = [min(r.max_output - g, limit - x) for r, g, x in zip(running, g0, known)]
        first = min(remaining)
        if first <= 0:
            return None
        c0 = [r.num_computed for r in running]
        if cfg.speculation is not None:
            # (remaining counts tokens, an upper bound of the passes: the run's segments draw the
            # bursts and end it at the first completion or the blocks, actors.engine.worker)
            if off is not None or n * cfg.speculation.verify_tokens > cfg.max_batched_tokens:
                return None
            return min(max_passes, max(remaining)), list(running), c0, g0, known, remaining
        # (something waiting - a request or a destination's reservation - ends the run at the first completion)
        k = min(max_passes, max(remaining) if not (self.waiting or self.policy.pending) else first)
        k = self.blocks_bound(c0, remaining, k)
        if off is not None and off.stores:
            cap = off.run_cap(running, remaining)
            if cap is not None and cap < k:
                k = cap
        if k <= 0:
            return None

        return k, list(running), c0, g0, known, remaining

    def grow_run(self, batch: list, computed: list[int], upto) -> None:
        """A decode run's schedule-time effects up to pass ``upto``: the blocks of the batch's
        requests (``computed`` tokens at the run's start) for ``computed + upto`` tokens (``upto``:
        a list, per request, with speculative decoding)."""
        kv = self.kv
        bs = kv.block_size
        caching = kv.prefix_caching
        # most passes neither cross a block boundary nor fill a block
        # kv.grow's test for t = c + upto tokens: ceil(t / bs) > held + private blocks, or
        # t // bs > registered full blocks (prefix caching); integer forms of it
        if type(upto) is int:
            items = [(req, c + upto) for req, c in zip(batch, computed)
                     if c + upto > (req.num_held + req.num_private) * bs
                     or (caching and c + upto >= (req.num_full_registered + 1) * bs)]
        else:
            items = [(req, c + u) for req, c, u in zip(batch, computed, upto)
                     if c + u > (req.num_held + req.num_private) * bs
                     or (caching and c + u >= (req.num_full_registered + 1) * bs)]
        if items:
            self._grow_run_items(items)

    def _grow_run_items(self, items: list) -> None:
        """Grow a decode run's ``(request, tokens)`` items (a run's blocks are free or evictable
        by its horizon: they cannot run out)."""
        kv = self.kv
        done = kv.grow_decode(items)
        if done is None:
            done = all([kv.grow(req, t, req.hashes) for req, t in items])
        if not done:  # pragma: no cover - the horizon guarantees it
            raise AssertionError("fast-forward run ran out of KV blocks")

    def run_blocks(self, batch: list, computed: list[int]) -> "RunBlocks":
        """The blocks of a decode run's batch (``grow_run`` with one ``upto`` for all), grown as its
        passes are scheduled, touching only the requests that need a block."""
        return RunBlocks(self, batch, computed)

    def blocks_bound(self, computed: list[int], remaining: list[int], k: int) -> int:
        """At most ``k`` decode passes of requests with ``computed`` tokens, request i leaving
        after ``remaining[i]`` of them, before one would need a block that is not free or
        evictable now (releases at completions only add room)."""
        return blocks_bound(computed, remaining, k, self.config.block_size, self.kv.num_reclaimable)

    def _admission_blocked(self, num_running: int) -> bool:
        """No waiting request can be admitted (and none rejected) while the batch decodes.

        A blocked head stays blocked: during decode, active blocks only grow."""
        waiting = self.waiting
        cfg = self.config
        if not waiting or num_running >= cfg.max_sequences or num_running >= cfg.max_batched_tokens:
            return True
        req = waiting[0]
        if req.num_generated == 0 and self._never_fits(req):
            return False
        return self._fit(req, req.prompt_len + req.num_generated) is None


_POSITION = itemgetter(1)
SCAN_PASSES = 4  # a decode run's blocks grown this many passes on or more: a scan of the batch, not RunBlocks
_NEXT_POSITION = -1  # (RankScheduler._lead_due's key for the position the next lead request gets: no pass count)
_STALE = -2  # (its key, present once requests of the lead completed: their entries may remain)


class RunBlocks:
    """``RankScheduler.grow_run(batch, computed, upto)`` for a run's successive ``upto`` (they only
    grow) a few passes apart: a heap of (the first ``upto`` at which a request needs ``kv.grow``,
    its position in the batch, the request, its tokens computed at the run's start), so a call
    grows the requests due, in batch order, as the scan over the whole batch would, and looks at no
    other (a request's due pass changes only when it grows; one that left the batch, completed, is
    dropped when due). For a step of ``SCAN_PASSES`` or more the worker scans instead
    (``grow_run``: about as many requests are due as the batch holds, and the heap's work per
    request due costs more) and drops this object (its heap is stale)."""

    __slots__ = ("rank", "batch", "computed", "heap")

    def __init__(self, rank: RankScheduler, batch: list, computed: list[int]) -> None:
        self.rank = rank
        self.batch = batch  # (the run entry's own lists: they lose the requests that leave)
        self.computed = computed
        self.heap = self._entries(zip(range(len(batch)), batch, computed))
        heapify(self.heap)

    def _entries(self, members) -> list:
        """Heap entries of ``(position, request, computed)`` members: first the least ``upto`` with
        kv.grow's test true for ``computed + upto`` tokens (``grow_run``'s): past the held and
        private blocks, or (prefix caching) filling the next full block. (One comprehension, no
        call per request.)"""
        kv = self.rank.kv
        bs = kv.block_size
        if kv.prefix_caching:
            return [(min((r.num_held + r.num_private) * bs + 1, (r.num_full_registered + 1) * bs) - c, i, r, c)
                    for i, r, c in members]
        return [((r.num_held + r.num_private) * bs + 1 - c, i, r, c) for i, r, c in members]

    def grow(self, upto: int) -> None:
        heap = self.heap
        if not heap or heap[0][0] > upto:
            return
        due = []
        while heap and heap[0][0] <= upto:
            due.append(heappop(heap))
        if len(due) > 1:
            due.sort(key=_POSITION)
        due = [e for e in due if e[2].status == RUNNING]
        if not due:
            return
        self.rank._grow_run_items([(r, c + upto) for _, _, r, c in due])
        for e in self._entries([(i, r, c) for _, i, r, c in due]):
            heappush(heap, e)
