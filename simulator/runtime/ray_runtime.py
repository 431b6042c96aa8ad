"""Ray runtime: the engine hosts, the router and the Planner as Ray actors.

The coordinator stays in the driver and owns the clock; every message to and from
an actor is msgpack bytes (the same plain data ``LocalRuntime(wire=True)`` round-trips), so
a replay on Ray gives byte for byte what it gives in process. Calls to the engine hosts of
one edge go out together and run in parallel.

Lifecycle: without an address a local Ray is started with ``ray.init`` (usage stats off,
bound to 127.0.0.1, no dashboard) and shut down at the end; with ``auto`` or ``HOST:PORT``
the driver joins that cluster and leaves it running (its actors are killed). A session that
already called ``ray.init`` is used as it is. Ray failing to start, an actor dying or a call
not answering within ``CALL_TIMEOUT_S`` raise ``RuntimeFailure`` (one line, exit code 1).
"""

from __future__ import annotations

import os
import re
import socket
import threading

from simulator.errors import InputError, RuntimeFailure
from simulator.runtime.local import RuntimeCounters, assign_workers, count_step, pack, unpack

CALL_TIMEOUT_S = float(os.environ.get("AISIM_RAY_CALL_TIMEOUT_S", "600"))
START_TIMEOUT_S = float(os.environ.get("AISIM_RAY_START_TIMEOUT_S", "120"))

_ACTORS = None


def _actor_classes():
    """The Ray actor classes (defined on first use: importing this module does not import Ray)."""
    global _ACTORS
    if _ACTORS is not None:
        return _ACTORS
    import ray

    class EngineHostActor:
        def __init__(self, pools, workload, workers) -> None:
            from actors.engine.host import WorkerHost
            from simulator.traffic.workload import BlockHashStore

            self.host = WorkerHost(pools, BlockHashStore(workload), workers)

        def ready(self) -> bool:
            return True

        def step(self, payload: bytes) -> bytes:
            return pack(self.host.step(*unpack(payload)))

        def deliver(self, payload: bytes) -> bytes:
            return pack(self.host.deliver(*unpack(payload)))

        def match_prefix(self, payload: bytes) -> bytes:
            return pack(self.host.match_prefix(unpack(payload)))

        def finish(self, end_ms: float) -> bytes:
            return pack(self.host.finish(end_ms))

    class RouterHostActor:
        def __init__(self, routers) -> None:
            from actors.router.host import RouterHost

            self.host = RouterHost(routers)

        def ready(self) -> bool:
            return True

        def step(self, payload: bytes) -> bytes:
            return pack(self.host.step(*unpack(payload)))

    class PlannerHostActor:
        def __init__(self, planner) -> None:
            from actors.planner.host import PlannerHost

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


def start_ray(address: str | None):
    """Join or start Ray; returns (ray module, whether this call started it)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - ray is a core dependency
        raise RuntimeFailure(f"execution.backend ray needs the ray package ({exc})") from None
    if ray.is_initialized():
        return ray, False
    where = "a local Ray" if address is None else f"the Ray cluster at {address!r}"
    hint = "check --ray-address, or run without it to start a local Ray"
    if address not in (None, "auto"):
        _probe(address, where, hint)
    if address is None:
        kwargs = dict(include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
                      configure_logging=False)
    else:
        kwargs = dict(address=address, log_to_driver=False, configure_logging=False)
    outcome: list = []
    if address in (None, "auto"):  # fails fast when it fails; keeps Ray's signal handlers
        try:
            ray.init(**kwargs)
        except Exception as exc:  # noqa: BLE001 - whatever Ray raises, the user gets one line
            raise RuntimeFailure(f"could not start or join {where}: {type(exc).__name__}: {_first_line(exc)}; "
                                 f"{hint}") from None
        return ray, True

    def init() -> None:  # a listener that is not Ray's GCS would make ray.init retry for ever
        try:
            ray.init(**kwargs)
            outcome.append(None)
        except Exception as exc:  # noqa: BLE001 - whatever Ray raises, the user gets one line
            outcome.append(exc)

    t = threading.Thread(target=init, name="aisim-ray-init", daemon=True)
    t.start()
    t.join(START_TIMEOUT_S)
    if not outcome:
        raise RuntimeFailure(f"could not start or join {where} within {START_TIMEOUT_S:.0f} s; {hint}", category="timeout")
    if outcome[0] is not None:
        exc = outcome[0]
        raise RuntimeFailure(f"could not start or join {where}: {type(exc).__name__}: {_first_line(exc)}; {hint}")
    return ray, True


def _probe(address: str, where: str, hint: str) -> None:
    """Fail fast when nothing listens at HOST:PORT (ray.init would retry for minutes)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise InputError("execution.ray_address", f"expected auto or HOST:PORT, got {address!r}")
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=5).close()
    except OSError as exc:
        raise RuntimeFailure(f"could not join {where}: nothing answers there ({exc.strerror or exc}); {hint}") from None


def _first_line(exc: BaseException) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    return text.splitlines()[0] if text else ""


class RayRuntime:
    name = "ray"
    direct = False  # requests cross in their wire form

    def __init__(self, pools: dict, workload, worker_roles: list[str], engine_actors: int | None, routers: dict,
                 planner=None, address: str | None = None) -> None:
        self.ray, self._started = start_ray(address)
        ray = self.ray
        self.counters = RuntimeCounters()
        self._actors: list = []
        try:
            cpus = int(ray.cluster_resources().get("CPU", 0))
            n = engine_actors or max(1, min(len(worker_roles), cpus))
            self.num_hosts = n
            per_actor = 1 if n <= cpus else 0  # one CPU each when the cluster has them (else share)
            engine_cls, router_cls, planner_cls = _actor_classes()
            pools_ref = ray.put(pools)
            workload_ref = ray.put(workload)
            self.hosts = [engine_cls.options(num_cpus=per_actor, scheduling_strategy="SPREAD").remote(
                pools_ref, workload_ref, ws) for ws in assign_workers(worker_roles, n)]
            self.router = router_cls.options(num_cpus=0).remote(routers)
            self.planner_actor = planner_cls.options(num_cpus=0).remote(planner) if planner is not None else None
            self._actors = self.hosts + [self.router] + ([self.planner_actor] if self.planner_actor else [])
            self._get([a.ready.remote() for a in self._actors], START_TIMEOUT_S, "starting the actors")
        except BaseException:
            self.close()
            raise

    def _get(self, refs, timeout: float = CALL_TIMEOUT_S, what: str = "a call"):
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
    def step(self, calls: dict, start: float, until: float) -> list[dict]:
        refs = [self.hosts[h].step.remote(pack([control, inputs, start, until])) for h, (control, inputs) in calls.items()]
        outs = [unpack(b) for b in self._get(refs, what="an engine step")]
        count_step(self.counters, calls, outs)
        return outs

    def deliver(self, calls: dict, now: float) -> list[dict]:
        refs = [self.hosts[h].deliver.remote(pack([control, inputs, now])) for h, (control, inputs) in calls.items()]
        outs = [unpack(b) for b in self._get(refs, what="a Planner snapshot")]
        count_step(self.counters, calls, outs)
        return outs

    def match_prefix(self, queries: dict) -> dict:
        self.counters.num_calls += len(queries)
        hosts = list(queries)
        refs = [self.hosts[h].match_prefix.remote(pack(queries[h])) for h in hosts]
        return {h: unpack(b) for h, b in zip(hosts, self._get(refs, what="a KV prefix lookup"))}

    def route(self, updates, requests, eligible, ranks_of) -> list:
        self.counters.num_calls += 1
        self.counters.num_messages += len(updates) + len(requests)
        ref = self.router.step.remote(pack([updates, requests, eligible, ranks_of]))
        return unpack(self._get(ref, what="routing"))

    def initial_tick_ms(self) -> float:
        return self._get(self.planner_actor.initial_tick_ms.remote(), what="the Planner's start")

    def tick(self, snapshot, traffic):
        self.counters.num_calls += 1
        return unpack(self._get(self.planner_actor.tick.remote(pack([snapshot, traffic])), what="a Planner tick"))

    def finish(self, end_ms: float) -> list[dict]:
        self.counters.num_calls += self.num_hosts
        return [unpack(b) for b in self._get([h.finish.remote(end_ms) for h in self.hosts], what="the final report")]

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
