"""When requests arrive: open-loop schedules and closed-loop (concurrency) slots.

An arrival process gives the coordinator the arrivals it knows up front (``initial``) and the
follow-ups a terminal request triggers (``on_terminal``): the next turn of a session
(``delay`` after the previous turn completes) or, in a closed loop, the next request when a
slot frees. Arrival ties are broken by request index.
"""

from __future__ import annotations

import numpy as np

from simulator.traffic.workload import Workload


class ArrivalProcess:
    """Base: open loop over first turns; session turns follow completions."""

    def __init__(self, workload: Workload, first_turn_times_ms: np.ndarray, delay_scale: float = 1.0) -> None:
        """``first_turn_times_ms[i]`` is request i's arrival if it starts a session (or has none)."""
        self.w = workload
        self.delay_scale = delay_scale
        n = workload.num_requests
        self._next_turn = np.full(n, -1, dtype=np.int64)
        starters = np.ones(n, dtype=bool)
        if workload.has_sessions():
            sess = workload.session_index
            last_of: dict[int, int] = {}
            for i in range(n):
                s = int(sess[i])
                if s < 0:
                    continue
                prev = last_of.get(s)
                if prev is not None:
                    self._next_turn[prev] = i
                    starters[i] = False
                last_of[s] = i
        self._starters = np.nonzero(starters)[0]
        self._first_times = first_turn_times_ms

    @property
    def follows_terminal(self) -> bool:
        """Whether a request ending can trigger an arrival (session turns, closed loops)."""
        return bool((self._next_turn >= 0).any())

    def initial(self) -> tuple[np.ndarray, np.ndarray]:
        """(times_ms, indices) of the arrivals known up front, sorted by (time, index)."""
        idx = self._starters
        t = self._first_times[idx]
        order = np.lexsort((idx, t))
        return t[order], idx[order]

    def on_terminal(self, index: int, now_ms: float) -> list[tuple[float, int]]:
        nxt = int(self._next_turn[index])
        if nxt < 0:
            return []
        d = self.w.delay_ms
        delay = float(d[nxt]) / self.delay_scale if d is not None and not np.isnan(d[nxt]) else 0.0
        return [(now_ms + delay, nxt)]


class ClosedLoop(ArrivalProcess):
    """``concurrency`` slots; a session holds its slot across all its turns and delays."""

    def __init__(self, workload: Workload, concurrency: int) -> None:
        n = workload.num_requests
        super().__init__(workload, np.zeros(n))
        self.concurrency = concurrency
        self._queue = list(self._starters.tolist())
        self._pos = min(concurrency, len(self._queue))

    @property
    def follows_terminal(self) -> bool:
        return True

    def initial(self) -> tuple[np.ndarray, np.ndarray]:
        idx = np.asarray(self._queue[: self._pos], dtype=np.int64)
        return np.zeros(len(idx)), idx

    def on_terminal(self, index: int, now_ms: float) -> list[tuple[float, int]]:
        follow = super().on_terminal(index, now_ms)
        if follow:
            return follow
        if self._pos < len(self._queue):
            nxt = self._queue[self._pos]
            self._pos += 1
            return [(now_ms, nxt)]
        return []


def trace_times(workload: Workload, speedup: float) -> np.ndarray:
    """Trace timestamps normalised to start at 0 and divided by ``speedup``."""
    ts = workload.timestamp_ms
    first = np.nanmin(ts) if len(ts) else 0.0
    out = (ts - first) / speedup
    return np.where(np.isnan(out), 0.0, out)


def poisson_times(count: int, rate_per_s: float, seed: int) -> np.ndarray:
    """Open-loop Poisson arrivals, first at t = 0 (seeded)."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1000.0 / rate_per_s, size=max(0, count - 1))
    return np.concatenate(([0.0], np.cumsum(gaps)))[:count]


def constant_times(count: int, rate_per_s: float) -> np.ndarray:
    return np.arange(count, dtype=np.float64) * (1000.0 / rate_per_s)
