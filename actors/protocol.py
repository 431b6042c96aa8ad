"""The coordinator <-> engine host and router host protocol, and the same-time phases.

Every message is a NamedTuple: built by name, read by position in the hot loops (a record that
crossed msgpack comes back as a plain list in the same field order: the wire form is the field
order). ``Phase`` is the one same-time order the coordinator, the hosts and docs/architecture.md
share. The Planner's messages are in ``actors.messages``.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple


class Phase(IntEnum):
    """The same-time order of a replay: at one instant everything of a lower phase happens first;
    inside a phase, ties go by stable identity (worker id, transfer ordinal, request index). The
    coordinator's ``_edge`` runs its phases in this order and the hosts stamp their events and
    inputs with it."""

    PASS_END = 0  # passes end: completions, first tokens, handoffs, drain settlements (by worker id)
    HANDOFF = 1  # handed-off prompts are placed on decode workers (coordinator)
    READY = 2  # workers that finished starting become ready (coordinator)
    TRANSFER = 3  # KV transfers complete: the source releases, then the destination admits (by ordinal)
    ARRIVAL = 4  # arrivals are routed and enqueued (by request index)
    TICK = 5  # the Planner's tick (coordinator)
    SETTLE = 99  # idle workers with work start their next pass (by worker id); admission rejections


class Op(IntEnum):
    """A timed input's operation (sorts after (time, phase, id): a release precedes the matching enqueue)."""

    RELEASE = 0  # payload: the handed-off request's index (its transfer completed)
    ENQUEUE = 1  # payload: the request; with ``rank`` and ``transferred``


class EventKind(IntEnum):
    FIRST_TOKEN = 0  # payload: the request index
    TERMINAL = 1  # payload: the request (completed or rejected)
    HANDOFF = 2  # payload: the request (a prefill worker finished its prompt)
    DRAINED = 3  # payload: the worker id (a draining worker holds nothing any more)
    RESERVED = 4  # payload: [transfer id, prompt tokens to transfer] (a reserving destination reserved its blocks)


class UpdateKind(IntEnum):
    """What a router update tells the router host."""

    KV = 0  # ``KvUpdate``: blocks stored or removed on a worker rank
    FIRST_TOKEN = 1  # ``RequestUpdate``: a request's first token (its prefill load is gone)
    RELEASE = 2  # ``RequestUpdate``: a request left its worker
    PARAMS = 3  # ``ParamsUpdate``: the router's knobs from now on (retune)
    HANDED_OFF = 4  # ``RequestUpdate``: a prefill worker handed the request off (first token, then release)


class HostInput(NamedTuple):
    """A timed input to an engine host, applied in (at_ms, phase, source_id, op) order."""

    at_ms: float
    phase: int  # Phase.ARRIVAL or Phase.TRANSFER
    source_id: int  # request index (arrival) or transfer ordinal
    op: int  # Op
    worker_id: int
    payload: object  # ENQUEUE: the Request (direct host) or its wire form; RELEASE: the request's index
    rank: int = 0  # ENQUEUE: the attention-data rank that admits the request
    transferred: bool = False  # ENQUEUE: the prompt's KV arrived from a prefill worker (admitted as computed)


class Control(NamedTuple):
    """A control message to an engine host, applied before its inputs."""

    op: str  # "spawn" (a new worker of ``pool``) | "drain" (report when it holds nothing)
    worker_id: int
    pool: str | None = None


class HostEvent(NamedTuple):
    """An engine host's output event; the coordinator applies them in (at_ms, phase, source_id, seq) order."""

    at_ms: float
    phase: int  # Phase.PASS_END, Phase.TRANSFER or Phase.SETTLE
    source_id: int  # worker id (pass end, settle) or transfer ordinal
    seq: int  # the host's emission order (ties)
    kind: int  # EventKind
    payload: object


class WorkerStatus(NamedTuple):
    """What the coordinator keeps of a worker between steps (it picks edges from it)."""

    worker_id: int
    busy: bool  # a pass is running
    has_work: bool  # requests waiting or running
    next_event_ms: float | None  # the running pass's (or run's next) end
    held: int  # handed-off requests whose KV it still holds
    pending: int  # inputs sent to it not applied yet


class HostOutput(NamedTuple):
    """What ``WorkerHost.step`` and ``deliver`` return."""

    events: list  # HostEvent
    kv: list  # KvUpdate per worker with KV events, addressed to its pool's router
    status: list  # WorkerStatus of every worker whose status may have changed
    reached: float | None  # where the step ended (None from deliver)
    fpm: list | None = None  # (worker id, its ranks' Fpm) per worker, from deliver


class WorkerTotals(NamedTuple):
    worker_id: int
    prefill_tokens: int  # committed prefill tokens
    generated_tokens: int
    preemptions: int
    passes: int
    runs: int  # fast-forwarded decode runs
    gaps: object  # the worker's GapSink (or its wire form)
    offload: list | None = None  # per rank, its KV tier counters (RankOffload.report), None without tiers


class HostFinish(NamedTuple):
    """What ``WorkerHost.finish`` returns."""

    leftover: list  # (worker id, requests still in it) per worker
    totals: list  # WorkerTotals per worker
    timelines: list  # per worker its recorded timeline as plain data, or None


class ReserveQuery(NamedTuple):
    """A handed-off request's destination, asked to reserve its blocks before the transfer."""

    worker_id: int
    rank: int
    request: object  # the Request (direct host) or its wire form
    transfer: int  # the transfer id (RESERVED events name it when a waiting reservation succeeds)


class PrefixQuery(NamedTuple):
    worker_id: int
    rank: int
    hashes: object
    limit: int  # blocks at most


class RouteCall(NamedTuple):
    """One request to route, against the eligible worker list ``eligible_ref`` of its batch."""

    pool: str
    index: int
    prompt_len: int
    hashes: object  # block hashes when the router reads worker state, else None
    at_ms: float
    eligible_ref: int


class RouteDecision(NamedTuple):
    worker_id: int
    rank: int
    info: object  # what the policy reports about its choice (routing records)


class KvUpdate(NamedTuple):
    """A worker's KV events since its last ones, in order: an engine host emits them, the
    coordinator forwards them to the router as they are."""

    pool: str  # the worker's pool (which router hears them)
    tag: int  # UpdateKind.KV
    worker_id: int
    events: list  # (rank, kind, hashes) each: the KV cache's event kind (stored | removed) and the
    # blocks' hashes (a view, or bytes over msgpack); a host tier's (HOST_STORED / HOST_REMOVED) carry
    # u64 payloads naming stretches by identity (actors.engine.offload.HostTier.stored / _publish)


class RequestUpdate(NamedTuple):
    pool: str
    tag: int  # UpdateKind.FIRST_TOKEN | RELEASE | HANDED_OFF
    index: int


class ParamsUpdate(NamedTuple):
    pool: str
    tag: int  # UpdateKind.PARAMS
    knobs: dict


def host_output_from_wire(data) -> HostOutput:
    """A ``HostOutput`` that crossed msgpack (a list in field order). Its statuses become
    ``WorkerStatus`` again (the coordinator keeps them); events and KV events stay lists, read by
    position."""
    events, kv, status, reached, fpm = data
    return HostOutput(events, kv, [WorkerStatus._make(st) for st in status], reached, fpm)


def host_finish_from_wire(data) -> HostFinish:
    return HostFinish(*data)
