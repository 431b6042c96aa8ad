"""A router host: the routers of a replay behind one batched, plain-data interface.

One call applies the workers' published updates (KV events, first tokens, releases) and
then routes a batch of requests in order, each against the eligible workers it names. The
same class runs in process and inside a Ray actor.
"""

from __future__ import annotations

from aisim.actors.hashing import hash_view
from aisim.actors.protocol import UpdateKind

_KV, _FIRST_TOKEN, _RELEASE, _HANDED_OFF = (int(k) for k in (UpdateKind.KV, UpdateKind.FIRST_TOKEN, UpdateKind.RELEASE,
                                                              UpdateKind.HANDED_OFF))


class RouteRequest:
    """What a routing policy reads of a request."""

    __slots__ = ("index", "prompt_len", "hashes")

    def __init__(self, index: int, prompt_len: int = 0, hashes=None) -> None:
        self.index = index
        self.prompt_len = prompt_len
        self.hashes = hashes

    def block_hashes(self, block_size: int):
        return self.hashes


class RouterHost:
    def __init__(self, routers: dict) -> None:
        self.routers = routers  # pool key -> routing policy

    def step(self, updates, requests, eligible, ranks_of) -> list:
        """Apply ``updates`` (``KvUpdate``, ``RequestUpdate``, ``ParamsUpdate``: ``actors.protocol``) in
        order, then route each ``RouteCall`` in order; returns a ``RouteDecision`` per call."""
        routers = self.routers
        for u in updates:
            router = routers[u[0]]
            kind = u[1]
            if kind == _KV:
                wid = u[2]
                for rank, k, hashes in u[3]:
                    router.on_kv_events(wid, rank, k, hash_view(hashes))
            elif kind == _FIRST_TOKEN:
                router.on_first_token(RouteRequest(u[2]))
            elif kind == _RELEASE:
                router.on_release(RouteRequest(u[2]))
            elif kind == _HANDED_OFF:
                r = RouteRequest(u[2])
                router.on_first_token(r)
                router.on_release(r)
            else:
                router.set_parameters(u[2])
        out = []
        for pool, index, prompt_len, hashes, now_ms, ref in requests:  # RouteCall
            if hashes is not None:
                hashes = hash_view(hashes)  # (bytes when the request crossed as msgpack)
            out.append(routers[pool].route(RouteRequest(index, prompt_len, hashes), now_ms, eligible[ref], ranks_of))
        return out
