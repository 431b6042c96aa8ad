"""The Spica search end to end on a 16-point space (agg, 2 GPUs: 4 shapes x 2 routers x 2
max_num_seqs) over a small synthetic workload: stops at max_trials, exhausts the space with the
random sampler, the same ledger for any parallelism and on Ray, duplicates re-asked, resume after a
SIGKILL, and a winner's YAML replaying to its recorded metrics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from aisim.search.spica.config import SearchConfig
from aisim.search.spica.loop import STUDY_FILE, run_search
from tests.conftest import ROOT

SEARCH = {
    "engine": {"model": "meta-llama/Llama-3.1-8B-Instruct", "hardware": "h200_sxm", "timing": {"type": "polynomial"}},
    "workload": {"isl": 512, "osl": 32, "request_rate": 20, "request_count": 120, "arrival_seed": 7},
    "evaluation": {"sla": {"ttft_ms": 500, "itl_ms": 50}},
    "search_space": {"deployment_mode": ["agg"], "backend": ["vllm"], "gpu_budget": 2,
                     "agg_max_num_batched_tokens": [8192], "agg_max_num_seqs": [64, 256],
                     "router_mode": ["round_robin", "kv_router"], "overlap_score_credit": [1.0],
                     "prefill_load_scale": [1.0], "router_temperature": [0.0], "planner_scaling_policy": ["disabled"]},
    "optimization": {"target": "goodput_per_gpu"},
    "optimizer": {"algorithm": "random", "max_trials": 16, "seed": 3},
    "study": {"name": "t"},
}


def config(**changes) -> SearchConfig:
    data = json.loads(json.dumps(SEARCH))
    for path, value in changes.items():
        node = data
        *head, last = path.split("__")
        for k in head:
            node = node.setdefault(k, {})
        node[last] = value
    return SearchConfig.from_dict(data)


def ledger(result) -> list:
    """The candidates as the search found them (ids, configs, scores, metrics), provenance aside."""
    return [(c["candidate_id"], c["status"], json.dumps(c["config"], sort_keys=True), c["score"],
             json.dumps(c["metrics"], sort_keys=True)) for c in result.recommendation["candidates"]]


@pytest.fixture(scope="module")
def exhaustive(tmp_path_factory):
    return run_search(config(), tmp_path_factory.mktemp("s16"), parallelism=2)


def test_random_evaluates_every_point_of_a_16_point_space_once(exhaustive):
    r = exhaustive
    assert r.counts["evaluated"] == 16 and r.counts["feasible"] == 16 and r.counts["cache_hits"] == 0
    configs = {json.dumps(c["config"], sort_keys=True) for c in r.recommendation["candidates"]}
    assert len(configs) == 16
    assert r.recommendation["provenance"]["search_strategy"] == "exhaustive"
    ranked = [c for c in r.recommendation["candidates"] if c["status"] == "feasible"]
    assert [c["score"] for c in ranked] == sorted((c["score"] for c in ranked), reverse=True)
    assert (r.output_dir / STUDY_FILE).exists() and (r.output_dir / "recommendation.csv").exists()


def test_the_search_stops_at_max_trials_and_at_exhaustion(tmp_path):
    assert run_search(config(optimizer__max_trials=5), tmp_path / "a", parallelism=2).counts["evaluated"] == 5
    r = run_search(config(optimizer__max_trials=40), tmp_path / "b", parallelism=2)
    assert r.counts["evaluated"] == 16  # the space holds 16 points


def test_the_ledger_is_the_same_for_any_parallelism_and_on_ray(exhaustive, tmp_path, ray_session):
    one = run_search(config(), tmp_path / "one", parallelism=1)
    assert ledger(one) == ledger(exhaustive)
    ray = run_search(config(), tmp_path / "ray", backend="ray", parallelism=2)
    assert ledger(ray) == ledger(exhaustive)


def test_tpe_re_asks_duplicates_and_counts_them(tmp_path):
    r = run_search(config(optimizer__algorithm="tpe", optimizer__max_trials=16,
                          search_space__agg_max_num_seqs=[256]), tmp_path, parallelism=2)
    assert r.counts["evaluated"] == 8  # the space holds 8 points
    assert len({json.dumps(c["config"], sort_keys=True) for c in r.recommendation["candidates"]}) == 8


def test_a_winner_replays_to_its_recorded_metrics(exhaustive, tmp_path):
    best = exhaustive.best
    path = exhaustive.output_dir / "recommendations" / "0000.yaml"
    assert yaml.safe_load(path.read_text()) == best["prediction_config"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "aisim", "predict", "-c", str(path), "--format", "json"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert {k: summary[k] for k in best["metrics"]} == best["metrics"]


def _search_yaml(tmp_path, **changes) -> str:
    data = json.loads(json.dumps(SEARCH))
    data["optimizer"].update(changes)
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _finished(journal) -> int:
    if not journal.exists():
        return 0
    return journal.read_text().count('"candidate_id"')  # user_attrs written once per finished candidate


def test_resume_after_a_sigkill_runs_every_candidate_once(tmp_path):
    cfg = _search_yaml(tmp_path, max_trials=16)
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "aisim", "recommend", "-c", cfg, "--output-dir", str(out), "--parallelism", "1",
           "--format", "json"]
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while _finished(out / STUDY_FILE) < 4 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "recommendation.json").exists()  # killed mid-search
    p = subprocess.run(cmd + ["--resume"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    rec = json.loads((out / "recommendation.json").read_text())
    assert rec["counts"]["evaluated"] == 16
    configs = [json.dumps(c["config"], sort_keys=True) for c in rec["candidates"]]
    assert len(set(configs)) == 16  # none lost, none run twice
    again = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "--resume" in again.stderr  # an existing study is never overwritten silently


def test_a_pareto_search_reports_its_front(tmp_path):
    r = run_search(config(optimization__target="pareto", optimizer__algorithm="nsga2", optimizer__max_trials=6),
                   tmp_path, parallelism=2)
    rec = r.recommendation
    assert r.counts["evaluated"] == 6
    feasible = {c["candidate_id"]: c["score"] for c in rec["candidates"] if c["status"] == "feasible"}
    front = rec["views"]["pareto_front"]
    assert front and set(front) <= set(feasible) and all(len(feasible[f]) == 2 for f in front)
    for f in front:  # nobody dominates a front member
        assert not any(o[0] >= feasible[f][0] and o[1] >= feasible[f][1] and o != feasible[f] for o in feasible.values())


def test_ctrl_c_stops_cleanly_and_the_search_resumes(tmp_path):
    cfg = _search_yaml(tmp_path, max_trials=16)
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "aisim", "recommend", "-c", cfg, "--output-dir", str(out), "--parallelism", "1",
           "--format", "json"]
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while _finished(out / STUDY_FILE) < 4 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    p = subprocess.run(cmd + ["--resume"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    rec = json.loads((out / "recommendation.json").read_text())
    assert rec["counts"]["evaluated"] == 16
    assert len({json.dumps(c["config"], sort_keys=True) for c in rec["candidates"]}) == 16


def test_infeasible_candidates_carry_their_reason_and_never_win(tmp_path):
    shapes = [{"tp": 1, "replicas": 1}, {"tp": 1, "replicas": 2}]
    r = run_search(config(search_space__parallel_configs=shapes, optimization__constraints={"min_candidate_gpus": 2}),
                   tmp_path / "band", parallelism=2)
    by_gpus = {}
    for c in r.recommendation["candidates"]:
        by_gpus.setdefault(c["used_gpus"], set()).add((c["status"], c["reason_category"]))
    assert by_gpus == {1: {("infeasible", "gpu_budget")}, 2: {("feasible", None)}}
    assert r.best["used_gpus"] == 2 and r.counts["infeasible"] == 4 and r.counts["feasible"] == 4
    r = run_search(config(search_space__parallel_configs=shapes, search_space__agg_gpu_memory_utilization=0.05),
                   tmp_path / "kv", parallelism=2)
    assert {(c["status"], c["reason_category"]) for c in r.recommendation["candidates"]} == {("infeasible", "kv_capacity")}
    assert r.best is None and r.recommendation["views"]["top_n"] == []
    assert not list((tmp_path / "kv" / "recommendations").glob("*.yaml"))


def test_a_dgd_section_writes_the_winners_deployment(tmp_path):
    r = run_search(config(optimizer__max_trials=3, dgd={"name": "spica-test", "namespace": "ns"}), tmp_path,
                   parallelism=2)
    assert r.dgd_paths == [tmp_path / "dgd.yaml"]
    manifest = yaml.safe_load((tmp_path / "dgd.yaml").read_text())
    assert manifest["kind"] == "DynamoGraphDeployment" and manifest["metadata"] == {"name": "spica-test", "namespace": "ns"}
    worker = manifest["spec"]["services"]["VllmDecodeWorker"]
    assert worker["replicas"] == r.best["config"]["replicas"]


def test_a_signal_whose_handler_runs_during_storage_writes_waits_for_them():
    # a SIGINT that arrived just before the writes: Python runs its handler at a later bytecode
    from aisim.search.spica.loop import _storage_writes

    done = []
    with pytest.raises(KeyboardInterrupt):
        with _storage_writes():
            signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
            done.append("written")
    assert done == ["written"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_search_over_three_backends_replays_each_candidate_on_its_own_and_on_ray(tmp_path, ray_session):
    cfg = config(search_space__backend=["vllm", "sglang", "trtllm"], search_space__router_mode=["round_robin"],
                 search_space__agg_max_num_seqs=[256], optimizer__max_trials=12)
    local = run_search(cfg, tmp_path / "local", parallelism=2)
    cands = local.recommendation["candidates"]
    assert local.counts["evaluated"] == 12 and {c["config"]["backend"] for c in cands} == {"vllm", "sglang", "trtllm"}
    for c in cands:  # each candidate's predict config replays its own backend
        assert c["prediction_config"]["engine"]["backend"] == c["config"]["backend"]
    by_backend = {}
    for c in cands:
        by_backend.setdefault(c["config"]["backend"], []).append(c["metrics"]["mean_ttft_ms"])
    assert by_backend["vllm"] != by_backend["trtllm"]  # the schedulers differ on this load
    assert by_backend["sglang"] != by_backend["vllm"]
    ray = run_search(cfg, tmp_path / "ray", backend="ray", parallelism=2)
    assert ledger(ray) == ledger(local)
    best = local.best
    path = local.output_dir / "recommendations" / "0000.yaml"
    p = subprocess.run([sys.executable, "-m", "aisim", "predict", "-c", str(path), "--format", "json"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert {k: summary[k] for k in best["metrics"]} == best["metrics"]


def test_a_search_with_a_host_tier_searches_the_cache_hit_weights_and_renders_kvbm(tmp_path):
    from aisim.search.spica.materialize import prediction_config

    cfg = config(search_space__router_mode=["kv_router"], search_space__agg_max_num_seqs=[64],
                 search_space__num_g2_blocks=4096, search_space__bandwidth_g1_to_g2_gbps=16.0,
                 search_space__host_cache_hit_weight=[0.5, 1.0], search_space__disk_cache_hit_weight=[0.0, 0.25],
                 optimizer__max_trials=6, dgd={"name": "spica-g2"})
    r = run_search(cfg, tmp_path, parallelism=2)
    configs = [c["config"] for c in r.recommendation["candidates"]]
    assert r.counts["feasible"] == len(configs) > 1
    assert {(c["host_cache_hit_weight"], c["disk_cache_hit_weight"]) for c in configs} <= {
        (h, d) for h in (0.5, 1.0) for d in (0.0, 0.25)}
    assert len({c["host_cache_hit_weight"] for c in configs}) == 2  # (searched, not pinned)
    predict = prediction_config(cfg, r.best["config"])
    assert predict["engine"]["workers"]["aggregated"]["kv_cache"]["host_offload"] == {
        "num_host_blocks": 4096, "d2h_bandwidth_gbps": 16.0}
    assert predict["router"]["host_cache_hit_weight"] == r.best["config"]["host_cache_hit_weight"]
    worker = yaml.safe_load((tmp_path / "dgd.yaml").read_text())["spec"]["services"]["VllmDecodeWorker"]
    assert worker["envs"] == [{"name": "DYN_KVBM_CPU_CACHE_OVERRIDE_NUM_BLOCKS", "value": "4096"}]
