"""The Planner in the replay: lifecycle, draining, GPU time, advisory, determinism, config
rules and the Python API."""

from __future__ import annotations

import json
import os

import pytest

from aisim import plan_from_config, run_config, run_trace_replay
from aisim.simulator.config.loading import load_config, validate_config
from aisim.simulator.errors import InputError
from aisim.simulator.metrics.output import canonical_json
from tests.conftest import ROOT, SLICE
from tests.helpers import WALL, without_wall

FIXED = {"type": "fixed", "prefill_ms": 100, "decode_ms": 10}


def cfg(planner: dict | None, *, replicas=1, blocks=200, startup=0.0, requests=400, concurrency=64, out=50, extra=None):
    d = {
        "traffic": {"source": {"type": "synthetic", "input_tokens": 2000, "output_tokens": out},
                    "load": {"type": "concurrency", "concurrency": concurrency}, "stop": {"requests": requests}},
        "engine": {"model": "meta-llama/Llama-3.1-8B-Instruct", "hardware": "h200_sxm",
                   "workers": {"aggregated": {"startup_seconds": startup, "parallelism": {"replicas": replicas},
                                              "kv_cache": {"block_size": 16, "capacity": {"type": "fixed", "blocks": blocks}},
                                              "timing": FIXED}}},
        "evaluation": {"sla": {"ttft_ms": 1000, "itl_ms": 50}},
    }
    if planner is not None:
        d["planner"] = planner
    d.update(extra or {})
    return validate_config(d)


OVERLOAD = {"policy": "enabled", "target": "load", "max_num_gpus": 16}


def test_added_workers_start_then_become_ready_and_scale_ups_wait_for_them():
    rep = run_config(cfg(OVERLOAD, startup=20.0))
    ups = [e["at_s"] for e in rep.planner["scaling_events"] if e["reason"] == "scale_up"]
    assert ups[:3] == [5.0, 30.0, 55.0]  # startup 20 s, 5 s ticks (the reference's example)
    ops = rep.planner["lifecycle_operations"]
    first = [o for o in ops if o["planner_tick_ordinal"] == 0][0]
    assert first["cause"] == "planner_scale" and first["at_ms"] == 5000.0
    assert first["transitions"] == [{"worker_id": 1, "transition": "worker_starting", "prior_state": None, "state": "starting"}]
    ready = [o for o in ops if o["cause"] == "worker_ready_event"][0]
    assert ready["at_ms"] == 25_000.0 and ready["transitions"][0]["worker_id"] == 1
    assert ready["state_after_batch"] == {"active": 2, "starting": 0, "draining": 0}


def test_zero_startup_adds_ready_workers_directly():
    rep = run_config(cfg(OVERLOAD, startup=0.0))
    first = rep.planner["lifecycle_operations"][0]
    assert first["transitions"][0]["transition"] == "worker_ready"
    assert not any(o["cause"] == "worker_ready_event" for o in rep.planner["lifecycle_operations"])


def test_removed_workers_drain_their_work_and_take_no_new_requests():
    planner = {"policy": "enabled", "target": "throughput", "max_num_gpus": 16}
    rep = run_config(cfg(planner, replicas=3, blocks=5000, concurrency=6, requests=300, out=100), capture_per_request=True)
    ops = rep.planner["lifecycle_operations"]
    drain = next(o for o in ops if any(t["transition"] == "worker_draining" for t in o["transitions"]))
    wid = drain["transitions"][0]["worker_id"]
    assert wid == 2  # the highest id drains first
    settled = next(o for o in ops if o["cause"] == "drain_settlement" and o["transitions"][0]["worker_id"] == wid)
    assert settled["at_ms"] >= drain["at_ms"]
    for r in rep.per_request:
        if r["decode_worker_idx"] == wid:
            assert r["arrival_time_ms"] <= drain["at_ms"] and r["terminal_time_ms"] <= settled["at_ms"]
    assert rep.summary["completed_requests"] == 300


def test_gpu_hours_integrate_provisioned_workers():
    rep = run_config(cfg(OVERLOAD, startup=20.0))
    s = rep.summary
    end = s["duration_ms"]
    spans = {0: [0.0, None]}
    for op in rep.planner["lifecycle_operations"]:
        for t in op["transitions"]:
            if t["transition"] in ("worker_starting", "worker_ready") and t["prior_state"] is None:
                spans[t["worker_id"]] = [op["at_ms"], None]
            if t["state"] == "removed":
                spans[t["worker_id"]][1] = op["at_ms"]
    expected = sum(min(u if u is not None else end, end) - a for a, u in spans.values()) / 1000.0
    assert s["decode_worker_seconds"] == pytest.approx(expected)
    assert s["gpu_hours"] == pytest.approx(expected / 3600.0)
    assert s["gpu_hours"] > 1 * end / 3.6e6  # more than the single starting worker


def test_advisory_decides_everything_and_changes_nothing(caplog):
    plain = run_config(cfg(None))
    adv = run_config(cfg({**OVERLOAD, "advisory": True}))
    assert adv.planner["metadata"]["advisory"] is True
    assert adv.planner["scaling_events"] == [] and adv.planner["lifecycle_operations"] == []
    assert adv.planner["recommended_scaling_events"]
    assert all(t["runtime_decision"]["target_decode"] is None for t in adv.planner["ticks"])
    a = {k: v for k, v in adv.summary.items() if k not in WALL and k != "planner_total_ticks"}
    b = {k: v for k, v in plain.summary.items() if k not in WALL}
    assert a == b  # the starting deployment serves the whole trace
    assert any("[ADVISORY]" in r.message for r in caplog.records)


def test_planner_runs_are_deterministic():
    c = cfg({"policy": "enabled", "target": "sla", "enable_load_scaling": True, "load_predictor": "kalman",
             "throughput_adjustment_interval_seconds": 20, "max_num_gpus": 8}, requests=600)
    a, b = run_config(c, capture_per_request=True), run_config(c, capture_per_request=True)
    assert a.planner["metadata"]["bootstrap"]["status"] == "installed"
    assert canonical_json(without_wall(a.to_dict())) == canonical_json(without_wall(b.to_dict()))


def test_disabled_planner_reports_null():
    assert run_config(cfg({"policy": "disabled"})).to_dict()["planner"] is None


@pytest.mark.parametrize(
    "planner,extra,where,needle",
    [
        ({"policy": "enabled", "target": "sla"}, {"evaluation": {"sla": {"e2e_ms": 5000}}}, "evaluation.sla", "ttft_ms and itl_ms"),
        ({"policy": "disabled", "advisory": True}, None, "planner", "advisory"),
        ({"policy": "enabled", "prefill_min_workers": 1}, None, "planner.prefill_min_workers", "disaggregated"),
        ({"policy": "enabled", "target": "sla", "enable_load_scaling": True, "load_adjustment_interval_seconds": 200},
         None, "planner.load_adjustment_interval_seconds", "shorter"),
        ({"policy": "enabled", "retune": {"interval_seconds": 600}}, None,
         "traffic.source.type", "retune replays windows of a recorded Dynamo request trace"),
        ({"policy": "enabled", "min_num_gpus": 9}, None, "planner.min_num_gpus", "is over max_num_gpus 8"),
        ({"policy": "enabled", "min_num_gpu": 2}, None, "planner.min_num_gpu", "Extra inputs are not permitted"),
        ({"policy": "enabled", "fpm_sample_bucket_size": 10}, None, "planner.fpm_sample_bucket_size", "perfect square"),
    ],
)
def test_planner_section_rules(planner, extra, where, needle):
    with pytest.raises(InputError) as info:
        plan_from_config(_raw(planner, extra))
    assert info.value.where == where and needle in str(info.value)


def _raw(planner, extra):
    d = {"engine": {"model": "meta-llama/Llama-3.1-8B-Instruct", "hardware": "h200_sxm",
                    "workers": {"aggregated": {"timing": FIXED, "kv_cache": {"capacity": {"type": "fixed", "blocks": 99}}}}},
         "planner": planner, "evaluation": {"sla": {"ttft_ms": 1000, "itl_ms": 50}}, **(extra or {})}
    return validate_config(d)


def test_target_rules_set_the_loops_and_thresholds():
    def loops(pp):
        return pp.settings.enable_throughput_scaling, pp.settings.enable_load_scaling

    thr = plan_from_config(cfg({"policy": "enabled", "target": "throughput", "enable_throughput_scaling": True,
                                "enable_load_scaling": False})).planner
    assert loops(thr) == (False, True)  # non-sla targets ignore the two flags
    load = plan_from_config(cfg({"policy": "enabled", "target": "load"})).planner.settings
    assert (load.decode_scale_up_kv_rate, load.decode_scale_down_kv_rate) == (90, 70)
    mine = plan_from_config(cfg({"policy": "enabled", "target": "load", "decode_scale_up_kv_rate": 80,
                                 "decode_scale_down_kv_rate": 40})).planner.settings  # (an aisim extension)
    assert (mine.decode_scale_up_kv_rate, mine.decode_scale_down_kv_rate) == (80, 40)
    sla = plan_from_config(cfg({"policy": "enabled", "target": "sla"})).planner
    assert loops(sla) == (True, False) and (sla.settings.ttft_ms, sla.settings.itl_ms) == (1000, 50)
    assert sla.settings.tick_interval_s == 180.0
    own = plan_from_config(cfg({"policy": "enabled", "target": "sla", "ttft_ms": 700})).planner.settings
    assert (own.ttft_ms, own.itl_ms) == (700, 50)  # the Planner's own target over evaluation.sla's
    both = plan_from_config(cfg({"policy": "enabled", "target": "sla", "enable_load_scaling": True})).planner
    assert both.settings.tick_interval_s == 5.0
    tick = plan_from_config(cfg({"policy": "enabled", "target": "sla", "enable_load_scaling": True,
                                 "scale_interval_seconds": 2.5})).planner
    assert tick.settings.tick_interval_s == 2.5


def test_python_api_planner_config_forms_and_html_report(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pc = {"mode": "agg", "optimization_target": "load", "decode_scale_up_kv_rate": 90, "decode_scale_down_kv_rate": 70,
          "max_gpu_budget": 4}
    kw = dict(extra_engine_args={"num_gpu_blocks": 3000}, num_workers=1, max_sim_time_ms=120_000)
    quiet = run_trace_replay(str(SLICE), planner_config=pc, **kw)  # nothing written unless asked
    assert quiet.planner["html_report_path"] is None and list(tmp_path.iterdir()) == []
    a = run_trace_replay(str(SLICE), planner_config=pc, planner_report_dir=tmp_path / "pages", **kw)
    assert a.planner["html_report_path"] and os.path.isfile(a.planner["html_report_path"])
    assert a.planner["html_report_path"].startswith(str(tmp_path / "pages"))
    assert quiet.planner["scaling_events"] == a.planner["scaling_events"]
    html = open(a.planner["html_report_path"]).read()
    assert "Replicas over time" in html and "Scaling events" in html
    (tmp_path / "pc.yaml").write_text(json.dumps({**pc, "report_interval_hours": None, "live_dashboard_port": 0}))
    b = run_trace_replay(str(SLICE), planner_config=str(tmp_path / "pc.yaml"), planner_report_dir=tmp_path / "b", **kw)
    assert b.planner["html_report_path"] is None
    c = run_trace_replay(str(SLICE), planner_config=json.dumps(pc), capture_planner_details=False, **kw)
    assert "ticks" not in c.planner and "lifecycle_operations" not in c.planner
    assert c.planner["scaling_events"] == a.planner["scaling_events"] and c.planner["html_report_path"] is None
    assert c.to_dict()["coverage"]["capture_planner_details"] is False
    with pytest.raises(InputError, match="planner_config.mode: mode disagg does not match"):
        run_trace_replay(str(SLICE), planner_config={**pc, "mode": "disagg"}, **kw)
    with pytest.raises(InputError, match="needs its thresholds"):
        run_trace_replay(str(SLICE), planner_config={"mode": "agg", "optimization_target": "load"}, **kw)


def test_predict_never_writes_an_html_report(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rep = run_config(cfg(OVERLOAD))
    assert rep.planner["html_report_path"] is None and not (tmp_path / "planner_reports").exists()


def test_disaggregated_planner_scales_each_role():
    d = {
        "traffic": {"source": {"type": "synthetic", "input_tokens": 3000, "output_tokens": 40},
                    "load": {"type": "concurrency", "concurrency": 48}, "stop": {"requests": 400}},
        "engine": {"mode": "disaggregated", "model": "meta-llama/Llama-3.1-8B-Instruct", "hardware": "h200_sxm",
                   "workers": {r: {"kv_cache": {"block_size": 16, "capacity": {"type": "fixed", "blocks": 600}},
                                   "timing": FIXED} for r in ("prefill", "decode")}},
        "planner": {"policy": "enabled", "target": "load", "max_num_gpus": 8, "prefill_min_workers": 1,
                    "decode_min_workers": 1},
    }
    rep = run_config(validate_config(d))
    comps = {e["component"] for e in rep.planner["scaling_events"]}
    assert "prefill" in comps
    assert rep.planner["metadata"]["mode"] == "disagg"
    assert rep.summary["prefill_worker_seconds"] > rep.summary["duration_ms"] / 1000  # more than one prefill worker


def test_warmup_trace_windows_feed_the_predictor(tmp_path, monkeypatch):
    from aisim.simulator.planning import warmup_windows

    wins = warmup_windows(str(SLICE), 60, "planner.load_predictor_warmup_trace")
    assert sum(n for n, _, _ in wins) == 1000 and len(wins) == 6
    assert all(isl > 0 and osl > 0 for n, isl, osl in wins if n)
    monkeypatch.chdir(SLICE.parent)  # a relative warm-up path resolves against the working directory
    c = cfg({"policy": "enabled", "target": "sla", "load_predictor": "constant",
             "load_predictor_warmup_trace": SLICE.name, "throughput_adjustment_interval_seconds": 60})
    rep = run_config(c)
    first = next(t for t in rep.planner["ticks"] if t["scheduled_tick"]["run_throughput_scaling"])
    assert first["effects"]["diagnostics"]["throughput"]["predicted_num_req"] > 0


def test_prophet_without_its_extra_fails_at_configuration():
    try:
        import prophet  # noqa: F401
        pytest.skip("prophet is installed")
    except ImportError:
        pass
    with pytest.raises(InputError, match=r"pip install 'aisim\[prophet\]'") as info:
        run_config(cfg({"policy": "enabled", "target": "sla", "load_predictor": "prophet"}))
    assert info.value.where == "planner.load_predictor"


def test_the_fp8_workflow_makes_the_reference_planners_first_decisions_on_the_trace_slice():
    """The bundled slice is the conversation trace's first 1,000 requests: the reference Planner
    scales 2 -> 3 at 50 s (every engine's ITL estimate ~105 ms > 50 ms once the mixed store holds 5
    passes) and 3 -> 4 at 90 s (after the 30 s start-up), then holds at the 4-GPU ceiling."""
    cfg, cdir = load_config(ROOT / "configs" / "planner-aggregated-fp8.yaml",
                            ["traffic.source.paths=[data/conversation_slice.jsonl]",
                             "traffic.stop={max_virtual_time_seconds: 200}"])
    p = run_config(cfg, cdir).planner
    assert [(e["at_s"], e["from_count"], e["to_count"]) for e in p["scaling_events"]] == [(50.0, 2, 3), (90.0, 3, 4)]
    by_time = {t["at_ms"]: t["effects"]["diagnostics"] for t in p["ticks"]}
    assert by_time[40_000.0]["reasons"]["decode"] == "insufficient_data"  # 3 mixed passes seen: not ready
    engines = by_time[50_000.0]["engines"]["decode"]
    assert all(e["itl_store"] == "contains_locally_mixed" and e["itl_ready"] and e["itl_ms"] > 90 for e in engines)
    assert by_time[50_000.0]["perf_models"]["agg"]["stores"]["contains_locally_mixed"] == [True, 5]
