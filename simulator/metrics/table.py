"""The stdout table of ``aisim predict --format table`` (layout of the reference report)."""

from __future__ import annotations

ROWS = (
    ("Time to First Token (ms)", "ttft_ms"),
    ("Time to Second Token (ms)", "ttst_ms"),
    ("Request Latency (ms)", "e2e_latency_ms"),
    ("Inter Token Latency (ms)", "itl_ms"),
    ("Output Token Throughput Per User (tokens/sec/user)", "output_token_throughput_per_user"),
)
SCALARS = (
    ("Output Token Throughput (tokens/sec)", "output_throughput_tok_s"),
    ("Request Throughput (requests/sec)", "request_throughput_rps"),
    ("Completed Requests (requests)", "completed_requests"),
    ("Rejected Requests (requests)", "rejected_requests"),
    ("Incomplete Requests (requests)", "incomplete_requests"),
)
COLUMNS = ("avg", "min", "max", "p99", "p90", "p75", "std")
_STAT_OF = {"avg": "mean", "min": "min", "max": "max", "p99": "p99", "p90": "p90", "p75": "p75", "std": "std"}


def _fmt(v) -> str:
    if v is None:
        return "N/A"
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:,.2f}"


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


def render_table(summary: dict, title: str = "aisim | LLM Metrics", runtime: dict | None = None) -> str:
    body: list[list[str]] = []
    for label, key in ROWS:
        if summary.get(f"mean_{key}") is None:
            continue
        body.append([label] + [_fmt(summary.get(f"{_STAT_OF[c]}_{key}")) for c in COLUMNS])
    for label, key in SCALARS:
        body.append([label, _fmt(summary.get(key))] + ["N/A"] * (len(COLUMNS) - 1))
    header = ["Metric", *COLUMNS]
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]

    def line(left: str, mid: str, right: str, fill: str) -> str:
        return left + mid.join(fill * (w + 2) for w in widths) + right

    def row(cells: list[str], bar: str) -> str:
        parts = [f" {cells[0]:<{widths[0]}} "] + [f" {c:>{w}} " for c, w in zip(cells[1:], widths[1:])]
        return bar + bar.join(parts) + bar

    total = sum(widths) + 3 * len(widths) + 1
    lines = [title.center(total).rstrip(), line("┏", "┳", "┓", "━"), row(header, "┃"), line("┡", "╇", "┩", "━")]
    lines += [row(r, "│") for r in body]
    lines.append(line("└", "┴", "┘", "─"))
    lines += rejection_lines(summary)
    dep = summary.get("deployment")
    if dep:
        pools = ", ".join(f"{n} {role}" for role, n in dep["workers"].items())
        lines.append(f"Deployment: {dep['mode']}, {pools} workers ({dep['gpus']} GPUs), router {dep['router']['policy']}")
    if runtime:
        sync = (dep or {}).get("router_sync_ms") or 0
        text = f"Runtime: {runtime['backend']}"
        if runtime["backend"] != "local" or runtime["num_hosts"] > 1:
            text += (f", {runtime['num_hosts']} engine host(s), {runtime['num_calls']:,} calls "
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
    if "goodput_completed_requests" in summary:
        lines.append(
            f"Goodput: {summary['goodput_completed_requests']} requests, "
            f"{_fmt(summary.get('goodput_output_throughput_tok_s'))} output tokens/sec"
        )
    return "\n".join(lines)
