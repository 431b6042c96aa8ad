"""Retune windows and decision times (reference §6.3), in virtual milliseconds.

- Window k covers ``[k I, (k+1) I)`` after the first request (``I`` = ``interval_seconds``); its
  sweep launches at ``(k+1) I + grace``.
- A request belongs to window k when it starts inside it and its recorded completion (start +
  ``total_time_ms``) is at or before the launch; a request without a recorded total time cannot
  be excluded, so it belongs to the window it starts in.
- Virtual time stops while the sweep runs; the decision applies at the first Planner tick ``t``
  with ``t > launch`` and ``t >= launch + latency`` (ticks at multiples of the tick interval).
  Example: I = 600 s, grace 60 s, 5 s ticks: window 0 launches at 660 s and decides at 665 s
  with latency 0, or at 675 s with a measured 11 s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aisim.simulator.retune_driver import decision_tick_ms

__all__ = ["Window", "window", "windows_launched_by", "decision_tick_ms", "window_requests"]


@dataclass(frozen=True)
class Window:
    index: int
    start_ms: float
    end_ms: float
    launch_ms: float


def window(index: int, interval_s: float, grace_s: float) -> Window:
    i_ms = interval_s * 1000.0
    return Window(index, index * i_ms, (index + 1) * i_ms, (index + 1) * i_ms + grace_s * 1000.0)


def windows_launched_by(end_ms: float, interval_s: float, grace_s: float) -> list[Window]:
    """The windows whose sweep launches at or before ``end_ms`` (the replay's end)."""
    out = []
    k = 0
    while True:
        w = window(k, interval_s, grace_s)
        if w.launch_ms > end_ms:
            return out
        out.append(w)
        k += 1


def window_requests(start_ms: np.ndarray, recorded_total_ms: np.ndarray | None, w: Window) -> np.ndarray:
    """Indices (ascending) of the requests of window ``w``: ``start_ms`` relative to the first
    request; ``recorded_total_ms`` NaN (or None for the whole trace) where not recorded."""
    start = np.asarray(start_ms, dtype=np.float64)
    inside = (start >= w.start_ms) & (start < w.end_ms)
    if recorded_total_ms is not None:
        total = np.asarray(recorded_total_ms, dtype=np.float64)
        done_by_launch = np.isnan(total) | (start + total <= w.launch_ms)
        inside &= done_by_launch
    return np.nonzero(inside)[0]
