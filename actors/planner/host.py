"""A planner host: the Planner behind a plain-data tick interface (in process or in a Ray actor).

The coordinator sends the snapshot without traffic plus the traffic window it has
accumulated so far; the host attaches the window only when the throughput loop is due and
says whether it consumed it (the coordinator then starts a new window).
"""

from __future__ import annotations

from aisim.actors.messages import decision_to_wire, snapshot_from_wire, traffic_from_wire


class PlannerHost:
    def __init__(self, planner) -> None:
        self.planner = planner

    def initial_tick_ms(self) -> float:
        return self.planner.initial_tick_ms()

    def tick(self, snapshot, traffic, changes: dict | None = None) -> tuple[list, bool]:
        """One tick; ``changes``: Planner runtime fields a retune decision changes from this tick on."""
        if changes:
            self.planner.set_runtime_fields(changes)
        snap = snapshot_from_wire(snapshot)
        consumed = self.planner.needs_traffic(snap.now_ms)
        if consumed:
            snap.traffic = traffic_from_wire(traffic)
        return decision_to_wire(self.planner.on_tick(snap)), consumed
