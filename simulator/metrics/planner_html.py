"""The Planner diagnostics page of the Python API (``aisim predict --report`` has it as a section).

One self-contained HTML file (inline SVG, no scripts, no network): replicas over time per
role, observed vs predicted requests per throughput interval, and the scaling events. It is
written only when the API is given ``planner_report_dir`` (into that directory) and its path
returned in ``planner.html_report_path``; otherwise no file is written.
"""

from __future__ import annotations

import html
from pathlib import Path

from aisim.simulator.metrics.output import atomic_write_text

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")


def _polyline(points: list[tuple[float, float]], x_max: float, y_max: float, w: int, h: int, color: str,
              step: bool = True) -> str:
    if not points:
        return ""
    pts = []
    prev_y = None
    for x, y in points:
        px = 40 + (w - 50) * (x / x_max if x_max else 0)
        py = h - 25 - (h - 40) * (y / y_max if y_max else 0)
        if step and prev_y is not None:
            pts.append(f"{px:.1f},{prev_y:.1f}")
        pts.append(f"{px:.1f},{py:.1f}")
        prev_y = py
    return f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{" ".join(pts)}"/>'


def _chart(title: str, series: dict[str, list[tuple[float, float]]], x_label: str, step: bool = True) -> str:
    w, h = 760, 240
    xs = [x for s in series.values() for x, _ in s] or [1.0]
    ys = [y for s in series.values() for _, y in s] or [1.0]
    x_max, y_max = max(xs) or 1.0, (max(ys) or 1.0) * 1.1
    lines = [f'<svg width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg">',
             f'<rect x="40" y="15" width="{w - 50}" height="{h - 40}" fill="#fafafa" stroke="#ccc"/>',
             f'<text x="40" y="{h - 5}" font-size="11">0</text>',
             f'<text x="{w - 60}" y="{h - 5}" font-size="11">{x_max:,.0f} {html.escape(x_label)}</text>',
             f'<text x="2" y="25" font-size="11">{y_max / 1.1:,.1f}</text>']
    legend = []
    for i, (name, pts) in enumerate(series.items()):
        color = _COLORS[i % len(_COLORS)]
        lines.append(_polyline(pts, x_max, y_max, w, h, color, step))
        legend.append(f'<span style="color:{color}">&#9632; {html.escape(name)}</span>')
    lines.append("</svg>")
    return f"<h2>{html.escape(title)}</h2><div>{' '.join(legend)}</div>" + "".join(lines)


def render_planner_html(planner: dict, summary: dict) -> str:
    return ("<!doctype html><html><head><meta charset='utf-8'><title>aisim Planner diagnostics</title>"
            "<style>body{font-family:sans-serif;margin:20px}</style></head><body><h1>aisim Planner diagnostics</h1>"
            + planner_section(planner, summary) + "</body></html>")


def planner_section(planner: dict, summary: dict) -> str:
    """The page's body (also a section of ``aisim predict --report``'s report.html)."""
    ticks = planner.get("ticks") or []
    replicas: dict[str, list[tuple[float, float]]] = {}
    observed: list[tuple[float, float]] = []
    predicted: list[tuple[float, float]] = []
    for t in ticks:
        at_s = t["at_ms"] / 1000.0
        for role, topo in t["topology"].items():
            if topo is not None:
                replicas.setdefault(f"{role} (active + starting)", []).append(
                    (at_s, topo["active_count"] + topo["starting_count"]))
        thr = (t["effects"]["diagnostics"] or {}).get("throughput")
        traffic = t["input"]["traffic"]
        if traffic is not None:
            observed.append((at_s, traffic["num_req"]))
        if thr and "predicted_num_req" in thr:
            predicted.append((at_s + planner["metadata"].get("tick_interval_s", 0), thr["predicted_num_req"]))
    rows = "".join(
        f"<tr><td>{e['at_s']:,.1f}</td><td>{html.escape(e['component'])}</td><td>{e['from_count']}</td>"
        f"<td>{e['to_count']}</td><td>{html.escape(e['reason'])}</td></tr>"
        for e in (planner.get("scaling_events") or []) + (planner.get("recommended_scaling_events") or []))
    meta = planner["metadata"]
    head = (f"<p>target <b>{html.escape(str(meta['target']))}</b>, mode {html.escape(meta['mode'])}, "
            f"{planner['total_ticks']} ticks, advisory {meta['advisory']}; GPU hours {summary.get('gpu_hours', 0):.3f}, "
            f"mean TTFT {summary.get('mean_ttft_ms') or 0:,.1f} ms, mean ITL {summary.get('mean_itl_ms') or 0:,.2f} ms</p>")
    body = [head, _chart("Replicas over time", replicas, "s")]
    if observed or predicted:
        body.append(_chart("Requests per throughput interval: observed vs predicted",
                           {"observed": observed, "predicted (for the next interval)": predicted}, "s", step=False))
    body.append("<h2>Scaling events</h2><table border=1 cellspacing=0 cellpadding=3><tr><th>at (s)</th>"
                f"<th>component</th><th>from</th><th>to</th><th>reason</th></tr>{rows}</table>")
    return "".join(body)


def write_planner_html(planner: dict, summary: dict, directory: str | Path) -> str:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"planner-{planner['metadata']['planner_config_digest'][:12]}.html"
    atomic_write_text(path, render_planner_html(planner, summary))
    return str(path)
