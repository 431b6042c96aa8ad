"""``capacity_report.html`` of ``aisim capacity --report``: one self-contained page (matplotlib SVGs,
no script, opens offline), like predict's ``report.html``.

Per job: for each SLA rule, the rule's metric against QPS over the job's trials, the threshold as a
line, passing trials as filled circles and failing ones as crosses, each point numbered in search
order; the search trace as a table (order, QPS, pass/fail, every rule's value). Each chart carries its
numbers as JSON (``<script type="application/json" class="chart-data">``)."""

from __future__ import annotations

import html

from aisim.simulator.metrics.report_html import figure_html, page_html, pyplot, svg_of

__all__ = ["render_capacity_html"]


def rule_label(r: dict) -> str:
    return f"q{r['quantile']:g} {r['metric']} {r['op']} {r['threshold']:g}"


def job_chart_data(job: dict) -> dict:
    """Per SLA rule of a job: its trials in search order (qps, value, passed)."""
    rules: dict[str, dict] = {}
    for order, t in enumerate(job.get("search_trace") or []):
        for r in t.get("sla_results") or []:
            d = rules.setdefault(rule_label(r), {"metric": r["metric"], "threshold": r["threshold"], "op": r["op"],
                                                 "quantile": r["quantile"], "points": []})
            d["points"].append({"order": order + 1, "qps": t["qps"], "value": r["value"], "passed": r["passed"]})
    return rules


def _chart(name: str, label: str, d: dict) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 2.8))
    pts = [p for p in d["points"] if p["value"] is not None]
    for passed, marker, color, text in ((True, "o", "#2ca02c", "pass"), (False, "x", "#d62728", "fail")):
        sel = [p for p in pts if p["passed"] is passed]
        if sel:
            ax.scatter([p["qps"] for p in sel], [p["value"] for p in sel], marker=marker, color=color, label=text,
                       zorder=3)
    for p in pts:
        ax.annotate(str(p["order"]), (p["qps"], p["value"]), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.axhline(d["threshold"], color="#7f7f7f", linestyle="--", label=f"threshold {d['threshold']:g}")
    ax.set_xlabel("QPS")
    ax.set_ylabel(f"q{d['quantile']:g} {d['metric']}")
    ax.legend(loc="best", fontsize=8)
    return figure_html(name, f"{label}: value per trial (numbers: search order)", svg_of(fig), d)


def _trace_table(job: dict) -> str:
    trace = job.get("search_trace") or []
    labels = [rule_label(r) for r in (trace[0].get("sla_results") or [])] if trace else []
    head = "".join(f"<th>{html.escape(x)}</th>" for x in ("#", "QPS", "result", *labels))
    rows = []
    for i, t in enumerate(trace):
        verdict = "timed out" if t.get("timed_out") else {True: "pass", False: "fail", None: "done"}[t.get("passed")]
        cells = [str(i + 1), f"{t['qps']:g}", verdict + (" (cached)" if t.get("cached") else "")]
        cells += ["" if r["value"] is None else f"{r['value']:.4g}" for r in t.get("sla_results") or []]
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    return f"<table class='trace'><tr>{head}</tr>{''.join(rows)}</table>"


def render_capacity_html(result: dict) -> str:
    """The page for ``capacity_search_results.json``'s document (``{"jobs": [...]}``)."""
    parts = ["<h2>Jobs</h2><table class='jobs'><tr><th>job</th><th>mode</th><th>max QPS under SLA</th>"
             "<th>trials</th><th>stopped</th><th>error</th></tr>"]
    for j in result["jobs"]:
        best = "null" if j["max_qps_under_sla"] is None else f"{j['max_qps_under_sla']:g}"
        parts.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
            j["job_name"], j["mode"], best, j["num_trials"], j.get("stopped") or "", j.get("error") or "")) + "</tr>")
    parts.append("</table>")
    for k, j in enumerate(result["jobs"]):
        parts.append(f"<h2>{html.escape(j['job_name'])} ({html.escape(j['mode'])})</h2>")
        for i, (label, d) in enumerate(job_chart_data(j).items()):
            parts.append(_chart(f"job{k}-rule{i}", label, d))
        parts += ["<h3>Search trace</h3>", _trace_table(j)]
    return page_html("aisim capacity", parts)
