"""Capacity policies of the vLLM-style rank scheduler: what a waiting request needs to be
admitted, how much of a cached prefix it may reuse, and whether running requests may be
preempted. The scheduler asks its policy and holds no backend checks of its own
(docs/schedulers.md).

- ``RecomputeCapacity`` (vLLM): the whole sequence's blocks minus its cached blocks that are
  active must fit in the blocks live requests do not hold; a prefix hit leaves at least one token
  to compute; allocation failures preempt running requests (recompute).
- ``GuaranteedNoEvict`` (TensorRT-LLM's default capacity scheduler): admission reserves the
  prompt plus the maximum output (clamped at enqueue to what the pool can hold); a request waits
  (FIFO, the head blocks the queue) until its whole footprint fits beside the rest of every
  running request's; nothing is ever preempted; every full cached block of the prompt is reused.
"""

from __future__ import annotations

from collections import deque


class RecomputeCapacity:
    """vLLM's admission test and recompute preemption.

    What the scheduler reads of every policy (data, read once, so that vLLM's hot path makes no
    call for a hook it does not need): ``preempts``, ``reserves``, ``reuses_whole_prompt`` (a
    prefix hit may cover every full block of the sequence, else all but its last token),
    ``tracks`` (``prepare``/``admitted``/``left``/``source_released`` must be called) and
    ``max_prompt_tokens(config)`` (a longer prompt can never be held)."""

    preempts = True
    reserves = False  # a disaggregated destination admits a transferred prompt as it arrives
    takes_pages = False  # a reservation allocates physical blocks at once (it only counts them here)
    reuses_whole_prompt = False
    tracks = False
    pending: tuple | deque = ()  # destinations waiting for their blocks: (transfer id, request), in order
    reserved_ids: frozenset | set = frozenset()  # requests whose blocks are reserved (by index)

    __slots__ = ("kv", "block_size")

    def __init__(self, config, kv) -> None:
        self.kv = kv
        self.block_size = config.block_size

    @staticmethod
    def max_prompt_tokens(config) -> int:
        return config.num_gpu_blocks * config.block_size

    def prepare(self, req) -> None:
        """At enqueue: normalise the request for this policy."""

    def fits(self, req, known: int, active_hits: int) -> bool:
        kv = self.kv
        return -(-known // self.block_size) - active_hits <= kv.capacity - kv.num_active

    def admitted(self, req) -> None:
        pass

    def reserve_destination(self, req, transfer: int, now_ms: float, busy: bool = False) -> bool:
        """Reserve a handed-off request's blocks before its transfer starts (a reserving
        destination only; ``busy``: the rank is in a pass); False: it waits behind those already
        waiting (FIFO)."""
        raise NotImplementedError("vLLM destinations do not reserve before the transfer")

    def retry_destinations(self, now_ms: float, idle: bool = True) -> list[tuple[int, int]]:
        """The waiting destinations that reserve now, in order: (transfer id, tokens to
        transfer); ``idle``: the rank has nothing to run."""
        return []

    def transfer_tokens(self, req) -> int:
        """The prompt tokens a reserved destination needs transferred."""
        return req.prompt_len

    def left(self, req, holds_kv: bool = False) -> None:
        """``req`` left the running list (completed or preempted; ``holds_kv``: handed off, its
        KV held here until its transfer ends)."""

    def source_released(self, req) -> None:
        """A handed-off request's KV is about to be released (its transfer ended)."""


class DestinationQueue:
    """Reservations of a reserving destination, in FIFO order: a request reserves at once when
    none waits before it and ``_reserve`` (the policy's) succeeds, else it waits in ``pending``;
    waiting ones are retried in order (when completions freed blocks), the first that does not
    fit stopping the rest. ``per_round`` (SGLang): a reservation is tried only when the rank
    starts a round - a busy rank queues it, and each pass end tries the head once (a rank with
    nothing to run tries them all: its rounds take no time)."""

    __slots__ = ()
    per_round = False

    def reserve_destination(self, req, transfer: int, now_ms: float, busy: bool = False) -> bool:
        if not self.pending and not (busy and self.per_round) and self._reserve(req, now_ms):
            return True
        self.pending.append((transfer, req))
        return False

    def retry_destinations(self, now_ms: float, idle: bool = True) -> list[tuple[int, int]]:
        pending = self.pending
        out = []
        while pending and self._reserve(pending[0][1], now_ms):
            transfer, req = pending.popleft()
            out.append((transfer, self.transfer_tokens(req)))
            if self.per_round and not idle:
                break
        return out

    def transfer_tokens(self, req) -> int:
        return req.prompt_len


class GuaranteedNoEvict(DestinationQueue):
    """TensorRT-LLM's GUARANTEED_NO_EVICT: admission reserves every block a request can need."""

    preempts = False
    reserves = True  # a disaggregated destination reserves the request's blocks before its transfer
    takes_pages = False
    reuses_whole_prompt = True  # every full cached block, the whole prompt included
    tracks = True

    __slots__ = ("kv", "block_size", "capacity_tokens", "prefill_only", "context_limit", "reserved", "held_off",
                 "pending", "reserved_ids")

    def __init__(self, config, kv) -> None:
        self.kv = kv
        self.block_size = config.block_size
        self.capacity_tokens = config.num_gpu_blocks * config.block_size
        self.prefill_only = config.prefill_only
        cl = config.context_length
        self.context_limit = cl if cl is not None else 1 << 62
        self.reserved = 0  # completion blocks of the running requests and of the reserved destinations
        self.held_off = 0  # blocks handed-off requests hold here (out of the running list)
        self.pending = deque()
        self.reserved_ids = set()

    @staticmethod
    def max_prompt_tokens(config) -> int:
        return config.num_gpu_blocks * config.block_size - 1  # (room for one output token)

    def prepare(self, req) -> None:
        """The maximum output is clamped to the room the pool (and the context length) leaves
        beside the prompt (a prompt with no room is refused at the head)."""
        room = min(self.capacity_tokens, self.context_limit) - req.prompt_len
        if 0 < room < req.max_output:
            req.max_output = room

    def completion_blocks(self, req) -> int:
        """Blocks ``req`` can hold at most: its prompt and every output token (a prefill worker's
        request: its one hidden token)."""
        out = 1 if self.prefill_only else req.max_output
        return -(-(req.prompt_len + out) // self.block_size)

    def fits(self, req, known: int, active_hits: int) -> bool:
        kv = self.kv
        # the blocks still to come of the running requests and reserved destinations: their
        # completion blocks minus what the running ones hold (each counting its shared blocks:
        # every live holder's blocks, the handed-off ones' aside)
        outstanding = self.reserved - (kv.num_refs - self.held_off)
        return self.completion_blocks(req) - active_hits <= kv.capacity - kv.num_active - outstanding

    def admitted(self, req) -> None:
        self.reserved += self.completion_blocks(req)

    def _reserve(self, req, now_ms: float = 0.0) -> bool:
        """A disaggregated destination: the request's completion blocks, fresh (no prefix
        reuse), reserved before its prompt's KV is transferred."""
        if not self.fits(req, req.prompt_len, 0):
            return False
        self.admitted(req)
        self.reserved_ids.add(req.index)
        return True

    def left(self, req, holds_kv: bool = False) -> None:
        self.reserved -= self.completion_blocks(req)
        if holds_kv:
            self.held_off += req.num_held + req.num_private

    def source_released(self, req) -> None:
        self.held_off -= req.num_held + req.num_private


POLICIES = {"vllm": RecomputeCapacity, "guaranteed_no_evict": GuaranteedNoEvict}
