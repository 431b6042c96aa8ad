"""The "dynamo" decision rules of the SLA Planner, each with exact expectations; the priced
passes come from the reference Planner's own trace (shared/reference/planner-trace-f5.txt:
the aggregated FP8 workflow, first ticks)."""

from __future__ import annotations

import pytest

from aisim.actors.engine.request import Request
from aisim.actors.engine.scheduler import RankScheduler, SchedulerConfig
from aisim.actors.engine.timing import FixedTiming
from aisim.actors.engine.worker import EngineWorker
from aisim.actors.messages import Capabilities, Fpm, RoleState, Snapshot
from aisim.actors.planner.perf_model import (
    CROSS_RANK,
    MIXED,
    PURE_DECODE,
    PURE_PREFILL,
    Pass,
    PerfModel,
    SampleStore,
    bootstrap_samples,
    install_bootstrap,
)
from aisim.actors.planner.planner import Planner, PlannerSettings

CAPS = Capabilities(max_batched_tokens=8192, max_sequences=256, context_length=131072, max_kv_tokens=2_000_000)

# the records the reference Planner observed at its load ticks t = 10 .. 50 s (worker order):
# (num_prefill, prefill_tokens, prefix KV, num_decode, decode KV, wall_s)
OBSERVED = [
    [(0, 0, 0, 3, 31676, 0.0042041), (2, 8180, 5014, 12, 250103, 0.1406427)],
    [(0, 0, 0, 5, 90487, 0.0054088), (0, 0, 0, 2, 33134, 0.0042530)],
    [(0, 0, 0, 5, 71129, 0.0050259), (0, 0, 0, 2, 20830, 0.0039051)],
    [(2, 8188, 1992, 4, 42040, 0.1265962), (1, 8187, 45553, 5, 185604, 0.4600945)],
    [(2, 8191, 48066, 1, 15423, 0.2850096), (1, 8176, 54049, 16, 379359, 0.5246281)],
]


def reference_model(ticks: int) -> PerfModel:
    m = PerfModel("agg", CAPS, 64, 16, 5)
    install_bootstrap(m, bootstrap_samples(lambda t, b, kv: 5.0 + t / 100 + b / 10 + kv / 1e5, CAPS, "agg"))
    for records in OBSERVED[:ticks]:
        for sp, spt, spkv, sd, sdkv, wall in records:
            m.observe(Pass(sp, spt, spkv, sd, sdkv), wall * 1000.0)
    return m


def test_the_bootstrap_fills_only_the_pure_stores_and_a_store_is_ready_at_five_samples():
    m = reference_model(0)
    assert {k: (s.ready(), s.num_samples) for k, s in m.stores.items()} == {
        PURE_PREFILL: (True, 9), PURE_DECODE: (True, 32), MIXED: (False, 0), CROSS_RANK: (False, 0)}
    m = reference_model(4)  # three mixed passes observed by t = 40 s: not ready
    assert m.stores[MIXED].num_samples == 3 and m.price(Pass(1, 1000, 0, 2, 2000)) == (None, MIXED)
    assert m.price(Pass(1, 1000, 0, 0, 0))[0] is not None  # a pure prefill is priced by its own store
    m = reference_model(5)
    assert m.stores[MIXED].num_samples == 5 and m.price(Pass(1, 1000, 0, 2, 2000))[0] is not None
    assert m.stores[PURE_DECODE].num_samples == 32 + 5  # the decode-only records of t = 10, 20, 30 s


def test_running_averages_are_those_of_the_reference():
    m = reference_model(1)  # t = 10 s: 41 bootstrap passes + 2 records
    assert m.avg_isl == pytest.approx(41386 / 43)  # (9 bootstrap ISLs + 8180 / 2) / 43 passes = 962.5
    assert m.avg_decode_length == pytest.approx((116000 + 31676 / 3 + 250103 / 12) / 34)  # 4335.3
    assert m.typical_mixed_prefill() == (1, 1058)  # ceil((37296 + 8180) / 43), at least one request
    m = reference_model(5)  # t = 50 s
    assert round(m.avg_isl, 1) == 1292.9 and m.typical_mixed_prefill() == (1, 1534)


def test_the_averages_cover_the_last_64_passes():
    m = reference_model(0)
    for _ in range(23):  # 41 + 23 = 64 passes: the first prefill bootstrap pass (ISL 100) goes next
        m.observe(Pass(), 0.0)
    isl = m.avg_isl
    m.observe(Pass(), 0.0)
    assert m.avg_isl == pytest.approx(isl - 100 / 64)


def test_ttft_is_the_queue_and_one_average_request_drained_in_full_chunks():
    m = reference_model(5)
    # t = 50 s, worker 1: 10 queued prompts, 108,775 tokens + ceil(1292.9) = 110,068 = 13 x 8192 + 3572
    ms, passes = m.ttft_ms(10, 108775, 16, 379359)
    assert [(p["prefill_requests"], p["prefill_tokens"], p["num_decode"], p["decode_kv"], p["count"], p["store"])
            for p in passes] == [(11, 8192, 16, 379359, 13, MIXED), (11, 3572, 16, 379359, 1, MIXED)]
    full, rest = (m.price(Pass(11, t, 0, 16, 379359))[0] for t in (8192, 3572))
    assert ms == pytest.approx(13 * full + rest)
    # the consolidation check: queue and decode load x 2 -> 26 x 8192 + 5851, 21 prompts, 32 decodes
    _, passes = m.ttft_ms(10 * 2, 108775 * 2, 16 * 2, 379359 * 2)
    assert [(p["prefill_requests"], p["prefill_tokens"], p["num_decode"], p["decode_kv"], p["count"])
            for p in passes] == [(21, 8192, 32, 758718, 26), (21, 5851, 32, 758718, 1)]
    # worker 0 (2 queued, 5,000 tokens): one chunk of 6,293 tokens with 3 prompts
    _, passes = m.ttft_ms(2, 5000, 1, 15423)
    assert [(p["prefill_requests"], p["prefill_tokens"], p["count"]) for p in passes] == [(3, 6293, 1)]


def test_aggregated_itl_is_a_mixed_pass_with_the_typical_prefill():
    m = reference_model(5)
    # t = 50 s, worker 0: 1 decode (15,423 KV) + one request of the average decode length
    _, info = m.itl_ms(1, 15423)
    assert (info["num_prefill"], info["prefill_tokens"], info["num_decode"], info["decode_kv"], info["store"]) == \
        (1, 1534, 2, 22411, MIXED)
    # consolidated (x 2), queued prompts counted as decodes: (1 + 2) x 2 + 1 = 7, (15,423 + 5,000) x 2 + 6,987.4
    _, info = m.itl_ms((1 + 2) * 2, (15423 + 5000) * 2)
    assert (info["num_decode"], info["decode_kv"]) == (7, 47834)
    _, info = m.itl_ms(16, 379359)
    assert (info["num_decode"], info["decode_kv"]) == (17, 386347)
    decode = PerfModel("decode", CAPS)
    install_bootstrap(decode, bootstrap_samples(lambda t, b, kv: 5.0 + b / 10, CAPS, "decode"))
    assert decode.itl_ms(3, 3000)[1]["store"] == PURE_DECODE  # a decode engine: a pure decode pass


def test_nnls_on_standardised_features_lets_the_constant_absorb_what_it_cannot_separate():
    store = SampleStore(CAPS, min_observations=5)
    # five full chunks: the FFN term (tokens) hardly varies, the attention term does
    for prefix, wall in ((0, 104.0), (10_000, 113.0), (20_000, 122.0), (40_000, 140.0), (60_000, 158.0)):
        store.add(Pass(1, 8192, prefix, 0, 0), wall)
    att = lambda p: p.features()[0]  # noqa: E731
    # wall = 104 + 9 ms per 10k prefix tokens x 8192 tokens = 104 + (att - att0) x 9 / 81.92e6 exactly
    small = Pass(1, 1000, 0, 0, 0)
    base = Pass(1, 8192, 0, 0, 0)
    assert store.price(base) == pytest.approx(104.0)
    expected = 104.0 + (att(small) - att(base)) * 9.0 / 81_920_000
    assert store.price(small) == pytest.approx(max(0.0, expected))
    # a cost that falls as the features rise: no non-negative weight helps, the constant takes the mean
    flat = SampleStore(CAPS, min_observations=5)
    for prefix, wall in ((0, 150.0), (10_000, 140.0), (20_000, 130.0), (40_000, 120.0), (60_000, 110.0)):
        flat.add(Pass(1, 8192, prefix, 0, 0), wall)
    assert flat.price(small) == pytest.approx(130.0) and flat.price(base) == pytest.approx(130.0)


def test_a_stores_fit_is_numpys_standardisation_bit_for_bit():
    import random

    import numpy as np

    from aisim.actors.planner.perf_model import nnls

    rnd = random.Random(11)
    for _ in range(200):
        store = SampleStore(CAPS, max_samples=rnd.choice([8, 64, 300]), min_observations=1)
        flat_kv = rnd.random() < 0.2  # a feature that never varies
        for _ in range(rnd.randint(1, 400)):
            p = Pass(rnd.randint(1, 4), rnd.choice([8192, rnd.randint(1, 8192)]),
                     0 if flat_kv else rnd.randint(0, 60_000), rnd.randint(0, 64), rnd.randint(0, 400_000))
            store.add(p, rnd.uniform(5.0, 200.0))
        # the reference: numpy's column means and standard deviations of the stored samples
        rows = [r for q in store._buckets.values() for r in q]
        x = np.array([f for f, _ in rows], dtype=np.float64)
        y = np.array([t for _, t in rows], dtype=np.float64)
        mean, std = x.mean(axis=0), x.std(axis=0)
        z = np.where(std > 0, (x - mean) / np.where(std > 0, std, 1.0), 0.0)
        coef, _ = nnls(np.column_stack([np.ones(len(y)), z]), y)
        want = (float(coef[0]), float(coef[1] / std[0]) if std[0] > 0 else 0.0,
                float(coef[2] / std[1]) if std[1] > 0 else 0.0, float(mean[0]), float(mean[1]), 0.0)
        assert store._coefficients() == want


def test_the_planners_nnls_is_scipys_bit_for_bit_without_importing_scipy():
    import subprocess
    import sys

    import numpy as np
    from scipy.optimize import nnls as scipy_nnls

    from aisim.actors.planner.perf_model import nnls

    rng = np.random.default_rng(7)
    for m, n in ((5, 3), (40, 3), (64, 3), (64, 6), (3, 3)):
        for _ in range(20):
            a = rng.normal(size=(m, n))
            a[:, 0] = 1.0
            if rng.random() < 0.3:
                a[:, n - 1] = 0.0  # a feature that never varies (standardised to zero)
            b = rng.normal(loc=rng.choice([-50.0, 0.0, 100.0]), scale=10.0, size=m)
            x, rnorm = nnls(a, b)
            x_ref, rnorm_ref = scipy_nnls(a, b)
            assert x.tolist() == x_ref.tolist() and rnorm == rnorm_ref
    # and where scipy keeps the compiled routine in scipy.optimize._slsqplib, without the package's imports
    code = ("import sys, numpy as np; from aisim.actors.planner.perf_model import nnls, _load_nnls;"
            "x, _ = nnls(np.eye(3), np.array([1.0, -2.0, 3.0])); assert x.tolist() == [1.0, 0.0, 3.0], x;"
            "loaded = sorted(k for k in sys.modules if k == 'scipy' or k.startswith('scipy.'));"
            "import scipy, os, importlib.machinery as m;"
            "here = any(os.path.exists(os.path.join(scipy.__path__[0], 'optimize', '_slsqplib' + s)) for s in m.EXTENSION_SUFFIXES);"
            "assert not here or loaded == ['scipy.optimize._slsqplib'], loaded")
    subprocess.run([sys.executable, "-c", code], check=True)


# -- the votes ------------------------------------------------------------------------------
def record(wid, sp=0, spt=0, sd=4, sdkv=4000, qp=0, qpt=0, wall=0.02, ordinal=1):
    return Fpm(wid, 0, ordinal, wall, sp, spt, 0, 0.0, sd, sdkv, 0.0, qp, qpt, 0.0, 0, 0, 0.0)


def flat_model(ms: float) -> PerfModel:
    """Every store prices every pass at ``ms``."""
    m = PerfModel("agg", CAPS, 64, 16, 5)
    for k in range(5):
        m.observe(Pass(1, 100 + k, 0, 0, 0), ms)
        m.observe(Pass(0, 0, 0, 1 + k, 100), ms)
        m.observe(Pass(1, 100 + k, 0, 1 + k, 100), ms)
    return m


def decide(ms, records, ttft_ms=1500.0, itl_ms=50.0, active=(0, 1)):
    s = PlannerSettings(mode="agg", target="sla", enable_load_scaling=True, ttft_ms=ttft_ms, itl_ms=itl_ms,
                        load_interval_s=10, tick_interval_s=10, max_gpu_budget=16)
    p = Planner(s, perf_models={"agg": flat_model(ms)})
    d = p.on_tick(Snapshot(10_000.0, {"decode": RoleState(list(active), [], [], records, CAPS)}))
    diag = p.ticks[-1]["effects"]["diagnostics"]
    return d.target_decode, diag["reasons"]["decode"], diag


def test_every_engine_above_the_itl_sla_scales_up_whatever_the_ttft():
    # each pass 100 ms: ITL 100 > 50 on both engines; TTFT (one chunk) 100 < 1500
    assert decide(100.0, [record(0), record(1)])[:2] == (3, "scale_up")


def test_every_engine_above_the_ttft_sla_scales_up():
    # a queue of 3 x 8192 tokens + the average request: 4 chunks x 100 ms = 400 > 300 on both engines
    target, reason, diag = decide(100.0, [record(0, qp=3, qpt=3 * 8192), record(1, qp=3, qpt=3 * 8192)],
                                  ttft_ms=300.0, itl_ms=500.0)
    assert (target, reason) == (3, "scale_up")
    assert [e["ttft_ms"] for e in diag["engines"]["decode"]] == [pytest.approx(400.0)] * 2


def test_one_engine_within_the_sla_holds_the_scale_up():
    target, reason, _ = decide(100.0, [record(0, qp=3, qpt=3 * 8192), record(1)], ttft_ms=300.0, itl_ms=500.0)
    assert target is None and reason == "scale_down_refused_consolidation"


def test_scale_down_needs_both_sides_to_pass_on_every_engine():
    # ITL side: consolidated 20 ms < 50 x 0.8; TTFT side: queue-driven part 0 < (1500 - 20) x 0.8
    assert decide(20.0, [record(0), record(1)])[:2] == (1, "scale_down")
    # a queue on one engine: consolidated TTFT 2 x 8192 x 2 + avg ISL -> 5 chunks = 100 ms, own 20 ms:
    # the queue-driven 80 ms passes (budget (100 - 20) x 0.8 = 64 ms) fails
    target, reason, _ = decide(20.0, [record(0, qp=2, qpt=2 * 8192), record(1)], ttft_ms=100.0)
    assert target is None and reason == "scale_down_refused_consolidation"
    # ITL side refuses: consolidated 45 ms is not below 50 x 0.8 = 40
    assert decide(45.0, [record(0), record(1)])[:2] == (None, "scale_down_refused_consolidation")


def test_the_idle_rule_scales_down_by_one_without_the_model():
    idle = [record(0, sd=0, sdkv=0, wall=0.0), record(1, sd=0, sdkv=0, wall=0.0)]
    assert decide(1000.0, idle)[:2] == (1, "scale_down_idle")
    assert decide(1000.0, idle[:1], active=(0,))[:2] == (None, "no_change")  # at the floor
    busy_one = [idle[0], record(1, sd=0, sdkv=0, qp=1, qpt=500, wall=0.0)]  # a queue is not idle
    assert decide(1000.0, busy_one)[1] != "scale_down_idle"


def test_no_estimate_before_the_store_is_ready():
    s = PlannerSettings(mode="agg", target="sla", enable_load_scaling=True, load_interval_s=10, tick_interval_s=10)
    p = Planner(s, perf_models={"agg": reference_model(4)})
    d = p.on_tick(Snapshot(10_000.0, {"decode": RoleState([0, 1], [], [], [record(0), record(1)], CAPS)}))
    diag = p.ticks[-1]["effects"]["diagnostics"]
    assert d.target_decode is None and diag["reasons"]["decode"] == "insufficient_data"
    assert {(e["ttft_store"], e["ttft_ready"], e["itl_store"], e["itl_ready"]) for e in diag["engines"]["decode"]} == \
        {(MIXED, False, MIXED, False)}


# -- the records the Planner reads --------------------------------------------------------------
def worker(track_queue: bool) -> EngineWorker:
    cfg = SchedulerConfig(max_batched_tokens=512, max_sequences=8, block_size=16, num_gpu_blocks=1000)
    return EngineWorker(0, [RankScheduler(cfg, FixedTiming(100.0, 10.0))], track_queue=track_queue)


class _Src:
    def block_hashes(self, index, block_size):
        return list(range(index * 1000, index * 1000 + 64))


def test_a_record_carries_the_queue_as_of_its_pass_and_an_idle_worker_reports_an_empty_record():
    for track, queued in ((True, 0), (False, 1)):
        w = worker(track)
        w.enqueue(Request(0, _Src(), 0.0, 512, 2), 0, 0.0)
        end = w.start(0.0)  # pass 1: A's prompt, nothing queued
        w.enqueue(Request(1, _Src(), 50.0, 512, 2), 0, 50.0)  # B arrives mid-pass
        w.finish(end)
        (_, ordinal, last, queue), = w.forward_pass_metrics()
        assert ordinal == 1 and last[2] == 512 and queue[0] == queued  # as of the pass / as of now
    w = worker(True)
    w.enqueue(Request(0, _Src(), 0.0, 16, 1), 0, 0.0)
    w.finish(w.start(0.0))  # the prompt's pass emits its only token: done, idle
    (_, ordinal, last, queue), = w.forward_pass_metrics()
    assert last == (0.0, 0, 0, 0, 0.0, 0, 0, 0.0) and queue == (0, 0, 0.0, 0, 0, 0.0)
    assert worker(True).forward_pass_metrics()[0][2] is None  # never ran a pass: no record yet
