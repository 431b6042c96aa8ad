"""What a person reads at the end of a Spica search: the winner in words (its score with its unit, mode,
shape, router, the SLA margins, the YAML that replays it), a Pareto front as a small table, and why
the candidates that did not make it failed, with counts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["UNITS", "describe_shape", "sla_margins", "winner_lines", "front_table", "reason_parts", "reason_line"]

#: objective -> how its raw value reads
UNITS = {
    "throughput": "output tok/s",
    "throughput_per_gpu": "output tok/s per GPU",
    "throughput_per_user": "output tok/s per user",
    "goodput": "goodput output tok/s",
    "goodput_per_gpu": "goodput output tok/s per GPU",
    "ttft": "ms mean TTFT",
    "e2e_latency": "ms mean E2E latency",
    "min_gpus": "GPUs",
}


def _worker(cfg: Mapping, prefix: str) -> str:
    parts = [f"tp{cfg.get(prefix + 'tp', 1)}"]
    for key, tag in (("pp", "pp"), ("attention_dp", "dp"), ("moe_ep", "ep"), ("moe_tp", "moetp")):
        v = cfg.get(prefix + key, 1)
        if v not in (None, 1):
            parts.append(f"{tag}{v}")
    return " ".join(parts)


def describe_shape(cfg: Mapping) -> str:
    """``agg 2 x (tp1 dp2)`` or ``disagg prefill 1 x (tp1 dp2) + decode 3 x (tp1)`` from a flat config."""
    if cfg.get("deployment_mode") == "disagg":
        roles = [f"{r} {cfg.get(r + '_replicas')} x ({_worker(cfg, r + '_')})" for r in ("prefill", "decode")]
        return "disagg " + " + ".join(roles)
    return f"agg {cfg.get('replicas')} x ({_worker(cfg, '')})"


def _fmt(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1e5 else f"{v:,.0f}"


def sla_margins(metrics: Mapping | None, sla: Mapping | None) -> list[str]:
    """``mean TTFT 812 ms vs 2000 (59% margin)`` per SLA limit set (the statistic the SLA names)."""
    from aisim.search.spica.objectives import sla_fields, sla_statistic

    if not metrics or not sla:
        return []
    stat = sla_statistic(sla)
    out = []
    for (key, field), label in zip(sla_fields(stat), ("TTFT", "ITL", "E2E")):
        limit = sla.get(key)
        if limit is None:
            continue
        value = metrics.get(field)
        if value is None:
            out.append(f"{stat} {label} n/a (limit {_fmt(limit)} ms)")
            continue
        margin = (limit - value) / limit * 100
        word = "margin" if margin >= 0 else "over"
        out.append(f"{stat} {label} {_fmt(value)} ms vs {_fmt(limit)} ({abs(margin):.0f}% {word})")
    return out


def winner_lines(best: Mapping, target: str, sla: Mapping | None, yaml_path: str) -> list[str]:
    """The winner in three lines."""
    cfg = best.get("config") or {}
    objectives = best.get("objectives") or {}
    if target == "pareto":
        score = ", ".join(f"{k} {_fmt(v)} {UNITS.get(k, '')}".rstrip() for k, v in objectives.items())
    else:
        v = objectives.get(target)
        score = f"{target} {_fmt(v)} {UNITS[target]}" if v is not None else f"score {best.get('score')}"
    lines = [f"best: {best['candidate_id']}: {score} on {best.get('used_gpus')} GPUs",
             f"  {describe_shape(cfg)}, {cfg.get('backend', 'vllm')}, router {cfg.get('router_mode')}"
             + (f", planner {cfg.get('planner_scaling_policy')}" if cfg.get("planner_scaling_policy") not in
                (None, "disabled") else "")]
    margins = sla_margins(best.get("metrics"), sla)
    if margins:
        lines.append("  SLA: " + "; ".join(margins))
    lines.append(f"  replay it: aisim predict -c {yaml_path}")
    return lines


def front_table(front: Sequence[Mapping]) -> list[str]:
    """A Pareto front as aligned rows: candidate, each objective, GPUs, shape, router."""
    if not front:
        return []
    names = list((front[0].get("objectives") or {}).keys())
    header = ["candidate", *names, "GPUs", "deployment", "router"]
    rows = [[c["candidate_id"], *(_fmt((c.get("objectives") or {}).get(n, float("nan"))) for n in names),
             str(c.get("used_gpus")), describe_shape(c.get("config") or {}), str((c.get("config") or {}).get(
                 "router_mode"))] for c in front]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    numeric = set(range(1, len(names) + 2))
    fmt = lambda r: "  ".join(str(x).rjust(w) if i in numeric else str(x).ljust(w)  # noqa: E731
                              for i, (x, w) in enumerate(zip(r, widths))).rstrip()
    return [f"pareto front ({len(front)} candidates):", "  " + fmt(header), *("  " + fmt(r) for r in rows)]


def count_parts(counts: Mapping[str, int]) -> str:
    """``30 feasible, 2 infeasible, 5 pruned, 1 not run to a score`` (pruned: only when counted)."""
    pruned = f"{counts['pruned']} pruned, " if "pruned" in counts else ""
    unscored = counts["failed"] + counts["timed_out"] + counts["unsupported"] + counts["resource_limited"]
    return (f"{counts['feasible']} feasible, {counts['infeasible']} infeasible, {pruned}{unscored} not run to a "
            "score")


def reason_parts(reasons: Mapping[str, Mapping[str, int]]) -> str:
    """``infeasible 10 (kv_capacity 6, sla_constraint 4); failed 2 (replay_runtime 2); pruned 3`` (a
    status whose only category is itself is not repeated)."""
    def part(status: str, per: Mapping[str, int]) -> str:
        head = f"{status} {sum(per.values())}"
        if set(per) == {status}:
            return head
        return f"{head} ({', '.join(f'{k} {n}' for k, n in sorted(per.items()))})"

    return "; ".join(part(status, per) for status, per in sorted(reasons.items()))


def reason_line(reasons: Mapping[str, Mapping[str, int]]) -> str | None:
    """``not feasible: `` + ``reason_parts``, None when every candidate was feasible."""
    return "not feasible: " + reason_parts(reasons) if reasons else None
