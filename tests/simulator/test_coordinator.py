"""The coordinator over in-process runtimes: one host called directly (requests shared as
objects) and three hosts with every message through msgpack give byte-identical reports, for
exact lockstep (router_sync_ms 0) and for windows; every coordinator path is exercised."""

from __future__ import annotations

import dataclasses
from bisect import bisect_right

import pytest

from aisim import ExecutionPlan, plan_from_config, run_plan, run_synthetic_trace_replay, run_trace_replay
from aisim.actors.engine.worker import EngineWorker
from aisim.simulator import coordinator
from aisim.simulator.config.loading import load_config
from aisim.simulator.metrics.output import canonical_json
from tests.conftest import ROOT, SLICE
from tests.helpers import by_uuid, without_wall, write_trace

CONFIGS = ROOT / "configs"
SLICE_SETS = ["traffic.stop={max_virtual_time_seconds: 90}"]
SESSIONS = ("traffic.source={type: synthetic-session, new_input_tokens_per_turn: 700, output_tokens_per_turn: 90, "
            "session: {turns: 3}, shared_prefix_ratio: 0.3, prefix_groups: 4, inter_turn_delay_ms: 500}")
PLANNER_SLICE = ["traffic.source.paths=[data/conversation_slice.jsonl]", "traffic.stop={max_virtual_time_seconds: 150}"]

# name -> (config, overrides): every coordinator path (routers, ranks, disaggregation, closed
# loops, session turns, the stop time, the Planner adding, starting and draining workers)
CASES = {
    "round_robin": ("quickstart.yaml", SLICE_SETS),
    "kv_router_4": ("quickstart.yaml", SLICE_SETS + ["router={policy: kv_router}",
                                                     "engine.workers.aggregated.parallelism.replicas=4"]),
    "kv_router_dp": ("quickstart.yaml", SLICE_SETS + [
        "router={policy: kv_router, temperature: 0.3}",
        "engine.workers.aggregated.parallelism={replicas: 2, attention_data: 2}"]),
    # host (G2) KV tiers: per rank pools with the KV router weighing them, and one shared pool
    "offload_kv_router": ("quickstart.yaml", SLICE_SETS + [
        "router={policy: kv_router}", "engine.workers.aggregated.parallelism={replicas: 3, attention_data: 2}",
        "engine.workers.aggregated.kv_cache={block_size: 64, capacity: {type: fixed, blocks: 1500}, "
        "host_offload: {num_host_blocks: 8000, d2h_bandwidth_gbps: 8}}"]),
    "offload_shared": ("quickstart.yaml", SLICE_SETS + [
        "engine.workers.aggregated.parallelism.replicas=3",
        "engine.workers.aggregated.kv_cache={block_size: 64, capacity: {type: fixed, blocks: 2500}, "
        "host_offload: {scope: cluster_shared, num_host_blocks: 20000, shared_h2d_bandwidth_gbps: 20}}"]),
    "offload_shared_kv_router": ("quickstart.yaml", SLICE_SETS + [
        "router={policy: kv_router}", "engine.workers.aggregated.parallelism.replicas=3",
        "engine.workers.aggregated.kv_cache={block_size: 64, capacity: {type: fixed, blocks: 1200}, "
        "host_offload: {scope: cluster_shared, num_host_blocks: 20000, shared_h2d_bandwidth_gbps: 20}}"]),
    # the Planner adds workers to a shared pool's deployment: the KV router's one view of the pool
    "offload_shared_planner": ("planner-aggregated.yaml", PLANNER_SLICE + [
        "engine.workers.aggregated.startup_seconds=20", "planner.target=load",
        "planner.load_adjustment_interval_seconds=2", "router={policy: kv_router}",
        "engine.workers.aggregated.kv_cache={block_size: 64, capacity: {type: fixed, blocks: 1200}, "
        "host_offload: {scope: cluster_shared, num_host_blocks: 3000, shared_h2d_bandwidth_gbps: 20}}"]),
    # per-rank pools on both roles: a handed-off request's tier state is each rank's own
    "offload_2p2d": ("disaggregated-1p1d.yaml", SLICE_SETS + [
        "engine.workers.prefill.parallelism.replicas=2", "engine.workers.decode.parallelism.replicas=2",
        "engine.workers.prefill.kv_cache={block_size: 64, capacity: {type: fixed, blocks: 600}, "
        "host_offload: {num_host_blocks: 6000}}",
        "engine.workers.decode.kv_cache.host_offload={num_host_blocks: 6000}"]),
    # speculative decoding: MTP on attention-DP ranks with the KV router; n-gram drafts on the decode role
    "mtp_kv_router_dp": ("quickstart.yaml", SLICE_SETS + [
        "engine.nextn=2", "engine.nextn_accepted=1.4", "engine.workers.aggregated.timing={type: default}",
        "router={policy: kv_router}", "engine.workers.aggregated.parallelism={replicas: 2, attention_data: 2}"]),
    "ngram_2p2d": ("disaggregated-1p1d.yaml", SLICE_SETS + [
        "engine.speculation={kind: ngram, num_speculative_tokens: 3, acceptance_rates: [0.8, 0.6, 0.4]}",
        "engine.workers.prefill.parallelism.replicas=2", "engine.workers.decode.parallelism.replicas=2",
        "engine.workers.decode.timing={type: default}"]),
    "sglang_dp": ("quickstart.yaml", SLICE_SETS + [
        "engine.backend=sglang", "engine.workers.aggregated.kv_cache={block_size: 1, capacity: {type: fixed, "
        "blocks: 60000}}", "engine.workers.aggregated.parallelism={replicas: 3, attention_data: 2}"]),
    "sglang_kv_router": ("quickstart.yaml", SLICE_SETS + [
        "engine.backend=sglang", "engine.workers.aggregated.kv_cache={block_size: 16, capacity: {type: fixed, "
        "blocks: 3000}}", "engine.workers.aggregated.parallelism.replicas=4", "router={policy: kv_router}"]),
    "sglang_2p2d": ("disaggregated-1p1d.yaml", SLICE_SETS + [
        "engine.backend=sglang", "engine.workers.prefill.parallelism.replicas=2",
        "engine.workers.decode={parallelism: {replicas: 2}, kv_cache: {block_size: 64, capacity: {type: fixed, "
        "blocks: 1500}}, timing: {type: polynomial}}"]),
    "disaggregated_2p2d": ("disaggregated-1p1d.yaml", SLICE_SETS + [
        "engine.workers.prefill.parallelism.replicas=2", "engine.workers.decode.parallelism.replicas=2"]),
    "closed_loop": ("quickstart.yaml", [
        "traffic.source={type: synthetic, input_tokens: 1500, output_tokens: 200, cached_prefix_tokens: 512}",
        "traffic.load={type: concurrency, concurrency: 24}", "traffic.stop={requests: 300}",
        "router={policy: kv_router}"]),
    "sessions": ("quickstart.yaml", [SESSIONS, "traffic.load={type: poisson, sessions_per_second: 6}",
                                     "traffic.stop={sessions: 60}", "router={policy: kv_router}"]),
    "planner_aggregated": ("planner-aggregated.yaml", PLANNER_SLICE + [
        "engine.workers.aggregated.startup_seconds=20", "planner.target=load",
        "planner.load_adjustment_interval_seconds=2"]),
    "planner_sla": ("planner-aggregated-fp8.yaml", PLANNER_SLICE),
    "sglang_planner": ("planner-disaggregated.yaml", PLANNER_SLICE + ["engine.backend=sglang"]),
    "planner_disaggregated": ("planner-disaggregated.yaml", PLANNER_SLICE + [
        "planner.target=load", "planner.load_adjustment_interval_seconds=2",
        "engine.workers.decode.startup_seconds=10"]),
}


def replay(name: str, **execution):
    cfg_file, sets = CASES[name]
    cfg, cdir = load_config(CONFIGS / cfg_file, sets)
    plan = plan_from_config(cfg, cdir, capture_per_request=True)
    return run_plan(dataclasses.replace(plan, execution=ExecutionPlan(**execution)))


def same(a, b) -> bool:
    return canonical_json(without_wall(a.to_dict())) == canonical_json(without_wall(b.to_dict()))


@pytest.mark.parametrize("name", list(CASES))
def test_direct_objects_and_three_hosts_over_the_wire_agree_byte_for_byte(name):
    direct = replay(name)
    wired = replay(name, engine_actors=3, wire=True)
    assert direct.diagnostics["runtime"]["num_hosts"] == 1
    # (a shared KV tier is one state: its deployment's workers share one host, over the wire too)
    assert wired.diagnostics["runtime"]["num_hosts"] == (1 if name.startswith("offload_shared") else 3)
    assert same(direct, wired)


def test_the_paths_the_cases_exercise():
    agg = replay("planner_aggregated").planner
    transitions = {t["transition"] for op in agg["lifecycle_operations"] for t in op["transitions"]}
    assert {"worker_starting", "worker_ready", "worker_draining", "worker_removed"} <= transitions
    # (workers added to a shared host pool while the KV router weighs it, and routed to)
    shared = replay("offload_shared_planner")
    added = {t["worker_id"] for op in shared.planner["lifecycle_operations"] for t in op["transitions"]
             if t["transition"] == "worker_ready"}
    on_added = [r for r in shared.per_request if r["decode_worker_idx"] in added]
    assert added and added <= {r["decode_worker_idx"] for r in on_added}
    assert any(r["routing_history"][0]["selected_overlap_blocks"] and r["first_admission_host_reused_input_tokens"]
               for r in on_added)
    closed = replay("closed_loop").summary
    assert closed["completed_requests"] == 300


@pytest.mark.parametrize("name", ["kv_router_dp", "disaggregated_2p2d", "sessions"])
def test_a_window_gives_the_same_result_on_one_host_or_three_over_the_wire(name):
    one = replay(name, router_sync_ms=40)
    three = replay(name, router_sync_ms=40, engine_actors=3, wire=True)
    assert one.summary["deployment"]["router_sync_ms"] == 40.0
    assert same(one, three)


def test_a_window_changes_nothing_when_the_router_reads_no_worker_state():
    exact = replay("round_robin")
    windowed = replay("round_robin", router_sync_ms=100)
    a, b = without_wall(exact.to_dict()), without_wall(windowed.to_dict())
    a["summary"]["deployment"].pop("router_sync_ms")
    b["summary"]["deployment"].pop("router_sync_ms")
    assert canonical_json(a) == canonical_json(b)
    # no window edges: every arrival is routed up front; the only edges are the start and the stop
    assert windowed.diagnostics["runtime"]["num_edges"] == 2


@pytest.mark.parametrize("name", ["round_robin", "disaggregated_2p2d", "sessions"])
def test_routing_ahead_a_few_arrivals_at_a_time_changes_nothing(monkeypatch, name):
    """A trace's arrivals are taken from their arrays, and routed ahead, ARRIVAL_WINDOW at a time
    (bounded memory for any trace size): an edge every 7 arrivals gives the same report."""
    from aisim.simulator import coordinator

    whole = replay(name)
    monkeypatch.setattr(coordinator, "ARRIVAL_WINDOW", 7)
    windowed = replay(name)
    assert same(whole, windowed)
    if name == "round_robin":  # (the edges routing ahead takes: about one each 7 arrivals, fewer where
        # arrivals share a time stamp)
        assert whole.diagnostics["runtime"]["num_edges"] == 2
        assert windowed.diagnostics["runtime"]["num_edges"] >= whole.summary["num_requests"] // 14


FIXED = {"timing_model": {"type": "fixed", "prefill_ms": 100, "decode_ms": 10}}


def test_a_closed_loop_follow_up_waits_for_the_window_end():
    # request 0: prefill 0-100 (first token), decode 100-110, 110-120: done at 120, when request 1 arrives
    kw = dict(extra_engine_args=FIXED, replay_concurrency=1, capture_per_request=True)
    exact = by_uuid(run_synthetic_trace_replay(512, 3, 2, **kw))
    assert exact["req-0000001"]["arrival_time_ms"] == 120.0 and exact["req-0000001"]["ttft_ms"] == 100.0
    late = by_uuid(run_synthetic_trace_replay(512, 3, 2, router_sync_ms=50, **kw))
    r = late["req-0000001"]
    # the completion at 120 lies in the window [100, 150): the router learns of it at 150
    assert (r["arrival_time_ms"], r["dispatched_at_ms"], r["first_token_ms"]) == (120.0, 150.0, 250.0)
    assert r["ttft_ms"] == 130.0
    assert late["req-0000000"]["ttft_ms"] == 100.0


def test_a_handoff_is_placed_at_the_window_end(tmp_path):
    trace = write_trace(tmp_path / "t.jsonl", [{"timestamp": 0, "input_length": 128, "output_length": 2,
                                                "hash_ids": [1], "request_id": "r1"}])
    kw = dict(prefill_engine_args=FIXED, decode_engine_args=FIXED, capture_per_request=True)
    exact = by_uuid(run_trace_replay(str(trace), **kw))["r1"]
    assert exact["ttft_ms"] == 110.0  # prefill 100 + the decode worker's first pass 10
    late = by_uuid(run_trace_replay(str(trace), router_sync_ms=30, **kw))["r1"]
    # the prompt finishes at 100, inside [90, 120): the decode worker is chosen at 120
    assert (late["source_held_ms"], late["destination_reserved_ms"], late["destination_activated_ms"]) == (
        100.0, 120.0, 120.0)
    assert late["ttft_ms"] == 130.0 and late["decode_admit_ms"] == 120.0


def test_kv_router_routes_a_window_against_its_view_at_the_window_start(tmp_path):
    # B repeats A's prompt after A's prefill ended (its blocks are cached and published at 100)
    rows = [{"timestamp": 0, "input_length": 2048, "output_length": 2, "hash_ids": [1, 2, 3, 4], "request_id": "A"},
            {"timestamp": 150, "input_length": 2048, "output_length": 2, "hash_ids": [1, 2, 3, 4], "request_id": "B"}]
    trace = write_trace(tmp_path / "t.jsonl", rows)
    kw = dict(extra_engine_args={**FIXED, "block_size": 64}, num_workers=2, router_mode="kv_router",
              capture_per_request=True)
    exact = by_uuid(run_trace_replay(str(trace), **kw))
    assert exact["B"]["decode_worker_idx"] == exact["A"]["decode_worker_idx"]
    assert exact["B"]["reused_input_tokens"] == 1984  # every full block but the last
    stale = by_uuid(run_trace_replay(str(trace), router_sync_ms=200, **kw))
    # both routed at 0: the router has seen no KV event yet and counts A's pending prefill
    assert stale["B"]["routing_history"][0]["selected_overlap_blocks"] == 0
    assert stale["B"]["decode_worker_idx"] != stale["A"]["decode_worker_idx"]
    assert stale["B"]["reused_input_tokens"] == 0
    assert stale["B"]["dispatched_at_ms"] == 150.0  # routed early, dispatched on arrival


def test_windows_without_arrivals_take_no_edge_and_change_nothing(tmp_path):
    # arrivals at window starts (W = 100): each is routed at its window's start, as exact lockstep
    # routes it at its arrival; in between the workers stay busy (200 output tokens: prefill 100 ms,
    # then 199 passes of 10 ms), yet only the windows holding arrivals take edges, at their start and
    # end: 0 and 100, 1000 and 1100, 2500 and 2600 (38 before: each window in which passes ended)
    rows = [{"timestamp": t, "input_length": 2048, "output_length": 200, "hash_ids": [1, 2, 3, 4], "request_id": r}
            for t, r in ((0, "A"), (1000, "B"), (2500, "C"))]
    trace = write_trace(tmp_path / "t.jsonl", rows)
    kw = dict(extra_engine_args={**FIXED, "block_size": 64}, num_workers=2, router_mode="kv_router",
              capture_per_request=True)
    exact = run_trace_replay(str(trace), **kw)
    windowed = run_trace_replay(str(trace), router_sync_ms=100, **kw)
    assert windowed.diagnostics["runtime"]["num_edges"] == 6
    a, b = without_wall(exact.to_dict()), without_wall(windowed.to_dict())
    assert b["summary"]["deployment"].pop("router_sync_ms") == 100
    a["summary"]["deployment"].pop("router_sync_ms")
    assert canonical_json(a) == canonical_json(b)
    assert [r["routing_history"][0]["released_at_ms"] for r in b["per_request"]] == [0.0, 1000.0, 2500.0]


@pytest.mark.parametrize("window_ms", [0, 25])
def test_the_kv_router_hears_a_busy_worker_later_only_where_no_route_can_tell(monkeypatch, window_ms):
    # open loop, edges placed by arrivals alone (exact, or windows): at each edge the router
    # reads the blocks of the prompts it routes there, and a busy worker whose KV events up to
    # it cannot change them is brought up later (EngineWorker.router_unchanged); 4 workers of
    # 700 blocks, so decode runs evict cached prompts. Byte-identical to bringing every busy
    # worker up at every edge; leaving every such sync for later whatever the evictions (only
    # a completion syncing) is not.
    sets = ["traffic.stop={max_virtual_time_seconds: 200}", "router={policy: kv_router}",
            "engine.workers.aggregated.parallelism.replicas=4",
            "engine.workers.aggregated.kv_cache={block_size: 64, capacity: {type: fixed, blocks: 700}}"]
    cfg, cdir = load_config(CONFIGS / "quickstart.yaml", sets)
    plan = plan_from_config(cfg, cdir, capture_per_request=True)
    plan = dataclasses.replace(plan, execution=ExecutionPlan(router_sync_ms=window_ms))
    answers = []
    watched = []
    checked = EngineWorker.router_unchanged

    def counted(self, now_ms, watch):
        watched.append(len(watch.raw))  # (bytes of the hashes)
        answers.append(checked(self, now_ms, watch))
        return answers[-1]

    def careless(self, now_ms, watch):
        run = self._run
        return run is not None and not (run.next_exit < len(run.exit_passes)
                                        and run.exit_passes[run.next_exit] < bisect_right(run.ends, now_ms))

    monkeypatch.setattr(EngineWorker, "router_unchanged", counted)
    later = run_plan(plan)
    assert answers.count(True) > 200 and answers.count(False) > 10 and max(watched) > 0
    # past WATCH_ARRIVALS arrivals at once the hosts are not told the blocks: all are synced
    # (only edges without arrivals, such as the stop time's, come with their empty set)
    monkeypatch.setattr(coordinator, "WATCH_ARRIVALS", 0)
    checks = len(answers)
    assert same(later, run_plan(plan)) and not any(watched[checks:])
    monkeypatch.undo()
    monkeypatch.setattr(EngineWorker, "router_unchanged", lambda self, now_ms, watch: False)
    assert same(later, run_plan(plan))
    monkeypatch.setattr(EngineWorker, "router_unchanged", careless)
    assert not same(later, run_plan(plan))


def test_router_sync_ms_is_validated():
    with pytest.raises(Exception, match="router_sync_ms"):
        run_trace_replay(str(SLICE), router_sync_ms=-1)


@pytest.mark.parametrize("name", ["disaggregated_2p2d", "planner_aggregated"])
def test_worker_timelines_agree_across_runtimes_and_cover_each_workers_provisioned_time(name):
    def run(**execution):
        cfg_file, sets = CASES[name]
        cfg, cdir = load_config(CONFIGS / cfg_file, sets)
        plan = plan_from_config(cfg, cdir, capture_worker_timeline=True)
        return run_plan(dataclasses.replace(plan, execution=ExecutionPlan(**execution)))

    direct, wired = run(), run(engine_actors=3, wire=True)
    rows = [tl.to_rows() for tl in direct.timelines]
    assert rows == [tl.to_rows() for tl in wired.timelines]
    assert same(direct, wired) and direct.to_dict() == dataclasses.replace(direct, timelines=None).to_dict()
    assert any(r[4] > 0 for tl in rows for r in tl)  # somebody queued
    if name == "planner_aggregated":
        added = [op for op in direct.planner["lifecycle_operations"] for t in op["transitions"]
                 if t["transition"] == "worker_starting"]
        first = added[0]
        wid = first["transitions"][0]["worker_id"]
        timeline = next(tl for tl in direct.timelines if tl.worker_id == wid)
        assert timeline.intervals()[0].start_ms == first["at_ms"]  # from when it was added, not from 0
