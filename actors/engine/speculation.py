"""Speculative decoding of one rank: how many draft tokens a decode pass verifies and how many of
them are accepted (docs/speculative-decoding.md).

A decode pass of a request verifies ``draft_tokens`` drafts (MTP heads or n-gram prompt lookup)
and emits ``1 + a`` tokens: the ``a`` leading drafts accepted plus the target model's own next
token, clipped to what the request may still generate. Draft ``t`` is accepted with probability
``rates[t]`` given that the ones before it were (the first rejection ends the burst), so
``P(a >= t) = thresholds[t - 1] = rates[0] x ... x rates[t - 1]``; one uniform number ``u`` per pass
decides the burst: ``a = #{t : u < thresholds[t - 1]}`` (the same distribution as one draw per draft;
compared exactly in integers, ``Speculation.cutoffs``).

MTP's ``nextn_accepted = x`` (mean accepted drafts per pass) becomes the rates ``[1] x floor(x) +
[x - floor(x)]``: every pass accepts ``floor(x)`` drafts and one more with probability
``x - floor(x)``, the reference's draw.

Determinism: each request has its own SplitMix64 stream, seeded from (seed, request index)
(``Request.spec_stream``); the ``p``-th decode pass of the request (``Request.spec_passes``) takes
the stream's ``p``-th output. The draws do not depend on the batch, the rank, the order passes are
stepped in or on whether a decode run fast-forwards them (a run draws a whole block of passes for
its batch as one numpy expression, bit for bit what stepping draws one at a time; a stepped pass's
leading decode requests read bursts drawn ahead for several passes, ``draw_ahead``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

# the stream's constants (public: the scheduler draws inline on its hot path)
MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB


@dataclass(frozen=True)
class Speculation:
    """A rank's speculative decoding: ``kind`` (``mtp`` | ``ngram``), the drafts a decode pass
    verifies, ``thresholds`` (``P(accepted >= t)`` for t = 1..draft_tokens, non-increasing),
    ``layer_scale`` (MTP: the draft heads as extra layers of a decode pass, (layers + n) / layers;
    n-gram: 1) and the seed of the requests' streams (None until the workers are built: then the
    replay's root seed)."""

    kind: str
    draft_tokens: int
    thresholds: tuple[float, ...]
    layer_scale: float = 1.0
    seed: int | None = 42

    @functools.cached_property
    def cutoffs(self) -> tuple[int, tuple[int, ...]]:
        """The thresholds as integer cutoffs on a 64-bit output ``z`` (its uniform number is
        ``(z >> 11) x 2^-53``): ``u < t`` exactly when ``z < ceil(t x 2^53) x 2^11``. (The thresholds
        that are 1, always passed; the cutoffs of the others): the accepted count is
        ``always + #{c : z < c}``."""
        always = sum(1 for t in self.thresholds if t >= 1.0)
        return always, tuple(math.ceil(t * 2.0 ** 53) << 11 for t in self.thresholds if t < 1.0)

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
    z = ((z ^ (z >> 30)) * MIX1) & MASK
    z = ((z ^ (z >> 27)) * MIX2) & MASK
    return z ^ (z >> 31)


def stream_seed(seed: int, index: int) -> int:
    """The SplitMix64 state of request ``index``'s stream under ``seed``."""
    return _mix((_mix(seed & MASK) + (index + 1) * GOLDEN) & MASK)


def stream_of(spec: Speculation, req) -> int:
    """``req``'s stream state under ``spec`` (kept on the request)."""
    state = req.spec_stream
    if state is None:
        state = req.spec_stream = stream_seed(spec.seed, req.index)
    return state


def accepted(spec: Speculation, state: int, p: int) -> int:
    """Drafts accepted at the ``p``-th decode pass of the request whose stream state is ``state``:
    the thresholds its uniform number lies below (compared exactly in integers, ``Speculation.cutoffs``)."""
    n, cuts = spec.cutoffs
    z = _mix((state + (p + 1) * GOLDEN) & MASK)
    for c in cuts:  # (non-increasing: the thresholds are)
        if z >= c:
            break
        n += 1
    return n


# (the constants as numpy scalars, made once: uint64 array arithmetic wraps silently, as the
# stream's arithmetic modulo 2^64 wants)
_MIX1, _MIX2 = np.uint64(MIX1), np.uint64(MIX2)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def _mix_array(z: np.ndarray) -> np.ndarray:
    """``_mix`` of each element, in place."""
    z ^= z >> _S30
    z *= _MIX1
    z ^= z >> _S27
    z *= _MIX2
    z ^= z >> _S31
    return z


def block_bases(states: list[int], first_pass: list[int]) -> np.ndarray:
    """The stream positions (before mixing) of the requests whose stream states are ``states`` at
    their decode passes ``first_pass``, as a uint64 array: ``accepted_from``'s ``bases``. (In
    Python integers: cheaper than numpy's three array operations for a batch.)"""
    return np.array([(s + (p + 1) * GOLDEN) & MASK for s, p in zip(states, first_pass)], dtype=np.uint64)


def advance_bases(bases: np.ndarray, num_passes: int) -> np.ndarray:
    """``bases`` ``num_passes`` decode passes later."""
    return bases + np.uint64((num_passes * GOLDEN) & MASK)


def accepted_block(spec: Speculation, states: list[int], first_pass: list[int], num_passes: int,
                   plus: int = 0) -> np.ndarray:
    """``accepted`` (+ ``plus``) for the requests whose stream states are ``states`` (one column
    each) at their decode passes ``first_pass[i]`` .. ``first_pass[i] + num_passes - 1``
    (rows), as an int64 array of shape (num_passes, requests): the same numbers."""
    return accepted_from(spec, block_bases(states, first_pass), num_passes, plus)


def draw_ahead(spec: Speculation, reqs: list, num_passes: int) -> None:
    """Draw each of ``reqs``' bursts (1 + accepted) for its next ``num_passes`` decode passes at once
    (``Request.spec_ahead``): what ``accepted`` gives them one by one."""
    first = [r.spec_passes for r in reqs]
    cols = accepted_block(spec, [stream_of(spec, r) for r in reqs], first, num_passes, 1).T.tolist()
    for r, col, p in zip(reqs, cols, first):
        r.spec_ahead = col
        r.spec_ahead_at = p
        r.spec_ahead_end = p + num_passes


def accepted_from(spec: Speculation, bases: np.ndarray, num_passes: int, plus: int = 0,
                  out: np.ndarray | None = None) -> np.ndarray:
    """``accepted_block`` from the requests' ``block_bases`` (into ``out`` when given: int64, its shape)."""
    always, cuts = spec.cutoffs
    z = _steps(num_passes)[:, None] + bases
    _mix_array(z)
    if not cuts:
        if out is None:
            out = np.empty(z.shape, dtype=np.int64)
        out.fill(always + plus)
        return out
    if len(cuts) == 1:
        return np.add(z < np.uint64(cuts[0]), always + plus, dtype=np.int64, out=out)
    # #{c : z < c} = len(cuts) - #{c <= z}: one binary search over the ascending cutoffs
    k = np.searchsorted(_ascending(cuts), z, side="right")
    return np.subtract(always + plus + len(cuts), k, out=k if out is None else out)


@functools.lru_cache(maxsize=64)
def _ascending(cuts: tuple[int, ...]) -> np.ndarray:
    return np.array(sorted(cuts), dtype=np.uint64)


@functools.lru_cache(maxsize=64)
def _steps(num_passes: int) -> np.ndarray:
    """``j x golden`` for j = 0 .. num_passes - 1 (the stream's step between passes; read-only)."""
    out = np.arange(num_passes, dtype=np.uint64) * np.uint64(GOLDEN)
    out.setflags(write=False)
    return out
