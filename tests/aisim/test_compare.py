"""aisim compare: loading run directories, deltas against the first run, table/json/csv output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aisim.compare import (
    METRICS,
    CompareError,
    compare,
    fmt_cell,
    load_run,
    main_compare,
    planner_counts,
    render_table,
    to_csv,
    to_json,
)
from aisim.simulator.errors import InputError
from tests.conftest import ROOT

SUMMARY_A = {
    "gpu_hours": 2.0, "goodput_output_throughput_tok_s": 1000.0, "goodput_request_throughput_rps": 4.0,
    "mean_ttft_ms": 100.0, "p90_ttft_ms": 200.0, "p99_ttft_ms": 400.0,
    "mean_itl_ms": 0.1, "p90_itl_ms": 20.0, "p99_itl_ms": 40.0,
    "mean_e2e_latency_ms": 1000.0, "p90_e2e_latency_ms": 2000.0, "p99_e2e_latency_ms": 4000.0,
    "rejected_requests": 0, "completed_requests": 100,
}
SUMMARY_B = {
    **SUMMARY_A, "gpu_hours": 2.5, "goodput_output_throughput_tok_s": 1500.0, "goodput_request_throughput_rps": 3.0,
    "mean_ttft_ms": 80.0, "mean_itl_ms": 0.3, "rejected_requests": 4, "completed_requests": 96,
}
del SUMMARY_B["p99_e2e_latency_ms"]  # a missing value: no delta

PLANNER = {
    "scaling_events": [
        {"at_s": 10.0, "component": "decode", "from_count": 1, "to_count": 2, "reason": "scale_up"},
        {"at_s": 20.0, "component": "decode", "from_count": 2, "to_count": 3, "reason": "scale_up"},
        {"at_s": 90.0, "component": "decode", "from_count": 3, "to_count": 2, "reason": "scale_down"},
    ],
    "lifecycle_operations": [
        {"transitions": [{"transition": "worker_starting"}, {"transition": "worker_ready"}]},
        {"transitions": [{"transition": "worker_starting"}]},
    ],
    "retune_events": [{"outcome": "applied"}, {"outcome": "kept"}, {"outcome": "applied"}, {"outcome": "timeout"}],
}


def _run_dir(root: Path, name: str, summary: dict, planner: dict | None = None) -> Path:
    d = root / name
    d.mkdir()
    (d / "prediction.json").write_text(json.dumps({"summary": summary, "planner": planner, "per_request": None,
                                                   "coverage": {}}))
    return d


@pytest.fixture
def two_runs(tmp_path):
    return _run_dir(tmp_path, "a", SUMMARY_A), _run_dir(tmp_path, "b", SUMMARY_B, PLANNER)


def _row(result: dict, metric: str) -> dict:
    return next(r for r in result["rows"] if r["metric"] == metric)


def test_metrics_table_shape():
    keys = [m[0] for m in METRICS]
    assert len(keys) == len(set(keys))
    assert all(better in ("lower", "higher", None) for *_, better in METRICS)
    for k in ("gpu_hours", "goodput_request_throughput_rps", "p99_itl_ms", "p90_e2e_latency_ms",
              "rejected_requests", "scaling_events", "retune_decisions"):
        assert k in keys


def test_load_run(two_runs):
    a, b = two_runs
    run = load_run(b)
    assert run == {"name": str(b), "summary": SUMMARY_B, "planner": PLANNER}
    assert load_run(a / "prediction.json")["summary"] == SUMMARY_A  # a prediction.json path works too


def test_deltas_and_pct_exact(two_runs):
    result = compare([load_run(p) for p in two_runs])
    assert result["runs"] == [str(p) for p in two_runs]
    assert [r["metric"] for r in result["rows"]] == [m[0] for m in METRICS]
    expect = {  # metric: (values, delta, pct)
        "gpu_hours": ([2.0, 2.5], 0.5, 25.0),
        "goodput_output_throughput_tok_s": ([1000.0, 1500.0], 500.0, 50.0),
        "goodput_request_throughput_rps": ([4.0, 3.0], -1.0, -25.0),
        "mean_ttft_ms": ([100.0, 80.0], -20.0, -20.0),
        "p90_ttft_ms": ([200.0, 200.0], 0.0, 0.0),
        "mean_itl_ms": ([0.1, 0.3], 0.2, 200.0),  # float noise rounded away (0.3 - 0.1)
        "p99_e2e_latency_ms": ([4000.0, None], None, None),
        "rejected_requests": ([0, 4], 4, None),  # first is 0: no percentage
        "completed_requests": ([100, 96], -4, -4.0),
        "scaling_events": ([None, 3], None, None),  # run a has no Planner
    }
    for metric, (values, delta, pct) in expect.items():
        row = _row(result, metric)
        assert row["values"] == values, metric
        assert row["deltas"] == [None, delta], metric
        assert row["delta_pct"] == [None, pct], metric
    assert isinstance(_row(result, "rejected_requests")["deltas"][1], int)
    gpu = _row(result, "gpu_hours")
    assert (gpu["label"], gpu["unit"], gpu["better"]) == ("GPU hours", "h", "lower")


def test_reuse_rows_and_the_settings_that_differ(tmp_path):
    gpu = {**SUMMARY_A, "prefix_cache_reused_ratio": 0.05,
           "deployment": {"router": {"policy": "kv_router", "temperature": 0.0}, "seed": 42},
           "prediction_provenance": {"aggregated": {"replicas": 2, "kv_block_size": 64}}}
    host = {**gpu, "prefix_cache_reused_ratio": 0.25, "kv_tiers": {"reuse": {"first_admission_host_ratio": 0.125}},
            "deployment": {"router": {"policy": "kv_router", "temperature": 0.0, "host_cache_hit_weight": 0.5},
                           "seed": 42},
            "prediction_provenance": {"aggregated": {"replicas": 2, "kv_block_size": 64,
                                                     "host_offload": {"scope": "dp_rank_local", "num_host_blocks": 40}}}}
    a, b = _run_dir(tmp_path, "gpu", gpu), _run_dir(tmp_path, "host", host)
    result = compare([load_run(a), load_run(b)])
    assert _row(result, "prefix_cache_reused_ratio")["values"] == [0.05, 0.25]
    assert _row(result, "prefix_cache_reused_ratio")["delta_pct"] == [None, 400.0]
    host_row = _row(result, "kv_tiers.reuse.first_admission_host_ratio")  # (a nested field: tiers only)
    assert host_row["values"] == [None, 0.125] and host_row["deltas"] == [None, None]
    # only what differs, in the first run's order then the others' new paths; absent is None
    assert result["settings"] == [
        {"setting": "deployment.router.host_cache_hit_weight", "values": [None, 0.5]},
        {"setting": "prediction_provenance.aggregated.host_offload.scope", "values": [None, "dp_rank_local"]},
        {"setting": "prediction_provenance.aggregated.host_offload.num_host_blocks", "values": [None, 40]},
    ]
    lines = render_table(result, width=200).split("\n")
    assert lines[-4:] == ["settings that differ:", "  deployment.router.host_cache_hit_weight: - | 0.5",
                          "  prediction_provenance.aggregated.host_offload.scope: - | dp_rank_local",
                          "  prediction_provenance.aggregated.host_offload.num_host_blocks: - | 40"]
    assert compare([load_run(a), load_run(a)])["settings"] == []  # the same run: no section
    assert "settings" not in render_table(compare([load_run(a), load_run(a)]), width=200)


def test_planner_counts():
    assert planner_counts(PLANNER) == {"scaling_events": 3, "scale_ups": 2, "scale_downs": 1, "worker_starts": 2,
                                       "retune_decisions": 4, "retune_applied": 2}
    # a Planner without retune (retune_events null) makes no retune decisions
    assert planner_counts({"scaling_events": [], "retune_events": None}) == {
        "scaling_events": 0, "scale_ups": 0, "scale_downs": 0, "worker_starts": 0,
        "retune_decisions": 0, "retune_applied": 0}
    assert set(planner_counts(None).values()) == {None}


def test_planner_runs_compared(tmp_path):
    a = _run_dir(tmp_path, "a", SUMMARY_A, {"scaling_events": [PLANNER["scaling_events"][0]], "retune_events": None})
    b = _run_dir(tmp_path, "b", SUMMARY_A, PLANNER)
    result = compare([load_run(a), load_run(b)])
    got = {r["metric"]: (r["values"], r["deltas"][1], r["delta_pct"][1]) for r in result["rows"]}
    assert got["scaling_events"] == ([1, 3], 2, 200.0)
    assert got["scale_ups"] == ([1, 2], 1, 100.0)
    assert got["scale_downs"] == ([0, 1], 1, None)
    assert got["retune_decisions"] == ([0, 4], 4, None)
    assert got["retune_applied"] == ([0, 2], 2, None)


def test_to_json_exact(two_runs):
    result = compare([load_run(p) for p in two_runs])
    text = to_json(result)
    assert json.loads(text) == result
    assert not text.endswith("\n")
    row = json.loads(text)["rows"][0]
    assert row == {"metric": "gpu_hours", "label": "GPU hours", "unit": "h", "better": "lower",
                   "values": [2.0, 2.5], "deltas": [None, 0.5], "delta_pct": [None, 25.0]}
    assert main_compare([str(p) for p in two_runs], "json") == text


def test_to_csv_exact(two_runs):
    a, b = two_runs
    lines = main_compare([str(a), str(b)], "csv").split("\n")
    assert lines[0] == f"metric,label,unit,{a},{b},delta_{b},delta_pct_{b}"
    assert len(lines) == 1 + len(METRICS)
    by_metric = {line.split(",")[0]: line for line in lines[1:]}
    assert by_metric["gpu_hours"] == "gpu_hours,GPU hours,h,2.0,2.5,0.5,25.0"
    assert by_metric["mean_itl_ms"] == "mean_itl_ms,ITL mean,ms,0.1,0.3,0.2,200.0"
    assert by_metric["p99_e2e_latency_ms"] == "p99_e2e_latency_ms,E2E p99,ms,4000.0,,,"
    assert by_metric["rejected_requests"] == "rejected_requests,rejected,requests,0,4,4,"
    assert by_metric["scale_ups"] == "scale_ups,scale-ups,events,,2,,"


def test_csv_three_runs(tmp_path):
    dirs = [_run_dir(tmp_path, n, {**SUMMARY_A, "gpu_hours": g}) for n, g in (("x", 4.0), ("y", 5.0), ("z", 3.0))]
    lines = to_csv(compare([load_run(d) for d in dirs])).split("\n")
    x, y, z = dirs
    assert lines[0] == f"metric,label,unit,{x},{y},{z},delta_{y},delta_{z},delta_pct_{y},delta_pct_{z}"
    assert lines[1] == "gpu_hours,GPU hours,h,4.0,5.0,3.0,1.0,-1.0,25.0,-25.0"


def test_fmt_cell():
    assert fmt_cell(1.23, 0.1, 8.8, first=False) == "1.23 (+0.10, +8.8%)"
    assert fmt_cell(1.23, None, None, first=True) == "1.23"
    assert fmt_cell(4, 4, None, first=False) == "4 (+4)"
    assert fmt_cell(2500.0, -500.0, -16.66, first=False) == "2,500.0 (-500.0, -16.7%)"
    assert fmt_cell(80.0, 0.0, 0.0, first=False) == "80.00 (=)"
    assert fmt_cell(None, None, None, first=False) == "-"
    assert fmt_cell(0.206, 0.0187, 10.0, first=False) == "0.206 (+0.019, +10.0%)"  # delta at its value's precision
    assert fmt_cell(0.0012, -0.0003, -20.0, first=False) == "0.00120 (-0.00030, -20.0%)"
    assert fmt_cell(1000, -4, -0.4, first=False) == "1,000 (-4, -0.4%)"


def test_render_table_side_by_side(two_runs):
    a, b = two_runs
    text = render_table(compare([load_run(a), load_run(b)]), width=200)
    lines = text.split("\n")
    assert lines[0].split() == ["metric", str(a), str(b)]
    assert set(lines[1]) == {"-"}
    assert len(lines) == 2 + len(METRICS) + 2
    assert max(len(line) for line in lines) <= 200
    gpu = lines[2]
    assert gpu.startswith("GPU hours (h)") and gpu.endswith("2.50 (+0.50, +25.0%)")
    assert lines[2 + [m[0] for m in METRICS].index("rejected_requests")].endswith("4 (+4)")
    assert lines[-1] == f"deltas: each run minus the first ({a})"


def test_render_table_stacks_when_narrow(two_runs):
    a, b = two_runs
    result = compare([load_run(a), load_run(b)])
    wide = render_table(result, width=200)
    narrow_width = max(len(line) for line in wide.split("\n")) - 1
    text = render_table(result, width=narrow_width)
    lines = text.split("\n")
    assert lines[0] == f"run 1: {a}"
    assert f"run 2: {b} (vs run 1)" in lines
    assert "  GPU hours (h)" in lines[1] and lines[1].endswith(" 2.00")
    assert any(line.endswith("2.50 (+0.50, +25.0%)") for line in lines)
    assert main_compare([str(a), str(b)], width=narrow_width) == text


def test_single_run_no_deltas(two_runs):
    a, _ = two_runs
    result = compare([load_run(a)])
    assert all(r["deltas"] == [None] and r["delta_pct"] == [None] for r in result["rows"])
    assert "deltas:" not in render_table(result)


@pytest.mark.parametrize("case", ["missing", "no_prediction", "invalid_json", "no_summary", "not_object"])
def test_bad_run_directories(tmp_path, case):
    d = tmp_path / "run"
    if case != "missing":
        d.mkdir()
    if case == "invalid_json":
        (d / "prediction.json").write_text('{"summary": {\n  "gpu_hours": 1,,\n')
    elif case == "no_summary":
        (d / "prediction.json").write_text('{"planner": null}')
    elif case == "not_object":
        (d / "prediction.json").write_text("[1, 2]")
    with pytest.raises(InputError) as info:
        load_run(d)
    err = info.value
    assert isinstance(err, CompareError) and err.exit_code == 2
    assert err.where == str(d)
    assert "\n" not in str(err) and str(err).startswith(f"{d}: ")
    want = {"missing": "no such directory", "no_prediction": "holds no prediction.json",
            "invalid_json": "not valid JSON", "no_summary": 'no "summary"', "not_object": 'no "summary"'}[case]
    assert want in err.message
    assert "aisim predict" in err.message  # says how to fix it
    # main_compare fails on the bad directory even after a good one
    good = _run_dir(tmp_path, "good", SUMMARY_A)
    with pytest.raises(InputError) as info2:
        main_compare([str(good), str(d)])
    assert info2.value.where == str(d)


def test_no_runs_and_bad_format(two_runs):
    with pytest.raises(InputError):
        main_compare([])
    with pytest.raises(InputError) as info:
        main_compare([str(p) for p in two_runs], "xml")
    assert info.value.where == "--format"


def test_non_numeric_and_non_finite_values_are_missing(tmp_path):
    a = _run_dir(tmp_path, "a", {**SUMMARY_A, "gpu_hours": "n/a", "mean_ttft_ms": None})
    d = tmp_path / "b"
    d.mkdir()
    (d / "prediction.json").write_text(json.dumps({"summary": {**SUMMARY_A, "p90_ttft_ms": float("nan")},
                                                   "planner": None}))
    result = compare([load_run(a), load_run(d)])
    assert _row(result, "gpu_hours")["values"] == [None, 2.0]
    assert _row(result, "mean_ttft_ms")["deltas"] == [None, None]
    assert _row(result, "p90_ttft_ms")["values"] == [200.0, None]
    json.loads(to_json(result))  # strict JSON: no NaN


# --- compare --report ---------------------------------------------------------------------------
def _report_charts(page: str) -> dict:
    import re

    blocks = re.findall(r'<script type="application/json" class="chart-data" data-chart="([a-z0-9-]+)">(.*?)</script>',
                        page, flags=re.S)
    return {name: json.loads(text.replace("<\\/", "</")) for name, text in blocks}


def test_compare_report_overlays_each_runs_distribution(tmp_path):
    pytest.importorskip("matplotlib", reason="compare --report needs the report extra (matplotlib)")
    from aisim.compare import main_compare

    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1")
    a, b = tmp_path / "a", tmp_path / "b"
    for d, extra in ((a, ["--capture-per-request"]), (b, ["--set", "engine.workers.aggregated.parallelism.replicas=3"])):
        p = subprocess.run([sys.executable, "-m", "aisim", "predict", "--output-dir", str(d), "--format", "json", *extra],
                           capture_output=True, text=True, env=env, timeout=180)
        assert p.returncode == 0, p.stderr
    out = tmp_path / "cmp.html"
    main_compare([str(a), str(b)], "json", report=out)
    data = _report_charts(out.read_text())
    rows = [json.loads(x) for x in (a / "requests.jsonl").read_text().splitlines()]
    done = [r for r in rows if r["terminal_status"] == "completed"]
    sb = json.loads((b / "prediction.json").read_text())["summary"]
    assert data["cdf-ttft"]["runs"][str(a)] == {"values_ms": [r["ttft_ms"] for r in done]}
    assert data["cdf-itl"]["runs"][str(a)] == {"values_ms": [r["itl_ms"] for r in done if r["itl_ms"] is not None]}
    # b kept no request records: its summary's percentiles (ITL per request = the summary's TPOT)
    assert data["cdf-ttft"]["runs"][str(b)] == {"percentiles": [
        [sb[f"{s}_ttft_ms"], q] for s, q in (("min", 0.0), ("median", 0.5), ("p75", 0.75), ("p90", 0.9),
                                             ("p95", 0.95), ("p99", 0.99), ("max", 1.0))]}
    assert data["cdf-itl"]["runs"][str(b)]["percentiles"][1] == [sb["median_tpot_ms"], 0.5]
    assert "replicas" not in data  # no Planner in either run
    page = out.read_text()
    assert "GPU hours" in page and "+49.9%" in page  # the comparison table with its deltas


def test_compare_report_errors_are_one_line(tmp_path):
    p = aisim_compare(str(tmp_path / "missing"), "--report", str(tmp_path / "x.html"))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "missing" in p.stderr


def aisim_compare(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "aisim", "compare", *args], capture_output=True, text=True, env=env,
                          timeout=120)
