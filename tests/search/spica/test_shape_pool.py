"""Parallel-shape enumeration (KV feasibility, dense/MoE splits), branch pools, keys and projection."""

from __future__ import annotations

import json
import pickle

import pytest

from aisim.search.spica.shapes import (
    ShapeProjectionError,
    _worker_shapes,
    project,
    shape_distance,
    shape_from_key,
    shape_key,
    shape_pool,
    strategy,
    used_gpus,
    worker_shapes,
)
from aisim.simulator.catalog.models import BUNDLED_DIR
from aisim.simulator.errors import InputError

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
QWEN_MOE = "Qwen/Qwen3-30B-A3B"


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _w(tp=1, attention_dp=1, moe_tp=1, moe_ep=1) -> dict:
    return {"tp": tp, "pp": 1, "attention_dp": attention_dp, "moe_tp": moe_tp, "moe_ep": moe_ep}


def _s(tp=1, attention_dp=1, moe_tp=1, moe_ep=1, replicas=1, pp=1) -> dict:
    return {"tp": tp, "pp": pp, "attention_dp": attention_dp, "moe_tp": moe_tp, "moe_ep": moe_ep,
            "replicas": replicas}


def _summary(shapes) -> list[tuple[str, int]]:
    return [(strategy(s), s["tp"] * s["pp"] * s["attention_dp"]) for s in shapes]


def _local_model(tmp_path, bundled: str, **changes) -> str:
    """A local model directory: a bundled config.json with ``changes``."""
    cfg = json.loads((BUNDLED_DIR / bundled / "config.json").read_text())
    cfg.update(changes)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return str(tmp_path)


# -- worker shapes -----------------------------------------------------------------------------
def test_llama_8b_on_h200_enumerates_tp_and_dtp_for_every_size():
    assert worker_shapes(LLAMA, "h200_sxm") == [
        _w(tp=1),
        _w(tp=2), _w(attention_dp=2),
        _w(tp=4), _w(attention_dp=4),
        _w(tp=8), _w(attention_dp=8),
        _w(tp=16), _w(attention_dp=16),
    ]
    assert _summary(worker_shapes(LLAMA, "h200_sxm")) == [
        ("tp", 1), ("tp", 2), ("dtp", 2), ("tp", 4), ("dtp", 4), ("tp", 8), ("dtp", 8), ("tp", 16), ("dtp", 16)]


def test_kv_feasibility_drops_shapes_whose_weights_fill_the_gpu():
    # Qwen3-32B in bf16 (~65 GB) does not fit one 48 GB L40S; dtp replicates the layers on every rank
    assert _summary(worker_shapes("Qwen/Qwen3-32B", "l40s")) == [("tp", 2), ("tp", 4), ("tp", 8), ("tp", 16)]
    # the FP8 checkpoint fits one
    assert _summary(worker_shapes("Qwen/Qwen3-32B-FP8", "l40s"))[:3] == [("tp", 1), ("tp", 2), ("dtp", 2)]
    # a memory fraction too small for the weights leaves nothing
    assert worker_shapes("Qwen/Qwen3-32B", "l40s", sizes=(1,)) == []
    assert worker_shapes(LLAMA, "h200_sxm", memory_fraction=0.02) == []  # 2.8 GB < the 3.5 GiB runtime overhead


def test_activation_reserve_and_sizes_are_honoured():
    assert worker_shapes(LLAMA, "h200_sxm", sizes=(4, 1, 4)) == [_w(tp=1), _w(tp=4), _w(attention_dp=4)]
    # a huge max_batched_tokens activation reserve crowds out the KV cache of the small workers
    big = worker_shapes(LLAMA, "h200_sxm", max_batched_tokens=2_000_000)
    assert _summary(big) != _summary(worker_shapes(LLAMA, "h200_sxm"))
    assert all(s["tp"] > 1 for s in big)


def test_attention_heads_must_split_for_tp(tmp_path):
    model = _local_model(tmp_path, "meta-llama__Llama-3.1-8B-Instruct", num_attention_heads=24, head_dim=128)
    # 24 heads: tp 16 does not divide them; dtp 16 (tp 1) needs no head split
    assert _summary(worker_shapes(model, "h200_sxm")) == [
        ("tp", 1), ("tp", 2), ("dtp", 2), ("tp", 4), ("dtp", 4), ("tp", 8), ("dtp", 8), ("dtp", 16)]


def test_moe_model_gives_tep_and_dep():
    assert worker_shapes(QWEN_MOE, "h200_sxm") == [
        _w(),
        _w(tp=2, moe_ep=2), _w(attention_dp=2, moe_ep=2),
        _w(tp=4, moe_ep=4), _w(attention_dp=4, moe_ep=4),
        _w(tp=8, moe_ep=8), _w(attention_dp=8, moe_ep=8),
        _w(tp=16, moe_ep=16), _w(attention_dp=16, moe_ep=16),
    ]
    # ~61 GB of bf16 weights: no single L40S holds it, two do
    assert _summary(worker_shapes(QWEN_MOE, "l40s"))[:2] == [("tep", 2), ("dep", 2)]
    assert ("tp", 1) not in _summary(worker_shapes(QWEN_MOE, "l40s"))


def test_moe_expert_count_must_divide(tmp_path):
    model = _local_model(tmp_path, "Qwen__Qwen3-30B-A3B", num_experts=60)
    assert _summary(worker_shapes(model, "h200_sxm")) == [("tp", 1), ("tep", 2), ("dep", 2), ("tep", 4), ("dep", 4)]


def test_enumeration_is_memoised_and_returns_fresh_dicts():
    _worker_shapes.cache_clear()
    first = worker_shapes(LLAMA, "h200_sxm")
    first[0]["tp"] = 99
    second = worker_shapes(LLAMA, "h200_sxm")
    assert second[0] == _w(tp=1)
    info = _worker_shapes.cache_info()
    assert (info.hits, info.misses) == (1, 1)


@pytest.mark.parametrize("kwargs, where", [
    ({"model": "no/such-model"}, "search_space.model_name"),
    ({"hardware": "tpu"}, "search_space.hardware_sku"),
    ({"max_batched_tokens": 0}, "max_batched_tokens"),
    ({"block_size": 1.5}, "block_size"),
    ({"memory_fraction": 1.5}, "memory_fraction"),
    ({"sizes": (0,)}, "sizes"),
])
def test_worker_shapes_rejections(kwargs, where):
    args = {"model": LLAMA, "hardware": "h200_sxm", **kwargs}
    with pytest.raises(InputError) as info:
        worker_shapes(**args)
    assert info.value.where == where


# -- pools -------------------------------------------------------------------------------------
def test_agg_pool_under_a_tiny_budget():
    ws = worker_shapes(LLAMA, "h200_sxm")
    assert shape_pool("agg", {"agg": ws}, None, 2) == [
        _s(tp=1), _s(tp=1, replicas=2), _s(tp=2), _s(attention_dp=2)]
    assert shape_pool("agg", {"agg": ws}, 2, 2) == [_s(tp=1, replicas=2), _s(tp=2), _s(attention_dp=2)]
    assert [shape_key(c) for c in shape_pool("agg", {"agg": ws}, 4, 4)] == [
        "tp1-pp1-adp1-mtp1-mep1-x4", "tp2-pp1-adp1-mtp1-mep1-x2", "tp1-pp1-adp2-mtp1-mep1-x2",
        "tp4-pp1-adp1-mtp1-mep1-x1", "tp1-pp1-adp4-mtp1-mep1-x1"]


def test_disagg_pool_under_a_tiny_budget():
    ws = worker_shapes(LLAMA, "h200_sxm")
    pool = shape_pool("disagg", {"prefill": ws, "decode": ws}, None, 3)
    assert [shape_key(c) for c in pool] == [
        "prefill:tp1-pp1-adp1-mtp1-mep1-x1/decode:tp1-pp1-adp1-mtp1-mep1-x1",
        "prefill:tp1-pp1-adp1-mtp1-mep1-x1/decode:tp1-pp1-adp1-mtp1-mep1-x2",
        "prefill:tp1-pp1-adp1-mtp1-mep1-x1/decode:tp2-pp1-adp1-mtp1-mep1-x1",
        "prefill:tp1-pp1-adp1-mtp1-mep1-x1/decode:tp1-pp1-adp2-mtp1-mep1-x1",
        "prefill:tp1-pp1-adp1-mtp1-mep1-x2/decode:tp1-pp1-adp1-mtp1-mep1-x1",
        "prefill:tp2-pp1-adp1-mtp1-mep1-x1/decode:tp1-pp1-adp1-mtp1-mep1-x1",
        "prefill:tp1-pp1-adp2-mtp1-mep1-x1/decode:tp1-pp1-adp1-mtp1-mep1-x1",
    ]
    assert pool[0] == {"prefill": _s(), "decode": _s()}
    assert [used_gpus("disagg", c) for c in pool] == [2, 3, 3, 3, 3, 3, 3]
    assert shape_pool("disagg", {"prefill": ws, "decode": ws}, 3, 3) == pool[1:]
    assert shape_pool("disagg", {"prefill": ws, "decode": ws}, None, 1) == []  # each role needs a GPU


def test_pool_roles_are_enumerated_separately():
    pool = shape_pool("disagg", {"prefill": [_w(tp=2)], "decode": [_w(attention_dp=2, moe_ep=2)]}, 4, 6)
    assert [shape_key(c) for c in pool] == [
        "prefill:tp2-pp1-adp1-mtp1-mep1-x1/decode:tp1-pp1-adp2-mtp1-mep2-x1",
        "prefill:tp2-pp1-adp1-mtp1-mep1-x1/decode:tp1-pp1-adp2-mtp1-mep2-x2",
        "prefill:tp2-pp1-adp1-mtp1-mep1-x2/decode:tp1-pp1-adp2-mtp1-mep2-x1"]


def test_pool_bounds_and_sizes():
    ws = worker_shapes(LLAMA, "h200_sxm")
    agg = shape_pool("agg", {"agg": ws}, 8, 32)
    assert all(8 <= used_gpus("agg", c) <= 32 for c in agg)
    assert [used_gpus("agg", c) for c in agg] == sorted(used_gpus("agg", c) for c in agg)
    assert len(shape_pool("agg", {"agg": ws}, None, 32)) == 92
    assert len(shape_pool("agg", {"agg": ws}, None, 32, max_replicas=4)) == 4 + 8 + 8 + 8 + 4
    assert shape_pool("agg", {"agg": ws}, 5, 4) == []
    assert shape_pool("agg", {"agg": []}, None, 32) == []
    # duplicate worker shapes are listed once; omitted dims are 1
    assert shape_pool("agg", {"agg": [{"tp": 2}, _w(tp=2)]}, None, 4) == [_s(tp=2), _s(tp=2, replicas=2)]
    disagg = shape_pool("disagg", {"prefill": ws, "decode": ws}, None, 32)
    assert len(disagg) == 3628
    assert all(2 <= used_gpus("disagg", c) <= 32 for c in disagg)
    assert len({shape_key(c) for c in disagg}) == len(disagg)
    assert all(strategy(c[role]) != "mixed" for c in disagg for role in c)


def test_pool_rejections():
    with pytest.raises(InputError) as info:
        shape_pool("both", {"agg": []}, None, 4)
    assert info.value.where == "deployment_mode"
    with pytest.raises(InputError) as info:
        shape_pool("agg", {"agg": [_s(tp=2)]}, None, 4)
    assert info.value.where == "worker_shapes.agg.0.replicas"
    with pytest.raises(InputError) as info:
        shape_pool("agg", {"agg": []}, 0, 4)
    assert info.value.where == "min_gpu_budget"
    with pytest.raises(ValueError, match="missing decode"):
        shape_pool("disagg", {"prefill": []}, None, 4)


# -- keys --------------------------------------------------------------------------------------
def test_shape_keys_round_trip():
    agg = _s(tp=2, attention_dp=1, moe_ep=2, replicas=3)
    assert shape_key(agg) == "tp2-pp1-adp1-mtp1-mep2-x3"
    assert shape_from_key("tp2-pp1-adp1-mtp1-mep2-x3") == agg
    disagg = {"prefill": _s(tp=4, replicas=2), "decode": _s(attention_dp=8, moe_ep=8, replicas=12)}
    key = shape_key(disagg)
    assert key == "prefill:tp4-pp1-adp1-mtp1-mep1-x2/decode:tp1-pp1-adp8-mtp1-mep8-x12"
    assert shape_from_key(key) == disagg
    assert shape_key({"tp": 4}) == "tp4-pp1-adp1-mtp1-mep1-x1"  # omitted dims are 1
    ws = worker_shapes(LLAMA, "h200_sxm")
    pools = shape_pool("disagg", {"prefill": ws, "decode": ws}, None, 6) + shape_pool("agg", {"agg": ws}, None, 32)
    for config in pools:
        assert shape_from_key(shape_key(config)) == config


@pytest.mark.parametrize("key", ["", "tp2", "tp0-pp1-adp1-mtp1-mep1-x1", "tp02-pp1-adp1-mtp1-mep1-x1",
                                 "tp2-pp1-adp1-mtp1-mep1-x1 ", "prefill:tp1-pp1-adp1-mtp1-mep1-x1",
                                 "prefill:tp1-pp1-adp1-mtp1-mep1-x1/decode:", 7])
def test_bad_shape_keys(key):
    with pytest.raises(InputError) as info:
        shape_from_key(key)
    assert info.value.where == "parallel_config"


# -- projection --------------------------------------------------------------------------------
def test_distance_is_l1_over_log2_dims():
    assert shape_distance(_s(tp=2, replicas=4), _s(tp=8, replicas=1)) == 4.0
    assert shape_distance({"prefill": _s(tp=2), "decode": _s(attention_dp=4, moe_ep=4)},
                          {"prefill": _s(tp=4), "decode": _s(tp=4, moe_ep=4)}) == 1.0 + 4.0


def test_a_pool_member_projects_onto_itself():
    ws = worker_shapes(LLAMA, "h200_sxm")
    pool = shape_pool("agg", {"agg": ws}, None, 8)
    for member in pool:
        assert project(member, pool) == member
    got = project(pool[3], pool)
    assert got is not pool[3]


def test_projection_picks_the_nearest_shape():
    ws = worker_shapes(LLAMA, "h200_sxm")
    pool = shape_pool("agg", {"agg": ws}, None, 8)
    # tp 3 is no shape: tp 4 (distance log2(4/3)) beats tp 2 (log2(3/2))
    assert project({"tp": 3}, pool) == _s(tp=4)
    # over budget: tp 16 -> tp 8 (distance 1, the only one)
    assert project({"tp": 16}, pool) == _s(tp=8)
    # tp 2 x 5 (10 GPUs): tp 2 x 4 (log2(5/4)) beats tp 2 x 3 (log2(5/3))
    assert project({"tp": 2, "replicas": 5}, pool) == _s(tp=2, replicas=4)
    # a dense model has no tep: tp 4 with moe_ep 4 -> tp 4
    assert project({"tp": 4, "moe_ep": 4}, pool) == _s(tp=4)
    # dep 4 -> dtp 4
    assert project({"attention_dp": 4, "moe_ep": 4}, pool) == _s(attention_dp=4)


def test_projection_ties_break_on_gpus_then_pool_order():
    ws = worker_shapes(LLAMA, "h200_sxm")
    pool = shape_pool("agg", {"agg": ws}, None, 8)
    # tp 4 x 4 (16 GPUs): tp 4 x 2 and tp 2 x 4 are both at distance 1 and 8 GPUs -> pool order (tp 2 x 4 first)
    assert project({"tp": 4, "replicas": 4}, pool) == _s(tp=2, replicas=4)
    # tp 16 x 2 (32 GPUs): tp 8 x 1 and tp 4 x 2 are both at distance 2 and 8 GPUs -> pool order (tp 4 first)
    assert project({"tp": 16, "replicas": 2}, pool) == _s(tp=4, replicas=2)
    # tp 2 with adp 2 (mixed, 4 GPUs): tp 2 x 1 and dtp 2 x 1 at distance 1, both 2 GPUs -> pool order (tp first)
    assert project({"tp": 2, "attention_dp": 2}, pool) == _s(tp=2)
    # the tie-break is the pool's order: reversed, the other one wins
    assert project({"tp": 2, "attention_dp": 2}, pool[::-1]) == _s(attention_dp=2)
    # equal distance, different GPUs: tp 2 x 2 (4 GPUs) -> tp 4 x 1 (distance 2, 4 GPUs) over tp 1 x 1
    # (distance 2, 1 GPU) though tp 1 x 1 comes first in the pool
    small = shape_pool("agg", {"agg": [_w(tp=1), _w(tp=4)]}, None, 4, max_replicas=1)
    assert small == [_s(tp=1), _s(tp=4)]
    assert project({"tp": 2, "replicas": 2}, small) == _s(tp=4)


def test_disagg_projection():
    ws = worker_shapes(LLAMA, "h200_sxm")
    pool = shape_pool("disagg", {"prefill": ws, "decode": ws}, None, 6)
    # 8 GPUs asked, 6 allowed: (tp 2, tp 4) and (tp 4, tp 2) tie at distance 1 and 6 GPUs -> pool order
    assert project({"prefill": {"tp": 4}, "decode": {"tp": 4}}, pool) == {"prefill": _s(tp=2), "decode": _s(tp=4)}
    # tp 8 / tp 1 x 3 (11 GPUs) -> tp 4 / tp 1 x 2: 1 + log2(3/2), nearer than tp 4 / tp 1 x 1 (1 + log2 3)
    assert project({"prefill": {"tp": 8}, "decode": {"replicas": 3}}, pool) == {
        "prefill": _s(tp=4), "decode": _s(replicas=2)}
    assert project({"prefill": {"tp": 2}, "decode": {"replicas": 4}}, pool) == {
        "prefill": _s(tp=2), "decode": _s(replicas=4)}
    with pytest.raises(InputError) as info:
        project(_s(tp=2), pool)  # an agg suggestion against a disagg pool
    assert info.value.where == "parallel_config.tp"


def test_an_empty_pool_raises_parallel_projection():
    with pytest.raises(ShapeProjectionError) as info:
        project({"tp": 2}, [])
    err = info.value
    assert isinstance(err, InputError)
    assert err.reason_category == "parallel_projection"
    assert err.category == "invalid_config"
    assert err.where == "parallel_config"
    assert "tp2-pp1-adp1-mtp1-mep1-x1" in err.message and "pool is empty" in err.message
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is ShapeProjectionError and again.reason_category == "parallel_projection"
    # no KV-feasible shape at all (the model does not fit one GPU) -> an empty pool
    none_fit = worker_shapes("Qwen/Qwen3-32B", "l40s", sizes=(1,))
    pool = shape_pool("disagg", {"prefill": none_fit, "decode": none_fit}, None, 32)
    with pytest.raises(ShapeProjectionError):
        project({"prefill": {}, "decode": {}}, pool)
