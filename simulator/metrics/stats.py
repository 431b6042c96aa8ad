"""Distribution statistics: mean, min, max, median, p75, p90, p95, p99, std (population).

Percentiles use linear interpolation (numpy's default ``linear`` method). Pooled token gaps
arrive as (value, weight) pairs; ``weighted_stats`` gives exactly what the unweighted
statistics of the expanded sample would, without expanding it. Values are sorted by
value first, so the result depends only on the multiset, never on arrival order.
"""

from __future__ import annotations

import math

import numpy as np

STAT_NAMES = ("mean", "min", "max", "median", "p75", "p90", "p95", "p99", "std")
_PCTS = (("median", 50), ("p75", 75), ("p90", 90), ("p95", 95), ("p99", 99))


def _lerp(a: float, b: float, t: float) -> float:
    # numpy's _lerp: stable at both ends
    d = b - a
    return b - d * (1.0 - t) if t >= 0.5 else a + d * t


def empty_stats() -> dict[str, float | None]:
    return {k: None for k in STAT_NAMES}


def distinct_sorted(values: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ascending distinct values, their total weights): a canonical form of the multiset."""
    values = np.asarray(values, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.int64)
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    if len(values) == 0:
        return values, weights
    if weights.max() < 1 << 15:
        # Token gaps have few distinct weights (batch sizes): per weight, sort the values alone
        # (no index array) and count repeats, then merge those sorted, shorter lists
        w16 = weights.astype(np.int16)
        order = np.argsort(w16, kind="stable")  # (a radix sort)
        ws = w16[order]
        vs = values[order]
        del order, w16
        bounds = np.concatenate(([0], np.flatnonzero(ws[1:] != ws[:-1]) + 1, [len(ws)])).tolist()
        parts_v = []
        parts_w = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            s = vs[a:b]
            s.sort()  # (in place: vs is this function's own copy)
            starts = np.concatenate(([0], np.flatnonzero(s[1:] != s[:-1]) + 1))
            parts_v.append(s[starts])
            parts_w.append(np.diff(starts, append=len(s)) * int(ws[a]))
        del vs, ws
        values = np.concatenate(parts_v)
        weights = np.concatenate(parts_w)
        del parts_v, parts_w
    order = np.argsort(values, kind="stable")  # (timsort: fast on sorted stretches)
    v = values[order]
    w = weights[order]
    del order
    starts = np.concatenate(([0], np.flatnonzero(v[1:] != v[:-1]) + 1))
    return v[starts], np.add.reduceat(w, starts)


def weighted_sum(values: np.ndarray, weights: np.ndarray) -> float:
    """``sum(values * weights)`` by numpy's own (pairwise) summation: the same bits on every
    machine. (``np.dot`` hands long vectors to the BLAS library, whose threads each sum a part:
    the result's last bits then depend on how many threads it runs, i.e. on the machine's cores
    and on OPENBLAS_NUM_THREADS / OMP_NUM_THREADS, which Ray sets to 1 in its workers.)"""
    return float(np.add.reduce(values * weights))


def weighted_stats(values: np.ndarray, weights: np.ndarray, presorted: bool = False) -> dict[str, float | None]:
    """Statistics of the sample in which ``values[i]`` occurs ``weights[i]`` times
    (``presorted``: already the output of ``distinct_sorted``)."""
    uniq, w = (values, weights) if presorted else distinct_sorted(values, weights)
    if len(uniq) == 0:
        return empty_stats()
    n = int(w.sum())
    cum = np.cumsum(w)
    wf = w.astype(np.float64)
    mean = weighted_sum(uniq, wf) / n
    var = weighted_sum((uniq - mean) ** 2, wf) / n
    out: dict[str, float | None] = {
        "mean": mean,
        "min": float(uniq[0]),
        "max": float(uniq[-1]),
        "std": math.sqrt(var),
    }
    for name, p in _PCTS:
        pos = (p / 100) * (n - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, n - 1)
        a = float(uniq[np.searchsorted(cum, lo, side="right")])
        b = float(uniq[np.searchsorted(cum, hi, side="right")])
        out[name] = _lerp(a, b, pos - lo)
    return {k: out[k] for k in STAT_NAMES}


def plain_stats(values: np.ndarray) -> dict[str, float | None]:
    """Statistics of an unweighted sample (NaNs dropped)."""
    values = np.asarray(values, dtype=np.float64)
    values = values[~np.isnan(values)]  # (a copy of its own: sorted in place)
    if len(values) == 0:
        return empty_stats()
    # distinct_sorted of weights 1, without an index or weight array (a ten-million-request
    # column's statistics then need about four copies of it, not nine): the same sort of the
    # same values, so the same distinct values and counts
    values.sort()
    starts = np.concatenate(([0], np.flatnonzero(values[1:] != values[:-1]) + 1))
    counts = np.diff(starts, append=len(values))
    return weighted_stats(values[starts], counts, presorted=True)
