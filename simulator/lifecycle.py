"""Worker lifecycle bookkeeping of the coordinator.

Each worker is ``starting``, ``active``, ``draining`` or ``removed``. Provisioned time (what
gpu_hours integrates) runs from the moment a worker is added until it is removed: starting
and draining time count. Every change is recorded as a lifecycle operation for the Planner
report. This class only keeps the books; the coordinator decides when things happen.
"""

from __future__ import annotations

STARTING = "starting"
ACTIVE = "active"
DRAINING = "draining"
REMOVED = "removed"


class Lifecycle:
    def __init__(self, num_workers: int, pool_roles: list[str]) -> None:
        self.state = [ACTIVE] * num_workers
        self.provisioned: list[list] = [[0.0, None] for _ in range(num_workers)]  # [since, until]
        self.role_of = list(pool_roles)  # pool role per worker
        self.operations: list[dict] = []

    def add(self, role: str, now_ms: float, starting: bool) -> int:
        wid = len(self.state)
        self.state.append(STARTING if starting else ACTIVE)
        self.provisioned.append([now_ms, None])
        self.role_of.append(role)
        return wid

    def counts(self, worker_ids: list[int]) -> dict:
        out = {ACTIVE: 0, STARTING: 0, DRAINING: 0}
        for wid in worker_ids:
            st = self.state[wid]
            if st in out:
                out[st] += 1
        return out

    def in_state(self, worker_ids: list[int], state: str) -> list[int]:
        return [w for w in worker_ids if self.state[w] == state]

    def record(self, pool_name: str, worker_ids: list[int], now_ms: float, cause: str, transitions: list[dict],
               tick: int | None) -> None:
        self.operations.append({
            "operation_ordinal": len(self.operations),
            "at_ms": now_ms,
            "pool": pool_name,
            "cause": cause,
            "planner_tick_ordinal": tick,
            "transitions": transitions,
            "state_after_batch": self.counts(worker_ids),
            "topology_released_request_uuids": [],
        })

    def scale_down(self, worker_ids: list[int], drop: int, now_ms: float) -> list[dict]:
        """Cancel pending startups first (highest ids), then drain the highest active ids."""
        transitions = []
        for wid in sorted(self.in_state(worker_ids, STARTING), reverse=True)[:drop]:
            self.state[wid] = REMOVED
            self.provisioned[wid][1] = now_ms
            transitions.append({"worker_id": wid, "transition": "worker_start_canceled", "prior_state": STARTING,
                                "state": REMOVED})
            drop -= 1
        for wid in sorted(self.in_state(worker_ids, ACTIVE), reverse=True)[:drop]:
            self.state[wid] = DRAINING
            transitions.append({"worker_id": wid, "transition": "worker_draining", "prior_state": ACTIVE,
                                "state": DRAINING})
        return transitions

    @staticmethod
    def added(wid: int, starting: bool) -> dict:
        if starting:
            return {"worker_id": wid, "transition": "worker_starting", "prior_state": None, "state": STARTING}
        return {"worker_id": wid, "transition": "worker_ready", "prior_state": None, "state": ACTIVE}

    def ready(self, wid: int) -> dict | None:
        """A started worker becomes active (None if its start was canceled)."""
        if self.state[wid] != STARTING:
            return None
        self.state[wid] = ACTIVE
        return {"worker_id": wid, "transition": "worker_ready", "prior_state": STARTING, "state": ACTIVE}

    def remove(self, wid: int, now_ms: float) -> dict:
        """A draining worker that finished its work leaves."""
        self.state[wid] = REMOVED
        self.provisioned[wid][1] = now_ms
        return {"worker_id": wid, "transition": "worker_removed", "prior_state": DRAINING, "state": REMOVED}

    def worker_seconds(self, until_ms: float) -> dict[str, float]:
        """Provisioned worker time per pool role up to ``until_ms`` (starting and draining count)."""
        out: dict[str, float] = {}
        for wid, (since, until) in enumerate(self.provisioned):
            end = min(until if until is not None else until_ms, until_ms)
            role = self.role_of[wid]
            out[role] = out.get(role, 0.0) + max(0.0, end - since) / 1000.0
        return out
