"""Where the coordinator's actors live: in process (``LocalRuntime``, the default).

A runtime hosts the engine hosts, the router host and the planner host and carries the
coordinator's plain-data messages to them. The runtime interface (``num_hosts``, ``direct``,
``step``, ``deliver``, ``match_prefix``, ``route``, ``initial_tick_ms``, ``tick``, ``finish``,
``planner``, ``close``, ``counters``) is what ``simulator.coordinator.Coordinator`` calls;
``simulator.runtime.ray_runtime.RayRuntime`` implements the same one over Ray actors.

``LocalRuntime`` calls its hosts directly. With one engine host (the default) requests cross
as the ``Request`` objects themselves (``direct``); with several hosts they cross in their
wire form, and ``wire=True`` also round-trips every message through msgpack, exactly as on
Ray, so the two can be compared without Ray.
"""

from __future__ import annotations

import msgpack

from aisim.actors.engine.host import HostPool, WorkerHost
from aisim.actors.planner.host import PlannerHost
from aisim.actors.protocol import (
    HostFinish,
    HostOutput,
    WorkerStatus,
    host_finish_from_wire,
    host_output_from_wire,
)
from aisim.actors.router.host import RouterHost


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data: bytes):
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def assign_workers(worker_roles: list[str], num_hosts: int) -> list[list[tuple[int, str]]]:
    """Worker ``wid`` lives on host ``wid % num_hosts`` (workers added later too)."""
    out: list[list[tuple[int, str]]] = [[] for _ in range(num_hosts)]
    for wid, role in enumerate(worker_roles):
        out[wid % num_hosts].append((wid, role))
    return out


class RuntimeCounters:
    """Calls made and messages carried (events back, inputs out)."""

    def __init__(self) -> None:
        self.num_calls = 0
        self.num_host_calls = 0
        self.num_messages = 0
        # wall-clock figures of a runtime whose hosts run elsewhere (None in process): seconds the
        # driver waited for the hosts' answers, and each host's seconds answering
        self.wait_s = 0.0
        self.host_busy_s: list[float] | None = None

    def as_dict(self) -> dict:
        out = {"num_calls": self.num_calls, "num_host_calls": self.num_host_calls,
               "num_messages": self.num_messages,
               "messages_per_call": self.num_messages / self.num_calls if self.num_calls else 0.0}
        if self.host_busy_s is not None:
            out["driver_wait_s"] = self.wait_s
            out["host_busy_s"] = self.host_busy_s
        return out


def count_step(counters: RuntimeCounters, calls: dict, outs: list) -> None:
    counters.num_calls += len(calls)
    counters.num_host_calls += len(calls)
    counters.num_messages += sum(len(inputs) + len(control) for control, inputs in calls.values())
    counters.num_messages += sum(len(o.events) + len(o.kv) for o in outs)


class LocalRuntime:
    name = "local"
    num_nodes = 1  # (machines holding engine hosts)

    def __init__(self, pools: dict[str, HostPool], hash_source, worker_roles: list[str], num_hosts: int,
                 routers: dict, planner=None, wire: bool = False) -> None:
        self.num_hosts = num_hosts
        # objects may be shared only within one host: a handed-off request's source and
        # destination would otherwise both hold (and change) the same object
        self.direct = num_hosts == 1 and not wire
        self.hosts = [WorkerHost(pools, hash_source, ws, self.direct) for ws in assign_workers(worker_roles, num_hosts)]
        self.router = RouterHost(routers)
        self.planner_host = PlannerHost(planner) if planner is not None else None
        self.wire = wire
        self.counters = RuntimeCounters()

    def _w(self, obj):
        return unpack(pack(obj)) if self.wire else obj

    def _out(self, out: HostOutput) -> HostOutput:
        return host_output_from_wire(unpack(pack(out))) if self.wire else out

    # the coordinator's calls; ``calls`` maps host -> (control, inputs)
    def step(self, calls: dict, start: float, until: float, stop_at_handoff: bool = False,
             watch: bytes | None = None) -> list[HostOutput]:
        outs = [self._out(self.hosts[h].step(*self._w([control, inputs, start, until, stop_at_handoff, watch])))
                for h, (control, inputs) in calls.items()]
        count_step(self.counters, calls, outs)
        return outs

    def deliver(self, calls: dict, now: float) -> list[HostOutput]:
        outs = [self._out(self.hosts[h].deliver(*self._w([control, inputs, now])))
                for h, (control, inputs) in calls.items()]
        count_step(self.counters, calls, outs)
        return outs

    def reserve(self, queries: dict) -> tuple[dict, list]:
        """Each host's destinations reserve their blocks (``ReserveQuery`` lists by host): the
        answers by host and the statuses of the workers asked."""
        self.counters.num_calls += len(queries)
        answers, statuses = {}, []
        for h, q in queries.items():
            ok, st = self._w(self.hosts[h].reserve(self._w(q)))
            answers[h] = ok
            statuses.extend(WorkerStatus._make(s) for s in st)
        return answers, statuses

    def match_prefix(self, queries: dict) -> dict:
        self.counters.num_calls += len(queries)
        return {h: self._w(self.hosts[h].match_prefix(self._w(q))) for h, q in queries.items()}

    def route(self, updates, requests, eligible, ranks_of) -> list:
        self.counters.num_calls += 1
        self.counters.num_messages += len(updates) + len(requests)
        return self._w(self.router.step(*self._w([updates, requests, eligible, ranks_of])))

    def kv_contents(self, wids: list[int]) -> dict[int, list]:
        self.counters.num_calls += self.num_hosts
        return {wid: ranks for h in self.hosts for wid, ranks in self._w(h.kv_contents(self._w(wids)))}

    def in_flight(self) -> list:
        """Every hosted request's (arrival_ms, first_token_ms, first_admit_ms), as of now."""
        self.counters.num_calls += self.num_hosts
        return [tuple(x) for h in self.hosts for x in self._w(h.in_flight())]

    def initial_tick_ms(self) -> float:
        return self.planner_host.initial_tick_ms()

    def tick(self, snapshot, traffic, changes=None):
        self.counters.num_calls += 1
        return self._w(self.planner_host.tick(*self._w([snapshot, traffic, changes])))

    def finish(self, end_ms: float) -> list[HostFinish]:
        self.counters.num_calls += self.num_hosts
        return [host_finish_from_wire(self._w(h.finish(end_ms))) if self.wire else h.finish(end_ms) for h in self.hosts]

    def planner(self):
        return self.planner_host.planner if self.planner_host is not None else None

    def close(self) -> None:
        pass
