"""timing.type default: measured kernel data (aiconfigurator-core) as interpolated tables."""

from __future__ import annotations

import random

import numpy as np
import pytest

from aisim.actors.engine.timing import PassShape
from aisim.simulator.catalog.models import resolve_model
from aisim.simulator.errors import NotSupportedError

aic = pytest.importorskip("aiconfigurator_core")
from aisim.simulator.catalog import measured  # noqa: E402
from aisim.simulator.catalog.measured import measured_timing  # noqa: E402

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def llama():
    return measured_timing(resolve_model(LLAMA), "h200_sxm", "vllm", None)


def prefill(n, new, prefix=0):
    return PassShape(num_prefill=n, prefill_new_tokens=n * new, prefill_sum_isl=n * (new + prefix), prefill_sum_prefix=n * prefix)


def test_monotonic_in_batch_size_and_prompt_length(llama):
    pre = [llama.pass_ms(prefill(1, t)) for t in (64, 256, 1024, 4096, 8192)]
    assert pre == sorted(pre) and len(set(pre)) == len(pre)
    dec = [llama.decode_ms(b, b * 3000, 10**7) for b in (1, 4, 16, 64, 256)]
    assert dec == sorted(dec)
    ctx = [llama.decode_ms(32, 32 * c, 10**7) for c in (500, 2000, 8000, 32000)]
    assert ctx == sorted(ctx)
    assert llama.pass_ms(prefill(1, 2048, 6000)) > llama.pass_ms(prefill(1, 2048))  # attention over the cached prefix


def test_plausible_range_for_llama_8b_on_h200(llama):
    assert 3.0 < llama.decode_ms(1, 2000, 10**7) < 8.0  # weight-bound step of a 16 GB model
    assert 15.0 < llama.decode_ms(256, 256 * 2000, 10**7) < 40.0
    assert 30.0 < llama.pass_ms(prefill(1, 2048)) < 80.0
    assert 120.0 < llama.pass_ms(prefill(1, 8192)) < 300.0
    assert llama.describe()["data_version"].startswith("h200_sxm/vllm/")
    assert llama.describe()["estimator"] == "aiconfigurator"


def test_interpolation_stays_close_to_direct_library_calls(llama):
    from aiconfigurator_core.sdk.engine import EngineHandle

    eng = EngineHandle.compile(_model_dir(), "h200_sxm", "vllm", backend_version="current", tp_size=1)
    rnd = random.Random(1)
    for _ in range(40):
        b, ctx = rnd.randint(1, 256), rnd.randint(100, 60_000)
        direct = eng.mixed_step_breakdown(0, b, ctx - 1, 1, 0)[0]
        assert llama.decode_ms(b, b * ctx, 10**7) == pytest.approx(direct, rel=0.04)
        new, pre = rnd.randint(16, 8000), rnd.choice([0, rnd.randint(1, 30_000)])
        direct = eng.mixed_step_breakdown(new + pre, 0, new + pre, 1, pre)[0]
        assert llama.pass_ms(prefill(1, new, pre)) == pytest.approx(direct, rel=0.06)


def _model_dir():
    from aisim.simulator.catalog.models import BUNDLED_DIR

    return str(BUNDLED_DIR / "meta-llama__Llama-3.1-8B-Instruct")


@pytest.mark.parametrize("num_passes", [1, 17, 63, 64, 255, 256, 300, 2000])  # short runs in Python, long ones with numpy
def test_decode_run_equals_stepping(llama, num_passes):
    # batch sizes on and between the table's rows and past its last one; sequence lengths below
    # the grid's first point, across its points and past its last one
    for b, kv0 in ((1, 1999), (1, 0), (7, 7 * 1500 + 3), (64, 64 * 800), (100, 123_457), (3000, 3000 * 200_000),
                   (max(llama._batch) + 5, 17)):
        run = llama.decode_run_ms(b, kv0, 10**7, num_passes)
        step = [llama.pass_ms(PassShape(num_decode=b, decode_kv_tokens=kv0 + j * b, total_kv_tokens=10**7))
                for j in range(num_passes)]
        assert run == step


def test_decode_run_equals_stepping_random(llama):
    # random runs on both sides of the numpy threshold, inside one grid segment and across several
    rnd = random.Random(7)
    for _ in range(300):
        b = rnd.choice([rnd.randint(1, 16), rnd.randint(1, 400)])
        kv0 = b * rnd.randint(0, 70_000) + rnd.randint(0, b - 1)
        num_passes = rnd.choice([rnd.randint(1, 63), rnd.randint(64, 700)])
        run = llama.decode_run_ms(b, kv0, 10**7, num_passes)
        assert run == [llama.decode_ms(b, kv0 + j * b, 10**7) for j in range(num_passes)]


# -- speculative decoding: aiconfigurator's nextn path -------------------------------------------------
def test_a_speculative_decode_pass_is_aiconfigurators_nextn_decode_step(llama):
    from aiconfigurator_core.sdk.engine import EngineHandle

    from aisim.actors.engine.timing import SpeculativeMeasuredTiming

    eng = EngineHandle.compile(_model_dir(), "h200_sxm", "vllm", backend_version="current", tp_size=1, nextn=2)
    spec = SpeculativeMeasuredTiming(llama, 3, 34 / 32)  # 2 drafts: 3 tokens a request; 2 draft layers on 32
    for b in (1, 8, 40, 200):
        for ctx in (600, 3000, 20_000):
            direct = eng.decode_step_latency(b, ctx, 1)
            assert spec.decode_ms(b, b * ctx, 10**7) == pytest.approx(direct, rel=0.03)
            # exactly: the plain pass of 3b sequences, times 34 / 32
            assert spec.decode_ms(b, b * ctx, 10**7) == pytest.approx(llama.decode_ms(3 * b, 3 * b * ctx, 10**7) * 34 / 32)
    # a mixed pass: its prefill as a prefill-only pass plus its decode step
    shape = PassShape(1, 1000, 1000, 0, 8, 8 * 2000, 10**7)
    assert spec.pass_ms(shape) == llama.prefill_ms(shape) + spec.decode_ms(8, 8 * 2000, 10**7)
    assert llama.describe()["timing_source"] in spec.describe()["timing_source"]
    # n-gram drafts (4 tokens a request): the GEMMs of 4b tokens, the attention of the b sequences
    ngram = SpeculativeMeasuredTiming(llama, 4, 1.0, attention_per_token=False)
    for b, ctx in ((1, 600), (64, 560), (200, 3000)):
        assert ngram.decode_ms(b, b * ctx, 10**7) == pytest.approx(llama.shared(4 * b) + llama.decode_attention(b, ctx))
        assert llama.decode_ms(b, b * ctx, 10**7) < ngram.decode_ms(b, b * ctx, 10**7) < \
            llama.decode_ms(4 * b, 4 * b * ctx, 10**7)


@pytest.mark.parametrize("num_passes", [1, 17, 63, 64, 300])
def test_speculative_decode_passes_equal_stepping(llama, num_passes):
    from aisim.actors.engine.timing import SpeculativeMeasuredTiming

    rnd = random.Random(num_passes)
    for spec in (SpeculativeMeasuredTiming(llama, 3, 34 / 32), SpeculativeMeasuredTiming(llama, 4, 1.0, False)):
        for b in (1, 7, 100, 400):
            kv = [b * 900 + rnd.randint(0, 50)]
            for _ in range(num_passes - 1):  # (each request gains 1 to 3 tokens a pass)
                kv.append(kv[-1] + b + rnd.randint(0, 2 * b))
            assert spec.decode_passes_ms(b, kv, 10**7) == [spec.decode_ms(b, x, 10**7) for x in kv]
            assert spec.decode_run_ms(b, kv[0], 10**7, num_passes) == [spec.decode_ms(b, kv[0] + j * b, 10**7)
                                                                        for j in range(num_passes)]


def _forbid(monkeypatch, *targets):
    """Make each (object, name) step fail the test if a lookup runs it; returns the calls attempted."""
    calls = []

    def refuse(name):
        def call(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"{name} called")
        return call

    for target, name in targets:
        monkeypatch.setattr(target, name, refuse(name))
    return calls


def _aic_resolution():
    from aiconfigurator_core.sdk import perf_database

    return [(perf_database, "get_supported_databases"), (perf_database, "get_version_slots"),
            (perf_database, "resolve_query_version")]


def _new_process_with_warm_disk(monkeypatch):
    """Forget the in-process memo (as a new process would) once the disk cache holds the llama tables."""
    monkeypatch.setattr(measured, "_MEMO", {})
    measured_timing(resolve_model(LLAMA), "h200_sxm", "vllm", None)  # a disk hit, or a build if the memo hid a miss
    monkeypatch.setattr(measured, "_MEMO", {})


def test_tables_are_cached_on_disk_and_identical(llama, monkeypatch):
    _new_process_with_warm_disk(monkeypatch)
    calls = _forbid(monkeypatch, (measured, "_build"), (measured, "_resolve_data_version"), *_aic_resolution())
    again = measured_timing(resolve_model(LLAMA), "h200_sxm", "vllm", None)
    assert calls == []  # nothing built, no version resolved: everything came from the file
    assert again is not llama and again.describe() == llama.describe()
    for name in measured._NPZ_FIELDS:
        assert np.array_equal(getattr(again.tables, name), getattr(llama.tables, name))


def test_warm_disk_lookup_never_enumerates_the_databases(llama, monkeypatch):
    _new_process_with_warm_disk(monkeypatch)
    from aiconfigurator_core.sdk import perf_database

    def boom(*args, **kwargs):
        raise RuntimeError("get_supported_databases must not run on a disk-cache hit")

    monkeypatch.setattr(perf_database, "get_supported_databases", boom)
    assert measured_timing(resolve_model(LLAMA), "h200_sxm", "vllm", None).describe() == llama.describe()


def test_second_lookup_in_process_is_memoised(llama, monkeypatch):
    first = measured_timing(resolve_model(LLAMA), "h200_sxm", "vllm", None)
    calls = _forbid(monkeypatch, (measured, "_load"), (measured, "_build"), (measured, "_resolve_data_version"),
                    *_aic_resolution())
    assert measured_timing(resolve_model(LLAMA), "h200_sxm", "vllm", None) is first
    assert measured_timing(resolve_model(LLAMA), "h200_sxm", "vllm", "current") is first  # the same request
    assert calls == []
    assert not first.tables.decode_attn_ms.flags.writeable  # shared by every caller, so nobody may change it


def test_memo_and_disk_cache_are_per_request(llama, monkeypatch, tmp_path):
    monkeypatch.setattr(measured, "_MEMO", {})
    monkeypatch.setattr(measured, "cache_dir", lambda: tmp_path)
    built = []

    def fake_build(src, hardware, backend, alias, what, field, tensor, *rest):
        built.append((alias, tensor))
        return measured.MeasuredTables(**{k: getattr(llama.tables, k).copy() for k in measured._NPZ_FIELDS})

    monkeypatch.setattr(measured, "_build", fake_build)
    two = measured_timing(resolve_model(LLAMA), "h200_sxm", "vllm", None, tensor=2)
    assert measured_timing(resolve_model(LLAMA), "h200_sxm", "vllm", None, tensor=2) is two
    four = measured_timing(resolve_model(LLAMA), "h200_sxm", "vllm", None, tensor=4)
    nxt = measured_timing(resolve_model(LLAMA), "h200_sxm", "vllm", "next", tensor=2)
    assert built == [("current", 2), ("current", 4), ("next", 2)]
    assert four is not two and nxt.describe()["data_version"] != two.describe()["data_version"]
    assert len(list((tmp_path / "measured-timing").glob("*.npz"))) == 3


def test_unsupported_combination_fails_clearly_and_suggests_roofline():
    with pytest.raises(NotSupportedError) as info:
        measured_timing(resolve_model("Qwen/Qwen3-32B-FP8"), "a100_sxm", "vllm", None)  # no FP8 units on A100
    msg = str(info.value)
    assert "no measured timing data for Qwen/Qwen3-32B-FP8 on a100_sxm" in msg and "roofline" in msg and "\n" not in msg
    with pytest.raises(NotSupportedError, match="roofline"):
        measured_timing(resolve_model(LLAMA), "l4", "vllm", None)  # aiconfigurator ships no L4 data


def test_unknown_backend_version_lists_the_available_ones():
    from aisim.simulator.errors import InputError

    with pytest.raises(InputError) as info:
        measured_timing(resolve_model(LLAMA), "h200_sxm", "vllm", "0.1.0")
    assert info.value.where == "engine.backend_version" and "0.24.0" in str(info.value)
    assert measured_timing(resolve_model(LLAMA), "h200_sxm", "vllm", "next").describe()["data_version"] != \
        measured_timing(resolve_model(LLAMA), "h200_sxm", "vllm", "current").describe()["data_version"]
