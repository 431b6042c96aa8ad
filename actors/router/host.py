"""A router host: the routers of a replay behind one batched, plain-data interface.

One call applies the workers' published updates (KV events, first tokens, releases) and
then routes a batch of requests in order, each against the eligible workers it names. The
same class runs in process and inside a Ray actor.
"""

from __future__ import annotations

from aisim.actors.hashing import hash_view

# update kinds
UP_KV = 0  # (pool, UP_KV, worker, rank, kind, hashes)
UP_FIRST_TOKEN = 1  # (pool, UP_FIRST_TOKEN, index)
UP_RELEASE = 2  # (pool, UP_RELEASE, index)
UP_PARAMS = 3  # (pool, UP_PARAMS, {knob: value}): the router's knobs from now on (retune)


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
        """Apply ``updates`` in order, then route each ``(pool, index, prompt_len, hashes, now_ms,
        eligible_ref)`` in order; returns ``(worker, rank, info)`` per request."""
        routers = self.routers
        for u in updates:
            router = routers[u[0]]
            kind = u[1]
            if kind == UP_KV:
                router.on_kv_events(u[2], u[3], u[4], hash_view(u[5]))
            elif kind == UP_FIRST_TOKEN:
                router.on_first_token(RouteRequest(u[2]))
            elif kind == UP_RELEASE:
                router.on_release(RouteRequest(u[2]))
            else:
                router.set_parameters(u[2])
        out = []
        for pool, index, prompt_len, hashes, now_ms, ref in requests:
            if hashes is not None:
                hashes = hash_view(hashes)  # (bytes when the request crossed as msgpack)
            wid, rank, info = routers[pool].route(RouteRequest(index, prompt_len, hashes), now_ms, eligible[ref],
                                                  ranks_of)
            out.append((wid, rank, info))
        return out
