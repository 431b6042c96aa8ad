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

The G2 pool is kept as the GPU cache is (a ``KVCache`` over one-token blocks: runs of
consecutive blocks, release batches for recency, holders for pending and pinned entries), so a
store, a lookup, an onboarding or an eviction costs a step per run it touches; nothing scans a
tier. G3 (rarer: aggregated workers with one attention-data rank) is kept block by block.
"""

from __future__ import annotations

import struct
from collections import OrderedDict, deque
from dataclasses import dataclass

from aisim.actors.engine.kv_cache import KVCache
from aisim.actors.hashing import hash_view

INF = float("inf")
_IDENTITY = struct.Struct("=QQ")  # a HOST_STORED payload's (seq, index), as its hashes are stored (native "Q")

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

    def plain(self) -> dict:
        """The tier as the config names it (``kv_cache.host_offload``), with its block size in bytes;
        the shared pool's caps only where they apply."""
        out = {"scope": self.scope, "num_host_blocks": self.num_blocks, "block_bytes": self.block_bytes,
               "d2h_bandwidth_gbps": self.d2h_gbps, "h2d_bandwidth_gbps": self.h2d_gbps}
        if self.shared:
            out["shared_d2h_bandwidth_gbps"] = self.shared_d2h_gbps
            out["shared_h2d_bandwidth_gbps"] = self.shared_h2d_gbps
        out["latency_to_first_byte_ms"] = self.latency_ms
        return out


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

    def plain(self) -> dict:
        """The tier as the config names it (``kv_cache.g3_offload``), with its block size in bytes."""
        out = {"scope": self.scope, "num_g3_blocks": self.num_blocks, "block_bytes": self.block_bytes,
               "read_bandwidth_gbps": self.read_gbps, "write_bandwidth_gbps": self.write_gbps}
        if self.shared:
            out["shared_read_bandwidth_gbps"] = self.shared_read_gbps
            out["shared_write_bandwidth_gbps"] = self.shared_write_gbps
        out["latency_to_first_byte_ms"] = self.latency_ms
        return out


def bytes_per_ms(gbps: float) -> float:
    """Decimal GB/s as bytes per millisecond; 0 means instantaneous."""
    return gbps * 1e6 if gbps > 0 else INF


class Job:
    """One transfer: ``keys`` (a hash view) of ``nbytes`` from ``client``."""

    __slots__ = ("id", "kind", "client", "keys", "nbytes", "submit_ms", "start_ms", "left", "cap", "done_ms",
                 "req", "tier", "link", "ended", "hold")

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
        self.hold = None  # the host-tier blocks it holds (a _Hold), released when it ends


class FifoLane:
    """A private link direction: jobs one after another, each end fixed when it is sent."""

    __slots__ = ("tail_ms", "queue", "domain")

    def __init__(self) -> None:
        self.tail_ms = 0.0
        self.queue: deque[Job] = deque()  # in send order = completion order
        self.domain: OffloadDomain | None = None

    def send(self, job: Job, ready_ms: float, latency_ms: float, rate: float) -> None:
        start = ready_ms + latency_ms
        if self.tail_ms > start:
            start = self.tail_ms
        job.start_ms = start
        job.done_ms = self.tail_ms = done = start + (job.nbytes / rate if rate < INF else 0.0)
        job.link = self
        self.queue.append(job)
        d = self.domain
        if done < d.next_t:
            d.next_t = done
        if d.known is not None and done < d.known:  # (a lane's earlier jobs end no later: still exact)
            d.known = done

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

    __slots__ = ("rate", "jobs", "now", "domain", "_rates_now", "_next")

    def __init__(self, shared_gbps: float) -> None:
        self.rate = bytes_per_ms(shared_gbps)
        self.jobs: list[Job] = []  # in send order
        self.now = 0.0  # the jobs' bytes left are as of then (the link's last event)
        self.domain: OffloadDomain | None = None
        self._rates_now: list | None = None  # the active jobs' rates while the active set stands
        self._next: float | None = None  # its next event while nothing is sent (None: to compute)

    def send(self, job: Job, ready_ms: float, latency_ms: float, rate: float) -> None:
        start = job.start_ms = ready_ms + latency_ms
        job.cap = rate
        job.link = self
        now = self.now
        d = self.domain
        first = start  # (the link's first event it causes)
        if start <= d.now and now <= start < self.next_event():
            # it starts now and nothing of the link happens before: serve the others up to now
            # and count it active at once (what its first-byte event would do, one event less)
            if start > now:
                dt = start - now
                for j, r in self._rates():
                    j.left -= r * dt
                self.now = start
            fastest = rate if rate < self.rate else self.rate
            first = start + job.nbytes / fastest if fastest < INF else start  # (it ends no sooner)
        self.jobs.append(job)
        self._rates_now = None
        self._next = None
        if first < d.next_t:  # (the others' ends only move later)
            d.next_t = first
        d.known = None

    def _rates(self) -> list[tuple[Job, float]]:
        out = self._rates_now
        if out is not None:
            return out
        now = self.now
        jobs = self.jobs
        if len(jobs) == 1 and jobs[0].start_ms <= now:  # (the usual case: one job, the link's rate or its cap)
            j = jobs[0]
            out = self._rates_now = [(j, j.cap if j.cap < self.rate else self.rate)]
            return out
        active = [j for j in jobs if j.start_ms <= now]
        out = []
        if active:
            per_client: dict[int, int] = {}
            for j in active:
                per_client[id(j.client)] = per_client.get(id(j.client), 0) + 1
            share = self.rate / len(active)
            for j in active:
                r = j.cap / per_client[id(j.client)]
                out.append((j, r if r < share else share))
        if len(active) == len(self.jobs):  # (no first byte to come: the set stands until one ends)
            self._rates_now = out
        return out

    def next_event(self) -> float:
        t = self._next
        if t is None:
            t = self._next = self._next_event()
        return t

    def _next_event(self) -> float:
        jobs = self.jobs
        now = self.now
        if len(jobs) == 1:  # (the usual case: one job, its first byte or its end at its rate)
            j = jobs[0]
            if j.start_ms > now:
                return j.start_ms
            r = j.cap if j.cap < self.rate else self.rate
            return now + j.left / r if r < INF else now
        t = INF
        for j in jobs:
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
        next0 = self._next
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
            self._rates_now = None
            self._next = next0

    def run_to(self, t: float, out: list, mark: bool = True) -> None:
        """Serve up to ``t`` (no event of this link before it); jobs ending at ``t`` go to ``out``.
        Before its next event nothing changes but the bytes left, which are drained at events
        only (the same whenever and however often the domain looks)."""
        if t < self.next_event():
            return
        self._next = None
        now = self.now
        if not self.jobs:
            if t > now:
                self.now = t
            return
        dt = t - now
        ended = []
        for j, r in self._rates():
            d = now + j.left / r if r < INF else now
            if d <= t:
                ended.append(j)
            else:
                j.left -= r * dt
        if t > now:
            self.now = t  # (kept rates stay: they are kept only while every job has started)
        if ended:
            for j in ended:
                j.left = 0.0
                if mark:
                    j.done_ms = self.now
            self.jobs = [j for j in self.jobs if j.left > 0.0 or j.start_ms > self.now]
            self._rates_now = None
            out.extend(ended)


class OffloadDomain:
    """The tiers and links that share one clock (a rank's, or a deployment's shared ones)."""

    __slots__ = ("links", "now", "next_id", "generation", "next_t", "known")

    def __init__(self) -> None:
        self.links: list = []
        self.next_t = INF  # no event before it (a lower bound: sending a job lowers it)
        self.known: float | None = None  # the links' next event while it is known exactly (None: to find)
        self.now = 0.0
        self.next_id = 0
        self.generation = 0  # completions so far (a deferred lookup retries after one)

    def add(self, link) -> None:
        link.domain = self
        self.links.append(link)
        self.known = None

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def next_event_ms(self) -> float:
        t = self.known
        if t is None:
            t = INF
            for link in self.links:
                e = link.next_event()
                if e < t:
                    t = e
            self.known = t
        return t

    def advance(self, t: float) -> None:
        """Complete every job ending by ``t``, in time order (what they trigger too)."""
        if t < self.now:
            return  # (a shared domain another rank brought further already)
        if t < self.next_t:  # (nothing ends by then)
            if t > self.now:
                self.now = t
            return
        links = self.links
        while True:
            t_ev = self.next_event_ms()
            if t_ev > t or t_ev == INF:
                self.next_t = t_ev
                break
            done: list[Job] = []
            for link in links:
                link.run_to(t_ev, done)
            self.known = None  # (the links' events moved on)
            if t_ev > self.now:
                self.now = t_ev
            if done:
                if len(done) > 1:
                    done.sort(key=_completion_order)
                for job in done:
                    job.ended = True
                    job.tier.complete(job, t_ev)
                    # (its request keeps it as its latest store or load: leave no cycle behind,
                    # so the two are freed when the request goes, not by the cyclic collector)
                    job.req = job.hold = None
                self.generation += 1
        # (a shared link is served up to its events only: its bytes left are the same whenever
        # anyone looks, so the results do not depend on how often the domain is advanced)
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


class _Hold:
    """Holds host-tier blocks for one transfer (the pending blocks of a store or a G3 read, the
    blocks an onboarding reads): the request-side fields ``KVCache`` keeps holdings in."""

    __slots__ = ("held", "num_held", "num_private", "num_full_registered", "dup_tail", "hashes", "stretches")

    def __init__(self) -> None:
        self.held: list = []
        self.num_held = 0
        self.num_private = 0
        self.num_full_registered = 0
        self.dup_tail = False
        self.hashes = None
        self.stretches: list = ()  # the new blocks it registered, as HOST_STORED payloads (a router indexes it)


class HostTier:
    """A G2 pool, kept as the GPU cache is (``KVCache`` over one-token blocks, so chain positions
    are block counts): resident unpinned entries are its cached inactive blocks (LRU, a chain's
    tail evicted first), pending and pinned ones are blocks held by a transfer (``_Hold``: a store
    or G3 read in flight, an onboarding, a G3 write of stored blocks). A lookup or a finished
    transfer makes the blocks it covers the most recent (one release batch). Every operation costs
    one step per run of consecutive blocks it touches, not one per block."""

    __slots__ = ("capacity", "block_bytes", "kv", "subscribers", "version", "num_pending")

    def __init__(self, capacity: int, block_bytes: int) -> None:
        self.capacity = capacity
        self.block_bytes = block_bytes
        self.kv = KVCache(capacity, 1, True, False)
        self.subscribers: list = []  # KV event lists of the ranks the router indexes
        self.version = 0  # bumped by every change of the recency order
        self.num_pending = 0  # blocks of stores and G3 reads in flight

    def subscribe(self, sink: list) -> None:
        if self.kv.removed_ids is None:
            self.kv.removed_ids = []
        self.subscribers.append(sink)

    @property
    def num_used(self) -> int:
        kv = self.kv
        return kv.num_active + kv.num_inactive

    @property
    def num_evictions(self) -> int:
        return self.kv.num_evicted

    def _publish(self) -> None:
        """Evictions as one HOST_REMOVED event: ``(seq, index, count)`` per evicted stretch, the
        blocks' identities (see ``stored``; the pool's new entries are pending until ``stored``
        tells the router they are resident, as the reference does)."""
        ids = self.kv.removed_ids
        if ids:
            self._send((HOST_REMOVED, hash_view(ids)))
            ids.clear()

    def _send(self, ev: tuple) -> None:
        for sink in self.subscribers:
            sink.append(ev)

    def stored(self, hold: _Hold) -> None:
        """The blocks ``hold`` registered became resident (a store or a G3 read ended): one
        HOST_STORED event per stretch of consecutive new blocks, ``[seq, index, *hashes]`` - its
        first block is the ``index``-th the pool's registration ``seq`` stored, the next ones
        follow (the identities HOST_REMOVED names evicted stretches by)."""
        for payload in hold.stretches:
            self._send((HOST_STORED, payload))

    def prefix(self, hashes, limit: int) -> tuple[int, list]:
        """How many leading ``hashes`` (up to ``limit``) the pool holds, and the path to them."""
        n, _, path = self.kv.match_prefix(hashes, limit)
        return n, path

    def span(self, hashes, lo: int, hi: int) -> tuple[int, list, int]:
        """The pool's blocks of ``hashes`` consecutive from ``lo`` (below ``hi``): (where they end,
        the path to them, where the path starts - 0, or the start of the run holding ``lo`` when
        the pool lost a block before it). Ends at or before ``lo`` when the pool lacks ``lo``."""
        kv = self.kv
        n, _, path = kv.match_prefix(hashes, hi)
        if n > lo or not lo:
            return n, path, 0
        heads = kv._heads
        key = hashes[lo]
        for p in range(lo, n, -1):  # (a gap: the run holding ``lo`` starts after it, if any)
            run = heads.get(hashes[p])
            if run is not None:
                off = lo - p
                if off < len(run.keys) and run.keys[off] == key:
                    m, _, sub = kv.match_prefix(hashes[p:hi], hi - p)
                    return p + m, sub, p
                break  # (the run starting at p holds hashes[p]: no earlier one reaches lo)
        return n, path, 0

    @staticmethod
    def held_in(path: list, lo: int, hi: int) -> bool:
        """Whether a transfer holds one of the path's blocks ``lo`` to ``hi`` (pending or being read)."""
        pos = 0
        for run, n in path:
            if pos >= hi:
                break
            if run.holders and pos + n > lo:
                return True
            pos += n
        return False

    def touch(self, path: list) -> None:
        """A lookup: the path's blocks become the most recent (the first block most)."""
        if path:
            self.kv.touch(path)
        self.version += 1

    def reserve_new(self, hashes, start: int, end: int) -> _Hold | None:
        """Pending entries for ``hashes[start:end]`` (not in the pool), evicting LRU entries; None
        (nothing changed) when the unpinned entries cannot make room."""
        kv = self.kv
        n = end - start
        if not kv.reserve(n):
            return None
        h = _Hold()
        h.num_private = n
        h.num_full_registered = start
        h.hashes = hashes
        kv.register(h, hashes, end)
        if start and hashes[start] in kv._heads:
            # (its parent may go first: it is not in the pool, or not pinned while these are
            # pending and older once they are stored - the pool does not evict leaves first)
            kv.mark_loose(hashes, start)
        if self.subscribers:  # (each new run: one registration's stretch, its first mark its identity)
            h.stretches = [memoryview(_IDENTITY.pack(*run.marks[0][1:]) + run.keys.tobytes()).cast("Q")
                           for run, _ in h.held]
        self.num_pending += n
        self._publish()
        return h

    def hold_range(self, hashes, lo: int, hi: int) -> _Hold:
        """Hold the resident blocks ``hashes[lo:hi]`` (an onboarding reads them)."""
        kv = self.kv
        if lo:
            _, path, pos = self.span(hashes, lo, lo + 1)
            for run, n in path:
                if pos + n > lo:
                    if pos < lo:  # (a run starts at lo, so the hold begins there)
                        kv.split_in_place(run, lo - pos)
                    break
                pos += n
            kv.mark_loose(hashes, lo)  # (its parent may now be evicted before it)
        _, _, sub = kv.match_prefix(hashes[lo:hi], hi - lo)
        h = _Hold()
        kv.acquire(h, sub)
        return h

    def release(self, h: _Hold, pending: int = 0) -> None:
        """A transfer ended: its blocks are resident and the most recent (one batch)."""
        self.kv.release(h)
        self.num_pending -= pending
        self.version += 1
        self._publish()

    def complete(self, job: Job, now: float) -> None:
        client = job.client
        if job.kind == STORE:
            client.store_ended(job, now)
            if self.subscribers:
                self.stored(job.hold)
            g3 = client.g3  # (the storing rank's G3: its worker's, or the shared one)
            self.num_pending -= len(job.keys)
            if g3 is None or not g3.write_through(self, job, now):
                self.release(job.hold)
            else:
                self.version += 1  # (written on to G3: the blocks stay held until that write ends)
        elif job.kind == LOAD:
            self.release(job.hold)  # (one recency epoch for the blocks it read)
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
        domain.add(self.write)
        domain.add(self.read)
        self.writer: dict[int, int] = {}  # key -> id of the client that wrote it (cross-worker reads)
        self.subscribers: list = []  # KV event lists of the ranks the router indexes
        self.stats = {"lookup_probes": 0, "lookup_hits": 0, "lookup_pending": 0, "evictions": 0,
                      "cross_worker_read_blocks": 0}

    def write_through(self, g2: HostTier, store: Job, now: float) -> bool:
        """A G2 store ended: write the blocks G3 lacks as one job, the G2 copies held until it
        ends (False: nothing to write, or no room - the reference skips the write silently)."""
        keys = [k for k in store.keys if k not in self.lru and k not in self.pending]
        if not keys:
            return False
        free = self.capacity - len(self.lru) - len(self.pending)
        if len(keys) > free:
            need = len(keys) - free
            if need > len(self.lru) - len(self.pins):
                return False
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
        job.hold = store.hold  # (the G2 copies stay held until the write ends)
        for k in keys:
            self.pending[k] = job
        self.write.send(job, now, self.spec.latency_ms, bytes_per_ms(self.spec.write_gbps))
        client.g3_write.sent(job, now)
        return True

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

    def promote(self, g2: HostTier, hashes, lo: int, hi: int, client, now: float) -> bool:
        """Read ``hashes[lo:hi]`` (resident here) into new pending G2 entries; False when G2 has no room."""
        hold = g2.reserve_new(hashes, lo, hi)
        if hold is None:
            return False
        view = hashes[lo:hi]
        job = Job(self.domain.new_id(), G3_READ, client, view, (hi - lo) * self.block_bytes, now, self)
        job.hold = hold
        for k in view:
            self.pins[k] = self.pins.get(k, 0) + 1
            self.lru.move_to_end(k)
            w = self.writer.get(k)
            if w is not None and w != client.worker_key:
                self.stats["cross_worker_read_blocks"] += 1
        self.read.send(job, now, self.spec.latency_ms, bytes_per_ms(self.spec.read_gbps))
        client.g3_read.sent(job, now)
        return True

    def complete(self, job: Job, now: float) -> None:
        g2 = job.client.tier  # (the G2 pool of the rank that wrote or reads: its hold is there)
        if job.kind == G3_WRITE:
            for k in job.keys:
                del self.pending[k]
                self.lru[k] = None
                self.writer[k] = job.client.worker_key
            g2.release(job.hold)
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
            g2.release(job.hold, len(job.keys))
            if g2.subscribers:
                g2.stored(job.hold)
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
                 "retries", "worker_key", "block_size", "loading", "lagging", "stores", "events")

    def __init__(self, spec: HostOffloadSpec, domain: OffloadDomain, tier: HostTier, g3: G3Tier | None, d2h, h2d,
                 block_size: int, worker_key: int, events: list | None = None) -> None:
        self.spec = spec
        self.domain = domain
        self.tier = tier
        self.g3 = g3
        self.d2h = d2h
        self.h2d = h2d
        self.d2h_rate = bytes_per_ms(spec.d2h_gbps)
        self.h2d_rate = bytes_per_ms(spec.h2d_gbps)
        self.block_size = block_size
        # GPU blocks this rank's stores in flight are still copying, once their request let go of
        # them (an eviction could overwrite them)
        self.sources: set[int] = set()
        self.stores: list[Job] = []  # those stores, in sending order
        self.cohorts: list = []  # (request, its state, hold, first block, end) prepared for the pass
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
        self.events = events  # its tiers' KV events not yet published, when the router indexes them

    # -- time -----------------------------------------------------------------------------
    def advance(self, now_ms: float) -> None:
        self.domain.advance(now_ms)

    def next_event_ms(self) -> float:
        return self.domain.next_event_ms()

    def done_by(self, job: Job) -> float:
        """When ``job`` ends (a shared link's: as predicted now)."""
        return job.done_ms if job.done_ms is not None else job.link.predict(job)

    def fence_ms(self, fenced: list) -> float:
        """When the stores behind ``fenced`` end: GPU blocks (hashes) an eviction overwrote while
        a store of this rank was still copying them, or a preempted request's last store (a Job)."""
        out = 0.0
        for x in fenced:
            if isinstance(x, Job):
                t = self.done_by(x)
            else:
                t = max([self.done_by(j) for j in self.stores if x in j.keys], default=0.0)
            if t > out:
                out = t
        return out

    # -- lookup and onboarding ------------------------------------------------------------------
    def lookup(self, req, state: RequestOffload, hashes, pos: int, full: int, now_ms: float) -> tuple[int, int, list]:
        """G2 blocks continuing a GPU hit of ``pos`` blocks (up to ``full``): (blocks, HIT or DEFER,
        the path to touch when the admission decides - ``touch``). A deferred lookup touches at
        once; a G3 hit starts a promotion (DEFER). G2 is probed from the prompt's first block: a
        block G2 lost ends its hit."""
        tier = self.tier
        if state.store is not None and not state.store.ended:
            return 0, DEFER, []  # (its own latest store is still in flight)
        n, path, p0 = tier.span(hashes, pos, full)
        if n > pos and tier.held_in(path, pos - p0, n - p0):
            self.touch(state, path)
            return 0, DEFER, []  # (a block it needs is being stored or read)
        hit = n - pos if n > pos else 0
        g3 = self.g3
        if g3 is not None and pos + hit < full:
            lo = pos + hit
            hi = lo
            while hi < full:
                p = g3.probe(hashes[hi])
                if p < 0:
                    self.touch(state, path)
                    return 0, DEFER, []
                if p == 0:
                    break
                hi += 1
            if hi > lo:
                self.touch(state, path)
                if g3.promote(tier, hashes, lo, hi, self, now_ms):
                    return 0, DEFER, []
                return hit, HIT, []  # (G2 had no room for them; touched already)
        return hit, HIT, path

    def touch(self, state: RequestOffload, path: list) -> None:
        """The request's lookup counts (it is admitted, onboards or waits for a transfer): its
        cached prompt blocks become the most recent - not at each pass a full GPU cache keeps it
        waiting (a decode run takes no lookups)."""
        tier = self.tier
        if state.version != tier.version:
            tier.touch(path)
            state.version = tier.version

    def counted(self, hit: int) -> None:
        """A lookup decided (the request onboards, is admitted or waits for a transfer): counted
        once, not at each pass a full GPU cache keeps it waiting."""
        self.lookups += 1
        if hit:
            self.hit_lookups += 1
            self.hit_blocks += hit

    def start_load(self, req, state: RequestOffload, hashes, lo: int, hi: int, now_ms: float,
                   fence_ms: float) -> None:
        """Onboard ``hashes[lo:hi]`` (resident in G2) into the GPU blocks ``req`` reserved."""
        tier = self.tier
        job = Job(self.domain.new_id(), LOAD, self, hashes[lo:hi], (hi - lo) * tier.block_bytes, now_ms, tier, req)
        job.hold = tier.hold_range(hashes, lo, hi)
        ready = fence_ms if fence_ms > now_ms else now_ms
        self.h2d.send(job, ready, self.spec.latency_ms, self.h2d_rate)
        self.load_stats.sent(job, now_ms)
        state.load = job

    def load_ended(self, job: Job, now: float) -> None:
        self.load_stats.ended(job, now)

    # -- stores -------------------------------------------------------------------------------
    def prepare_store(self, req, state: RequestOffload, upto: int) -> None:
        """Pass start: the cohort of ``req``'s complete prompt blocks up to ``upto`` that G2 lacks
        (after the ones it holds from the first block on, or the stored cursor)."""
        hashes = req.hashes
        tier = self.tier
        cur = state.cursor
        n, path = tier.prefix(hashes, upto)
        if n >= upto:
            state.cursor = upto
            return
        start = n
        if n < cur:  # (G2 lost a block before the cursor: what it holds from the cursor on)
            e, _, _ = tier.span(hashes, cur, upto)
            start = e if e > cur else cur
            if start >= upto:
                state.cursor = upto
                return
        if upto - start > tier.capacity:
            state.stuck = True  # (retried forever by the reference: never stored)
            state.cursor = upto
            self.retries += 1
            return
        if state.version != tier.version:  # (a successful prepare repeats the lookup's touch)
            tier.touch(path)
        hold = tier.reserve_new(hashes, start, upto)
        if hold is None:
            self.retries += 1
            self.lagging.add(req)
            return  # (retried at the request's next pass)
        state.version = tier.version
        state.cursor = upto
        self.cohorts.append((req, state, hold, start, upto))
        if self.lagging:
            self.lagging.discard(req)

    def submit_stores(self, end_ms: float) -> None:
        """Pass end: send the pass's cohorts (one job each, in scheduling order)."""
        self.domain.advance(end_ms)  # (transfers that ended before it: the links' busy time)
        tier = self.tier
        for req, state, hold, start, upto in self.cohorts:
            keys = req.hashes[start:upto]
            job = Job(self.domain.new_id(), STORE, self, keys, (upto - start) * tier.block_bytes, end_ms, tier, req)
            job.hold = hold
            self.stores.append(job)
            self.d2h.send(job, end_ms, self.spec.latency_ms, self.d2h_rate)
            self.store_stats.sent(job, end_ms)
            state.store = job
        self.cohorts = []

    def store_ended(self, job: Job, now: float) -> None:
        if job.req is None:  # (its request let go of the GPU blocks before the copy ended)
            self.sources.difference_update(job.keys)
        self.stores.remove(job)
        self.store_stats.ended(job, now)

    def released(self, req) -> None:
        """``req`` let go of its GPU blocks (completed, preempted, handed off) while stores of its
        blocks may still be copying them: from now on an eviction of one of those blocks waits
        for its copy (while the request holds them nothing can overwrite them)."""
        for job in self.stores:
            if job.req is req:
                job.req = None
                self.sources.update(job.keys)

    def run_cap(self, batch: list, remaining: list) -> int | None:
        """How many passes a decode run of ``batch`` may take before a request whose store is
        still in flight completes (its GPU blocks would then need watching): None when none is."""
        cap = None
        for job in self.stores:
            req = job.req
            if req is not None:
                for r, left in zip(batch, remaining):
                    if r is req and (cap is None or left - 1 < cap):
                        cap = left - 1
        return cap

    def quiet_for_run(self, rank) -> bool:
        """Whether the rank's next passes may be fast-forwarded as a decode run: no GPU block a
        store is still copying can be evicted (their requests hold them; ``run_cap`` ends the run
        before one of those requests completes), no onboarding or deferred lookup, no cohort to
        retry, and - when a waiting request could be admitted between passes - no tier entry in
        flight that could turn its lookup deferred."""
        if self.sources or self.loading or self.lagging:
            return False
        if rank.waiting and len(rank.running) < rank.config.max_sequences:
            # (each stepped pass would look the blocked head up, which changes the tiers only
            # when it is deferred or starts a G3 read)
            if self.tier.num_pending or self.g3 is not None:
                return False
            state = rank.waiting[0].offload
            if state is not None and state.store is not None and not state.store.ended:
                return False
        return True

    # -- report -----------------------------------------------------------------------------------
    def report(self) -> dict:
        """This rank's counters (plain data), with its tiers' occupancy (``tier``: a shared tier is
        named once per replay by ``shared``)."""
        t = self.tier
        out = {
            "tier": {"shared": self.spec.shared, "capacity_blocks": t.capacity,
                     "resident_blocks": t.num_used - t.num_pending, "used_blocks": t.num_used,
                     "evictions": t.num_evictions, "block_bytes": t.block_bytes},
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
                for link in self._shared_links:
                    domain.add(link)
            tier = self._shared_g2
            d2h, h2d = self._shared_links
        else:
            tier = HostTier(spec.num_blocks, spec.block_bytes)
            d2h, h2d = FifoLane(), FifoLane()
            domain.add(d2h)
            domain.add(h2d)
        if events is not None:
            # (a shared tier publishes through its first rank that records events: the router
            # keeps one view of it for every candidate, ``KvRouter(host_tier="cluster_shared")``)
            if not (spec.shared and tier.subscribers):
                tier.subscribe(events)
            if g3 is not None and not (g3spec.shared and g3.subscribers):
                g3.subscribers.append(events)
        return RankOffload(spec, domain, tier, g3, d2h, h2d, block_size, worker_key, events)
