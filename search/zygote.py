"""Local fan-out workers forked from a zygote: one helper process that imported the simulator once
and forks a worker on request, so a worker starts in milliseconds instead of the ~0.6 s (more on a
loaded machine) a fresh interpreter takes to import it (docs/fanout.md, "Local workers").

The zygote is a fresh interpreter (started like a worker used to be: ``python -c``, the parent's
``sys.path`` and flags) that is single-threaded, so forking it is safe where forking the parent
(threads: lanes, the spawner, a progress display) is not. Each fork request carries what a fresh
interpreter would have taken from the parent at that moment: the environment, the working
directory and ``sys.path``; and the worker end of a socket pair (``SCM_RIGHTS``). The zygote
answers with the worker's pid and a pidfd, so the parent watches, signals and waits for a process
that is not its child without any pid-reuse race, and asks the zygote for the exit status it reaped.

No orphans: the zygote dies with the parent (``PR_SET_PDEATHSIG``, set from the fan-out's
long-lived spawner thread) and every worker dies with the zygote (the same signal, set in the
forked child), so killing the parent ends the chain. Linux only (``os.pidfd_open``); elsewhere
``available()`` is False and workers start as fresh interpreters.
"""

from __future__ import annotations

import json
import os
import pickle
import queue
import select
import signal
import socket
import subprocess
import sys
import threading

__all__ = ["Zygote", "ForkedProcess", "available", "prepare", "shared_zygote", "in_spawner_thread",
           "interpreter_flags", "import_paths"]

# what a worker needs loaded before its first item (each import here is one a worker no longer
# pays): what every trial imports, and per search the modules of its trials; ``prepare(search)``
# loads one search's (the zygote is ready sooner), a zygote started by a fan-out loads them all
PRELOAD_COMMON = ("aisim.simulator.run", "aisim.search.trial", "aisim.simulator.config.loading",
                  "aisim.simulator.metrics.timeline",
                  "aisim.simulator.metrics.csv_out", "aisim.simulator.checkpoints",
                  "aisim.simulator.catalog.kv_capacity", "numpy.random")
PRELOAD_SEARCH = {"capacity": ("aisim.search.capacity.runner", "aisim.search.capacity.early"),
                  "spica": ("aisim.search.spica.trial",)}
PRELOAD = PRELOAD_COMMON + tuple(m for mods in PRELOAD_SEARCH.values() for m in mods)
_BOOT = ("import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
         "from aisim.search.zygote import _zygote_main; "
         "_zygote_main(int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4]))")
_MAX_MSG = 1 << 22


# -- starting processes: from one long-lived thread -----------------------------------------------
# PR_SET_PDEATHSIG fires when the *thread* that started the process ends, so the zygote and fresh
# workers are started from one helper thread that lives as long as the process, never from a
# caller's (maybe short-lived) thread.
_SPAWNER: tuple[int, "queue.SimpleQueue"] | None = None  # (the pid that started it, its call queue)
_SPAWNER_LOCK = threading.Lock()


def _spawner_loop(calls: "queue.SimpleQueue") -> None:
    while True:
        fn, args, done = calls.get()
        try:
            done.append((True, fn(*args)))
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            done.append((False, exc))
        done[0].set()


def in_spawner_thread(fn, *args):
    """``fn(*args)`` run in this process's spawner thread (the caller waits for it). The thread
    is a daemon: it lives as long as the process and never holds the process's exit."""
    global _SPAWNER
    with _SPAWNER_LOCK:
        if _SPAWNER is None or _SPAWNER[0] != os.getpid():  # (a forked child has no such thread)
            calls: queue.SimpleQueue = queue.SimpleQueue()
            threading.Thread(target=_spawner_loop, args=(calls,), name="aisim-fanout-spawner", daemon=True).start()
            _SPAWNER = (os.getpid(), calls)
        calls = _SPAWNER[1]
    done: list = [threading.Event()]
    calls.put((fn, args, done))
    done[0].wait()
    ok, value = done[1]
    if not ok:
        raise value
    return value


def import_paths() -> list[str]:
    """This process's ``sys.path`` with the working directory spelled out (a child process that
    starts elsewhere imports what this one would)."""
    return [p or os.getcwd() for p in sys.path]


def interpreter_flags() -> list[str]:
    """-E, -s, -X ... as this process has them (a child interpreter gets the same)."""
    try:
        return list(subprocess._args_from_interpreter_flags())
    except Exception:  # noqa: BLE001 - another Python: plain flags
        return []


_SHARED: tuple[int, "Zygote"] | None = None  # (the pid that started it, the zygote)


def shared_zygote(preload: tuple[str, ...] = PRELOAD) -> "Zygote | None":
    """This process's zygote, started on first use (call in the spawner thread); None where
    workers start as fresh interpreters (``available()`` False). One that died is replaced, and so
    is one whose aisim sources changed since it started (a long-lived session, a notebook, that
    edits the simulator gets workers with the new code, as fresh interpreters would; the old
    zygote stays for the workers it already forked)."""
    global _SHARED
    if not available():
        return None
    if _SHARED is None or _SHARED[0] != os.getpid() or not _SHARED[1].alive() \
            or _sources_mtime() > _SHARED[1].sources_mtime:
        import multiprocessing.util

        _SHARED = (os.getpid(), Zygote([sys.executable, *interpreter_flags()], preload))
        multiprocessing.util.Finalize(None, _SHARED[1].close, exitpriority=5)  # after the fan-outs' (10)
    return _SHARED[1]


def prepare(search: str | None = None) -> None:
    """Start this process's zygote now, so it imports the simulator while the caller loads its
    config (the first local workers then start in milliseconds); ``search`` (a ``PRELOAD_SEARCH``
    key): preload only what that search's trials import. Cheap to import and call."""
    in_spawner_thread(shared_zygote, PRELOAD_COMMON + PRELOAD_SEARCH[search] if search else PRELOAD)


_SOURCE_PACKAGES = ("aisim.simulator", "aisim.actors", "aisim.search")


def _sources_mtime() -> float:
    """The latest modification time of the Python sources the zygote imports (~200 files)."""
    import importlib.util

    latest = 0.0
    for name in _SOURCE_PACKAGES:
        spec = importlib.util.find_spec(name)
        for root in (spec.submodule_search_locations or ()) if spec is not None else ():
            for dirpath, dirs, files in os.walk(root):
                dirs[:] = [d for d in dirs if d != "__pycache__"]
                for f in files:
                    if f.endswith(".py"):
                        latest = max(latest, os.stat(os.path.join(dirpath, f)).st_mtime)
    return latest


def available() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "pidfd_open") and hasattr(socket, "send_fds") \
        and hasattr(signal, "pidfd_send_signal")


class Zygote:
    """The parent's handle on its zygote: ``fork()`` a worker, ``reap(pid)`` its exit status. Safe
    to call from several threads (one request at a time). Start it from a long-lived thread."""

    def __init__(self, argv_prefix: list[str], preload: tuple[str, ...] = PRELOAD) -> None:
        self.sources_mtime = _sources_mtime()  # (before it starts importing them)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            paths = json.dumps(import_paths())
            self.proc = subprocess.Popen([*argv_prefix, "-c", _BOOT, paths, str(theirs.fileno()), str(os.getpid()),
                                          json.dumps(list(preload))],
                                         pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        self.sock = mine
        self.lock = threading.Lock()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def fork(self, worker_fd: int) -> "ForkedProcess":
        """A worker forked with ``worker_fd`` (sent, not closed here) as its end of the pipe, the
        environment, working directory and ``sys.path`` of this process now."""
        req = pickle.dumps(("fork", dict(os.environ), os.getcwd(), import_paths()))
        with self.lock:
            socket.send_fds(self.sock, [req], [worker_fd])
            msg, fds, _, _ = socket.recv_fds(self.sock, _MAX_MSG, 1)
        if not msg:
            raise OSError("the fan-out zygote ended")
        pid = pickle.loads(msg)
        if isinstance(pid, str):  # the zygote could not fork
            for fd in fds:
                os.close(fd)
            raise OSError(pid)
        return ForkedProcess(self, pid, fds[0])

    def reap(self, pid: int) -> int | None:
        """The exit status of worker ``pid`` (as ``Popen.returncode``) once it has ended; None while
        it runs. A worker of a zygote that is gone is reported killed (its death signal)."""
        try:
            with self.lock:
                self.sock.send(pickle.dumps(("reap", pid)))
                msg = self.sock.recv(_MAX_MSG)
        except OSError:
            msg = b""
        return pickle.loads(msg) if msg else -signal.SIGKILL

    def close(self) -> None:
        """End it at once (it holds nothing; a worker it forked dies with it)."""
        try:
            self.sock.close()
        except OSError:
            pass
        self.proc.kill()
        self.proc.wait()


class ForkedProcess:
    """What the fan-out uses of ``subprocess.Popen``, for a worker forked by the zygote: ``pid``,
    ``returncode``, ``poll()``, ``kill()``, ``wait(timeout)``."""

    def __init__(self, zygote: Zygote, pid: int, pidfd: int) -> None:
        self.zygote = zygote
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd: int | None = pidfd

    def poll(self) -> int | None:
        if self.returncode is None and self._ended(0.0):
            self._reap()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not self._ended(timeout):
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
            self._reap()
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None and self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _ended(self, timeout: float | None) -> bool:
        if self._pidfd is None:
            return True
        return bool(select.select([self._pidfd], [], [], timeout)[0])  # a pidfd reads ready on exit

    def _reap(self) -> None:
        code = self.zygote.reap(self.pid)
        self.returncode = -signal.SIGKILL if code is None else code  # (None: ended, not yet reapable)
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def __del__(self) -> None:
        if self._pidfd is not None:
            try:
                os.close(self._pidfd)
            except OSError:
                pass


# -- in the zygote -------------------------------------------------------------------------------------

def _zygote_main(fd: int, parent_pid: int, preload: list[str]) -> None:
    """Import what workers need, then fork one per request until the parent closes the socket."""
    from aisim.search import fanout

    fanout._die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    import importlib

    for name in preload:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the worker imports it again and reports the error
            pass
    me = os.getpid()
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, _MAX_MSG, 1)
        except OSError:
            os._exit(0)
        if not msg:  # the parent closed the socket (or is gone)
            os._exit(0)
        req = pickle.loads(msg)
        if req[0] == "reap":
            sock.send(pickle.dumps(_reap(req[1])))
            continue
        _, env, cwd, path = req
        try:
            pid = os.fork()
        except OSError as exc:
            for f in fds:
                os.close(f)
            sock.send(pickle.dumps(f"the fan-out zygote could not fork a worker: {exc}"))
            continue
        if pid == 0:  # the worker
            code = 0
            try:
                sock.close()
                os.environ.clear()
                os.environ.update(env)
                try:
                    os.chdir(cwd)
                except OSError:
                    pass
                sys.path[:] = path
                fanout._worker_main(fds[0], me)
            except BaseException:  # noqa: BLE001 - the pipe's EOF tells the parent
                code = 1
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        for f in fds:
            os.close(f)
        pidfd = os.pidfd_open(pid)  # (the child cannot be reaped before this: only we reap it)
        try:
            socket.send_fds(sock, [pickle.dumps(pid)], [pidfd])
        finally:
            os.close(pidfd)


def _reap(pid: int) -> int | None:
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return os.waitstatus_to_exitcode(status) if done else None
