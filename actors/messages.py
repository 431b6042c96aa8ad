"""The Planner's messages (frozen dataclasses): what the coordinator sends the planner host and what
it answers, sent as they are in process or serialised (msgpack) to a Planner hosted elsewhere. The
engine and router hosts' messages and the same-time phases are in ``actors.protocol``."""

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




# -- wire forms (msgpack-ready lists) for actors hosted elsewhere ----------------------------
def _fpm_to_wire(f: Fpm) -> list:
    return [getattr(f, name) for name in Fpm.__dataclass_fields__]


def snapshot_to_wire(snap: Snapshot) -> list:
    """The snapshot without its traffic window (sent separately, see actors.planner.host)."""
    roles = {role: [st.active, st.starting, st.draining, [_fpm_to_wire(f) for f in st.fpms],
                    [getattr(st.caps, n) for n in Capabilities.__dataclass_fields__]]
             for role, st in snap.roles.items()}
    return [snap.now_ms, roles]


def snapshot_from_wire(data) -> Snapshot:
    now_ms, roles = data
    return Snapshot(now_ms, {role: RoleState(list(a), list(s), list(d), [Fpm(*f) for f in fpms], Capabilities(*caps))
                             for role, (a, s, d, fpms, caps) in roles.items()})


def traffic_to_wire(w: TrafficWindow | None) -> list | None:
    return None if w is None else [getattr(w, n) for n in TrafficWindow.__dataclass_fields__]


def traffic_from_wire(data) -> TrafficWindow | None:
    return None if data is None else TrafficWindow(*data)


def decision_to_wire(d: Decision) -> list:
    return [d.target_prefill, d.target_decode, d.next_tick_ms]


def decision_from_wire(data) -> Decision:
    return Decision(*data)
