"""The virtual clock: one event heap that drives every actor and owns time.

Events are keyed ``(time_ms, phase, stable_id)``. Same-time order is one written policy:

    pass completion -> handoff placement -> worker ready -> transfer completion
    -> arrivals/admission -> telemetry -> planner tick

ties inside a phase broken by stable identity (worker id, handoff ordinal, request index),
never by insertion order. A prompt finished on a prefill worker is placed on a decode worker
only after every pass ending at that time has ended, so placement sees the decode pool as
of that time whatever the worker ids. After every event at a time has settled, each idle worker with
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

from typing import Callable

from actors.engine.request import WAITING, Request
from actors.engine.worker import EngineWorker
from actors.messages import Capabilities, Fpm, RoleState, Snapshot, TrafficWindow
from simulator.lifecycle import ACTIVE, DRAINING, STARTING, Lifecycle
from simulator.metrics.collector import STATUS_INCOMPLETE, RequestLog
from simulator.traffic.arrivals import ArrivalProcess
from simulator.traffic.workload import BlockHashStore, Workload

PH_PASS_END = 0
PH_HANDOFF = 1
PH_WORKER_READY = 2
PH_TRANSFER = 3
PH_ARRIVAL = 4
PH_TELEMETRY = 5
PH_PLANNER = 6


@dataclass
class Pool:
    """Workers of one role behind one router."""

    role: str  # aggregated | prefill | decode
    worker_ids: list[int]  # every worker the pool ever had, ascending
    router: object
    block_size: int
    eligible: list[int] = field(default_factory=list)  # ready and not draining, ascending
    caps: Capabilities | None = None  # what one rank holds (for the Planner)
    gpus_per_worker: int = 1
    startup_ms: float = 0.0  # delay before a worker added during the run is ready
    spawn: Callable[[int], EngineWorker] | None = None  # builds a new worker with the given id
    num_ranks: int = 1  # attention-data ranks per worker

    def __post_init__(self) -> None:
        if not self.eligible:
            self.eligible = list(self.worker_ids)

    @property
    def label(self) -> str:
        return "agg" if self.role == "aggregated" else self.role

    @property
    def planner_role(self) -> str:
        return "prefill" if self.role == "prefill" else "decode"


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


class TrafficAccumulator:
    """The traffic window the Planner's throughput loop reads: arrivals (count, ISL, requested
    OSL) and completions (TTFT, ITL, prefix-cache hit rate) since the window last closed."""

    def __init__(self, start_ms: float = 0.0) -> None:
        self.reset(start_ms)

    def reset(self, now_ms: float) -> None:
        self.start_ms = now_ms
        self.arrivals = 0
        self.isl = 0
        self.osl = 0
        self.completed = 0
        self.ttft = 0.0
        self.itl = 0.0
        self.itl_n = 0
        self.reused = 0
        self.inputs = 0

    def arrive(self, req: Request) -> None:
        self.arrivals += 1
        self.isl += req.prompt_len
        self.osl += req.max_output

    def complete(self, req: Request) -> None:
        if req.first_token_ms is None:
            return
        self.completed += 1
        self.ttft += req.first_token_ms - req.arrival_ms
        if req.num_generated >= 2:
            self.itl += (req.last_token_ms - req.first_token_ms) / (req.num_generated - 1)
            self.itl_n += 1
        first = [r for _, r, pool in req.admissions if pool != "decode"]
        if first:
            self.reused += first[0]
            self.inputs += req.prompt_len

    def take(self, now_ms: float) -> TrafficWindow:
        w = self.peek(now_ms)
        self.reset(now_ms)
        return w

    def peek(self, now_ms: float) -> TrafficWindow:
        """The window so far (it stays open)."""
        n = self.arrivals
        return TrafficWindow(
            duration_s=(now_ms - self.start_ms) / 1000.0,
            num_req=n,
            avg_isl=self.isl / n if n else 0.0,
            avg_osl=self.osl / n if n else 0.0,
            avg_ttft_ms=self.ttft / self.completed if self.completed else None,
            avg_itl_ms=self.itl / self.itl_n if self.itl_n else None,
            avg_kv_hit_rate=self.reused / self.inputs if self.inputs else 0.0,
        )


@dataclass
class CoordinatorStats:
    num_events: int = 0
    num_transfers: int = 0
    last_event_ms: float = 0.0
    stopped_at_ms: float | None = None


def routing_entry(pool_label: str, now_ms: float, info: dict | None) -> dict:
    """One routing decision as the per-request record shows it."""
    entry = {"pool": pool_label, "outcome": "immediate", "queue_entered_at_ms": None, "queue_wait_ms": 0.0,
             "released_at_ms": now_ms, "selected_overlap_blocks": None, "best_available_overlap_blocks": None,
             "overlap_regret_blocks": None, "reported_overlap_tokens": None}
    if info:
        entry.update({k: v for k, v in info.items() if k in entry})
    return entry


def handoff_record(src: int, src_rank: int, held_ms: float, reserved_ms: float, dst: int, tokens: int,
                   delay_ms: float) -> dict:
    return {"prefill_worker": src, "prefill_rank": src_rank, "source_held_ms": held_ms,
            "destination_reserved_ms": reserved_ms, "decode_worker": dst, "transfer_tokens": tokens,
            "transfer_ms": delay_ms}


class PoolCoordinator:
    """What both coordinators share: the pools, the lifecycle books, and carrying out the
    Planner's decisions (add workers, cancel startups, drain, settle drains)."""

    def _init_run(self, workload: Workload, hash_store: BlockHashStore, arrivals: ArrivalProcess, log: RequestLog,
                  transfer: KvTransferModel | None, stop_ms: float | None, resource_guard) -> None:
        self.workload = workload
        self.hash_store = hash_store
        self.arrivals = arrivals
        self.transfer = transfer or KvTransferModel()
        self.log = log
        self.stop_ms = stop_ms
        self.resource_guard = resource_guard
        self.stats = CoordinatorStats()
        self.num_offered = 0

    def _init_pools(self, num_workers: int, entry: Pool, decode: Pool | None, planner) -> None:
        self.entry = entry
        self.decode = decode
        self.planner = planner
        self._pool_of: list[Pool] = [entry] * num_workers
        if decode is not None:
            for wid in decode.worker_ids:
                self._pool_of[wid] = decode
        self.lifecycle = Lifecycle(num_workers, [p.role for p in self._pool_of])
        self._traffic = TrafficAccumulator()
        self.planner_hook = lambda entering: None  # the runtime may time the Planner's ticks

    @property
    def lifecycle_operations(self) -> list[dict]:
        return self.lifecycle.operations

    def worker_seconds(self, until_ms: float) -> dict[str, float]:
        return self.lifecycle.worker_seconds(until_ms)

    def _pools(self) -> list[Pool]:
        return [p for p in (self.entry, self.decode) if p is not None]

    # hooks of the runtime
    def _spawn(self, pool: Pool, wid: int) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _drain_blocked(self, wid: int) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def _on_ready(self, wid: int, now_ms: float) -> None:
        """A worker added with a startup delay becomes ready at ``now_ms + startup_ms``."""
        raise NotImplementedError  # pragma: no cover

    def _record(self, pool: Pool, now_ms: float, cause: str, transitions: list[dict], tick: int | None) -> None:
        self.lifecycle.record(pool.planner_role, pool.worker_ids, now_ms, cause, transitions, tick)

    def _apply_decision(self, decision, now_ms: float, tick: int) -> None:
        for pool, target in ((self.entry if self.decode else None, decision.target_prefill),
                             (self.decode or self.entry, decision.target_decode)):
            if pool is not None and target is not None:
                self._scale(pool, target, now_ms, tick)

    def _scale(self, pool: Pool, target: int, now_ms: float, tick: int) -> None:
        counts = self.lifecycle.counts(pool.worker_ids)
        current = counts[STARTING] + counts[ACTIVE]
        transitions: list[dict] = []
        if target > current:
            for _ in range(target - current):
                transitions.append(self._add_worker(pool, now_ms))
        elif target < current:
            transitions = self.lifecycle.scale_down(pool.worker_ids, current - target, now_ms)
            for t in transitions:
                if t["state"] == DRAINING:
                    pool.eligible.remove(t["worker_id"])
        if transitions:
            self._record(pool, now_ms, "planner_scale", transitions, tick)
            for t in transitions:
                if t["state"] == DRAINING:
                    self._settle_drain(t["worker_id"], now_ms)

    def _add_worker(self, pool: Pool, now_ms: float) -> dict:
        starting = pool.startup_ms > 0
        wid = self.lifecycle.add(pool.role, now_ms, starting)
        self._pool_of.append(pool)
        pool.worker_ids.append(wid)
        self._spawn(pool, wid)
        if starting:
            self._on_ready(wid, now_ms + pool.startup_ms)
        else:
            pool.eligible.append(wid)
        return Lifecycle.added(wid, starting)

    def _worker_ready(self, wid: int, now_ms: float) -> None:
        t = self.lifecycle.ready(wid)
        if t is None:
            return  # its start was canceled
        pool = self._pool_of[wid]
        pool.eligible.append(wid)
        pool.eligible.sort()
        self._record(pool, now_ms, "worker_ready_event", [t], None)

    def _drain_later(self, wid: int) -> None:
        """A draining worker could not leave yet (the runtime watches it)."""

    def _settle_drain(self, wid: int, now_ms: float) -> None:
        """A draining worker leaves once it has finished all its work and no KV transfer
        from or to it is in flight."""
        if self._drain_blocked(wid):
            self._drain_later(wid)
            return
        self._record(self._pool_of[wid], now_ms, "drain_settlement", [self.lifecycle.remove(wid, now_ms)], None)


class Coordinator(PoolCoordinator):
    """Runs one replay in process, in exact lockstep: arrivals -> routers -> workers
    (-> transfers -> decode workers)."""

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
        planner=None,
    ) -> None:
        self._init_run(workload, hash_store, arrivals, log, transfer, stop_ms, resource_guard)
        self.workers = workers
        self._versions = [0] * len(workers)
        self._heap: list = []
        self._dirty: set[int] = set()
        self._ranks_of = [len(w.ranks) for w in workers]
        self._init_pools(len(workers), entry, decode, planner)
        self._transfers: dict[int, tuple[Request, int, int, int]] = {}
        self._next_transfer = 0
        self._handoffs: dict[int, tuple[Request, int]] = {}
        self._next_handoff = 0
        self._ptr = 0
        self._n_init = 0
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
        if self.log.capture:
            req.routing.append(routing_entry(pool.label, now_ms, info))
        return wid, rank

    # -- event handlers -------------------------------------------------------------------
    def _make_request(self, index: int, now_ms: float) -> Request:
        return make_request(self.workload, self.hash_store, index, now_ms)

    def _arrive(self, index: int, now_ms: float) -> None:
        req = self._make_request(index, now_ms)
        self.num_offered += 1
        if self.planner is not None:
            self._traffic.arrive(req)
        wid, rank = self._route(self.entry, req, now_ms)
        req.dispatched_ms = now_ms
        self._enqueue(req, wid, rank, now_ms)

    def _terminal(self, req: Request, now_ms: float) -> None:
        self.log.add(req)
        if self.planner is not None:
            self._traffic.complete(req)
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
            for req in worker.take_handoffs():  # placed once every pass ending now has ended
                seq = self._next_handoff
                self._next_handoff += 1
                self._handoffs[seq] = (req, wid)
                heapq.heappush(self._heap, (now_ms, PH_HANDOFF, seq, 0))
        self._forward_kv_events(wid)
        self._dirty.add(wid)
        if self.lifecycle.state[wid] == DRAINING:
            self._settle_drain(wid, now_ms)

    def _handoff(self, seq: int, now_ms: float) -> None:
        """Prefill done on ``src``: place the request on a decode worker and start its KV transfer."""
        req, src = self._handoffs.pop(seq)
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
        req.handoff = handoff_record(src, req.rank, now_ms, now_ms, wid, tokens, delay)
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
        if self.lifecycle.state[src] == DRAINING:
            self._settle_drain(src, now_ms)

    def _settle(self, now_ms: float) -> None:
        dirty = sorted(self._dirty)
        self._dirty.clear()
        for wid in dirty:
            end, rejected = self.workers[wid].start_if_idle(now_ms)
            if end is not None:
                self._schedule_end(wid, end)
            for req in rejected:
                self._pool_of[wid].router.on_release(req)
                self._terminal(req, now_ms)

    # -- main loop ------------------------------------------------------------------------
    def run(self) -> CoordinatorStats:
        times, indices = self.arrivals.initial()
        times = times.tolist()
        indices = indices.tolist()
        n_init = self._n_init = len(times)
        ptr = 0
        if self.planner is not None:
            heapq.heappush(self._heap, (self.planner.initial_tick_ms(), PH_PLANNER, 0, 0))
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
                self._ptr = ptr
                self._arrive(indices[ptr - 1], now)
                continue
            t, phase, sid, ver = heappop(heap)
            if phase == PH_PASS_END:
                if ver == versions[sid]:
                    self._pass_end(sid, now)
            elif phase == PH_ARRIVAL:
                self._arrive(sid, now)
            elif phase == PH_HANDOFF:
                self._handoff(sid, now)
            elif phase == PH_TRANSFER:
                self._transfer_done(sid, now)
            elif phase == PH_WORKER_READY:
                self._worker_ready(sid, now)
            elif phase == PH_PLANNER:
                self._planner_tick(now)
            else:  # pragma: no cover
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

    # -- the Planner and the worker lifecycle -------------------------------------------------
    def _spawn(self, pool: Pool, wid: int) -> None:
        worker = pool.spawn(wid)
        self.workers.append(worker)
        self._versions.append(0)
        self._ranks_of.append(len(worker.ranks))
        if pool.router.tracks_first_tokens and pool.role == "aggregated":
            for rank in worker.ranks:
                rank.first_tokens = []

    def _on_ready(self, wid: int, at_ms: float) -> None:
        heapq.heappush(self._heap, (at_ms, PH_WORKER_READY, wid, 0))

    def _drain_blocked(self, wid: int) -> bool:
        w = self.workers[wid]
        return (w.busy or w.has_work or any(src == wid for _, src in self._handoffs.values())
                or any(src == wid or dst == wid for _, src, dst, _ in self._transfers.values()))

    def _work_remains(self) -> bool:
        if self._ptr < self._n_init or self._transfers or self._handoffs:
            return True
        versions = self._versions
        for t, phase, sid, ver in self._heap:
            if phase != PH_PLANNER and (phase != PH_PASS_END or ver == versions[sid]):
                return True  # a live event (a superseded pass end is not work)
        return any(w.busy or w.has_work for w in self.workers)

    def _snapshot(self, now_ms: float) -> Snapshot:
        roles = {}
        for pool in self._pools():
            self._sync_pool(pool, now_ms)
            lc = self.lifecycle
            active = lc.in_state(pool.worker_ids, ACTIVE)
            fpms = [f for wid in active for f in fpms_of(wid, self.workers[wid].forward_pass_metrics())]
            roles[pool.planner_role] = RoleState(active, lc.in_state(pool.worker_ids, STARTING),
                                                 lc.in_state(pool.worker_ids, DRAINING), fpms, pool.caps)
        traffic = self._traffic.take(now_ms) if self.planner.needs_traffic(now_ms) else None
        return Snapshot(now_ms, roles, traffic)

    def _planner_tick(self, now_ms: float) -> None:
        if not self._work_remains():
            return  # ticks continue only while work remains
        self.planner_hook(True)
        snap = self._snapshot(now_ms)
        decision = self.planner.on_tick(snap)
        self.planner_hook(False)
        self._apply_decision(decision, now_ms, self.planner.total_ticks - 1)
        if decision.next_tick_ms is not None:
            heapq.heappush(self._heap, (decision.next_tick_ms, PH_PLANNER, 0, 0))


def make_request(workload: Workload, hash_store, index: int, now_ms: float) -> Request:
    w = workload
    return Request(
        index=index,
        source=hash_store,
        arrival_ms=now_ms,
        prompt_len=int(w.input_len[index]),
        max_output=int(w.output_len[index]),
        session_id=w.session_name(index),
        turn_index=int(w.turn_index[index]) if w.turn_index is not None else 0,
    )


def fpms_of(wid: int, metrics) -> list[Fpm]:
    """Forward-pass metrics (``EngineWorker.forward_pass_metrics()``, after sync) of the ranks
    of a worker that have run a pass."""
    out = []
    for rank, ordinal, last, q in metrics:
        if last is None:
            continue  # never ran a pass: no metrics yet
        wall, n_p, t_p, kv_p, var_p, n_d, kv_d, var_d = last
        out.append(Fpm(wid, rank, ordinal, wall / 1000.0, n_p, t_p, kv_p, var_p, n_d, kv_d, var_d, *q))
    return out
