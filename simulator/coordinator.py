"""The virtual clock: the one coordinator of a replay. It owns time and drives every actor
through a runtime.

The engine workers live in *hosts* (``actors.engine.host``), the routers in a router host
(``actors.router.host``) and the Planner in a planner host (``actors.planner.host``); a
runtime (``simulator.runtime``) keeps them in process, called directly (the default), or in
Ray actors, and carries the same messages (the NamedTuples of ``actors.protocol``) either way. The coordinator picks the
next *edge*, sends each host its timed inputs, and the hosts run their workers to the edge;
their events come back stamped ``(time, phase, id, seq)`` and are applied in that order.

Same-time order (one written policy: ``actors.protocol.Phase``, listed in docs/architecture.md):

    pass completion -> handoff placement -> worker ready -> transfer completion
    -> arrivals/admission -> planner tick -> settle (idle workers start passes)

ties inside a phase broken by stable identity (worker id, handoff ordinal, request index),
never by insertion order. After every event at a time has settled, each idle worker with work
starts its next pass, in ascending worker id (``WorkerHost``). A prompt finished on a prefill
worker is placed on a decode worker only after every pass ending at that time has ended; at
transfer completion the source releases its KV before the decode worker admits the prompt
as computed.

Edges with ``router_sync_ms = 0`` (exact lockstep):

- every instant something outside a worker must react: a Planner tick, a worker becoming
  ready, the stop time; every arrival when the router reads worker state (kv_router);
- when one worker's pass end can cause work elsewhere (closed loops and session turns, where a
  completion triggers an arrival), every pass end and every input time, each edge in two calls
  (start the passes, then advance to the earliest end);
- disaggregated, arrivals not following terminals: every arrival, and every handoff. With one
  host, the coordinator steps it to the next arrival (or fixed edge) and the host stops by itself
  after the pass ends of the first instant at which a prefill worker hands a request off (one
  call per edge); with several hosts another host may already be past that instant, so the
  edges are every prefill pass end and every transfer completion, in two calls as above. A
  decode worker's pass ends concern no one else either way.

Arrivals between edges are routed up front when the router ignores worker state (round
robin, random): nothing it reads can change before the next edge.

With a window ``W = router_sync_ms > 0`` the edges are the multiples of ``W`` (plus ticks,
ready times and the stop). The arrivals inside a window are routed at its start against the
router's view then, as a real router sees KV events and load late; everything the window's
passes trigger elsewhere (handoffs to decode, follow-up arrivals, rejections' follow-ups)
happens at the window's end. Windows in which nothing happens are skipped, and where no pass
end concerns anyone else (aggregated, arrivals not following terminals, no Planner or
monitor) so are windows without arrivals: the workers run across them in one step, which
changes no result.

Topology: requests enter the *entry pool* (aggregated workers, or prefill workers when
disaggregated) through its router. A prefill worker hands a finished prompt to the *decode
pool*: a load-only router places it, and the KV transfer takes ``tokens x bytes_per_token /
bandwidth``. Model code never reads a wall clock; it is handed ``now_ms``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import itemgetter

import numpy as np

from aisim.actors.engine.gaps import GapSink
from aisim.actors.engine.request import Request, apply_wire_progress, request_to_wire
from aisim.actors.engine.worker import EngineWorker
from aisim.actors.messages import (
    Capabilities,
    Fpm,
    RoleState,
    Snapshot,
    TrafficWindow,
    decision_from_wire,
    snapshot_to_wire,
    traffic_to_wire,
)
from aisim.actors.protocol import (
    Control,
    EventKind,
    Op,
    ParamsUpdate,
    Phase,
    PrefixQuery,
    RequestUpdate,
    ReserveQuery,
    RouteCall,
    UpdateKind,
    WorkerStatus,
)
from aisim.simulator.lifecycle import ACTIVE, DRAINING, STARTING, Lifecycle
from aisim.simulator.metrics.collector import STATUS_INCOMPLETE, RequestLog
from aisim.simulator.metrics.timeline import WorkerTimeline
from aisim.simulator.traffic.workload import BlockHashStore, Workload

_EVENT_ORDER = itemgetter(0, 1, 2, 3)
_new = tuple.__new__  # builds a protocol NamedTuple without its Python-level __new__ (hot loops)
INF = math.inf
#: initial arrivals taken from their arrays at a time, and routed ahead at most (``_arrival_horizon``)
ARRIVAL_WINDOW = 4096
#: arrivals at one edge past which the engine hosts are not told the router's blocks (``_watch_at``):
#: a burst's set of hashes would cost more than the syncs it saves
WATCH_ARRIVALS = 256


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
    reserves: bool = False  # a decode pool whose workers reserve a handoff's blocks before its transfer
    destination_first: bool = False  # ... and before its prefill starts (SGLang): chosen at arrival

    def __post_init__(self) -> None:
        if not self.eligible:
            self.eligible = list(self.worker_ids)

    # One pool, three names, each where its reader expects it: ``role`` is ours (aggregated |
    # prefill | decode), ``record_pool`` the reference's per-request record name (agg | prefill |
    # decode), ``planner_role`` the Planner's (it calls an aggregated pool "decode").
    @property
    def record_pool(self) -> str:
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
    OSL) and completions (TTFT, ITL, prefix-cache hit rate, speculative decoding's accept length:
    tokens per decode pass) since the window last closed. The
    hit rate is reported only where the router tracks KV (the live Planner reads it from the
    KV router's events: 0 under round robin or random)."""

    def __init__(self, start_ms: float = 0.0, reports_hit_rate: bool = True) -> None:
        self.reports_hit_rate = reports_hit_rate
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
        self.spec_tokens = 0  # speculative decoding: tokens the completed requests' decode passes emitted
        self.spec_passes = 0

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
        if req.spec_passes:
            self.spec_tokens += req.spec_tokens
            self.spec_passes += req.spec_passes
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
            avg_kv_hit_rate=self.reused / self.inputs if self.inputs and self.reports_hit_rate else 0.0,
            avg_accept_length=self.spec_tokens / self.spec_passes if self.spec_passes else 1.0,
        )


@dataclass
class CoordinatorStats:
    num_events: int = 0
    num_transfers: int = 0
    last_event_ms: float = 0.0
    stopped_at_ms: float | None = None
    stopped_early: dict | None = None  # {at_s, reason}: a checkpoint monitor stopped the replay


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


class Coordinator:
    """Runs one replay over engine hosts (see the module doc). ``runtime`` hosts the actors:
    ``simulator.runtime.local.LocalRuntime`` or ``simulator.runtime.ray_runtime.RayRuntime``;
    ``arrivals`` is this run's own arrival state (``ArrivalProcess.start()``)."""

    def __init__(
        self,
        workload: Workload,
        hash_store: BlockHashStore,
        arrivals,
        runtime,
        entry: Pool,
        log: RequestLog,
        decode: Pool | None = None,
        transfer: KvTransferModel | None = None,
        stop_ms: float | None = None,
        resource_guard=None,
        has_planner: bool = False,
        window_ms: float = 0.0,
    ) -> None:
        self.workload = workload
        self.hash_store = hash_store
        self.arrivals = arrivals
        self.transfer = transfer or KvTransferModel()
        self.log = log
        self.stop_ms = stop_ms
        self.resource_guard = resource_guard
        self.stats = CoordinatorStats()
        self._latest_event_ms = 0.0  # the last event of the final run-out (the workers run ahead of ``now`` there)
        self.num_offered = 0
        self.rt = runtime
        self.window_ms = float(window_ms)
        self.entry = entry
        self.decode = decode
        self.has_planner = has_planner
        self.planner_hook: Callable[[bool], None] = lambda entering: None  # the runner may time the Planner's ticks
        self.retune = None  # a simulator.retune_driver.RetuneDriver when the Planner retunes
        # progress (the runner's display): called as (now_ms, last arrival ms or None, requests ended,
        # requests offered) after every edge; ``progress_edges`` extra edges make sure it is called
        # often enough (an edge changes no result: the hosts' steps are exact at any edge)
        self.progress: Callable[[float, float | None, int, int], None] | None = None
        # asked at every edge whether the replay is decided (simulator.checkpoints.Monitor): a
        # reason stops it there; None runs on
        self.monitor = None
        self.checkpoint_slices = 50  # a monitored run-out is stepped in this many slices of the arrival span
        self.progress_edges = 200
        self._progress_every_ms: float | None = None
        self._progress_end_ms: float | None = None
        num_workers = len(entry.worker_ids) + (len(decode.worker_ids) if decode is not None else 0)
        self._pool_of: list[Pool] = [entry] * num_workers
        if decode is not None:
            for wid in decode.worker_ids:
                self._pool_of[wid] = decode
        self.lifecycle = Lifecycle(num_workers, [p.role for p in self._pool_of])
        self._traffic = TrafficAccumulator(reports_hit_rate=entry.router.needs_kv_events)
        self._ranks_of = [self._pool_of[w].num_ranks for w in range(num_workers)]
        # requests cross to the hosts as objects (one in-process host) or in their wire form
        self._direct = runtime.direct
        self._wire = _same if self._direct else request_to_wire
        self._status: list[WorkerStatus] = [idle_status(w) for w in range(num_workers)]
        self._active_on: list[set[int]] = [set() for _ in range(runtime.num_hosts)]  # workers with work, per host
        self.requests: dict[int, Request] = {}  # in flight, by index
        self._gen: list = []  # follow-up arrivals (time, index)
        self._late: list = []  # routed ahead of their time: (time, request), for the Planner's traffic window
        self._ready: list = []  # (time, worker)
        self._handoffs: list = []  # (time, source worker, request), not placed yet
        self._transfers: dict[int, list] = {}  # seq -> [request, src, dst, rank, done_ms]
        self._transfer_times: list = []  # (done_ms, seq) not yet reached
        self._next_transfer = 0
        self._updates: list = []  # router updates not yet sent
        self._inputs: list[list] = [[] for _ in range(runtime.num_hosts)]
        self._control: list[list] = [[] for _ in range(runtime.num_hosts)]
        self._tick_ms: float | None = None
        self._tick_interval_ms = 0.0
        self._num_ticks = 0
        self._routes_state = entry.router.needs_worker_state
        self._coupled = decode is not None or arrivals.follows_terminal
        # the workers whose pass ends may need the coordinator at that very instant (exact edges): a
        # prefill worker's (a handoff is placed when it happens), everyone's (None) when arrivals
        # follow terminals; a decode worker's pass ends otherwise concern no one else
        # (a reserving decode pool's pass ends start the transfers its completions made room for)
        self._reserving = decode is not None and decode.reserves
        # destination first (SGLang): an arrival's decode worker is chosen and reserves its prompt's
        # blocks before the request goes to its prefill worker
        self._dest_first = decode is not None and decode.destination_first
        self._awaiting: dict[int, tuple] = {}  # transfer id -> (request, decode worker): reservation waits
        # request index -> [transfer id, decode worker, rank, reserved_ms, tokens to transfer]
        self._destination: dict[int, list] = {}
        self._edge_workers: list[int] | None = (None if arrivals.follows_terminal or self._reserving
                                                else entry.worker_ids)
        # a window only matters where the router reads worker state or one worker's events cause
        # work elsewhere; otherwise every window gives the lockstep result and none is needed
        self._windowed = self.window_ms > 0 and (self._routes_state or self._coupled)
        self._arrivals_only = False  # (set by run: a monitor and the Planner are known by then)
        # with one host, a disaggregated run (arrivals not following terminals, no window) steps
        # the host until the next arrival or fixed edge and lets it stop at the first handoff
        self._stop_at_handoff = (self._coupled and not self._windowed and not arrivals.follows_terminal
                                 and runtime.num_hosts == 1)
        self._reserved: list[tuple] = []  # (time, [transfer id, tokens]): destinations that reserved
        self.num_edges = 0

    # -- the Planner's decisions and the worker lifecycle -------------------------------------
    @property
    def lifecycle_operations(self) -> list[dict]:
        return self.lifecycle.operations

    def worker_seconds(self, until_ms: float) -> dict[str, float]:
        return self.lifecycle.worker_seconds(until_ms)

    def _pools(self) -> list[Pool]:
        return [p for p in (self.entry, self.decode) if p is not None]

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

    def _settle_drain(self, wid: int, now_ms: float) -> None:
        """A draining worker leaves once it has finished all its work and no KV transfer
        from or to it is in flight."""
        if self._drain_blocked(wid):
            self._drain_later(wid)
            return
        self._record(self._pool_of[wid], now_ms, "drain_settlement", [self.lifecycle.remove(wid, now_ms)], None)

    # -- small helpers ------------------------------------------------------------------------
    def _host(self, wid: int) -> int:
        return wid % self.rt.num_hosts

    def _send(self, wid: int, item: tuple) -> None:
        """Queue a ``HostInput`` for worker ``wid``'s host. The coordinator builds it as an exact
        tuple in HostInput's field order: the host keeps its inputs in a heap as exact tuples
        (they compare and unpack faster), so a NamedTuple would only be copied there."""
        self._inputs[self._host(wid)].append(item)

    def _next_arrival(self) -> float | None:
        if self._ptr >= self._n_win and self._win_end < self._n_init:
            self._next_window()
        t = self._arr_t[self._ptr] if self._ptr < self._n_win else None
        if self._gen and (t is None or self._gen[0][0] < t):
            t = self._gen[0][0]
        return t

    def _next_window(self) -> None:
        """The next ``ARRIVAL_WINDOW`` initial arrivals as lists (read from their arrays: a large
        trace's arrivals never exist as Python objects all at once)."""
        a = self._win_end
        b = min(a + ARRIVAL_WINDOW, self._n_init)
        self._arr_t = self._init_t[a:b].tolist()
        self._arr_i = self._init_i[a:b].tolist()
        self._ptr = 0
        self._n_win = b - a
        self._win_end = b

    def _arrival_horizon(self, now: float) -> float | None:
        """When routing ahead, the time of the initial arrival ``ARRIVAL_WINDOW`` arrivals ahead (or
        of the first after ``now``): an edge there bounds the requests in flight (arrived or routed
        ahead) whatever the trace's size (an edge changes no result)."""
        k = self._win_end - self._n_win + self._ptr + ARRIVAL_WINDOW
        if k >= self._n_init:
            return None
        t = float(self._init_t[k])
        if t <= now:
            k = int(np.searchsorted(self._init_t, now, side="right"))
            t = float(self._init_t[k]) if k < self._n_init else None
        return t

    def _watch_at(self, until: float, ahead: float | None) -> bytes | None:
        """The hashes of the full prompt blocks of the arrivals not routed yet that arrive by
        ``until``, or before ``ahead`` (routed ahead there), as bytes of uint64: open loop, the
        blocks the router reads at the edge ``until``, and nothing else (the engine hosts may
        leave a worker whose KV events cannot change them for later: ``WorkerHost._publish``).
        None past ``WATCH_ARRIVALS`` arrivals at once (every busy worker is brought up, as
        without)."""
        w = self.workload
        store = self.hash_store
        bs = self.entry.block_size
        last = until if ahead is None else max(until, math.nextafter(ahead, -INF))  # (t <= last)
        out = []
        p, ts, ids = self._ptr, self._arr_t, self._arr_i
        while p < self._n_win and ts[p] <= last:
            out.append(ids[p])
            p += 1
        if p >= self._n_win:  # (the next windows', read from their arrays)
            k = self._win_end
            times = self._init_t
            while k < self._n_init and times[k] <= last:
                out.append(int(self._init_i[k]))
                k += 1
                if len(out) > WATCH_ARRIVALS:
                    break
        if len(out) > WATCH_ARRIVALS:
            return None
        return b"".join([store.block_hashes(i, bs)[: int(w.input_len[i]) // bs].tobytes() for i in out])

    def _pop_arrival(self) -> tuple[float, int]:
        """The next arrival in (time, index) order, from the trace or the follow-ups."""
        if self._ptr >= self._n_win and self._win_end < self._n_init:
            self._next_window()
        if self._ptr < self._n_win:
            ta, ia = self._arr_t[self._ptr], self._arr_i[self._ptr]
            if not self._gen or (ta, ia) < self._gen[0]:
                self._ptr += 1
                return ta, ia
        return heapq.heappop(self._gen)

    # -- calls to the hosts -------------------------------------------------------------------
    def _take_calls(self, every_host: bool = False) -> dict:
        """host -> (control, inputs) for the hosts that have something to do (or all)."""
        control, inputs = self._control, self._inputs
        self._control = [[] for _ in control]
        self._inputs = [[] for _ in inputs]
        active = self._active_on
        return {h: (control[h], inputs[h]) for h in range(len(control))
                if every_host or control[h] or inputs[h] or active[h]}

    def _step(self, start: float, until: float, stop_at_handoff: bool = False, track_latest: bool = False,
              watch: bytes | None = None) -> float:
        """Step the hosts with something to do from ``start`` to ``until``; returns where they
        stopped (before ``until`` only with ``stop_at_handoff``, at a handoff; one host).
        ``track_latest``: keep the latest event time as a run-out does (a run-out in slices).
        ``watch``: the blocks the router reads at ``until`` (``_watch_at``), when that is all."""
        calls = self._take_calls()
        if not calls:
            return until
        outs = self.rt.step(calls, start, until, stop_at_handoff, watch)
        reached = min(out.reached for out in outs)
        if reached == INF or track_latest:  # running the workers out: their last events lie past the loop's clock
            self._latest_event_ms = max([self._latest_event_ms] + [e[0] for out in outs for e in out.events])
        self._complete_transfers(reached)  # before the completions they precede are logged
        self._absorb(outs)
        return reached

    def _absorb(self, outs: list) -> None:
        """Merge the hosts' events into lockstep order and apply them."""
        events = []
        updates = self._updates
        take = self._take_statuses
        for out in outs:  # HostOutput
            updates.extend(out.kv)  # KvUpdate: the router hears the workers' KV events in their order
            take(out.status)
            events.extend(out.events)
        if len(outs) > 1:
            events.sort(key=_EVENT_ORDER)
        for t, _phase, sid, _seq, kind, payload in events:  # HostEvent
            if kind == _TERMINAL:
                self._terminal(payload, t)
            elif kind == _FIRST_TOKEN:
                updates.append(_new(RequestUpdate, (self.entry.role, _UP_FIRST_TOKEN, payload)))
            elif kind == _HANDOFF:
                self._handoffs.append((t, sid, self._local(payload)))
            elif kind == _RESERVED:
                self._reserved.append((t, payload))
            elif kind == _DRAINED:
                self._drained(payload, t)
        self.stats.num_events += len(events)

    def _local(self, payload) -> Request:
        """The coordinator's request for a host's payload (the object itself, or its wire form
        whose progress is copied onto the coordinator's request)."""
        if self._direct:
            return payload
        req = self.requests[payload[0]]
        apply_wire_progress(req, payload)
        return req

    def _terminal(self, payload, t: float) -> None:
        req = self._local(payload)
        del self.requests[req.index]
        pool = self._pool_of[req.worker]
        if pool.router.tracks_requests:
            self._updates.append(_new(RequestUpdate, (pool.role, _UP_RELEASE, req.index)))
        self.log.add(req)
        if self.has_planner:
            self._traffic.complete(req)
        for t2, idx in self.arrivals.on_terminal(req.index, t):
            heapq.heappush(self._gen, (t2, idx))

    def _drained(self, wid: int, t: float) -> None:
        if self.lifecycle.state[wid] == DRAINING:
            self._record(self._pool_of[wid], t, "drain_settlement", [self.lifecycle.remove(wid, t)], None)

    # -- the lifecycle hooks ---------------------------------------------------------------------
    def _spawn(self, pool: Pool, wid: int) -> None:
        self._control[self._host(wid)].append(Control("spawn", wid, pool.role))
        self._ranks_of.append(pool.num_ranks)
        self._status.append(idle_status(wid))

    def _on_ready(self, wid: int, at_ms: float) -> None:
        heapq.heappush(self._ready, (at_ms, wid))

    def _drain_blocked(self, wid: int) -> bool:
        st = self._status[wid]
        if st.busy or st.has_work or st.held or st.pending:
            return True
        if any(dst == wid for _, dst in self._awaiting.values()) or any(
                d[1] == wid for d in self._destination.values()):
            return True
        return any(src == wid or dst == wid for _, src, dst, _, _ in self._transfers.values())

    def _drain_later(self, wid: int) -> None:
        self._control[self._host(wid)].append(Control("drain", wid))

    def _work_remains(self) -> bool:
        if (self._ptr < self._n_win or self._win_end < self._n_init or self._gen or self._transfers or self._ready
                or self._handoffs or self._reserved or self._awaiting):
            return True
        return any(self._active_on) or any(self._inputs) or any(self._control)  # (the last two: not sent yet)

    # -- one edge ---------------------------------------------------------------------------
    def _edge(self, now: float, until: float | None) -> None:
        """Everything the coordinator does at an edge, in the lockstep phase order: place
        handoffs, ready workers, complete transfers (bookkeeping), route the arrivals at
        ``now``, the Planner's tick; then, when routing ahead, the arrivals before ``until``."""
        self.num_edges += 1
        tick_now = self._tick_ms is not None and self._tick_ms <= now
        requests = []
        eligible = []
        placing = []
        if self._reserved:  # destinations that reserved their blocks: their transfers start now
            reserved, self._reserved = self._reserved, []
            for _, (seq, tokens) in sorted(reserved):
                if self._dest_first:  # (or their prefill)
                    self._release_to_prefill(seq, tokens, now)
                else:
                    self._start_transfer(seq, now)
        if self._handoffs and self._dest_first:  # (their destinations are reserved: the transfers start)
            placing, self._handoffs = self._handoffs, []
            self._place_reserved(placing, now)
        if self._handoffs:
            eligible.append(list(self.decode.eligible))
            placing = self._handoffs
            self._handoffs = []
            tracked = self.entry.router.tracks_requests
            for t_h, src, req in placing:
                if tracked:
                    self._updates.append(_new(RequestUpdate, (self.entry.role, _UP_HANDED_OFF, req.index)))
                requests.append(_new(RouteCall, ("decode", req.index, req.prompt_len, self._route_hashes(self.decode, req),
                                          now, len(eligible) - 1)))
        while self._ready and self._ready[0][0] <= now:
            _, wid = heapq.heappop(self._ready)
            self._worker_ready(wid, now)
        arriving = self._arrivals(now, None if tick_now else until, requests, eligible)
        if self._dest_first and arriving:
            self._route_destinations(arriving, requests, eligible, now)
        decisions = self._route(requests, eligible)
        if placing:
            self._place(placing, decisions[: len(placing)], now)
        self._complete_transfers(now)
        self._dispatch_routed(arriving, decisions[len(placing):], now)
        if tick_now:
            self._tick(now)
            if until is not None:  # arrivals after the tick see its scaling
                requests, eligible = [], []
                arriving = self._arrivals(now, until, requests, eligible)
                if self._dest_first and arriving:
                    self._route_destinations(arriving, requests, eligible, now)
                self._dispatch_routed(arriving, self._route(requests, eligible), now)

    def _complete_transfers(self, now: float) -> None:
        """The KV transfers done by ``now`` (the hosts applied them at their time): bookkeeping."""
        while self._transfer_times and self._transfer_times[0][0] <= now:
            done_ms, seq = heapq.heappop(self._transfer_times)
            h = self._transfers.pop(seq)[0].handoff
            h["source_released_ms"] = done_ms
            h["destination_activated_ms"] = done_ms

    def _arrivals(self, now: float, until: float | None, requests: list, eligible: list) -> list[Request]:
        """Pop the arrivals due by ``now`` (and before ``until``) and add their routing requests."""
        arriving = []
        ref = None
        while True:
            t = self._next_arrival()
            if t is None or not (t <= now or (until is not None and t < until)):
                return arriving
            if ref is None:
                eligible.append(list(self.entry.eligible))
                ref = len(eligible) - 1
            t, idx = self._pop_arrival()
            req = make_request(self.workload, self.hash_store, idx, t)
            self.requests[idx] = req
            arriving.append(req)
            requests.append(_new(RouteCall, (self.entry.role, idx, req.prompt_len, self._route_hashes(self.entry, req),
                                      max(t, now), ref)))

    def _route(self, requests: list, eligible: list) -> list:
        if not requests:
            return []
        updates, self._updates = self._updates, []
        return self.rt.route(updates, requests, eligible, self._ranks_of)

    def _dispatch(self, arriving: list[Request], decisions: list, now: float, parked: set | None = None) -> None:
        """Send routed arrivals to their workers (enqueued at their arrival, or now if late); those
        in ``parked`` (indices) are sent when their destination has reserved their blocks."""
        wire = self._wire
        for req, (wid, rank, info) in zip(arriving, decisions):  # RouteDecision
            at = max(req.arrival_ms, now)
            self.num_offered += 1
            if self.log.capture:
                req.routing.append(routing_entry(self.entry.record_pool, at, info))
            req.dispatched_ms = at
            req.worker = wid
            req.rank = rank
            if self.has_planner:
                if req.arrival_ms <= now:
                    self._traffic.arrive(req)
                else:
                    self._late.append(req)
            if parked and req.index in parked:
                continue
            self._send(wid, (at, _ARRIVAL, req.index, _ENQUEUE, wid, wire(req), rank, False))  # HostInput

    def _dispatch_routed(self, arriving: list[Request], decisions: list, now: float) -> None:
        """Dispatch arrivals with their routing decisions; destination first, these are the
        arrivals' own then their decode workers' (``_route_destinations``), which reserve first."""
        if self._dest_first and arriving:
            n = len(arriving)
            parked = self._reserve_destinations(arriving, decisions[n:], now)
            self._dispatch(arriving, decisions[:n], now, parked)
        else:
            self._dispatch(arriving, decisions, now)

    # -- destination first (SGLang) ----------------------------------------------------------
    def _route_destinations(self, arriving: list[Request], requests: list, eligible: list, now: float) -> None:
        """Add each arrival's decode routing call (after the arrivals' own)."""
        eligible.append(list(self.decode.eligible))
        ref = len(eligible) - 1
        for req in arriving:
            requests.append(_new(RouteCall, ("decode", req.index, req.prompt_len, self._route_hashes(self.decode, req),
                                      max(req.arrival_ms, now), ref)))

    def _reserve_destinations(self, arriving: list[Request], decisions: list, now: float) -> set:
        """Each arrival's decode worker reserves its prompt's blocks now; returns the indices of
        those whose reservation waits (their prefill starts when it succeeds)."""
        by_host: dict[int, list] = {}
        for req, (wid, rank, info) in zip(arriving, decisions):  # RouteDecision
            if self.log.capture:
                req.routing.append(routing_entry(self.decode.record_pool, max(req.arrival_ms, now), info))
            seq = self._next_transfer
            self._next_transfer += 1
            self._destination[req.index] = [seq, wid, rank, None, None]
            by_host.setdefault(self._host(wid), []).append((req, ReserveQuery(wid, rank, self._wire(req), seq)))
        answers, statuses = self.rt.reserve({h: [q for _, q in qs] for h, qs in by_host.items()})
        self._take_statuses(statuses)
        parked = set()
        for h, qs in by_host.items():
            for (req, q), tokens in zip(qs, answers[h]):
                d = self._destination[req.index]
                if tokens is not None:
                    d[3] = max(req.arrival_ms, now)
                    d[4] = tokens
                else:
                    self._awaiting[d[0]] = (req, d[1])
                    parked.add(req.index)
        return parked

    def _release_to_prefill(self, seq: int, tokens: int, now: float) -> None:
        """A waiting destination reserved (``tokens`` to transfer): its request goes to its
        prefill worker now."""
        req, _ = self._awaiting.pop(seq)
        d = self._destination[req.index]
        d[3] = now
        d[4] = tokens
        self._send(req.worker, (now, _ARRIVAL, req.index, _ENQUEUE, req.worker, self._wire(req), req.rank, False))

    def _place_reserved(self, placing: list, now: float) -> None:
        """Handoffs whose destinations reserved before their prefill: the transfers start now
        (moving what the destination does not cache: the tokens its reservation named)."""
        for t_h, src, req in placing:
            if self.entry.router.tracks_requests:
                self._updates.append(_new(RequestUpdate, (self.entry.role, _UP_HANDED_OFF, req.index)))
            seq, wid, rank, reserved_ms, tokens = self._destination.pop(req.index)
            req.handoff = handoff_record(src, req.rank, t_h, reserved_ms, wid, tokens, self.transfer.delay_ms(tokens))
            self._transfers[seq] = [req, src, wid, rank, None]
            self.stats.num_transfers += 1
            self._start_transfer(seq, now, reserved=False)

    def _route_hashes(self, pool: Pool, req: Request):
        return req.block_hashes(pool.block_size) if pool.router.needs_worker_state else None

    def _place(self, placing: list, decisions: list, now: float) -> None:
        """Handoffs placed at ``now``: decode worker chosen, KV transfer started."""
        pool = self.decode
        tokens_of = [req.prompt_len for _, _, req in placing]
        if self.transfer.timing_mode == "destination_missing":
            bs = pool.block_size
            by_host: dict[int, list] = {}
            for k, ((_, _, req), (wid, rank, _)) in enumerate(zip(placing, decisions)):
                q = PrefixQuery(wid, rank, req.block_hashes(bs), (req.prompt_len - 1) // bs)
                by_host.setdefault(self._host(wid), []).append((k, q))
            hits = self.rt.match_prefix({h: [q for _, q in qs] for h, qs in by_host.items()})
            for h, qs in by_host.items():
                for (k, _), n in zip(qs, hits[h]):
                    tokens_of[k] -= n * bs
        seqs = []
        for (t_h, src, req), (wid, rank, info), tokens in zip(placing, decisions, tokens_of):  # RouteDecision
            if self.log.capture:
                req.routing.append(routing_entry(pool.record_pool, now, info))
            req.handoff = handoff_record(src, req.rank, t_h, now, wid, tokens, self.transfer.delay_ms(tokens))
            seq = self._next_transfer
            self._next_transfer += 1
            self._transfers[seq] = [req, src, wid, rank, None]
            self.stats.num_transfers += 1
            seqs.append(seq)
        if pool.reserves:  # the destination reserves the blocks first; the rest start when they can
            by_host: dict[int, list] = {}
            for seq in seqs:
                req, _, wid, rank, _ = self._transfers[seq]
                by_host.setdefault(self._host(wid), []).append(
                    (seq, ReserveQuery(wid, rank, self._wire(req), seq)))
            answers, statuses = self.rt.reserve({h: [q for _, q in qs] for h, qs in by_host.items()})
            self._take_statuses(statuses)
            seqs = [seq for h, qs in by_host.items() for (seq, _), ok in zip(qs, answers[h]) if ok is not None]
            seqs.sort()
        for seq in seqs:
            self._start_transfer(seq, now)

    def _start_transfer(self, seq: int, now: float, reserved: bool = True) -> None:
        """The KV transfer ``seq`` starts at ``now`` (its destination holds its blocks: reserved
        now, unless ``reserved`` is False): the source releases the KV at its end, then the decode
        worker admits the prompt as computed."""
        entry = self._transfers[seq]
        req, src, wid, rank, _ = entry
        h = req.handoff
        if reserved:
            h["destination_reserved_ms"] = now
        done = now + h["transfer_ms"]
        entry[4] = done
        heapq.heappush(self._transfer_times, (done, seq))
        self._send(src, (done, _TRANSFER, seq, _RELEASE, src, req.index, 0, False))  # HostInput
        self._send(wid, (done, _TRANSFER, seq, _ENQUEUE, wid, self._wire(req), rank, True))  # HostInput

    def _take_statuses(self, statuses: list) -> None:
        """The workers' statuses a host reported (a step's, or a reservation's that cut a run)."""
        status = self._status
        active_on = self._active_on
        n = self.rt.num_hosts
        for st in statuses:  # WorkerStatus
            wid = st[0]
            status[wid] = st
            if st[1] or st[2] or st[5]:  # busy, has work or inputs pending
                active_on[wid % n].add(wid)
            else:
                active_on[wid % n].discard(wid)

    def _tick(self, now: float) -> None:
        self._tick_ms = None
        late = self._late
        k = 0
        while k < len(late) and late[k].arrival_ms <= now:
            self._traffic.arrive(late[k])
            k += 1
        del late[:k]
        outs = self.rt.deliver(self._take_calls(every_host=True), now)
        self._absorb(outs)
        if not self._work_remains():
            return  # ticks continue only while work remains
        changes = None
        if self.retune is not None:  # virtual time stands still while sweeps run
            lc = self.lifecycle
            replicas = {}
            for pool in self._pools():
                counts = lc.counts(pool.worker_ids)
                replicas[pool.role] = counts[STARTING] + counts[ACTIVE]
            changes, knobs = self.retune.at_tick(now, replicas, self.kv_contents)
            if knobs:  # the router's knobs from the arrivals after this tick on
                self._updates.append(ParamsUpdate(self.entry.role, UpdateKind.PARAMS, knobs))
        self.planner_hook(True)
        fpm = {}
        for out in outs:
            for wid, metrics in out.fpm:
                fpm[wid] = metrics
        roles = {}
        lc = self.lifecycle
        for pool in self._pools():
            active = lc.in_state(pool.worker_ids, ACTIVE)
            fpms = [f for wid in active for f in fpms_of(wid, fpm[wid])]
            roles[pool.planner_role] = RoleState(active, lc.in_state(pool.worker_ids, STARTING),
                                                 lc.in_state(pool.worker_ids, DRAINING), fpms, pool.caps)
        wire, consumed = self.rt.tick(snapshot_to_wire(Snapshot(now, roles)), traffic_to_wire(self._traffic.peek(now)),
                                      changes)
        if consumed:
            self._traffic.reset(now)
        decision = decision_from_wire(wire)
        self.planner_hook(False)
        tick = self._num_ticks
        self._num_ticks += 1
        self._apply_decision(decision, now, tick)
        self._tick_ms = decision.next_tick_ms

    def kv_contents(self) -> dict[str, list]:
        """Pool role -> per provisioned worker (by id) -> per rank, its resident KV blocks now."""
        lc = self.lifecycle
        out = {}
        for pool in self._pools():
            wids = sorted(lc.in_state(pool.worker_ids, ACTIVE) + lc.in_state(pool.worker_ids, STARTING))
            got = self.rt.kv_contents(wids)
            out[pool.role] = [got[w] for w in wids if w in got]
        return out

    # -- choosing the next edge ------------------------------------------------------------
    def _next_pass_end(self, wids: list[int] | None = None) -> float | None:
        """The earliest pass end of ``wids`` (of every worker when None)."""
        status = self._status
        ends = [st[3] for st in (status if wids is None else [status[w] for w in wids]) if st[3] is not None]
        return min(ends) if ends else None

    def _fixed_edges(self, now: float) -> list[float]:
        """Ticks (one due now is followed by the next, an interval later), ready times, the stop."""
        out = []
        if self._tick_ms is not None:
            out.append(self._tick_ms if self._tick_ms > now else now + self._tick_interval_ms)
        for t, _ in self._ready:
            if t > now:
                out.append(t)
        if self.stop_ms is not None and self.stop_ms > now:
            out.append(self.stop_ms)
        every = self._progress_every_ms
        if every is not None:
            t = (math.floor(now / every) + 1) * every
            if t < self._progress_end_ms:
                out.append(t)
        return out

    def _earliest_activity(self) -> float | None:
        """The earliest time anything is due: an arrival, a pass end, an input, a handoff."""
        ts = [t for t in (self._next_arrival(),) if t is not None]
        end = self._next_pass_end()
        if end is not None:
            ts.append(end)
        if self._transfer_times:
            ts.append(self._transfer_times[0][0])
        if self._handoffs:
            ts.append(self._handoffs[0][0])
        return min(ts) if ts else None

    def _window_until(self, now: float) -> float | None:
        """Next edge with a window, or an earlier fixed edge. When a pass end may cause work
        elsewhere, a monitor checks at edges or a Planner reads the workers' pass metrics (their
        statistics summed edge by edge): the end of the first window from ``now`` in which
        anything happens. Otherwise only arrivals need the coordinator: the start of the window
        holding the next one (its arrivals are routed there, against the workers' state then),
        or the end of the window under way when that one started at or before ``now`` (routed
        now); the workers run across the windows between in one step."""
        w = self.window_ms
        cands = self._fixed_edges(now)
        if not self._arrivals_only:
            t = self._earliest_activity()
            if t is not None:
                k = math.floor(max(t, now) / w) + 1
                edge = k * w
                cands.append(edge if edge > now else (k + 1) * w)  # k * w may round to ``now``
        else:
            t = self._next_arrival()
            if t is not None:
                k = math.floor(max(t, now) / w)
                edge = k * w
                if edge <= now:  # (its window is under way: routed now, the next edge at its end)
                    edge = (k + 1) * w
                    if edge <= now:  # (k * w may round to ``now``)
                        edge = (k + 2) * w
                cands.append(edge)
        return min(cands) if cands else None

    def _exact_until(self, now: float) -> float | None:
        cands = self._fixed_edges(now)
        if self._routes_state or self._coupled:
            t = self._next_arrival()
            if t is not None:
                cands.append(t)
        else:  # (routing ahead up to the next edge)
            t = self._arrival_horizon(now)
            if t is not None:
                cands.append(t)
        if self._coupled and not self._stop_at_handoff:
            end = self._next_pass_end(self._edge_workers)
            if end is not None:
                cands.append(end)
            if self._transfer_times:
                cands.append(self._transfer_times[0][0])
        cands = [c for c in cands if c > now]
        return min(cands) if cands else None

    # -- main loop ---------------------------------------------------------------------------
    def run(self) -> CoordinatorStats:
        """Run the replay to its end (or the stop time); the run closes the hosts' books."""
        times, indices = self.arrivals.initial()
        # whether only arrivals place the edges of a window (no pass end concerns anyone else)
        self._arrivals_only = not (self._coupled or self.monitor is not None or self.has_planner)
        self._init_t = times
        self._init_i = indices
        self._n_init = len(times)
        self._arr_t = self._arr_i = []
        self._ptr = self._n_win = self._win_end = 0
        progress = self.progress
        if progress is not None and self._n_init:
            end = float(times.max())
            if self.stop_ms is not None:
                end = min(end, self.stop_ms)
            if end > 0:
                self._progress_end_ms = end
                self._progress_every_ms = end / self.progress_edges
        if self.has_planner:
            self._tick_ms = self._tick_interval_ms = self.rt.initial_tick_ms()
        windowed = self._windowed
        ahead = windowed or not (self._routes_state or self._coupled)  # route arrivals up to the next edge
        optimistic = self._stop_at_handoff
        # open loop, the edges placed by arrivals alone (exact, or windows nobody's pass end
        # moves): what the router reads at the next edge is known before the step
        watches = self._routes_state and self.entry.router.needs_kv_events and not self._coupled and (
            not windowed or self._arrivals_only)
        stop = self.stop_ms
        guard = self.resource_guard
        monitor = self.monitor
        if monitor is not None:
            monitor.begin(self._arrival_span_ms())
        now = 0.0
        first = [t for t in (self._next_arrival(), self._tick_ms, stop) if t is not None]
        until: float | None = min(first) if first else None
        while until is not None:
            final = stop is not None and until >= stop
            if final:
                until = stop
            if until > now:
                watch = None
                if watches:  # (the arrivals routed at the edge ``until``: those _edge routes there)
                    watch = self._watch_at(until, self._window_until(until) if windowed and not final else None)
                reached = self._step(now, until, optimistic, watch=watch)
                if reached == INF:  # run out: nothing was handed off any more
                    break
                if reached < until:  # stopped at a handoff
                    final = False
                now = reached
            if guard is not None and not self.num_edges & 255:
                guard.check()
            if final:
                self._edge(now, None)
                self._step(now, now)  # what starts at the stop time (then the run ends)
                while self._coupled and self._next_arrival() == now:
                    self._edge(now, None)
                    self._step(now, now)
                self.stats.stopped_at_ms = stop
                break
            if ahead:
                nxt = self._window_until(now) if windowed else self._exact_until(now)
                self._edge(now, INF if nxt is None else nxt)
            else:
                self._edge(now, None)
                if self._coupled and not optimistic:  # start the passes now: their ends bound the next edge
                    self._step(now, now)
                    while self._next_arrival() == now:  # follow-ups of what was rejected just now
                        self._edge(now, None)
                        self._step(now, now)
                nxt = self._exact_until(now)
            if progress is not None:
                progress(now, self._progress_end_ms, len(self.log), self.workload.num_requests)
            if monitor is not None and self._stopped_by(monitor, now):
                break  # decided: the replay ends here, what is in flight incomplete
            if nxt is None and optimistic:
                nxt = INF if self._work_remains() else None  # run them out, stopping at handoffs
            elif nxt is None and (not self._coupled or self._edge_workers is not None):
                if monitor is None or self._transfers or self._awaiting:
                    self._step(now, INF)  # nothing outside the workers is due any more: run them out
                else:
                    stop_ms = self._run_out_checked(now, monitor)
                    if stop_ms is not None:
                        now = stop_ms
                        break
            until = nxt
        if self.stats.stopped_at_ms is None:  # run out ahead of the loop's clock: the run ends at its last event
            now = max(now, self._latest_event_ms)
        self.stats.last_event_ms = now
        if progress is not None:
            progress(now, self._progress_end_ms, len(self.log), self.workload.num_requests)
        self._finish(now)
        return self.stats

    def _run_out_checked(self, now: float, monitor) -> float | None:
        """Run the workers out as ``_step(now, INF)`` does, in slices of virtual time with the
        monitor asked after each (the slices change no result: a worker stepped to a time and on
        again is where one stepped past it would be). Returns where the monitor stopped the
        replay, or None when the workers ran out."""
        slice_ms = max(self._arrival_span_ms() / max(1, self.checkpoint_slices), 1.0)
        at = now
        while any(self._active_on) or any(self._inputs) or any(self._control):
            self._step(at, at + slice_ms, track_latest=True)
            at += slice_ms
            if self._stopped_by(monitor, at):
                return at
        return None

    def _arrival_span_ms(self) -> float:
        return float(self._init_t.max()) if self._n_init else 0.0

    def _stopped_by(self, monitor, now: float) -> bool:
        """Ask the monitor at ``now``; a reason stops the replay there (recorded in the stats)."""
        reason = monitor.check(now, len(self.log), self.rt.in_flight)
        if reason is None:
            return False
        self.stats.stopped_early = {"at_s": now / 1000.0, "reason": reason}
        self.stats.stopped_at_ms = now
        return True

    def _finish(self, end_ms: float) -> None:
        outs = self.rt.finish(end_ms)
        leftover = sorted((item for out in outs for item in out.leftover), key=itemgetter(0))
        for _, payloads in leftover:
            for payload in payloads:
                req = self._local(payload)
                del self.requests[req.index]
                self.log.add(req, STATUS_INCOMPLETE)
        for seq in sorted(self._transfers):
            self.log.add(self._transfers[seq][0], STATUS_INCOMPLETE)
        for seq in sorted(self._awaiting):  # (their destination never had room: never sent to a prefill worker)
            req = self._awaiting[seq][0]
            del self.requests[req.index]
            self.log.add(req, STATUS_INCOMPLETE)
        totals = sorted((t for out in outs for t in out.totals), key=itemgetter(0))
        self.worker_totals = [t[1:6] for t in totals]  # WorkerTotals without the id and gaps
        self.gap_sinks = [t[6] if isinstance(t[6], GapSink) else GapSink.from_wire(t[6]) for t in totals]
        self.offload_reports = [(t[0], t[7]) for t in totals if len(t) > 7 and t[7]]  # (worker, per rank)
        recorded = sorted((d for out in outs for d in out.timelines if d is not None), key=itemgetter("worker_id"))
        provisioned = self.lifecycle.provisioned  # a worker's timeline covers the time it was provisioned
        self.timelines = [WorkerTimeline.from_plain(d, start_ms=provisioned[d["worker_id"]][0],
                                                    end_ms=min(end_ms, provisioned[d["worker_id"]][1] or end_ms))
                          for d in recorded]


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


def idle_status(wid: int) -> WorkerStatus:
    """A new worker's status until its host reports one."""
    return WorkerStatus(wid, False, False, None, 0, 0)


# the protocol's numbers as plain ints in the hot loops
_ARRIVAL, _TRANSFER = int(Phase.ARRIVAL), int(Phase.TRANSFER)
_ENQUEUE, _RELEASE = int(Op.ENQUEUE), int(Op.RELEASE)
_RESERVED = int(EventKind.RESERVED)
_FIRST_TOKEN, _TERMINAL, _HANDOFF, _DRAINED = (int(k) for k in (EventKind.FIRST_TOKEN, EventKind.TERMINAL,
                                                                  EventKind.HANDOFF, EventKind.DRAINED))
_UP_FIRST_TOKEN, _UP_RELEASE, _UP_HANDED_OFF = (int(k) for k in (UpdateKind.FIRST_TOKEN, UpdateKind.RELEASE,
                                                                  UpdateKind.HANDED_OFF))


def _same(req):
    return req


