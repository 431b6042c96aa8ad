"""Routing policies: pick the (worker, rank) that serves a request.

A policy sees only eligible workers (ready and not draining), given in ascending id order,
and each worker's rank count. ``needs_worker_state`` tells the coordinator whether the policy
reads worker state (KV events, load) and so needs every worker synced to ``now`` first.
"""

from __future__ import annotations

from actors.engine.request import Request


class RoundRobinRouter:
    """Cycle over eligible workers, then over the chosen worker's ranks; ignores cache and load."""

    name = "round_robin"
    needs_worker_state = False

    def __init__(self) -> None:
        self._next_worker = 0
        self._next_rank: dict[int, int] = {}

    def route(self, req: Request, now_ms: float, eligible: list[int], ranks_of: list[int]) -> tuple[int, int]:
        if not eligible:
            raise RuntimeError("no eligible worker to route to")
        w = eligible[self._next_worker % len(eligible)]
        self._next_worker += 1
        nranks = ranks_of[w]
        r = 0
        if nranks > 1:
            r = self._next_rank.get(w, 0)
            self._next_rank[w] = (r + 1) % nranks
        return w, r

    def on_terminal(self, req: Request) -> None:
        pass

    def describe(self) -> dict:
        return {"policy": self.name}
