"""Turn the ``traffic`` section into a workload, an arrival process and a stop time."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aisim.actors import hashing
from aisim.simulator.config import models as m
from aisim.simulator.errors import InputError
from aisim.simulator.traffic.arrivals import ArrivalProcess, ClosedLoop, constant_times, poisson_times, trace_times
from aisim.simulator.traffic.traces import read_dynamo, read_mooncake, resolve_trace_paths
from aisim.simulator.traffic.workload import OUTPUT_TAG, UNIQUE_PROMPT_TAG, Workload

SHARED_PREFIX_TAG = 0x0_0999


@dataclass(frozen=True)
class TrafficPlan:
    """What a replay offers: a value, built and validated once, that any number of runs share.
    Each run takes its own arrival state from ``arrivals.start()``."""

    workload: Workload
    arrivals: ArrivalProcess  # immutable description; ``start()`` gives one run's state
    stop_ms: float | None
    unit: str  # "requests" or "sessions"
    description: str


def _count(stop: m.Stop, unit: str, load_unit: float, source: str) -> int:
    plain, per = (stop.requests, stop.requests_per_load_unit) if unit == "requests" else (stop.sessions, stop.sessions_per_load_unit)
    other = (stop.sessions, stop.sessions_per_load_unit) if unit == "requests" else (stop.requests, stop.requests_per_load_unit)
    if any(v is not None for v in other):
        wrong = "sessions" if unit == "requests" else "requests"
        raise InputError(f"traffic.stop.{wrong}", f"{source} traffic counts {unit}; use traffic.stop.{unit} "
                                                  f"or traffic.stop.{unit}_per_load_unit")
    if (plain is None) == (per is None):
        raise InputError("traffic.stop", f"{source} traffic needs exactly one of stop.{unit} or stop.{unit}_per_load_unit")
    return plain if plain is not None else max(1, round(per * load_unit))


def _load_unit(load) -> float:
    if isinstance(load, m.ConcurrencyLoad):
        return float(load.concurrency)
    if isinstance(load, (m.PoissonLoad, m.ConstantRateLoad)):
        return float(load.rate)
    return 1.0


def synthetic_workload(count: int, input_tokens: int, output_tokens: int, cached_prefix_tokens: int = 0) -> Workload:
    """Independent fixed-length requests; ``cached_prefix_tokens`` is a prefix shared by all."""
    idx = np.arange(count, dtype=np.int64)
    uniq = input_tokens - cached_prefix_tokens
    per = (1 if cached_prefix_tokens else 0) + (1 if uniq else 0)
    src = np.empty(count * per, dtype=np.uint64)
    lens = np.empty(count * per, dtype=np.int64)
    k = 0
    if cached_prefix_tokens:
        src[0::per] = hashing.unique_sources(SHARED_PREFIX_TAG, np.zeros(1, dtype=np.int64))[0]
        lens[0::per] = cached_prefix_tokens
        k = 1
    if uniq:
        src[k::per] = hashing.unique_sources(UNIQUE_PROMPT_TAG, idx)
        lens[k::per] = uniq
    return Workload(
        input_len=np.full(count, input_tokens, dtype=np.int64),
        output_len=np.full(count, output_tokens, dtype=np.int64),
        timestamp_ms=np.full(count, np.nan),
        piece_ptr=np.arange(count + 1, dtype=np.int64) * per,
        piece_src=src,
        piece_len=lens,
        description=f"synthetic {input_tokens}/{output_tokens}",
    )


def session_workload(src_cfg: m.SyntheticSessionSource, sessions: int) -> Workload:
    """Sessions of ``turns`` turns; turn k's prompt = every earlier prompt and output + new input."""
    turns = src_cfg.session.turns
    new_in = src_cfg.new_input_tokens_per_turn
    out = src_cfg.output_tokens_per_turn
    n = sessions * turns
    out_src = hashing.unique_sources(OUTPUT_TAG, np.arange(n, dtype=np.int64))
    new_src = hashing.unique_sources(UNIQUE_PROMPT_TAG, np.arange(n, dtype=np.int64))
    groups = src_cfg.prefix_groups
    shared = int(src_cfg.shared_prefix_ratio * new_in) if groups else 0
    group_src = hashing.unique_sources(SHARED_PREFIX_TAG, np.arange(max(groups, 1), dtype=np.int64))
    srcs: list[int] = []
    lens: list[int] = []
    ptr = [0]
    inputs = []
    for s in range(sessions):
        prefix_src: list[int] = []
        prefix_len: list[int] = []
        for t in range(turns):
            r = s * turns + t
            if t == 0 and shared:
                prefix_src.append(int(group_src[s % groups]))
                prefix_len.append(shared)
                if new_in - shared:
                    prefix_src.append(int(new_src[r]))
                    prefix_len.append(new_in - shared)
            else:
                prefix_src.append(int(new_src[r]))
                prefix_len.append(new_in)
            srcs.extend(prefix_src)
            lens.extend(prefix_len)
            ptr.append(len(srcs))
            inputs.append(sum(prefix_len))
            prefix_src.append(int(out_src[r]))  # the next turn's prompt carries this output
            prefix_len.append(out)
    sess = np.repeat(np.arange(sessions, dtype=np.int64), turns)
    return Workload(
        input_len=np.array(inputs, dtype=np.int64),
        output_len=np.full(n, out, dtype=np.int64),
        timestamp_ms=np.full(n, np.nan),
        piece_ptr=np.array(ptr, dtype=np.int64),
        piece_src=np.array(srcs, dtype=np.uint64),
        piece_len=np.array(lens, dtype=np.int64),
        session_index=sess,
        turn_index=np.tile(np.arange(turns, dtype=np.int64), sessions),
        delay_ms=np.where(np.tile(np.arange(turns), sessions) > 0, src_cfg.inter_turn_delay_ms, np.nan),
        session_names=[f"session-{s:06d}" for s in range(sessions)],
        description=f"synthetic sessions {sessions}x{turns} turns",
    )


def _starter_count(w: Workload) -> int:
    if not w.has_sessions():
        return w.num_requests
    return int((w.turn_index == 0).sum()) if w.turn_index is not None else w.num_requests


def open_loop(w: Workload, times_for_starters: np.ndarray, delay_scale: float = 1.0) -> ArrivalProcess:
    full = np.zeros(w.num_requests)
    starters = np.nonzero(w.turn_index == 0)[0] if w.has_sessions() else np.arange(w.num_requests)
    full[starters] = times_for_starters[: len(starters)]
    return ArrivalProcess(w, full, delay_scale=delay_scale)


def build_traffic(traffic: m.Traffic, config_dir: Path | None) -> TrafficPlan:
    src = traffic.source
    load = traffic.load
    stop = traffic.stop
    if isinstance(load, m.KvCapacityFractionLoad):
        raise InputError("traffic.load.type", "kv_capacity_fraction is only available to recommend; "
                                               "use concurrency, poisson, constant_rate or trace_timestamps")
    if isinstance(src, m.TraceSource):
        for k in ("requests", "requests_per_load_unit", "sessions", "sessions_per_load_unit"):
            if getattr(stop, k) is not None:
                raise InputError(f"traffic.stop.{k}", "traces accept only traffic.stop.max_virtual_time_seconds; "
                                                      "they run to the end of the trace otherwise")
        paths = resolve_trace_paths(src.paths, "traffic.source.paths", config_dir)
        if src.format == "dynamo":
            w = read_dynamo(paths)
        else:
            w = read_mooncake(paths, src.block_size, need_timestamps=isinstance(load, m.TraceTimestampsLoad))
        unit = "sessions" if w.has_sessions() else "requests"
    else:
        if isinstance(load, m.TraceTimestampsLoad):
            raise InputError("traffic.load.type", "trace_timestamps needs a trace source; use concurrency, poisson or constant_rate")
        if isinstance(src, m.SyntheticSource):
            unit = "requests"
            n = _count(stop, unit, _load_unit(load), "synthetic")
            w = synthetic_workload(n, src.input_tokens, src.output_tokens, src.cached_prefix_tokens)
        else:
            unit = "sessions"
            n = _count(stop, unit, _load_unit(load), "synthetic-session")
            w = session_workload(src, n)
    if isinstance(load, (m.PoissonLoad, m.ConstantRateLoad)):
        given = "requests" if load.requests_per_second is not None else "sessions"
        if given != unit:
            raise InputError(f"traffic.load.{given}_per_second", f"this traffic arrives in {unit}; "
                                                                  f"set {unit}_per_second instead")
    stop_ms = stop.max_virtual_time_seconds * 1000.0 if stop.max_virtual_time_seconds is not None else None

    starters = _starter_count(w)
    if isinstance(load, m.ConcurrencyLoad):
        arrivals: ArrivalProcess = ClosedLoop(w, load.concurrency)
        desc = f"concurrency {load.concurrency}"
    elif isinstance(load, m.PoissonLoad):
        arrivals = open_loop(w, poisson_times(starters, load.rate, load.seed))
        desc = f"poisson {load.rate}/s"
    elif isinstance(load, m.ConstantRateLoad):
        arrivals = open_loop(w, constant_times(starters, load.rate))
        desc = f"constant {load.rate}/s"
    else:
        arrivals = ArrivalProcess(w, trace_times(w, load.speedup), delay_scale=load.speedup)
        desc = f"trace timestamps x{load.speedup}"
    return TrafficPlan(w, arrivals, stop_ms, unit, f"{w.description}, {desc}")
