"""When requests arrive: open-loop schedules and closed-loop (concurrency) slots.

Two layers, so that one plan can be run any number of times:

* ``ArrivalProcess`` / ``ClosedLoop`` describe the arrivals of a workload. They are values:
  built once (precomputed read-only arrays), never changed afterwards, cheap to pickle.
* ``start()`` returns an ``ArrivalRun``: the state of one run. The coordinator takes the
  arrivals it knows up front from it (``initial``) and the follow-ups a terminal request
  triggers (``on_terminal``): the next turn of a session (``delay`` after the previous turn
  completes) or, in a closed loop, the next request when a slot frees. Every ``start()`` gives
  a fresh, independent run, so every run of a plan sees the same arrivals.

Arrival ties are broken by request index.
"""

from __future__ import annotations

import numpy as np

from aisim.simulator.traffic.workload import Workload


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.array(a, copy=True)
    a.setflags(write=False)
    return a


class ArrivalRun:
    """One run of an open-loop process: nothing changes during the run (the schedule is fixed,
    session turns follow completions), so this is a thin view over the description."""

    __slots__ = ("process",)

    def __init__(self, process: ArrivalProcess) -> None:
        self.process = process

    @property
    def follows_terminal(self) -> bool:
        """Whether a request ending can trigger an arrival (session turns, closed loops)."""
        return self.process.follows_terminal

    def initial(self) -> tuple[np.ndarray, np.ndarray]:
        """(times_ms, indices) of the arrivals known up front, sorted by (time, index) (read-only)."""
        p = self.process
        return p._initial_times, p._initial_idx

    def on_terminal(self, index: int, now_ms: float) -> list[tuple[float, int]]:
        """Arrivals ``index`` ending at ``now_ms`` triggers: its session's next turn, if any."""
        p = self.process
        if p._next_turn is None:  # (no sessions)
            return []
        nxt = int(p._next_turn[index])
        if nxt < 0:
            return []
        return [(now_ms + float(p._turn_delay[nxt]), nxt)]


class ClosedLoopRun(ArrivalRun):
    """One run of a closed loop: the position in the queue of session starters advances as slots free."""

    __slots__ = ("_pos",)

    def __init__(self, process: ClosedLoop) -> None:
        super().__init__(process)
        self._pos = len(process._initial_idx)

    @property
    def follows_terminal(self) -> bool:
        return True

    def on_terminal(self, index: int, now_ms: float) -> list[tuple[float, int]]:
        follow = ArrivalRun.on_terminal(self, index, now_ms)
        if follow:
            return follow  # the session keeps its slot
        queue = self.process._starters
        if self._pos < len(queue):
            nxt = int(queue[self._pos])
            self._pos += 1
            return [(now_ms, nxt)]
        return []


class ArrivalProcess:
    """Open loop over first turns; session turns follow completions. Immutable: ``start()`` a run."""

    def __init__(self, workload: Workload, first_turn_times_ms: np.ndarray, delay_scale: float = 1.0) -> None:
        """``first_turn_times_ms[i]`` is request i's arrival if it starts a session (or has none)."""
        self._setup(workload, delay_scale)
        t = np.asarray(first_turn_times_ms, dtype=np.float64)
        if self._starters is None and not (t[1:] < t[:-1]).any() and not np.isnan(t).any():  # (in order already)
            self._initial_times = _frozen(t)
            self._initial_idx = _frozen(np.arange(len(t), dtype=np.int64))
        else:
            idx = self.starters()
            t = t[idx]
            order = np.lexsort((idx, t))
            self._initial_times = _frozen(t[order])
            self._initial_idx = _frozen(idx[order])
        self._sealed = True

    def starters(self) -> np.ndarray:
        """The requests that start a session or have none (ascending)."""
        return self._starters if self._starters is not None else np.arange(self.w.num_requests, dtype=np.int64)

    def _setup(self, workload: Workload, delay_scale: float) -> None:
        self.w = workload
        self.delay_scale = delay_scale
        n = workload.num_requests
        if not workload.has_sessions():  # (no follow-ups: nothing per request; delays are later turns')
            self._next_turn = self._turn_delay = self._starters = None
            self._follows = False
            return
        next_turn = np.full(n, -1, dtype=np.int64)
        starters = np.ones(n, dtype=bool)
        sess = workload.session_index
        last_of: dict[int, int] = {}
        for i in range(n):
            s = int(sess[i])
            if s < 0:
                continue
            prev = last_of.get(s)
            if prev is not None:
                next_turn[prev] = i
                starters[i] = False
            last_of[s] = i
        d = workload.delay_ms
        # the delay before request i when it follows its session's previous turn
        turn_delay = np.zeros(n) if d is None else np.where(np.isnan(d), 0.0, np.asarray(d, dtype=np.float64) / delay_scale)
        self._next_turn = _frozen(next_turn)
        self._turn_delay = _frozen(turn_delay)
        self._starters = _frozen(np.nonzero(starters)[0])
        self._follows = bool((next_turn >= 0).any())

    def __setattr__(self, name: str, value) -> None:
        if self.__dict__.get("_sealed"):
            raise AttributeError(f"{type(self).__name__} is immutable; per-run state lives in start()'s run")
        object.__setattr__(self, name, value)

    def __setstate__(self, state: dict) -> None:  # unpickled arrays come back writable
        for k, v in state.items():
            if isinstance(v, np.ndarray):
                v.setflags(write=False)
        self.__dict__.update(state)

    @property
    def follows_terminal(self) -> bool:
        """Whether a request ending can trigger an arrival (session turns, closed loops)."""
        return self._follows

    def start(self) -> ArrivalRun:
        """A fresh run: call once per replay; the run holds everything that changes during it."""
        return ArrivalRun(self)


class ClosedLoop(ArrivalProcess):
    """``concurrency`` slots; a session holds its slot across all its turns and delays."""

    def __init__(self, workload: Workload, concurrency: int) -> None:
        self._setup(workload, 1.0)
        self._starters = _frozen(self.starters())  # (the queue of session starters)
        self.concurrency = concurrency
        k = max(0, min(concurrency, len(self._starters)))
        self._initial_times = _frozen(np.zeros(k))
        self._initial_idx = _frozen(self._starters[:k])
        self._sealed = True

    @property
    def follows_terminal(self) -> bool:
        return True

    def start(self) -> ClosedLoopRun:
        return ClosedLoopRun(self)


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
