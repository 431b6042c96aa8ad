"""An engine host: a group of engine workers that advance on their own between two edges of
the coordinator's clock. This is the one per-worker event loop of aisim.

The same class runs in process and inside a Ray actor; the coordinator decides the edges and
sends each host its timed inputs (requests to enqueue, KV sources to release) and control
messages (spawn, drain). Requests cross as plain-data lists (``request_to_wire``) when the
host lives elsewhere or the runtime checks the wire form; a single in-process host is handed
the ``Request`` objects themselves (``direct=True``: no copies, same results). Between edges
a host replays, for each of its workers, exactly what happens at each instant:

    pass ends (ascending worker id) -> timed inputs, in (time, phase, id, op) order -> settle

A step from the current edge ``now`` to ``until`` first applies the inputs at ``now`` and
starts passes at ``now``, then runs every instant in (now, until) fully, and ends at
``until`` after its pass ends: inputs at ``until`` and the passes starting then belong to the
next step, after the coordinator has routed what arrives at ``until``. Asked to, a step ends
early in the same way at the first instant at which a worker hands a request off (the output's
``reached`` says where it ended).

The messages in and out are the NamedTuples of ``actors.protocol`` (``HostInput``, ``Control``,
``HostEvent``, ``KvUpdate``, ``WorkerStatus``, ``HostOutput``, ``HostFinish``). Output events carry
``(time, phase, id, seq)`` so the coordinator can merge every host's events into the same-time
order (``actors.protocol.Phase``): pass-end events (completions, first tokens, handoffs, drain
settlements) at ``(t, PASS_END, worker)``, release-triggered drain settlements at
``(t, TRANSFER, transfer)``, admission rejections at ``(t, SETTLE, worker)``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from operator import itemgetter

from aisim.actors.engine.request import WAITING, Request, request_from_wire, request_to_wire
from aisim.actors.engine.worker import EngineWorker
from aisim.actors.hashing import hash_view
from aisim.actors.protocol import (
    EventKind,
    HostEvent,
    HostFinish,
    HostOutput,
    KvUpdate,
    Op,
    Phase,
    UpdateKind,
    WorkerStatus,
    WorkerTotals,
)

# the protocol's numbers as plain ints in the hot loops
_PASS_END, _SETTLE = int(Phase.PASS_END), int(Phase.SETTLE)
_ENQUEUE = int(Op.ENQUEUE)
_UP_KV = int(UpdateKind.KV)
_RESERVED = int(EventKind.RESERVED)
_FIRST_TOKEN, _TERMINAL, _HANDOFF, _DRAINED = (int(k) for k in (EventKind.FIRST_TOKEN, EventKind.TERMINAL,
                                                                  EventKind.HANDOFF, EventKind.DRAINED))

_EVENT_ORDER = itemgetter(0, 1, 2, 3)
_new = tuple.__new__  # builds a protocol NamedTuple without its Python-level __new__ (hot loops)
INF = float("inf")


class HostPool:
    """How a host builds workers of one pool and what it reports about them."""

    __slots__ = ("spawn", "track_first_tokens", "hands_off", "reserves")

    def __init__(self, spawn: Callable[[int], EngineWorker], track_first_tokens: bool, hands_off: bool,
                 reserves: bool = False) -> None:
        self.spawn = spawn  # worker id -> a new EngineWorker
        self.track_first_tokens = track_first_tokens  # report first tokens (the router tracks them)
        self.hands_off = hands_off  # prefill pool: finished prompts leave through handoffs
        self.reserves = reserves  # decode pool whose destinations reserve before their transfer


def _same(req, source=None):
    return req


class _Watch:
    """The blocks the router reads at an edge (bytes of uint64 hashes) as a set, built when first
    asked: often no busy worker needs it (nothing it allocates evicts)."""

    __slots__ = ("raw", "hashes")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.hashes: set | None = None

    def isdisjoint(self, blocks) -> bool:
        if self.hashes is None:
            self.hashes = set(hash_view(self.raw))
        return self.hashes.isdisjoint(blocks)


class WorkerHost:
    def __init__(self, pools: dict[str, HostPool], hash_source, workers: list[tuple[int, str]],
                 direct: bool = False) -> None:
        self.pools = pools
        self.source = hash_source
        # how requests cross: the objects themselves (one in-process host) or their wire form
        self.direct = direct
        self._encode = _same if direct else request_to_wire
        self._decode = _same if direct else request_from_wire
        self.now = 0.0
        self.workers: dict[int, EngineWorker] = {}
        self.pool_of: dict[int, str] = {}
        self._ends: list = []  # (end_ms, worker id, version)
        self._version: dict[int, int] = {}
        self._pending: list = []  # timed inputs
        self._pending_for: dict[int, int] = {}  # worker -> inputs not yet applied
        self._dirty: set[int] = set()
        self._held: dict[int, tuple[int, Request]] = {}  # handed-off request -> (source worker, request)
        self._held_by: dict[int, int] = {}
        self._draining: set[int] = set()
        self._events: list = []
        self._seq = 0
        self._last = (float("-inf"), 0, 0)  # (time, phase, id) of the last event emitted
        self._unsorted = False  # events were emitted out of (time, phase, id) order
        self._inputs_of: dict[int, list[float]] = {}  # worker -> times of its pending inputs (a heap)
        self._kv: list = []
        self._touched: set[int] = set()  # workers whose status may have changed since the last report
        self._tiered: list[int] = []  # workers with KV tiers that publish (synced before each report)
        self._handed_off = False  # a handoff was emitted in this step
        self._hint: float | None = None  # the current step's end (``step``)
        self._hint_bounds = False  # no input comes before it (a step that cannot stop early)
        self._watched = False  # the steps come with the blocks the router reads (EngineWorker.edges_watched)
        for wid, key in workers:
            self._add(wid, key)

    # -- construction -------------------------------------------------------------------
    def _add(self, wid: int, key: str) -> None:
        pool = self.pools[key]
        worker = pool.spawn(wid)
        if pool.track_first_tokens:
            for rank in worker.ranks:
                rank.first_tokens = []
        self.workers[wid] = worker
        self.pool_of[wid] = key
        self._version[wid] = 0
        self._pending_for[wid] = 0
        self._inputs_of[wid] = []
        self._held_by[wid] = 0
        self._touched.add(wid)
        worker.edges_watched = self._watched
        if worker.records_kv_events and worker.has_tiers:
            self._tiered.append(wid)

    def _control(self, control) -> None:
        for op, wid, pool in control:  # Control
            if op == "spawn":
                self._add(wid, pool)
            elif op == "drain":
                self._draining.add(wid)
            else:  # pragma: no cover - a coordinator bug
                raise ValueError(f"unknown control message {op!r}")

    # -- events out ---------------------------------------------------------------------
    def _emit(self, t: float, phase: int, sid: int, kind: int, payload) -> None:
        self._events.append(_new(HostEvent, (t, phase, sid, self._seq, kind, payload)))
        self._seq += 1
        self._last = (t, phase, sid)

    def _emit_terminals(self, wid: int, reqs: list[Request]) -> None:
        """Completions at their ``terminal_ms``: a run's earlier completions are applied lazily,
        after events that follow them (``_output`` then restores the same-time order)."""
        encode = self._encode
        for req in reqs:
            t = req.terminal_ms
            if (t, _PASS_END, wid) < self._last:
                self._unsorted = True
            self._emit(t, _PASS_END, wid, _TERMINAL, encode(req))

    def _take_exits(self, wid: int, worker: EngineWorker) -> None:
        if worker.exits:
            self._emit_terminals(wid, worker.take_exits())
            self._touched.add(wid)

    def _take_kv(self, wid: int, worker: EngineWorker) -> None:
        if worker.kv_events:
            self._kv.append(_new(KvUpdate, (self.pool_of[wid], _UP_KV, wid, worker.take_kv_events())))

    def _check_drain(self, wid: int, t: float, phase: int, sid: int) -> None:
        w = self.workers[wid]
        if w.busy or w.has_work or self._held_by[wid] or self._pending_for[wid]:
            return
        self._draining.discard(wid)
        self._emit(t, phase, sid, _DRAINED, wid)

    # -- the worker-local event loop ----------------------------------------------------------
    def _schedule_end(self, wid: int, end: float) -> None:
        v = self._version[wid] + 1
        self._version[wid] = v
        heapq.heappush(self._ends, (end, wid, v))

    def _pass_end(self, wid: int, t: float) -> None:
        worker = self.workers[wid]
        pool = self.pools[self.pool_of[wid]]
        inputs = self._inputs_of[wid]
        completed = worker.finish(t, inputs[0] if inputs else None, self._hint, self._hint_bounds)
        if worker.busy:  # a run went on
            self._schedule_end(wid, worker.pass_end_ms)
        if pool.track_first_tokens:
            for req in worker.take_first_tokens():
                self._emit(t, _PASS_END, wid, _FIRST_TOKEN, req.index)
        if completed:
            self._emit_terminals(wid, completed)
        if pool.reserves:  # (completions freed blocks; SGLang tries a reservation every round)
            for transfer in worker.retry_destinations(t, bool(completed)):  # (transfer id, tokens)
                self._emit(t, _PASS_END, wid, _RESERVED, list(transfer))
                self._handed_off = True  # (the coordinator starts the transfer at once)
        if pool.hands_off:
            encode = self._encode
            for req in worker.take_handoffs():
                self._held[req.index] = (wid, req)
                self._held_by[wid] += 1
                self._emit(t, _PASS_END, wid, _HANDOFF, encode(req))
                self._handed_off = True
        if worker.kv_events:
            self._take_kv(wid, worker)
        if not worker.busy:  # (a run that went on has nothing to start)
            self._dirty.add(wid)
        self._touched.add(wid)
        if wid in self._draining:
            self._check_drain(wid, t, _PASS_END, wid)

    def _apply_input(self, item) -> None:
        t, phase, sid, op, wid, payload, rank, transferred = item  # HostInput (as an exact tuple)
        self._pending_for[wid] -= 1
        heapq.heappop(self._inputs_of[wid])
        self._touched.add(wid)
        worker = self.workers[wid]
        if op == _ENQUEUE:
            req = self._decode(payload, self.source)
            if transferred:  # the prompt's KV arrived: admitted as computed (after the source let go)
                req.materialized = True
                req.num_computed = 0
                req.status = WAITING
            new_end = worker.enqueue(req, rank, t)
            self._take_exits(wid, worker)
            if new_end is not None:
                self._schedule_end(wid, new_end)
                self._take_kv(wid, worker)
            if not worker.busy:
                self._dirty.add(wid)
        else:  # Op.RELEASE: the transfer of a handed-off request completed
            src, req = self._held.pop(payload)
            worker.release_source(req, t)
            self._held_by[src] -= 1
            self._dirty.add(src)
            self._touched.add(src)
        if wid in self._draining:
            self._check_drain(wid, t, phase, sid)

    def _inputs_at(self, t: float) -> None:
        pending = self._pending
        while pending and pending[0][0] <= t:
            item = heapq.heappop(pending)
            if item[0] < t:  # pragma: no cover - a coordinator bug
                raise AssertionError(f"input at {item[0]} ms delivered after the host reached {t} ms")
            self._apply_input(item)

    def _settle(self, t: float) -> None:
        dirty = sorted(self._dirty)
        self._dirty.clear()
        self._touched.update(dirty)
        inputs_of = self._inputs_of
        for wid in dirty:
            inputs = inputs_of[wid]
            end, rejected = self.workers[wid].start_if_idle(t, inputs[0] if inputs else None, self._hint,
                                                            self._hint_bounds)
            if end is not None:
                self._schedule_end(wid, end)
            for req in rejected:
                self._emit(t, _SETTLE, wid, _TERMINAL, self._encode(req))

    def _ends_at(self, t: float) -> None:
        ends = self._ends
        version = self._version
        while ends and ends[0][0] <= t:
            end, wid, v = heapq.heappop(ends)
            if v == version[wid]:
                self._pass_end(wid, end)

    def _next_end(self) -> float | None:
        ends = self._ends
        version = self._version
        while ends and ends[0][2] != version[ends[0][1]]:
            heapq.heappop(ends)  # superseded by a cut-short run
        return ends[0][0] if ends else None

    # -- messages in ----------------------------------------------------------------------
    def _receive(self, control, inputs) -> None:
        if control:
            self._control(control)
        for item in inputs:
            item = tuple(item)  # an exact tuple (a HostInput, or its list form over msgpack): the heap
            # compares it and _apply_input unpacks it, both faster on an exact tuple
            heapq.heappush(self._pending, item)
            self._pending_for[item[4]] += 1
            heapq.heappush(self._inputs_of[item[4]], item[0])
            self._touched.add(item[4])

    def _sync(self, wid: int, worker: EngineWorker, t: float, blocks_only: bool = False) -> None:
        worker.sync(t, blocks_only)
        if worker.has_tiers:
            worker.publish_tiers(t)
        if worker.kv_events:
            self._take_kv(wid, worker)
        if worker.exits:
            self._take_exits(wid, worker)

    def _sync_all(self, t: float) -> None:
        for wid, worker in self.workers.items():
            self._sync(wid, worker, t)

    def _publish(self, t: float, watch: bytes | None = None) -> None:
        """Bring up to ``t`` the workers that publish KV events (a router reads them next) and
        those with a completion inside their run by ``t``: only workers in a pass or run can
        have either (or with KV tiers, whose transfers go on while idle), so the cost is
        proportional to the busy workers, not to all. ``watch``: the hashes (bytes of uint64)
        of the prompts routed at ``t``, when nothing else is: a worker whose KV events up to
        ``t`` cannot change what the router reads of them is brought up later
        (``EngineWorker.router_unchanged``)."""
        workers = self.workers
        version = self._version
        due = {wid for _, wid, v in self._ends if v == version[wid]}  # (one live end per busy worker)
        due.update(self._tiered)
        watched = None if watch is None else _Watch(watch)
        for wid in sorted(due):
            worker = workers[wid]
            if worker.exit_due(t) or worker.records_kv_events and (
                    watched is None or not worker.router_unchanged(t, watched)):
                self._sync(wid, worker, t, blocks_only=True)  # (what a router reads)

    def _status(self, wid: int) -> WorkerStatus:
        w = self.workers[wid]
        return WorkerStatus(wid, w.busy, w.has_work, w.next_event_ms, self._held_by[wid], self._pending_for[wid])

    def _output(self, reached: float | None, with_fpm: bool = False) -> HostOutput:
        """Events and KV events since the last report, and the status (busy, has_work, pass
        end, held, pending) of every worker whose status may have changed."""
        status = []
        workers = self.workers
        for wid in sorted(self._touched):
            w = workers[wid]
            status.append(_new(WorkerStatus, (wid, w.busy, w.has_work, w.next_event_ms, self._held_by[wid],
                                       self._pending_for[wid])))
        self._touched.clear()
        if self._unsorted:
            self._events.sort(key=_EVENT_ORDER)
            self._unsorted = False
        self._last = (float("-inf"), 0, 0)
        fpm = [(wid, w.forward_pass_metrics()) for wid, w in workers.items()] if with_fpm else None
        out = HostOutput(self._events, self._kv, status, reached, fpm)
        self._events = []
        self._kv = []
        return out

    def _catch_up(self, start: float) -> None:
        """The coordinator skips calling a host with nothing to do; it joins at ``start``."""
        if start > self.now:
            if self._next_end() is not None or (self._pending and self._pending[0][0] < start):
                raise AssertionError(f"host skipped from {self.now} ms to {start} ms with work due")  # pragma: no cover
            self.now = start

    def step(self, control, inputs, start: float, until: float, stop_at_handoff: bool = False,
             watch: bytes | None = None) -> HostOutput:
        """From the edge ``start``: apply the inputs then, start passes, run to ``until`` (see the
        module doc). ``stop_at_handoff``: end the step early, after the pass ends of the first
        instant at which a worker hands a request off (the coordinator places it then, as if that
        instant were ``until``). The output's ``reached`` is where the step ended. ``watch``: the
        blocks the router reads at ``until``, when known (``_publish``)."""
        self._catch_up(start)
        self._handed_off = False
        # no input is sent before the step's end, unless the step may stop early at a handoff
        # (whose request the coordinator then places at once): runs without a known next input
        # compute their pass end times up to it, else no further than about it (a hint only: it
        # changes no result)
        self._hint = until if until < INF else None
        self._hint_bounds = not stop_at_handoff
        if (watch is not None) != self._watched:  # (the coordinator's mode; its run-out comes without)
            self._watched = watch is not None
            for worker in self.workers.values():
                worker.edges_watched = self._watched
        self._receive(control, inputs)
        t = self.now
        self._inputs_at(t)
        self._ends_at(t)  # a run cut short by an input at t ends now
        self._settle(t)
        pending = self._pending
        ends = self._ends
        version = self._version
        while True:
            while ends and ends[0][2] != version[ends[0][1]]:
                heapq.heappop(ends)  # superseded by a cut-short run
            t_end = ends[0][0] if ends else None
            t_in = pending[0][0] if pending else None
            t_next = t_end if t_in is None or (t_end is not None and t_end <= t_in) else t_in
            if t_next is None or t_next > until:
                break
            t = t_next
            if t_end == t:
                self._ends_at(t)
                if stop_at_handoff and self._handed_off:
                    until = t
                    break
            if t == until:
                break
            if t_in is not None and t_in <= t:
                self._inputs_at(t)
                self._ends_at(t)  # a run cut short by an input at t ends now
            if self._dirty:
                self._settle(t)
        self.now = until
        self._publish(until, watch)
        return self._output(until)

    def deliver(self, control, inputs, now: float, with_fpm: bool = True) -> HostOutput:
        """Apply the inputs at the edge ``now`` without starting passes (the Planner's tick sees
        them queued) and report forward-pass metrics."""
        self._catch_up(now)
        self._receive(control, inputs)
        self._inputs_at(self.now)
        self._sync_all(self.now)
        return self._output(None, with_fpm)

    def reserve(self, queries) -> tuple[list[int | None], list]:
        """Each ``ReserveQuery``'s destination reserves its blocks now if it can (else it waits
        and a RESERVED event says when it could); returns the answers (the prompt tokens to
        transfer, None: it waits) and the statuses of the workers asked (a planned run may have
        been cut so that completions are retried)."""
        out = []
        decode = self._decode
        asked = []
        for wid, rank, payload, transfer in queries:
            worker = self.workers[wid]
            ok, new_end = worker.reserve_destination(decode(payload, self.source), rank, transfer, self.now)
            if new_end is not None:
                self._schedule_end(wid, new_end)
            asked.append(wid)
            out.append(ok)
        return out, [self._status(wid) for wid in sorted(set(asked))]

    def match_prefix(self, queries) -> list[int]:
        """Blocks each ``PrefixQuery`` (worker, rank, hashes, limit) would reuse now (destination_missing)."""
        out = []
        for wid, rank, hashes, limit in queries:
            worker = self.workers[wid]
            kv = worker.ranks[rank].kv
            if not kv.prefix_caching:
                out.append(0)
                continue
            self._sync(wid, worker, self.now)
            out.append(kv.match_prefix(hash_view(hashes), limit)[0])  # (bytes over msgpack)
        return out

    def kv_contents(self, wids) -> list:
        """(worker, per rank its resident blocks, next eviction first) for each of ``wids`` it hosts,
        as of now (a retune warm start)."""
        out = []
        for wid in wids:
            worker = self.workers.get(wid)
            if worker is None:
                continue
            self._sync(wid, worker, self.now)
            out.append((wid, [rank.kv.contents() for rank in worker.ranks]))
        return out

    def in_flight(self, _=None) -> list:
        """``(arrival_ms, first_token_ms, first_admit_ms)`` of every request its workers hold, as of
        now (a checkpoint monitor's lower bounds: ``simulator.checkpoints``)."""
        out = []
        for wid in sorted(self.workers):
            worker = self.workers[wid]
            self._sync(wid, worker, self.now)
            for rank in worker.ranks:
                for req in (*rank.running, *rank.waiting):
                    out.append((req.arrival_ms, req.first_token_ms, req.first_admit_ms))
        return out

    def finish(self, end_ms: float) -> HostFinish:
        """End of the run: requests still in the workers (incomplete), then the totals."""
        leftover = []
        for wid in sorted(self.workers):
            worker = self.workers[wid]
            if worker.busy:
                worker.sync(end_ms)
                if worker.exits:  # pragma: no cover - the last step brought every worker up to the end
                    raise AssertionError("completions inside a run were not reported before the end")
            reqs = [self._encode(r) for rank in worker.ranks for r in list(rank.running) + list(rank.waiting)
                    + rank.handoffs + (list(rank.offload.loading) if rank.offload is not None else [])]
            leftover.append((wid, reqs))
        totals = []
        for wid in sorted(self.workers):
            w = self.workers[wid]
            g = w.gaps
            if not self.direct:
                g = g.to_wire()
            offload = None
            if w.ranks[0].offload is not None:  # (the transfers still in flight end: complete counters)
                for r in w.ranks:
                    r.offload.advance(INF)
                offload = [r.offload.report() for r in w.ranks]
            totals.append(WorkerTotals(wid, sum(r.committed_prefill_tokens for r in w.ranks),
                                       sum(r.num_generated_tokens for r in w.ranks),
                                       sum(r.num_preemptions for r in w.ranks), w.num_passes, w.num_runs, g, offload))
        # per worker (by id): its recorded timeline as plain data (``WorkerTimeline.from_plain``),
        # None when not recorded; the columns are bytes, or the arrays themselves for a direct host
        timelines = [self.workers[wid].export_timeline(self.pool_of[wid], end_ms, as_bytes=not self.direct)
                     for wid in sorted(self.workers)]
        return HostFinish(leftover, totals, timelines)
