"""Per-request engine state.

One invariant drives the scheduler (as in vLLM v1): ``num_computed`` catches up with
the known tokens (prompt + generated). While ``prefill_done`` is false the request is
(re)computing its known tokens in chunks; the pass that computes the last of them emits a
token. After that each pass computes the one token sampled last pass and emits another.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Protocol

from aisim.actors.hashing import hash_view

# lifecycle states
WAITING = 0
RUNNING = 1
COMPLETED = 2
REJECTED = 3
HANDED_OFF = 4  # prefill done on a prefill worker; its KV is held there until transferred

# why a request was rejected at admission (``Request.reject_reason``; set by the scheduler)
REJECT_CONTEXT_LENGTH = "context_length"  # prompt >= the context length
REJECT_KV_CAPACITY = "kv_capacity"  # the prompt alone needs more KV blocks than the rank's cache holds
REJECT_BATCH_TOKENS = "max_batched_tokens"  # chunked prefill off and the prompt exceeds one pass's tokens
REJECT_UNKNOWN = "unknown"  # not expected: a rejection none of the checks explains


class HashSource(Protocol):
    """Gives the chained block hashes of a request's full sequence (prompt + output): ideally as
    ``actors.hashing.hash_view`` makes them (any sequence of ints is converted)."""

    def block_hashes(self, index: int, block_size: int) -> Sequence[int]: ...


class Request:
    """A request as the engine, router and metrics see it (plain mutable record)."""

    __slots__ = (
        "index",
        "source",
        "arrival_ms",
        "prompt_len",
        "max_output",
        "session_id",
        "turn_index",
        # engine progress
        "num_computed",
        "num_generated",
        "prefill_done",
        "hashes",
        "hash_block_size",
        "held",
        "num_held",
        "dup_tail",
        "num_full_registered",
        "num_private",
        "status",
        "worker",
        "rank",
        # times
        "dispatched_ms",
        "first_admit_ms",
        "first_token_ms",
        "second_token_ms",
        "last_token_ms",
        "terminal_ms",
        # cache / admissions
        "admissions",
        # disaggregation: the decode side receives the prompt's KV already computed
        "materialized",
        "handoff",
        "routing",
        # admission rejection: a code (REJECT_*) and a sentence with the numbers; None otherwise
        "reject_reason",
        "reject_detail",
        # SGLang ranks: the KV lease of a running (or chunking) request (actors.engine.sglang.Lease)
        # and its tokens as pieces (actors.engine.radix_cache.TokenSeq), while it is live
        "lease",
        "tokens",
        # host (G2) / disk (G3) KV tiers: the request's offload state on such a rank
        # (actors.engine.offload.RequestOffload) and the prompt tokens its first admission
        # onboarded from them
        "offload",
        "host_reused",
        # speculative decoding: the decode passes that verified drafts (the request's acceptance
        # stream's position, actors.engine.speculation), the tokens they emitted and the stream
        "spec_passes",
        "spec_tokens",
        "spec_stream",
        "spec_ahead",
        "spec_ahead_at",
        "spec_ahead_end",
    )

    def __init__(
        self,
        index: int,
        source: HashSource,
        arrival_ms: float,
        prompt_len: int,
        max_output: int,
        session_id: str | None = None,
        turn_index: int = 0,
    ) -> None:
        self.index = index  # stable id: ties at equal times break by it
        self.source = source
        self.arrival_ms = arrival_ms
        self.prompt_len = prompt_len
        self.max_output = max_output
        self.session_id = session_id
        self.turn_index = turn_index
        self.num_computed = 0
        self.num_generated = 0
        self.prefill_done = False
        self.hashes: memoryview | None = None
        self.hash_block_size = 0
        self.held: list = []  # KV runs held: (run, blocks) records (KVCache)
        self.num_held = 0  # shared KV blocks held
        self.dup_tail = False  # the last full block is a private copy of a cached one (KVCache)
        self.num_full_registered = 0
        self.num_private = 0
        self.status = WAITING
        self.worker = -1
        self.rank = -1
        self.dispatched_ms: float | None = None
        self.first_admit_ms: float | None = None
        self.first_token_ms: float | None = None
        self.second_token_ms: float | None = None
        self.last_token_ms: float | None = None
        self.terminal_ms: float | None = None
        # (at_ms, reused_tokens, pool) per admission, first one first
        self.admissions: list[tuple[float, int, str]] = []
        self.routing: list[dict] = []  # one entry per routing decision (when captured)
        self.materialized = False
        self.handoff: dict | None = None  # disaggregated timestamps and placement
        self.reject_reason: str | None = None
        self.reject_detail: str | None = None
        self.lease = None
        self.tokens = None
        self.offload = None
        self.host_reused = 0
        self.spec_passes = 0
        self.spec_tokens = 0
        self.spec_stream: int | None = None
        self.spec_ahead: list | tuple = ()  # bursts drawn ahead for its passes spec_ahead_at .. spec_ahead_end - 1
        self.spec_ahead_at = 0
        self.spec_ahead_end = 0

    def block_hashes(self, block_size: int) -> memoryview:
        """Chained hashes of the full blocks of prompt + output (computed once, kept while live),
        as a read-only view (``actors.hashing.hash_view``: KV runs view it, never copy it)."""
        if self.hashes is None or self.hash_block_size != block_size:
            self.hashes = hash_view(self.source.block_hashes(self.index, block_size))
            self.hash_block_size = block_size
        return self.hashes

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (
            f"Request(index={self.index}, prompt={self.prompt_len}, out={self.num_generated}/{self.max_output}, "
            f"computed={self.num_computed}, status={self.status})"
        )


# -- wire form: a request's state as plain data, for actors hosted elsewhere ----------------
#: identity fields (set once at arrival) then progress fields (the engine's view of the request)
WIRE_IDENTITY = ("index", "arrival_ms", "prompt_len", "max_output", "session_id", "turn_index")
WIRE_PROGRESS = ("num_computed", "num_generated", "prefill_done", "status", "worker", "rank", "first_admit_ms",
                 "first_token_ms", "second_token_ms", "last_token_ms", "terminal_ms", "materialized", "reject_reason",
                 "reject_detail", "host_reused", "spec_passes", "spec_tokens")


_wire_fields = attrgetter(*WIRE_IDENTITY, *WIRE_PROGRESS)  # (one C call for every field)
_PROGRESS_AT = len(WIRE_IDENTITY)
_ADMISSIONS_AT = len(WIRE_IDENTITY) + len(WIRE_PROGRESS)


def request_to_wire(req: Request) -> list:
    """Identity, progress and admission history as a msgpack-ready list (KV holdings stay behind)."""
    out = list(_wire_fields(req))
    out.append(list(map(list, req.admissions)))
    return out


def request_from_wire(state, source: HashSource) -> Request:
    req = Request(state[0], source, state[1], state[2], state[3], state[4], state[5])
    apply_wire_progress(req, state)
    return req


def apply_wire_progress(req: Request, state) -> None:
    """Copy the progress part of a wire state onto ``req`` (identity and routing stay)."""
    for f, v in zip(WIRE_PROGRESS, state[_PROGRESS_AT:_ADMISSIONS_AT]):
        setattr(req, f, v)
    req.admissions = list(map(tuple, state[_ADMISSIONS_AT]))
