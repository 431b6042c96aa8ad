"""The stdout table of ``aisim predict --format table``, drawn with rich.

Two layouts of the same numbers: the full one (the reference report's rows and box, every
statistic: avg, min, max, p99, p95, p90, p75, p50, std) wherever it fits, which is always when
stdout is not a terminal (``width=None``), and a compact one for narrower terminals (short
labels; avg, p50, p90, p95, p99, max; the counts and throughputs as lines below), which fits 80
columns. Below either: request counts and rejection reasons, the deployment, the Planner's
replica range over time, its scaling events and retune decisions when it ran, and the run's
totals.
"""

from __future__ import annotations

import io

from aisim.simulator.metrics.planner_summary import planner_counts, replica_steps

ROWS = (
    ("Time to First Token (ms)", "TTFT (ms)", "ttft_ms"),
    ("Time to Second Token (ms)", "TTST (ms)", "ttst_ms"),
    ("Request Latency (ms)", "E2E (ms)", "e2e_latency_ms"),
    ("Inter Token Latency (ms)", "ITL (ms)", "itl_ms"),
    ("Output Token Throughput Per User (tokens/sec/user)", "Tok/s/user", "output_token_throughput_per_user"),
)
SCALARS = (
    ("Output Token Throughput (tokens/sec)", "output_throughput_tok_s"),
    ("Request Throughput (requests/sec)", "request_throughput_rps"),
    ("Completed Requests (requests)", "completed_requests"),
    ("Rejected Requests (requests)", "rejected_requests"),
    ("Incomplete Requests (requests)", "incomplete_requests"),
)
COLUMNS = ("avg", "min", "max", "p99", "p95", "p90", "p75", "p50", "std")
COMPACT_COLUMNS = ("avg", "p50", "p90", "p95", "p99", "max")
_STAT_OF = {"avg": "mean", "min": "min", "max": "max", "p99": "p99", "p95": "p95", "p90": "p90", "p75": "p75",
            "p50": "median", "std": "std"}
_SPARK = "▁▂▃▄▅▆▇█"


def _fmt(v) -> str:
    if v is None:
        return "N/A"
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:,.2f}"


def _fmt_short(v) -> str:
    """Fewer digits where they do not matter (the compact layout): 12,345 / 123 / 12.3 / 1.23."""
    if v is None or isinstance(v, int):
        return _fmt(v)
    a = abs(v)
    return f"{v:,.0f}" if a >= 100 else f"{v:.1f}" if a >= 10 else f"{v:.2f}"


def kv_tier_lines(summary: dict) -> list[str]:
    """The host/disk KV tiers' lines (only when the deployment has them)."""
    t = summary.get("kv_tiers")
    if not t:
        return []
    r = t["reuse"]
    lines = [f"First Admission Reuse by Tier: device {r['first_admission_device_ratio']:.4f}, "
             f"host {r['first_admission_host_ratio']:.4f}"]
    for name, key in (("Host (G2)", "host"), ("Disk (G3)", "disk")):
        x = t.get(key)
        if x is None:
            continue
        moves = (("offloaded", "offload"), ("onboarded", "onboard")) if key == "host" else (("written", "write"),
                                                                                           ("read", "read"))
        parts = [f"{verb} {x[k]['blocks']:,} blocks ({x[k]['bytes'] / 1e9:,.1f} GB, link busy "
                 f"{x[k]['busy_ms'] / 1000.0:,.1f} s)" for verb, k in moves]
        hits = (f"{x['hit_lookups']:,} of {x['lookups']:,} lookups hit" if key == "host"
                else f"{x['lookup_hits']:,} of {x['lookup_probes']:,} probes hit")
        lines.append(f"{name} KV tier ({x['scope']}, {x['resident_blocks']:,}/{x['capacity_blocks']:,} blocks): "
                     f"{hits}; " + "; ".join(parts))
    return lines


def rejection_lines(summary: dict) -> list[str]:
    """One line per rejection reason, most frequent first (then by code): none when nothing was rejected."""
    reasons = summary.get("rejection_reasons") or {}
    examples = summary.get("rejection_examples") or {}
    out = []
    for code, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
        text = f"Rejected ({code}): {n:,} request{'s' if n != 1 else ''}"
        if examples.get(code):
            text += f", e.g. {examples[code]}"
        out.append(text)
    return out


def replicas_over_time(planner: dict, summary: dict, buckets: int = 40) -> dict[str, dict]:
    """Per Planner component (``replica_steps``): the replica count at the start, its minimum,
    maximum and end, the number of scaling events, and a sparkline of the count over the run in
    ``buckets`` equal slices of the simulated duration (each slice: its time-weighted mean count,
    from the lowest count to the highest)."""
    duration_s = (summary.get("duration_ms") or 0.0) / 1000.0
    out: dict[str, dict] = {}
    for comp, c in replica_steps(planner, summary.get("duration_ms") or 0.0)["components"].items():
        times, counts = c["times_s"], c["replicas"]
        if not all(isinstance(n, int) for n in counts):
            continue
        spark = ""
        if duration_s > 0:
            hi, lo = max(counts), min(counts)
            level = []
            k = 0  # counts[k] holds from times[k] on
            for b in range(buckets):
                t0, t1 = duration_s * b / buckets, duration_s * (b + 1) / buckets
                area, t = 0.0, t0
                while k + 1 < len(times) and times[k + 1] < t1:
                    at = max(times[k + 1], t0)
                    area += counts[k] * (at - t)
                    t = at
                    k += 1
                area += counts[k] * (t1 - t)
                level.append(area / (t1 - t0))
            span = hi - lo
            spark = "".join(_SPARK[0 if span == 0 else round((n - lo) * (len(_SPARK) - 1) / span)] for n in level)
        out[comp] = {"start": counts[0], "min": min(counts), "max": max(counts), "end": counts[-1],
                     "events": len(c["events"]), "sparkline": spark}
    return out


def _planner_lines(planner: dict, summary: dict) -> list[str]:
    n = planner_counts(planner)
    lines = [f"Planner: {n['scaling_events']:,} scaling events ({n['scale_ups']:,} up, {n['scale_downs']:,} down), "
             f"{planner.get('total_ticks', 0):,} ticks"]
    for comp, r in replicas_over_time(planner, summary).items():
        lines.append(f"  {comp}: {r['start']} -> {r['end']} replicas, {r['min']}-{r['max']} over the run  "
                     f"{r['sparkline']}".rstrip())
    if planner.get("retune_events") is not None:
        lines.append(f"Retune: {n['retune_decisions']:,} decisions, {n['retune_applied']:,} applied")
    return lines


def _rich_table(summary: dict, title: str, compact: bool):
    from rich import box
    from rich.table import Table

    table = Table(title=title, box=box.HEAVY_HEAD, title_style="", header_style="", show_edge=True)
    cols = COMPACT_COLUMNS if compact else COLUMNS
    table.add_column("Metric", no_wrap=True)
    for c in cols:
        table.add_column(c, justify="right", no_wrap=True)
    for label, short, key in ROWS:
        if summary.get(f"mean_{key}") is None:
            continue
        fmt = _fmt_short if compact else _fmt
        table.add_row(short if compact else label, *[fmt(summary.get(f"{_STAT_OF[c]}_{key}")) for c in cols])
    if not compact:
        for label, key in SCALARS:
            table.add_row(label, _fmt(summary.get(key)), *["N/A"] * (len(cols) - 1))
    return table


def _render(renderable, width: int) -> list[str]:
    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, force_terminal=False, legacy_windows=False,
            emoji=False, highlight=False, markup=False).print(renderable)
    return [ln.rstrip() for ln in buf.getvalue().splitlines()]


def render_table(summary: dict, title: str = "aisim | LLM Metrics", runtime: dict | None = None,
                 planner: dict | None = None, width: int | None = None) -> str:
    """The table and the lines below it; ``width``: the terminal's columns (None: not a terminal,
    the full layout at its natural width)."""
    natural = 1000
    full = _render(_rich_table(summary, title, compact=False), natural)
    full_width = max(len(ln) for ln in full)
    compact = width is not None and full_width > width
    lines = _render(_rich_table(summary, title, compact=True), width) if compact else full
    if compact:
        lines.append(f"Requests: {_fmt(summary.get('completed_requests'))} completed, "
                     f"{_fmt(summary.get('rejected_requests'))} rejected, "
                     f"{_fmt(summary.get('incomplete_requests'))} incomplete")
        lines.append(f"Throughput: {_fmt(summary.get('output_throughput_tok_s'))} output tokens/s, "
                     f"{_fmt(summary.get('request_throughput_rps'))} requests/s")
    lines += rejection_lines(summary)
    dep = summary.get("deployment")
    if dep:
        pools = ", ".join(f"{n} {role}" for role, n in dep["workers"].items())
        start = " at the start" if planner is not None else ""
        lines.append(f"Deployment: {dep['mode']}, {pools} workers{start} ({dep['gpus']} GPUs), "
                     f"router {dep['router']['policy']}")
    if planner is not None:
        lines += _planner_lines(planner, summary)
    if runtime:
        sync = (dep or {}).get("router_sync_ms") or 0
        text = f"Runtime: {runtime['backend']}"
        if runtime["backend"] != "local" or runtime["num_hosts"] > 1:
            nodes = runtime.get("num_nodes", 1)
            hosts = runtime["num_hosts"]
            mine = f" (the driver and {hosts - 1} actor(s))" if runtime.get("driver_hosts_workers") else ""
            text += (f", {hosts} engine host(s){mine}{f' on {nodes} nodes' if nodes > 1 else ''}, "
                     f"{runtime['num_calls']:,} calls "
                     f"({runtime['messages_per_call']:.1f} messages each)")
        text += f", router sync {'exact lockstep' if not sync else f'{sync:g} ms window'}"
        lines.append(text)
    lines.append(f"Wall Time (ms): {_fmt(summary.get('wall_time_ms'))}")
    lines.append(f"Simulated Duration (ms): {_fmt(summary.get('duration_ms'))}")
    lines.append(f"GPU Hours: {summary.get('gpu_hours', 0):.4f}")
    lines.append(f"Prefix Cache Reused Ratio: {summary.get('prefix_cache_reused_ratio', 0):.4f}")
    lines.append(
        f"First Admission Prefix Cache Reused Ratio: {summary.get('first_admission_prefix_cache_reused_ratio', 0):.4f}"
    )
    lines.extend(kv_tier_lines(summary))
    if "goodput_completed_requests" in summary:
        lines.append(
            f"Goodput: {summary['goodput_completed_requests']} requests, "
            f"{_fmt(summary.get('goodput_output_throughput_tok_s'))} output tokens/sec"
            + (f" (p{summary['sla_percentile']} SLA {'met' if summary['sla_met'] else 'missed'})"
               if "sla_met" in summary else "")
        )
    return "\n".join(lines)
