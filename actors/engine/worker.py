"""A simulated engine worker: one or more attention-data ranks that pass in lockstep.

The worker runs one pass at a time; its end time is fixed when it starts and its effects
become visible at its end. A worker pass lasts as long as its slowest rank.

Steady decode is fast-forwarded: when every busy rank runs pure decode of a batch that
cannot change on its own (no prefill, no admission possible, no allocation failure ahead),
the worker plans a *run* of up to k passes at once. When nothing waits on a rank, a completion
frees only blocks nobody asks for, so the run goes on with the smaller batch (the request leaves
after its last pass, its blocks are released before the next pass allocates, its completion is
taken by the host at its ``terminal_ms``); otherwise the run ends at the first completion. Pass
end times are computed in chunks: up to the next input the host knows of, else as many as so
far. Anything that reads the worker mid-run first ``sync``s it (applies the passes that have
started/ended by then); an arrival truncates the run after the pass in progress (it syncs only
for the timeline's sample or KV events: the queue reads nothing of the run, whose passes are
applied when next asked for, in time order all the same), so a run is indistinguishable from
stepping pass by pass (tested byte for byte). In disaggregation, a request
whose KV was transferred here, arriving alone, joins the batch where the run was cut: instead of
a general pass and a new plan, a new run starts at once whose first pass is that general pass
and in which the request decodes from the second (``_join``).

Timeline (opt-in, ``record_timeline=True``): the worker samples ``(time_ms, waiting, running,
KV blocks used)`` summed over its ranks after every event that can change them: an enqueue, a
pass/run start (after admission, preemption and rejection), a pass/run end and a completion
inside a run (after completions), and a handed-off request's release when the caller passes its time. The state is
piecewise constant between samples; before the first sample it is idle (0, 0, 0). KV blocks
used are the blocks held by live requests (``KVCache.num_active``: shared + private; cached
inactive blocks count as free, as in vLLM's KV usage). A fast-forwarded decode run allocates
its blocks lazily, so within a run the KV usage is sampled at its start (before the run's first
pass's allocations), at any enqueue that cuts into it and at its end, not block by block.
Recording only reads state: it never changes results. A ``timeline_spool`` (the replay's, e.g.
``simulator.metrics.timeline.TimelineSpool``: ``limit``, ``append(columns)``, ``columns(tail)``)
takes the older samples past its ``limit``, so a long replay's timeline is not held in memory;
the worker keeps its last two samples (coalescing rewrites them).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from itertools import accumulate
from operator import neg
from typing import NamedTuple

import numpy as np

from aisim.actors.engine.kv_cache import REMOVED, KVCache
from aisim.actors.engine.request import COMPLETED, Request
from aisim.actors.engine.scheduler import SCAN_PASSES, GapSink, RankPass, RankScheduler
from aisim.actors.engine.speculation import accepted_from, advance_bases, block_bases, stream_of
from aisim.actors.engine.timing import PassShape

MAX_RUN_PASSES = 4096
_SPEC_CHUNK = 4096  # (requests x passes) a run with speculative decoding draws at least at once


def _passes_to_reach(t_ms: float, m: int, start_ms: float, last_ms: float) -> int:
    """About as many passes as reach ``t_ms`` at the mean pass time of a run's first ``m``
    (from ``start_ms`` to ``last_ms``), and 8 more."""
    return m + 8 + int((t_ms - last_ms) * m / (last_ms - start_ms))


class DecodeRun:
    """Up to ``num_planned`` decode passes of one batch per busy rank, which only shrinks: a
    request leaves after the pass that completes it. Pass end times are computed ahead in
    chunks (``num_passes`` of them so far, ``ends``); the run ends at the last computed one
    unless more are planned and nothing cut it short."""

    __slots__ = ("start_ms", "ends", "num_passes", "num_planned", "n_sched", "n_done", "ranks", "batch_size",
                 "held_events", "segments", "exit_passes", "next_exit", "bound", "joined", "drawn", "blocks")

    def __init__(self, start_ms: float, num_planned: int, ranks: list, segments: dict, drawn: bool = False) -> None:
        self.start_ms = start_ms
        self.ends: list[float] = []
        self.num_passes = 0  # passes whose end time is computed
        self.num_planned = num_planned
        self.n_sched = 0  # passes whose schedule-time effects (blocks) are applied; lazily, on sync
        self.n_done = 0
        # per busy rank: [rank, batch, computed at start, generated at start, passes to completion],
        # the requests still in the batch (lists of the run's own: a leaving request is deleted)
        self.ranks = ranks
        self.batch_size = sum(len(r[1]) for r in ranks)
        self.held_events: list | None = None  # KV events of the scheduled pass still in progress
        # id(rank) -> its _Segments (the stretches of passes with the same batch, built as needed)
        self.segments = segments
        self.exit_passes: list[int] = []  # sorted passes after which some request leaves (as far as built)
        self.next_exit = 0  # first entry of exit_passes not applied yet
        self.bound = num_planned  # passes whose blocks are sure to be there (an input may cut num_planned)
        # the request that joined the batch as the run started (EngineWorker._join) while its
        # tokens are not applied yet: (pass j, request, prompt tokens committed at j, 1 or 0, or
        # None once its first token is applied); pass 0 is its prompt's last step (its first
        # token), pass 1 its first decode step (its second)
        self.joined: tuple | None = None
        self.drawn = drawn  # (speculative decoding: the ranks' segments are _SpecSegments)
        self.blocks: list | None = None  # per entry, its rank's run_blocks (made when first scheduled)

    @property
    def end_ms(self) -> float:
        return self.ends[self.num_passes - 1]


class TimelineColumns(NamedTuple):
    """Raw timeline of a worker: one sample per state change (see the module doc)."""

    times_ms: array  # 'd'
    waiting: array  # 'q': requests in the ranks' waiting queues
    running: array  # 'q': requests in the ranks' running batches
    kv_blocks_used: array  # 'q': KV blocks held by live requests

    @classmethod
    def empty(cls) -> "TimelineColumns":
        return cls(array("d"), array("q"), array("q"), array("q"))


_IDLE_PASS = (0.0, 0, 0, 0, 0.0, 0, 0, 0.0)  # an empty forward-pass record (wall 0: no regression sample)
_NO_QUEUE = (0, 0, 0.0, 0, 0, 0.0)


class EngineWorker:
    """Engine worker actor (in-process form). Times are virtual milliseconds."""

    def __init__(self, worker_id: int, ranks: list[RankScheduler], fast_forward: bool = True,
                 max_run_passes: int = MAX_RUN_PASSES, record_timeline: bool = False,
                 track_queue: bool = False, timeline_spool=None) -> None:
        self.worker_id = worker_id
        self.ranks = ranks
        # KV events published at pass ends: (rank, kind, hashes); only when the ranks record them
        self.kv_events: list[tuple[int, int, list[int]]] = []
        self.records_kv_events = ranks[0].kv.events is not None
        self.max_run_passes = max_run_passes
        self.gaps = GapSink()
        self.busy = False
        self.pass_start_ms = 0.0
        self.pass_end_ms = 0.0
        self._plans: list[RankPass | None] | None = None
        self._run: DecodeRun | None = None
        # waiting (busy, no pass) for a host/disk KV transfer a queued request needs: ends at the
        # tiers' next event, or at once when a request arrives
        self._waits = False
        self._offload = [r.offload for r in ranks if r.offload is not None]
        self.has_tiers = any(off.events is not None for off in self._offload)  # (tier KV events: publish_tiers)
        self.exits: list[Request] = []  # completed inside a run, not taken yet (take_exits)
        self.num_passes = 0
        self.num_runs = 0
        cfg = ranks[0].config
        self._interval = cfg.prefill_schedule_interval if len(ranks) > 1 else 1
        # whether a pass may start a decode run (a prefill role never decodes)
        self._runs = fast_forward and self._interval == 1 and not cfg.prefill_only
        # whether a request whose KV was transferred here may join a run instead of ending it
        # (one rank; no timeline, queue tracking or KV events, which a joining pass would have
        # to record as a general pass does): see _join
        self._spec = cfg.speculation is not None  # (speculative decoding: runs draw bursts, _SpecSegments)
        self._joins = self._runs and len(ranks) == 1 and not record_timeline and not track_queue \
            and not self.records_kv_events and ranks[0].joins_runs and not self._spec
        # the host's edges are the router's, each knowing the blocks it reads, and nothing reads
        # this worker's pass ends between them (WorkerHost.step with a watch): its runs' chunks
        # grow past the step's end (_extend), and a sync for the router may wait where it can
        # (router_unchanged: vLLM's block cache, no tiers, no drawn runs)
        self.edges_watched = False
        self._waits_for_router = self.records_kv_events and isinstance(ranks[0].kv, KVCache) \
            and not self.has_tiers and not self._spec
        # raw timeline columns, or None when not recorded (the hot path checks only this)
        self.timeline: TimelineColumns | None = TimelineColumns.empty() if record_timeline else None
        self._spool = timeline_spool if record_timeline else None
        self._rank = ranks[0] if len(ranks) == 1 else None  # (the timeline's samples read it directly)
        self.kv_blocks_total = sum(r.kv.capacity for r in ranks)
        # forward-pass records carry the queue as of their pass's scheduling (the Planner reads
        # them): per rank, the queue when the current pass or run started and when the last ended
        self.track_queue = track_queue
        self._queue_now: list[tuple] | None = None
        self._queue_last: list[tuple] | None = None

    # -- queries --------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        for r in self.ranks:
            if r.running or r.waiting or r.policy.pending:
                return True
        for off in self._offload:
            if off.loading:
                return True
        return False

    @property
    def num_requests(self) -> int:
        return sum(r.num_requests for r in self.ranks)

    # -- requests -------------------------------------------------------------------
    def enqueue(self, req: Request, rank: int, now_ms: float) -> float | None:
        """Queue a request; it joins the first pass that starts after ``now_ms``.

        Returns the new end time when a planned run had to be cut short, else None.
        """
        req.worker = self.worker_id
        req.rank = rank
        run = self._run
        if run is None:
            self.ranks[rank].enqueue(req)
            if self.timeline is not None:
                self._sample(now_ms)
            if self._waits:  # (the wait for a transfer ends: a pass may start now)
                self.pass_end_ms = now_ms
                return now_ms
            return None
        if self.timeline is not None or self.records_kv_events:
            # (the sample counts the run's completions by now; the KV events of the passes ended
            # by now go out before the cut) - else the run's passes are applied when next asked
            # for (nothing the queue does reads them)
            self.sync(now_ms)
        self.ranks[rank].enqueue(req)
        if self.timeline is not None:
            self._sample(now_ms)
        return self._cut_run(run, now_ms)

    def _cut_run(self, run, now_ms: float) -> float | None:
        """End the planned run after the pass in progress at ``now_ms`` (something joins or waits);
        the new end time, or None when it ends there anyway."""
        keep = max(1, run.n_sched, bisect_left(run.ends, now_ms) + 1)
        if keep >= run.num_passes:
            run.num_planned = run.num_passes
            return None
        run.num_passes = run.num_planned = keep
        del run.ends[keep:]
        end = run.end_ms
        self.pass_end_ms = end
        return end

    def reserve_destination(self, req: Request, rank: int, transfer: int,
                            now_ms: float) -> tuple[int | None, float | None]:
        """A reserving destination (TRT-LLM, SGLang decode): reserve ``req``'s blocks on ``rank``
        now, before its transfer (SGLang: its prefill) starts. Returns (the prompt tokens to
        transfer when reserved, else None; the new end time when a planned run was cut short so
        that completions can be retried as they come, else None)."""
        self.sync(now_ms)  # (the run's completions up to now have freed their blocks)
        policy = self.ranks[rank].policy
        run = self._run
        if policy.reserve_destination(req, transfer, now_ms, self.busy):
            # (an SGLang reservation takes its pages now: the run's later passes must not count on them)
            return (policy.transfer_tokens(req),
                    self._cut_run(run, now_ms) if run is not None and policy.takes_pages else None)
        return None, self._cut_run(run, now_ms) if run is not None else None

    def retry_destinations(self, now_ms: float, completed: bool = True) -> list[tuple[int, int]]:
        """At a pass end (``completed``: requests completed in it): (transfer id, tokens to
        transfer) of the destinations that reserved their blocks now."""
        out = []
        for rank in self.ranks:
            policy = rank.policy
            if policy.pending and (completed or policy.per_round):
                out.extend(policy.retry_destinations(now_ms, not (rank.running or rank.waiting)))
        return out

    def take_handoffs(self) -> list[Request]:
        """Prefill role: requests whose prompt finished (their KV stays here until released)."""
        out: list[Request] = []
        for r in self.ranks:
            if r.handoffs:
                out.extend(r.handoffs)
                r.handoffs = []
        return out

    def take_first_tokens(self) -> list[Request]:
        """Requests that emitted their first token since the last call (if ranks track them)."""
        out: list[Request] = []
        for r in self.ranks:
            if r.first_tokens:
                out.extend(r.first_tokens)
                r.first_tokens.clear()
        return out

    def _run_pass_metrics(self, run: DecodeRun, j: int) -> dict:
        """Scheduled-batch metrics of pass j of a run, per busy rank (keyed by id(rank))."""
        ends = run.ends
        wall = ends[j] - (ends[j - 1] if j else run.start_ms)
        out = {}
        for entry in run.ranks:
            rank = entry[0]
            n, kv, var = run.segments[id(rank)].metrics(j)
            out[id(rank)] = (wall, 0, 0, 0, 0.0, n, kv, var)
        return out

    def forward_pass_metrics(self) -> list[tuple]:
        """Per rank: (rank, pass ordinal, last pass metrics or None, queue stats). Call after sync().

        The metrics are the last finished pass's (None before the first); an idle worker (nothing
        running, nothing queued) reports an empty record, as a live engine's metrics publisher
        does between passes. With ``track_queue`` the queue is as of that pass's scheduling,
        else as of now."""
        if not self.busy and not self.has_work:
            return [(i, rank.pass_count, None if rank.last_pass is None else _IDLE_PASS, _NO_QUEUE)
                    for i, rank in enumerate(self.ranks)]
        run = self._run
        in_run = run is not None and run.n_done
        run_last = self._run_pass_metrics(run, run.n_done - 1) if in_run else {}
        queues = (self._queue_now if in_run else self._queue_last) if self.track_queue else None
        out = []
        for i, rank in enumerate(self.ranks):
            if in_run:
                last = run_last.get(id(rank), _IDLE_PASS)
                ordinal = rank.pass_count + run.n_done
            else:
                last, ordinal = rank.last_pass, rank.pass_count
            out.append((i, ordinal, last, queues[i] if queues is not None else rank.queue_stats()))
        return out

    def take_kv_events(self) -> list[tuple[int, int, list[int]]]:
        out, self.kv_events = self.kv_events, []
        return out

    def take_exits(self) -> list[Request]:
        """Requests that completed inside the current run since the last call (applied by a
        ``sync``), in completion order; ``terminal_ms`` says when."""
        out, self.exits = self.exits, []
        return out

    def _next_exit_ms(self) -> float | None:
        """When the next completion inside the current run happens (not applied yet), if its end
        time is computed; None otherwise."""
        run = self._run
        if run is None or run.next_exit >= len(run.exit_passes):
            return None
        e = run.exit_passes[run.next_exit]
        return run.ends[e] if e < run.num_passes else None

    def exit_due(self, now_ms: float) -> bool:
        """Whether a completion inside the current run happens by ``now_ms`` (not applied yet)."""
        t = self._next_exit_ms()
        return t is not None and t <= now_ms

    @property
    def next_event_ms(self) -> float | None:
        """When this worker next changes what others see: the next completion inside its run,
        else its pass end; None when idle."""
        if not self.busy:
            return None
        t = self._next_exit_ms()
        return self.pass_end_ms if t is None else t

    def release_source(self, req: Request, now_ms: float | None = None) -> None:
        """Free a handed-off request's blocks (its transfer completed); ``now_ms`` (when
        given) is when, for the timeline."""
        self.ranks[req.rank].release_source(req, now_ms, self.busy)
        if self.timeline is not None and now_ms is not None:
            self._sample(now_ms)

    def _publish(self) -> list:
        """Move the ranks' recorded KV events to the published list (called at pass ends)."""
        if self.records_kv_events:
            for i, r in enumerate(self.ranks):
                ev = r.kv.events
                if ev:
                    self.kv_events.extend((i, kind, hashes) for kind, hashes in ev)
                    ev.clear()

    def publish_tiers(self, now_ms: float) -> None:
        """The KV tiers' events up to ``now_ms`` (an edge: the engine host reports to the
        router): the tiers are brought to ``now_ms`` and what they published since the last
        edge joins the KV events. So the router hears a tier's change at the first edge at or
        after it, however the ranks' passes were stepped or fast-forwarded, and a rank sharing a
        tier hears the other ranks' transfers whether it runs passes or not."""
        for i, r in enumerate(self.ranks):
            off = r.offload
            if off is not None and off.events is not None:
                off.advance(now_ms)
                if off.events:
                    self.kv_events.extend([(i, kind, payload) for kind, payload in off.events])
                    off.events.clear()

    def take_rejected(self) -> list[Request]:
        """Requests the ranks rejected at admission since the last call (they never run)."""
        out: list[Request] = []
        for r in self.ranks:
            if r.rejected:
                out.extend(r.rejected)
                r.rejected = []
        return out

    # -- passes ---------------------------------------------------------------------
    def start_if_idle(self, now_ms: float, horizon_ms: float | None = None,
                      hint_ms: float | None = None, hint_bounds: bool = False) -> tuple[float | None, list[Request]]:
        """If idle with work, start the next pass: (its end or None, requests rejected at admission)."""
        if self.busy or not self.has_work:
            return None, []
        end = self.start(now_ms, horizon_ms, hint_ms, hint_bounds)
        return end, self.take_rejected()

    def start(self, now_ms: float, horizon_ms: float | None = None, hint_ms: float | None = None,
              hint_bounds: bool = False) -> float | None:
        """Start the next pass (or run) at ``now_ms``; returns its end time, None if idle.

        ``horizon_ms``: when the next request is known to arrive here (a run's pass end times
        are computed up to it), None if unknown; ``hint_ms``: without one, the end of the
        caller's current step, before which no other request arrives when ``hint_bounds`` (end
        times are computed up to it), else seldom (no further than about it). Neither changes
        any result."""
        assert not self.busy
        if self._runs:
            run = self._plan_run(now_ms, horizon_ms, hint_ms, hint_bounds)
            if run is not None:
                self._run = run
                self.busy = True
                self.pass_start_ms = now_ms
                self.pass_end_ms = run.end_ms
                self.num_runs += 1
                if self.track_queue:
                    self._queue_now = [r.queue_stats() for r in self.ranks]
                if self.timeline is not None:
                    self._sample(now_ms)
                return self.pass_end_ms
        defer = self._interval > 1 and (self.num_passes % self._interval) != 0
        plans = [r.schedule(now_ms, defer) for r in self.ranks]
        duration = -1.0
        for p in plans:
            if p is not None and p.duration_ms > duration:
                duration = p.duration_ms
        if self.timeline is not None:
            self._sample(now_ms)  # also when nothing runs: rejections and preemptions changed the queues
        if duration < 0.0:
            if self._offload:
                return self._wait(now_ms)
            return None
        if self.track_queue:
            self._queue_now = [r.queue_stats() for r in self.ranks]
        self._plans = plans
        self.busy = True
        self.pass_start_ms = now_ms
        self.pass_end_ms = now_ms + duration
        return self.pass_end_ms

    def finish(self, now_ms: float, horizon_ms: float | None = None, hint_ms: float | None = None,
               hint_bounds: bool = False) -> list[Request]:
        """End the current pass/run at ``now_ms``; returns the requests that completed (in a run,
        also those that completed earlier in it and were not taken yet: their ``terminal_ms``
        says when). A run with more passes planned, and not cut short, goes on instead (the
        worker stays busy, ``pass_end_ms`` is its new end). ``horizon_ms``: when the next request
        is known to arrive here (the run is not cut short before it), None if unknown; ``hint_ms``
        and ``hint_bounds``: as for ``start``. Neither changes any result."""
        run = self._run
        if self._waits:
            self._waits = False
            self.busy = False
            return []
        if run is not None:
            if run.num_passes < run.num_planned and (horizon_ms is None or horizon_ms > now_ms):
                m = run.num_passes
                self._extend(run, horizon_ms, hint_ms, hint_bounds)
                if run.num_passes > m:  # (speculative segments may end the run where it is)
                    self.pass_end_ms = run.end_ms
                    return self.take_exits()
            if (self._joins and run.num_passes < run.bound and (horizon_ms is None or horizon_ms > now_ms)
                    and (hint_ms is None or hint_ms > now_ms)
                    and self._join(run, now_ms, horizon_ms, hint_ms, hint_bounds)):
                return self.take_exits()
            self._apply_run(run, run.num_passes, run.num_passes)
            completed = self.take_exits()
            self._close_run(run)
        else:
            completed = []
            start = self.pass_start_ms
            for rank, plan in zip(self.ranks, self._plans):
                if plan is not None:
                    rank.finish(plan, start, now_ms, self.gaps, completed)
            self._plans = None
            if self.records_kv_events:
                self._publish()
            self.num_passes += 1
            if not self.num_passes & 4095:  # (a run's segments check on their own)
                self.gaps.check()
        self.busy = False
        self._queue_last = self._queue_now
        if self.timeline is not None:
            self._sample(now_ms)
        return completed

    def _wait(self, now_ms: float) -> float | None:
        """Nothing to run, but a queued request waits for a KV tier transfer: wait until the tiers'
        next event (a transfer's end, or a shared link's rate change), None when none is due."""
        wake = float("inf")
        for off in self._offload:
            if off.loading:
                t = off.next_event_ms()
                if t < wake:
                    wake = t
        if wake == float("inf"):
            return None
        self._waits = True
        self.busy = True
        self.pass_start_ms = now_ms
        self.pass_end_ms = wake
        return wake

    def _close_run(self, run: DecodeRun) -> None:
        """Count an ended run's passes (applied up to its end) as the ranks' and the worker's."""
        last = self._run_pass_metrics(run, run.num_passes - 1)
        if run.drawn:  # (the bursts drawn past its end: the next stepped passes read them)
            for rank, batch, _, _, _ in run.ranks:
                run.segments[id(rank)].hand_over(batch, run.num_passes)
        for rank in self.ranks:
            rank.pass_count += run.num_passes
            rank.last_pass = last.get(id(rank), (0.0, 0, 0, 0, 0.0, 0, 0, 0.0))
        self._run = None
        self.num_passes += run.num_passes

    # -- timeline ---------------------------------------------------------------------
    def _sample(self, now_ms: float) -> None:
        """Append the current (waiting, running, KV blocks used), coalesced: a sample equal to
        the previous state is skipped; one at the previous sample's time replaces it (the last
        state at an instant wins) and is dropped when that restores the state before it."""
        r = self._rank
        if r is not None:  # (one rank: no sums)
            waiting, running, used = len(r.waiting), len(r.running), r.kv.num_active
        else:
            waiting = running = used = 0
            for r in self.ranks:
                waiting += len(r.waiting)
                running += len(r.running)
                used += r.kv.num_active
        times, ws, rs, ks = self.timeline
        n = len(times)
        if n and times[n - 1] == now_ms:
            n -= 1
            if n:
                same = ws[n - 1] == waiting and rs[n - 1] == running and ks[n - 1] == used
            else:
                same = waiting == 0 and running == 0 and used == 0  # the idle state before any sample
            if same:
                del times[n], ws[n], rs[n], ks[n]
            else:
                ws[n] = waiting
                rs[n] = running
                ks[n] = used
            return
        if n:
            if ws[n - 1] == waiting and rs[n - 1] == running and ks[n - 1] == used:
                return
        elif waiting == 0 and running == 0 and used == 0:
            return
        times.append(now_ms)
        ws.append(waiting)
        rs.append(running)
        ks.append(used)
        if self._spool is not None and n + 1 >= self._spool.limit:
            cut = n - 1  # (all but the last two samples)
            self._spool.append(times[:cut], ws[:cut], rs[:cut], ks[:cut])
            del times[:cut], ws[:cut], rs[:cut], ks[:cut]

    def export_timeline(self, role: str | None = None, end_ms: float | None = None,
                        as_bytes: bool = True) -> dict | None:
        """The timeline as plain data (``simulator.metrics.timeline.WorkerTimeline.from_plain``),
        None when not recorded. Columns are native-endian bytes of the arrays ('d' and 'q',
        msgpack-safe), or the arrays themselves (not copies) with ``as_bytes=False`` (a spooled
        timeline's: the spool's columns, every sample)."""
        tl = self.timeline
        if tl is None:
            return None
        cols = tuple(tl) if self._spool is None else self._spool.columns(*tl)  # (spilled: every sample)
        conv = (lambda a: a.tobytes() if isinstance(a, array) else np.asarray(a).tobytes()) if as_bytes \
            else (lambda a: a)
        times, waiting, running, used = (conv(c) for c in cols)
        return {
            "worker_id": self.worker_id,
            "role": role,
            "times_ms": times,
            "waiting": waiting,
            "running": running,
            "kv_blocks_used": used,
            "kv_blocks_total": self.kv_blocks_total,
            "start_ms": 0.0,
            "end_ms": end_ms,
        }

    def sync(self, now_ms: float, blocks_only: bool = False) -> None:
        """Apply a planned run's passes that started before / ended by ``now_ms``. ``blocks_only``:
        only what others read of them (their blocks, the KV events of those ended, completions):
        when no request leaves by then, the token counts and gaps wait for the next full sync or
        the run's end (applied then in one piece: the same values, in the same order)."""
        run = self._run
        if run is None:
            return
        ends = run.ends
        started = min(run.num_passes, bisect_left(ends, now_ms) + 1)
        # the last pass ends (with its completions) only through finish()
        done = min(run.num_passes - 1, bisect_right(ends, now_ms))
        if blocks_only and not run.drawn and run.joined is None:
            x = run.next_exit
            exits = run.exit_passes
            if x >= len(exits) or exits[x] >= done:  # (no completion by then)
                self._schedule_to(run, max(started, run.n_sched), done)
                return
        if started > run.n_sched or done > run.n_done:
            self._apply_run(run, max(started, run.n_sched), done)

    def router_unchanged(self, now_ms: float, watch) -> bool:
        """Whether ``sync(now_ms, blocks_only=True)`` may wait, for a router that reads only the
        blocks in ``watch`` (the prompts it routes next; a set, or anything with its
        ``isdisjoint``): a plain decode run with no completion by then, whose passes ended by
        ``now_ms`` evict none of them (a bound on their allocations against the free blocks,
        then the evictable ones in eviction order). A decode run stores only blocks holding
        generated tokens, which no prompt has, so the router's depths for the watched prompts
        are the same either way; the sync happens later, its KV events in the same order
        (docs/scale.md, "The KV router at many workers")."""
        run = self._run
        if run is None or not self._waits_for_router or run.joined is not None:
            return False
        done = min(run.num_passes - 1, bisect_right(run.ends, now_ms))
        x = run.next_exit
        exits = run.exit_passes
        if x < len(exits) and exits[x] < done:
            return False  # (a completion: the router hears it now)
        n = run.n_sched
        held = run.held_events
        if held is not None and done >= n:  # (the evictions of the pass in progress at the last sync)
            for _, kind, hashes in held:
                if kind == REMOVED and not watch.isdisjoint(hashes):
                    return False
        span = done - n
        if span <= 0:
            return True
        for rank, batch, _, _, _ in run.ranks:
            kv = rank.kv
            # each request takes at most one new block per block_size passes
            evict = len(batch) * ((span - 1) // kv.block_size + 1) - kv.num_free
            if evict > 0 and kv.evicts_any(evict, watch):
                return False
        return True

    # -- fast-forward ---------------------------------------------------------------
    def _plan_run(self, now_ms: float, horizon_ms: float | None, hint_ms: float | None,
                  hint_bounds: bool) -> DecodeRun | None:
        k = self.max_run_passes
        plans = []
        for rank in self.ranks:
            if not rank.running and not rank.waiting:
                continue
            plan = rank.plan_decode_run(k)
            if plan is None:
                return None
            k = min(k, plan[0])
            plans.append((rank, plan))
        if k < 2 or not plans:
            return None
        entries = []
        segments = {}
        for rank, (_, batch, c0, g0, known, remaining) in plans:
            if self._spec:  # (passes to completion: known as the bursts are drawn)
                entry = [rank, batch, c0, g0, [-1] * len(batch)]
                segments[id(rank)] = _SpecSegments(rank, entry, known, remaining, k)
            else:
                entry = [rank, batch, c0, g0, remaining[:]]  # (its own list: exits delete from it)
                segments[id(rank)] = _Segments(known, remaining, k)
            entries.append(entry)
        run = DecodeRun(now_ms, k, entries, segments, self._spec)
        self._extend(run, horizon_ms, hint_ms, hint_bounds)
        if not run.num_passes:  # (speculative segments found no pass to run: nothing was changed)
            return None
        return run

    def _extend(self, run: DecodeRun, horizon_ms: float | None, hint_ms: float | None = None,
                hint_bounds: bool = False) -> None:
        """Compute the end times of the run's next passes: up to the one in progress at
        ``horizon_ms`` (the next known input) when known, else at ``hint_ms`` when it bounds
        the inputs not known yet (``hint_bounds``: with ``edges_watched``, at least as many as so
        far); else as many as so far (at least 32), and with a hint no further than about it. The
        results do not depend on the chunks (each end is the previous end plus its duration)."""
        ends = run.ends
        m = run.num_passes
        start = run.start_ms
        last = ends[-1] if ends else start
        # no input comes before the target: the passes up to the one in progress then are kept
        target = horizon_ms if horizon_ms is not None else hint_ms if hint_bounds else None
        if target is not None and (horizon_ms is not None or target > last):
            # a short first chunk while the pass rate is not known (runs are often cut a few
            # passes in, and each pass computed costs its segments), then about as many as
            # reach the target at the mean pass time so far
            upto = _passes_to_reach(target, m, start, last) if m and target > last > start else m + 8
            if horizon_ms is None and self.edges_watched and upto < 2 * m:
                # the hint bounds the inputs up to it, not past it: beyond it the chunks grow
                # geometrically as below (a router reading worker state steps the hosts from
                # arrival to arrival; a run extended just past each would be extended at each)
                upto = 2 * m
        else:
            # an input nobody knows of yet may cut the run anywhere: what is computed past the
            # cut is lost, so the chunks grow geometrically (at most about as many lost as kept)
            target = None
            upto = m + max(32, m)
            if hint_ms is not None and m and hint_ms > last > start:
                upto = min(upto, _passes_to_reach(hint_ms, m, start, last))
        if run.drawn:  # (speculative segments draw a block of passes for a fixed cost: a long one)
            want = min(_SPEC_CHUNK // run.batch_size, *[s.horizon() for s in run.segments.values()])
            if target is not None and not m:  # (about as many as reach the target at the first pass's pace)
                first = max(run.segments[id(e[0])].first_pass_ms(e[0]) for e in run.ranks)
                if first > 0:  # (twice as many: later passes are slower, and a second block costs more)
                    want = min(want, 2 * int((target - start) / first) + 16)
            upto = max(upto, m + max(16, want))
        while True:
            upto = min(upto, run.num_planned)
            if run.drawn:
                for entry in run.ranks:
                    segs = run.segments[id(entry[0])]
                    segs.build(upto)
                    if segs.k < run.num_planned:  # (a completion or the blocks end it: _SpecSegments.build)
                        run.num_planned = segs.k
                        run.bound = min(run.bound, segs.k)
                        upto = min(upto, segs.k)
                if upto <= m:
                    break
            durations = None
            exits = None
            for entry in run.ranks:
                rank = entry[0]
                segs = run.segments[id(rank)]
                if not run.drawn:
                    segs.build(upto)
                d = segs.durations(rank, m, upto)
                durations = d if durations is None else list(map(max, durations, d))
                exits = segs.exits if exits is None else sorted(set(exits) | set(segs.exits))
            run.exit_passes = exits
            durations[0] += ends[-1] if ends else run.start_ms
            ends.extend(accumulate(durations))  # sequential sums: end = previous end + duration
            m = upto
            if target is None or ends[-1] >= target or m >= run.num_planned:
                break
            last = ends[-1]
            upto = _passes_to_reach(target, m, start, last) if last > start else 2 * m
        run.num_passes = m

    def _schedule_run_passes(self, run: DecodeRun, upto: int) -> None:
        """Schedule-time effects (block allocation, registration) of passes < ``upto``."""
        if run.drawn:
            for rank, batch, c0, _, _ in run.ranks:
                rank.grow_run(batch, c0, run.segments[id(rank)].advanced_all(upto))
            return
        if upto - run.n_sched >= SCAN_PASSES:  # (many requests due: a scan of each batch)
            run.blocks = None
            for rank, batch, c0, _, _ in run.ranks:
                rank.grow_run(batch, c0, upto)
            return
        blocks = run.blocks
        if blocks is None:
            blocks = run.blocks = [rank.run_blocks(batch, c0) for rank, batch, c0, _, _ in run.ranks]
        for b in blocks:
            b.grow(upto)

    def _apply_run(self, run: DecodeRun, sched_upto: int, done_upto: int) -> None:
        """Apply the run's passes up to ``sched_upto`` started and ``done_upto`` ended, in time
        order: a completion inside the run frees its blocks before the next pass allocates."""
        done_before = run.n_done
        exits = run.exit_passes
        x = run.next_exit
        # up to each completion (and the joined request's first and second token): the passes'
        # blocks and gaps, and the leaving (joining) requests' state
        while True:
            e = exits[x] if x < len(exits) and exits[x] < done_upto else None
            j = run.joined
            if j is not None and j[0] < done_upto and (e is None or j[0] <= e):
                self._joined(run)
                continue
            if e is None:
                break
            self._advance(run, e + 1, e + 1)
            self._exit(run, e)
            x += 1
            run.next_exit = x
        self._advance(run, sched_upto, done_upto)
        if run.n_done > done_before:  # the staying requests' state, once
            self._set_members(run, run.n_done)

    def _join(self, run: DecodeRun, now_ms: float, horizon_ms: float | None, hint_ms: float | None,
              hint_bounds: bool) -> bool:
        """At the end of a run cut by an input, when that input is the only waiting request and
        its KV was transferred (the prompt is computed but its last token): the run ends and a new
        one starts at once with the pass a general scheduling would start now (the batch decoding,
        the request admitted for its one token, which emits its first token) as its first pass and
        the request a member of the batch from its second, instead of that general pass and a new
        plan. The same admission, pass shape and duration, blocks and completions as those
        (tested against stepping); False (the run ends as before) when any condition fails."""
        rank = self.ranks[0]
        waiting = rank.waiting
        if len(waiting) != 1 or rank.first_tokens is not None or rank.policy.pending:
            return False  # (a destination waiting for blocks: the next run must end at a completion)
        req = waiting[0]
        limit = rank.context_limit
        if (not req.materialized or req.num_generated or req.max_output < 2 or req.prompt_len + 1 >= limit
                or rank._never_fits(req)):
            return False
        m = run.num_passes
        # the run up to now: its completions by then, the batch's blocks for the next pass (what a
        # general pass would grow first; it finds them there when this returns False)
        self._apply_run(run, m + 1, m)
        _, batch, c0, g0, remaining = run.ranks[0]
        n = len(batch)
        cfg = rank.config
        if not n or n >= cfg.max_sequences or n >= cfg.max_batched_tokens:
            return False
        known = req.prompt_len
        fit = rank._fit(req, known)
        if fit is None or not rank._admit(req, fit, known - 1, 1, now_ms):
            return False
        decode_kv = sum([r.prompt_len + r.num_generated for r in batch])
        if req.prefill_done:  # (handed off by a prefill worker: its one token is a decode step)
            shape = PassShape(0, 0, 0, 0, n + 1, decode_kv + known, rank.total_kv_tokens)
        else:
            shape = PassShape(1, 1, known, known - 1, n, decode_kv, rank.total_kv_tokens)
        self._close_run(run)
        # the new run: the batch's counts from now, the request's as if it had been in it (one
        # token computed and one generated after the first pass)
        batch = batch + [req]
        c0 = [c + m for c in c0] + [known - 1]
        g0 = [g + m for g in g0] + [0]
        remaining = [r - m for r in remaining] + [min(req.max_output, limit - known)]
        # as far as a run planned after the first pass would go (blocks free or evictable now)
        k = rank.blocks_bound([c + 1 for c in c0], [r - 1 for r in remaining],
                              min(self.max_run_passes, max(remaining) - 1))
        planned = 1 + max(k, 0)
        segs = _Segments([r.prompt_len + g for r, g in zip(batch, g0)], remaining, planned)
        nxt = DecodeRun(now_ms, planned, [[rank, batch, c0, g0, remaining[:]]], {id(rank): segs})
        nxt.batch_size = n  # (the request decodes from the second pass)
        nxt.ends.append(now_ms + rank.timing.pass_ms(shape))
        nxt.num_passes = nxt.n_sched = 1  # (the first pass's blocks are there)
        nxt.joined = (0, req, 0 if req.prefill_done else 1)
        self._run = nxt
        self.num_runs += 1
        self.pass_start_ms = now_ms
        if planned > 1:
            self._extend(nxt, horizon_ms, hint_ms, hint_bounds)
        else:
            segs.build(1)
            nxt.exit_passes = segs.exits
        self.pass_end_ms = nxt.end_ms
        return True

    def _joined(self, run: DecodeRun) -> None:
        """Apply the joined request's next step: pass 0 (its prompt's last token) ended with its
        first token, then pass 1 (its first decode pass) with its second."""
        j, req, prefill = run.joined
        self._advance(run, j + 1, j + 1)
        if prefill is not None:
            if prefill:
                req.prefill_done = True
                self.ranks[0].committed_prefill_tokens += 1
            req.first_token_ms = run.ends[j]
            run.batch_size += 1
            run.joined = (j + 1, req, None)
        else:
            req.second_token_ms = run.ends[j]
            run.joined = None

    def _exit(self, run: DecodeRun, e: int) -> None:
        """The requests whose last pass is ``e`` complete (their blocks are released) and leave the batch."""
        end = run.ends[e]
        left = e + 1
        for rank, batch, c0, g0, remaining in run.ranks:
            num = remaining.count(left)  # (the scans at C speed: a batch is long, its leavers few)
            if not num:
                continue
            at = []
            i = -1
            for _ in range(num):
                i = remaining.index(left, i + 1)
                at.append(i)
            leaving = []
            for i in at:
                req = batch[i]
                req.num_computed = c0[i] + left
                req.num_generated = g0[i] + left
                req.last_token_ms = end
                req.status = COMPLETED
                req.terminal_ms = end
                leaving.append(req)
            if run.drawn:  # (each advanced its own tokens: all it had left)
                run.segments[id(rank)].leave(leaving, at, left, c0, g0)
            rank.release_completed(leaving, self.exits)
            for i in reversed(at):  # (the entry's own lists: see DecodeRun)
                del batch[i], c0[i], g0[i], remaining[i]
        run.batch_size = sum(len(entry[1]) for entry in run.ranks)
        if self.timeline is not None:
            self._sample(end)

    def _set_members(self, run: DecodeRun, b: int) -> None:
        """The batch's requests as they are after the run's first ``b`` passes."""
        last_end = run.ends[b - 1]
        if run.drawn:  # (each advanced its own tokens)
            for rank, batch, c0, g0, _ in run.ranks:
                run.segments[id(rank)].set_members(batch, c0, g0, b, last_end)
            return
        for _, batch, c0, g0, _ in run.ranks:
            for req, c, g in zip(batch, c0, g0):
                req.num_computed = c + b
                req.num_generated = g + b
                req.last_token_ms = last_end

    def _advance(self, run: DecodeRun, sched_upto: int, done_upto: int) -> None:
        """Apply passes up to ``sched_upto`` started and ``done_upto`` ended, no request leaving:
        blocks, gaps and token counts (the batch's requests' own state is ``_set_members``')."""
        self._schedule_to(run, sched_upto, done_upto)
        self._account(run, done_upto)

    def _schedule_to(self, run: DecodeRun, sched_upto: int, done_upto: int) -> None:
        """The schedule-time effects (blocks) of passes up to ``sched_upto`` started; their KV
        events publish when they end (those up to ``done_upto`` have)."""
        if self.records_kv_events:
            if run.held_events is not None and done_upto >= run.n_sched:
                self.kv_events.extend(run.held_events)
                run.held_events = None
            if done_upto > run.n_sched:
                self._schedule_run_passes(run, done_upto)
                run.n_sched = done_upto
                self._publish()
            if sched_upto > run.n_sched:
                self._schedule_run_passes(run, sched_upto)
                run.n_sched = sched_upto
                held, self.kv_events = self.kv_events, []
                self._publish()
                run.held_events, self.kv_events = self.kv_events, held
        elif sched_upto > run.n_sched:
            self._schedule_run_passes(run, sched_upto)
            run.n_sched = sched_upto

    def _account(self, run: DecodeRun, done_upto: int) -> None:
        """Gaps and token counts of the passes up to ``done_upto`` ended (their blocks scheduled)."""
        a, b = run.n_done, done_upto
        if b <= a:
            return
        ends = run.ends
        gaps = self.gaps
        start = run.start_ms
        first_end = ends[0]
        pooled0 = 0
        if a == 0:  # the run's first pass: each request's gap since its last token before the run
            joining = run.joined[1] if run.joined is not None else None  # (its first token: no gap)
            for _, batch, _, g0, _ in run.ranks:
                for req, g in zip(batch, g0):
                    if req is joining:
                        continue
                    if req.last_token_ms == start:
                        pooled0 += 1
                    else:
                        gaps.individual.append(first_end - req.last_token_ms)
                    if g == 1:
                        req.second_token_ms = first_end
        if run.drawn:
            zeros = 0
            for rank, batch, _, _, _ in run.ranks:
                t = run.segments[id(rank)].tokens(a, b)
                rank.num_generated_tokens += t
                zeros += t - len(batch) * (b - a)  # (a burst's tokens after its first: 0 ms gaps)
            if zeros:
                gaps.pooled_values.append(0.0)
                gaps.pooled_weights.append(zeros)
        else:
            for rank, batch, _, _, _ in run.ranks:
                rank.num_generated_tokens += len(batch) * (b - a)
        if pooled0:
            gaps.pooled_values.append(first_end - start)
            gaps.pooled_weights.append(pooled0)
        lo = a if a > 0 else 1
        if b > lo:
            gaps.add_segment(ends[lo - 1 : b], run.batch_size)
        run.n_done = b


class _Segments:
    """One rank's stretches of passes with the same batch in a run (a request leaves after its
    ``remaining``-th pass), built as far as the run's end times are computed. ``entries``: (first
    pass a, batch size n, s, variance of the sequence lengths at pass a), where the batch's KV
    tokens at pass j are ``s + n * j`` (exact integer sums: the same numbers a run started at
    pass a would compute); ``exits``: the passes after which requests leave, ascending."""

    __slots__ = ("known", "remaining", "order", "k", "i", "s1", "s2", "n", "entries", "exits", "cursor")

    def __init__(self, known: list[int], remaining: list[int], k: int) -> None:
        self.known = known
        self.remaining = remaining
        self.order = sorted(range(len(known)), key=remaining.__getitem__)
        self.k = k
        self.i = 0
        self.s1 = sum(known)
        self.s2 = sum([x * x for x in known])
        self.n = len(known)
        self.entries: list[tuple] = []
        self.exits: list[int] = []
        self.cursor = 0  # the entry covering the first pass whose duration was last asked for
        self._add(0)

    def _add(self, a: int) -> None:
        n, s1 = self.n, self.s1
        s = s1 + n * a  # sum of (x + a)
        sq = self.s2 + 2 * a * s1 + n * a * a  # sum of (x + a)^2
        self.entries.append((a, n, s1, sq / n - (s / n) ** 2))

    def build(self, upto: int) -> None:
        """Entries and exits for every pass below ``upto``."""
        order, remaining, known = self.order, self.remaining, self.known
        while self.n and (not self.exits or self.exits[-1] < upto - 1):
            nxt = remaining[order[self.i]]
            if nxt > self.k:
                break
            while self.i < len(order) and remaining[order[self.i]] == nxt:
                x = known[order[self.i]]
                self.s1 -= x
                self.s2 -= x * x
                self.n -= 1
                self.i += 1
            self.exits.append(nxt - 1)
            if self.n and nxt < self.k:
                self._add(nxt)

    def metrics(self, j: int) -> tuple:
        """(batch size, KV tokens, variance of the sequence lengths) of pass j."""
        segs = self.entries
        i = len(segs) - 1
        while segs[i][0] > j:
            i -= 1
        _, n, kv, var = segs[i]
        return n, kv + j * n, var

    def durations(self, rank, m: int, upto: int) -> list[float]:
        """Durations of the rank's passes ``m`` to ``upto`` (exclusive)."""
        out: list[float] = []
        timing = rank.timing
        total = rank.total_kv_tokens
        segs = self.entries
        num = len(segs)
        i = self.cursor  # (a run asks for its passes in order)
        while i + 1 < num and segs[i + 1][0] <= m:
            i += 1
        self.cursor = i
        while i < num:
            a, n, s, _ = segs[i]
            if a >= upto:
                break
            i += 1
            b = segs[i][0] if i < num else upto
            lo = a if a > m else m
            hi = b if b < upto else upto
            if lo < hi:
                out.extend(timing.decode_run_ms(n, s + n * lo, total, hi - lo))
        return out


class _SpecSegments:
    """``_Segments`` of a rank with speculative decoding: request i advances ``T[j, i]`` tokens in
    the run's first j passes (its bursts, drawn for a block of passes at once from the requests'
    acceptance streams: ``actors.engine.speculation.accepted_from``, the numbers stepping draws),
    so the batch's KV tokens grow unevenly and a request leaves after the pass at which ``T``
    reaches its ``remaining`` tokens. ``build`` draws the passes as the run's end times are
    computed and lowers ``k`` where stepping would do otherwise: at the first completion when
    something waits, before a pass whose blocks are not free or evictable now, and where the
    rank's batch is empty (the entry's ``remaining`` learns each request's passes as they are
    drawn; ``T`` is ``buf``). Per pass: batch size and KV tokens; ``F``: the sums of ``T`` by pass
    (tokens emitted); the variance of a pass's lengths when asked for. (Arrays are passes x
    requests.)"""

    __slots__ = ("spec", "entry", "reqs", "live_rows", "known_list", "R", "R_list", "c", "h", "p0_list", "bases",
                 "s0", "avail", "bs", "stop_first", "k", "buf", "built", "n_pass", "kv", "F", "exits", "known_live", "R_gone")

    def __init__(self, rank, entry: list, known: list[int], remaining: list[int], k: int) -> None:
        batch = entry[1]
        self.spec = rank.config.speculation
        self.entry = entry
        self.reqs = list(batch)  # (row i: the plan's i-th request)
        self.live_rows = list(range(len(batch)))  # (the entry's batch, in its order, as rows: exits delete)
        self.known_list = known
        self.R = np.array(remaining, dtype=np.int64)
        self.R_list = remaining
        self.c = entry[2]  # (lists: arrays when the blocks are checked, rarely)
        self.h = [r.num_held + r.num_private for r in batch]
        self.p0_list = [r.spec_passes for r in batch]
        self.bases = block_bases([stream_of(self.spec, r) for r in batch], self.p0_list)  # (the streams at the run's first pass)
        self.s0 = [r.spec_tokens for r in batch]
        self.avail = rank.kv.num_reclaimable
        self.bs = rank.config.block_size
        self.stop_first = bool(rank.waiting or rank.policy.pending)
        self.k = k
        self.buf = None  # T's rows 0 .. built and more (the first block's; later blocks append)
        self.built = 0
        self.n_pass: list[int] = []
        self.kv: list[int] = []
        self.F: list[int] = [0]
        self.exits: list[int] = []
        self.known_live = sum(known)  # (the known tokens of those still in the batch after the built passes)
        self.R_gone = 0  # (the remaining tokens of those gone)

    def build(self, upto: int) -> None:
        a = self.built
        upto = min(upto, self.k)
        if upto <= a:
            return
        w = upto - a
        R = self.R
        known, rest = self.known_list, self.R_list
        # T's rows a .. upto: the tokens each request advanced before the block, then its bursts summed
        T = np.empty((w + 1, len(rest)), dtype=np.int64)
        if a:
            accepted_from(self.spec, advance_bases(self.bases, a), w, 1, out=T[1:])
            T[0] = self.buf[a]
            live = T[0] < R  # (the batch at pass a)
            n_live = int(np.count_nonzero(live))
        else:  # (the run's first block: T is 0 and every request has tokens left)
            accepted_from(self.spec, self.bases, w, 1, out=T[1:])
            T[0] = 0
            live = None
            n_live = len(rest)
        np.cumsum(T, axis=0, out=T)
        np.minimum(T, R, out=T)
        stop = w if n_live else 0
        # blocks: pass a + j takes what c + T[a + j + 1] tokens need beyond the blocks held at the start
        # (at most verify tokens a pass each: nothing to check while that fits for every request)
        if len(R) * (self.spec.verify_tokens * upto // self.bs + 1) > self.avail:
            c, h = np.array(self.c, dtype=np.int64), np.array(self.h, dtype=np.int64)
            need = np.maximum(-(-(c + T[1:]) // self.bs) - h, 0).sum(axis=1)
            over = np.flatnonzero(need > self.avail)
            if len(over) and over[0] < stop:
                stop = int(over[0])
        # those reaching their R in the block (T only grows), each leaving after the pass (from a) ``col``
        out = T[w] >= R
        rows = np.flatnonzero(out if live is None else out & live)
        leavers = []
        if len(rows):
            cols = (T[1:, rows] >= R[rows]).argmax(axis=0)
            leavers = sorted(zip(cols.tolist(), rows.tolist()))
            if self.stop_first and leavers[0][0] + 1 < stop:
                stop = leavers[0][0] + 1
        # the batch at each pass's start: its size and KV tokens (T's sums + the live's known - the gone's
        # R); one leaving before the block's last pass leaves both from the pass after its last
        if stop:
            sums = np.einsum("ij->i", T[:stop + 1])  # (tokens advanced before passes a .. a + stop; einsum: a faster row sum)
            n_pass: list[int] = []
            off = self.known_live - self.R_gone
            offs = [off]  # (the offset from each leaver's pass on: the batch's size steps down with it)
            steps = []
            n = n_live
            p = 0
            for col, row in leavers:
                if col >= stop - 1:
                    break
                q = col + 1
                n_pass += [n] * (q - p)
                steps.append(q - p)
                n -= 1
                off -= known[row] + rest[row]
                offs.append(off)
                p = q
                if not n:  # (the batch emptied: the run ends where it did)
                    stop = q
                    break
            if n:
                n_pass += [n] * (stop - p)
                steps.append(stop - p)
            else:
                del offs[-1]
            self.n_pass += n_pass
            self.kv += (sums[:stop] + (np.repeat(offs, steps) if len(offs) > 1 else offs[0])).tolist()
            self.F += sums[1:stop + 1].tolist()
        if stop < w:
            self.k = a + stop
        if not a:
            self.buf = T  # (the rows past ``built`` are never read)
        elif stop:
            self.buf = np.concatenate((self.buf[:a + 1], T[1:]))
        if stop and leavers:
            batch, remaining = self.entry[1], self.entry[4]
            reqs = self.reqs
            whole = len(batch) == len(reqs)  # (nobody left the batch yet: its positions are the rows)
            for col, row in leavers:
                if col >= stop:
                    break
                remaining[row if whole else batch.index(reqs[row])] = a + col + 1
                self.known_live -= known[row]
                self.R_gone += rest[row]
                if not self.exits or self.exits[-1] != a + col:
                    self.exits.append(a + col)
        self.built = a + stop

    def first_pass_ms(self, rank) -> float:
        """The duration of the run's first pass here (before any is built: an estimate's basis)."""
        return rank.timing.decode_ms(len(self.R_list), sum(self.known_list), rank.total_kv_tokens)

    def horizon(self) -> int:
        """Passes the run may still take here (from those built): up to the first completion when
        something waits, else the last, at the mean burst (+25%, +4; never more than at one token a
        pass). Only sizes the next block: a completion later than this costs another block."""
        if self.built >= self.k:
            return 0
        if self.built:
            left = self.R - self.buf[self.built]
            left = left[left > 0]
            if not len(left):
                return 0
            n = int(left.min() if self.stop_first else left.max())
        else:  # (none built: every request has its remaining tokens left, all > 0)
            n = min(self.R_list) if self.stop_first else max(self.R_list)
        return min(n, int(n / (1.0 + self.spec.mean_accepted) * 1.25) + 4)

    def metrics(self, j: int) -> tuple:
        n, kv = self.n_pass[j], self.kv[j]
        sq = sum([(x + t) * (x + t) for x, t, r in zip(self.known_list, self.buf[j].tolist(), self.R_list) if t < r])
        return n, kv, sq / n - (kv / n) ** 2

    def durations(self, rank, m: int, upto: int) -> list[float]:
        out: list[float] = []
        timing = rank.timing
        total = rank.total_kv_tokens
        n_pass = self.n_pass
        j = m
        while j < upto:
            n = n_pass[j]
            # (the batch only shrinks in a run: the first pass after j with fewer requests)
            e = bisect_right(n_pass, -n, j + 1, upto, key=neg)
            out.extend(timing.decode_passes_ms(n, self.kv[j:e], total))
            j = e
        return out

    def advanced_all(self, j: int) -> list[int]:
        """The tokens each request of the entry's batch as it is now advanced in the run's first j passes."""
        row = self.buf[j].tolist()
        live = self.live_rows
        return row if len(live) == len(row) else [row[i] for i in live]

    def leave(self, reqs: list, at: list[int], j: int, c0: list[int], g0: list[int]) -> None:
        """``reqs`` (the entry's batch positions ``at``, ascending) completed at the run's j-th pass,
        each having advanced all the tokens it had left (``R``, where ``build`` found them leaving):
        their token counts and speculative counters; the entry's batch loses them."""
        live, rest, p0, s0 = self.live_rows, self.R_list, self.p0_list, self.s0
        for req, i in zip(reqs, at):
            row = live[i]
            t = rest[row]
            req.num_computed = c0[i] + t
            req.num_generated = g0[i] + t
            req.spec_passes = p0[row] + j  # (its own passes: it ran in all j)
            req.spec_tokens = s0[row] + t
        for i in reversed(at):
            del live[i]

    def set_members(self, batch: list, c0: list[int], g0: list[int], j: int, last_ms: float) -> None:
        """The entry's batch (``c0``, ``g0``: its counts before the run) as it is after the run's
        first j passes, its last token at ``last_ms``."""
        T = self.buf[j].tolist()
        p0, s0 = self.p0_list, self.s0
        for req, c, g, row in zip(batch, c0, g0, self.live_rows):
            t = T[row]
            req.num_computed = c + t
            req.num_generated = g + t
            req.spec_passes = p0[row] + j
            req.spec_tokens = s0[row] + t
            req.last_token_ms = last_ms

    def hand_over(self, batch: list, j: int) -> None:
        """Give the entry's batch, still running after the run's j passes, the bursts drawn for its
        passes j .. built - 1 (``Request.spec_ahead``: the numbers ``draw_ahead`` would draw, the
        tokens left clipping them as a stepped lead does), so that stepping reads them."""
        k = self.built
        if k <= j or not batch:
            return
        cols = np.diff(self.buf[j:k + 1], axis=0).T.tolist()
        p0 = self.p0_list
        for req, row in zip(batch, self.live_rows):
            p = p0[row] + j
            req.spec_ahead = cols[row]
            req.spec_ahead_at = p
            req.spec_ahead_end = p + k - j

    def tokens(self, a: int, b: int) -> int:
        """Tokens the rank's batch emitted in passes a .. b - 1."""
        return self.F[b] - self.F[a]
