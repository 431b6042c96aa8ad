"""``recommendation.html`` of ``aisim recommend --report``: one self-contained page (matplotlib SVGs,
no script, opens offline), like predict's ``report.html``.

Sections: the outcome (counts, the winner in words, why the others did not make it); the score of
every scored candidate against its GPUs (feasible filled, infeasible hollow at their objective where
they have one, the winner or the Pareto front ringed; a pareto search plots its two objectives with
the front joined); the top candidates as a table (rank, candidate, score, GPUs, deployment, router,
mean TTFT / ITL, goodput); the not-feasible reasons with counts. Each chart carries its numbers as
JSON (``<script type="application/json" class="chart-data">``)."""

from __future__ import annotations

import html

from aisim.search.spica.summary import UNITS, count_parts, describe_shape, reason_parts, sla_margins
from aisim.simulator.metrics.report_html import figure_html, page_html, pyplot, svg_of

__all__ = ["render_search_html", "score_chart_data"]

TOP = 10


def _objective(c: dict, name: str):
    return (c.get("objectives") or {}).get(name)


def score_chart_data(rec: dict) -> dict:
    """What the score chart draws: per candidate its id, GPUs, status, objective values, and
    whether it is the winner / on the front."""
    target = rec["provenance"]["config"]["optimization"]["target"]
    front = set(rec["views"]["pareto_front"])
    top = rec["views"]["top_n"][:1]
    names = None
    points = []
    for c in rec["candidates"]:
        obj = c.get("objectives") or {}
        names = names or (list(obj) if obj else None)
        points.append({"candidate_id": c["candidate_id"], "used_gpus": c.get("used_gpus"), "status": c["status"],
                       "objectives": {k: v for k, v in obj.items() if isinstance(v, (int, float))
                                      and v == v and abs(v) != float("inf")},
                       "front": c["candidate_id"] in front, "best": c["candidate_id"] in top})
    return {"target": target, "objectives": names or [target], "points": points}


def _score_chart(d: dict) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 3.2))
    pareto = d["target"] == "pareto" and len(d["objectives"]) >= 2
    xk, yk = (d["objectives"][0], d["objectives"][1]) if pareto else ("used_gpus", d["objectives"][0])

    def xy(p):
        x = p["objectives"].get(xk) if pareto else p["used_gpus"]
        return x, p["objectives"].get(yk)

    for feasible, style in ((True, dict(color="#1f77b4", marker="o", label="feasible")),
                            (False, dict(facecolors="none", edgecolors="#d62728", marker="o", label="not feasible"))):
        sel = [xy(p) for p in d["points"] if (p["status"] == "feasible") is feasible]
        sel = [(x, y) for x, y in sel if x is not None and y is not None]
        if sel:
            ax.scatter(*zip(*sel), zorder=3, **style)
    ring = [xy(p) for p in d["points"] if (p["front"] if pareto else p["best"])]
    ring = [(x, y) for x, y in ring if x is not None and y is not None]
    if ring:
        ax.scatter(*zip(*ring), s=160, facecolors="none", edgecolors="#ff7f0e", linewidths=2, zorder=4,
                   label="pareto front" if pareto else "best")
        if pareto:
            ax.plot(*zip(*sorted(ring)), color="#ff7f0e", linewidth=1)
    ax.set_xlabel(f"{xk} ({UNITS.get(xk, '')})" if pareto else "GPUs")
    ax.set_ylabel(f"{yk} ({UNITS.get(yk, '')})")
    ax.legend(loc="best", fontsize=8)
    title = "The two objectives of every scored candidate" if pareto else f"{yk} against GPUs, every scored candidate"
    return figure_html("score", title, svg_of(fig), d)


def _fmt(v) -> str:
    return "" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))


def _top_table(rec: dict, target: str) -> str:
    by_id = {c["candidate_id"]: c for c in rec["candidates"]}
    objectives = None
    rows = []
    for rank, cid in enumerate(rec["views"]["top_n"][:TOP]):
        c = by_id[cid]
        obj = c.get("objectives") or {}
        objectives = objectives or list(obj)
        m = c.get("metrics") or {}
        cfg = c.get("config") or {}
        cells = [rank + 1, cid, *(_fmt(obj.get(k)) for k in objectives), c.get("used_gpus"), describe_shape(cfg),
                 cfg.get("router_mode"), _fmt(m.get("mean_ttft_ms")), _fmt(m.get("mean_tpot_ms")),
                 _fmt(m.get("goodput_output_throughput_tok_s"))]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(x))}</td>" for x in cells) + "</tr>")
    if not rows:
        return "<p>No feasible candidate.</p>"
    head = ["#", "candidate", *(f"{k} ({UNITS.get(k, '')})" for k in objectives), "GPUs", "deployment", "router",
            "mean TTFT ms", "mean ITL ms", "goodput tok/s"]
    return ("<table class='top'><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"
            + "".join(rows) + "</table>")


def render_search_html(rec: dict, reasons: dict, decided: str | None) -> str:
    """The page for a search's ``recommendation.json`` document; ``reasons``: status -> category ->
    count of the candidates that were not feasible; ``decided``: None, or why nothing was."""
    target = rec["provenance"]["config"]["optimization"]["target"]
    sla = rec["provenance"]["config"]["evaluation"]["sla"]
    counts = rec["counts"]
    lines = [f"{counts['evaluated']} candidates evaluated: {count_parts(counts)}; {counts['cache_hits']} duplicate "
             "suggestions"]
    if decided:
        lines.append(decided)
    elif rec["views"]["top_n"]:
        best = next(c for c in rec["candidates"] if c["candidate_id"] == rec["views"]["top_n"][0])
        lines.append(f"best: {best['candidate_id']} on {best.get('used_gpus')} GPUs, "
                     f"{describe_shape(best.get('config') or {})}")
        lines += sla_margins(best.get("metrics"), sla)
    if reasons:
        lines.append("not feasible: " + reason_parts(reasons))
    parts = ["<h2>Outcome</h2>", "<ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in lines) + "</ul>",
             "<h2>Score</h2>", _score_chart(score_chart_data(rec)),
             f"<h2>Top candidates (target {html.escape(target)})</h2>", _top_table(rec, target)]
    return page_html("aisim recommend", parts)
