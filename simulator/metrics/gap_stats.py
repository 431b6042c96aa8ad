"""Statistics of the token gaps: ITL and per-user output throughput (1000 / gap), exact at any size.

Up to ``IN_MEMORY_ENTRIES`` gap entries (written out by a worker or not) the gaps are pooled into
one sorted multiset in memory (``stats.distinct_sorted``), as always. Past that (a production
trace: tens of millions of entries) they are read from the workers' sinks a chunk at a time, over
a few passes, in bounded memory:

- order statistics (min, max, every percentile) are exact: a float's bits, mapped to an unsigned
  key that sorts as the values do, are counted by their top 20 bits; the bucket holding a wanted
  rank is then either read whole (at most ``COLLECT_ENTRIES`` entries) and sorted, or counted by
  its next 20 bits, and so on down to single values;
- mean and std: each chunk summed by numpy (pairwise), the chunks' sums added exactly
  (``math.fsum``); the same numbers in process and on Ray (the chunks are each worker's own).
See docs/metrics.md, "Token gaps at scale".
"""

from __future__ import annotations

import math

import numpy as np

from aisim.simulator.metrics.stats import _PCTS, STAT_NAMES, _lerp, distinct_sorted, empty_stats, weighted_stats

#: gap entries pooled in memory at most; more are read a chunk at a time
IN_MEMORY_ENTRIES = 1 << 22
#: entries of one bucket read whole at most (else counted by finer buckets first)
COLLECT_ENTRIES = 1 << 21
_SHIFTS = (44, 24, 4, 0)  # the key bits below each level's buckets
_SIGN = np.uint64(1 << 63)


def gap_statistics(sinks: list) -> tuple[dict, dict, int]:
    """(ITL statistics, per-user output throughput statistics, ITL samples) of the gaps in ``sinks``
    (``actors.engine.gaps.GapSink``)."""
    if sum(g.num_entries() for g in sinks) <= IN_MEMORY_ENTRIES:
        parts = [c for g in sinks for c in g.chunks()]
        values = np.concatenate([v for v, _ in parts]) if parts else np.zeros(0)
        weights = np.concatenate([w for _, w in parts]) if parts else np.zeros(0, dtype=np.int64)
        del parts
        gaps, w = distinct_sorted(values, weights)
        del values, weights
        itl = weighted_stats(gaps, w, presorted=True)
        pos = gaps > 0  # 1000/gap reverses the order of distinct positive gaps: still sorted
        per_user = weighted_stats((1000.0 / gaps[pos])[::-1], w[pos][::-1], presorted=True)
        return itl, per_user, int(w.sum())
    return _chunked(lambda: _coalesced(c for g in sinks for c in g.chunks()))


def _coalesced(chunks, size: int = 1 << 20):
    """``chunks`` joined into pieces of about ``size`` pairs (many workers write small blocks; each
    piece costs the passes a fixed amount, whatever its length)."""
    vs: list = []
    ws: list = []
    have = 0
    for v, w in chunks:
        vs.append(v)
        ws.append(w)
        have += len(v)
        if have >= size:
            yield (np.concatenate(vs), np.concatenate(ws)) if len(vs) > 1 else (vs[0], ws[0])
            vs, ws, have = [], [], 0
    if vs:
        yield (np.concatenate(vs), np.concatenate(ws)) if len(vs) > 1 else (vs[0], ws[0])


def _keys(v: np.ndarray) -> np.ndarray:
    """Unsigned keys that sort as the float64 values do (-0.0 as 0.0)."""
    bits = (v + 0.0).view(np.uint64)
    neg = (bits & _SIGN) != 0
    return np.where(neg, ~bits, bits | _SIGN)


def _value(key: int) -> float:
    bits = key ^ (1 << 63) if key >> 63 else ~key & ((1 << 64) - 1)
    return float(np.array([bits], dtype=np.uint64).view(np.float64)[0])


def _chunked(chunks) -> tuple[dict, dict, int]:
    """``gap_statistics`` over ``chunks()`` (a fresh iterator of (values, weights) each call)."""
    width0 = 64 - _SHIFTS[0]
    hist_w = np.zeros(1 << width0, dtype=np.int64)
    hist_c = np.zeros(1 << width0, dtype=np.int64)
    n = n_pos = 0
    sums: list[float] = []
    sums_pu: list[float] = []
    for v, w in chunks():  # pass 1: counts, sums, the top-level buckets
        if not len(v):
            continue
        n += int(w.sum())
        pos = v > 0
        n_pos += int(w[pos].sum())
        wf = w.astype(np.float64)
        sums.append(float(np.add.reduce(v * wf)))
        sums_pu.append(float(np.add.reduce((1000.0 / v[pos]) * wf[pos])))
        top = (_keys(v) >> np.uint64(_SHIFTS[0])).astype(np.int64)
        hist_w += np.rint(np.bincount(top, weights=wf, minlength=len(hist_w))).astype(np.int64)
        hist_c += np.bincount(top, minlength=len(hist_c))
    if not n:
        return empty_stats(), empty_stats(), 0
    mean = math.fsum(sums) / n
    mean_pu = math.fsum(sums_pu) / n_pos if n_pos else None
    # the ranks wanted: every percentile's two neighbours, of the gaps and of the positive gaps
    # (the k-th smallest 1000/gap is 1000 over the k-th largest positive gap)
    ranks = {0, n - 1}
    positions = {}
    for name, p in _PCTS:
        positions[name] = _position(p, n)
        ranks.update(positions[name][:2])
        if n_pos:
            lo, hi, _ = _position(p, n_pos)
            ranks.update((n - 1 - lo, n - 1 - hi))
    if n_pos:
        ranks.add(n - n_pos)  # (the smallest positive gap: the largest throughput)
    at, var, var_pu = _select(chunks, sorted(ranks), hist_w, hist_c, mean, mean_pu)
    itl = {"mean": mean, "min": at[0], "max": at[n - 1], "std": math.sqrt(var / n)}
    for name, _ in _PCTS:
        lo, hi, t = positions[name]
        itl[name] = _lerp(at[lo], at[hi], t)
    per_user = empty_stats()
    if n_pos:
        per_user = {"mean": mean_pu, "min": 1000.0 / at[n - 1], "max": 1000.0 / at[n - n_pos],
                    "std": math.sqrt(var_pu / n_pos)}
        for name, p in _PCTS:
            lo, hi, t = _position(p, n_pos)
            per_user[name] = _lerp(1000.0 / at[n - 1 - lo], 1000.0 / at[n - 1 - hi], t)
    return {k: itl[k] for k in STAT_NAMES}, {k: per_user[k] for k in STAT_NAMES}, n


def _position(p: float, n: int) -> tuple[int, int, float]:
    """(lower rank, upper rank, fraction) of the p-th percentile of n samples (numpy's linear)."""
    pos = (p / 100) * (n - 1)
    lo = math.floor(pos)
    return lo, min(lo + 1, n - 1), pos - lo


def _select(chunks, ranks: list[int], hist_w: np.ndarray, hist_c: np.ndarray, mean: float,
            mean_pu: float | None) -> tuple[dict[int, float], float, float]:
    """The value at each of ``ranks`` (0-based, ascending) and the two variance sums (their first
    pass: the squared deviations from ``mean`` and ``mean_pu``)."""
    out: dict[int, float] = {}
    # each wanted rank's bucket: (level, prefix) -> [the weight below it, its entries, ranks]
    buckets: dict[tuple[int, int], list] = {}
    cum = np.cumsum(hist_w)
    for r in ranks:
        b = int(np.searchsorted(cum, r, side="right"))
        buckets.setdefault((0, b), [int(cum[b - 1]) if b else 0, int(hist_c[b]), []])[2].append(r)
    var = var_pu = None
    while buckets:
        collect = {k: [] for k, (_, c, _) in buckets.items() if c <= COLLECT_ENTRIES}
        refine = {k: (np.zeros(1 << (_SHIFTS[k[0]] - _SHIFTS[k[0] + 1]), dtype=np.int64),
                      np.zeros(1 << (_SHIFTS[k[0]] - _SHIFTS[k[0] + 1]), dtype=np.int64))
                  for k in buckets if k not in collect}
        sq: list[float] = []
        sq_pu: list[float] = []
        for v, w in chunks():
            if not len(v):
                continue
            if var is None:
                wf = w.astype(np.float64)
                sq.append(float(np.add.reduce((v - mean) ** 2 * wf)))
                if mean_pu is not None:
                    pos = v > 0
                    sq_pu.append(float(np.add.reduce((1000.0 / v[pos] - mean_pu) ** 2 * wf[pos])))
            keys = _keys(v)
            for (level, prefix), got in collect.items():
                m = (keys >> np.uint64(_SHIFTS[level])) == np.uint64(prefix)
                if m.any():
                    got.append((v[m], w[m]))
            for (level, prefix), (hw, hc) in refine.items():
                m = (keys >> np.uint64(_SHIFTS[level])) == np.uint64(prefix)
                if m.any():
                    sub = ((keys[m] >> np.uint64(_SHIFTS[level + 1]))
                           & np.uint64(len(hw) - 1)).astype(np.int64)
                    hw += np.rint(np.bincount(sub, weights=w[m].astype(np.float64), minlength=len(hw))).astype(np.int64)
                    hc += np.bincount(sub, minlength=len(hc))
        if var is None:
            var, var_pu = math.fsum(sq), math.fsum(sq_pu)
        nxt: dict[tuple[int, int], list] = {}
        for key, (base, _, rs) in buckets.items():
            level, prefix = key
            if key in collect:
                got = collect[key]
                vals, wts = distinct_sorted(np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got]))
                c = base + np.cumsum(wts)
                for r in rs:
                    out[r] = float(vals[np.searchsorted(c, r, side="right")])
                continue
            hw, hc = refine[key]
            c = base + np.cumsum(hw)
            bits = _SHIFTS[level] - _SHIFTS[level + 1]
            for r in rs:
                b = int(np.searchsorted(c, r, side="right"))
                sub = (prefix << bits) | b
                if level + 1 == len(_SHIFTS) - 1:  # (a whole key: one value)
                    out[r] = _value(sub)
                    continue
                nxt.setdefault((level + 1, sub), [int(c[b - 1]) if b else base, int(hc[b]), []])[2].append(r)
        buckets = nxt
    return out, var, var_pu
