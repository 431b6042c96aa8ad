"""The one place that submits work: many calls of one function, run in parallel, answered in order.

    with fanout("local", max_parallel=4, workloads=[plan.traffic.workload]) as fo:
        results = fo.run_trials(plans, timeout_s=600)          # list[TrialResult], in plan order
        values = fo.map(some_module_function, items)            # fn(item) for each item, in item order

Invariants, the same on every backend and for every ``max_parallel``: results come back in item
order; one failing or late item never aborts the batch (it comes back as a ``TrialResult``);
a deterministic ``fn`` gives the same list whatever the backend; workers never outlive the parent.
Semantics of timeouts, ``on_result``, the local and Ray backends and their clean-up: docs/fanout.md.
"""

from __future__ import annotations

import ctypes
import functools
import json
import multiprocessing.util
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as _wait
from typing import Any

from aisim.search.trial import TrialResult, run_dumped_trial, run_monitored_trial
from aisim.search.zygote import import_paths, in_spawner_thread, interpreter_flags, shared_zygote

__all__ = ["Fanout", "LocalFanout", "RayFanout", "fanout", "BACKENDS"]

BACKENDS = ("local", "ray")
_PROTOCOL = pickle.HIGHEST_PROTOCOL


def fanout(backend: str = "local", max_parallel: int | None = None, ray_address: str | None = None,
           workloads: Iterable = ()) -> "Fanout":
    """A Fanout on ``backend`` (``local`` or ``ray``) running at most ``max_parallel`` calls at once
    (None: the machine's CPUs, or the Ray cluster's). ``ray_address`` (Ray only): None starts a local
    Ray (or uses the one this process initialised); ``auto`` or HOST:PORT joins a cluster.
    ``workloads``: the ``Workload`` objects (``plan.traffic.workload``) the plans will share; every
    worker registers them once so plans travel without them."""
    if max_parallel is not None and (isinstance(max_parallel, bool) or not isinstance(max_parallel, int)
                                     or max_parallel < 1):
        raise ValueError(f"max_parallel must be a whole number >= 1, got {max_parallel!r}")
    if backend == "local":
        if ray_address is not None:
            raise ValueError("ray_address needs backend='ray'")
        return LocalFanout(max_parallel, workloads)
    if backend == "ray":
        return RayFanout(max_parallel, ray_address, workloads)
    raise ValueError(f"unknown fan-out backend {backend!r}; use one of {', '.join(BACKENDS)}")


def _unique(workloads: Iterable) -> list:
    out: dict[str, Any] = {}
    for w in workloads:
        out.setdefault(w.digest, w)
    return list(out.values())


class Fanout:
    """Common part of the backends (see the module docs)."""

    backend = ""
    max_parallel: int

    def __init__(self, workloads: Iterable) -> None:
        self._workloads = _unique(workloads)
        self._digests = frozenset(w.digest for w in self._workloads)
        self._closed = False

    # -- the API -------------------------------------------------------------------------------
    def map(self, fn: Callable[[Any], Any], items: Iterable, timeout_s: float | None = None,
            item_timeout_s: float | None = None, on_result: Callable[[int, Any], None] | None = None) -> list:
        """``fn(item)`` for each item, in item order; a call that raised, died or ran out of time is a
        ``TrialResult`` (see the module docs). ``timeout_s`` bounds the whole call; ``item_timeout_s``
        each item from when it starts (a late item is stopped alone, the others go on).
        ``on_result(index, result)`` is called in this process as each item's result arrives (in
        completion order; an exception from it stops the call as an interrupt does)."""
        if self._closed:
            raise RuntimeError("this Fanout is closed")
        for name, value in (("timeout_s", timeout_s), ("item_timeout_s", item_timeout_s)):
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 or None, got {value!r}")
        items = list(items)
        return list(self._map(fn, items, timeout_s, item_timeout_s, _Results(len(items), on_result)))

    def run_trials(self, plans: Sequence, metrics_keys: Sequence[str] | None = None,
                   timeout_s: float | None = None, monitors: Sequence | None = None) -> list[TrialResult]:
        """``run_trial(plan, metrics_keys)`` for each plan, in plan order (plans shipped by reference
        when their workload was given to this Fanout). ``monitors``: one checkpoint-monitor spec (or
        None) per plan, built in the worker (``search.trial.run_monitored_trial``)."""
        keys = None if metrics_keys is None else tuple(metrics_keys)
        if monitors is not None:
            return self.map(run_monitored_trial, [{"plan": self.ship(p), "metrics_keys": keys, "monitor": m}
                                                  for p, m in zip(plans, monitors)], timeout_s)
        fn = run_dumped_trial if keys is None else functools.partial(run_dumped_trial, metrics_keys=keys)
        return self.map(fn, [self.ship(p) for p in plans], timeout_s)

    def start(self, n: int | None = None) -> None:
        """Start workers ahead of the first ``map`` where the backend keeps its own (a no-op here)."""

    def ship(self, plan) -> bytes:
        """``plan`` as bytes for a worker: by reference when its workload is registered there."""
        from aisim.simulator.plan import dump_plan

        return dump_plan(plan, by_reference=plan.traffic.workload.digest in self._digests)

    def worker_pids(self) -> list[int]:
        """The ids of this Fanout's live local worker processes (a diagnostic; empty on Ray)."""
        return []

    def abort(self) -> None:
        """Stop at once what a ``map`` in another thread runs, where the backend can: its items
        end failed (their worker died) and it returns; the Fanout stays usable (new workers start
        on the next ``map``). Ray: nothing is stopped, the tasks finish."""

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> "Fanout":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _map(self, fn, items: list, timeout_s: float | None, item_timeout_s: float | None,
             results: "_Results") -> list:
        raise NotImplementedError


class _Results(list):
    """A map's results, one slot per item; filling a slot tells ``on_result`` (when given)."""

    def __init__(self, n: int, on_result: Callable[[int, Any], None] | None) -> None:
        super().__init__([None] * n)
        self._on_result = on_result

    def __setitem__(self, i, value) -> None:
        super().__setitem__(i, value)
        if self._on_result is not None:
            self._on_result(i, value)


# ==== local: a pool of worker processes ==========================================================

class _Worker:
    __slots__ = ("proc", "conn")

    def __init__(self, proc, conn: Connection) -> None:  # proc: a subprocess.Popen or a zygote.ForkedProcess
        self.proc = proc
        self.conn = conn

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def end(self, kill: bool, wait_s: float = 2.0) -> None:
        """Kill it (or, when idle, let it leave: closing the pipe ends its loop) and reap it."""
        try:
            self.conn.close()
        except OSError:
            pass
        if kill:
            self.proc.kill()
        try:
            self.proc.wait(timeout=None if kill else wait_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class _Workers:
    """The worker processes of one LocalFanout (no reference back to it: its finalizer holds this)."""

    def __init__(self, blob: bytes) -> None:
        self.blob = blob  # the pickled workloads, each worker's first message
        self.all: list[_Worker] = []

    def grow(self, n: int) -> None:
        """Replace workers that died while idle, then start workers up to ``n``."""
        for w in [w for w in self.all if not w.alive()]:
            self.remove(w, kill=True)
        if n > len(self.all):
            self.all.extend(in_spawner_thread(_start_workers, n - len(self.all), self.blob))

    def remove(self, w: _Worker, kill: bool) -> None:
        if w in self.all:  # (not after close())
            self.all.remove(w)
        w.end(kill)

    def close(self, grace_s: float = 2.0) -> None:
        """Close every pipe (an idle worker then leaves), give them ``grace_s`` in all, kill the rest."""
        workers, self.all = self.all, []
        for w in workers:
            try:
                w.conn.close()
            except OSError:
                pass
        end = time.monotonic() + grace_s
        for w in workers:
            w.end(False, max(0.0, end - time.monotonic()))


class LocalFanout(Fanout):
    """``fanout(backend="local")``: see the module docs."""

    backend = "local"

    def __init__(self, max_parallel: int | None = None, workloads: Iterable = ()) -> None:
        super().__init__(workloads)
        self.max_parallel = max_parallel or os.cpu_count() or 1
        self._pool = _Workers(pickle.dumps(self._workloads, protocol=_PROTOCOL))
        # runs on close(), when the Fanout is garbage-collected, and at exit (before multiprocessing
        # joins its child processes)
        self._finalizer = multiprocessing.util.Finalize(self, self._pool.close, exitpriority=10)

    def worker_pids(self) -> list[int]:
        return sorted(w.pid for w in self._pool.all if w.alive())

    def start(self, n: int | None = None) -> None:
        """Start ``n`` (default ``max_parallel``) workers now, so they load the simulator while the
        caller prepares its first items (else the first ``map`` starts them)."""
        if self._closed:
            raise RuntimeError("this Fanout is closed")
        self._pool.grow(min(self.max_parallel, n or self.max_parallel))

    def abort(self) -> None:
        for w in list(self._pool.all):  # (the map reads their pipes' end at once)
            w.proc.kill()

    def close(self) -> None:
        super().close()
        self._finalizer()

    def _map(self, fn, items: list, timeout_s: float | None, item_timeout_s: float | None,
             results: "_Results") -> list:
        payloads = [pickle.dumps((fn, item), protocol=_PROTOCOL) for item in items]  # unpicklable: raise now
        n = len(items)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        todo = deque(range(n))
        sends = [0] * n
        running: dict[_Worker, tuple[int, float]] = {}  # worker -> (item, when sent)
        pool = self._pool
        try:
            while todo or running:
                if todo:
                    pool.grow(min(self.max_parallel, len(todo) + len(running)))
                    for w in [w for w in pool.all if w not in running]:
                        if not todo:
                            break
                        i = todo.popleft()
                        try:
                            w.conn.send_bytes(payloads[i])
                        except OSError:  # it died while idle: replace it and send again (once)
                            pool.remove(w, kill=True)
                            sends[i] += 1
                            if sends[i] >= 2:
                                results[i] = _died(w)
                            else:
                                todo.appendleft(i)
                            continue
                        running[w] = (i, time.monotonic())
                if not running:
                    continue
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                if item_timeout_s is not None:  # stop the items past their own limit, alone
                    now = time.monotonic()
                    for w, (i, since) in list(running.items()):
                        if now - since >= item_timeout_s:
                            del running[w]
                            pool.remove(w, kill=True)
                            results[i] = TrialResult.timed_out(item_timeout_s, now - since)
                    if not running:
                        continue
                    first_end = min(since for _, since in running.values()) + item_timeout_s - now
                    remaining = first_end if remaining is None else min(remaining, first_end)
                # a dead worker's pipe reads EOF; the 1 s cap also catches one whose pipe a
                # process it forked still holds open
                ready = _wait_ready(list(running), 1.0 if remaining is None else max(0.0, min(remaining, 1.0)))
                for w, (i, _) in list(running.items()):
                    if w.conn not in ready and w.alive():
                        continue
                    del running[w]
                    try:
                        data = w.conn.recv_bytes() if w.conn.poll() else None
                    except (EOFError, OSError):
                        data = None
                    if data is None:  # the worker died running it
                        pool.remove(w, kill=True)
                        results[i] = _died(w)
                        continue
                    try:
                        results[i] = pickle.loads(data)
                    except Exception as exc:  # noqa: BLE001 - a result that does not unpickle here
                        results[i] = TrialResult.from_exception(exc)
        except BaseException:  # interrupted: nothing keeps running behind the caller's back
            for w in running:
                pool.remove(w, kill=True)
            raise
        now = time.monotonic()
        for w, (i, since) in running.items():  # past the deadline
            pool.remove(w, kill=True)
            results[i] = TrialResult.timed_out(timeout_s, now - since)
        for i in todo:
            results[i] = TrialResult.timed_out(timeout_s)
        return results


def _wait_ready(workers: list[_Worker], timeout: float) -> set:
    return set(_wait([w.conn for w in workers], timeout))


def _died(w: _Worker) -> TrialResult:
    code = w.proc.returncode
    how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
    return TrialResult("failed", "runtime", f"the worker process {w.pid} {how} while running this item "
                       "(out of memory, or killed from outside?)")


# Where there is no zygote (search.zygote: workers forked from a process that imported the
# simulator), a worker is a fresh interpreter running this (not multiprocessing's spawn, which
# would re-run the parent's __main__ script in every worker): the parent's sys.path, then _worker_main.
_BOOT = ("import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
         "from aisim.search.fanout import _worker_main; _worker_main(int(sys.argv[2]), int(sys.argv[3]))")


def _start_workers(n: int, blob: bytes) -> list[_Worker]:
    zygote = shared_zygote()
    paths = None if zygote is not None else json.dumps(import_paths())
    started = []
    try:
        for _ in range(n):
            mine, theirs = socket.socketpair()
            try:
                if zygote is not None:
                    proc = zygote.fork(theirs.fileno())
                else:
                    proc = subprocess.Popen(
                        [sys.executable, *interpreter_flags(), "-c", _BOOT, paths, str(theirs.fileno()),
                         str(os.getpid())], pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
            except BaseException:
                mine.close()
                raise
            finally:
                theirs.close()
            started.append(_Worker(proc, Connection(mine.detach())))
    except BaseException:
        for w in started:
            w.end(True)
        raise
    for w in started:  # after all started, so they import the simulator side by side
        try:
            w.conn.send_bytes(blob)
        except OSError:  # died at once: its first item finds out (and says how)
            pass
    return started


# -- in the worker -------------------------------------------------------------------------------
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> None:
    """Linux: SIGKILL this process when its parent ends; exit now if it already has (the race
    between the parent dying and prctl). Elsewhere nothing (the parent's exit closes the workers)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:  # noqa: BLE001 - no prctl: rely on the parent closing us
        return
    if os.getppid() != parent_pid:
        os._exit(1)


def _worker_main(fd: int, parent_pid: int) -> None:
    """A worker's loop: the workloads first, then (fn, item) calls answered one by one."""
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    conn = Connection(fd)
    init_error = None
    try:
        _register_workloads(pickle.loads(conn.recv_bytes()))
        import aisim.simulator.run  # noqa: F401 - load the simulator once, not in the first trial
    except (EOFError, OSError):
        return
    except BaseException as exc:  # noqa: BLE001 - reported with every call instead
        init_error = TrialResult("failed", "runtime", f"the fan-out worker could not start: {_one_line(exc)}")
    while True:
        try:
            payload = conn.recv_bytes()
        except (EOFError, OSError):  # the parent closed the pipe (or is gone)
            return
        result = init_error or _call_payload(payload)
        try:
            out = pickle.dumps(result, protocol=_PROTOCOL)
        except Exception as exc:  # noqa: BLE001
            out = pickle.dumps(TrialResult.from_exception(exc), protocol=_PROTOCOL)
        try:
            conn.send_bytes(out)
        except OSError:
            return


def _one_line(exc: BaseException) -> str:
    from aisim.search.trial import one_line

    return one_line(exc)


def _call_payload(payload: bytes):
    t0 = time.perf_counter()
    try:
        fn, item = pickle.loads(payload)
    except Exception as exc:  # noqa: BLE001 - e.g. fn's module does not import here
        return TrialResult.from_exception(exc, time.perf_counter() - t0)
    return _call(fn, item)


def _call(fn, item):
    t0 = time.perf_counter()
    try:
        return fn(item)
    except Exception as exc:  # noqa: BLE001 - a failed item, not a failed batch
        return TrialResult.from_exception(exc, time.perf_counter() - t0)


_REGISTERED: set[str] = set()  # the workload digests registered in this process (by a fan-out)


def _register_workloads(workloads) -> None:
    from aisim.simulator.plan import register_workload

    for w in workloads:
        _REGISTERED.add(register_workload(w))


# ==== Ray: one task per item ========================================================================

_RAY_TASK = None


def _ray_task():
    """The remote function (defined on first use: importing this module does not import Ray)."""
    global _RAY_TASK
    if _RAY_TASK is None:
        import ray

        _RAY_TASK = ray.remote(num_cpus=1, max_retries=0)(_ray_call)
    return _RAY_TASK


def _ray_call(payload: bytes, paths: list[str], workloads):
    """In a Ray worker: the driver's ``sys.path`` entries this process lacks (appended: the task's
    function may live outside the installed packages, e.g. under tests/), the workloads it has not
    registered yet (``workloads``: ``[(digest, [ref])]``, nested so Ray does not fetch them for every
    task), then ``fn(item)`` from ``payload``."""
    sys.path.extend(p for p in paths if p not in sys.path)
    missing = [ref for digest, (ref,) in workloads if digest not in _REGISTERED]
    if missing:
        import ray

        _register_workloads(ray.get(missing))
    return _call_payload(payload)


class RayFanout(Fanout):
    """``fanout(backend="ray")``: see the module docs."""

    backend = "ray"

    def __init__(self, max_parallel: int | None = None, ray_address: str | None = None,
                 workloads: Iterable = ()) -> None:
        super().__init__(workloads)
        from aisim.simulator.runtime.ray_runtime import start_ray

        self._ray, self._started = start_ray(ray_address)
        try:
            ray = self._ray
            self.max_parallel = max_parallel or max(1, int(ray.cluster_resources().get("CPU", 1)))
            self._workload_refs = [(w.digest, [ray.put(w)]) for w in self._workloads]
            self._task = _ray_task()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._closed:
            return
        super().close()
        self._workload_refs = []
        if self._started:
            self._started = False
            self._ray.shutdown()

    def _map(self, fn, items: list, timeout_s: float | None, item_timeout_s: float | None,
             results: "_Results") -> list:
        ray = self._ray
        payloads = [pickle.dumps((fn, item), protocol=_PROTOCOL) for item in items]  # unpicklable: raise now
        paths = import_paths()
        n = len(items)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        todo = deque(range(n))
        running: dict = {}  # ObjectRef -> (item, when submitted)
        try:
            while todo or running:
                while todo and len(running) < self.max_parallel:
                    i = todo.popleft()
                    running[self._task.remote(payloads[i], paths, self._workload_refs)] = (i, time.monotonic())
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                if item_timeout_s is not None:  # stop the tasks past their own limit, alone
                    now = time.monotonic()
                    late = [ref for ref, (_, since) in running.items() if now - since >= item_timeout_s]
                    self._cancel(late)
                    for ref in late:
                        i, since = running.pop(ref)
                        results[i] = TrialResult.timed_out(item_timeout_s, now - since)
                    if not running:
                        continue
                    first_end = min(since for _, since in running.values()) + item_timeout_s - now
                    remaining = first_end if remaining is None else min(remaining, first_end)
                ready, _ = ray.wait(list(running), num_returns=1, timeout=max(0.0, remaining) if remaining is not None else None)
                for ref in ready:
                    i, _ = running.pop(ref)
                    results[i] = self._get(ref)
        except BaseException:
            self._cancel(list(running))
            raise
        now = time.monotonic()
        self._cancel(list(running))
        for i, since in running.values():
            results[i] = TrialResult.timed_out(timeout_s, now - since)
        for i in todo:
            results[i] = TrialResult.timed_out(timeout_s)
        return results

    def _get(self, ref):
        ray = self._ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:  # raised outside fn (e.g. its arguments did not load)
            cause = exc.cause if isinstance(getattr(exc, "cause", None), BaseException) else exc
            return TrialResult.from_exception(cause)
        except ray.exceptions.RayError as exc:  # the worker died, the object was lost, ...
            return TrialResult("failed", "runtime", f"the Ray task failed: {_one_line(exc)}")

    def _cancel(self, refs: list) -> None:
        for ref in refs:
            try:
                self._ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - finished meanwhile
                pass
