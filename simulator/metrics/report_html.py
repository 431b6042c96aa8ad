"""``report.html`` of ``aisim predict --report``: one self-contained page that opens offline.

Charts are matplotlib SVGs inlined in the page (no script runs, no network, nothing to load):
static figures keep the file small (hundreds of KB, where Plotly's inlined JavaScript alone is
~4 MB) and render the same in every browser and in a headless one. Each chart carries the numbers
it draws as JSON (``<script type="application/json" class="chart-data" data-chart=NAME>``), so
the page can be checked against the run and the data reused.

Sections: latency distributions (TTFT, ITL, E2E per request, with the SLA lines), throughput over
time, per worker its queue depth and KV usage over time, replicas over time with the Planner's
scaling events and retune decisions marked, the Planner diagnostics (``planner_html``), and the
resolved config. matplotlib is the ``report`` extra (``pip install 'aisim[report]'``).
"""

from __future__ import annotations

import html
import io
import json
from collections.abc import Iterable

import numpy as np

from aisim.simulator.errors import InputError
from aisim.simulator.metrics.planner_summary import replica_steps

MAX_POINTS = 2000  # per plotted series: timelines are sampled on an even grid beyond this
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f")


def require_matplotlib(where: str) -> None:
    """A one-line ``InputError`` naming ``where`` (the flag) when matplotlib is not installed."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise InputError(where, "needs matplotlib to draw its charts; install the report extra: "
                                "pip install 'aisim[report]'")


def pyplot():
    import matplotlib

    matplotlib.use("svg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "aisim", "font.size": 9, "figure.dpi": 100})  # stable SVG ids
    return plt


def svg_of(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    pyplot().close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _data_block(name: str, data: dict) -> str:
    text = json.dumps(data, sort_keys=True, allow_nan=False).replace("</", "<\\/")
    return f'<script type="application/json" class="chart-data" data-chart="{html.escape(name)}">{text}</script>'


def figure_html(name: str, title: str, svg: str, data: dict) -> str:
    return (f'<figure class="chart" id="chart-{html.escape(name)}"><figcaption>{html.escape(title)}</figcaption>'
            f"{svg}{_data_block(name, data)}</figure>")


PAGE_STYLE = ("body{font-family:sans-serif;margin:20px;max-width:1100px}figure{margin:10px 0}"
              "figcaption{font-weight:bold}pre{background:#f6f6f6;padding:8px;overflow-x:auto}"
              "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:2px 6px}")


def page_html(title: str, parts: list[str]) -> str:
    """A whole page: ``title`` as its title and heading, then ``parts`` (HTML fragments)."""
    t = html.escape(title)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{t}</title><style>{PAGE_STYLE}</style>"
            f"</head><body><h1>{t}</h1>" + "".join(parts) + "</body></html>\n")


def _finite(values: Iterable) -> list[float]:
    return [float(v) for v in values if v is not None and np.isfinite(v)]


# -- the data of each chart (plain numbers; tests compare them with the run) -----------------------
LATENCIES = (("ttft", "ttft_ms", "Time to first token (ms)", "ttft_ms"),
             ("itl", "itl_ms", "Inter-token latency, per-request mean (ms)", "itl_ms"),
             ("e2e", "e2e_latency_ms", "Request latency (ms)", "e2e_ms"))


def latency_data(per_request: list[dict], sla: dict | None) -> dict[str, dict]:
    """Per latency: every completed request's value (arrival order) and the SLA target (or None)."""
    out = {}
    for name, field, _, sla_key in LATENCIES:
        values = _finite(r.get(field) for r in per_request if r.get("terminal_status") == "completed")
        out[name] = {"values_ms": values, "sla_ms": (sla or {}).get(sla_key)}
    return out


def throughput_data(per_request: list[dict], duration_ms: float, bins: int = 60) -> dict:
    """Completed requests and their output tokens per equal slice of the run, by completion time."""
    width = max(duration_ms, 1.0) / bins
    reqs = [0] * bins
    toks = [0] * bins
    for r in per_request:
        if r.get("terminal_status") != "completed" or r.get("last_token_ms") is None:
            continue
        b = min(int(r["last_token_ms"] // width), bins - 1)
        reqs[b] += 1
        toks[b] += int(r.get("output_length") or 0)
    return {"bin_s": width / 1000.0, "start_s": [i * width / 1000.0 for i in range(bins)],
            "requests_per_s": [n / (width / 1000.0) for n in reqs],
            "output_tokens_per_s": [n / (width / 1000.0) for n in toks]}


def timeline_data(timelines) -> list[dict]:
    """Per worker: waiting requests and KV usage (fraction of its blocks) over time, as steps.
    Beyond ``MAX_POINTS`` samples the state is read on an even grid of that many times."""
    out = []
    for tl in timelines or []:
        t = np.asarray(tl.times_ms, dtype=np.float64)
        waiting = np.asarray(tl.waiting)
        kv = np.asarray(tl.kv_blocks_used) / max(tl.kv_blocks_total, 1)
        if len(t) > MAX_POINTS:
            grid = np.linspace(t[0], t[-1], MAX_POINTS)
            idx = np.searchsorted(t, grid, side="right") - 1
            t, waiting, kv = grid, waiting[idx], kv[idx]
        out.append({"worker_id": tl.worker_id, "role": tl.role, "times_s": (t / 1000.0).tolist(),
                    "waiting": [int(x) for x in waiting], "kv_usage": [float(x) for x in kv]})
    return out


# -- the charts --------------------------------------------------------------------------------------
def _latency_chart(name: str, title: str, d: dict) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 2.6))
    values = d["values_ms"]
    if values:
        ax.hist(values, bins=60, color=_COLORS[0], alpha=0.85)
        for q, style in ((50, ":"), (90, "--"), (99, "-.")):
            ax.axvline(float(np.percentile(values, q)), color="#444", linestyle=style, linewidth=1, label=f"p{q}")
    if d["sla_ms"] is not None:
        ax.axvline(d["sla_ms"], color=_COLORS[1], linewidth=2, label=f"SLA {d['sla_ms']:g} ms")
    ax.set_xlabel("ms")
    ax.set_ylabel("requests")
    if values or d["sla_ms"] is not None:
        ax.legend(loc="upper right", fontsize=8)
    return figure_html(name, title, svg_of(fig), d)


def _throughput_chart(d: dict) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 2.6))
    ax.step(d["start_s"], d["output_tokens_per_s"], where="post", color=_COLORS[0], label="output tokens/s")
    ax.set_xlabel("simulated s")
    ax.set_ylabel("output tokens/s")
    ax2 = ax.twinx()
    ax2.step(d["start_s"], d["requests_per_s"], where="post", color=_COLORS[2], label="requests/s")
    ax2.set_ylabel("requests/s")
    fig.legend(loc="upper right", fontsize=8)
    return figure_html("throughput", "Throughput over time (by completion time)", svg_of(fig), d)


def _timeline_chart(data: list[dict]) -> str:
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7.5, 4.2), sharex=True)
    for i, w in enumerate(data):
        color = _COLORS[i % len(_COLORS)]
        label = f"worker {w['worker_id']}" + (f" ({w['role']})" if w["role"] else "")
        ax1.step(w["times_s"], w["waiting"], where="post", color=color, linewidth=1, label=label)
        ax2.step(w["times_s"], w["kv_usage"], where="post", color=color, linewidth=1, label=label)
    ax1.set_ylabel("waiting requests")
    ax2.set_ylabel("KV usage")
    ax2.set_ylim(0, 1.05)
    ax2.set_xlabel("simulated s")
    if 0 < len(data) <= 12:
        ax1.legend(loc="upper right", fontsize=7, ncol=2)
    return figure_html("workers", "Queue depth and KV usage over time, per worker", svg_of(fig), {"workers": data})


def _replica_chart(d: dict) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 2.6))
    for i, (comp, c) in enumerate(d["components"].items()):
        color = _COLORS[i % len(_COLORS)]
        ax.step(c["times_s"], c["replicas"], where="post", color=color, label=comp)
        ups = [e for e in c["events"] if e["reason"] == "scale_up"]
        downs = [e for e in c["events"] if e["reason"] != "scale_up"]
        ax.scatter([e["at_s"] for e in ups], [e["to"] for e in ups], marker="^", color=color, s=14)
        ax.scatter([e["at_s"] for e in downs], [e["to"] for e in downs], marker="v", color=color, s=14)
    for k, r in enumerate(d["retune"]):
        ax.axvline(r["at_s"], color="#999", linestyle="--", linewidth=1,
                   label="retune decision" if k == 0 else None)
    ax.set_xlabel("simulated s")
    ax.set_ylabel("replicas")
    if d["components"] or d["retune"]:
        ax.legend(loc="upper right", fontsize=8)
    return figure_html("replicas", "Replicas over time (scaling events: triangles; retune decisions: dashed)",
                   svg_of(fig), d)


def render_report_html(summary: dict, per_request: list[dict], timelines, planner: dict | None,
                       config: dict, sla: dict | None) -> str:
    """The page (see the module doc); ``per_request``: the run's request records, ``timelines``:
    its ``WorkerTimeline``s, ``config``: the resolved config as plain data."""
    import yaml

    from aisim.simulator.metrics.planner_html import planner_section
    from aisim.simulator.metrics.table import render_table

    duration = float(summary.get("duration_ms") or 0.0)
    lat = latency_data(per_request, sla)
    parts = ["<h2>Summary</h2>", f"<pre class='table'>{html.escape(render_table(summary, planner=planner, width=100))}</pre>",
             "<h2>Latency</h2>"]
    for name, _, title, _ in LATENCIES:
        parts.append(_latency_chart(name, title, lat[name]))
    parts += ["<h2>Throughput</h2>", _throughput_chart(throughput_data(per_request, duration)),
              "<h2>Workers</h2>", _timeline_chart(timeline_data(timelines))]
    if planner is not None:
        parts += ["<h2>Planner</h2>", _replica_chart(replica_steps(planner, duration))]
        if planner.get("ticks") is not None:
            parts.append(planner_section(planner, summary))
    parts += ["<h2>Resolved config</h2>",
              f"<pre class='config'>{html.escape(yaml.safe_dump(config, sort_keys=False))}</pre>"]
    return page_html("aisim report", parts)


# -- aisim compare --report -----------------------------------------------------------------------------
_PCT_KEYS = (("min", 0.0), ("median", 0.5), ("p75", 0.75), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99), ("max", 1.0))


def cdf_data(summary: dict, values: list[float] | None, key: str) -> dict:
    """One run's distribution of a latency: the per-request values when the run kept them (their
    empirical CDF), else the summary's percentiles (a coarse CDF through min, p50, ..., max)."""
    if values:
        return {"values_ms": values}
    pts = [(summary.get(f"{stat}_{key}"), q) for stat, q in _PCT_KEYS]
    return {"percentiles": [[float(v), q] for v, q in pts if v is not None]}


def render_compare_html(runs: list[dict], table_text: str) -> str:
    """The overlay page of ``aisim compare --report``. ``runs``: per run ``{"name", "summary",
    "planner", "latencies"}`` with ``latencies`` mapping ttft/itl/e2e to per-request values (or
    None when the run did not keep its requests); ``table_text``: the comparison table."""
    plt = pyplot()
    # the summary's statistics of the same per-request quantities (a request's mean ITL is its TPOT)
    keys = {"ttft": "ttft_ms", "itl": "tpot_ms", "e2e": "e2e_latency_ms"}
    parts = ["<h2>Comparison</h2>", f"<pre class='table'>{html.escape(table_text)}</pre>", "<h2>Latency</h2>"]
    for name, _, title, _ in LATENCIES:
        data = {}
        fig, ax = plt.subplots(figsize=(7.5, 2.8))
        for i, run in enumerate(runs):
            d = cdf_data(run["summary"], (run.get("latencies") or {}).get(name), keys[name])
            data[run["name"]] = d
            color = _COLORS[i % len(_COLORS)]
            if "values_ms" in d:
                xs = np.sort(np.asarray(d["values_ms"]))
                ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", color=color, label=run["name"])
            elif d["percentiles"]:
                xs, qs = zip(*d["percentiles"])
                ax.plot(xs, qs, marker="o", markersize=3, color=color, linestyle="--",
                        label=f"{run['name']} (percentiles only)")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.legend(loc="lower right", fontsize=8)
        parts.append(figure_html(f"cdf-{name}", f"{title}: distribution per run", svg_of(fig), {"runs": data}))
    replicas = {run["name"]: replica_steps(run.get("planner"), float(run["summary"].get("duration_ms") or 0.0))
                for run in runs}
    if any(r["components"] for r in replicas.values()):
        fig, ax = plt.subplots(figsize=(7.5, 2.8))
        for i, (rname, r) in enumerate(replicas.items()):
            for j, (comp, c) in enumerate(r["components"].items()):
                ax.step(c["times_s"], c["replicas"], where="post", color=_COLORS[i % len(_COLORS)],
                        linestyle=("-", "--", ":", "-.")[j % 4], label=f"{rname}: {comp}")
        ax.set_xlabel("simulated s")
        ax.set_ylabel("replicas")
        ax.legend(loc="upper right", fontsize=8)
        parts += ["<h2>Planner</h2>", figure_html("replicas", "Replicas over time per run", svg_of(fig), {"runs": replicas})]
    return page_html("aisim compare", parts)
