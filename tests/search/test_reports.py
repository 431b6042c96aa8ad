"""``aisim recommend --report`` and ``aisim capacity --report``: self-contained pages whose charts
carry exactly the numbers of the search (checked against recommendation.json and
capacity_search_results.json), that open offline in headless Chromium with every chart drawn."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from aisim.search.capacity import run_capacity_search
from aisim.search.capacity.report import job_chart_data, rule_label
from aisim.search.spica.loop import REPORT_FILE, run_search
from aisim.search.spica.report import score_chart_data
from tests.conftest import ROOT
from tests.search.spica.test_loop import config

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def chart_data(page: str) -> dict[str, dict]:
    return {m.group(1): json.loads(m.group(2).replace("<\\/", "</")) for m in re.finditer(
        r'<script type="application/json" class="chart-data" data-chart="([^"]+)">(.*?)</script>', page, re.S)}


@pytest.fixture(scope="module")
def spica(tmp_path_factory):
    out = tmp_path_factory.mktemp("spica")
    r = run_search(config(optimizer__max_trials=6, search_space__agg_gpu_memory_utilization=0.35), out,
                   parallelism=2, report=True)
    return r, (out / REPORT_FILE).read_text()


@pytest.fixture(scope="module")
def capacity(tmp_path_factory):
    out = tmp_path_factory.mktemp("capacity")
    r = run_capacity_search(ROOT / "configs" / "capacity-search.yaml", out, use_cache=False, report=True)
    return r, (out / "capacity_report.html").read_text()


def test_the_search_report_charts_every_candidate_as_the_ledger_has_it(spica):
    r, page = spica
    rec = json.loads((r.output_dir / "recommendation.json").read_text())
    data = chart_data(page)
    assert list(data) == ["score"] and data["score"] == score_chart_data(rec)
    points = {p["candidate_id"]: p for p in data["score"]["points"]}
    assert set(points) == {c["candidate_id"] for c in rec["candidates"]}
    for c in rec["candidates"]:
        p = points[c["candidate_id"]]
        assert p["used_gpus"] == c["used_gpus"] and p["status"] == c["status"]
        if c["status"] == "feasible":
            assert p["objectives"] == c["objectives"]
    assert [p["candidate_id"] for p in data["score"]["points"] if p["best"]] == rec["views"]["top_n"][:1]
    top = re.findall(r"<tr><td>(\d+)</td><td>(candidate-\d+)</td>", page)
    assert [cid for _, cid in top] == rec["views"]["top_n"][:10]
    assert "goodput_per_gpu (goodput output tok/s per GPU)" in page


def test_the_capacity_report_charts_every_rule_of_every_trial(capacity):
    r, page = capacity
    doc = json.loads((r.output_dir / "capacity_search_results.json").read_text())
    data = chart_data(page)
    expected = {}
    for k, job in enumerate(doc["jobs"]):
        for i, d in enumerate(job_chart_data(job).values()):
            expected[f"job{k}-rule{i}"] = d
    assert data == expected and len(data) == 2 * len(doc["jobs"])  # two SLA rules each
    job = doc["jobs"][0]
    first_rule = job["search_trace"][0]["sla_results"][0]
    d = data["job0-rule0"]
    assert d["threshold"] == first_rule["threshold"] and rule_label(first_rule) == "q0.9 ttft_ms <= 1000"
    assert [(p["order"], p["qps"], p["value"], p["passed"]) for p in d["points"]] == [
        (n + 1, t["qps"], t["sla_results"][0]["value"], t["sla_results"][0]["passed"])
        for n, t in enumerate(job["search_trace"])]


def test_report_needs_matplotlib_named_by_the_flag(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    from aisim.simulator.errors import InputError

    with pytest.raises(InputError, match="--report: needs matplotlib"):
        run_search(config(optimizer__max_trials=1), tmp_path / "s", report=True)
    with pytest.raises(InputError, match="--report: needs matplotlib"):
        run_capacity_search(ROOT / "configs" / "capacity-search.yaml", tmp_path / "c", report=True)
    assert not (tmp_path / "s").exists() and not (tmp_path / "c").exists()


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (Debian package 'chromium'; .ci/run "
                                             "installs it where it can)")
@pytest.mark.parametrize("which", ["spica", "capacity"])
def test_the_search_reports_render_offline_in_headless_chromium(which, request, tmp_path):
    _, page = request.getfixturevalue(which)
    path = tmp_path / "page.html"
    path.write_text(page)
    base = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
            "--disable-background-networking", "--user-data-dir=" + str(tmp_path / "profile")]
    dom = subprocess.run(base + ["--enable-logging=stderr", "--v=0", "--dump-dom", path.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "Uncaught" not in dom.stderr and "CONSOLE" not in dom.stderr
    figures = re.findall(r'<figure class="chart" id="chart-([a-z0-9-]+)">(.*?)</figure>', dom.stdout, flags=re.S)
    assert figures and all("<svg" in body and body.count("<path") >= 3 for _, body in figures)
    shot = Path(tmp_path / "shot.png")
    done = subprocess.run(base + ["--window-size=1200,1400", "--hide-scrollbars", f"--screenshot={shot}",
                                  path.as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and shot.stat().st_size > 10_000, done.stderr[-2000:]
