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

from typing import Callable

from actors.engine.request import WAITING, Request
from actors.engine.worker import EngineWorker
from actors.messages import Capabilities, Fpm, RoleState, Snapshot, TrafficWindow
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
    worker_ids: list[int]  # every worker the pool ever had, ascending
    router: object
    block_size: int
    eligible: list[int] = field(default_factory=list)  # ready and not draining, ascending
    caps: Capabilities | None = None  # what one rank holds (for the Planner)
    gpus_per_worker: int = 1
    startup_ms: float = 0.0  # delay before a worker added during the run is ready
    spawn: Callable[[int], EngineWorker] | None = None  # builds a new worker with the given id

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
        n = self.arrivals
        w = TrafficWindow(
            duration_s=(now_ms - self.start_ms) / 1000.0,
            num_req=n,
            avg_isl=self.isl / n if n else 0.0,
            avg_osl=self.osl / n if n else 0.0,
            avg_ttft_ms=self.ttft / self.completed if self.completed else None,
            avg_itl_ms=self.itl / self.itl_n if self.itl_n else None,
            avg_kv_hit_rate=self.reused / self.inputs if self.inputs else 0.0,
        )
        self.reset(now_ms)
        return w


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
        planner=None,
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
        # lifecycle (the Planner adds and removes workers)
        self.planner = planner
        self._state = ["active"] * len(workers)  # starting | active | draining | removed
        self._provisioned = [[0.0, None] for _ in workers]  # [since, until]
        self.lifecycle_operations: list[dict] = []
        self._traffic = TrafficAccumulator()
        self._ptr = 0
        self._n_init = 0
        self.planner_hook = lambda entering: None  # the runtime may time the Planner's ticks
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
            for req in worker.take_handoffs():
                self._handoff(req, wid, now_ms)
        self._forward_kv_events(wid)
        self._dirty.add(wid)
        if self._state[wid] == "draining":
            self._settle_drain(wid, now_ms)

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
        if self._state[src] == "draining":
            self._settle_drain(src, now_ms)
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
    def _pools(self) -> list[Pool]:
        return [p for p in (self.entry, self.decode) if p is not None]

    def _work_remains(self) -> bool:
        if self._ptr < self._n_init or self._transfers:
            return True
        if any(ev[1] != PH_PLANNER for ev in self._heap):
            return True
        return any(w.busy or w.has_work for w in self.workers)

    def _snapshot(self, now_ms: float) -> Snapshot:
        roles = {}
        for pool in self._pools():
            self._sync_pool(pool, now_ms)
            by_state = {"active": [], "starting": [], "draining": []}
            for wid in pool.worker_ids:
                st = self._state[wid]
                if st in by_state:
                    by_state[st].append(wid)
            fpms = []
            for wid in by_state["active"]:
                for rank, ordinal, last, q in self.workers[wid].forward_pass_metrics():
                    if last is None:
                        continue  # never ran a pass: no metrics yet
                    wall, n_p, t_p, kv_p, var_p, n_d, kv_d, var_d = last
                    fpms.append(Fpm(wid, rank, ordinal, wall / 1000.0, n_p, t_p, kv_p, var_p, n_d, kv_d, var_d, *q))
            roles[pool.planner_role] = RoleState(by_state["active"], by_state["starting"], by_state["draining"], fpms,
                                                 pool.caps)
        traffic = self._traffic.take(now_ms) if self.planner.needs_traffic(now_ms) else None
        return Snapshot(now_ms, roles, traffic)

    def _planner_tick(self, now_ms: float) -> None:
        if not self._work_remains():
            return  # ticks continue only while work remains
        self.planner_hook(True)
        snap = self._snapshot(now_ms)
        decision = self.planner.on_tick(snap)
        self.planner_hook(False)
        tick = self.planner.total_ticks - 1
        for pool, target in ((self.entry if self.decode else None, decision.target_prefill),
                             (self.decode or self.entry, decision.target_decode)):
            if pool is not None and target is not None:
                self._scale(pool, target, now_ms, tick)
        if decision.next_tick_ms is not None:
            heapq.heappush(self._heap, (decision.next_tick_ms, PH_PLANNER, 0, 0))

    def _counts(self, pool: Pool) -> dict:
        out = {"active": 0, "starting": 0, "draining": 0}
        for wid in pool.worker_ids:
            st = self._state[wid]
            if st in out:
                out[st] += 1
        return out

    def _record(self, pool: Pool, now_ms: float, cause: str, transitions: list[dict], tick: int | None) -> None:
        self.lifecycle_operations.append({
            "operation_ordinal": len(self.lifecycle_operations),
            "at_ms": now_ms,
            "pool": pool.planner_role if self.decode is not None else "decode",
            "cause": cause,
            "planner_tick_ordinal": tick,
            "transitions": transitions,
            "state_after_batch": self._counts(pool),
            "topology_released_request_uuids": [],
        })

    def _scale(self, pool: Pool, target: int, now_ms: float, tick: int) -> None:
        starting = [w for w in pool.worker_ids if self._state[w] == "starting"]
        active = [w for w in pool.worker_ids if self._state[w] == "active"]
        current = len(starting) + len(active)
        transitions: list[dict] = []
        if target > current:
            for _ in range(target - current):
                transitions.append(self._add_worker(pool, now_ms))
        elif target < current:
            drop = current - target
            for wid in sorted(starting, reverse=True)[:drop]:  # cancel pending startups first
                self._state[wid] = "removed"
                self._provisioned[wid][1] = now_ms
                transitions.append({"worker_id": wid, "transition": "worker_start_canceled", "prior_state": "starting",
                                    "state": "removed"})
                drop -= 1
            for wid in sorted(active, reverse=True)[:drop]:  # then drain the highest ids
                self._state[wid] = "draining"
                pool.eligible.remove(wid)
                transitions.append({"worker_id": wid, "transition": "worker_draining", "prior_state": "active",
                                    "state": "draining"})
        if transitions:
            self._record(pool, now_ms, "planner_scale", transitions, tick)
            for t in transitions:
                if t["transition"] == "worker_draining":
                    self._settle_drain(t["worker_id"], now_ms)

    def _add_worker(self, pool: Pool, now_ms: float) -> dict:
        wid = len(self.workers)
        worker = pool.spawn(wid)
        self.workers.append(worker)
        self._versions.append(0)
        self._ranks_of.append(len(worker.ranks))
        self._pool_of.append(pool)
        self._provisioned.append([now_ms, None])
        pool.worker_ids.append(wid)
        if pool.router.tracks_first_tokens and pool.role == "aggregated":
            for rank in worker.ranks:
                rank.first_tokens = []
        if pool.startup_ms > 0:
            self._state.append("starting")
            heapq.heappush(self._heap, (now_ms + pool.startup_ms, PH_WORKER_READY, wid, 0))
            return {"worker_id": wid, "transition": "worker_starting", "prior_state": None, "state": "starting"}
        self._state.append("active")
        pool.eligible.append(wid)
        return {"worker_id": wid, "transition": "worker_ready", "prior_state": None, "state": "active"}

    def _worker_ready(self, wid: int, now_ms: float) -> None:
        if self._state[wid] != "starting":
            return  # its start was canceled
        pool = self._pool_of[wid]
        self._state[wid] = "active"
        pool.eligible.append(wid)
        pool.eligible.sort()
        self._record(pool, now_ms, "worker_ready_event",
                     [{"worker_id": wid, "transition": "worker_ready", "prior_state": "starting", "state": "active"}], None)

    def _settle_drain(self, wid: int, now_ms: float) -> None:
        """A draining worker leaves once it has finished all its work (and its KV is handed off)."""
        w = self.workers[wid]
        if w.busy or w.has_work or any(src == wid for _, src, _, _ in self._transfers.values()):
            return
        self._state[wid] = "removed"
        self._provisioned[wid][1] = now_ms
        self._record(self._pool_of[wid], now_ms, "drain_settlement",
                     [{"worker_id": wid, "transition": "worker_removed", "prior_state": "draining", "state": "removed"}],
                     None)

    def worker_seconds(self, until_ms: float) -> dict[str, float]:
        """Provisioned worker time per pool role up to ``until_ms`` (starting and draining count)."""
        out: dict[str, float] = {}
        for wid, (since, until) in enumerate(self._provisioned):
            end = min(until if until is not None else until_ms, until_ms)
            role = self._pool_of[wid].role
            out[role] = out.get(role, 0.0) + max(0.0, end - since) / 1000.0
        return out
