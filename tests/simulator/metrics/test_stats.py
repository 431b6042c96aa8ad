"""Weighted statistics equal the statistics of the expanded sample."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from aisim.simulator.metrics.stats import distinct_sorted, plain_stats, weighted_stats


@pytest.mark.parametrize("seed", range(5))
def test_weighted_equals_expanded(seed):
    rng = np.random.default_rng(seed)
    values = rng.choice(rng.uniform(1, 50, size=20), size=60)
    weights = rng.integers(0, 9, size=60)
    got = weighted_stats(values, weights)
    full = np.repeat(values, weights)
    for name, q in (("median", 50), ("p75", 75), ("p90", 90), ("p95", 95), ("p99", 99)):
        assert got[name] == pytest.approx(np.percentile(full, q), rel=1e-12)
    assert got["mean"] == pytest.approx(full.mean(), rel=1e-12)
    assert got["std"] == pytest.approx(full.std(), rel=1e-9)
    assert (got["min"], got["max"]) == (full.min(), full.max())


def test_order_does_not_matter_bit_for_bit():
    v = np.array([3.1, 0.7, 2.2, 3.1, 9.9])
    w = np.array([2, 5, 1, 1, 3])
    p = np.array([4, 0, 3, 1, 2])
    assert weighted_stats(v, w) == weighted_stats(v[p], w[p])


def test_empty_and_nan():
    assert plain_stats(np.array([np.nan]))["mean"] is None
    assert plain_stats(np.array([2.0, np.nan, 4.0]))["median"] == 3.0


@pytest.mark.parametrize("max_weight", [1, 5, 300, 1 << 16])
def test_distinct_sorted_is_the_expanded_sample_counted(max_weight):
    """Few distinct weights (sorted per weight, then merged) or weights too large for that path:
    the same distinct values and total weights as counting the expanded sample."""
    rng = np.random.default_rng(max_weight)
    for _ in range(50):
        n = int(rng.integers(0, 80))
        values = rng.integers(0, 12, n) / 4.0
        weights = rng.choice([0, 1, max_weight, max(1, max_weight // 2)], n).astype(np.int64)
        got_v, got_w = distinct_sorted(values, weights)
        want_v, want_w = np.unique(np.repeat(values, weights), return_counts=True)
        assert got_v.tolist() == want_v.tolist() and got_w.tolist() == want_w.tolist()
        assert got_v.dtype == np.float64 and got_w.dtype == np.int64


_STATS_IN_CHILD = """
import numpy as np
from aisim.simulator.metrics.stats import weighted_stats
rng = np.random.default_rng(7)
values = rng.uniform(1.0, 200.0, size=60_000)
weights = rng.integers(1, 40, size=60_000)
s = weighted_stats(values, weights)
print(s["mean"].hex(), s["std"].hex())
"""


def test_mean_and_std_do_not_depend_on_the_blas_threads():
    """A long sample's mean and std carry the same bits whatever the number of BLAS threads (the
    machine's cores, or 1 in a Ray worker): a search's objective is the same on every backend.
    (OpenBLAS caps its threads at the machine's cores: on one core both runs use one.)"""
    root = Path(__file__).resolve().parents[3]
    out = []
    for threads in ("1", "2"):
        env = {**os.environ, "OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads,
               "MKL_NUM_THREADS": threads, "PYTHONPATH": str(root)}
        p = subprocess.run([sys.executable, "-c", _STATS_IN_CHILD], capture_output=True, text=True, env=env,
                           cwd=root, check=True)
        out.append(p.stdout)
    assert out[0] == out[1]


@pytest.mark.parametrize("kind", ["spread", "ties", "nan"])
def test_plain_stats_equal_the_weighted_statistics_of_weight_one(kind):
    rng = np.random.default_rng(3)
    v = {"spread": rng.exponential(100.0, 5001), "ties": np.round(rng.exponential(10.0, 5001)),
         "nan": np.where(rng.random(5001) < 0.1, np.nan, rng.random(5001))}[kind]
    kept = v[~np.isnan(v)]
    assert plain_stats(v) == weighted_stats(kept, np.ones(len(kept), dtype=np.int64))
