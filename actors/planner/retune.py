"""The Planner's retune protocol: what a sweep is asked and what it answers (plain data).

The coordinator (``simulator``) pauses virtual time at the first Planner tick after a window's
launch and hands a ``SweepRequest`` to the injected ``Sweeper`` (``search.retune`` implements
it); the ``SweepAnswer`` says which knobs to change, and the coordinator delivers the change at
the decision tick. Nothing here imports the layers above: the request carries the window and
the point in effect, the answer plain dicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["SweepRequest", "SweepAnswer", "Sweeper", "OUTCOMES"]

OUTCOMES = ("applied", "kept", "timeout", "advisory", "failed")


@dataclass(frozen=True)
class SweepRequest:
    """One window's sweep. Times are virtual milliseconds from the start of the replay."""

    window_index: int
    window_start_ms: float
    window_end_ms: float
    launch_ms: float
    replicas: dict[str, int]  # pool role -> workers provisioned at the window start
    router: dict[str, float]  # the router knobs in effect at the launch
    planner: dict[str, object]  # the searched Planner fields in effect at the launch (incl. the predictor's)
    kv_blocks: dict[str, list] | None = None  # warm start: pool role -> per worker, the cached block hashes (LRU first)


@dataclass
class SweepAnswer:
    """What a sweep found. ``outcome``: ``applied`` (``router``/``planner`` hold the changes),
    ``kept``, ``timeout`` or ``failed`` (nothing changes)."""

    outcome: str
    router: dict[str, float] = field(default_factory=dict)  # router knobs to change
    planner: dict[str, object] = field(default_factory=dict)  # Planner fields to change (incl. the predictor's)
    chosen: dict | None = None  # {"router": {...} | None, "planner": {...} | None}: the winning point
    predictor_warmup: dict | None = None  # the predictor pre-sweep, when it ran
    current: dict | None = None  # {"point", "score"}
    candidates: list[dict] = field(default_factory=list)  # [{"point", "score", "status"}]
    improvement_pct: float | None = None
    sweep_wall_s: float = 0.0
    num_requests: int = 0


class Sweeper(Protocol):
    def sweep(self, request: SweepRequest) -> SweepAnswer: ...

    def close(self) -> None: ...
