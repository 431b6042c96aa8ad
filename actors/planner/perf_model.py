"""The Planner's performance model of one engine role: forward-pass time by pass type.

As the live Dynamo Planner does, the model keeps four sample stores, one per pass type:

- ``pure_prefill``: prompt tokens only;
- ``pure_decode``: decodes only;
- ``contains_locally_mixed``: prompt tokens and decodes in one rank's pass;
- ``cross_rank_aggregated``: a pure rank pass inside a worker pass whose attention-data ranks
  mix prefill and decode.

A query is priced only by the store of its own pass type, and a store prices nothing until it
holds ``min_observations`` samples (None: "not ready"). Each store keeps at most
``max_samples`` samples over a sqrt(bucket_size) x sqrt(bucket_size) grid of (tokens in the
pass / max_batched_tokens, KV read / max_kv_tokens); when full, the oldest sample of the
fullest bucket goes. A store fits a non-negative least squares of pass time on standardised
features with two regressors and a constant:

    attention = decode KV tokens + prefill tokens x (prefix KV tokens + prefill tokens / 2) / prefill requests
    ffn       = tokens in the pass (prefill tokens + decode requests)

A feature that does not vary over the store's samples standardises to 0, so the constant
absorbs the cost it cannot separate (the mixed store of an aggregated engine, which has seen
only full ~8k-token chunks, prices every mixed pass near the chunk's time).

The bootstrap (reference grid, granularity 8) fills only the pure stores: prefill ISLs 100 ..
max_batched_tokens at batch 1 (``pure_prefill``) and decode contexts {500, 2000, 4000, 8000} x
batch 1 .. max_sequences while batch x context fits the KV capacity (``pure_decode``); an
aggregated engine takes both, so its mixed store fills only from observed mixed passes.

The model also keeps the last 64 passes it saw (bootstrap passes first, then every observed
record, idle ones included) for the running averages the estimates use: the average ISL
(prefill tokens per prefill request, passes without prefill counting 0), the average decode
length (KV tokens per decode request over passes with decodes) and the *typical mixed prefill*
(the rounded-up mean prefill requests and tokens per pass, at least one request).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from aisim.actors.messages import Capabilities

BENCHMARK_GRANULARITY = 8
AVERAGE_WINDOW = 64  # passes behind the running averages

PURE_PREFILL = "pure_prefill"
PURE_DECODE = "pure_decode"
MIXED = "contains_locally_mixed"
CROSS_RANK = "cross_rank_aggregated"
STORES = (PURE_PREFILL, PURE_DECODE, MIXED, CROSS_RANK)


class Pass(NamedTuple):
    """A forward pass as the model sees it (one rank; a named tuple: the Planner builds several
    per engine and tick)."""

    num_prefill: int = 0
    prefill_tokens: float = 0
    prefill_kv: float = 0  # prefix KV tokens read by the prefill requests
    num_decode: int = 0
    decode_kv: float = 0

    @property
    def empty(self) -> bool:
        return self.prefill_tokens <= 0 and self.num_decode <= 0

    @property
    def pass_type(self) -> str:
        if self.prefill_tokens > 0 and self.num_decode > 0:
            return MIXED
        return PURE_PREFILL if self.prefill_tokens > 0 else PURE_DECODE

    def features(self) -> tuple[float, float]:
        t = float(self.prefill_tokens)
        attention = float(self.decode_kv) + (t * (float(self.prefill_kv) + t / 2.0) / max(1, self.num_prefill)
                                             if t > 0 else 0.0)
        return attention, t + float(self.num_decode)

    def as_dict(self) -> dict:
        return {"num_prefill": self.num_prefill, "prefill_tokens": self.prefill_tokens,
                "prefill_kv": self.prefill_kv, "num_decode": self.num_decode, "decode_kv": self.decode_kv}


class SampleStore:
    """Samples of one pass type and their fit (see the module doc)."""

    def __init__(self, caps: Capabilities, max_samples: int = 64, bucket_size: int = 16,
                 min_observations: int = 5) -> None:
        self.caps = caps
        self.max_samples = max_samples
        self.side = max(1, math.isqrt(bucket_size))
        self.min_observations = min_observations
        self._buckets: dict[tuple[int, int], deque] = {}
        self._size = 0
        self._fit: tuple[float, float, float, float, float, float] | None = None

    def _bucket(self, p: Pass) -> tuple[int, int]:
        c = self.caps
        a = (p.prefill_tokens + p.num_decode) / max(1, c.max_batched_tokens)
        b = (p.prefill_kv + p.decode_kv) / max(1, c.max_kv_tokens)
        s = self.side
        return min(s - 1, int(a * s)), min(s - 1, int(b * s))

    def add(self, p: Pass, wall_ms: float) -> None:
        if not math.isfinite(wall_ms) or wall_ms <= 0:
            return
        q = self._buckets.setdefault(self._bucket(p), deque())
        q.append((p.features(), wall_ms))
        self._size += 1
        if self._size > self.max_samples:  # the oldest sample of the fullest bucket goes
            fullest = max(sorted(self._buckets), key=lambda k: len(self._buckets[k]))
            self._buckets[fullest].popleft()
            self._size -= 1
        self._fit = None

    @property
    def num_samples(self) -> int:
        return self._size

    def ready(self) -> bool:
        return self._size >= self.min_observations

    def _coefficients(self) -> tuple[float, float, float, float, float, float]:
        """(constant, attention weight, ffn weight, attention mean, ffn mean, -) on standardised features."""
        if self._fit is None:
            rows = [r for q in self._buckets.values() for r in q]
            # the features' means and (population) standard deviations as numpy's column
            # reductions compute them (sums in row order, then the division; the same IEEE
            # operations, so the same bits), at a fraction of numpy's per-call cost on ~64 rows
            n = len(rows)
            s_att = s_ffn = 0.0
            for (att, ffn), _ in rows:
                s_att += att
                s_ffn += ffn
            m_att = s_att / n
            m_ffn = s_ffn / n
            v_att = v_ffn = 0.0
            for (att, ffn), _ in rows:
                d = att - m_att
                v_att += d * d
                d = ffn - m_ffn
                v_ffn += d * d
            sd_att = math.sqrt(v_att / n)
            sd_ffn = math.sqrt(v_ffn / n)
            a = np.array([(1.0, (att - m_att) / sd_att if sd_att > 0 else 0.0,
                           (ffn - m_ffn) / sd_ffn if sd_ffn > 0 else 0.0) for (att, ffn), _ in rows])
            coef, _ = nnls(a, np.array([t for _, t in rows], dtype=np.float64))
            w_att = float(coef[1]) / sd_att if sd_att > 0 else 0.0
            w_ffn = float(coef[2]) / sd_ffn if sd_ffn > 0 else 0.0
            self._fit = (float(coef[0]), w_att, w_ffn, m_att, m_ffn, 0.0)
        return self._fit

    def price(self, p: Pass) -> float | None:
        """Pass time in ms, or None before the store is ready."""
        fit = self._fit  # (a fit exists only for a ready store: ``add`` drops it)
        if fit is None:
            if not self.ready():
                return None
            fit = self._coefficients()
        c0, w_att, w_ffn, m_att, m_ffn, _ = fit
        att, ffn = p.features()
        ms = c0 + w_att * (att - m_att) + w_ffn * (ffn - m_ffn)
        return ms if ms > 0.0 else 0.0

    def describe(self) -> dict:
        out = {"ready": self.ready(), "num_samples": self._size}
        if self.ready():
            c0, w_att, w_ffn, m_att, m_ffn, _ = self._coefficients()
            out.update({"constant_ms": c0, "attention_ms_per_token": w_att, "ffn_ms_per_token": w_ffn,
                        "attention_mean": m_att, "ffn_mean": m_ffn})
        return out


_NNLS = None


def nnls(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, float]:
    """``scipy.optimize.nnls(a, b)``: scipy's compiled Lawson-Hanson routine, loaded on first use
    from scipy's directory without importing ``scipy`` or ``scipy.optimize`` (about half a
    second of imports per process, for this one routine) and called as ``scipy.optimize.nnls``
    calls it. Where scipy keeps it elsewhere (other versions), ``scipy.optimize.nnls`` itself."""
    global _NNLS
    if _NNLS is None:
        _NNLS = _load_nnls()
    return _NNLS(a, b)


def _load_nnls():
    import importlib.machinery
    import importlib.util
    import os

    found = importlib.util.find_spec("scipy")  # (where scipy lives, without importing the package)
    where = found.submodule_search_locations if found is not None else None
    for suffix in importlib.machinery.EXTENSION_SUFFIXES if where else ():
        path = os.path.join(where[0], "optimize", "_slsqplib" + suffix)
        if not os.path.exists(path):
            continue
        try:
            spec = importlib.util.spec_from_file_location("scipy.optimize._slsqplib", path)
            lib = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(lib)
            routine = lib.nnls
        except (ImportError, AttributeError, OSError):
            break

        def direct(a, b):
            a = np.asarray_chkfinite(a, dtype=np.float64, order="C")
            b = np.asarray_chkfinite(b, dtype=np.float64)
            x, rnorm, info = routine(a, b, 3 * a.shape[1])
            if info == 3:
                raise RuntimeError("Maximum number of iterations reached.")
            return x, rnorm

        return direct
    from scipy.optimize import nnls as scipy_nnls

    return scipy_nnls


class PerfModel:
    """The four stores of one engine role plus the running averages (see the module doc)."""

    def __init__(self, role: str, caps: Capabilities, max_samples: int = 64, bucket_size: int = 16,
                 min_observations: int = 5) -> None:
        self.role = role  # prefill | decode | agg
        self.caps = caps
        self.stores = {name: SampleStore(caps, max_samples, bucket_size, min_observations) for name in STORES}
        self._window: deque = deque()  # the last AVERAGE_WINDOW passes: (isl, decode length or None, reqs, tokens)
        self._sums = [0.0, 0.0, 0, 0.0, 0.0]  # over the window: isl, decode length, passes with decodes, reqs, tokens
        self.num_observed = 0

    # -- observations ----------------------------------------------------------------------
    def observe(self, p: Pass, wall_ms: float, store: str | None = None, sample: bool = True) -> None:
        """One pass record: into the averages, and (when it ran and ``sample``) into the store of
        its pass type (``store`` overrides the type: cross-rank passes)."""
        isl = p.prefill_tokens / p.num_prefill if p.num_prefill else 0.0
        dec_len = p.decode_kv / p.num_decode if p.num_decode else None
        entry = (isl, dec_len, p.num_prefill, p.prefill_tokens)
        self._window.append(entry)
        self._account(entry, 1)
        if len(self._window) > AVERAGE_WINDOW:
            self._account(self._window.popleft(), -1)
        if sample and not p.empty:
            self.stores[store or p.pass_type].add(p, wall_ms)
            self.num_observed += 1

    def _account(self, entry: tuple, sign: int) -> None:
        isl, dec_len, reqs, tokens = entry
        sums = self._sums
        sums[0] += sign * isl
        if dec_len is not None:
            sums[1] += sign * dec_len
            sums[2] += sign
        sums[3] += sign * reqs
        sums[4] += sign * tokens

    def ready(self, store: str) -> bool:
        return self.stores[store].ready()

    def price(self, p: Pass) -> tuple[float | None, str]:
        store = p.pass_type
        return self.stores[store].price(p), store

    # -- running averages ------------------------------------------------------------------
    @property
    def avg_isl(self) -> float:
        n = len(self._window)
        return self._sums[0] / n if n else 0.0

    @property
    def avg_decode_length(self) -> float:
        return self._sums[1] / self._sums[2] if self._sums[2] else 0.0

    def typical_mixed_prefill(self) -> tuple[int, int]:
        """(requests, tokens): the rounded-up mean prefill requests and tokens per pass."""
        n = len(self._window)
        if not n:
            return 1, 1
        return max(1, _up(self._sums[3] / n)), max(1, _up(self._sums[4] / n))

    # -- estimates ---------------------------------------------------------------------------
    def ttft_ms(self, queued_requests: float, queued_tokens: float, num_decode: float, decode_kv: float,
                hit_rate: float | None = None) -> tuple[float | None, list[dict]]:
        """TTFT of one more request of the average ISL behind the queue: the queue and the request
        drained in chunks of max_batched_tokens, each chunk one pass holding every queued prompt
        plus the request and the given decode load. Returns (ms or None, the priced passes)."""
        tokens = queued_tokens + _up(self.avg_isl)
        if hit_rate:
            tokens *= 1.0 - min(max(hit_rate, 0.0), 0.95)
        tokens = _up(tokens)
        mbt = self.caps.max_batched_tokens
        reqs = _up(queued_requests) + 1
        nd, kv = _up(num_decode), _up(decode_kv)
        full, rest = divmod(max(1, tokens), mbt)
        chunks = [(mbt, full)] if full else []
        if rest:
            chunks.append((rest, 1))
        total = 0.0
        priced = []
        for size, count in chunks:
            ms, store = self.price(Pass(reqs, size, 0, nd, kv))
            priced.append({"prefill_requests": reqs, "prefill_tokens": size, "num_decode": nd, "decode_kv": kv,
                           "count": count, "store": store, "ms": ms})
            if ms is None:
                return None, priced
            total += ms * count
        return total, priced

    def itl_ms(self, num_decode: float, decode_kv: float, accept_length: float = 1.0) -> tuple[float | None, dict]:
        """ITL with one more request of the average decode length: a pure decode pass for a
        decode engine; for an aggregated engine a mixed pass that also carries the typical prefill."""
        nd = _up(num_decode) + 1
        kv = _up(decode_kv + self.avg_decode_length)
        if self.role == "agg":
            reqs, tokens = self.typical_mixed_prefill()
            p = Pass(reqs, tokens, 0, nd, kv)
        else:
            p = Pass(0, 0, 0, nd, kv)
        ms, store = self.price(p)
        info = {**p.as_dict(), "store": store, "ms": ms}
        return (None if ms is None else ms / max(1.0, accept_length)), info

    # -- capacity (max requests/s of one engine within the SLA) -------------------------
    def _chunked(self, tokens: float, num_decode: int = 0, decode_kv: float = 0) -> float | None:
        mbt = self.caps.max_batched_tokens
        total, left = 0.0, float(tokens)
        while left > 0:
            t = min(mbt, left)
            ms, _ = self.price(Pass(1, t, 0, num_decode, decode_kv))
            if ms is None:
                return None
            total += ms
            left -= t
        return total

    def capacity_rps(self, isl: float, osl: float, hit_rate: float, ttft_ms: float, itl_ms: float,
                     accept_length: float = 1.0) -> tuple[float, bool]:
        """(requests/s, whether any candidate batch met the SLA); (0, False) when the stores it
        needs are not ready."""
        c = self.caps
        a = max(1.0, accept_length)
        isl_e = max(1, math.ceil(isl * (1.0 - min(max(hit_rate, 0.0), 0.95))))
        osl = max(1.0, osl)
        ctx = isl + osl // 2
        mbt = c.max_batched_tokens
        cands: list[tuple[float, bool]] = []
        if self.role == "prefill":
            top = 1 if isl_e > mbt else min(c.max_sequences, mbt // isl_e)
            for b in _batches(top):
                ttft = self._chunked(b * isl_e)
                if ttft:
                    cands.append((b / (ttft / 1000.0), ttft <= ttft_ms))
        elif self.role == "decode":
            top = max(1, min(c.max_sequences, int(c.max_kv_tokens // max(1, ctx))))
            for b in _batches(top):
                ms, _ = self.price(Pass(0, 0, 0, b, b * ctx))
                if ms:
                    itl = ms / a
                    cands.append((b / (osl * itl / 1000.0), itl <= itl_ms))
        else:
            top = max(1, min(c.max_sequences, int(c.max_kv_tokens // max(1, ctx)), mbt - 1))
            for b in _batches(top):
                p = math.ceil(b * a * isl_e / osl)
                if p > mbt - b:
                    continue
                ms, _ = self.price(Pass(1, p, 0, b, b * ctx))
                ttft = self._chunked(p + isl_e, b, b * ctx)
                if ms and ttft is not None:
                    itl = ms / a
                    cands.append((b / (osl * itl / 1000.0), itl <= itl_ms and ttft <= ttft_ms))
        if not cands:
            return 0.0, False
        ok = [r for r, e in cands if e]
        return (max(ok), True) if ok else (max(r for r, _ in cands), False)

    def describe(self) -> dict:
        reqs, tokens = self.typical_mixed_prefill()
        return {"avg_isl": self.avg_isl, "avg_decode_length": self.avg_decode_length,
                "typical_mixed_prefill": [reqs, tokens],
                "stores": {name: [s.ready(), s.num_samples] for name, s in self.stores.items()}}


def _up(x: float) -> int:
    """Round up, as the reference sizes its priced passes (a hair of float noise stays put)."""
    return math.ceil(x - 1e-9)


def _batches(top: int) -> list[int]:
    top = max(1, int(top))
    if top <= 128:
        return list(range(1, top + 1))
    return sorted({int(round(x)) for x in np.linspace(1, top, 128)})


@dataclass(frozen=True)
class BootstrapSamples:
    prefill: list[tuple[int, float]]  # (isl, ms) at batch 1
    decode: list[tuple[int, int, float]]  # (batch, context, ms)

    @property
    def sha256(self) -> str:
        doc = json.dumps({"prefill": self.prefill, "decode": self.decode}, sort_keys=True)
        return hashlib.sha256(doc.encode()).hexdigest()


def bootstrap_samples(pass_ms, caps: Capabilities, role: str) -> BootstrapSamples:
    """Reference bootstrap grid evaluated with ``pass_ms(prefill_tokens, num_decode, decode_kv)``."""
    g = BENCHMARK_GRANULARITY
    prefill: list[tuple[int, float]] = []
    decode: list[tuple[int, int, float]] = []
    if role in ("prefill", "agg"):
        mbt = caps.max_batched_tokens
        step = max(1, (mbt - 100) // g)
        for isl in range(100, mbt + 1, step):
            prefill.append((isl, float(pass_ms(isl, 0, 0))))
    if role in ("decode", "agg"):
        seqs = caps.max_sequences
        step = max(1, seqs // g)
        for ctx in (500, 2000, 4000, 8000):
            for b in range(1, seqs + 1, step):
                if b * ctx > caps.max_kv_tokens:
                    break
                decode.append((b, ctx, float(pass_ms(0, b, b * ctx))))
    return BootstrapSamples(prefill, decode)


def install_bootstrap(model: PerfModel, samples: BootstrapSamples) -> None:
    """Bootstrap passes into the pure stores and the averages window (prefill first)."""
    for isl, ms in samples.prefill:
        model.observe(Pass(1, isl, 0, 0, 0), ms)
    for b, ctx, ms in samples.decode:
        model.observe(Pass(0, 0, 0, b, b * ctx), ms)
