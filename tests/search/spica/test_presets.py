"""The preset tables equal the reference dump, and the composite expansions follow the seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aisim.search.spica.presets import (
    ALLOWED_CHOICES,
    COMPOSITE_DICT_KEYS,
    COMPOSITE_KNOBS,
    COMPOSITE_REQUIRED_KEYS,
    DEFAULTS,
    PREDICTOR_FAMILY_DEFAULTS,
    PRESET_EXPANSIONS,
    fpm_fields,
    load_sensitivity_fields,
    predictor_fields,
    scaling_fields,
    scaling_is_on,
)

REFERENCE = Path(__file__).resolve().parents[3].parent / "shared" / "reference" / "spica-search-space.json"


@pytest.fixture(scope="module")
def reference() -> dict:
    if not REFERENCE.is_file():
        pytest.skip(f"{REFERENCE} is absent")
    return json.loads(REFERENCE.read_text())


def _lists(value):
    """Tuples as lists (the dump is JSON)."""
    if isinstance(value, (list, tuple)):
        return [_lists(v) for v in value]
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    return value


def test_defaults_equal_the_resolved_defaults_less_the_input(reference):
    expected = {**reference["resolved"], **{key: None for key in reference["input"]}}
    assert list(DEFAULTS) == list(expected)  # the reference's field order
    assert _lists(DEFAULTS) == expected


def test_allowed_choices_equal_the_reference(reference):
    assert _lists(ALLOWED_CHOICES) == reference["allowed_choices"]


def test_composite_keys_equal_the_reference(reference):
    assert {k: sorted(v) for k, v in COMPOSITE_DICT_KEYS.items()} == reference["composite_dict_keys"]
    assert {k: sorted(v) for k, v in COMPOSITE_REQUIRED_KEYS.items()} == reference["composite_required_keys"]
    assert list(COMPOSITE_DICT_KEYS) == list(COMPOSITE_KNOBS)


def test_preset_expansions_equal_the_reference_in_order(reference):
    assert PRESET_EXPANSIONS == reference["preset_expansions"]
    for knob, presets in reference["preset_expansions"].items():
        assert list(PRESET_EXPANSIONS[knob]) == list(presets)
        for preset, fields in presets.items():
            assert list(PRESET_EXPANSIONS[knob][preset].items()) == list(fields.items())


def test_family_defaults_equal_the_reference(reference):
    assert PREDICTOR_FAMILY_DEFAULTS == reference["predictor_family_defaults"]


def test_planner_composites_allow_exactly_what_they_require():
    for knob in COMPOSITE_KNOBS[:3]:
        assert COMPOSITE_REQUIRED_KEYS[knob] == COMPOSITE_DICT_KEYS[knob]
    assert COMPOSITE_REQUIRED_KEYS["load_predictor_candidates"] < COMPOSITE_DICT_KEYS["load_predictor_candidates"]


# -- expansions --------------------------------------------------------------------------------
def test_a_preset_id_expands_to_its_fields_in_emission_order():
    assert list(scaling_fields("load_180_10").items()) == [
        ("enable_throughput_scaling", False), ("enable_load_scaling", True),
        ("throughput_adjustment_interval_seconds", 180), ("load_adjustment_interval_seconds", 10)]
    assert list(fpm_fields("fine").items()) == [("max_num_fpm_samples", 128), ("fpm_sample_bucket_size", 64)]
    assert list(load_sensitivity_fields("conservative").items()) == [
        ("load_scaling_down_sensitivity", 90), ("load_min_observations", 8)]


def test_a_dict_expands_like_a_preset_in_emission_order():
    entry = {"load_adjustment_interval_seconds": 5, "throughput_adjustment_interval_seconds": 240,
             "enable_load_scaling": False, "enable_throughput_scaling": True}
    assert list(scaling_fields(entry).items()) == [
        ("enable_throughput_scaling", True), ("enable_load_scaling", False),
        ("throughput_adjustment_interval_seconds", 240), ("load_adjustment_interval_seconds", 5)]
    assert scaling_fields(dict(PRESET_EXPANSIONS["planner_scaling_policy"]["hybrid_600_5"])) == \
        scaling_fields("hybrid_600_5")


def test_predictor_fields_of_presets():
    assert predictor_fields("constant_last") == {"load_predictor": "constant", "load_predictor_log1p": False}
    assert list(predictor_fields("kalman_reactive_log1p").items()) == [
        ("load_predictor", "kalman"), ("load_predictor_log1p", True), ("kalman_q_level", 10.0),
        ("kalman_q_trend", 1.0), ("kalman_r", 5.0), ("kalman_min_points", 3)]


def test_predictor_fields_fill_family_defaults_and_drop_other_keys():
    assert predictor_fields({"load_predictor": "prophet"}) == {
        "load_predictor": "prophet", "load_predictor_log1p": False, "prophet_window_size": 50}
    assert list(predictor_fields({"load_predictor": "kalman", "kalman_r": 3.0, "prophet_window_size": 20,
                                  "load_predictor_log1p": True, "loss": 0.5}).items()) == [
        ("load_predictor", "kalman"), ("load_predictor_log1p", True), ("kalman_q_level", 1.0),
        ("kalman_q_trend", 0.1), ("kalman_r", 3.0), ("kalman_min_points", 5)]
    assert predictor_fields({"load_predictor": "arima", "kalman_r": 3.0}) == {
        "load_predictor": "arima", "load_predictor_log1p": False}


def test_scaling_is_on():
    assert [scaling_is_on(p) for p in DEFAULTS["planner_scaling_policy"]] == [False] + [True] * 6
    off = {"enable_throughput_scaling": False, "enable_load_scaling": False,
           "throughput_adjustment_interval_seconds": None, "load_adjustment_interval_seconds": None}
    assert scaling_is_on(off) is False
