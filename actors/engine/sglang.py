"""SGLang's cache-aware scheduler of one attention-data rank (docs/schedulers.md).

A pass is either a prefill pass or a decode pass, never both:

1. ``prefill_decode_interval`` gate: for N rounds after a prefill no prefill starts (rounds with
   nothing to decode are idle: no time passes, and the gate's idle rounds reset the ratio).
2. Prefill admission (``_prefill_pass``): the waiting queue in order (FIFO, or longest prefix match
   when the queue is short), strict head-of-line, under three budgets: the running-request cap,
   the chunk budget (``chunked_prefill_size`` page-rounded tokens a pass, a request truncated to
   what is left) and memory: ``free + evictable - sum(running min(remaining, clip) x
   new_token_ratio)`` must exceed the candidate's pages plus its clipped output.
3. If anything was admitted the pass prefills it and running requests stall; a request finishing
   its prompt gets its first token from that forward. Otherwise the pass decodes every running
   request; when the pages for the new tokens are not there, running requests are *retracted*
   (fewest generated tokens first; their cached prefix stays in the tree) back to the end of the
   queue and ``new_token_ratio`` is raised, else it decays a step.

Disaggregated, a decode rank reserves a request's prompt pages before its prefill starts
(``_Destinations``) and takes the transferred prompt into them; a prefill rank hands a finished
prompt off and holds its KV until the transfer releases it.

KV lives in a radix tree of pages (``actors.engine.radix_cache``). A request's ``lease`` is its
locked tree path (``node``, ``cached`` tokens) plus the pages it owns outside the tree; its
materialized tokens (``num_computed``) always equal its sequence once it runs (each emitted
token gets its slot). Tokens generated while running enter the tree when it finishes or is
retracted (nobody else can match them, so caching them earlier changes nothing).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from aisim.actors.engine.capacity import DestinationQueue
from aisim.actors.engine.radix_cache import RadixCache, TokenSeq
from aisim.actors.engine.request import (
    COMPLETED,
    HANDED_OFF,
    REJECT_CONTEXT_LENGTH,
    REJECT_KV_CAPACITY,
    RUNNING,
    WAITING,
    Request,
)
from aisim.actors.engine.scheduler import GapSink, RankPass, RankQueues, blocks_bound
from aisim.actors.engine.timing import PassShape, TimingModel

LPM_MAX_QUEUE = 128  # longest-prefix-match ordering only while the queue is this short (else FIFO)
LPM_DEPRIORITIZE_TOKENS = 32  # a short match whose first tokens another queued request shares goes last
RETRACT_OUTPUT_BONUS = 20  # tokens per surviving request in the ratio a retraction sets
DECODE_PREFILL_MS = 1e-6  # a decode worker's prefill pass (the reference's takes no time)


@dataclass(frozen=True)
class SGLangKnobs:
    """SGLang's scheduler settings (the engine's defaults; aisim extensions in the config)."""

    schedule_policy: str = "fifo"  # fifo | lpm
    max_prefill_tokens: int = 16384
    chunked_prefill_size: int = 8192  # per attention-data rank (the lowering divides it)
    clip_max_new_tokens: int = 4096
    schedule_conservativeness: float = 1.0
    prefill_decode_interval: int = 0


class Lease:
    """A running (or chunking) request's KV: its locked tree path and the pages it owns beyond it."""

    __slots__ = ("seq", "node", "cached", "own_pages")

    def __init__(self, seq: TokenSeq, node, cached: int, own_pages: int) -> None:
        self.seq = seq
        self.node = node  # the deepest locked node (the tree's root when nothing is cached)
        self.cached = cached  # tokens on the locked path (whole pages)
        self.own_pages = own_pages  # pages held outside the tree


class _Destinations(DestinationQueue):
    """A decode rank's reservations (SGLang disaggregation is destination first): a request's
    prompt pages are reserved here before its prefill may start, the prompt's cached prefix here
    locked and only the rest taken fresh (and transferred); reservations wait in FIFO order and
    are tried when the rank starts a round (``DestinationQueue.per_round``)."""

    reserves = True
    takes_pages = True  # (a reservation holds its pages from the start)
    per_round = True  # (tried when the rank starts a round: once per pass end while it is busy)

    __slots__ = ("rank", "pending", "pages", "failed_at")

    def __init__(self, rank: "SGLangRank") -> None:
        self.rank = rank
        self.pending: deque = deque()  # (transfer id, request) waiting for their pages, in order
        # request index -> (locked node, its cached tokens, fresh pages) until the prompt arrives
        self.pages: dict[int, tuple] = {}
        self.failed_at: int | None = None  # the tree's version when the waiting head last failed

    @property
    def settled(self) -> bool:
        """The waiting head failed and nothing was given back since: it cannot reserve now."""
        return self.failed_at == self.rank.tree.version

    def _reserve(self, req: Request, now_ms: float = 0.0) -> bool:
        """(Tried once per capacity generation: a head that failed is not tried again until
        pages are given back or unlocked.)"""
        rank = self.rank
        tree = rank.tree
        if self.pending and req is self.pending[0][1] and self.settled:
            return False
        page = rank.page
        prompt = req.prompt_len
        node, cached = tree.root, 0
        if rank.caching:
            seq = rank._tokens(req)
            cached = tree.peek(seq, prompt - prompt % page)
            if cached:
                node, cached = tree.match(seq, cached, now_ms)
                tree.lock(node)
        fresh = -(-prompt // page) - cached // page
        if fresh * page > tree.headroom_tokens or not tree.take_pages(fresh):
            if node is not tree.root:
                tree.unlock(node)
            self.failed_at = tree.version
            return False
        self.failed_at = None
        self.pages[req.index] = (node, cached, fresh)
        return True

    def transfer_tokens(self, req: Request) -> int:
        """Its fresh pages' tokens (a cached prefix is not transferred)."""
        return self.pages[req.index][2] * self.rank.page


class _KvView:
    """The KV figures the worker, host and timeline read of a rank (``KVCache``'s names); its
    ``events`` are the tree's: the prompt pages a prefill caches (STORED) and their evictions
    (REMOVED); generated tokens' pages, which no other request can match, are not announced."""

    __slots__ = ("tree", "prefix_caching", "block_size", "capacity", "events")

    def __init__(self, tree: RadixCache, prefix_caching: bool) -> None:
        self.tree = tree
        self.events = tree.events
        self.prefix_caching = prefix_caching
        self.block_size = tree.page
        self.capacity = tree.num_pages

    @property
    def num_active(self) -> int:
        """Pages held by live requests (free and unlocked cached pages aside)."""
        t = self.tree
        return t.num_pages - t.free_pages - t.evictable_tokens // t.page

    def contents(self) -> list:
        return []

    def preload(self, hashes: list) -> None:
        if hashes:
            raise NotImplementedError("a warm start of an SGLang rank's cache is not modelled yet")


def clipped_sum(values: list[int], clip: int) -> int:
    """``sum(min(v, clip) for v in values)``, at C speed when no value exceeds ``clip``."""
    total = sum(values)
    if values and max(values) > clip:
        total -= sum([v - clip for v in values if v > clip])
    return total


def token_seq(req: Request) -> TokenSeq:
    """The request's tokens as pieces, kept in ``req.tokens`` while it is live (an SGLang rank
    compares tokens, not block hashes): from its source's ``token_pieces`` when it has them, else
    one piece per token from its one-token block hashes (chained: equal means an equal prefix)."""
    seq = req.tokens
    if seq is not None:
        return seq
    src = req.source
    pieces = getattr(src, "token_pieces", None)
    if pieces is not None:
        seq = pieces(req.index)
    else:
        n = req.prompt_len + max(req.max_output, 1)
        hashes = list(src.block_hashes(req.index, 1))[:n]
        hashes += [(req.index << 32) ^ (0xA15E << 16) ^ i for i in range(len(hashes), n)]
        seq = TokenSeq(hashes, list(range(1, n + 1)))
    req.tokens = seq
    return seq


class SGLangRank(RankQueues):
    """Scheduler + radix KV cache of one SGLang rank (the interface of ``RankScheduler``)."""

    joins_runs = False  # (a transferred request ends a decode run: the next pass promotes it)

    def __init__(self, config, timing: TimingModel, record_kv_events: bool = False) -> None:
        self.config = config
        self.timing = timing
        k = config.sglang
        self.knobs = k
        page = self.page = config.block_size
        self.tree = RadixCache(config.num_gpu_blocks, page, record_kv_events)
        self.kv = _KvView(self.tree, config.enable_prefix_caching)
        self.caching = config.enable_prefix_caching
        self.policy = _Destinations(self)
        self.running: list[Request] = []
        self.waiting: deque[Request] = deque()
        self.total_kv_tokens = config.num_gpu_blocks * page
        self.num_preemptions = 0
        self.committed_prefill_tokens = 0
        self.num_generated_tokens = 0
        self.rejected: list[Request] = []
        self.handoffs: list[Request] = []
        self.first_tokens: list[Request] | None = None
        self.pool_label = "prefill" if config.prefill_only else "agg"
        self.last_pass: tuple | None = None
        self.pass_count = 0
        cl = config.context_length
        self.context_limit = cl if cl is not None else 1 << 62
        init = min(1.0, 0.7 * k.schedule_conservativeness)
        self.ratio_init = init
        self.ratio_min = 0.14 * init
        self.ratio_step = (init - self.ratio_min) / 600
        self.new_token_ratio = init
        self.prefill_rounds_left = 0  # rounds until a prefill may start again (prefill_decode_interval)
        self.max_running = config.max_sequences
        self.chunk_tokens = k.chunked_prefill_size
        self.num_retractions = 0
        self._passes_seen = 0  # pass_count when the ratio and the gate were last brought up to date
        self._last_end_ms = 0.0  # when the last pass ended
        self.num_ready = 0  # transferred requests in the queue, their prompt in reserved pages
        # the worker's ranks when they are an attention-DP group sharing the interval gate (set by
        # the builder), and this rank's part of the round in progress
        self.group: list | None = None
        self._round: bool | None = None
        self._sources: dict[int, Lease] = {}  # handed-off prompts' KV, held until their transfer ends
        self._releases: list[tuple] = []  # (lease, tokens) of transferred sources, released at the pass end

    # -- queue ------------------------------------------------------------------------------
    def enqueue(self, req: Request) -> None:
        if req.materialized and req.index in self.policy.pages:
            # its prompt's KV arrived in the pages it reserved: it joins the batch at the next round
            req.num_computed = req.prompt_len
            req.prefill_done = True
            self.num_ready += 1
        room = self.context_limit - req.prompt_len
        if 0 < room < req.max_output:  # (the output is capped by the context length, as SGLang does)
            req.max_output = room
        self.waiting.append(req)

    def _tokens(self, req: Request) -> TokenSeq:
        """``token_seq``, with its pages' hashes when this rank publishes KV events."""
        seq = token_seq(req)
        if seq.hashes is None and self.tree.events is not None:
            seq.hashes = req.block_hashes(self.page)
        return seq

    def _output_reserve(self, req: Request) -> int:
        """The output tokens admission sets aside for ``req``: its clipped remaining output (a
        prefill worker's request: its one token)."""
        if self.config.prefill_only:
            return 1
        return min(req.max_output - req.num_generated, self.knobs.clip_max_new_tokens)

    @staticmethod
    def _remaining(req: Request) -> int:
        return req.max_output - req.num_generated

    # -- a pass -------------------------------------------------------------------------------
    def _promote(self, now_ms: float) -> None:
        waiting = self.waiting
        running = self.running
        keep = []
        while waiting and self.num_ready and len(running) < self.max_running:
            req = waiting.popleft()
            if not req.prefill_done:
                keep.append(req)
                continue
            self.num_ready -= 1
            node, cached, fresh = self.policy.pages.pop(req.index)
            lease = req.lease = Lease(self._tokens(req), node, cached, fresh)
            upto = req.prompt_len // self.page * self.page
            if self.caching and upto > cached:  # (the prompt enters the cache as it activates)
                self._cache(lease, upto, now_ms, keep_lock=True)
            req.status = RUNNING
            req.admissions.append((now_ms, 0, self.pool_label))
            if req.first_admit_ms is None:
                req.first_admit_ms = now_ms
            running.append(req)
        waiting.extendleft(reversed(keep))

    def _catch_up(self) -> None:
        """The decode passes of a fast-forwarded run (counted by the worker) decayed the ratio and
        counted the gate down, one pass at a time."""
        m = self.pass_count - self._passes_seen
        if m:
            self._passes_seen = self.pass_count
            r, step, low = self.new_token_ratio, self.ratio_step, self.ratio_min
            for _ in range(m):
                if r == low:
                    break
                r = max(r - step, low)
            self.new_token_ratio = r
            self.prefill_rounds_left = max(0, self.prefill_rounds_left - m)

    def schedule(self, now_ms: float, defer_prefill: bool = False) -> RankPass | None:
        self._catch_up()
        waiting = self.waiting
        running = self.running
        if self.num_ready:
            # requests whose prompt arrived (in the queue's order) join the batch while there is
            # room (reused: none); while one still waits for a slot, nothing is prefilled
            if len(running) < self.max_running:
                self._promote(now_ms)
            if self.num_ready:
                self._end_round(False if running else None)
                return self._decode_pass(now_ms) if running else None
        group = self.group
        if self.prefill_rounds_left and not (any([r.running for r in group]) if group else self.running):
            # rounds with nothing to decode (on any rank of the group) are idle: they take no
            # time, and count down
            self.prefill_rounds_left = 0
            self.new_token_ratio = self.ratio_init
        if waiting and not self.prefill_rounds_left:
            rp = self._prefill_pass(now_ms)
            if rp is not None:
                self._end_round(True)
                return rp
        if not self.running:
            if waiting:  # (a round with nothing to do: retried at once until the ratio settles)
                self.new_token_ratio = self.ratio_min
            self._end_round(None)
            return None
        self._end_round(False)
        return self._decode_pass(now_ms)

    def _end_round(self, prefilled: bool | None) -> None:
        """The interval gate after this rank's part of a round (``prefilled``: it prefilled; None:
        it ran nothing). Alone: N rounds after a prefill, one less per decode. In an attention-DP
        group (the worker's ranks, scheduled in order each round) the gate is the group's: the
        last rank sets every rank's after the whole round - N when any rank prefilled."""
        group = self.group
        n = self.knobs.prefill_decode_interval
        if group is None:
            if prefilled:
                self.prefill_rounds_left = n
            elif prefilled is not None and self.prefill_rounds_left:
                self.prefill_rounds_left -= 1
            return
        self._round = prefilled
        if self is not group[-1]:
            return
        rounds = [r._round for r in group]
        left = max([r.prefill_rounds_left for r in group])
        if True in rounds:
            left = n
        elif False in rounds and left:
            left -= 1
        for r in group:
            r.prefill_rounds_left = left
            r._round = None

    # -- prefill ------------------------------------------------------------------------------
    def _order(self) -> None:
        """Longest prefix match first (a chunk continuation stays at the head)."""
        waiting = self.waiting
        if self.knobs.schedule_policy != "lpm" or not self.caching or len(waiting) > LPM_MAX_QUEUE:
            return
        head = [waiting.popleft()] if waiting and waiting[0].num_computed else []
        page = self.page
        span = -(-LPM_DEPRIORITIZE_TOKENS // page) * page
        seen = set()
        scored = []
        for i, req in enumerate(waiting):
            seq = token_seq(req)
            score = self.tree.peek(seq, req.prompt_len + req.num_generated)
            low = False
            if score <= LPM_DEPRIORITIZE_TOKENS and req.prompt_len + req.num_generated >= span:
                key = tuple(seq.page_key(p, page) for p in range(0, span, page))
                low = key in seen
                seen.add(key)
            scored.append((low, -score, i, req))
        scored.sort()
        waiting.clear()
        waiting.extend(head + [s[3] for s in scored])

    def _never_fits(self, req: Request) -> str | None:
        if req.prompt_len >= self.context_limit:
            return REJECT_CONTEXT_LENGTH
        page = self.page
        need = -(-req.prompt_len // page) * page + self._output_reserve(req)
        if need >= self.total_kv_tokens:
            return REJECT_KV_CAPACITY
        return None

    def rejection_detail(self, req: Request, code: str) -> str:
        n = req.prompt_len
        if code == REJECT_CONTEXT_LENGTH:
            return f"prompt of {n:,} tokens >= context length {self.context_limit:,}"
        out = self._output_reserve(req)
        cache = "the cache" if self.pool_label == "agg" else f"the {self.pool_label} cache"
        return (f"prompt of {n:,} tokens and {out:,} reserved output tokens need {n + out:,} KV tokens, "
                f"{cache} holds {self.total_kv_tokens:,}")

    def _prefill_pass(self, now_ms: float) -> RankPass | None:
        """Admit from the waiting queue (§3.1 of docs/dev/reference-sglang-trtllm.md); the pass, or
        None when nothing was admitted."""
        self._order()
        k = self.knobs
        page = self.page
        tree = self.tree
        running = self.running
        waiting = self.waiting
        clip = k.clip_max_new_tokens
        ratio = self.new_token_ratio
        reserved = clipped_sum([r.max_output - r.num_generated for r in running], clip) * ratio
        rem_total = tree.headroom_tokens - reserved
        rem_input = k.max_prefill_tokens
        rem_chunk = self.chunk_tokens
        slots = self.max_running - len(running)
        items = []
        sum_isl = sum_prefix = sq = 0
        while len(items) < slots and waiting:
            req = waiting[0]
            lease = req.lease
            if lease is None and req.num_generated == 0:
                why = self._never_fits(req)
                if why:
                    waiting.popleft()
                    self._reject(req, now_ms, why)
                    continue
            seq_len = req.prompt_len + req.num_generated
            if lease is None:
                seq = self._tokens(req)
                # (a read-only look: the path is matched, split and refreshed only when admitted)
                limit = seq_len if self._remaining(req) <= 0 else seq_len - 1
                cached = tree.peek(seq, limit - limit % page) if self.caching else 0
                start = cached
            else:
                start = req.num_computed
            extend = seq_len - start
            if extend <= 0:
                break
            if -(-extend // page) * page <= rem_chunk:
                chunk = extend
            else:
                chunk = min(rem_chunk // page * page, extend)
                if chunk <= 0:
                    break
            charged = -(-chunk // page) * page
            reserve = 0 if chunk < extend else self._output_reserve(req)
            if charged + reserve >= rem_total or charged > rem_input or charged > rem_chunk:
                break
            end = start + chunk
            if lease is None:
                node, _ = tree.match(seq, cached, now_ms) if cached else (tree.root, 0)
                tree.lock(node)
                pages = -(-end // page) - cached // page
                if pages * page > tree.headroom_tokens or not tree.take_pages(pages):
                    tree.unlock(node)
                    break
                req.lease = Lease(seq, node, cached, pages)
                req.admissions.append((now_ms, cached, self.pool_label))
                if req.first_admit_ms is None:
                    req.first_admit_ms = now_ms
            else:
                pages = -(-end // page) - (lease.cached // page + lease.own_pages)
                if pages > 0:
                    if not tree.take_pages(pages):
                        break
                    lease.own_pages += pages
            waiting.popleft()
            req.status = RUNNING
            req.num_computed = end
            running.append(req)
            items.append((req, chunk))
            sum_isl += end
            sum_prefix += start
            sq += chunk * chunk
            rem_total -= charged + reserve
            rem_input -= charged
            rem_chunk -= charged
            if rem_chunk <= 0:
                break
        if not items:
            return None
        n = len(items)
        new_tokens = sum_isl - sum_prefix
        shape = PassShape(n, new_tokens, sum_isl, sum_prefix, 0, 0, self.total_kv_tokens)
        var = sq / n - (new_tokens / n) ** 2
        # (a decode worker's prefill - a retracted request's recompute - takes no time, as in the
        # reference: a nanosecond, so that its end is an instant of its own for the coordinator)
        duration = DECODE_PREFILL_MS if self.pool_label == "decode" else self.timing.pass_ms(shape)
        return RankPass(items, shape, duration, 0, var, 0.0)

    # -- decode -------------------------------------------------------------------------------
    def _growth_pages(self, req: Request) -> int:
        """Pages ``req`` needs for its next token."""
        lease = req.lease
        return -(-(req.prompt_len + req.num_generated + 1) // self.page) - lease.cached // self.page - lease.own_pages

    def _decode_pass(self, now_ms: float) -> RankPass | None:
        """Every running request's next token (items: (request, pages taken for it), assigned to
        its lease at the pass end); retractions first when the pages are not there."""
        running = self.running
        tree = self.tree
        page = self.page
        # a running request holds the pages of exactly its tokens (its last one's included): its
        # next token needs a page when they fill their pages
        if page == 1:
            growth = None
            need = len(running)
        else:
            growth = [1 if (r.prompt_len + r.num_generated) % page == 0 else 0 for r in running]
            need = sum(growth)
        retracted = []
        if need * page > tree.headroom_tokens and len(running) > 1:
            if growth is None:
                growth = [1] * len(running)
            while need * page > tree.headroom_tokens and len(running) > 1:
                outs = [r.num_generated for r in running]
                i = outs.index(min(outs))
                victim = running.pop(i)
                need -= growth.pop(i)
                self._retract(victim, now_ms)
                retracted.append(victim)
        if retracted:
            self.num_preemptions += len(retracted)
            self.num_retractions += len(retracted)
            gen = sum([r.num_generated for r in running])
            cap = sum([r.max_output for r in running])
            self.new_token_ratio = min(1.0, (gen + RETRACT_OUTPUT_BONUS * len(running)) / (cap + 1))
            self.waiting.extend(retracted)
        else:
            self.new_token_ratio = max(self.new_token_ratio - self.ratio_step, self.ratio_min)
        if not tree.take_pages(need):
            return None  # (a lone request whose next page is not there: nothing runs)
        n = len(running)
        kv = [r.prompt_len + r.num_generated for r in running]
        total = sum(kv)
        shape = PassShape(0, 0, 0, 0, n, total, self.total_kv_tokens)
        var = sum([x * x for x in kv]) / n - (total / n) ** 2
        items = [(r, 1) for r in running] if growth is None else list(zip(running, growth))
        return RankPass(items, shape, self.timing.pass_ms(shape), len(retracted), 0.0, var)

    def _retract(self, req: Request, now_ms: float) -> None:
        """Back to the queue keeping its generated tokens; its cached prefix stays in the tree."""
        self._release_kv(req, now_ms)
        req.num_computed = 0
        req.prefill_done = False
        req.status = WAITING

    def _release_kv(self, req: Request, now_ms: float) -> None:
        """Cache the request's whole pages, free the rest, unlock its path."""
        self._release_lease(req.lease, min(req.num_computed, req.prompt_len + req.num_generated), now_ms)
        req.lease = None

    def _release_lease(self, lease: Lease, tokens: int, now_ms: float) -> None:
        """Cache the whole pages of a lease's first ``tokens`` tokens, free the rest, unlock its path."""
        tree = self.tree
        if self.caching:
            upto = tokens // self.page * self.page
            if upto > lease.cached:
                self._cache(lease, upto, now_ms, keep_lock=False)
            else:
                tree.unlock(lease.node)
        tree.give_pages(lease.own_pages)

    def _cache(self, lease: Lease, upto: int, now_ms: float, keep_lock: bool, publish: bool = False) -> None:
        """Insert a lease's tokens up to ``upto`` (whole pages) into the tree; its copies of
        tokens someone else cached first are freed. ``keep_lock``: its lock moves to the new path's
        end, else its path is unlocked."""
        tree = self.tree
        page = self.page
        old = lease.node
        node, dup = tree.insert(old, lease.seq, upto, now_ms, publish)
        moved = (upto - lease.cached) // page
        lease.own_pages -= moved
        tree.give_pages(dup // page)
        if keep_lock:
            tree.lock(node)
            tree.unlock(old)
            lease.node = node
            lease.cached = upto
        else:
            tree.unlock(old)
            tree.release_leaf(node)

    # -- pass end -----------------------------------------------------------------------------
    def finish(self, rp: RankPass, start_ms: float, end_ms: float, gaps: GapSink, completed: list) -> None:
        sh = rp.shape
        self.last_pass = (end_ms - start_ms, sh.num_prefill, sh.prefill_new_tokens, sh.prefill_sum_prefix,
                          rp.var_prefill_length, sh.num_decode, sh.decode_kv_tokens, rp.var_decode_kv_tokens)
        self.pass_count += 1
        self._passes_seen += 1
        self._last_end_ms = end_ms
        if sh.num_prefill:
            self._finish_prefill(rp, start_ms, end_ms, gaps, completed)
        else:
            self._finish_decode(rp, start_ms, end_ms, gaps, completed)
        if self._releases:
            for lease, tokens in self._releases:
                self._release_lease(lease, tokens, end_ms)
            self._releases = []

    def _finish_prefill(self, rp: RankPass, start_ms: float, end_ms: float, gaps: GapSink, completed: list) -> None:
        page = self.page
        tree = self.tree
        running = self.running
        chunked = None
        fresh = []
        for req, n in rp.items:
            self.committed_prefill_tokens += n
            seq_len = req.prompt_len + req.num_generated
            if self.caching and not (self.config.prefill_only and req.num_computed >= seq_len):
                # (a prefill worker's finished prompt is cached when its transfer releases it)
                upto = min(req.num_computed, req.prompt_len) // page * page
                if upto > req.lease.cached:
                    self._cache(req.lease, upto, end_ms, keep_lock=True, publish=True)
                upto = req.num_computed // page * page
                if upto > req.lease.cached:  # (a re-admitted request's own generated tokens)
                    self._cache(req.lease, upto, end_ms, keep_lock=True)
            if req.num_computed < seq_len:
                chunked = req
            else:
                req.prefill_done = True
                fresh.append(req)
        if chunked is not None:
            running.remove(chunked)
            chunked.status = WAITING
            self.waiting.appendleft(chunked)
        if self.config.prefill_only:  # (disaggregated prefill: hand the prompt's KV over)
            for req in fresh:
                req.status = HANDED_OFF
                running.remove(req)
                self.handoffs.append(req)
                self._sources[req.index] = req.lease  # (held here until its transfer ends)
                req.lease = None
            return
        emitting = []
        for req in fresh:
            left = self._remaining(req)
            if left <= 0:
                req.status = COMPLETED
                req.terminal_ms = end_ms
                continue
            if left > 1:  # its first token needs a slot; without one it comes at the next decode
                g = self._growth_pages(req)
                if g:
                    if not tree.take_pages(g):
                        continue
                    req.lease.own_pages += g
                req.num_computed += 1
            emitting.append(req)
        if emitting:
            self._emit(emitting, start_ms, end_ms, gaps)
        done = [req for req in fresh if req.status == COMPLETED]
        if done:
            self._complete(done, end_ms, completed)

    def _emit(self, reqs: list, start_ms: float, end_ms: float, gaps: GapSink) -> list:
        """One token each at ``end_ms`` (their gaps since their last ones); returns those that
        ended with it."""
        done = []
        pooled = 0
        individual = gaps.individual
        limit = self.context_limit
        first_tokens = self.first_tokens
        for req in reqs:
            g = req.num_generated + 1
            req.num_generated = g
            if g == 1:
                req.first_token_ms = end_ms
                if first_tokens is not None:
                    first_tokens.append(req)
            else:
                if g == 2:
                    req.second_token_ms = end_ms
                if req.last_token_ms == start_ms:
                    pooled += 1
                else:
                    individual.append(end_ms - req.last_token_ms)
            req.last_token_ms = end_ms
            if g >= req.max_output or req.prompt_len + g >= limit:
                req.status = COMPLETED
                req.terminal_ms = end_ms
                done.append(req)
        self.num_generated_tokens += len(reqs)
        if pooled:
            gaps.pooled_values.append(end_ms - start_ms)
            gaps.pooled_weights.append(pooled)
        return done

    def _finish_decode(self, rp: RankPass, start_ms: float, end_ms: float, gaps: GapSink, completed: list) -> None:
        reqs = []
        for req, pages in rp.items:  # (the new token's slot: its pages were taken when the pass started)
            if pages:
                req.lease.own_pages += pages
            req.num_computed += 1
            reqs.append(req)
        done = self._emit(reqs, start_ms, end_ms, gaps)
        if done:
            self._complete(done, end_ms, completed)

    def _complete(self, reqs: list, now_ms: float, completed: list) -> None:
        running = self.running
        for req in reqs:
            self._release_kv(req, now_ms)
            req.tokens = req.hashes = None
            completed.append(req)
            running.remove(req)

    def release_completed(self, reqs: list, completed: list) -> None:
        for req in reqs:
            self._complete([req], req.terminal_ms, completed)

    def reap_completed(self, completed: list) -> None:  # (completions are taken as they happen)
        pass

    def release_source(self, req: Request, now_ms: float | None = None, busy: bool = False) -> None:
        """A handed-off prompt's transfer ended: its pages are cached and released as at a finish,
        when the rank next starts a round (``busy``: at the end of its pass in progress)."""
        lease = self._sources.pop(req.index)
        if busy:
            self._releases.append((lease, req.prompt_len))
        else:
            self._release_lease(lease, req.prompt_len, now_ms if now_ms is not None else self._last_end_ms)

    # -- queries ------------------------------------------------------------------------------
    # -- fast-forward --------------------------------------------------------------------------
    def plan_decode_run(self, max_passes: int):
        """``RankScheduler.plan_decode_run``'s contract: the next passes decode the running batch
        and nothing else happens - no admission (the waiting head's memory test is evaluated pass
        by pass with the ratio's decay, the reserve's shrinking and the pages taken; the run stops
        before the first pass that would admit it, and at the first completion) and no
        retraction."""
        self._catch_up()
        running = self.running
        n = len(running)
        if not n or self.config.prefill_only:
            return None
        if (self.num_ready and n < self.max_running) or (self.policy.pending and not self.policy.settled):
            return None  # (a transferred prompt joins the batch, a reservation is tried, at the next pass)
        waiting = self.waiting
        need = None
        if waiting and n < self.max_running:
            need = self._head_need()
            if need == -1:
                return None  # (the next pass rejects it)
            if need is not None and not self.prefill_rounds_left:  # (admitted now? the common case, first)
                reserve = clipped_sum([r.max_output - r.num_generated for r in running], self.knobs.clip_max_new_tokens)
                if need < self.tree.headroom_tokens - reserve * self.new_token_ratio:
                    return None
        g0 = [r.num_generated for r in running]
        if not all(g0):
            return None  # (fresh: its first token is still to come)
        c0 = [r.num_computed for r in running]
        known = [r.prompt_len + g for r, g in zip(running, g0)]
        if c0 != known:
            return None  # (a token still without its slot)
        remaining = [r.max_output - g for r, g in zip(running, g0)]
        first = min(remaining)
        if first <= 0:
            return None
        # (something waiting - a request or a destination's reservation - ends the run at the first completion)
        k = min(max_passes, first if waiting or self.policy.pending else max(remaining))
        tree = self.tree
        page = self.page
        # evicting for the batch can only shorten the head's cached prefix (making it harder to
        # admit: a run stopped early stays exact), but it can reorder a longest-prefix-match queue
        lpm = waiting and self.knobs.schedule_policy == "lpm"
        k = blocks_bound(c0, remaining, k, page, tree.free_pages + (0 if lpm else tree.evictable_tokens // page))
        if need is not None:
            k = min(k, self._admission_pass(need, c0, remaining, k))
        if k < 2:
            return None
        return k, list(running), c0, g0, known, remaining

    def _head_need(self) -> int | None:
        """The waiting head's admission cost for the memory test (its pages plus its clipped
        output); None when it cannot be admitted whatever the memory (its next chunk does not fit a
        pass's budgets); -1 when it is to be rejected. (``_prefill_pass``'s tests, first request.)"""
        self._order()
        head = self.waiting[0]
        if head.lease is None and head.num_generated == 0 and self._never_fits(head):
            return -1
        k_ = self.knobs
        page = self.page
        seq_len = head.prompt_len + head.num_generated
        if head.lease is None:
            limit = seq_len if head.max_output - head.num_generated <= 0 else seq_len - 1
            start = self.tree.peek(token_seq(head), limit - limit % page) if self.caching else 0
        else:
            start = head.num_computed
        extend = seq_len - start
        budget = self.chunk_tokens
        if extend <= 0:
            return None
        chunk = extend if -(-extend // page) * page <= budget else min(budget // page * page, extend)
        if chunk <= 0:
            return None
        charged = -(-chunk // page) * page
        if charged > k_.max_prefill_tokens or charged > budget:
            return None
        return charged + (0 if chunk < extend else self._output_reserve(head))

    def _admission_pass(self, need: int, c0: list[int], remaining: list[int], k: int) -> int:
        """The first of the next ``k`` passes at whose start the waiting head (costing ``need``)
        would be admitted, with the state that pass would see (the ratio's decay, the reserve's
        shrinking, the pages taken), else ``k``."""
        page = self.page
        clip = self.knobs.clip_max_new_tokens
        reserve = clipped_sum(remaining, clip)
        headroom = self.tree.headroom_tokens
        ratio = self.new_token_ratio
        gate = self.prefill_rounds_left
        # the reserve's sum drops by one per pass for each request within clip of its end
        if max(remaining) <= clip:  # (the usual case: every request is)
            over = ()
            clipped = len(remaining)
        else:
            over = sorted([r - clip for r in remaining])  # request i is clipped while j < remaining_i - clip
            clipped = 0
            while clipped < len(over) and over[clipped] <= 0:
                clipped += 1
        crossings = [0] * page  # requests needing a new page at passes j = residue (mod page)
        for c in c0:
            crossings[(-c) % page] += 1
        step, low = self.ratio_step, self.ratio_min
        for j in range(k):
            if j >= gate and need < headroom - reserve * ratio:
                return j
            headroom -= crossings[j % page] * page
            ratio = max(ratio - step, low)
            reserve -= clipped  # (those with over <= j)
            while clipped < len(over) and over[clipped] <= j + 1:
                clipped += 1
        return k

    def run_blocks(self, batch: list, computed: list[int]) -> "_RunPages":
        """``grow_run`` for a run's successive passes (``RankScheduler.run_blocks``' form)."""
        return _RunPages(self, batch, computed)

    def grow_run(self, batch: list, computed: list[int], upto: int) -> None:
        """A decode run's pages up to pass ``upto``: each request's for ``computed + upto`` tokens."""
        page = self.page
        total = 0
        for req, c in zip(batch, computed):
            lease = req.lease
            want = -(-(c + upto) // page) - lease.cached // page
            if want > lease.own_pages:
                total += want - lease.own_pages
                lease.own_pages = want
        if total and not self.tree.take_pages(total):  # pragma: no cover - the plan's bound guarantees it
            raise AssertionError("fast-forward run ran out of KV pages")

    def check(self) -> None:
        """Every page is free, in the tree or owned by one live request (a test aid)."""
        t = self.tree
        owned = sum(r.lease.own_pages for r in list(self.running) + list(self.waiting) if r.lease is not None)
        owned += sum(lease.own_pages for lease in self._sources.values())
        owned += sum(fresh for _, _, fresh in self.policy.pages.values())
        owned += sum(lease.own_pages for lease, _ in self._releases)
        tree_tokens = t.evictable_tokens + t.protected_tokens
        assert tree_tokens % t.page == 0
        assert t.free_pages + tree_tokens // t.page + owned == t.num_pages, (t.free_pages, tree_tokens, owned)


class _RunPages:
    """A run's pages grown as its passes are scheduled (``SGLangRank.grow_run`` on the entry's lists,
    which lose the requests that leave)."""

    __slots__ = ("rank", "batch", "computed")

    def __init__(self, rank, batch: list, computed: list[int]) -> None:
        self.rank = rank
        self.batch = batch
        self.computed = computed

    def grow(self, upto: int) -> None:
        self.rank.grow_run(self.batch, self.computed, upto)
