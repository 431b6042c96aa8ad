"""report.html: every chart carries the numbers it draws, and they are the run's numbers."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib", reason="report.html needs the report extra (matplotlib)")

from aisim import plan_from_config, run_plan  # noqa: E402
from aisim.simulator.config.loading import load_config  # noqa: E402
from aisim.simulator.metrics.report_html import MAX_POINTS, render_report_html  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from tests.simulator.test_coordinator import CASES, CONFIGS  # noqa: E402

ENV = dict(os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1")


def charts(page: str) -> dict[str, dict]:
    blocks = re.findall(r'<script type="application/json" class="chart-data" data-chart="([a-z0-9]+)">(.*?)</script>',
                        page, flags=re.S)
    return {name: json.loads(text.replace("<\\/", "</")) for name, text in blocks}


def run(cfg_file: str, sets: list[str]):
    cfg, cdir = load_config(cfg_file, sets)
    rep = run_plan(plan_from_config(cfg, cdir, capture_per_request=True, capture_worker_timeline=True))
    page = render_report_html(rep.summary, rep.per_request, rep.timelines, rep.planner, cfg.model_dump(mode="json"),
                              cfg.evaluation.sla.model_dump())
    return rep, page


@pytest.fixture(scope="module")
def quickstart():
    return run(ROOT / "configs" / "quickstart.yaml", ["evaluation.sla={ttft_ms: 2000, itl_ms: 50}"])


def test_latency_charts_hold_every_completed_request_and_the_sla(quickstart):
    rep, page = quickstart
    data = charts(page)
    done = [r for r in rep.per_request if r["terminal_status"] == "completed"]
    assert len(done) == rep.summary["completed_requests"] == 1000
    for name, field in (("ttft", "ttft_ms"), ("itl", "itl_ms"), ("e2e", "e2e_latency_ms")):
        assert data[name]["values_ms"] == [r[field] for r in done if r[field] is not None]
    assert np.mean(data["ttft"]["values_ms"]) == pytest.approx(rep.summary["mean_ttft_ms"], rel=1e-12)
    assert np.mean(data["e2e"]["values_ms"]) == pytest.approx(rep.summary["mean_e2e_latency_ms"], rel=1e-12)
    assert (data["ttft"]["sla_ms"], data["itl"]["sla_ms"], data["e2e"]["sla_ms"]) == (2000.0, 50.0, None)


def test_throughput_bins_count_every_completion_and_its_tokens(quickstart):
    rep, page = quickstart
    d = charts(page)["throughput"]
    width = d["bin_s"]
    assert width == pytest.approx(rep.summary["duration_ms"] / 1000.0 / 60)
    assert round(sum(d["requests_per_s"]) * width) == 1000
    assert round(sum(d["output_tokens_per_s"]) * width) == rep.summary["total_output_tokens"]


def test_worker_charts_are_the_recorded_timelines(quickstart):
    rep, page = quickstart
    workers = charts(page)["workers"]["workers"]
    assert [w["worker_id"] for w in workers] == [tl.worker_id for tl in rep.timelines] == [0, 1]
    for w, tl in zip(workers, rep.timelines):
        assert len(tl.times_ms) <= MAX_POINTS  # small enough to be drawn sample by sample
        assert w["times_s"] == (np.asarray(tl.times_ms) / 1000.0).tolist()
        assert w["waiting"] == list(tl.waiting)
        assert w["kv_usage"] == (np.asarray(tl.kv_blocks_used) / tl.kv_blocks_total).tolist()
    assert "replicas" not in charts(page)  # no Planner, no Planner section
    assert "<svg" in page and "<h2>Resolved config</h2>" in page and "TTFT (ms)" in page


def test_a_planner_run_shows_its_replicas_events_and_diagnostics():
    cfg_file, sets = CASES["planner_aggregated"]
    rep, page = run(CONFIGS / cfg_file, sets)
    d = charts(page)["replicas"]
    events = rep.planner["scaling_events"]
    assert events and list(d["components"]) == ["agg"]
    c = d["components"]["agg"]
    assert c["times_s"] == [0.0] + [e["at_s"] for e in events] + [rep.summary["duration_ms"] / 1000.0]
    assert c["replicas"] == [events[0]["from_count"]] + [e["to_count"] for e in events] + [events[-1]["to_count"]]
    assert [e["reason"] for e in c["events"]] == [e["reason"] for e in events]
    assert "Replicas over time" in page and "Scaling events" in page  # the Planner diagnostics section


def test_predict_report_writes_report_html_and_leaves_prediction_json_alone(tmp_path):
    def predict(*extra):
        return subprocess.run([sys.executable, "-m", "aisim", "predict", "--format", "json", *extra],
                              capture_output=True, text=True, env=ENV, timeout=180)

    p = predict("--output-dir", str(tmp_path / "plain"))
    q = predict("--output-dir", str(tmp_path / "rep"), "--report")
    assert p.returncode == 0 and q.returncode == 0, q.stderr
    assert sorted(os.listdir(tmp_path / "rep")) == ["prediction.json", "report.html", "resource-runtime.json"]

    def without_wall(path):
        doc = json.loads(path.read_text())
        return {k: v for k, v in doc["summary"].items() if "wall" not in k and "per_s" not in k}, doc["per_request"]

    assert without_wall(tmp_path / "plain" / "prediction.json") == without_wall(tmp_path / "rep" / "prediction.json")
    r = predict("--report")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "--report" in r.stderr


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (Debian package 'chromium'; .ci/run "
                                             "installs it where it can)")
def test_report_renders_offline_in_headless_chromium(quickstart, tmp_path):
    rep, page = quickstart
    html_path = tmp_path / "report.html"
    html_path.write_text(page)
    base = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--no-first-run", "--disable-background-networking", "--user-data-dir=" + str(tmp_path / "profile")]
    dom = subprocess.run(base + ["--enable-logging=stderr", "--v=0", "--dump-dom", html_path.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "Uncaught" not in dom.stderr and "CONSOLE" not in dom.stderr  # the page logs nothing, no script error
    figures = re.findall(r'<figure class="chart" id="chart-([a-z0-9]+)">(.*?)</figure>', dom.stdout, flags=re.S)
    assert [name for name, _ in figures] == ["ttft", "itl", "e2e", "throughput", "workers"]
    for _, body in figures:  # every chart drawn: an SVG with drawn paths
        assert "<svg" in body and body.count("<path") >= 3
    shot = Path(os.environ.get("AISIM_REPORT_SCREENSHOT", tmp_path / "report.png"))
    done = subprocess.run(base + ["--window-size=1200,1800", "--hide-scrollbars", f"--screenshot={shot}",
                                  html_path.as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and shot.stat().st_size > 10_000, done.stderr[-2000:]
