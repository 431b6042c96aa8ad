"""A search that decides nothing says so (exit 1, the reason on stderr), the reasons of the
candidates that did not make it are counted on the terminal, a goodput of 0 is not feasible, the
winner reads as a deployment, and percentile SLAs (``evaluation.sla.percentile``) bound the named
statistic in the summary's goodput, Spica's feasibility and retune's scoring."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from aisim import run_config
from aisim.search.spica.loop import run_search
from aisim.search.spica.objectives import score
from aisim.search.spica.summary import describe_shape, front_table, sla_margins
from aisim.simulator.config.loading import load_config
from aisim.simulator.errors import InputError
from tests.conftest import ROOT
from tests.search.spica.test_loop import SEARCH, config

ENV = dict(os.environ, PYTHONPATH=str(ROOT))
QUICKSTART = ROOT / "configs" / "quickstart.yaml"


def recommend(tmp_path, *sets, fmt="table"):
    cfg = tmp_path / "s.yaml"
    cfg.write_text(yaml.safe_dump(SEARCH))
    cmd = [sys.executable, "-m", "aisim", "recommend", "-c", str(cfg), "--output-dir", str(tmp_path / "out"),
           "--parallelism", "1", "--format", fmt, *(x for s in sets for x in ("--set", s))]
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)


def test_no_shape_in_the_budget_exits_1_naming_why(tmp_path):
    p = recommend(tmp_path, "search_space.gpu_budget=1", "search_space.deployment_mode=[disagg]")
    assert p.returncode == 1, p.stderr
    assert p.stderr == ("aisim recommend: no candidate to evaluate: disagg: no disagg worker shape fits the GPU "
                        "budget of 1 (the smallest disagg deployment needs 2 GPUs)\n")
    assert "evaluated 0 candidates" in p.stdout


def test_no_feasible_candidate_exits_1_with_the_reasons_counted(tmp_path):
    p = recommend(tmp_path, "optimizer.max_trials=3", "evaluation.sla.ttft_ms=0.001", "optimization.strict_sla=true")
    assert p.returncode == 1
    assert p.stderr == "aisim recommend: no feasible candidate among 3: infeasible 3 (sla_constraint 3)\n"
    assert "not feasible: infeasible 3 (sla_constraint 3)" in p.stdout.splitlines()
    (tmp_path / "ok").mkdir()
    p = recommend(tmp_path / "ok", "optimizer.max_trials=2", fmt="json")
    line = json.loads(p.stdout)
    assert p.returncode == 0 and line["decided"] and line["not_feasible"] == {}


def test_the_winner_reads_as_a_deployment(tmp_path):
    p = recommend(tmp_path, "optimizer.max_trials=4")
    assert p.returncode == 0, p.stderr
    rec = json.loads((tmp_path / "out" / "recommendation.json").read_text())
    best = next(c for c in rec["candidates"] if c["candidate_id"] == rec["views"]["top_n"][0])
    lines = p.stdout.splitlines()
    i = next(n for n, x in enumerate(lines) if x.startswith("best: "))
    value = best["objectives"]["goodput_per_gpu"]
    assert lines[i] == (f"best: {best['candidate_id']}: goodput_per_gpu {value:.4g} goodput output tok/s per GPU "
                        f"on {best['used_gpus']} GPUs")
    assert lines[i + 1] == f"  {describe_shape(best['config'])}, vllm, router {best['config']['router_mode']}"
    assert lines[i + 2].startswith("  SLA: mean TTFT ") and "ms vs 500 (" in lines[i + 2]
    assert lines[i + 3] == f"  replay it: aisim predict -c {tmp_path / 'out' / 'recommendations' / '0000.yaml'}"


def test_shapes_margins_and_the_front_table():
    assert describe_shape({"deployment_mode": "agg", "replicas": 2, "tp": 1, "attention_dp": 2}) == "agg 2 x (tp1 dp2)"
    assert describe_shape({"deployment_mode": "disagg", "prefill_replicas": 1, "prefill_tp": 2, "decode_replicas": 3,
                           "decode_tp": 1, "decode_moe_ep": 4}) == "disagg prefill 1 x (tp2) + decode 3 x (tp1 ep4)"
    m = {"mean_ttft_ms": 50.0, "mean_tpot_ms": 60.0, "p90_ttft_ms": 157.0}
    assert sla_margins(m, {"ttft_ms": 200, "itl_ms": 40}) == ["mean TTFT 50 ms vs 200 (75% margin)",
                                                              "mean ITL 60 ms vs 40 (50% over)"]
    assert sla_margins(m, {"ttft_ms": 100, "percentile": 90}) == ["p90 TTFT 157 ms vs 100 (57% over)"]
    front = [{"candidate_id": "candidate-000001", "objectives": {"throughput_per_gpu": 1223.4, "throughput_per_user": 9.5},
              "used_gpus": 6, "config": {"deployment_mode": "agg", "replicas": 6, "tp": 1, "router_mode": "kv_router"}},
             {"candidate_id": "candidate-000010", "objectives": {"throughput_per_gpu": 80.0, "throughput_per_user": 150.25},
              "used_gpus": 8, "config": {"deployment_mode": "agg", "replicas": 4, "tp": 2, "router_mode": "round_robin"}}]
    assert front_table(front) == [
        "pareto front (2 candidates):",
        "  candidate         throughput_per_gpu  throughput_per_user  GPUs  deployment     router",
        "  candidate-000001                1223                  9.5     6  agg 6 x (tp1)  kv_router",
        "  candidate-000010                  80                150.2     8  agg 4 x (tp2)  round_robin",
    ]


def test_a_goodput_of_zero_is_not_feasible():
    m = {"goodput_output_throughput_tok_s": 0.0, "gpu_hours": 1.0, "duration_ms": 3.6e6}
    for target in ("goodput", "goodput_per_gpu"):
        s = score(target, m, 1, sla={"ttft_ms": 100}, strict_sla=False, constraints=None)
        assert (s.status, s.reason_category, s.reason) == ("infeasible", "sla_constraint",
                                                           f"no request met the SLA ({target} 0)")
    s = score("goodput", {**m, "goodput_output_throughput_tok_s": 0.5}, 1, sla={"ttft_ms": 100}, strict_sla=False,
              constraints=None)
    assert s.status == "feasible" and s.values == (0.5,)


def test_a_percentile_sla_bounds_that_percentile_in_spica():
    m = {"goodput_output_throughput_tok_s": 10.0, "mean_ttft_ms": 50.0, "p90_ttft_ms": 157.0, "num_ttft_samples": 9,
         "mean_tpot_ms": 5.0, "p90_tpot_ms": 8.0, "num_tpot_samples": 9}
    s = score("goodput", m, 1, sla={"ttft_ms": 100, "itl_ms": 40, "percentile": 90}, strict_sla=False, constraints=None)
    assert (s.status, s.reason) == ("infeasible", "p90_ttft_ms 157 > SLA ttft_ms 100")
    s = score("goodput", m, 1, sla={"ttft_ms": 160, "itl_ms": 40, "percentile": 90}, strict_sla=False, constraints=None)
    assert s.status == "feasible"
    # the mean (default) is checked only under strict_sla, as the reference
    assert score("goodput", m, 1, sla={"ttft_ms": 40}, strict_sla=False, constraints=None).status == "feasible"
    assert score("goodput", m, 1, sla={"ttft_ms": 40}, strict_sla=True, constraints=None).reason == \
        "mean_ttft_ms 50 > SLA ttft_ms 40"
    s = score("goodput", m, 1, sla={"ttft_ms": 160, "itl_ms": 40, "percentile": 99}, strict_sla=False,
              constraints=None)
    assert (s.status, s.reason) == ("infeasible", "p99_ttft_ms has no samples (SLA ttft_ms 160)")  # not measured


def test_a_percentile_sla_in_the_summary_counts_every_request_or_none():
    cfg, cdir = load_config(QUICKSTART)
    s = run_config(cfg, cdir).summary
    p90_ttft, p90_tpot = s["p90_ttft_ms"], s["p90_tpot_ms"]
    for ttft, met in ((p90_ttft, True), (p90_ttft * 0.999, False)):  # inclusive, like the per-request rule
        c, d = load_config(QUICKSTART, [f"evaluation.sla={{ttft_ms: {ttft!r}, itl_ms: {p90_tpot!r}, percentile: 90}}"])
        got = run_config(c, d).summary
        assert got["sla_met"] is met and got["sla_percentile"] == 90
        assert got["goodput_completed_requests"] == (s["completed_requests"] if met else 0)
        assert got["goodput_output_tokens"] == (s["total_output_tokens"] if met else 0)
    c, d = load_config(QUICKSTART, [f"evaluation.sla={{ttft_ms: {p90_ttft!r}}}"])  # the mean rule: per request
    assert "sla_met" not in run_config(c, d).summary
    with pytest.raises(InputError, match="percentile: must be mean or one of 50, 75, 90, 95, 99"):
        load_config(QUICKSTART, ["evaluation.sla.percentile=93"])


def test_a_spica_search_under_a_percentile_sla(tmp_path):
    r = run_search(config(optimizer__max_trials=2, evaluation={"sla": {"ttft_ms": 500, "itl_ms": 50,
                                                                       "percentile": 90}}), tmp_path, parallelism=1)
    for c in r.recommendation["candidates"]:
        m = c["metrics"]
        assert {"p90_ttft_ms", "p90_tpot_ms", "sla_met", "sla_percentile"} <= set(m)
        ok = m["p90_ttft_ms"] <= 500 and m["p90_tpot_ms"] <= 50
        assert c["status"] == ("feasible" if ok else "infeasible") and m["sla_met"] is ok
        assert c["prediction_config"]["evaluation"]["sla"]["percentile"] == 90
    plain = run_search(config(optimizer__max_trials=1), tmp_path / "plain", parallelism=1)
    assert "percentile" not in plain.best["prediction_config"]["evaluation"]["sla"]  # the default stays unwritten


def test_retune_scores_under_the_evaluation_percentile():
    from aisim import plan_from_config
    from aisim.search.retune.sweep import RetuneSweeper

    for sets, want in (([], "mean"), (["evaluation.sla.percentile=95"], 95)):
        cfg, cdir = load_config(ROOT / "configs" / "retune-router.yaml", sets)
        sweeper = RetuneSweeper(plan_from_config(cfg, cdir))
        assert sweeper.sla.percentile == want and sweeper.sla.ttft_ms == 2000 and sweeper.sla.itl_ms == 50
