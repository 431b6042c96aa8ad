"""The edge channel's polling wait (``ray_runtime._spin``): it only waits, it never reads."""

from __future__ import annotations

import socket

from aisim.simulator.runtime.ray_runtime import _read_exactly, _spin


def test_polling_returns_at_a_frame_and_leaves_it_to_the_read():
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"frame")
        _spin(b, 60.0)  # (a frame waiting: returns at once, not after a minute)
        assert _read_exactly(b, 5) == b"frame"


def test_polling_gives_up_after_its_budget_and_without_one_does_nothing():
    a, b = socket.socketpair()
    with a, b:
        _spin(b, 0.005)  # (nothing comes: back after 5 ms)
        _spin(b, 0.0)
        a.sendall(b"late")
        assert _read_exactly(b, 4) == b"late"
