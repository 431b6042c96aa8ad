"""What a run's ``planner`` section says in numbers: counts of its activity and each component's
replica count over time. One reading for the predict table, report.html and ``aisim compare``."""

from __future__ import annotations

from typing import Any

# the keys of planner_counts (None for a run without a Planner)
PLANNER_METRICS = frozenset(("scaling_events", "scale_ups", "scale_downs", "worker_starts",
                             "retune_decisions", "retune_applied"))


def _dicts(items: Any) -> list[dict]:
    return [x for x in items if isinstance(x, dict)] if isinstance(items, list) else []


def planner_counts(planner: dict | None) -> dict[str, int | None]:
    """Scaling events (up, down), worker starts, retune decisions (applied): every value None
    without a Planner; retune counts 0 when it does not retune."""
    if planner is None:
        return dict.fromkeys(PLANNER_METRICS)
    events = _dicts(planner.get("scaling_events"))
    retunes = _dicts(planner.get("retune_events"))  # null without retune: 0 decisions
    return {
        "scaling_events": len(events),
        "scale_ups": sum(e.get("reason") == "scale_up" for e in events),
        "scale_downs": sum(e.get("reason") == "scale_down" for e in events),
        "worker_starts": sum(t.get("transition") == "worker_starting"
                             for op in _dicts(planner.get("lifecycle_operations"))
                             for t in _dicts(op.get("transitions"))),
        "retune_decisions": len(retunes),
        "retune_applied": sum(e.get("outcome") == "applied" for e in retunes),
    }


def replica_steps(planner: dict | None, duration_ms: float) -> dict:
    """Per component (as its scaling events name it), its replica count as steps from 0 s to the
    end of the run (``times_s``, ``replicas``: the count from each time on; the last point repeats
    the final count at the end) and its events; the retune decisions as (time, outcome)."""
    if planner is None:
        return {"components": {}, "retune": []}
    events = sorted(_dicts(planner.get("scaling_events")), key=lambda e: e.get("at_s") or 0.0)
    comps: dict[str, dict] = {}
    for e in events:
        c = comps.setdefault(str(e.get("component")), {"times_s": [0.0], "replicas": [e.get("from_count")],
                                                         "events": []})
        at = float(e.get("at_s") or 0.0)
        c["times_s"].append(at)
        c["replicas"].append(e.get("to_count"))
        c["events"].append({"at_s": at, "reason": e.get("reason"), "to": e.get("to_count")})
    for c in comps.values():
        c["times_s"].append(duration_ms / 1000.0)
        c["replicas"].append(c["replicas"][-1])
    retune = [{"at_s": float(e.get("decided_at_s") or 0.0), "outcome": e.get("outcome")}
              for e in _dicts(planner.get("retune_events"))]
    return {"components": comps, "retune": retune}
