"""Spica ledger and outputs (§7.7): candidate records, the recommendation document (rank order,
views, retention, provenance), and the exact bytes of recommendation.json, recommendation.csv and
recommendations/NNNN.yaml."""

from __future__ import annotations

import csv
import json
import math

import pytest
import yaml

from aisim import __version__
from aisim.search.spica.objectives import Score
from aisim.search.spica.outputs import COUNT_KEYS, SCHEMA_VERSION, build_recommendation, candidate_record, write_outputs

PROV = {"model": "m", "hardware": "h200_sxm"}
PA = {"model": {"name": "m"}, "engine": {"tp": 2, "backend": "vllm"}}
PB = {"model": {"name": "m"}, "engine": {"tp": 4, "backend": "sglang"}}
COUNTS = {"evaluated": 4, "feasible": 3, "infeasible": 1, "cache_hits": 1}


def _metrics(tput, ttft):
    # wall-clock and map fields are dropped from the ledger
    return {"output_throughput_tok_s": tput, "mean_ttft_ms": ttft, "wall_time_ms": 12.5,
            "rejection_reasons": {}, "prediction_provenance": {"x": 1}}


def _ledger():
    """Rank order: 2 (200), then the tie at 100 and 2 GPUs by canonical config JSON: 3
    ('{"backend": "vllm", "tp": 2, "used_gpus": 2, "x": true}': ',' < '}') before 0
    ('{"backend": "vllm", "tp": 2, "used_gpus": 2}'), then the infeasible 1. Candidates 0 and 3 share a
    prediction config."""
    return [
        candidate_record(0, "feasible", {"backend": "vllm", "tp": 2, "used_gpus": 2}, PA, 2,
                         Score((100.0,), {"throughput": 100.0}, "feasible", None, None), _metrics(100.0, 50.5),
                         None, None, PROV),
        candidate_record(1, "infeasible", {"backend": "vllm", "tp": 8, "used_gpus": 8}, {"engine": {"tp": 8}}, 8,
                         Score(None, {"throughput": 300.0}, "infeasible", "sla_constraint",
                               "mean_ttft_ms 900 > SLA ttft_ms 500"), _metrics(300.0, 900.0), None, None, PROV),
        candidate_record(2, "feasible", {"backend": "sglang", "tp": 4, "used_gpus": 4}, PB, 4,
                         Score((200.0,), {"throughput": 200.0}, "feasible", None, None), _metrics(200.0, 40.0),
                         None, None, PROV),
        candidate_record(3, "feasible", {"backend": "vllm", "tp": 2, "used_gpus": 2, "x": True}, dict(PA), 2,
                         Score((100.0,), {"throughput": 100.0}, "feasible", None, None), _metrics(100.0, 60.0),
                         None, None, PROV),
    ]


def _recommendation(ledger=None, **kw):
    args = dict(target="throughput", counts=COUNTS, search_strategy="optimizer_guided", run_id="run-1",
                input_fingerprint="sha256:abc", config={"optimization": {"target": "throughput"}}, top_n=2,
                created_at="2025-01-02T03:04:05Z")
    args.update(kw)
    return build_recommendation(_ledger() if ledger is None else ledger, **args)


# -- records -------------------------------------------------------------------------------------
def test_candidate_record_fields():
    rec = _ledger()[1]
    assert rec == {
        "candidate_id": "candidate-000001", "status": "infeasible",
        "config": {"backend": "vllm", "tp": 8, "used_gpus": 8}, "prediction_config": {"engine": {"tp": 8}},
        "used_gpus": 8, "score": None, "metrics": {"output_throughput_tok_s": 300.0, "mean_ttft_ms": 900.0},
        "objectives": {"throughput": 300.0}, "reason_category": "sla_constraint",
        "reason": "mean_ttft_ms 900 > SLA ttft_ms 500", "provenance": PROV}
    assert _ledger()[0]["score"] == 100.0
    pareto = candidate_record(12, "feasible", {}, None, 1, Score((1.5, 2.0), {"a": 1.5, "b": 2.0}), None, None,
                              None, {})
    assert (pareto["candidate_id"], pareto["score"], pareto["metrics"]) == ("candidate-000012", [1.5, 2.0], None)


def test_candidate_record_rejections_and_unscored_statuses():
    with pytest.raises(ValueError, match="status"):
        candidate_record(0, "ok", {}, None, 1, None, None, None, None, {})
    with pytest.raises(ValueError, match="reason_category"):
        candidate_record(0, "failed", {}, None, 1, None, None, "oops", "x", {})
    with pytest.raises(ValueError, match="scored"):
        candidate_record(0, "feasible", {}, None, 1, None, None, None, None, {})
    rec = candidate_record(5, "timed_out", {}, None, None, Score((1.0,), {"throughput": 1.0}), None,
                           "runtime_timeout", "replay ran past 600 s", {})
    assert (rec["score"], rec["reason_category"], rec["objectives"]) == (None, "runtime_timeout", {"throughput": 1.0})


# -- the document --------------------------------------------------------------------------------
def test_build_recommendation():
    rec = _recommendation()
    assert list(rec) == ["schema_version", "candidate_retention", "counts", "candidates", "views", "provenance"]
    assert rec["schema_version"] == SCHEMA_VERSION == "1.1"
    assert rec["candidate_retention"] == "all"
    assert rec["counts"] == {"evaluated": 4, "feasible": 3, "infeasible": 1, "unsupported": 0, "timed_out": 0,
                             "failed": 0, "resource_limited": 0, "cache_hits": 1}
    assert list(rec["counts"]) == [k for k in COUNT_KEYS if k != "pruned"]  # (pruned: only a search with a pruner)
    assert [c["candidate_id"] for c in rec["candidates"]] == [
        "candidate-000002", "candidate-000003", "candidate-000000", "candidate-000001"]
    assert rec["views"] == {"top_n": ["candidate-000002", "candidate-000003"], "pareto_front": []}
    assert rec["provenance"] == {
        "search_strategy": "optimizer_guided", "implementation": "aisim", "implementation_version": __version__,
        "run_id": "run-1", "created_at": "2025-01-02T03:04:05Z", "input_fingerprint": "sha256:abc",
        "config": {"optimization": {"target": "throughput"}}}


def test_retention_modes():
    ids = lambda rec: [c["candidate_id"][-1] for c in rec["candidates"]]  # noqa: E731
    assert ids(_recommendation(retention="feasible")) == ["2", "3", "0"]
    assert ids(_recommendation(retention="views", top_n=1)) == ["2"]
    assert ids(_recommendation(top_n=0)) == ["2", "3", "0", "1"]


def test_pareto_views():
    def c(i, v, gpus=1):
        return candidate_record(i, "feasible", {"i": i}, {"i": i}, gpus, Score(tuple(v), {}), None, None, None, {})
    ledger = [c(0, (10.0, 1.0)), c(1, (5.0, 5.0)), c(2, (4.0, 4.0)), c(3, (8.0, 4.0))]
    rec = _recommendation(ledger, target="pareto", top_n=10)
    assert rec["views"] == {"top_n": ["candidate-000000", "candidate-000003", "candidate-000001", "candidate-000002"],
                            "pareto_front": ["candidate-000000", "candidate-000003", "candidate-000001"]}
    assert [x["candidate_id"][-1] for x in _recommendation(ledger, target="pareto", top_n=1,
                                                            retention="views")["candidates"]] == ["0", "3", "1"]


@pytest.mark.parametrize("kw, match", [
    ({"counts": {"evaluated": 1, "hits": 2}}, "unknown counts keys: hits"),
    ({"retention": "some"}, "candidate_retention"),
    ({"search_strategy": "grid"}, "search_strategy"),
    ({"target": "latency"}, "unknown target"),
    ({"top_n": -1}, "top_n"),
])
def test_build_recommendation_rejections(kw, match):
    with pytest.raises(ValueError, match=match):
        _recommendation(**kw)
    with pytest.raises(ValueError, match="duplicate candidate_id"):
        _recommendation(_ledger() + _ledger()[:1])


def test_created_at_defaults_to_now_in_utc():
    assert _recommendation(created_at=None)["provenance"]["created_at"].endswith("Z")


# -- files ---------------------------------------------------------------------------------------
CSV = """\
rank,candidate_id,status,used_gpus,score,reason_category,reason,objectives.throughput,metrics.mean_ttft_ms,\
metrics.output_throughput_tok_s,config.backend,config.tp,config.used_gpus,config.x,provenance.hardware,provenance.model
1,candidate-000002,feasible,4,200.0,,,200.0,40.0,200.0,sglang,4,4,,h200_sxm,m
2,candidate-000003,feasible,2,100.0,,,100.0,60.0,100.0,vllm,2,2,true,h200_sxm,m
3,candidate-000000,feasible,2,100.0,,,100.0,50.5,100.0,vllm,2,2,,h200_sxm,m
,candidate-000001,infeasible,8,,sla_constraint,mean_ttft_ms 900 > SLA ttft_ms 500,300.0,900.0,300.0,vllm,8,8,,h200_sxm,m
"""
YAML_0000 = """\
model:
  name: m
engine:
  tp: 4
  backend: sglang
"""
YAML_0001 = """\
model:
  name: m
engine:
  tp: 2
  backend: vllm
"""


def test_write_outputs_exact_files(tmp_path):
    rec = _recommendation()
    write_outputs(tmp_path / "out", rec)
    out = tmp_path / "out"
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        "recommendation.csv", "recommendation.json", "recommendations", "recommendations/0000.yaml",
        "recommendations/0001.yaml"]  # no temporary files left; candidate 0's config repeats 3's
    text = (out / "recommendation.json").read_text()
    assert text == json.dumps(rec, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    assert list(json.loads(text)) == ["candidate_retention", "candidates", "counts", "provenance", "schema_version",
                                      "views"]
    assert list(json.loads(text)["candidates"][0]) == sorted(
        ["candidate_id", "status", "config", "prediction_config", "used_gpus", "score", "metrics", "objectives",
         "reason_category", "reason", "provenance"])
    assert (out / "recommendation.csv").read_text() == CSV
    assert (out / "recommendations" / "0000.yaml").read_text() == YAML_0000
    assert (out / "recommendations" / "0001.yaml").read_text() == YAML_0001
    assert yaml.safe_load(YAML_0000) == PB and yaml.safe_load(YAML_0001) == PA


def test_rewrite_removes_stale_recommendations_and_keeps_other_files(tmp_path):
    (tmp_path / "recommendations").mkdir()
    for name in ("0000.yaml", "0001.yaml", "0002.yaml", "notes.yaml"):
        (tmp_path / "recommendations" / name).write_text("old\n")
    rec = _recommendation(retention="feasible", top_n=1)
    rec["candidates"] = rec["candidates"][:1]
    write_outputs(tmp_path, rec)
    assert sorted(p.name for p in (tmp_path / "recommendations").iterdir()) == ["0000.yaml", "notes.yaml"]
    assert (tmp_path / "recommendations" / "0000.yaml").read_text() == YAML_0000


def test_json_is_standard_and_csv_cells(tmp_path):
    rec = candidate_record(0, "feasible", {"list": [1, 2], "nested": {"a": None}}, None, 1,
                           Score((1.0,), {"throughput": 1.0}), {"output_throughput_tok_s": 1.0, "x": math.nan,
                                                               "flag": False}, None, None, {})
    write_outputs(tmp_path, _recommendation([rec]))
    doc = json.loads((tmp_path / "recommendation.json").read_text())
    assert doc["candidates"][0]["metrics"]["x"] is None  # NaN -> null
    header, row = (tmp_path / "recommendation.csv").read_text().splitlines()
    cells = dict(zip(header.split(","), next(csv.reader([row]))))
    assert (cells["config.list"], cells["config.nested.a"], cells["metrics.x"], cells["metrics.flag"]) == (
        "[1, 2]", "", "", "false")
    assert not (tmp_path / "recommendations" / "0000.yaml").exists()  # no prediction config: no file
