"""Host limits of a replay (``execution.resources``): memory ceiling, CPU pinning, init timeout.

The memory guard reads the process RSS every few thousand events; crossing the limit stops
the run with exit code 3 (``resource_limited``). It reads no clock, only /proc.
"""

from __future__ import annotations

import os
import resource

from simulator.config.models import Resources
from simulator.errors import ResourceLimitError

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                out[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def current_rss_bytes() -> int:
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return peak_rss_bytes()


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_limit_bytes(res: Resources) -> int | None:
    if res.memory_limit_gb != "auto":
        return int(res.memory_limit_gb * 1e9)
    info = _meminfo()
    avail = info.get("MemAvailable")
    if not avail:
        return None
    reserve = max(res.reserve_memory_gb * 1e9, res.reserve_memory_fraction * info.get("MemTotal", avail))
    return int(max(0.0, min(avail * res.available_memory_fraction, avail - reserve)))


def apply_cpu_limit(res: Resources) -> int | None:
    if res.cpu_limit == "auto" or not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))[: res.cpu_limit]
    os.sched_setaffinity(0, set(cpus))
    return len(cpus)


class ResourceGuard:
    """Raises ``ResourceLimitError`` when the RSS crosses the memory limit."""

    def __init__(self, limit_bytes: int | None) -> None:
        self.limit_bytes = limit_bytes
        self.peak_observed = current_rss_bytes()

    def check(self) -> None:
        rss = current_rss_bytes()
        if rss > self.peak_observed:
            self.peak_observed = rss
        if self.limit_bytes is not None and rss > self.limit_bytes:
            raise ResourceLimitError(
                f"resident memory {rss / 1e9:.2f} GB exceeded execution.resources.memory_limit "
                f"{self.limit_bytes / 1e9:.2f} GB; raise execution.resources.memory_limit_gb or shorten the run"
            )
