"""KV tiers below a rank's GPU cache: host memory (G2) and disk (G3), and the links that move
blocks between them (docs/kv-offload.md has the model; docs/dev/reference-kv-offload.md the
reference's behaviour it follows).

- A tier entry is a full prompt block, keyed by its chained hash (equal prefixes share entries).
- Stores are write-through: a pass that computes complete prompt blocks copies the ones G2 lacks
  (one *cohort* per request per pass: reserved at pass start, sent at pass end). A G2 store
  that completes is written on to G3 (when configured) as one job.
- A waiting request whose prefix continues in G2 reserves GPU blocks and *onboards* the blocks
  (one host-to-device job) before its prefill may use them; blocks found only in G3 are first
  read into G2 (the request waits for that, then onboards).
- Links: a ``dp_rank_local`` G2 pool has a FIFO lane per direction (a job's end is fixed when it
  is sent: ``max(lane tail, ready + first-byte latency) + bytes / bandwidth``); a
  ``cluster_shared`` pool and G3 serve their jobs by equal shares (a job past its first byte
  moves at ``min(client cap / the client's active jobs, shared cap / all active jobs)``; every
  arrival and completion reflows the rates). Bandwidth 0 is instantaneous.
- All tiers and links a deployment shares live in one ``OffloadDomain``, advanced in time order
  (same-time completions: writes before reads, then by job id), so a shared pool's state is one
  deterministic sequence of events whatever the runtime (the workers of such a deployment share
  one engine host). Private tiers get a domain per rank.

Work is proportional to the blocks that move: lookups probe consecutive keys, eviction pops
from the LRU front, nothing scans a tier.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from itertools import filterfalse, islice, repeat

from aisim.actors.hashing import hash_view

INF = float("inf")

# job kinds, in same-time completion order (writes before reads)
STORE = 0  # G1 -> G2
G3_WRITE = 1  # G2 -> G3
G3_READ = 2  # G3 -> G2 (promotion)
LOAD = 3  # G2 -> G1 (onboarding)

# KV event kinds of the host tier (the GPU tier's are kv_cache.STORED / REMOVED)
HOST_STORED = 3
HOST_REMOVED = 4
DISK_STORED = 5
DISK_REMOVED = 6

# lookup outcomes
HIT = 0
DEFER = 1


@dataclass(frozen=True)
class HostOffloadSpec:
    """A pool's G2 tier (``kv_cache.host_offload``), bandwidths in decimal GB/s."""

    num_blocks: int
    block_bytes: int
    scope: str = "dp_rank_local"  # or cluster_shared
    d2h_gbps: float = 32.0
    h2d_gbps: float = 32.0
    shared_d2h_gbps: float = 80.0
    shared_h2d_gbps: float = 80.0
    latency_ms: float = 0.0

    @property
    def shared(self) -> bool:
        return self.scope == "cluster_shared"


@dataclass(frozen=True)
class G3Spec:
    """A pool's G3 tier (``kv_cache.g3_offload``)."""

    scope: str  # worker_local | cluster_shared
    num_blocks: int
    block_bytes: int
    latency_ms: float = 0.1
    read_gbps: float = 10.0
    write_gbps: float = 10.0
    shared_read_gbps: float = 80.0
    shared_write_gbps: float = 80.0

    @property
    def shared(self) -> bool:
        return self.scope == "cluster_shared"


def bytes_per_ms(gbps: float) -> float:
    """Decimal GB/s as bytes per millisecond; 0 means instantaneous."""
    return gbps * 1e6 if gbps > 0 else INF


class Job:
    """One transfer: ``keys`` (a hash view) of ``nbytes`` from ``client``."""

    __slots__ = ("id", "kind", "client", "keys", "nbytes", "submit_ms", "start_ms", "left", "cap", "done_ms",
                 "req", "tier", "link", "ended")

    def __init__(self, jid: int, kind: int, client, keys, nbytes: int, submit_ms: float, tier, req=None) -> None:
        self.id = jid
        self.kind = kind
        self.client = client
        self.keys = keys
        self.nbytes = nbytes
        self.submit_ms = submit_ms
        self.start_ms = submit_ms
        self.left = float(nbytes)
        self.cap = INF
        self.done_ms: float | None = None  # set when it completes (a FIFO job: when sent)
        self.req = req
        self.tier = tier
        self.link = None
        self.ended = False


class FifoLane:
    """A private link direction: jobs one after another, each end fixed when it is sent."""

    __slots__ = ("tail_ms", "queue")

    def __init__(self) -> None:
        self.tail_ms = 0.0
        self.queue: deque[Job] = deque()  # in send order = completion order

    def send(self, job: Job, ready_ms: float, latency_ms: float, rate: float) -> None:
        start = ready_ms + latency_ms
        if self.tail_ms > start:
            start = self.tail_ms
        job.start_ms = start
        job.done_ms = self.tail_ms = start + (job.nbytes / rate if rate < INF else 0.0)
        job.link = self
        self.queue.append(job)

    def next_event(self) -> float:
        return self.queue[0].done_ms if self.queue else INF

    def run_to(self, t: float, out: list) -> None:
        q = self.queue
        while q and q[0].done_ms <= t:
            out.append(q.popleft())

    def predict(self, job: Job) -> float:
        return job.done_ms


class ShareLink:
    """A shared link direction: equal-share service of its jobs (see the module doc)."""

    __slots__ = ("rate", "jobs", "now")

    def __init__(self, shared_gbps: float) -> None:
        self.rate = bytes_per_ms(shared_gbps)
        self.jobs: list[Job] = []  # in send order
        self.now = 0.0

    def send(self, job: Job, ready_ms: float, latency_ms: float, rate: float) -> None:
        job.start_ms = ready_ms + latency_ms
        job.cap = rate
        job.link = self
        self.jobs.append(job)

    def _rates(self) -> list[tuple[Job, float]]:
        now = self.now
        active = [j for j in self.jobs if j.start_ms <= now]
        if not active:
            return []
        per_client: dict[int, int] = {}
        for j in active:
            per_client[id(j.client)] = per_client.get(id(j.client), 0) + 1
        share = self.rate / len(active)
        out = []
        for j in active:
            r = j.cap / per_client[id(j.client)]
            out.append((j, r if r < share else share))
        return out

    def next_event(self) -> float:
        t = INF
        now = self.now
        for j in self.jobs:
            if j.start_ms > now and j.start_ms < t:
                t = j.start_ms
        for j, r in self._rates():
            d = now + j.left / r if r < INF else now
            if d < t:
                t = d
        return t

    def predict(self, job: Job) -> float:
        """When ``job`` would end if no other job came (rates reflow as the others end)."""
        if job.done_ms is not None:
            return job.done_ms
        saved = [(j, j.left) for j in self.jobs]
        now0 = self.now
        done: list[Job] = []
        try:
            while job not in done:
                t = self.next_event()
                if t == INF:  # pragma: no cover - a job always progresses
                    return INF
                self.run_to(t, done, mark=False)
            return self.now
        finally:
            self.jobs = [j for j, _ in saved]
            for j, left in saved:
                j.left = left
            self.now = now0

    def run_to(self, t: float, out: list, mark: bool = True) -> None:
        """Serve up to ``t`` (no rate change strictly before it); jobs ending at ``t`` go to ``out``."""
        now = self.now
        if t <= now and not self.jobs:
            return
        dt = t - now
        ended = []
        for j, r in self._rates():
            d = now + j.left / r if r < INF else now
            if d <= t:
                ended.append(j)
            else:
                j.left -= r * dt
        self.now = t if t > now else now
        if ended:
            for j in ended:
                j.left = 0.0
                if mark:
                    j.done_ms = self.now
            self.jobs = [j for j in self.jobs if j.left > 0.0 or j.start_ms > self.now]
            out.extend(ended)


class OffloadDomain:
    """The tiers and links that share one clock (a rank's, or a deployment's shared ones)."""

    __slots__ = ("links", "now", "next_id", "generation")

    def __init__(self) -> None:
        self.links: list = []
        self.now = 0.0
        self.next_id = 0
        self.generation = 0  # completions so far (a deferred lookup retries after one)

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def next_event_ms(self) -> float:
        t = INF
        for link in self.links:
            e = link.next_event()
            if e < t:
                t = e
        return t

    def advance(self, t: float) -> None:
        """Complete every job ending by ``t``, in time order (what they trigger too)."""
        links = self.links
        while True:
            t_ev = INF
            for link in links:
                e = link.next_event()
                if e < t_ev:
                    t_ev = e
            if t_ev > t or t_ev == INF:
                break
            done: list[Job] = []
            for link in links:
                link.run_to(t_ev, done)
            if t_ev > self.now:
                self.now = t_ev
            if done:
                done.sort(key=_completion_order)
                for job in done:
                    job.ended = True
                    job.tier.complete(job, t_ev)
                self.generation += 1
        for link in links:
            if isinstance(link, ShareLink):
                link.run_to(t, [])  # (nothing ends before the next event)
        if t > self.now:
            self.now = t


def _completion_order(job: Job) -> tuple:
    return (job.kind, job.id)


class TierStats:
    """One client's (rank's) counters of one tier's traffic."""

    __slots__ = ("jobs", "blocks", "bytes", "transfer_ms", "busy_ms", "_active", "_since")

    def __init__(self) -> None:
        self.jobs = self.blocks = self.bytes = 0
        self.transfer_ms = self.busy_ms = 0.0
        self._active = 0
        self._since = 0.0

    def sent(self, job: Job, now: float) -> None:
        self.jobs += 1
        self.blocks += len(job.keys)
        self.bytes += job.nbytes
        if not self._active:
            self._since = now
        self._active += 1

    def ended(self, job: Job, now: float) -> None:
        self.transfer_ms += now - job.submit_ms
        self._active -= 1
        if not self._active:
            self.busy_ms += now - self._since

    def plain(self) -> dict:
        return {"jobs": self.jobs, "blocks": self.blocks, "bytes": self.bytes,
                "transfer_ms": self.transfer_ms, "busy_ms": self.busy_ms}


def _lru_insert(lru: OrderedDict, keys) -> None:
    """Make ``keys`` (chain order, none of them in ``lru``) the most recent, the first block most
    recent of all (the chain's tail goes first)."""
    lru.update(dict.fromkeys(keys[::-1]))


def _drain(it) -> None:
    """Run an iterator (of calls with side effects) to its end at C speed."""
    deque(it, 0)


class HostTier:
    """A G2 pool: resident entries (LRU), pending ones (a store or a G3 read in flight) and pins
    (in-flight onboarding, G3 writes), with the ranks that see its KV events."""

    __slots__ = ("capacity", "lru", "pending", "pins", "loading", "subscribers", "version", "num_evictions",
                 "block_bytes")

    def __init__(self, capacity: int, block_bytes: int) -> None:
        self.capacity = capacity
        self.block_bytes = block_bytes
        self.lru: OrderedDict = OrderedDict()
        self.pending: dict[int, Job | None] = {}
        self.pins: dict[int, int] = {}  # resident key -> pins (onboarding and G3 writes)
        self.loading: dict[int, int] = {}  # resident key -> onboarding jobs reading it
        self.subscribers: list = []  # KV event lists of the ranks the router indexes
        self.version = 0  # bumped by every change of the LRU order
        self.num_evictions = 0

    @property
    def num_used(self) -> int:
        return len(self.lru) + len(self.pending)

    def has(self, key: int) -> bool:
        return key in self.lru or key in self.pending

    def touch(self, keys) -> None:
        """A lookup: the resident ones of ``keys`` become the most recent (the first most)."""
        lru = self.lru
        _drain(map(lru.move_to_end, filter(lru.__contains__, keys[::-1])))
        self.version += 1

    def make_room(self, n: int) -> bool:
        """Room for ``n`` new entries, evicting unpinned LRU entries; False (nothing changed)
        when they do not fit."""
        free = self.capacity - len(self.lru) - len(self.pending)
        if n <= free:
            return True
        need = n - free
        lru = self.lru
        pins = self.pins
        if need > len(lru) - len(pins):
            return False
        victims = list(islice(filterfalse(pins.__contains__, lru) if pins else lru, need))
        _drain(map(lru.pop, victims))
        self.num_evictions += need  # (the order of the rest stands: ``version`` stays)
        if self.subscribers:
            ev = (HOST_REMOVED, hash_view(victims))
            for sink in self.subscribers:
                sink.append(ev)
        return True

    def pin(self, keys, loading: bool) -> None:
        pins = self.pins
        for k in keys:
            pins[k] = pins.get(k, 0) + 1
        if loading:
            ld = self.loading
            for k in keys:
                ld[k] = ld.get(k, 0) + 1

    def unpin(self, keys, loading: bool) -> None:
        pins = self.pins
        for k in keys:
            c = pins[k] - 1
            if c:
                pins[k] = c
            else:
                del pins[k]
        if loading:
            ld = self.loading
            for k in keys:
                c = ld[k] - 1
                if c:
                    ld[k] = c
                else:
                    del ld[k]

    def resident(self, keys) -> None:
        """Pending ``keys`` became resident (a store or a G3 read ended)."""
        _drain(map(self.pending.pop, keys))
        _lru_insert(self.lru, keys)
        self.version += 1
        if self.subscribers:
            ev = (HOST_STORED, keys)
            for sink in self.subscribers:
                sink.append(ev)

    def complete(self, job: Job, now: float) -> None:
        client = job.client
        if job.kind == STORE:
            self.resident(job.keys)
            client.store_ended(job, now)
            g3 = client.g3  # (the storing rank's G3: its worker's, or the shared one)
            if g3 is not None:
                g3.write_through(self, job, now)
        elif job.kind == LOAD:
            self.unpin(job.keys, True)
            self.touch(job.keys)  # (one recency epoch for the blocks it read)
            client.load_ended(job, now)
        else:  # pragma: no cover - a G3 job's tier is the G3 tier
            raise AssertionError(job.kind)


class G3Tier:
    """A G3 store (per worker, or one for the deployment)."""

    __slots__ = ("capacity", "lru", "pending", "pins", "block_bytes", "spec", "read", "write", "domain",
                 "writer", "stats", "subscribers")

    def __init__(self, spec: G3Spec, domain: OffloadDomain) -> None:
        self.spec = spec
        self.capacity = spec.num_blocks
        self.block_bytes = spec.block_bytes
        self.lru: OrderedDict = OrderedDict()
        self.pending: dict[int, Job] = {}
        self.pins: dict[int, int] = {}  # resident key -> G3 reads in flight
        self.domain = domain
        self.read = ShareLink(spec.shared_read_gbps if spec.shared else 0.0)
        self.write = ShareLink(spec.shared_write_gbps if spec.shared else 0.0)
        domain.links.append(self.write)
        domain.links.append(self.read)
        self.writer: dict[int, int] = {}  # key -> id of the client that wrote it (cross-worker reads)
        self.subscribers: list = []  # KV event lists of the ranks the router indexes
        self.stats = {"lookup_probes": 0, "lookup_hits": 0, "lookup_pending": 0, "evictions": 0,
                      "cross_worker_read_blocks": 0}

    def write_through(self, g2: HostTier, store: Job, now: float) -> None:
        """A G2 store ended: write the blocks G3 lacks as one job (skipped when they do not fit)."""
        keys = [k for k in store.keys if k not in self.lru and k not in self.pending]
        if not keys:
            return
        free = self.capacity - len(self.lru) - len(self.pending)
        if len(keys) > free:
            need = len(keys) - free
            if need > len(self.lru) - len(self.pins):
                return  # (the reference skips the write silently)
            victims = []
            for k in self.lru:
                if k not in self.pins:
                    victims.append(k)
                    if len(victims) == need:
                        break
            for k in victims:
                del self.lru[k]
                self.writer.pop(k, None)
            self.stats["evictions"] += need
            if self.subscribers:
                ev = (DISK_REMOVED, hash_view(victims))
                for sink in self.subscribers:
                    sink.append(ev)
        view = hash_view(keys)
        client = store.client
        job = Job(self.domain.new_id(), G3_WRITE, client, view, len(keys) * self.block_bytes, now, self)
        job.req = g2  # (the G2 tier whose copies stay pinned until the write ends)
        for k in keys:
            self.pending[k] = job
        g2.pin(view, False)
        self.write.send(job, now, self.spec.latency_ms, bytes_per_ms(self.spec.write_gbps))
        client.g3_write.sent(job, now)

    def probe(self, key: int) -> int:
        """1: resident, 0: absent, -1: being written."""
        self.stats["lookup_probes"] += 1
        if key in self.lru:
            self.stats["lookup_hits"] += 1
            return 1
        if key in self.pending:
            self.stats["lookup_pending"] += 1
            return -1
        return 0

    def promote(self, g2: HostTier, keys: list, client, now: float) -> bool:
        """Read ``keys`` (resident here) into new pending G2 entries; False when G2 has no room."""
        if not g2.make_room(len(keys)):
            return False
        view = hash_view(keys)
        job = Job(self.domain.new_id(), G3_READ, client, view, len(keys) * self.block_bytes, now, self)
        job.req = g2
        for k in keys:
            g2.pending[k] = job
            self.pins[k] = self.pins.get(k, 0) + 1
            self.lru.move_to_end(k)
            w = self.writer.get(k)
            if w is not None and w != client.worker_key:
                self.stats["cross_worker_read_blocks"] += 1
        self.read.send(job, now, self.spec.latency_ms, bytes_per_ms(self.spec.read_gbps))
        client.g3_read.sent(job, now)
        return True

    def complete(self, job: Job, now: float) -> None:
        g2: HostTier = job.req
        if job.kind == G3_WRITE:
            for k in job.keys:
                del self.pending[k]
                self.lru[k] = None
                self.writer[k] = job.client.worker_key
            g2.unpin(job.keys, False)
            job.client.g3_write.ended(job, now)
            if self.subscribers:
                ev = (DISK_STORED, job.keys)
                for sink in self.subscribers:
                    sink.append(ev)
        else:  # G3_READ
            pins = self.pins
            for k in job.keys:
                c = pins[k] - 1
                if c:
                    pins[k] = c
                else:
                    del pins[k]
            g2.resident(job.keys)
            job.client.g3_read.ended(job, now)


class RequestOffload:
    """A request's offload state on an offload rank."""

    __slots__ = ("cursor", "stuck", "store", "load", "g1_blocks", "gen", "version")

    def __init__(self) -> None:
        self.cursor = 0  # prompt blocks stored (or found in G2) so far
        self.stuck = False  # a cohort larger than the pool: never stored
        self.store: Job | None = None  # its latest store
        self.load: Job | None = None  # its onboarding job (while it waits for it)
        self.g1_blocks = 0  # GPU-cached blocks when its onboarding was queued
        self.gen = -1  # the domain's generation when its lookup was deferred
        self.version = -1  # the pool's LRU version after its last lookup touch


class RankOffload:
    """A rank's side of the tiers: its G2 pool and links, its in-flight stores (GPU blocks that
    must not be overwritten before their copy ends), the store cohorts of the pass being
    scheduled, and its traffic counters."""

    __slots__ = ("spec", "domain", "tier", "d2h", "h2d", "g3", "d2h_rate", "h2d_rate", "sources", "cohorts",
                 "store_stats", "load_stats", "g3_read", "g3_write", "lookups", "hit_lookups", "hit_blocks",
                 "retries", "worker_key", "block_size", "loading", "lagging")

    def __init__(self, spec: HostOffloadSpec, domain: OffloadDomain, tier: HostTier, g3: G3Tier | None, d2h, h2d,
                 block_size: int, worker_key: int) -> None:
        self.spec = spec
        self.domain = domain
        self.tier = tier
        self.g3 = g3
        self.d2h = d2h
        self.h2d = h2d
        self.d2h_rate = bytes_per_ms(spec.d2h_gbps)
        self.h2d_rate = bytes_per_ms(spec.h2d_gbps)
        self.block_size = block_size
        self.sources: dict[int, Job] = {}  # key -> this rank's store in flight reading that GPU block
        self.cohorts: list = []  # (request, keys) prepared for the pass being scheduled
        self.store_stats = TierStats()
        self.load_stats = TierStats()
        self.g3_read = TierStats()
        self.g3_write = TierStats()
        self.lookups = self.hit_lookups = self.hit_blocks = self.retries = 0
        self.worker_key = worker_key  # the worker's id (G3 cross-worker reads)
        # the connector queue: requests onboarding (their GPU blocks reserved, no batch slot) or
        # whose lookup was deferred (a block they need is in flight), in queue order
        self.loading: deque = deque()
        self.lagging: set = set()  # running requests whose last cohort found no room (retried each pass)

    # -- time -----------------------------------------------------------------------------
    def advance(self, now_ms: float) -> None:
        self.domain.advance(now_ms)

    def next_event_ms(self) -> float:
        return self.domain.next_event_ms()

    def quiet(self) -> bool:
        """Nothing of this rank in flight (no store source to fence, no onboarding or deferred lookup)."""
        return not self.sources and not self.loading

    def done_by(self, job: Job) -> float:
        """When ``job`` ends (a shared link's: as predicted now)."""
        return job.done_ms if job.done_ms is not None else job.link.predict(job)

    # -- lookup and onboarding ------------------------------------------------------------------
    def lookup(self, req, state: RequestOffload, hashes, pos: int, full: int, now_ms: float) -> tuple[int, int]:
        """G2 blocks continuing a GPU hit of ``pos`` blocks (up to ``full``): (blocks, HIT or DEFER).
        Touches the request's prompt keys; a G3 hit starts a promotion (DEFER)."""
        tier = self.tier
        self.lookups += 1
        if state.store is not None and not state.store.ended:
            return 0, DEFER  # (its own latest store is still in flight)
        lru = tier.lru
        pending = tier.pending
        loading = tier.loading
        g3 = self.g3
        start = pos
        promote: list = []
        g2_run = -1  # the G2 hits before the first block found only in G3
        outcome = HIT
        while pos < full:
            k = hashes[pos]
            if k in lru:
                if k in loading:
                    outcome = DEFER
                    break
            elif k in pending:
                outcome = DEFER
                break
            elif g3 is not None:
                p = g3.probe(k)
                if p < 0:
                    outcome = DEFER
                    break
                if p == 0:
                    break
                if not promote:
                    g2_run = pos - start
                promote.append(k)
            else:
                break
            pos += 1
        if state.version != tier.version:
            tier.touch(hashes[:full])
            state.version = tier.version
        if outcome == DEFER:
            return 0, DEFER
        if promote:
            if g3.promote(tier, promote, self, now_ms):
                return 0, DEFER
            pos = start + g2_run  # (G2 has no room for them: the G2 hits before them)
        n = pos - start
        if n:
            self.hit_lookups += 1
            self.hit_blocks += n
        return n, HIT

    def start_load(self, req, state: RequestOffload, keys, now_ms: float, fence_ms: float) -> None:
        """Onboard ``keys`` (resident in G2) into the GPU blocks ``req`` reserved."""
        tier = self.tier
        job = Job(self.domain.new_id(), LOAD, self, keys, len(keys) * tier.block_bytes, now_ms, tier, req)
        tier.pin(keys, True)
        ready = fence_ms if fence_ms > now_ms else now_ms
        self.h2d.send(job, ready, self.spec.latency_ms, self.h2d_rate)
        self.load_stats.sent(job, now_ms)
        state.load = job

    def load_ended(self, job: Job, now: float) -> None:
        self.load_stats.ended(job, now)

    # -- stores -------------------------------------------------------------------------------
    def prepare_store(self, req, state: RequestOffload, upto: int) -> None:
        """Pass start: the cohort of ``req``'s complete prompt blocks up to ``upto`` not yet in G2."""
        cur = state.cursor
        hashes = req.hashes
        tier = self.tier
        lru = tier.lru
        pending = tier.pending
        missing = list(filterfalse(pending.__contains__, filterfalse(lru.__contains__, hashes[cur:upto])))
        if not missing:
            state.cursor = upto
            return
        if len(missing) > tier.capacity:
            state.stuck = True  # (retried forever by the reference: never stored)
            state.cursor = upto
            self.retries += 1
            return
        if not tier.make_room(len(missing)):
            self.retries += 1
            self.lagging.add(req)
            return  # (retried at the request's next pass)
        for k in missing:
            pending[k] = None
        if state.version != tier.version:  # (else its last touch is still the latest change of the order)
            tier.touch(hashes[: req.prompt_len // self.block_size])
            state.version = tier.version
        state.cursor = upto
        self.cohorts.append((req, state, missing))
        if self.lagging:
            self.lagging.discard(req)

    def submit_stores(self, end_ms: float) -> None:
        """Pass end: send the pass's cohorts (one job each, in scheduling order)."""
        tier = self.tier
        for req, state, missing in self.cohorts:
            keys = hash_view(missing)
            job = Job(self.domain.new_id(), STORE, self, keys, len(missing) * tier.block_bytes, end_ms, tier, req)
            entries = dict.fromkeys(missing, job)
            tier.pending.update(entries)
            self.sources.update(entries)
            self.d2h.send(job, end_ms, self.spec.latency_ms, self.d2h_rate)
            self.store_stats.sent(job, end_ms)
            state.store = job
        self.cohorts = []

    def store_ended(self, job: Job, now: float) -> None:
        # (a key is in one store at a time: G2 holds it pending until that store ends)
        _drain(map(self.sources.pop, job.keys, repeat(None)))
        self.store_stats.ended(job, now)

    def quiet_for_run(self, rank) -> bool:
        """Whether the rank's next passes may be fast-forwarded as a decode run: nothing of its own
        in flight (no store whose GPU blocks an eviction would have to wait for, no onboarding or
        deferred lookup), no cohort to retry, and - when a waiting request could be admitted
        between passes - no tier entry in flight that could turn its lookup deferred."""
        if self.sources or self.loading or self.lagging:
            return False
        if rank.waiting and len(rank.running) < rank.config.max_sequences:
            if self.tier.pending or (self.g3 is not None and self.g3.pending):
                return False
        return True

    # -- report -----------------------------------------------------------------------------------
    def report(self) -> dict:
        """This rank's counters (plain data), with its tiers' occupancy (``tier``: a shared tier is
        named once per replay by ``shared``)."""
        t = self.tier
        out = {
            "tier": {"shared": self.spec.shared, "capacity_blocks": t.capacity, "resident_blocks": len(t.lru),
                     "used_blocks": t.num_used, "evictions": t.num_evictions, "block_bytes": t.block_bytes},
            "g2_lookups": self.lookups,
            "g2_hit_lookups": self.hit_lookups,
            "g2_hit_blocks": self.hit_blocks,
            "store_retries": self.retries,
            "offload": self.store_stats.plain(),
            "onboard": self.load_stats.plain(),
        }
        if self.g3 is not None:
            g = self.g3
            out["g3_read"] = self.g3_read.plain()
            out["g3_write"] = self.g3_write.plain()
            out["g3"] = dict(g.stats, shared=g.spec.shared, capacity_blocks=g.capacity, resident_blocks=len(g.lru),
                             pending_blocks=len(g.pending))
        return out


class OffloadRegistry:
    """Builds the ranks' offload sides of one replay: private tiers per rank, the shared ones once
    (picklable; the workers of a deployment with a shared tier live in one engine host)."""

    def __init__(self) -> None:
        self._shared_domain: OffloadDomain | None = None
        self._shared_g2: HostTier | None = None
        self._shared_g3: G3Tier | None = None
        self._shared_links: tuple | None = None

    def _domain(self, shared: bool) -> OffloadDomain:
        if not shared:
            return OffloadDomain()
        if self._shared_domain is None:
            self._shared_domain = OffloadDomain()
        return self._shared_domain

    def rank(self, spec: HostOffloadSpec, g3spec: G3Spec | None, block_size: int, worker_key: int,
             events: list | None) -> RankOffload:
        shared = spec.shared or (g3spec is not None and g3spec.shared)
        domain = self._domain(shared)
        g3 = None
        if g3spec is not None:
            if g3spec.shared:
                if self._shared_g3 is None:
                    self._shared_g3 = G3Tier(g3spec, domain)
                g3 = self._shared_g3
            else:
                g3 = G3Tier(g3spec, domain)
        if spec.shared:
            if self._shared_g2 is None:
                self._shared_g2 = HostTier(spec.num_blocks, spec.block_bytes)
                self._shared_links = (ShareLink(spec.shared_d2h_gbps), ShareLink(spec.shared_h2d_gbps))
                domain.links.extend(self._shared_links)
            tier = self._shared_g2
            d2h, h2d = self._shared_links
        else:
            tier = HostTier(spec.num_blocks, spec.block_bytes)
            d2h, h2d = FifoLane(), FifoLane()
            domain.links.extend((d2h, h2d))
        if events is not None:
            tier.subscribers.append(events)
            if g3 is not None:
                g3.subscribers.append(events)
        return RankOffload(spec, domain, tier, g3, d2h, h2d, block_size, worker_key)
