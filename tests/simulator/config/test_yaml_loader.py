"""The YAML every config, --set value and planner config goes through: duplicate keys are errors,
alias bombs and recursive aliases are refused before they grow, YAML 1.2 floats are floats."""

from __future__ import annotations

from pathlib import Path

import pytest

from aisim.simulator.config.loading import MAX_YAML_NODES, apply_overrides, load_config, load_yaml, parse_override, read_yaml_mapping
from aisim.simulator.config.planner_config import parse_planner_config
from aisim.simulator.errors import InputError

ROOT = Path(__file__).resolve().parents[3]
QUICK = ROOT / "configs" / "quickstart.yaml"


def write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_a_key_set_twice_names_the_key_and_the_line_of_the_second(tmp_path):
    p = write(tmp_path, "engine:\n  model: m\n  hardware: h200_sxm\n  backend: vllm\n  hardware: b200_sxm\n")
    with pytest.raises(InputError) as info:
        read_yaml_mapping(p)
    e = info.value
    assert e.where == f"{p}:5" and e.exit_code == 2
    assert "duplicate key 'hardware'" in e.message and "line 3" in e.message


def test_a_duplicate_top_level_section_and_a_duplicate_deep_key(tmp_path):
    p = write(tmp_path, "router: {policy: random}\nengine: {}\nrouter: {policy: kv_router}\n")
    with pytest.raises(InputError, match=r"c.yaml:3: duplicate key 'router'"):
        read_yaml_mapping(p)
    text = QUICK.read_text().replace("      scheduler: {max_batched_tokens: 8192, max_sequences: 256}",
                                     "      scheduler: {max_batched_tokens: 8192, max_batched_tokens: 4096}")
    with pytest.raises(InputError, match="duplicate key 'max_batched_tokens'"):
        load_config(write(tmp_path, text, "q.yaml"))


def test_the_same_key_in_different_mappings_and_merge_overrides_are_fine(tmp_path):
    data = read_yaml_mapping(write(tmp_path, "a: {x: 1}\nb: {x: 2}\nbase: &b {p: 1, q: 2}\nc:\n  <<: *b\n  q: 3\n"))
    assert data["c"] == {"p": 1, "q": 3} and data["a"] == {"x": 1}


def test_set_values_and_planner_config_files_reject_duplicate_keys(tmp_path):
    with pytest.raises(InputError) as info:
        parse_override("router={policy: random, policy: kv_router}")
    assert info.value.where == "--set router={policy: random, policy: kv_router}"
    assert "'policy' twice" in info.value.message
    p = write(tmp_path, "ttft_ms: 100\nitl_ms: 10\nttft_ms: 200\n", "planner.yaml")
    with pytest.raises(InputError, match=r"planner.yaml:3: duplicate key 'ttft_ms'"):
        parse_planner_config(str(p))
    with pytest.raises(InputError, match="duplicate key 'ttft_ms'"):
        parse_planner_config('{"ttft_ms": 100, "ttft_ms": 200}')


def bomb(levels: int = 7, width: int = 10) -> str:
    """A classic "billion laughs": ``width ** levels`` leaves (10**7 here) from a ~500-byte file."""
    lines = ["l0: &l0 [" + ", ".join(['"lol"'] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    lines.append("boom: [" + ", ".join([f"*l{levels - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_before_it_expands(tmp_path):
    p = write(tmp_path, bomb())
    assert p.stat().st_size < 1000
    with pytest.raises(InputError) as info:
        read_yaml_mapping(p)
    assert info.value.exit_code == 2 and info.value.where == str(p)
    assert f"more than {MAX_YAML_NODES:,} values through its aliases" in info.value.message
    with pytest.raises(InputError, match="alias bomb"):
        load_config(p)
    with pytest.raises(InputError, match="alias bomb"):
        apply_overrides({}, ["router=" + "{" + bomb().replace("\n", ", ").rstrip(", ") + "}"])


def test_aliases_within_the_bound_still_work(tmp_path):
    data = read_yaml_mapping(write(tmp_path, bomb(levels=3)))  # 10**4 leaves
    assert len(data["boom"]) == 10 and data["boom"][9][9][9] == ["lol"] * 10


def test_a_recursive_alias_is_refused(tmp_path):
    with pytest.raises(InputError, match="recursive alias"):
        read_yaml_mapping(write(tmp_path, "a: &a [1, *a]\n"))


def test_deep_nesting_is_one_line(tmp_path):
    with pytest.raises(InputError, match="nested too deeply"):
        read_yaml_mapping(write(tmp_path, "a: " + "[" * 5000 + "]" * 5000 + "\n"))


def test_yaml_1_2_floats_are_floats():
    assert load_yaml("[1e3, 2.5e-3, -1E2, 1.0e3, 1_000, 1.5, 3, '1e3', 1e3x]") == \
        [1000.0, 0.0025, -100.0, 1000.0, 1000, 1.5, 3, "1e3", "1e3x"]
    assert parse_override("evaluation.sla.ttft_ms=1e3") == (["evaluation", "sla", "ttft_ms"], 1000.0)
