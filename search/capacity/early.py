"""Exact early decisions for capacity trials: a trial ends as soon as one SLA rule can no longer
pass, whatever the rest of the replay does (docs/early-stopping.md has the derivations).

A request rule ``{metric, quantile q, op, threshold T}`` is decided on the requests that have
ended (their metric values are final; a request that never completes fails every request rule,
``search.capacity.sla``). With ``N`` the requests the trial offers (an upper bound on the values
the quantile will see: ``n <= N``), sorted values ``x`` and ``h = (n - 1) q``, the linear
quantile lies in ``[x[floor(h)], x[ceil(h)]]`` (0-indexed), so:

- ``<=`` fails once ``N - floor((N - 1) q)`` values are ``> T`` (then ``x[floor(h)] > T``);
- ``<`` fails once that many values are ``>= T``;
- ``>=`` fails once ``ceil((N - 1) q) + 1`` values are ``< T`` (then ``x[ceil(h)] < T``);
- ``>`` fails once that many values are ``<= T``;
- any rejected request fails every request rule at once.

Both counts needed grow with ``n``, so using ``N`` for ``n`` only ever waits longer: a decision
taken is the decision of the full replay. At checkpoints (``simulator.checkpoints``) an upper-limit
rule on TTFT, the scheduling delay or E2E latency also counts the requests in flight whose value
is already past the threshold: no first token / not admitted / not finished after ``now -
arrival``, or a first token / first admission already there with a TTFT / delay past it (final:
the row computes it from the same two times); each either ends with such a value or never
completes, failing the rule either way.
``==`` rules and the queue rules (worker timelines) are never decided early; a trial that passes
always runs to the end. A threshold is compared with a relative margin of 1e-12 so a value equal
to it within rounding never decides.
"""

from __future__ import annotations

import math

from aisim.simulator.checkpoints import Monitor, as_row

__all__ = ["SlaMonitor", "needed", "proves"]

_EPS = 1e-12
TIME_CHECKPOINTS = 50  # checkpoints per arrival span of virtual time, besides one per 2% of the requests ended
# request metrics bounded below by the time a request has been in flight: metric -> (the
# in-flight tuple's field that must still be None for the bound, or None: always; the unit)
_ELAPSED = {"ttft_ms": (1, 1.0), "request_scheduling_delay": (2, 1000.0), "e2e_latency_ms": (None, 1.0)}


def needed(op: str, q: float, n: int) -> int | None:
    """Values beyond the threshold that prove rule ``op`` at quantile ``q`` fails over ``n``
    values (None: ``op`` is never decided early)."""
    if op in ("<=", "<"):
        return n - math.floor((n - 1) * q)
    if op in (">=", ">"):
        return math.ceil((n - 1) * q) + 1
    return None


def _beyond(op: str, threshold: float):
    """The test a final value must pass to count towards failing the rule."""
    margin = abs(threshold) * _EPS
    if op == "<=":
        return lambda v: v > threshold + margin
    if op == "<":
        return lambda v: v >= threshold + margin
    if op == ">=":
        return lambda v: v < threshold - margin
    return lambda v: v <= threshold - margin  # ">"


def proves(bound: dict | None, rule) -> bool:
    """Whether a trial decided early with ``bound`` (``_Rule.bound``'s; None: a request was rejected)
    fails ``rule`` too: any request rule after a rejection; else a rule on the same metric and
    quantile on the same side whose threshold the proved bound passes as well (a stricter one: the
    quantile is past ``T``, so past any ``T'`` nearer; at ``T' = T`` only where the proof's
    comparison is at least as strict as the rule's)."""
    if bound is None:
        return rule.kind == "request"
    if rule.kind != "request" or (rule.metric, rule.quantile) != (bound["metric"], bound["quantile"]):
        return False
    op, t, new = bound["op"], bound["threshold"], rule.threshold
    if op in ("<=", "<") and rule.op in ("<=", "<"):  # proved: quantile > t (>= t for "<")
        return new < t or (new == t and (op == "<=" or rule.op == "<"))
    if op in (">=", ">") and rule.op in (">=", ">"):  # proved: quantile < t (<= t for ">")
        return new > t or (new == t and (op == ">=" or rule.op == ">"))
    return False


class _Rule:
    def __init__(self, rule, num_requests: int, column: int) -> None:
        self.rule = rule
        self.column = column
        self.need = needed(rule.op, rule.quantile, num_requests)
        self.test = _beyond(rule.op, rule.threshold)
        self.count = 0

    def bound(self, num_requests: int) -> dict:
        r = self.rule
        negation = {"<=": ">", "<": ">=", ">=": "<", ">": "<="}[r.op]
        return {"metric": r.metric, "quantile": r.quantile, "op": r.op, "threshold": r.threshold,
                "proved": f"q{r.quantile:g} {r.metric} {negation} {r.threshold:g}",
                "values_beyond": self.count, "needed": self.need, "num_requests": num_requests}


class SlaMonitor(Monitor):
    """Stops a capacity trial once one of its request rules is certain to fail."""

    def __init__(self, rules, num_requests: int) -> None:
        from aisim.simulator.metrics.csv_out import REQUEST_CSV_COLUMNS

        super().__init__(num_requests, time_checkpoints=TIME_CHECKPOINTS)
        request_rules = [r for r in rules if r.kind == "request"]
        self.any_request_rule = bool(request_rules)
        self.rules = [_Rule(r, self.num_requests, REQUEST_CSV_COLUMNS.index(r.metric)) for r in request_rules
                      if needed(r.op, r.quantile, self.num_requests) is not None]
        self.decision: dict | None = None  # {reason, bound}: the rule proved to fail
        self._reason: str | None = None

    def observe(self, record: dict, row: tuple | None = None) -> None:
        if self._reason is not None:
            return
        row = as_row(record, row)
        if row[1] != "completed":
            if self.any_request_rule and row[1] == "rejected":
                self._decide(f"request {row[0]} was rejected: every request rule fails", None)
            return
        for r in self.rules:
            v = row[r.column]
            if v == "" or not r.test(v):
                continue
            r.count += 1
            if r.count >= r.need:
                b = r.bound(self.num_requests)
                self._decide(f"{b['proved']}: {r.count} of at most {self.num_requests} requests", b)
                return

    def at_checkpoint(self, now_ms: float, ended: int, in_flight) -> str | None:
        """Add the requests in flight whose value is already beyond an upper-limit rule's
        threshold: a request without a first token at ``now`` reports a TTFT >= now - arrival,
        one not yet admitted a scheduling delay >= that, any an E2E latency >= that; one with its
        first token (admission) reports the TTFT (delay) it has now (or it never completes,
        which fails the rule too)."""
        uppers = [r for r in self.rules if r.rule.op in ("<=", "<") and r.rule.metric in _ELAPSED]
        if not uppers:
            return None
        held = in_flight()
        for r in uppers:
            field, scale = _ELAPSED[r.rule.metric]
            test = r.test
            if field is None:
                extra = sum(1 for item in held if test((now_ms - item[0]) / scale))
            else:  # (a first token / admission already there: its value is final, as the row computes it)
                extra = sum(1 for item in held if test(((now_ms if item[field] is None else item[field]) - item[0])
                                                       / scale))
            if r.count + extra >= r.need:
                b = r.bound(self.num_requests)
                b["values_beyond"] = r.count + extra
                b["in_flight_beyond"] = extra
                self._decide(f"{b['proved']}: {r.count} ended and {extra} in flight of at most "
                             f"{self.num_requests} requests", b)
                return self._reason
        return None

    def _decide(self, reason: str, bound: dict | None) -> None:
        self._reason = reason
        self.decision = {"reason": reason, "bound": bound}

    def decided(self) -> str | None:
        return self._reason
