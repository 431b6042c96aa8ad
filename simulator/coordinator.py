"""The virtual clock: one event heap that drives every actor and owns time.

Events are keyed ``(time_ms, phase, stable_id)``. Same-time order is one written policy:

    pass completion -> worker ready -> transfer completion -> arrivals/admission
    -> telemetry -> planner tick

ties inside a phase broken by stable identity (worker id, request index), never by insertion
order. After every event at a time has settled, each idle worker with work starts its next
pass, in ascending worker id. Model code never reads a wall clock; it is handed ``now_ms``.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from actors.engine.request import Request
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
class CoordinatorStats:
    num_events: int = 0
    num_settles: int = 0
    last_event_ms: float = 0.0
    stopped_at_ms: float | None = None


class Coordinator:
    """Runs one replay: arrivals -> router -> workers, until no work remains (or the stop time)."""

    def __init__(
        self,
        workload: Workload,
        hash_store: BlockHashStore,
        arrivals: ArrivalProcess,
        workers: list[EngineWorker],
        router,
        log: RequestLog,
        stop_ms: float | None = None,
        resource_guard=None,
    ) -> None:
        self.workload = workload
        self.hash_store = hash_store
        self.arrivals = arrivals
        self.workers = workers
        self.router = router
        self.log = log
        self.stop_ms = stop_ms
        self.resource_guard = resource_guard
        self.stats = CoordinatorStats()
        self.num_offered = 0
        self._versions = [0] * len(workers)
        self._heap: list = []
        self._dirty: set[int] = set()
        self._eligible = [w.worker_id for w in workers]
        self._ranks_of = [len(w.ranks) for w in workers]

    # -- event handlers -------------------------------------------------------------
    def _make_request(self, index: int, now_ms: float) -> Request:
        w = self.workload
        return Request(
            index=index,
            source=self.hash_store,
            arrival_ms=now_ms,
            prompt_len=int(w.input_len[index]),
            max_output=int(w.output_len[index]),
            session_id=w.session_name(index),
            turn_index=int(w.turn_index[index]) if w.turn_index is not None else 0,
        )

    def _arrive(self, index: int, now_ms: float) -> None:
        req = self._make_request(index, now_ms)
        self.num_offered += 1
        if self.router.needs_worker_state:
            for w in self.workers:
                w.sync(now_ms)
        wid, rank = self.router.route(req, now_ms, self._eligible, self._ranks_of)
        req.dispatched_ms = now_ms
        worker = self.workers[wid]
        new_end = worker.enqueue(req, rank, now_ms)
        if new_end is not None:
            self._versions[wid] += 1
            heapq.heappush(self._heap, (new_end, PH_PASS_END, wid, self._versions[wid]))
        if not worker.busy:
            self._dirty.add(wid)

    def _terminal(self, req: Request, now_ms: float) -> None:
        self.log.add(req)
        self.router.on_terminal(req)
        for t, idx in self.arrivals.on_terminal(req.index, now_ms):
            heapq.heappush(self._heap, (t, PH_ARRIVAL, idx, 0))

    def _pass_end(self, wid: int, now_ms: float) -> None:
        worker = self.workers[wid]
        for req in worker.finish(now_ms):
            self._terminal(req, now_ms)
        self._dirty.add(wid)

    def _settle(self, now_ms: float) -> None:
        self.stats.num_settles += 1
        dirty = sorted(self._dirty)
        self._dirty.clear()
        heap = self._heap
        for wid in dirty:
            worker = self.workers[wid]
            if worker.busy or not worker.has_work:
                continue
            end = worker.start(now_ms)
            if end is not None:
                self._versions[wid] += 1
                heapq.heappush(heap, (end, PH_PASS_END, wid, self._versions[wid]))
            for req in worker.take_rejected():
                self._terminal(req, now_ms)

    # -- main loop ------------------------------------------------------------------
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
            else:  # pragma: no cover - later phases arrive with the Planner and disaggregation
                raise AssertionError(f"unknown event phase {phase}")
        self.stats.num_events = num_events
        self.stats.last_event_ms = now
        self._close_incomplete()
        return self.stats

    def _close_incomplete(self) -> None:
        """Requests still queued or running at the end are reported incomplete."""
        for worker in self.workers:
            if worker.busy:
                worker.sync(self.stats.stopped_at_ms if self.stats.stopped_at_ms is not None else worker.pass_start_ms)
            for rank in worker.ranks:
                for req in list(rank.running) + list(rank.waiting):
                    self.log.add(req, STATUS_INCOMPLETE)
