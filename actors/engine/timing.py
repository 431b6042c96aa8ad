"""Pass-duration models behind one narrow, batch-level interface.

A rank asks once per pass with batch aggregates only (``PassShape``):

- prefill side: requests that computed prompt tokens this pass, their new tokens, and the
  sums of ``isl`` (tokens known after this chunk) and ``prefix`` (tokens computed or cached
  before it);
- decode side: requests that generate from an already computed sequence, and the sum of
  their sequence lengths (prompt + generated so far).

Every model also answers ``decode_run_ms``: the durations of ``k`` consecutive decode-only
passes of the same batch (the KV grows by one token per request per pass). The fast-forward
path uses it; it must equal calling ``pass_ms`` ``k`` times bit for bit.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import truediv
from typing import NamedTuple

import numpy as np

from aisim.actors.engine.geometry import HardwareSpec, ModelGeometry


class PassShape(NamedTuple):
    """One pass's batch aggregates (a named tuple: built once per pass, cheaply)."""

    num_prefill: int = 0
    prefill_new_tokens: int = 0
    prefill_sum_isl: int = 0
    prefill_sum_prefix: int = 0
    num_decode: int = 0
    decode_kv_tokens: int = 0
    total_kv_tokens: int = 1


class TimingModel:
    """Base class: subclasses implement ``prefill_ms`` and ``decode_ms``."""

    #: short identifier recorded in prediction_provenance
    estimator = "base"
    timing_source = "base"
    data_version: str | None = None

    def prefill_ms(self, shape: PassShape) -> float:
        raise NotImplementedError

    def decode_ms(self, num_decode: int, decode_kv_tokens: int, total_kv_tokens: int) -> float:
        raise NotImplementedError

    def pass_ms(self, shape: PassShape) -> float:
        prefill = self.prefill_ms(shape) if shape.prefill_new_tokens > 0 else 0.0
        decode = (
            self.decode_ms(shape.num_decode, shape.decode_kv_tokens, shape.total_kv_tokens)
            if shape.num_decode > 0
            else 0.0
        )
        return prefill + decode

    def decode_run_ms(self, num_decode: int, kv_tokens0: int, total_kv_tokens: int, num_passes: int) -> list[float]:
        """Durations of ``num_passes`` decode-only passes; pass j has ``kv_tokens0 + j*num_decode``.

        A plain list: most runs are tens of passes, where numpy's per-call cost dominates."""
        decode = self.decode_ms
        return [float(decode(num_decode, kv_tokens0 + j * num_decode, total_kv_tokens)) for j in range(num_passes)]

    def decode_passes_ms(self, num_decode: int, kv_tokens: list[int], total_kv_tokens: int) -> list[float]:
        """Durations of decode-only passes of ``num_decode`` requests holding ``kv_tokens[j]`` KV
        tokens in pass j (non-decreasing: speculative decoding grows them unevenly); each equals
        ``decode_ms`` of that pass bit for bit."""
        decode = self.decode_ms
        return [float(decode(num_decode, kv, total_kv_tokens)) for kv in kv_tokens]

    def describe(self) -> dict:
        return {"estimator": self.estimator, "timing_source": self.timing_source, "data_version": self.data_version}


class FixedTiming(TimingModel):
    """``prefill_ms`` whenever prompt tokens were scheduled, ``decode_ms`` whenever the decode batch is non-empty."""

    estimator = "fixed"
    timing_source = "fixed"

    def __init__(self, prefill_ms: float, decode_ms: float) -> None:
        self._prefill = float(prefill_ms)
        self._decode = float(decode_ms)

    def prefill_ms(self, shape: PassShape) -> float:
        return self._prefill

    def decode_ms(self, num_decode: int, decode_kv_tokens: int, total_kv_tokens: int) -> float:
        return self._decode

    def decode_run_ms(self, num_decode, kv_tokens0, total_kv_tokens, num_passes):
        return [self._decode] * num_passes

    def decode_passes_ms(self, num_decode, kv_tokens, total_kv_tokens):
        return [self._decode] * len(kv_tokens)


# Reference polynomial coefficients.
_PA, _PB, _PC = 4.209989e-07, 1.518344e-02, 1.650142e01
_DA, _DB, _DC = -25.74, 54.01, 5.74


class PolynomialTiming(TimingModel):
    """Reference polynomial model.

    prefill(T new tokens) = 4.209989e-7*T^2 + 1.518344e-2*T + 16.50142
    decode(u) = max(1, -25.74*u^2 + 54.01*u + 5.74), u = min(1, active_kv_tokens / total_kv_tokens)

    (evaluated in Horner form, the same way in the scalar and the run-vector code)
    """

    estimator = "polynomial"
    timing_source = "polynomial"

    def prefill_ms(self, shape: PassShape) -> float:
        t = float(shape.prefill_new_tokens)
        return _PA * t * t + _PB * t + _PC

    def decode_ms(self, num_decode: int, decode_kv_tokens: int, total_kv_tokens: int) -> float:
        u = decode_kv_tokens / total_kv_tokens
        if u > 1.0:
            u = 1.0
        d = (_DA * u + _DB) * u + _DC  # Horner form, evaluated identically by decode_run_ms
        return d if d > 1.0 else 1.0

    def decode_run_ms(self, num_decode, kv_tokens0, total_kv_tokens, num_passes):
        if num_decode > 0 and kv_tokens0 + (num_passes - 1) * num_decode <= total_kv_tokens:
            # u stays in [0, 1], where the polynomial stays above 5.7: neither clamp applies
            # (the same operations as below, the loop at C speed; from 64 passes on in numpy:
            # the same IEEE divisions of exact integers, products and sums, element by element)
            if num_passes >= 64 and kv_tokens0 + num_passes * num_decode < 1 << 53:
                u = np.arange(kv_tokens0, kv_tokens0 + num_passes * num_decode, num_decode,
                              dtype=np.int64) / total_kv_tokens
                return ((_DA * u + _DB) * u + _DC).tolist()
            return [(_DA * u + _DB) * u + _DC for u in
                    map(truediv, range(kv_tokens0, kv_tokens0 + num_passes * num_decode, num_decode),
                        repeat(total_kv_tokens, num_passes))]
        out = []
        append = out.append
        kv = kv_tokens0
        for _ in range(num_passes):
            u = kv / total_kv_tokens
            if u > 1.0:
                u = 1.0
            d = (_DA * u + _DB) * u + _DC
            append(d if d > 1.0 else 1.0)
            kv += num_decode
        return out


@dataclass(frozen=True)
class RooflineFactors:
    """Efficiency factors of the roofline model (fractions of peak actually reached)."""

    compute_efficiency: float = 0.6
    memory_efficiency: float = 0.8
    interconnect_efficiency: float = 0.7
    overhead_ms: float = 1.0  # per pass: scheduling, kernel launches, sampling
    allreduce_latency_us: float = 8.0  # per all-reduce call when tensor > 1


class RooflineTiming(TimingModel):
    """Time of a pass = max(FLOPs / effective compute, bytes / effective HBM bandwidth)
    + tensor-parallel all-reduce time + a fixed per-pass overhead.

    FLOPs: 2 x active parameters per token x tokens (new prompt tokens + decode tokens),
    plus causal attention (4 x heads x head_dim per (query, key) pair per layer) and the LM head
    for one token per request. Bytes: every weight once per pass (MoE: the expected number of
    distinct experts T tokens touch, E x (1 - (1 - k/E)^T)), KV read for the attended context,
    KV written for new tokens. A worker's
    ``tensor`` GPUs split FLOPs and bytes; each layer all-reduces its activations twice.
    FP8 weights use the FP8 peak. See ``RooflineFactors`` for the efficiency factors.
    """

    estimator = "roofline"
    timing_source = "roofline"

    def __init__(self, model: ModelGeometry, hardware: HardwareSpec, tensor_parallel: int = 1,
                 factors: RooflineFactors | None = None) -> None:
        self.model = model
        self.hardware = hardware
        self.tp = max(1, int(tensor_parallel))
        self.factors = factors or RooflineFactors()
        f = self.factors
        peak_tflops = hardware.fp8_tflops if model.weight_bytes <= 1.0 else hardware.bf16_tflops
        self._flops_per_ms = peak_tflops * 1e9 * f.compute_efficiency * self.tp  # TFLOPS -> FLOP per ms
        self._bytes_per_ms = hardware.hbm_tb_per_s * 1e9 * f.memory_efficiency * self.tp  # TB/s -> B per ms
        m = model
        self._linear_flops_per_token = 2.0 * m.active_params_per_token
        self._lm_head_flops = 2.0 * m.vocab_size * m.hidden_size
        self._attn_flops_per_pair = 4.0 * m.num_layers * m.num_heads * m.head_dim
        self._kv_bytes_per_token = m.num_layers * 2 * m.num_kv_heads * m.head_dim * m.kv_bytes
        layer_attn = m.attention_params_per_layer
        # attention weights + the LM head (16-bit) are read every pass; MLP/expert weights per _weight_bytes
        lm_head = m.vocab_size * m.hidden_size * m.embedding_bytes_per_param
        self._dense_weight_bytes = m.num_layers * layer_attn * m.weight_bytes + lm_head
        self._mlp_weight_bytes_per_layer = m.mlp_params_per_layer * m.weight_bytes
        if self.tp > 1:
            bw = hardware.interconnect_gb_per_s * 1e6 * f.interconnect_efficiency  # GB/s -> B per ms
            self._allreduce_ms_per_token = 2.0 * (self.tp - 1) / self.tp * m.hidden_size * 2.0 / bw * 2 * m.num_layers
            self._allreduce_fixed_ms = 2 * m.num_layers * f.allreduce_latency_us / 1000.0
        else:
            self._allreduce_ms_per_token = 0.0
            self._allreduce_fixed_ms = 0.0

    def _weight_bytes(self, tokens: int) -> float:
        m = self.model
        if m.num_experts:
            # expected distinct experts a layer reads when each token picks k of E at random
            e, k = m.num_experts, min(m.experts_per_token, m.num_experts)
            touched = e * (1.0 - (1.0 - k / e) ** tokens)
            frac = (touched + m.num_shared_experts) / (e + m.num_shared_experts)
            return self._dense_weight_bytes + m.num_layers * self._mlp_weight_bytes_per_layer * frac
        return self._dense_weight_bytes + m.num_layers * self._mlp_weight_bytes_per_layer

    def _time(self, tokens: int, requests: int, attn_pairs: float, kv_read: float, kv_written: float) -> float:
        flops = self._linear_flops_per_token * tokens + self._lm_head_flops * requests + self._attn_flops_per_pair * attn_pairs
        nbytes = self._weight_bytes(tokens) + (kv_read + kv_written) * self._kv_bytes_per_token
        compute = flops / self._flops_per_ms
        memory = nbytes / self._bytes_per_ms
        comm = self._allreduce_ms_per_token * tokens + self._allreduce_fixed_ms
        return max(compute, memory) + comm + self.factors.overhead_ms

    def prefill_ms(self, shape: PassShape) -> float:
        n = shape.num_prefill
        new = shape.prefill_new_tokens
        mean_new = new / n
        mean_prefix = shape.prefill_sum_prefix / n
        pairs = n * mean_new * (mean_prefix + (mean_new + 1.0) / 2.0)
        return self._time(new, n, pairs, shape.prefill_sum_prefix, new)

    def decode_ms(self, num_decode: int, decode_kv_tokens: int, total_kv_tokens: int) -> float:
        return self._time(num_decode, num_decode, float(decode_kv_tokens), decode_kv_tokens, num_decode)

    def pass_ms(self, shape: PassShape) -> float:
        # A mixed pass shares one weight read: price it as one forward over all tokens.
        if shape.prefill_new_tokens > 0 and shape.num_decode > 0:
            n = shape.num_prefill
            new = shape.prefill_new_tokens
            mean_new = new / n
            mean_prefix = shape.prefill_sum_prefix / n
            pairs = n * mean_new * (mean_prefix + (mean_new + 1.0) / 2.0) + shape.decode_kv_tokens
            tokens = new + shape.num_decode
            return self._time(tokens, n + shape.num_decode, pairs,
                              shape.prefill_sum_prefix + shape.decode_kv_tokens, tokens)
        return super().pass_ms(shape)

    def describe(self) -> dict:
        d = super().describe()
        d["data_version"] = f"roofline:{self.hardware.name}"
        return d


# -- measured (table-driven) timing ---------------------------------------------------------
_VECTOR_RUN = 64  # decode runs at least this long are timed with numpy, shorter ones in Python


def _bracket(xs: list[float], x: float) -> int:
    """Index i of the grid segment [xs[i], xs[i+1]] used for x (edge segments extrapolate)."""
    i = bisect_right(xs, x) - 1
    if i < 0:
        return 0
    n2 = len(xs) - 2
    return n2 if i > n2 else i


def _lerp1(xs: list[float], ys: list[float], x: float) -> float:
    i = _bracket(xs, x)
    x0 = xs[i]
    y0 = ys[i]
    return y0 + (ys[i + 1] - y0) * ((x - x0) / (xs[i + 1] - x0))


@dataclass(frozen=True)
class MeasuredTables:
    """Per-pass latency components (ms) sampled from measured kernel data.

    A pass of ``T`` new tokens (prompt chunks + one per decoding request) costs
    ``shared(T)`` (GEMMs, norms, communication: depends on the token count only)
    + ``prefill_attention(n, mean new tokens, mean cached prefix)`` for its ``n`` prefilling
    requests + ``decode_attention(b, mean sequence length)`` for its ``b`` decoding ones.
    """

    tokens: np.ndarray  # grid of T
    shared_ms: np.ndarray  # shared(T)
    batch: np.ndarray  # grid of b (decode rows)
    seq_len: np.ndarray  # grid of the decode attention length
    decode_attn_ms: np.ndarray  # [len(batch), len(seq_len)]
    prefill_n: np.ndarray  # grid of prefilling requests
    prefill_new: np.ndarray  # grid of new tokens per request
    prefill_prefix: np.ndarray  # grid of cached tokens per request
    prefill_attn_ms: np.ndarray  # [n, new, prefix]


class MeasuredTiming(TimingModel):
    """Table-driven pass time (``timing.type: default``): piecewise-linear interpolation of
    measured-data tables (see ``simulator.catalog.measured``); no kernel-data lookups per pass.
    (The reference prices a mixed pass as its prefill part plus its decode part, each a pass of
    its own; this one shared token-count part is 2-5% faster: docs/dev/reference-speculative.md.)"""

    estimator = "aiconfigurator"

    def __init__(self, tables: MeasuredTables, timing_source: str, data_version: str) -> None:
        self.tables = tables
        self.timing_source = timing_source
        self.data_version = data_version
        self._tok = tables.tokens.astype(np.float64).tolist()
        self._shared = tables.shared_ms.tolist()
        self._batch = tables.batch.astype(np.float64).tolist()
        self._seq = tables.seq_len.astype(np.float64).tolist()
        self._dec = [row.tolist() for row in tables.decode_attn_ms]
        self._pn = tables.prefill_n.astype(np.float64).tolist()
        self._pnew = tables.prefill_new.astype(np.float64).tolist()
        self._ppre = tables.prefill_prefix.astype(np.float64).tolist()
        self._patt = tables.prefill_attn_ms.tolist()
        self._by_batch: dict[int, tuple] = {}  # batch size -> (shared, row weight, rows): decode runs
        self._by_tokens: dict[int, float] = {}  # tokens in a pass -> shared time
        self._seq_n2 = len(self._seq) - 2  # (the last segment index of each grid)
        self._pn_n2 = len(self._pn) - 2
        self._pnew_n2 = len(self._pnew) - 2
        self._ppre_n2 = len(self._ppre) - 2

    # components --------------------------------------------------------------------
    # (each grid lookup is ``_bracket`` inline: a pass prices up to six of them)
    def shared(self, tokens: int) -> float:
        got = self._by_tokens.get(tokens)
        if got is None:
            got = self._by_tokens[tokens] = _lerp1(self._tok, self._shared, float(tokens))
        return got

    def _rows(self, b: int):
        """Bracketing decode rows for batch b and the weight of the upper one (None if exact)."""
        i = _bracket(self._batch, float(b))
        b0 = self._batch[i]
        if b0 == b:
            return i, None
        return i, (b - b0) / (self._batch[i + 1] - b0)

    def decode_attention(self, b: int, seq_len: float) -> float:
        _, w, r0, r1 = self._batch_rows(b)
        xs = self._seq
        j = bisect_right(xs, seq_len) - 1
        if j < 0:
            j = 0
        elif j > self._seq_n2:
            j = self._seq_n2
        x0 = xs[j]
        t = (seq_len - x0) / (xs[j + 1] - x0)
        y0 = r0[j]
        d0 = y0 + (r0[j + 1] - y0) * t
        if w is None:
            return d0
        y0 = r1[j]
        return d0 + ((y0 + (r1[j + 1] - y0) * t) - d0) * w

    def prefill_attention(self, n: int, new: float, prefix: float) -> float:
        pn, pnew, ppre = self._pn, self._pnew, self._ppre
        i = bisect_right(pn, n) - 1
        i = 0 if i < 0 else (self._pn_n2 if i > self._pn_n2 else i)
        j = bisect_right(pnew, new) - 1
        j = 0 if j < 0 else (self._pnew_n2 if j > self._pnew_n2 else j)
        k = bisect_right(ppre, prefix) - 1
        k = 0 if k < 0 else (self._ppre_n2 if k > self._ppre_n2 else k)
        wi = (n - pn[i]) / (pn[i + 1] - pn[i])
        wj = (new - pnew[j]) / (pnew[j + 1] - pnew[j])
        wk = (prefix - ppre[k]) / (ppre[k + 1] - ppre[k])
        k1 = k + 1
        # the (j, k) plane of grid rows i and i + 1, then between them
        plane = self._patt[i]
        r0 = plane[j]
        r1 = plane[j + 1]
        c0 = r0[k] + (r0[k1] - r0[k]) * wk
        p0 = c0 + ((r1[k] + (r1[k1] - r1[k]) * wk) - c0) * wj
        plane = self._patt[i + 1]
        r0 = plane[j]
        r1 = plane[j + 1]
        c0 = r0[k] + (r0[k1] - r0[k]) * wk
        return p0 + ((c0 + ((r1[k] + (r1[k1] - r1[k]) * wk) - c0) * wj) - p0) * wi

    # TimingModel ------------------------------------------------------------------
    def prefill_ms(self, shape: PassShape) -> float:
        n = shape.num_prefill
        return self.shared(shape.prefill_new_tokens) + self.prefill_attention(
            n, shape.prefill_new_tokens / n, shape.prefill_sum_prefix / n)

    def decode_ms(self, num_decode: int, decode_kv_tokens: int, total_kv_tokens: int) -> float:
        return self.shared(num_decode) + self.decode_attention(num_decode, decode_kv_tokens / num_decode)

    def pass_ms(self, shape: PassShape) -> float:
        nd = shape.num_decode
        new = shape.prefill_new_tokens
        if not new:
            return self.decode_ms(nd, shape.decode_kv_tokens, shape.total_kv_tokens) if nd else 0.0
        t = self.shared(new + nd)
        n = shape.num_prefill
        t = t + self.prefill_attention(n, new / n, shape.prefill_sum_prefix / n)
        if nd:
            t = t + self.decode_attention(nd, shape.decode_kv_tokens / nd)
        return t

    def decode_run_ms(self, num_decode, kv_tokens0, total_kv_tokens, num_passes):
        if (num_passes < _VECTOR_RUN or type(num_decode) is not int or type(kv_tokens0) is not int
                or kv_tokens0 + num_passes * num_decode >= 1 << 53):
            return self._decode_run_scalar(num_decode, kv_tokens0, num_passes)
        return self._decode_run_vector(num_decode, kv_tokens0, num_passes)

    def _batch_rows(self, b: int) -> tuple:
        """(shared time, upper row weight or None, lower row, upper row or None) of batch size b."""
        got = self._by_batch.get(b)
        if got is None:
            i, w = self._rows(b)
            got = self._by_batch[b] = (self.shared(b), w, self._dec[i], self._dec[i + 1] if w is not None else None)
        return got

    def _decode_run_vector(self, b: int, kv_tokens0: int, num_passes: int) -> list[float]:
        """``_decode_run_scalar`` in numpy (``_lengths_ms``); for long runs (numpy's per-call cost
        is a few microseconds)."""
        seq = np.arange(kv_tokens0, kv_tokens0 + num_passes * b, b, dtype=np.int64) / b
        return self._lengths_ms(seq, self._batch_rows(b))

    def _lengths_ms(self, seq: np.ndarray, rows: tuple, scale: float | None = None) -> list[float]:
        """Decode pass times of the non-decreasing mean sequence lengths ``seq`` (exact integer
        sums divided once) with ``_batch_rows``' rows, grid segment by grid segment: the same IEEE
        operations as ``decode_ms`` element by element (the segment's affine map and the row blend
        in the same order; ``scale``: the pass time multiplied by it), so bit-identical."""
        xs = self._seq
        n2 = self._seq_n2
        num_passes = len(seq)
        j = _bracket(xs, float(seq[0]))
        if j == n2 or seq[-1] < xs[j + 1]:
            return self._segment_ms(seq, j, rows, scale).tolist()  # (most runs: one grid segment)
        out = np.empty(num_passes)
        p = 0
        while p < num_passes:
            q = num_passes if j == n2 else int(seq.searchsorted(xs[j + 1]))  # (side "left": bisect_left)
            if q > p:
                out[p:q] = self._segment_ms(seq[p:q], j, rows, scale)
                p = q
            j += 1
        return out.tolist()

    def _segment_ms(self, seq: np.ndarray, j: int, rows: tuple, scale: float | None = None) -> np.ndarray:
        """Pass times of sequence lengths ``seq`` in grid segment j (``_batch_rows``' rows):
        ``shared + d`` with d = y0 + dy * t, blended toward the upper row as ``d + (e - d) * w``
        (the sum multiplied by ``scale`` when given)."""
        shared, w, r0, r1 = rows
        xs = self._seq
        x0 = xs[j]
        y0 = r0[j]
        t = seq - x0
        t /= xs[j + 1] - x0
        d = t * (r0[j + 1] - y0)
        d += y0
        if r1 is not None:
            z0 = r1[j]
            e = t * (r1[j + 1] - z0)
            e += z0
            e -= d
            e *= w
            d += e
        d += shared
        if scale is not None:
            d *= scale
        return d

    def _decode_run_scalar(self, b: int, kv_tokens0: int, num_passes: int) -> list[float]:
        """``decode_ms`` of each pass, the same operations in the same order, for a short run
        (numpy's per-call cost dominates there): the batch's rows and shared time once per batch
        size, every pass's sequence length at C speed, then the passes grid segment by grid
        segment (the length only grows), each segment's constants once and its passes in one
        comprehension."""
        if type(b) is int and type(kv_tokens0) is int:
            seq = list(map(truediv, range(kv_tokens0, kv_tokens0 + num_passes * b, b), repeat(b, num_passes)))
        else:  # (non-integer counts: the lengths as stepping sums them)
            seq = list(map(truediv, accumulate(repeat(b, num_passes - 1), initial=kv_tokens0), repeat(b, num_passes)))
        return self._lengths_scalar(seq, self._batch_rows(b))

    def _lengths_scalar(self, seq: list[float], rows: tuple, scale: float | None = None) -> list[float]:
        """``_lengths_ms`` in Python for a short list of non-decreasing mean lengths."""
        shared, w, r0, r1 = rows
        num_passes = len(seq)
        xs = self._seq
        n2 = self._seq_n2
        out: list[float] = []
        j = _bracket(xs, seq[0]) if num_passes else 0
        p = 0
        while p < num_passes:
            # the passes from p on whose length lies below the segment's upper end (the last
            # segment extrapolates)
            q = bisect_left(seq, xs[j + 1], p) if j < n2 else num_passes
            if q > p:
                x0 = xs[j]
                dx = xs[j + 1] - x0
                y0 = r0[j]
                dy = r0[j + 1] - y0
                part = seq[p:q] if p or q < num_passes else seq
                if r1 is None:
                    if scale is None:
                        out += [shared + (y0 + dy * ((x - x0) / dx)) for x in part]
                    else:
                        out += [(shared + (y0 + dy * ((x - x0) / dx))) * scale for x in part]
                else:  # between two batch rows: (d, t as decode_attention computes them)
                    z0 = r1[j]
                    dz = r1[j + 1] - z0
                    if scale is None:
                        out += [shared + ((d := y0 + dy * (t := (x - x0) / dx)) + ((z0 + dz * t) - d) * w)
                                for x in part]
                    else:
                        out += [(shared + ((d := y0 + dy * (t := (x - x0) / dx)) + ((z0 + dz * t) - d) * w)) * scale
                                for x in part]
                p = q
            j += 1
        return out


class SpeculativeMeasuredTiming(MeasuredTiming):
    """``MeasuredTiming`` of a rank with speculative decoding: each decoding request computes
    ``verify`` tokens a pass (its last token and the drafts). A decode-only pass of b requests
    costs the token-count ops (GEMMs, norms) of ``b x verify`` tokens, plus the decode attention
    of ``b x verify`` sequences of the same mean length with MTP (aiconfigurator's nextn path) or
    of the b sequences with n-gram drafts (``attention_per_token`` False: a request's drafts
    attend over its one KV, read once), the whole times ``scale`` (MTP: the draft heads' layers,
    (layers + n) / layers; n-gram: 1). A mixed pass costs its prefill chunks as a prefill-only pass
    plus its decode step as a decode-only pass. Both as the reference prices them (within 1.2% of
    it on the conversation trace but one p90 ITL, docs/speculative-decoding.md). Shares the tables
    of the plain model it is made from."""

    def __init__(self, base: MeasuredTiming, verify: int, scale: float, attention_per_token: bool = True) -> None:
        self.__dict__.update(base.__dict__)  # (shares base's tables)
        self._by_batch = {}
        self._by_tokens = {}
        self._verify = int(verify)
        self._scale = float(scale)
        self._run_scale = None if scale == 1.0 else self._scale  # (x * 1.0 is x: runs skip it)
        self._attn_q = self._verify if attention_per_token else 1
        self._spec_rows: dict[int, tuple] = {}
        self.timing_source = f"{base.timing_source}; speculative decoding: {verify} tokens per decoding request"

    def decode_ms(self, num_decode: int, decode_kv_tokens: int, total_kv_tokens: int) -> float:
        return (self.shared(num_decode * self._verify)
                + MeasuredTiming.decode_attention(self, num_decode * self._attn_q, decode_kv_tokens / num_decode)
                ) * self._scale

    pass_ms = TimingModel.pass_ms  # (a mixed pass: its prefill as a prefill pass + its decode step)

    def decode_run_ms(self, num_decode, kv_tokens0, total_kv_tokens, num_passes):
        return self.decode_passes_ms(num_decode, [kv_tokens0 + j * num_decode for j in range(num_passes)],
                                     total_kv_tokens)

    def _rows_of(self, b: int) -> tuple:
        """``_batch_rows``' tuple for a pass of b decoding requests: the shared time of their verify
        tokens, the attention rows of their sequences (per token with MTP)."""
        got = self._spec_rows.get(b)
        if got is None:
            got = self._spec_rows[b] = (self.shared(b * self._verify),) + self._batch_rows(b * self._attn_q)[1:]
        return got

    def decode_passes_ms(self, num_decode, kv_tokens, total_kv_tokens):
        rows = self._rows_of(num_decode)
        if len(kv_tokens) < _VECTOR_RUN:
            return self._lengths_scalar(list(map(truediv, kv_tokens, repeat(num_decode, len(kv_tokens)))), rows,
                                        self._run_scale)
        seq = np.asarray(kv_tokens, dtype=np.int64) / num_decode
        return self._lengths_ms(seq, rows, self._run_scale)
