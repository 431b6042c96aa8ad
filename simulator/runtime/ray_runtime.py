"""Ray runtime: the engine hosts and the Planner as Ray actors, the router with the coordinator.

The coordinator stays in the driver and owns the clock, and the router lives beside it (each
edge waits for its answer before anything moves: an actor would only add a round trip). Every
message to and from an actor is msgpack bytes (the same plain data ``LocalRuntime(wire=True)``
round-trips), so a replay on Ray gives byte for byte what it gives in process. Calls to the
engine hosts of one edge go out together and run in parallel.

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
import secrets
import select
import socket
import struct
import threading
import time

from aisim.actors.protocol import (
    HostFinish,
    HostOutput,
    WorkerStatus,
    host_finish_from_wire,
    host_output_from_wire,
)
from aisim.actors.router.host import RouterHost
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
            self.busy_s = 0.0  # (seconds answering the edge channel)
            from aisim.simulator.run import tune_gc_for_replay

            tune_gc_for_replay()  # the actor's process only replays

        def ready(self) -> bool:
            return True

        def channel_busy_s(self) -> float:
            """Seconds this host spent answering its channel (unpacking, stepping, packing)."""
            return self.busy_s

        def open_channel(self, token: bytes, accept_timeout_s: float, spin_s: float = 0.0) -> tuple[str, int, str]:
            """Listen for the driver's direct connection (``_Channel``) on this node's address;
            returns (address, port, Ray node id). One connection, which must open with ``token``."""
            import ray

            ip = ray.util.get_node_ip_address()
            node = ray.get_runtime_context().get_node_id()
            srv = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM)
            srv.bind((ip, 0))
            srv.listen(1)
            srv.settimeout(accept_timeout_s)
            threading.Thread(target=_serve, args=(self, srv, token, spin_s), name="aisim-edge-channel",
                             daemon=True).start()
            return ip, srv.getsockname()[1], node

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

        def in_flight(self, payload: bytes) -> bytes:
            return pack(self.host.in_flight(unpack(payload)))

        def finish(self, end_ms: float) -> bytes:
            return pack(self.host.finish(end_ms))

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

    _ACTORS = tuple(ray.remote(c) for c in (EngineHostActor, PlannerHostActor))
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


# -- the edge channels --------------------------------------------------------------------------
# Ray places, starts and supervises the engine-host actors; the calls of an edge go over one TCP
# connection per actor that the driver opens at start (docs/scale.md, "Ray at scale"). A Ray actor
# call costs ~0.7 ms a round trip here (task submission, scheduling, the reply through the owner),
# more than a 10 ms window's work on a host; Ray's compiled graphs cut a round of two actors to
# ~0.16 ms, but their readers spin while they wait (a whole core per idle actor), which on a
# machine with as many actors as cores starves the driver. A socket read blocks: ~0.1 ms a round
# trip, no idle cost.
# A frame: kind (1 byte: a method's index in _METHODS, or in an answer 0 = ok, 1 = failed), length
# (8 bytes, big-endian), then the msgpack payload (a failure: its message, UTF-8).

# how long a process with a core of its own polls for its next frame before it sleeps in a read
# (a driver's edge of serial work takes ~0.3-0.5 ms on the issue-36 bench; see ``_spin``)
SPIN_S = 0.002
_METHODS = ("step", "deliver", "reserve", "match_prefix", "kv_contents", "in_flight")
_HEADER = struct.Struct(">BQ")


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    """``n`` bytes from ``sock``; None at end of stream."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            return None
        got += k
    return bytes(buf)


def _spin(sock: socket.socket, spin_s: float) -> None:
    """Poll ``sock`` for up to ``spin_s`` seconds before a blocking read: a process with a core of
    its own answers the next frame at once instead of after a wake-up (~0.05 ms each way here)."""
    if spin_s <= 0:
        return
    deadline = time.perf_counter() + spin_s
    poll = select.select
    while not poll((sock,), (), (), 0)[0] and time.perf_counter() < deadline:
        pass


def _serve(actor, srv: socket.socket, token: bytes, spin_s: float = 0.0) -> None:
    """An engine-host actor's side of its channel (a thread): accept the driver, check its token,
    then answer frames until the driver closes the connection (``spin_s``: ``_spin`` first)."""
    try:
        conn, _ = srv.accept()
    except OSError:  # (no driver within the timeout: the run failed to start; nothing to serve)
        return
    finally:
        srv.close()
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if _read_exactly(conn, len(token)) != token:
            return
        while True:
            _spin(conn, spin_s)
            header = _read_exactly(conn, _HEADER.size)
            if header is None:
                return
            code, n = _HEADER.unpack(header)
            payload = _read_exactly(conn, n) if n else b""
            if payload is None:
                return
            t0 = time.perf_counter()
            try:
                out, status = getattr(actor, _METHODS[code])(payload), 0
            except Exception as exc:  # noqa: BLE001 - reported to the driver, which raises it
                out, status = f"{type(exc).__name__}: {exc}".encode(), 1
            actor.busy_s += time.perf_counter() - t0
            conn.sendall(_HEADER.pack(status, len(out)) + out)


class _Channel:
    """The driver's connection to one engine-host actor."""

    def __init__(self, address, token: bytes, connect_timeout_s: float, call_timeout_s: float,
                 spin_s: float = 0.0) -> None:
        self.spin_s = spin_s
        host, port = address
        try:
            self.sock = socket.create_connection((host, port), timeout=connect_timeout_s)
        except OSError as exc:
            raise RuntimeFailure(f"could not connect to a Ray engine actor at {host}:{port} ({exc.strerror or exc}); "
                                 "the driver must reach the worker nodes' addresses") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(call_timeout_s)
        self.call_timeout_s = call_timeout_s
        self.sock.sendall(token)

    def send(self, code: int, payload: bytes, what: str) -> None:
        try:
            self.sock.sendall(_HEADER.pack(code, len(payload)) + payload)
        except OSError as exc:
            raise RuntimeFailure(f"a Ray actor died during {what}: its connection failed ({exc})") from None

    def receive(self, what: str) -> bytes:
        try:
            _spin(self.sock, self.spin_s)
            header = _read_exactly(self.sock, _HEADER.size)
            status, n = _HEADER.unpack(header) if header is not None else (None, 0)
            body = _read_exactly(self.sock, n) if header is not None and n else b""
        except TimeoutError:
            raise RuntimeFailure(f"Ray actors did not answer {what} within {self.call_timeout_s:.0f} s "
                                 "(AISIM_RAY_CALL_TIMEOUT_S raises the limit)", category="timeout") from None
        except OSError as exc:
            raise RuntimeFailure(f"a Ray actor died during {what}: its connection failed ({exc})") from None
        if header is None or body is None:
            raise RuntimeFailure(f"a Ray actor died during {what}: its connection closed")
        if status:
            raise RuntimeFailure(f"a Ray actor failed during {what}: {body.decode(errors='replace')}")
        return body

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class RayRuntime:
    name = "ray"
    direct = False  # requests cross in their wire form

    def __init__(self, pools: dict, workload, worker_roles: list[str], engine_actors: int | None, routers: dict,
                 planner=None, address: str | None = None, reserve_cpus: bool = True, driver_host: bool = False,
                 hash_source=None) -> None:
        """``driver_host``: the driver hosts a share of the workers too (host 0), stepping them
        while the actors step theirs (``hash_source``: its block hashes, default the workload's)."""
        # the environment settings, validated before anything starts
        self.call_timeout_s, self.start_timeout_s = call_timeout_s(), start_timeout_s()
        self.ray, self._started = start_ray(address, self.start_timeout_s)
        ray = self.ray
        self.counters = RuntimeCounters()
        self._actors: list = []
        self._mine = None  # host 0's WorkerHost, when the driver steps a share itself
        self._local_busy_s = 0.0
        try:
            cpus = int(ray.cluster_resources().get("CPU", 0))
            mine = 1 if driver_host else 0
            # auto: one actor per CPU (one CPU left to the driver when it hosts workers), at most one per worker
            n = engine_actors or max(1, min(len(worker_roles) - mine, cpus - mine))
            self.num_hosts = n + mine
            self.driver_host = driver_host
            per_actor = 1 if n <= cpus and reserve_cpus else 0  # one CPU each when the cluster has them (else share)
            engine_cls, planner_cls = _actor_classes()
            pools_ref = ray.put(pools)
            workload_ref = ray.put(workload)
            shares = assign_workers(worker_roles, n + mine)
            if driver_host:
                from aisim.actors.engine.host import WorkerHost
                from aisim.simulator.traffic.workload import BlockHashStore

                self._mine = WorkerHost(pools, hash_source or BlockHashStore(workload), shares[0])
            remote = range(mine, n + mine)  # the actors' host numbers
            self.hosts = [engine_cls.options(num_cpus=per_actor, scheduling_strategy="SPREAD").remote(
                pools_ref, workload_ref, shares[h]) for h in remote]
            # the router lives here, with the coordinator: every edge waits for its answer before
            # anything else moves, so an actor of its own would add a round trip per edge (and ship
            # the eligible workers and their ranks each time) for no parallelism
            self.router = RouterHost(routers)
            self.planner_actor = planner_cls.options(num_cpus=0).remote(planner) if planner is not None else None
            self._actors = self.hosts + ([self.planner_actor] if self.planner_actor else [])
            self._get([a.ready.remote() for a in self._actors], self.start_timeout_s, "starting the actors")
            token = secrets.token_bytes(16)
            # every process with a core of its own (the actors' reserved, one left to the driver):
            # each waits for its next frame polling, not asleep
            spin_s = SPIN_S if reserve_cpus and n + 1 <= cpus else 0.0
            addresses = self._get([h.open_channel.remote(token, self.start_timeout_s, spin_s) for h in self.hosts],
                                  self.start_timeout_s, "opening the actors' channels")
            self._channels = {h: _Channel((ip, port), token, self.start_timeout_s, self.call_timeout_s, spin_s)
                              for h, (ip, port, _) in zip(remote, addresses)}
            nodes = {node for _, _, node in addresses}
            if driver_host:
                nodes.add(ray.get_runtime_context().get_node_id())
            self.num_nodes = len(nodes)  # (nodes holding engine hosts)
        except BaseException:
            self.close()
            raise

    def _get(self, refs, timeout: float | None = None, what: str = "a call"):
        if timeout is None:
            timeout = getattr(self, "call_timeout_s", None) or call_timeout_s()
        ray = self.ray
        try:
            return ray.get(refs, timeout=timeout)
        except (ray.exceptions.GetTimeoutError, TimeoutError):
            raise RuntimeFailure(f"Ray actors did not answer {what} within {timeout:.0f} s "
                                 "(AISIM_RAY_CALL_TIMEOUT_S raises the limit)", category="timeout") from None
        except ray.exceptions.RayActorError as exc:
            raise RuntimeFailure(f"a Ray actor died during {what}: {_first_line(exc)}") from None
        except ray.exceptions.RayTaskError as exc:
            raise RuntimeFailure(f"a Ray actor failed during {what}: {_first_line(exc.cause or exc)}") from None

    def _edge(self, method: str, args: dict, what: str, spread: bool = False, wire=None) -> list:
        """``method`` of each host in ``args`` (host -> its arguments, ``spread``: a list of
        them), sent to every actor before any answer is read, so the actors work in parallel (and
        the driver steps its own share meanwhile, called directly); the answers in that order, the
        actors' unpacked and passed through ``wire``."""
        code = _METHODS.index(method)
        channels = self._channels  # (every host but the driver's share)
        for h, a in args.items():
            if h in channels:
                channels[h].send(code, pack(a), what)
        own = None
        if self._mine is not None and 0 in args:
            t0 = time.perf_counter()
            call = getattr(self._mine, method)
            own = call(*args[0]) if spread else call(args[0])
            self._local_busy_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        answers = [channels[h].receive(what) if h in channels else own for h in args]
        self.counters.wait_s += time.perf_counter() - t0
        return [(wire(unpack(a)) if wire else unpack(a)) if h in channels else a for h, a in zip(args, answers)]

    # the coordinator's calls (see LocalRuntime)
    def step(self, calls: dict, start: float, until: float, stop_at_handoff: bool = False,
             watch: bytes | None = None) -> list[HostOutput]:
        args = {h: [control, inputs, start, until, stop_at_handoff, watch] for h, (control, inputs) in calls.items()}
        outs = self._edge("step", args, "an engine step", True, host_output_from_wire)
        count_step(self.counters, calls, outs)
        return outs

    def deliver(self, calls: dict, now: float) -> list[HostOutput]:
        args = {h: [control, inputs, now] for h, (control, inputs) in calls.items()}
        outs = self._edge("deliver", args, "a Planner snapshot", True, host_output_from_wire)
        count_step(self.counters, calls, outs)
        return outs

    def reserve(self, queries: dict) -> tuple[dict, list]:
        self.counters.num_calls += len(queries)
        answers, statuses = {}, []
        outs = self._edge("reserve", queries, "a destination reservation")
        for h, (ok, st) in zip(queries, outs):
            answers[h] = ok
            statuses.extend(WorkerStatus._make(s) for s in st)
        return answers, statuses

    def match_prefix(self, queries: dict) -> dict:
        self.counters.num_calls += len(queries)
        outs = self._edge("match_prefix", queries, "a KV prefix lookup")
        return dict(zip(queries, outs))

    def kv_contents(self, wids: list[int]) -> dict[int, list]:
        self.counters.num_calls += self.num_hosts
        outs = self._edge("kv_contents", {h: wids for h in range(self.num_hosts)}, "the KV cache contents")
        return {wid: ranks for out in outs for wid, ranks in out}

    def in_flight(self) -> list:
        self.counters.num_calls += self.num_hosts
        outs = self._edge("in_flight", {h: None for h in range(self.num_hosts)}, "the requests in flight")
        return [tuple(x) for out in outs for x in out]

    def route(self, updates, requests, eligible, ranks_of) -> list:
        self.counters.num_calls += 1
        self.counters.num_messages += len(updates) + len(requests)
        return self.router.step(updates, requests, eligible, ranks_of)

    def initial_tick_ms(self) -> float:
        return self._get(self.planner_actor.initial_tick_ms.remote(), what="the Planner's start")

    def tick(self, snapshot, traffic, changes=None):
        self.counters.num_calls += 1
        return unpack(self._get(self.planner_actor.tick.remote(pack([snapshot, traffic, changes])), what="a Planner tick"))

    def finish(self, end_ms: float) -> list[HostFinish]:
        self.counters.num_calls += self.num_hosts
        remote = [host_finish_from_wire(unpack(b))
                  for b in self._get([h.finish.remote(end_ms) for h in self.hosts], what="the final report")]
        busy = self._get([h.channel_busy_s.remote() for h in self.hosts], what="the final report")
        if self._mine is None:
            self.counters.host_busy_s = busy
            return remote
        self.counters.host_busy_s = [self._local_busy_s] + busy
        return [self._mine.finish(end_ms)] + remote

    def planner(self):
        if self.planner_actor is None:
            return None
        return self._get(self.planner_actor.planner.remote(), what="the Planner's report")

    def close(self) -> None:
        ray = self.ray
        for c in getattr(self, "_channels", {}).values():
            c.close()
        self._channels = {}
        for a in self._actors:
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._actors = []
        if self._started:
            ray.shutdown()
            self._started = False
