"""Task functions the fan-out tests send to workers (importable by name: workers re-import them)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from aisim.simulator.errors import InputError


def square(x: int) -> int:
    return x * x


def square_or_fail(x: int) -> int:
    """Raises for 3 (an aisim error, with its category) and 5 (a plain exception)."""
    if x == 3:
        raise InputError("engine.workers.aggregated.kv_cache.capacity", "holds no block\nsecond line", category="kv_capacity")
    if x == 5:
        raise ZeroDivisionError("five")
    return x * x


def returns_none(x) -> None:
    return None


def record_pid_and_sleep(path: str) -> str:
    """Write this worker's pid to ``path`` (the test reads it), then sleep far past any timeout."""
    tmp = Path(path + ".tmp")
    tmp.write_text(str(os.getpid()))
    tmp.rename(path)
    time.sleep(60)
    return "slept"


def pid(_x) -> int:
    return os.getpid()


def hard_exit(_x) -> None:
    os._exit(7)


def sleep_for(seconds: float) -> float:
    """Sleep, then return how long (an item whose length the test chooses)."""
    time.sleep(seconds)
    return seconds


def env_cwd_and_parent(name: str) -> tuple:
    """What a worker sees: the environment variable ``name``, its working directory, its parent pid."""
    return os.environ.get(name), os.getcwd(), os.getppid()
