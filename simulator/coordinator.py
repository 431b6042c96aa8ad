"""The virtual clock: one event heap that drives every actor and owns time.

Events are keyed ``(time_ms, phase, stable_id)``. Same-time order is one written policy:

    pass completion -> worker ready -> transfer completion -> arrivals/admission
    -> telemetry -> planner tick

ties inside a phase broken by stable identity (worker id, handoff ordinal, request index),
never by insertion order. After every event at a time has settled, each idle worker with
work starts its next pass, in ascending worker id. Model code never reads a wall clock; it
is handed ``now_ms``.

Topology: requests enter the *entry pool* (aggregated workers, or prefill workers when
disaggregated) through its router. A prefill worker hands a finished prompt to the *decode
pool*: a load-only router places it, the KV transfer takes ``tokens x bytes_per_token /
bandwidth``, and at transfer completion the decode worker admits it with its prompt already
computed (the source KV is released then).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from actors.engine.request import WAITING, Request
from actors.engine.worker import EngineWorker
from simulator.metrics.collector import STATUS_INCOMPLETE, RequestLog
from simulator.traffic.arrivals import ArrivalProcess
from simulator.traffic.workload import BlockHashStore, Workload

PH_PASS_END = 0
PH_WORKER_READY = 1
PH_TRANSFER = 2
PH_ARRIVAL = 3
PH_TELEMETRY = 4
PH_PLANNER = 5


@dataclass
class Pool:
    """Workers of one role behind one router."""

    role: str  # aggregated | prefill | decode
    worker_ids: list[int]
    router: object
    block_size: int
    eligible: list[int] = field(default_factory=list)  # ready and not draining, ascending

    def __post_init__(self) -> None:
        if not self.eligible:
            self.eligible = list(self.worker_ids)

    @property
    def label(self) -> str:
        return "agg" if self.role == "aggregated" else self.role


@dataclass(frozen=True)
class KvTransferModel:
    """delay_ms = tokens x bytes_per_token / (bandwidth_gb_per_second x 1e9) x 1000 (0 if unset)."""

    bandwidth_gb_per_second: float | None = None
    bytes_per_token: int | None = None
    timing_mode: str = "destination_missing"  # or full_prompt

    def delay_ms(self, tokens: int) -> float:
        if not self.bandwidth_gb_per_second or not self.bytes_per_token or tokens <= 0:
            return 0.0
        return tokens * self.bytes_per_token / (self.bandwidth_gb_per_second * 1e9) * 1000.0


@dataclass
class CoordinatorStats:
    num_events: int = 0
    num_settles: int = 0
    num_transfers: int = 0
    last_event_ms: float = 0.0
    stopped_at_ms: float | None = None


class Coordinator:
    """Runs one replay: arrivals -> routers -> workers (-> transfers -> decode workers)."""

    def __init__(
        self,
        workload: Workload,
        hash_store: BlockHashStore,
        arrivals: ArrivalProcess,
        workers: list[EngineWorker],
        entry: Pool,
        log: RequestLog,
        decode: Pool | None = None,
        transfer: KvTransferModel | None = None,
        stop_ms: float | None = None,
        resource_guard=None,
    ) -> None:
        self.workload = workload
        self.hash_store = hash_store
        self.arrivals = arrivals
        self.workers = workers
        self.entry = entry
        self.decode = decode
        self.transfer = transfer or KvTransferModel()
        self.log = log
        self.stop_ms = stop_ms
        self.resource_guard = resource_guard
        self.stats = CoordinatorStats()
        self.num_offered = 0
        self._versions = [0] * len(workers)
        self._heap: list = []
        self._dirty: set[int] = set()
        self._ranks_of = [len(w.ranks) for w in workers]
        self._pool_of: list[Pool] = [entry] * len(workers)
        if decode is not None:
            for wid in decode.worker_ids:
                self._pool_of[wid] = decode
        self._transfers: dict[int, tuple[Request, int, int, int]] = {}
        self._next_transfer = 0
        for pool in (entry, decode):
            if pool is not None and pool.router.tracks_first_tokens and pool.role == "aggregated":
                for wid in pool.worker_ids:
                    for rank in workers[wid].ranks:
                        rank.first_tokens = []

    # -- helpers --------------------------------------------------------------------------
    def _schedule_end(self, wid: int, end: float) -> None:
        self._versions[wid] += 1
        heapq.heappush(self._heap, (end, PH_PASS_END, wid, self._versions[wid]))

    def _forward_kv_events(self, wid: int) -> None:
        worker = self.workers[wid]
        if worker.kv_events:
            router = self._pool_of[wid].router
            for rank, kind, hashes in worker.take_kv_events():
                router.on_kv_events(wid, rank, kind, hashes)

    def _sync_pool(self, pool: Pool, now_ms: float) -> None:
        for wid in pool.worker_ids:
            w = self.workers[wid]
            w.sync(now_ms)
            self._forward_kv_events(wid)

    def _enqueue(self, req: Request, wid: int, rank: int, now_ms: float) -> None:
        worker = self.workers[wid]
        new_end = worker.enqueue(req, rank, now_ms)
        if new_end is not None:
            self._schedule_end(wid, new_end)
            self._forward_kv_events(wid)
        if not worker.busy:
            self._dirty.add(wid)

    def _route(self, pool: Pool, req: Request, now_ms: float) -> tuple[int, int]:
        router = pool.router
        if router.needs_worker_state:
            self._sync_pool(pool, now_ms)
        wid, rank, info = router.route(req, now_ms, pool.eligible, self._ranks_of)
        entry = {"pool": pool.label, "outcome": "immediate", "queue_entered_at_ms": None, "queue_wait_ms": 0.0,
                 "released_at_ms": now_ms, "selected_overlap_blocks": None, "best_available_overlap_blocks": None,
                 "overlap_regret_blocks": None, "reported_overlap_tokens": None}
        if info:
            entry.update({k: v for k, v in info.items() if k in entry})
        if self.log.capture:
            req.routing.append(entry)
        return wid, rank

    # -- event handlers -------------------------------------------------------------------
    def _make_request(self, index: int, now_ms: float) -> Request:
        w = self.workload
        req = Request(
            index=index,
            source=self.hash_store,
            arrival_ms=now_ms,
            prompt_len=int(w.input_len[index]),
            max_output=int(w.output_len[index]),
            session_id=w.session_name(index),
            turn_index=int(w.turn_index[index]) if w.turn_index is not None else 0,
        )
        return req

    def _arrive(self, index: int, now_ms: float) -> None:
        req = self._make_request(index, now_ms)
        self.num_offered += 1
        wid, rank = self._route(self.entry, req, now_ms)
        req.dispatched_ms = now_ms
        self._enqueue(req, wid, rank, now_ms)

    def _terminal(self, req: Request, now_ms: float) -> None:
        self.log.add(req)
        for t, idx in self.arrivals.on_terminal(req.index, now_ms):
            heapq.heappush(self._heap, (t, PH_ARRIVAL, idx, 0))

    def _pass_end(self, wid: int, now_ms: float) -> None:
        worker = self.workers[wid]
        pool = self._pool_of[wid]
        completed = worker.finish(now_ms)
        router = pool.router
        if router.tracks_first_tokens and pool.role == "aggregated":
            for req in worker.take_first_tokens():
                router.on_first_token(req)
        for req in completed:
            router.on_release(req)
            self._terminal(req, now_ms)
        if pool.role == "prefill":
            for req in worker.take_handoffs():
                self._handoff(req, wid, now_ms)
        self._forward_kv_events(wid)
        self._dirty.add(wid)

    def _handoff(self, req: Request, src: int, now_ms: float) -> None:
        """Prefill done on ``src``: place the request on a decode worker and start its KV transfer."""
        prefill_router = self.entry.router
        prefill_router.on_first_token(req)
        prefill_router.on_release(req)
        pool = self.decode
        wid, rank = self._route(pool, req, now_ms)
        dst = self.workers[wid]
        tokens = req.prompt_len
        if self.transfer.timing_mode == "destination_missing":
            kv = dst.ranks[rank].kv
            if kv.prefix_caching:
                dst.sync(now_ms)
                bs = kv.block_size
                # the blocks the decode worker will reuse at admission (never the whole prompt)
                hits, _ = kv.match_prefix(req.block_hashes(bs), (req.prompt_len - 1) // bs)
                tokens -= len(hits) * bs
        delay = self.transfer.delay_ms(tokens)
        req.handoff = {
            "prefill_worker": src,
            "prefill_rank": req.rank,
            "source_held_ms": now_ms,
            "destination_reserved_ms": now_ms,
            "decode_worker": wid,
            "transfer_tokens": tokens,
            "transfer_ms": delay,
        }
        seq = self._next_transfer
        self._next_transfer += 1
        self._transfers[seq] = (req, src, wid, rank)
        self.stats.num_transfers += 1
        heapq.heappush(self._heap, (now_ms + delay, PH_TRANSFER, seq, 0))

    def _transfer_done(self, seq: int, now_ms: float) -> None:
        req, src, wid, rank = self._transfers.pop(seq)
        self.workers[src].release_source(req)
        self._dirty.add(src)
        req.handoff["source_released_ms"] = now_ms
        req.handoff["destination_activated_ms"] = now_ms
        req.materialized = True
        req.num_computed = 0
        req.status = WAITING
        self._enqueue(req, wid, rank, now_ms)

    def _settle(self, now_ms: float) -> None:
        self.stats.num_settles += 1
        dirty = sorted(self._dirty)
        self._dirty.clear()
        for wid in dirty:
            worker = self.workers[wid]
            if worker.busy or not worker.has_work:
                continue
            end = worker.start(now_ms)
            if end is not None:
                self._schedule_end(wid, end)
            rejected = worker.take_rejected()
            if rejected:
                router = self._pool_of[wid].router
                for req in rejected:
                    router.on_release(req)
                    self._terminal(req, now_ms)

    # -- main loop ------------------------------------------------------------------------
    def run(self) -> CoordinatorStats:
        times, indices = self.arrivals.initial()
        times = times.tolist()
        indices = indices.tolist()
        n_init = len(times)
        ptr = 0
        heap = self._heap
        versions = self._versions
        stop = self.stop_ms
        now = times[0] if n_init else 0.0
        num_events = 0
        heappop = heapq.heappop
        guard = self.resource_guard
        while True:
            if ptr < n_init:
                ta = times[ptr]
                from_list = not heap or (ta, PH_ARRIVAL, indices[ptr]) < heap[0][:3]
                t_next = ta if from_list else heap[0][0]
            elif heap:
                from_list = False
                t_next = heap[0][0]
            else:
                t_next = None
            if t_next is None or t_next > now:
                if self._dirty:
                    self._settle(now)
                    continue
                if t_next is None:
                    break
                if stop is not None and t_next > stop:
                    self.stats.stopped_at_ms = stop
                    break
                now = t_next
            num_events += 1
            if guard is not None and not num_events & 8191:
                guard.check()
            if from_list:
                ptr += 1
                self._arrive(indices[ptr - 1], now)
                continue
            t, phase, sid, ver = heappop(heap)
            if phase == PH_PASS_END:
                if ver == versions[sid]:
                    self._pass_end(sid, now)
            elif phase == PH_ARRIVAL:
                self._arrive(sid, now)
            elif phase == PH_TRANSFER:
                self._transfer_done(sid, now)
            else:  # pragma: no cover - later phases arrive with the Planner
                raise AssertionError(f"unknown event phase {phase}")
        self.stats.num_events = num_events
        self.stats.last_event_ms = now
        self._close_incomplete()
        return self.stats

    def _close_incomplete(self) -> None:
        """Requests still queued, running, handed off or in transfer at the end are incomplete."""
        end = self.stats.stopped_at_ms if self.stats.stopped_at_ms is not None else self.stats.last_event_ms
        for worker in self.workers:
            if worker.busy:
                worker.sync(end)
            for rank in worker.ranks:
                for req in list(rank.running) + list(rank.waiting) + rank.handoffs:
                    self.log.add(req, STATUS_INCOMPLETE)
        for req, _, _, _ in self._transfers.values():
            self.log.add(req, STATUS_INCOMPLETE)
