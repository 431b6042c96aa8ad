"""The Planner's performance model: forward-pass time from batch features, per role.

An online regression (non-negative least squares) of pass time on
``[1, T, T^2, cached prefill tokens, decode batch, decode KV tokens]`` (scaled), where T is
the prompt tokens computed in the pass. It keeps at most ``max_num_fpm_samples`` samples spread
over sqrt(bucket_size) x sqrt(bucket_size) buckets of (work, KV) so one regime cannot crowd out
the rest, and is ready after ``load_min_observations`` samples.

It is bootstrapped from the engine's timing model (reference grid, granularity 8): prefill ISLs
100 .. max_batched_tokens at batch 1; decode contexts {500, 2000, 4000, 8000} x batch
1 .. max_sequences while batch x context fits the KV capacity; aggregated takes both. Unlike
the reference (whose bootstrap comes from a different estimator than the simulated engines),
the samples come from the same timing model the workers use, so the two agree from the start.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from actors.messages import Capabilities

BENCHMARK_GRANULARITY = 8
_SCALE = np.array([1.0, 1e-3, 1e-6, 1e-5, 1e-2, 1e-5])


def features(prefill_tokens: float, prefill_kv: float, num_decode: float, decode_kv: float) -> np.ndarray:
    t = float(prefill_tokens)
    return np.array([1.0, t, t * t, float(prefill_kv), float(num_decode), float(decode_kv)]) * _SCALE


class PerfModel:
    def __init__(self, role: str, caps: Capabilities, max_samples: int = 64, bucket_size: int = 16,
                 min_observations: int = 5) -> None:
        self.role = role  # prefill | decode | agg
        self.caps = caps
        self.side = max(1, math.isqrt(bucket_size))
        self.per_bucket = max(1, max_samples // (self.side * self.side))
        self.min_observations = min_observations
        self._buckets: dict[tuple[int, int], deque] = {}
        self._coef: tuple[float, ...] | None = None  # fitted, scale folded in
        self.num_observed = 0

    # -- samples ---------------------------------------------------------------------
    def _bucket(self, prefill_tokens, prefill_kv, num_decode, decode_kv) -> tuple[int, int]:
        c = self.caps
        if self.role == "decode":
            a, b = num_decode / max(1, c.max_sequences), decode_kv / max(1, c.max_kv_tokens)
        else:
            a = (prefill_tokens + num_decode) / max(1, c.max_batched_tokens)
            b = (prefill_kv + decode_kv) / max(1, c.max_kv_tokens)
        s = self.side
        return min(s - 1, int(a * s)), min(s - 1, int(b * s))

    def add(self, prefill_tokens: float, prefill_kv: float, num_decode: float, decode_kv: float, wall_ms: float) -> None:
        if not math.isfinite(wall_ms) or wall_ms <= 0:
            return
        key = self._bucket(prefill_tokens, prefill_kv, num_decode, decode_kv)
        q = self._buckets.get(key)
        if q is None:
            q = self._buckets[key] = deque(maxlen=self.per_bucket)
        q.append((features(prefill_tokens, prefill_kv, num_decode, decode_kv), wall_ms))
        self.num_observed += 1
        self._coef = None

    @property
    def num_samples(self) -> int:
        return sum(len(q) for q in self._buckets.values())

    def ready(self) -> bool:
        return self.num_samples >= self.min_observations

    def _fit(self) -> tuple[float, ...]:
        if self._coef is None:
            from scipy.optimize import nnls

            rows = [r for q in self._buckets.values() for r in q]
            a = np.array([x for x, _ in rows])
            y = np.array([t for _, t in rows])
            coef, _ = nnls(a, y)
            self._coef = tuple((coef * _SCALE).tolist())
        return self._coef

    # -- estimates ---------------------------------------------------------------------
    def forward_ms(self, prefill_tokens: float = 0, prefill_kv: float = 0, num_decode: float = 0,
                   decode_kv: float = 0) -> float:
        if prefill_tokens <= 0 and num_decode <= 0:
            return 0.0
        c0, c1, c2, c3, c4, c5 = self._coef or self._fit()
        t = float(prefill_tokens)
        ms = c0 + c1 * t + c2 * t * t + c3 * prefill_kv + c4 * num_decode + c5 * decode_kv
        return ms if ms > 0.0 else 0.0

    def chunked_ms(self, tokens: float, num_decode: float = 0, decode_kv: float = 0) -> float:
        """Time to push ``tokens`` prompt tokens through passes of at most max_batched_tokens
        (sharing each pass with ``num_decode`` decodes)."""
        chunk = max(1, self.caps.max_batched_tokens - int(num_decode))
        total, left, done = 0.0, float(tokens), 0.0
        while left > 0:
            t = min(chunk, left)
            total += self.forward_ms(t, done, num_decode, decode_kv)
            left -= t
            done += t
        return total

    def prefill_ttft_ms(self, queued_tokens: float, avg_isl: float, hit_rate: float) -> float:
        """Drain the queue plus one request of ``avg_isl`` tokens, less the cached share."""
        return self.chunked_ms((queued_tokens + avg_isl) * (1.0 - hit_rate))

    def decode_itl_ms(self, num_decode: float, decode_kv: float, accept_length: float = 1.0) -> float:
        return self.forward_ms(0, 0, num_decode, decode_kv) / max(1.0, accept_length)

    # -- capacity (max requests/s of one engine within the SLA) -------------------------
    def capacity_rps(self, isl: float, osl: float, hit_rate: float, ttft_ms: float, itl_ms: float,
                     accept_length: float = 1.0) -> tuple[float, bool]:
        """(requests/s, whether any candidate batch met the SLA)."""
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
                ttft = self.chunked_ms(b * isl_e)
                if ttft > 0:
                    cands.append((b / (ttft / 1000.0), ttft <= ttft_ms))
        elif self.role == "decode":
            top = max(1, min(c.max_sequences, int(c.max_kv_tokens // max(1, ctx))))
            for b in _batches(top):
                itl = self.forward_ms(0, 0, b, b * ctx) / a
                if itl > 0:
                    cands.append((b / (osl * itl / 1000.0), itl <= itl_ms))
        else:
            top = max(1, min(c.max_sequences, int(c.max_kv_tokens // max(1, ctx)), mbt - 1))
            for b in _batches(top):
                p = math.ceil(b * a * isl_e / osl)
                if p > mbt - b:
                    continue
                itl = self.forward_ms(p, 0, b, b * ctx) / a
                ttft = self.chunked_ms(p + isl_e, b, b * ctx)
                if itl > 0:
                    cands.append((b / (osl * itl / 1000.0), itl <= itl_ms and ttft <= ttft_ms))
        if not cands:
            return 0.0, False
        ok = [r for r, e in cands if e]
        return (max(ok), True) if ok else (max(r for r, _ in cands), False)


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
    for isl, ms in samples.prefill:
        model.add(isl, 0, 0, 0, ms)
    for b, ctx, ms in samples.decode:
        model.add(0, 0, b, b * ctx, ms)
