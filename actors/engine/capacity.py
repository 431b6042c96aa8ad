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


class RecomputeCapacity:
    """vLLM's admission test and recompute preemption."""

    name = "vllm"
    preempts = True
    reserves = False  # a disaggregated destination admits a transferred prompt as it arrives

    __slots__ = ("kv", "block_size")

    def __init__(self, config, kv) -> None:
        self.kv = kv
        self.block_size = config.block_size

    def prepare(self, req) -> None:
        """At enqueue: normalise the request for this policy."""

    def too_large(self, req) -> bool:
        """The prompt alone can never be held here."""
        return -(-req.prompt_len // self.block_size) > self.kv.capacity

    def reuse_limit(self, known: int) -> int:
        """Blocks of a ``known``-token sequence a prefix hit may cover (at least one token is computed)."""
        return (known - 1) // self.block_size

    def fits(self, req, known: int, active_hits: int) -> bool:
        kv = self.kv
        return -(-known // self.block_size) - active_hits <= kv.capacity - kv.num_active

    def admitted(self, req) -> None:
        pass

    def reserve(self, req) -> bool:
        """Reserve a transferred request's blocks before its transfer (a reserving destination
        only); False: it waits."""
        raise NotImplementedError("vLLM destinations do not reserve before the transfer")

    def left(self, req, holds_kv: bool) -> None:
        """``req`` left the running list (completed; ``holds_kv``: handed off, its KV held for the transfer)."""

    def source_released(self, req) -> None:
        """A handed-off request's KV is about to be released (its transfer completed)."""


class GuaranteedNoEvict:
    """TensorRT-LLM's GUARANTEED_NO_EVICT: admission reserves every block a request can need."""

    name = "guaranteed_no_evict"
    preempts = False
    reserves = True  # a disaggregated destination reserves the request's blocks before its transfer

    __slots__ = ("kv", "block_size", "capacity_tokens", "prefill_only", "context_limit", "reserved", "held_off")

    def __init__(self, config, kv) -> None:
        self.kv = kv
        self.block_size = config.block_size
        self.capacity_tokens = config.num_gpu_blocks * config.block_size
        self.prefill_only = config.prefill_only
        cl = config.context_length
        self.context_limit = cl if cl is not None else 1 << 62
        self.reserved = 0  # completion blocks of the running requests
        self.held_off = 0  # blocks held by handed-off requests (out of the running list)

    def prepare(self, req) -> None:
        """The maximum output is clamped to the room the pool (and the context length) leaves
        beside the prompt (a prompt with no room is refused at the head: ``too_large``)."""
        room = min(self.capacity_tokens, self.context_limit) - req.prompt_len
        if 0 < room < req.max_output:
            req.max_output = room

    def too_large(self, req) -> bool:
        return req.prompt_len >= self.capacity_tokens  # (no room for one output token)

    def reuse_limit(self, known: int) -> int:
        return known // self.block_size  # every full cached block, the whole prompt included

    def completion_blocks(self, req) -> int:
        """Blocks ``req`` can hold at most: its prompt and every output token (a prefill worker's
        request: its one hidden token)."""
        out = 1 if self.prefill_only else req.max_output
        return -(-(req.prompt_len + out) // self.block_size)

    def fits(self, req, known: int, active_hits: int) -> bool:
        kv = self.kv
        # the running requests' blocks still to come: their completion blocks minus what they hold
        outstanding = self.reserved - (kv.num_refs - self.held_off)
        return self.completion_blocks(req) - active_hits <= kv.capacity - kv.num_active - outstanding

    def admitted(self, req) -> None:
        self.reserved += self.completion_blocks(req)

    def reserve(self, req) -> bool:
        """A disaggregated destination: the request's completion blocks, fresh (no prefix
        reuse), reserved before its prompt's KV is transferred."""
        if not self.fits(req, req.prompt_len, 0):
            return False
        self.admitted(req)
        return True

    def left(self, req, holds_kv: bool) -> None:
        self.reserved -= self.completion_blocks(req)
        if holds_kv:
            self.held_off += req.num_held + req.num_private

    def source_released(self, req) -> None:
        self.held_off -= req.num_held + req.num_private


POLICIES = {"vllm": RecomputeCapacity, "guaranteed_no_evict": GuaranteedNoEvict}
