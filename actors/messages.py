"""Messages between actors and the coordinator: plain frozen (or simple) dataclasses that can
be sent as they are (in process) or serialised (msgpack) to actors hosted elsewhere."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Capabilities:
    """What a rank can hold (from the engine configuration)."""

    max_batched_tokens: int = 8192
    max_sequences: int = 512
    context_length: int = 131072
    max_kv_tokens: int = 2_000_000  # per rank



@dataclass(frozen=True)
class Fpm:
    """Forward-pass metrics of one rank: its latest pass and its queue now."""

    worker_id: int
    dp_rank: int
    pass_ordinal: int  # passes the rank has run (0 = none yet)
    wall_time_s: float
    num_prefill: int
    prefill_tokens: int
    prefill_kv_tokens: int
    var_prefill_length: float
    num_decode: int
    decode_kv_tokens: int
    var_decode_kv_tokens: float
    queued_prefill: int
    queued_prefill_tokens: int
    var_queued_prefill_length: float
    queued_decode: int
    queued_decode_kv_tokens: int
    var_queued_decode_kv_tokens: float

    def as_dict(self) -> dict:
        return {
            "worker_id": self.worker_id,
            "dp_rank": self.dp_rank,
            "metrics": {
                "wall_time": self.wall_time_s,
                "scheduled_requests": {
                    "num_prefill_requests": self.num_prefill, "sum_prefill_tokens": self.prefill_tokens,
                    "var_prefill_length": self.var_prefill_length, "sum_prefill_kv_tokens": self.prefill_kv_tokens,
                    "num_decode_requests": self.num_decode, "sum_decode_kv_tokens": self.decode_kv_tokens,
                    "var_decode_kv_tokens": self.var_decode_kv_tokens,
                },
                "queued_requests": {
                    "num_prefill_requests": self.queued_prefill, "sum_prefill_tokens": self.queued_prefill_tokens,
                    "var_prefill_length": self.var_queued_prefill_length, "num_decode_requests": self.queued_decode,
                    "sum_decode_kv_tokens": self.queued_decode_kv_tokens,
                    "var_decode_kv_tokens": self.var_queued_decode_kv_tokens,
                },
            },
        }


@dataclass
class RoleState:
    active: list[int]  # ready, not draining
    starting: list[int]
    draining: list[int]
    fpms: list[Fpm]  # latest per (worker, rank) of the active workers that have run a pass
    caps: Capabilities

    @property
    def expected(self) -> int:
        return len(self.active) + len(self.starting)

    def topology(self) -> dict:
        return {"active": list(self.active), "active_count": len(self.active), "starting": list(self.starting),
                "starting_count": len(self.starting), "draining": list(self.draining),
                "draining_count": len(self.draining)}


@dataclass(frozen=True)
class TrafficWindow:
    duration_s: float
    num_req: int
    avg_isl: float
    avg_osl: float
    avg_ttft_ms: float | None
    avg_itl_ms: float | None
    avg_kv_hit_rate: float
    avg_accept_length: float = 1.0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Snapshot:
    now_ms: float
    roles: dict[str, RoleState]  # "prefill" (disaggregated) and "decode"
    traffic: TrafficWindow | None = None  # only when throughput scaling is due


@dataclass(frozen=True)
class Decision:
    target_prefill: int | None
    target_decode: int | None
    next_tick_ms: float | None


