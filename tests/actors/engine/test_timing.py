"""Timing models: the reference formulas' worked values, run vectors equal to stepping,
roofline behaviour."""

from __future__ import annotations

import numpy as np
import pytest

from aisim.actors.engine.timing import FixedTiming, PassShape, PolynomialTiming, RooflineTiming
from aisim.simulator.catalog.hardware import get_hardware
from aisim.simulator.catalog.models import load_geometry


def prefill(t: int) -> PassShape:
    return PassShape(num_prefill=1, prefill_new_tokens=t, prefill_sum_isl=t, prefill_sum_prefix=0)


@pytest.mark.parametrize("tokens,expected,decimals", [(4096, 85.756, 3), (2048, 49.363, 3), (1024, 32.49, 2), (512, 24.39, 2)])
def test_polynomial_prefill_worked_values(tokens, expected, decimals):
    # the reference quotes these rounded to the given number of decimals
    assert round(PolynomialTiming().pass_ms(prefill(tokens)), decimals) == expected


def test_polynomial_decode_depends_on_occupancy_only():
    p = PolynomialTiming()
    # 4 sequences, 4,096 active tokens over 256,000 capacity: u = 0.016
    assert round(p.decode_ms(4, 4096, 256_000), 3) == 6.598
    assert p.decode_ms(64, 4096, 256_000) == p.decode_ms(4, 4096, 256_000)
    assert p.decode_ms(1, 10**9, 256_000) == p.decode_ms(1, 256_000, 256_000)  # u capped at 1
    assert p.pass_ms(PassShape()) == 0.0


def test_mixed_pass_adds_prefill_and_decode():
    f = FixedTiming(100.0, 10.0)
    assert f.pass_ms(PassShape(1, 512, 512, 0, 1, 700, 10_000)) == 110.0
    assert f.pass_ms(prefill(512)) == 100.0
    assert f.pass_ms(PassShape(num_decode=3, decode_kv_tokens=10, total_kv_tokens=100)) == 10.0


@pytest.mark.parametrize("model", [PolynomialTiming(), FixedTiming(7.5, 3.25)])
def test_decode_run_equals_stepping_bit_for_bit(model):
    run = model.decode_run_ms(37, 123_457, 1_871_936, 500)
    step = [0.0 + model.decode_ms(37, 123_457 + j * 37, 1_871_936) for j in range(500)]
    assert run == step


@pytest.mark.parametrize("num_decode, kv0, total, k", [
    (37, 123_457, 1_871_936, 500),  # far below capacity (the fast path)
    (1, 0, 64, 64),  # up to exactly full: u = 1 on the last pass
    (5, 990, 1_000, 10),  # crosses capacity: u clamped to 1 from the third pass on
    (3, 2_000, 1_000, 7),  # over capacity from the start
    (256, 7, 1_871_936, 1),
    (4, 100, 1_000, 0),
])
def test_polynomial_decode_run_equals_stepping_on_both_sides_of_capacity(num_decode, kv0, total, k):
    model = PolynomialTiming()
    assert model.decode_run_ms(num_decode, kv0, total, k) == [
        model.decode_ms(num_decode, kv0 + j * num_decode, total) for j in range(k)]


def test_polynomial_decode_runs_in_numpy_equal_stepping_bit_for_bit():
    # runs of 64 passes and more are timed with numpy arrays: the same bits as one pass at a time
    model = PolynomialTiming()
    rnd = np.random.default_rng(7)
    for k in [63, 64, 65, 200, 1000] * 40:
        total = int(rnd.choice([1_871_936, 29_249 * 64, 12_345_677]))
        num_decode = int(rnd.integers(1, 300))
        kv0 = int(rnd.integers(0, max(1, total - k * num_decode)))
        assert model.decode_run_ms(num_decode, kv0, total, k) == [
            model.decode_ms(num_decode, kv0 + j * num_decode, total) for j in range(k)]


def roofline(model_id="meta-llama/Llama-3.1-8B-Instruct", hw="h200_sxm", tp=1):
    return RooflineTiming(load_geometry(model_id), get_hardware(hw), tp)


def test_roofline_is_monotonic_and_plausible_for_llama_8b_on_h200():
    r = roofline()
    pre = [r.pass_ms(prefill(t)) for t in (128, 512, 2048, 8192)]
    assert pre == sorted(pre)
    # 8k-token prefill of an 8B model on an H200: tens to a few hundred ms
    assert 100 < pre[-1] < 400
    dec = [r.decode_ms(b, b * 2000, 10**7) for b in (1, 8, 64, 256)]
    assert dec == sorted(dec)
    # one decode step of an 8B bf16 model is weight-bound: ~16 GB / (4.8 TB/s * eff) ~ 4-6 ms
    assert 3 < dec[0] < 10


def test_roofline_tensor_parallel_and_fp8_are_faster():
    assert roofline(tp=2).pass_ms(prefill(4096)) < roofline(tp=1).pass_ms(prefill(4096))
    assert roofline("Qwen/Qwen3-32B-FP8").decode_ms(8, 8000, 10**7) < roofline("Qwen/Qwen3-32B").decode_ms(8, 8000, 10**7)


def test_roofline_run_equals_stepping():
    r = roofline()
    run = r.decode_run_ms(5, 1000, 10**6, 50)
    assert np.array_equal(run, [0.0 + r.decode_ms(5, 1000 + 5 * j, 10**6) for j in range(50)])
