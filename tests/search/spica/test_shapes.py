"""Parallel shapes: strategy and used_gpus derivation, unrolled keys, and the shape checks."""

from __future__ import annotations

import pytest

from aisim.search.spica.shapes import check_parallel_config, parallel_fields, strategy, used_gpus
from aisim.simulator.errors import InputError


def _shape(tp=1, pp=1, attention_dp=1, moe_tp=1, moe_ep=1, replicas=1) -> dict:
    return {"tp": tp, "pp": pp, "attention_dp": attention_dp, "moe_tp": moe_tp, "moe_ep": moe_ep, "replicas": replicas}


@pytest.mark.parametrize("tp, attention_dp, moe_ep, expected", [
    (1, 1, 1, "tp"),
    (4, 1, 1, "tp"),
    (4, 1, 4, "tep"),
    (1, 1, 2, "tep"),
    (1, 4, 1, "dtp"),
    (1, 4, 4, "dep"),
    (2, 2, 1, "mixed"),
    (2, 2, 4, "mixed"),
])
def test_strategy(tp, attention_dp, moe_ep, expected):
    assert strategy(_shape(tp=tp, attention_dp=attention_dp, moe_ep=moe_ep)) == expected


def test_used_gpus_is_tp_pp_attention_dp_replicas_summed_over_roles():
    assert used_gpus("agg", _shape(tp=2, pp=2, attention_dp=3, moe_tp=4, moe_ep=8, replicas=5)) == 60
    assert used_gpus("disagg", {"prefill": _shape(tp=4, replicas=2), "decode": _shape(attention_dp=8, pp=2)}) == 24


def test_agg_parallel_fields_in_order():
    assert list(parallel_fields("agg", _shape(tp=1, attention_dp=4, moe_tp=1, moe_ep=4, replicas=2)).items()) == [
        ("tp", 1), ("pp", 1), ("attention_dp", 4), ("moe_tp", 1), ("moe_ep", 4), ("strategy", "dep"),
        ("replicas", 2), ("used_gpus", 8)]


def test_disagg_parallel_fields_in_order():
    config = {"prefill": _shape(tp=4, moe_ep=4, replicas=3), "decode": _shape(tp=2, pp=2, replicas=1)}
    assert list(parallel_fields("disagg", config).items()) == [
        ("prefill_tp", 4), ("prefill_pp", 1), ("prefill_attention_dp", 1), ("prefill_moe_tp", 1),
        ("prefill_moe_ep", 4), ("prefill_strategy", "tep"), ("prefill_replicas", 3),
        ("decode_tp", 2), ("decode_pp", 2), ("decode_attention_dp", 1), ("decode_moe_tp", 1),
        ("decode_moe_ep", 1), ("decode_strategy", "tp"), ("decode_replicas", 1),
        ("used_gpus", 16)]


def test_a_pinned_shape_fills_omitted_dims_with_1():
    assert check_parallel_config("agg", {"tp": 4}, "w", fill=True) == _shape(tp=4)
    assert check_parallel_config("disagg", {"prefill": {}, "decode": {"replicas": 2}}, "w", fill=True) == {
        "prefill": _shape(), "decode": _shape(replicas=2)}


@pytest.mark.parametrize("mode, raw, where, needle", [
    ("agg", {"tp": 2}, "pc.pp", "is missing"),
    ("agg", {**_shape(), "tpp": 2}, "pc.tpp", "unknown shape key"),
    ("agg", {**_shape(), "strategy": "tp"}, "pc.strategy", "derived from the shape, not settable"),
    ("agg", {**_shape(), "used_gpus": 1}, "pc.used_gpus", "derived from the shape, not settable"),
    ("agg", _shape(tp=0), "pc.tp", "must be a positive integer (got 0)"),
    ("agg", _shape(tp=True), "pc.tp", "must be a positive integer (got True)"),
    ("agg", _shape(tp=2.0), "pc.tp", "must be a positive integer (got 2.0)"),
    ("agg", [1, 2], "pc", "must be a mapping"),
    ("agg", {"prefill": _shape(), "decode": _shape()}, "pc", "is a disagg (prefill/decode) shape, but the mode is agg"),
    ("disagg", _shape(), "pc.tp", "a disagg shape takes only prefill and decode"),
    ("disagg", {"prefill": _shape()}, "pc.decode", "is missing; a disagg shape gives both prefill and decode"),
    ("disagg", {"prefill": _shape(), "decode": 3}, "pc.decode", "must be a mapping"),
    ("disagg", "x", "pc", "must be a mapping {prefill: shape, decode: shape}"),
])
def test_shape_rejections(mode, raw, where, needle):
    with pytest.raises(InputError) as info:
        check_parallel_config(mode, raw, "pc")
    assert info.value.where == where
    assert needle in info.value.message
