"""Speculative decoding of one rank: how many draft tokens a decode pass verifies and how many of
them are accepted (docs/speculative-decoding.md).

A decode pass of a request verifies ``draft_tokens`` drafts (MTP heads or n-gram prompt lookup)
and emits ``1 + a`` tokens: the ``a`` leading drafts accepted plus the target model's own next
token, clipped to what the request may still generate. Draft ``t`` is accepted with probability
``rates[t]`` given that the ones before it were (the first rejection ends the burst), so
``P(a >= t) = thresholds[t - 1] = rates[0] x ... x rates[t - 1]``; one uniform number ``u`` per pass
decides the burst: ``a = #{t : u < thresholds[t - 1]}`` (the same distribution as one draw per draft).

MTP's ``nextn_accepted = x`` (mean accepted drafts per pass) becomes the rates ``[1] x floor(x) +
[x - floor(x)]``: every pass accepts ``floor(x)`` drafts and one more with probability
``x - floor(x)``, the reference's draw.

Determinism: each request has its own SplitMix64 stream, seeded from (seed, request index); the
``p``-th decode pass of the request (``Request.spec_passes``) takes the stream's ``p``-th output. The
draws do not depend on the batch, the rank, the order passes are stepped in or on whether a decode
run fast-forwards them (a run draws a whole block of passes for its batch as one numpy expression,
bit for bit what stepping draws one at a time).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_UNIT = 2.0 ** -53


@dataclass(frozen=True)
class Speculation:
    """A rank's speculative decoding: ``kind`` (``mtp`` | ``ngram``), the drafts a decode pass
    verifies, ``thresholds`` (``P(accepted >= t)`` for t = 1..draft_tokens, non-increasing),
    ``layer_scale`` (MTP: the draft heads' share of the decode attention, (layers + n) / layers;
    n-gram: 1) and the seed of the requests' streams."""

    kind: str
    draft_tokens: int
    thresholds: tuple[float, ...]
    layer_scale: float = 1.0
    seed: int = 42

    @property
    def verify_tokens(self) -> int:
        """Tokens a decode pass computes per request: its last token and the drafts."""
        return 1 + self.draft_tokens

    @property
    def mean_accepted(self) -> float:
        """Expected accepted drafts per pass (before clipping to the output left)."""
        return float(sum(self.thresholds))


def rates_from_mean(mean_accepted: float, draft_tokens: int) -> list[float]:
    """MTP's conditional acceptance rates for a mean of ``mean_accepted`` accepted drafts per pass."""
    whole = int(mean_accepted)
    frac = mean_accepted - whole
    rates = [1.0] * whole + ([frac] if frac > 0 else [])
    return rates + [0.0] * (draft_tokens - len(rates))


def thresholds(rates) -> tuple[float, ...]:
    """``P(accepted >= t)`` for each t from the conditional rates (running products)."""
    out = []
    p = 1.0
    for r in rates:
        p *= float(r)
        out.append(p)
    return tuple(out)


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * _M1) & _MASK
    z = ((z ^ (z >> 27)) * _M2) & _MASK
    return z ^ (z >> 31)


def stream_seed(seed: int, index: int) -> int:
    """The SplitMix64 state of request ``index``'s stream under ``seed``."""
    return _mix((_mix(seed & _MASK) + (index + 1) * _GOLDEN) & _MASK)


def uniform(seed: int, index: int, p: int) -> float:
    """The ``p``-th uniform number in [0, 1) of request ``index``'s stream (p >= 0)."""
    return (_mix((stream_seed(seed, index) + (p + 1) * _GOLDEN) & _MASK) >> 11) * _UNIT


def accepted(spec: Speculation, index: int, p: int) -> int:
    """Drafts accepted at the ``p``-th decode pass of request ``index``."""
    u = uniform(spec.seed, index, p)
    a = 0
    for t in spec.thresholds:
        if u < t:
            a += 1
        else:
            break
    return a


def _mix_array(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
    return z ^ (z >> np.uint64(31))


def accepted_block(spec: Speculation, indices, first_pass, num_passes: int) -> np.ndarray:
    """``accepted`` for requests ``indices`` (one row each) at their decode passes ``first_pass[i]``
    .. ``first_pass[i] + num_passes - 1`` (columns), as an int64 array: the same numbers."""
    with np.errstate(over="ignore"):
        states = np.array([stream_seed(spec.seed, i) for i in indices], dtype=np.uint64)
        p = np.asarray(first_pass, dtype=np.uint64)[:, None] + np.arange(1, num_passes + 1, dtype=np.uint64)[None, :]
        z = states[:, None] + p * np.uint64(_GOLDEN)
        u = (_mix_array(z) >> np.uint64(11)).astype(np.float64) * _UNIT
    out = np.zeros(u.shape, dtype=np.int64)
    alive = np.ones(u.shape, dtype=bool)
    for t in spec.thresholds:
        alive &= u < t
        out += alive
    return out
