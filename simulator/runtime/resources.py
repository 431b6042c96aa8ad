"""Host limits of a replay (``execution.resources``): memory ceiling, CPU pinning, init timeout.

Memory: ``ResourceGuard`` compares this process's resident memory with the limit. ``check()`` (the
coordinator calls it every 256 edges) reads it there and then; ``start()`` (or ``with guard:``)
also samples it every 50 ms on a daemon thread, so loading the config and the trace and starting
Ray are bounded too, and a limit below what the interpreter and its libraries already hold fails
at once. The peak is the kernel's high-water mark (``VmHWM``: this process only, reset at exec;
``ru_maxrss`` is not, a child inherits its parent's) once the run raises it, so a spike between
two samples counts. Crossing the limit is ``ResourceLimitError``: exit code 3 (``resource_limited``).

Initialisation: ``InitWatchdog`` bounds it (``initialization_timeout_seconds``, counted from the
command's start) instead of checking it afterwards: a start that hangs (a trace that loads for
ever, a Ray that never answers) ends with ``InitTimeoutError`` (exit code 124) about when the
limit passes.

How a watcher stops the main thread: it sends SIGALRM to the main thread, whose handler raises
``LimitSignal``, a ``BaseException`` so that no ``except Exception`` on the way (Ray's retry loops,
a loader's fallbacks) swallows it; every ``finally`` and ``except BaseException`` cleanup runs
(a Ray the run started is shut down), and leaving ``with guard:`` / ``with watchdog:`` turns it
into the error. If the main thread does not take the signal within ``grace_s`` (stuck in C code,
SIGALRM blocked) or does not finish unwinding within ``cleanup_s``, the watcher runs
``on_hard_exit``, ends the processes started below this one since it was armed (a Ray's raylet
and its agents), writes the one-line error to stderr and ends the process (``os._exit``).
Signals need the main thread; elsewhere only that last resort is left
(``hard_exit=False`` turns it off: then ``check()`` and ``tripped`` report the breach).
"""

from __future__ import annotations

import collections
import os
import resource
import signal
import sys
import threading
import time

from aisim.simulator.config.models import Resources
from aisim.simulator.errors import AisimError, InitTimeoutError, ResourceLimitError

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

MEMORY_SETTING = "execution.resources.memory_limit_gb"
INIT_SETTING = "execution.resources.initialization_timeout_seconds"


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


def _status() -> tuple[int, int] | None:
    """(VmRSS, VmHWM) in bytes from /proc/self/status; None where it cannot be read."""
    rss = hwm = None
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    if rss is None or hwm is None:
        return None
    return rss, hwm


def current_rss_bytes() -> int:
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return peak_rss_bytes()


def peak_rss_bytes() -> int:
    """This process's peak resident memory: ``VmHWM`` where /proc has it (``ru_maxrss`` survives
    exec, so a small child of a big parent would report the parent's peak), else ``ru_maxrss``."""
    st = _status()
    if st is not None:
        return st[1]
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


def _size(b: float) -> str:
    """Bytes for a message: MB below 1 GB (so 101 MB over a 100 MB limit reads as such), else GB."""
    return f"{b / 1e6:.0f} MB" if b < 1e9 else f"{b / 1e9:.2f} GB"


# -- processes this one started --------------------------------------------------------------
def descendants(pid: int | None = None) -> set[int]:
    """The live (not zombie) processes below ``pid`` (default: this one), from /proc; empty where
    there is no /proc."""
    root = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return set()
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as fh:
                data = fh.read()
            state, ppid = data[data.rindex(")") + 2:].split()[:2]
        except (OSError, ValueError, IndexError):
            continue
        if state != "Z":
            children.setdefault(int(ppid), []).append(int(name))
    out: set[int] = set()
    todo = [root]
    while todo:
        for c in children.get(todo.pop(), ()):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def end_processes(pids, grace_s: float = 2.0) -> None:
    """SIGTERM ``pids``, then SIGKILL those still there after ``grace_s``."""
    pids = set(pids)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    end = time.monotonic() + grace_s
    while pids and time.monotonic() < end:
        time.sleep(0.05)
        pids = {p for p in pids if _alive(p)}
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            data = fh.read()
        return data[data.rindex(")") + 2:].split()[0] != "Z"
    except (OSError, ValueError, IndexError):
        return False


# -- stopping the main thread -------------------------------------------------------------
class LimitSignal(BaseException):
    """A watcher stopped the main thread; ``error`` is what to report. A ``BaseException`` so that no
    ``except Exception`` swallows it; ``with guard:`` / ``with watchdog:`` (or ``unwrap``) turn it
    into ``error``."""

    def __init__(self, error: AisimError) -> None:
        super().__init__(str(error))
        self.error = error


def unwrap(exc: BaseException) -> BaseException:
    """The error a ``LimitSignal`` carries; any other exception as it is."""
    return exc.error if isinstance(exc, LimitSignal) else exc


class _MainThreadSignal:
    """SIGALRM, sent to the main thread, raises the error a watcher posted (one handler for all
    watchers, installed while any is armed; a SIGALRM nobody posted goes to the previous handler)."""

    SIGNUM = getattr(signal, "SIGALRM", None)

    def __init__(self) -> None:
        self._users = 0
        self._previous = None
        self._main_ident: int | None = None
        self._posted: collections.deque = collections.deque()

    def acquire(self) -> bool:
        """Install the handler (main thread only); False where signals cannot be used."""
        if (self.SIGNUM is None or not hasattr(signal, "pthread_kill")
                or threading.current_thread() is not threading.main_thread()):
            return False
        if self._users == 0:
            previous = signal.signal(self.SIGNUM, self._handle)
            if previous != self._handle:  # (still installed after a release off the main thread)
                self._previous = previous
            self._main_ident = threading.main_thread().ident
        self._users += 1
        return True

    def release(self) -> None:
        self._users -= 1
        if self._users > 0 or threading.current_thread() is not threading.main_thread():
            return  # (off the main thread the handler stays: it passes unposted signals on)
        self._posted.clear()
        signal.signal(self.SIGNUM, signal.SIG_IGN)  # drops a SIGALRM still pending
        signal.signal(self.SIGNUM, self._previous if self._previous is not None else signal.SIG_DFL)
        self._previous = None

    def post(self, owner: "_Watcher", error: AisimError) -> None:
        """From a watcher thread: raise ``error`` in the main thread."""
        self._posted.append((owner, error))
        signal.pthread_kill(self._main_ident, self.SIGNUM)

    def _handle(self, signum, frame) -> None:
        posted = False
        while self._posted:
            owner, error = self._posted.popleft()
            posted = True
            if owner._armed:
                owner._delivered.set()
                raise LimitSignal(error)
        if not posted and callable(self._previous):
            self._previous(signum, frame)


_MAIN = _MainThreadSignal()
_ARMED: list["_Watcher"] = []


def set_phase(phase: str) -> None:
    """What the process is doing now (``loading the trace``, ``starting a local Ray``), for the
    message of a watcher that trips."""
    for w in list(_ARMED):
        w.phase = phase


class _Watcher:
    """A daemon thread that may stop the main thread with an error (see the module docstring)."""

    exit_code = 1
    kind = "watcher"

    def __init__(self, *, grace_s: float, cleanup_s: float, hard_exit: bool, on_hard_exit, label: str) -> None:
        self.grace_s = grace_s
        self.cleanup_s = cleanup_s
        self.hard_exit = hard_exit
        self.on_hard_exit = on_hard_exit
        self.label = label
        self.phase = "starting"
        self.tripped: AisimError | None = None
        self._armed = False
        self._signals = False
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._delivered = threading.Event()
        self._thread: threading.Thread | None = None
        self._children0: set[int] = set()

    def _arm(self) -> None:
        self._done.clear()
        self._delivered.clear()
        self._children0 = descendants()  # what runs below this process already is not this run's
        self._signals = _MAIN.acquire()
        self._armed = True
        _ARMED.append(self)
        self._thread = threading.Thread(target=self._run, name=f"aisim-{self.kind}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Disarm (idempotent; from the main thread where it was started)."""
        if not self._armed:
            return
        self._armed = False  # first: a signal already on its way is ignored from now on
        try:
            with self._lock:  # no post is half done after this
                pass
        finally:
            self._done.set()
            if self in _ARMED:
                _ARMED.remove(self)
            if self._signals:
                self._signals = False
                _MAIN.release()

    @property
    def active(self) -> bool:
        return self._armed

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop()
        if isinstance(exc, LimitSignal):
            raise exc.error from None

    def start(self):  # pragma: no cover - overridden
        raise NotImplementedError

    def _run(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _wait(self, condition, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while not condition():
            left = end - time.monotonic()
            if left <= 0:
                return False
            self._done.wait(min(0.05, left))
        return True

    def _trip(self, error: AisimError) -> None:
        """From the watcher thread: stop the main thread with ``error``."""
        with self._lock:
            if not self._armed:
                return
            self.tripped = error
            if self._signals:
                _MAIN.post(self, error)
        if not self.hard_exit:
            return
        # taken: the signal handler raised it, or (without signals) check() did; then the main thread unwinds
        if self._wait(lambda: self._done.is_set() or self._delivered.is_set(), self.grace_s) \
                and self._wait(self._done.is_set, self.cleanup_s):
            return
        if self._armed:
            self._exit_now(error)

    def _exit_now(self, error: AisimError) -> None:
        """The last resort: ``on_hard_exit``, the processes started since the watcher was armed ended
        (a Ray this run started: its raylet's agents would outlive an ``os._exit``), one line on
        stderr, then ``os._exit``."""
        if self.on_hard_exit is not None:
            def run() -> None:
                try:
                    self.on_hard_exit(error)
                except BaseException:  # noqa: BLE001 - nothing may stop the exit
                    pass

            t = threading.Thread(target=run, name=f"aisim-{self.kind}-exit", daemon=True)
            t.start()
            t.join(self.cleanup_s)
        try:
            end_processes(descendants() - self._children0, grace_s=1.0)
        except BaseException:  # noqa: BLE001
            pass
        try:
            sys.stderr.write(f"{self.label}: error: {error}\n")
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001
            pass
        os._exit(self.exit_code)


class InitWatchdog(_Watcher):
    """Bounds initialisation: ``limit_s`` after ``started_at`` (a ``time.perf_counter()`` reading,
    default now) the main thread gets ``InitTimeoutError`` (exit code 124). ``start()`` raises it at
    once when the time is already up. Stop it when the replay starts (``stop()``, or leave ``with``)."""

    exit_code = InitTimeoutError.exit_code
    kind = "init-watchdog"

    def __init__(self, limit_s: float, *, started_at: float | None = None, setting: str = INIT_SETTING,
                 grace_s: float = 1.0, cleanup_s: float = 5.0, hard_exit: bool = True, on_hard_exit=None,
                 label: str = "aisim") -> None:
        super().__init__(grace_s=grace_s, cleanup_s=cleanup_s, hard_exit=hard_exit, on_hard_exit=on_hard_exit,
                         label=label)
        self.limit_s = float(limit_s)
        self.started_at = time.perf_counter() if started_at is None else started_at
        self.setting = setting
        self.phase = "initialising"
        self._left = 0.0

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started_at

    def error(self) -> InitTimeoutError:
        return InitTimeoutError(f"initialisation took longer than {self.setting} ({self.limit_s:g} s): still "
                                f"{self.phase} after {self.elapsed_s():.1f} s; raise it for very large traces")

    def start(self) -> "InitWatchdog":
        if self._armed:
            return self
        left = self.limit_s - self.elapsed_s()
        if left <= 0:
            raise self.error()
        self._left = left
        self._arm()
        return self

    def _run(self) -> None:
        if self._done.wait(self._left):
            return
        self._trip(self.error())


class ResourceGuard(_Watcher):
    """Raises ``ResourceLimitError`` when this process's resident memory crosses ``limit_bytes``
    (None: no limit, the peak is still recorded): in ``check()``, and once ``start()`` ran, from a
    thread sampling every ``interval_s`` (see the module docstring). ``peak_observed``: the highest
    resident memory seen since the guard was made."""

    exit_code = ResourceLimitError.exit_code
    kind = "memory-guard"

    def __init__(self, limit_bytes: int | None, *, interval_s: float = 0.05, setting: str = MEMORY_SETTING,
                 grace_s: float = 1.0, cleanup_s: float = 5.0, hard_exit: bool = True, on_hard_exit=None,
                 label: str = "aisim") -> None:
        super().__init__(grace_s=grace_s, cleanup_s=cleanup_s, hard_exit=hard_exit, on_hard_exit=on_hard_exit,
                         label=label)
        self.limit_bytes = limit_bytes
        self.interval_s = interval_s
        self.setting = setting
        self.phase = "running"
        st = _status()
        # the process's high-water mark counts once this run raises it (before, it may be an earlier run's)
        self._hwm0 = st[1] if st is not None else None
        self.peak_observed = st[0] if st is not None else current_rss_bytes()
        self._on_check: list = []

    def sample(self) -> int:
        """The resident memory now; updates ``peak_observed``."""
        st = _status()
        if st is None:
            rss = current_rss_bytes()
            peak = rss
        else:
            rss, hwm = st
            peak = hwm if self._hwm0 is not None and hwm > self._hwm0 else rss
        if peak > self.peak_observed:
            self.peak_observed = peak
        return rss

    def _over(self) -> bool:
        return self.limit_bytes is not None and self.peak_observed > self.limit_bytes

    def error(self, rss: int | None = None) -> ResourceLimitError:
        peak = self.peak_observed
        rss = peak if rss is None else rss
        what = (f"resident memory {_size(rss)}" if rss >= peak else
                f"resident memory peaked at {_size(peak)} ({_size(rss)} now), which")
        return ResourceLimitError(
            f"{what} exceeded execution.resources.memory_limit {_size(self.limit_bytes)} while {self.phase}; "
            f"raise {self.setting} or shorten the run")

    def check(self) -> None:
        if self._on_check:
            hooks, self._on_check = self._on_check, []
            for fn in hooks:
                fn()
        rss = self.sample()
        if self.tripped is None and self._over():
            self.tripped = self.error(rss)
        if self.tripped is not None:
            self._delivered.set()  # the main thread has it (the sampler's last resort waits for the unwinding)
            raise self.tripped

    def on_next_check(self, fn) -> None:
        """Call ``fn()`` at the next ``check()`` (the coordinator's first one: the replay runs)."""
        self._on_check.append(fn)

    def start(self) -> "ResourceGuard":
        """Check now and keep sampling. Raises ``ResourceLimitError`` at once when the process already
        holds more than the limit (the interpreter and its libraries alone: the limit is too low)."""
        if self._armed:
            return self
        rss = self.sample()
        if self._over():
            self.tripped = ResourceLimitError(
                f"{self.setting} ({_size(self.limit_bytes)}) is below what aisim needs to start: "
                f"{_size(rss)} resident already (Python and its libraries, before the trace is read); "
                f"raise {self.setting}")
            raise self.tripped
        self._arm()
        return self

    def _run(self) -> None:
        while not self._done.wait(self.interval_s):
            rss = self.sample()
            if self.tripped is None and self._over():
                self._trip(self.error(rss))
                return
