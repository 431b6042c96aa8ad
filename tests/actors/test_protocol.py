"""actors.protocol: the same-time phases are the documented ones; messages cross msgpack in field order."""

from __future__ import annotations


def test_the_same_time_phases_are_the_ones_the_docs_list_in_order():
    import re

    from aisim.actors.protocol import Phase
    from tests.conftest import ROOT

    text = (ROOT / "docs" / "architecture.md").read_text()
    line = next(x for x in text.splitlines() if "PASS_END ->" in x)
    assert [p.strip() for p in line.split("->")] == [p.name for p in sorted(Phase)]
    rows = re.findall(r"^\| `([A-Z_]+)` \|", text, flags=re.M)
    assert rows[: len(Phase)] == [p.name for p in sorted(Phase)]


def test_a_host_output_crosses_msgpack_and_comes_back_with_named_statuses():
    import msgpack

    from aisim.actors.protocol import (
        EventKind,
        HostEvent,
        HostOutput,
        KvUpdate,
        Phase,
        UpdateKind,
        WorkerStatus,
        host_output_from_wire,
    )

    kv = KvUpdate("aggregated", UpdateKind.KV, 3, [(0, 1, b"\x01")])
    out = HostOutput([HostEvent(5.0, Phase.PASS_END, 3, 0, EventKind.FIRST_TOKEN, 17)], [kv],
                     [WorkerStatus(3, True, True, 9.5, 0, 1)], 10.0, None)
    back = host_output_from_wire(msgpack.unpackb(msgpack.packb(out, use_bin_type=True), raw=False))
    assert back.reached == 10.0 and back.status == [WorkerStatus(3, True, True, 9.5, 0, 1)]
    assert back.status[0].next_event_ms == 9.5 and back.status[0].pending == 1
    assert [tuple(e) for e in back.events] == [tuple(e) for e in out.events]  # field order is the wire form
    assert [tuple(k) for k in back.kv] == [("aggregated", 0, 3, [[0, 1, b"\x01"]])]


def test_every_input_the_coordinator_sends_is_a_host_input(monkeypatch):
    """The coordinator builds its host inputs as exact tuples (the hosts keep them so); each one
    has HostInput's fields, in its order, with a known op and phase."""
    from aisim import load_config, plan_from_config, run_plan
    from aisim.actors.protocol import HostInput, Op, Phase
    from aisim.simulator.coordinator import Coordinator
    from tests.conftest import ROOT

    sent = []
    original = Coordinator._send

    def spy(self, wid, item):
        sent.append((wid, item))
        original(self, wid, item)

    monkeypatch.setattr(Coordinator, "_send", spy)
    cfg, cdir = load_config(ROOT / "configs" / "disaggregated-1p1d.yaml", ["traffic.stop.max_virtual_time_seconds=20"])
    run_plan(plan_from_config(cfg, cdir))
    ops = set()
    for wid, item in sent:
        msg = HostInput._make(item)
        assert type(item) is tuple and msg.worker_id == wid and isinstance(msg.at_ms, float)
        assert msg.op in set(Op) and Phase(msg.phase) in (Phase.ARRIVAL, Phase.TRANSFER)
        if msg.op == Op.ENQUEUE:
            assert msg.payload.index == msg.source_id or msg.phase == Phase.TRANSFER
            assert msg.transferred == (msg.phase == Phase.TRANSFER)
        ops.add((Phase(msg.phase), Op(msg.op)))
    assert ops == {(Phase.ARRIVAL, Op.ENQUEUE), (Phase.TRANSFER, Op.RELEASE), (Phase.TRANSFER, Op.ENQUEUE)}
