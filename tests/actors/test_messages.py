"""Messages survive msgpack unchanged: what the Ray runtime sends is what the actors read."""

from __future__ import annotations

import msgpack

from aisim.actors.engine.request import Request, apply_wire_progress, request_from_wire, request_to_wire
from aisim.actors.messages import (
    Capabilities,
    Decision,
    Fpm,
    RoleState,
    Snapshot,
    TrafficWindow,
    decision_from_wire,
    decision_to_wire,
    snapshot_from_wire,
    snapshot_to_wire,
    traffic_from_wire,
    traffic_to_wire,
)


def roundtrip(obj):
    return msgpack.unpackb(msgpack.packb(obj, use_bin_type=True), raw=False, strict_map_key=False)


def test_a_request_crosses_the_wire_with_its_progress_and_admissions():
    req = Request(7, None, 12.5, 1500, 200, session_id="s1", turn_index=2)
    req.num_computed, req.num_generated, req.prefill_done, req.worker, req.rank = 1500, 3, True, 4, 1
    req.first_admit_ms, req.first_token_ms, req.second_token_ms, req.last_token_ms = 13.0, 90.5, 99.25, 120.125
    req.admissions = [(13.0, 512, "agg"), (400.0, 0, "agg")]
    req.materialized = True
    back = request_from_wire(roundtrip(request_to_wire(req)), source=None)
    for f in ("index", "arrival_ms", "prompt_len", "max_output", "session_id", "turn_index", "num_computed",
              "num_generated", "prefill_done", "worker", "rank", "first_admit_ms", "first_token_ms",
              "second_token_ms", "last_token_ms", "terminal_ms", "materialized", "reject_reason", "reject_detail",
              "admissions"):
        assert getattr(back, f) == getattr(req, f), f
    other = Request(7, None, 12.5, 1500, 200)
    other.routing = [{"pool": "agg"}]
    apply_wire_progress(other, roundtrip(request_to_wire(req)))
    assert other.routing == [{"pool": "agg"}] and other.admissions == req.admissions  # identity and routing stay


def test_snapshot_traffic_and_decision_cross_the_wire():
    fpm = Fpm(3, 0, 17, 0.0123, 1, 2048, 512, 0.0, 12, 40960, 1.5e6, 2, 3000, 250.0, 1, 900, 0.0)
    snap = Snapshot(5000.0, {"decode": RoleState([0, 3], [4], [1], [fpm], Capabilities(8192, 256, 131072, 1871936))})
    back = snapshot_from_wire(roundtrip(snapshot_to_wire(snap)))
    assert back.now_ms == 5000.0 and back.traffic is None
    assert back.roles["decode"].fpms == [fpm] and back.roles["decode"].caps == snap.roles["decode"].caps
    assert back.roles["decode"].topology() == snap.roles["decode"].topology()
    w = TrafficWindow(180.0, 420, 11000.5, 350.25, 812.0, None, 0.25)
    assert traffic_from_wire(roundtrip(traffic_to_wire(w))) == w and traffic_from_wire(None) is None
    d = Decision(None, 3, 15000.0)
    assert decision_from_wire(roundtrip(decision_to_wire(d))) == d


def test_a_rejected_request_crosses_the_wire_with_its_reason():
    req = Request(3, None, 0.0, 50000, 10)
    req.status, req.terminal_ms = 3, 5.0
    req.reject_reason, req.reject_detail = "context_length", "prompt of 50,000 tokens >= context length 40,960"
    back = request_from_wire(roundtrip(request_to_wire(req)), source=None)
    assert (back.status, back.reject_reason, back.reject_detail) == (3, req.reject_reason, req.reject_detail)
    other = Request(3, None, 0.0, 50000, 10)
    assert other.reject_reason is None and other.reject_detail is None
    apply_wire_progress(other, roundtrip(request_to_wire(req)))
    assert (other.reject_reason, other.reject_detail) == (req.reject_reason, req.reject_detail)

