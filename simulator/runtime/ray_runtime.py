"""Ray runtime: the engine hosts, the router and the Planner as Ray actors.

The coordinator stays in the driver and owns the clock; every message to and from
an actor is msgpack bytes (the same plain data ``LocalRuntime(wire=True)`` round-trips), so
a replay on Ray gives byte for byte what it gives in process. Calls to the engine hosts of
one edge go out together and run in parallel.

Lifecycle: without an address a fresh local Ray is started with ``ray.init(address="local")``
(usage stats off, no dashboard; never a cluster named by RAY_ADDRESS or a leftover
``ray_current_cluster`` file) and shut down at the end, also when its start fails or is
interrupted; with ``auto`` or ``HOST:PORT`` the driver joins that cluster and leaves it running
(its actors are killed). A session that already called ``ray.init`` is used as it is. What Ray
prints in the driver goes to stderr (stdout is aisim's). A cluster that wants token
authentication is named as such. Ray failing to start, an actor dying or a call
not answering within ``$AISIM_RAY_CALL_TIMEOUT_S`` seconds (600) raise ``RuntimeFailure`` (one line, exit code 1).
"""

from __future__ import annotations

import os
import re
import socket
import threading

from aisim.actors.protocol import (
    HostFinish,
    HostOutput,
    WorkerStatus,
    host_finish_from_wire,
    host_output_from_wire,
)
from aisim.simulator.config.env import env_float
from aisim.simulator.errors import AisimError, InputError, RuntimeFailure
from aisim.simulator.runtime.local import RuntimeCounters, assign_workers, count_step, pack, unpack

# environment settings, read (and validated) when a Ray runtime starts, never at import:


def call_timeout_s() -> float:
    """Seconds an actor call may take: ``$AISIM_RAY_CALL_TIMEOUT_S`` (> 0), default 600."""
    return env_float("AISIM_RAY_CALL_TIMEOUT_S", 600.0)


def start_timeout_s() -> float:
    """Seconds Ray and the actors may take to start: ``$AISIM_RAY_START_TIMEOUT_S`` (> 0), default 120."""
    return env_float("AISIM_RAY_START_TIMEOUT_S", 120.0)


_ACTORS = None


def _actor_classes():
    """The Ray actor classes (defined on first use: importing this module does not import Ray)."""
    global _ACTORS
    if _ACTORS is not None:
        return _ACTORS
    import ray

    class EngineHostActor:
        def __init__(self, pools, workload, workers) -> None:
            from aisim.actors.engine.host import WorkerHost
            from aisim.simulator.traffic.workload import BlockHashStore

            self.host = WorkerHost(pools, BlockHashStore(workload), workers)
            from aisim.simulator.run import tune_gc_for_replay

            tune_gc_for_replay()  # the actor's process only replays

        def ready(self) -> bool:
            return True

        def step(self, payload: bytes) -> bytes:
            return pack(self.host.step(*unpack(payload)))

        def deliver(self, payload: bytes) -> bytes:
            return pack(self.host.deliver(*unpack(payload)))

        def match_prefix(self, payload: bytes) -> bytes:
            return pack(self.host.match_prefix(unpack(payload)))

        def reserve(self, payload: bytes) -> bytes:
            return pack(self.host.reserve(unpack(payload)))

        def kv_contents(self, payload: bytes) -> bytes:
            return pack(self.host.kv_contents(unpack(payload)))

        def finish(self, end_ms: float) -> bytes:
            return pack(self.host.finish(end_ms))

    class RouterHostActor:
        def __init__(self, routers) -> None:
            from aisim.actors.router.host import RouterHost

            self.host = RouterHost(routers)

        def ready(self) -> bool:
            return True

        def step(self, payload: bytes) -> bytes:
            return pack(self.host.step(*unpack(payload)))

    class PlannerHostActor:
        def __init__(self, planner) -> None:
            from aisim.actors.planner.host import PlannerHost

            self.host = PlannerHost(planner)

        def ready(self) -> bool:
            return True

        def initial_tick_ms(self) -> float:
            return self.host.initial_tick_ms()

        def tick(self, payload: bytes) -> bytes:
            return pack(self.host.tick(*unpack(payload)))

        def planner(self):
            return self.host.planner  # once, at the end (pickled)

    _ACTORS = tuple(ray.remote(c) for c in (EngineHostActor, RouterHostActor, PlannerHostActor))
    return _ACTORS


def start_ray(address: str | None, start_timeout: float | None = None):
    """Join or start Ray; returns (ray module, whether this call started it). ``start_timeout``:
    seconds to wait for a cluster at HOST:PORT (None: ``start_timeout_s()``).

    Without an address this always starts a fresh local Ray (``address="local"``): never a cluster
    named by ``RAY_ADDRESS`` or by the ``ray_current_cluster`` file an earlier ``ray start`` left in
    Ray's temp directory (that cluster may be long gone). ``auto`` resolves as Ray does (RAY_ADDRESS,
    then that file, then a Ray running on this machine) and names where the address came from when
    it fails. A cluster that wants token authentication is named as such (``InvalidAuthToken``)."""
    if start_timeout is None:
        start_timeout = start_timeout_s()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - ray is a core dependency
        raise RuntimeFailure(f"execution.backend ray needs the ray package ({exc})") from None
    _driver_output_to_stderr(ray)
    if ray.is_initialized():
        return ray, False
    from aisim.simulator.runtime.resources import set_phase

    if address is None:
        set_phase("starting a local Ray")
        _start_local(ray)
        return ray, True
    target, source = _resolve(address)
    if source == "--ray-address":
        where, key = f"the Ray cluster at {address!r}", "execution.ray_address"
        hint = "check --ray-address, or run without it to start a local Ray"
    elif source == "RAY_ADDRESS":
        where, key = f"the Ray cluster at {target!r} (from RAY_ADDRESS, for --ray-address auto)", "RAY_ADDRESS"
        hint = "fix or unset RAY_ADDRESS, or run without --ray-address to start a local Ray"
    elif source == "process":
        where, key = f"the Ray cluster at {target!r} (a Ray running on this machine, for --ray-address auto)", None
        hint = "pass --ray-address HOST:PORT, or run without --ray-address to start a local Ray"
    else:
        where, key = f"the Ray cluster at {target!r} (recorded in {source} by an earlier `ray start`)", None
        hint = ("that cluster may be gone: start it again with `ray start --head`, delete that file, or run "
                "without --ray-address to start a local Ray")
    set_phase(f"joining {where}")
    if "://" not in target:  # (ray:// is Ray Client: ray.init handles it)
        _probe(target, where, hint, key)
    # a preflight answers an auth rejection at once (ray.init retries it for ~20 s); not where Ray
    # itself would switch token auth on (auto finding a cluster of this machine, a token at hand)
    preflight = "://" not in target and source in ("--ray-address", "RAY_ADDRESS")
    kwargs = dict(address=address, log_to_driver=False, configure_logging=False)
    outcome: list = []

    def init() -> None:  # a listener that is not Ray's GCS would make ray.init retry for ever
        try:
            if preflight:
                _check_auth(target)
            ray.init(**kwargs)
            outcome.append(None)
        except Exception as exc:  # noqa: BLE001 - whatever Ray raises, the user gets one line
            outcome.append(exc)

    t = threading.Thread(target=init, name="aisim-ray-init", daemon=True)
    t.start()
    t.join(start_timeout)
    if not outcome:
        raise RuntimeFailure(f"could not join {where} within {start_timeout:.0f} s; {hint}", category="timeout")
    if outcome[0] is not None:
        exc = outcome[0]
        if _is_auth_error(exc):
            raise RuntimeFailure(_auth_message(target)) from None
        raise RuntimeFailure(f"could not join {where}: {type(exc).__name__}: {_first_line(exc)}; {hint}")
    return ray, True


def _start_local(ray) -> None:
    """A fresh local Ray (``address="local"``, RAY_ADDRESS set aside meanwhile); on any failure, or an
    interruption (a watchdog, Ctrl-C), what it started is shut down."""
    from aisim.simulator.runtime.resources import descendants

    saved = os.environ.pop("RAY_ADDRESS", None)
    before = descendants()
    try:
        ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
                 configure_logging=False)
    except AisimError:
        _abandon(ray, before)
        raise
    except Exception as exc:  # noqa: BLE001 - whatever Ray raises, the user gets one line
        _abandon(ray, before)
        raise RuntimeFailure(f"could not start a local Ray: {type(exc).__name__}: {_first_line(exc)}; "
                             f"Ray's logs are under {_ray_temp_dir()}/session_latest/logs") from None
    except BaseException:
        _abandon(ray, before)
        raise
    finally:
        if saved is not None:
            os.environ["RAY_ADDRESS"] = saved


def _abandon(ray, before: set[int]) -> None:
    """A local start that failed or was interrupted: shut Ray down, and end every process it started
    (an interrupted ``ray.init`` may not have handed its node to ``ray.shutdown``; the raylet's agents
    would outlive this process)."""
    from aisim.simulator.runtime.resources import descendants, end_processes

    try:
        ray.shutdown()
    except BaseException:  # noqa: BLE001 - already failing: the first error is the one to report
        pass
    try:
        end_processes(descendants() - before, grace_s=0.5)  # (whatever is left then: SIGKILL)
    except Exception:  # noqa: BLE001
        pass


def _ray_temp_dir() -> str:
    try:
        from ray._common.utils import get_default_ray_temp_dir

        return get_default_ray_temp_dir()
    except Exception:  # noqa: BLE001 - another Ray layout
        import tempfile

        return os.path.join(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir(), "ray")


def _resolve(address: str) -> tuple[str, str]:
    """(HOST:PORT, where it came from: ``--ray-address``, ``RAY_ADDRESS``, the address file's path or
    ``process``). ``auto`` resolves in Ray's order; none found is a ``RuntimeFailure``."""
    if address != "auto":
        return address, "--ray-address"
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if env:
        return env, "RAY_ADDRESS"
    path = os.path.join(_ray_temp_dir(), "ray_current_cluster")
    try:
        with open(path, encoding="utf-8") as fh:
            recorded = fh.read().strip()
    except OSError:
        recorded = ""
    if recorded:
        return recorded, path
    try:
        from ray._private.services import find_gcs_addresses

        running = sorted(find_gcs_addresses())
    except Exception:  # noqa: BLE001 - another Ray layout: let ray.init look
        return "auto", "process"
    if len(running) == 1:
        return running[0], "process"
    if len(running) > 1:
        raise RuntimeFailure(f"--ray-address auto found several Ray clusters on this machine ({', '.join(running)}); "
                             "pass one as --ray-address HOST:PORT")
    raise RuntimeFailure(f"--ray-address auto found no Ray cluster: RAY_ADDRESS is unset, there is no {path} and no "
                         "Ray runs on this machine; start one with `ray start --head`, pass --ray-address HOST:PORT, "
                         "or run without --ray-address to start a local Ray")


def _probe(address: str, where: str, hint: str, key: str | None = "execution.ray_address") -> None:
    """Fail fast when nothing listens at HOST:PORT (ray.init would retry for minutes)."""
    if address == "auto":
        return
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        if key is None:
            raise RuntimeFailure(f"could not join {where}: {address!r} is not HOST:PORT; {hint}")
        raise InputError(key, f"expected auto or HOST:PORT, got {address!r}")
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=5).close()
    except OSError as exc:
        raise RuntimeFailure(f"could not join {where}: nothing answers there ({exc.strerror or exc}); {hint}") from None


def _check_auth(address: str) -> None:
    """Raise what Ray raises when the GCS at ``address`` refuses this process's credentials (one
    call; anything else is left to ``ray.init``)."""
    try:
        from ray._raylet import GcsClient
    except Exception:  # noqa: BLE001 - another Ray layout: ray.init reports it, later
        return
    try:
        GcsClient(address=address)
    except Exception as exc:  # noqa: BLE001
        if _is_auth_error(exc):
            raise


_AUTH_MARKS = ("InvalidAuthToken", "Unauthenticated", "UNAUTHENTICATED", "authentication token")


def _is_auth_error(exc: BaseException) -> bool:
    """Whether ``exc`` or an exception it was raised from is a token-authentication refusal (Ray
    chains it: ConnectionError from RuntimeError whose text holds ``AuthenticationError: ...
    InvalidAuthToken``)."""
    seen = 0
    while exc is not None and seen < 16:
        if type(exc).__name__ == "AuthenticationError" or any(m in str(exc) for m in _AUTH_MARKS):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def _auth_message(address: str) -> str:
    token_where = "RAY_AUTH_TOKEN, a file named by RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token"
    if os.environ.get("RAY_AUTH_MODE", "").strip().lower() == "token":
        return (f"the Ray cluster at {address} rejected this machine's authentication token (InvalidAuthToken); "
                f"RAY_AUTH_MODE=token is set: give the cluster's token ({token_where}); see README, Running on Ray")
    return (f"the Ray cluster at {address} requires token authentication (InvalidAuthToken); set "
            f"RAY_AUTH_MODE=token and the cluster's token ({token_where}); see README, Running on Ray")


_STDOUT_PATCHED = False


def _driver_output_to_stderr(ray) -> None:
    """What Ray prints in the driver (a dead worker's ``(raylet) ...`` line from the error listener,
    worker logs when forwarded) goes to stderr, never stdout: stdout is aisim's own (``--format json``).
    Ray's listener thread calls ``ray._private.worker.print_to_stdstream`` with ``is_err=False`` for
    those lines; this wraps it (once per process) to mark every batch as stderr."""
    global _STDOUT_PATCHED
    if _STDOUT_PATCHED:
        return
    try:
        worker = ray._private.worker
        original = worker.print_to_stdstream
    except AttributeError:  # another Ray layout: nothing to redirect here
        return

    def print_to_stderr(data, *args, **kwargs):
        if isinstance(data, dict) and not data.get("is_err"):
            data = dict(data, is_err=True)
        return original(data, *args, **kwargs)

    print_to_stderr.__wrapped__ = original
    worker.print_to_stdstream = print_to_stderr
    _STDOUT_PATCHED = True


def _first_line(exc: BaseException) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    return text.splitlines()[0] if text else ""


class RayRuntime:
    name = "ray"
    direct = False  # requests cross in their wire form

    def __init__(self, pools: dict, workload, worker_roles: list[str], engine_actors: int | None, routers: dict,
                 planner=None, address: str | None = None, reserve_cpus: bool = True) -> None:
        # the environment settings, validated before anything starts
        self.call_timeout_s, self.start_timeout_s = call_timeout_s(), start_timeout_s()
        self.ray, self._started = start_ray(address, self.start_timeout_s)
        ray = self.ray
        self.counters = RuntimeCounters()
        self._actors: list = []
        try:
            cpus = int(ray.cluster_resources().get("CPU", 0))
            n = engine_actors or max(1, min(len(worker_roles), cpus))
            self.num_hosts = n
            per_actor = 1 if n <= cpus and reserve_cpus else 0  # one CPU each when the cluster has them (else share)
            engine_cls, router_cls, planner_cls = _actor_classes()
            pools_ref = ray.put(pools)
            workload_ref = ray.put(workload)
            self.hosts = [engine_cls.options(num_cpus=per_actor, scheduling_strategy="SPREAD").remote(
                pools_ref, workload_ref, ws) for ws in assign_workers(worker_roles, n)]
            self.router = router_cls.options(num_cpus=0).remote(routers)
            self.planner_actor = planner_cls.options(num_cpus=0).remote(planner) if planner is not None else None
            self._actors = self.hosts + [self.router] + ([self.planner_actor] if self.planner_actor else [])
            self._get([a.ready.remote() for a in self._actors], self.start_timeout_s, "starting the actors")
        except BaseException:
            self.close()
            raise

    def _get(self, refs, timeout: float | None = None, what: str = "a call"):
        if timeout is None:
            timeout = getattr(self, "call_timeout_s", None) or call_timeout_s()
        ray = self.ray
        try:
            return ray.get(refs, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeFailure(f"Ray actors did not answer {what} within {timeout:.0f} s "
                                 "(AISIM_RAY_CALL_TIMEOUT_S raises the limit)", category="timeout") from None
        except ray.exceptions.RayActorError as exc:
            raise RuntimeFailure(f"a Ray actor died during {what}: {_first_line(exc)}") from None
        except ray.exceptions.RayTaskError as exc:
            raise RuntimeFailure(f"a Ray actor failed during {what}: {_first_line(exc.cause or exc)}") from None

    # the coordinator's calls (see LocalRuntime)
    def step(self, calls: dict, start: float, until: float, stop_at_handoff: bool = False) -> list[HostOutput]:
        refs = [self.hosts[h].step.remote(pack([control, inputs, start, until, stop_at_handoff]))
                for h, (control, inputs) in calls.items()]
        outs = [host_output_from_wire(unpack(b)) for b in self._get(refs, what="an engine step")]
        count_step(self.counters, calls, outs)
        return outs

    def deliver(self, calls: dict, now: float) -> list[HostOutput]:
        refs = [self.hosts[h].deliver.remote(pack([control, inputs, now])) for h, (control, inputs) in calls.items()]
        outs = [host_output_from_wire(unpack(b)) for b in self._get(refs, what="a Planner snapshot")]
        count_step(self.counters, calls, outs)
        return outs

    def reserve(self, queries: dict) -> tuple[dict, list]:
        self.counters.num_calls += len(queries)
        hosts = list(queries)
        refs = [self.hosts[h].reserve.remote(pack(queries[h])) for h in hosts]
        answers, statuses = {}, []
        for h, b in zip(hosts, self._get(refs, what="a destination reservation")):
            ok, st = unpack(b)
            answers[h] = ok
            statuses.extend(WorkerStatus._make(s) for s in st)
        return answers, statuses

    def match_prefix(self, queries: dict) -> dict:
        self.counters.num_calls += len(queries)
        hosts = list(queries)
        refs = [self.hosts[h].match_prefix.remote(pack(queries[h])) for h in hosts]
        return {h: unpack(b) for h, b in zip(hosts, self._get(refs, what="a KV prefix lookup"))}

    def kv_contents(self, wids: list[int]) -> dict[int, list]:
        self.counters.num_calls += self.num_hosts
        outs = self._get([h.kv_contents.remote(pack(wids)) for h in self.hosts], what="the KV cache contents")
        return {wid: ranks for b in outs for wid, ranks in unpack(b)}

    def route(self, updates, requests, eligible, ranks_of) -> list:
        self.counters.num_calls += 1
        self.counters.num_messages += len(updates) + len(requests)
        ref = self.router.step.remote(pack([updates, requests, eligible, ranks_of]))
        return unpack(self._get(ref, what="routing"))

    def initial_tick_ms(self) -> float:
        return self._get(self.planner_actor.initial_tick_ms.remote(), what="the Planner's start")

    def tick(self, snapshot, traffic, changes=None):
        self.counters.num_calls += 1
        return unpack(self._get(self.planner_actor.tick.remote(pack([snapshot, traffic, changes])), what="a Planner tick"))

    def finish(self, end_ms: float) -> list[HostFinish]:
        self.counters.num_calls += self.num_hosts
        return [host_finish_from_wire(unpack(b))
                for b in self._get([h.finish.remote(end_ms) for h in self.hosts], what="the final report")]

    def planner(self):
        if self.planner_actor is None:
            return None
        return self._get(self.planner_actor.planner.remote(), what="the Planner's report")

    def close(self) -> None:
        ray = self.ray
        for a in self._actors:
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._actors = []
        if self._started:
            ray.shutdown()
            self._started = False
