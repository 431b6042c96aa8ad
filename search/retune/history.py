"""The load predictor's history for a retune window, and the predictor pre-sweep.

History = the recorded history trace (``load_predictor_warmup_trace``, which ends at or before
the first replayed request) followed by the replayed trace's requests that arrived before a
time, bucketed per throughput interval on the trace's absolute timestamps (count, mean ISL, mean
OSL; an empty interval counts 0), the last ``history_seconds`` of it. Buckets are aligned on the
first replayed request, as the Planner's own intervals are; with a trace ``speedup`` they span
``interval x speedup`` of trace time (one interval of replay time).

Pre-sweep (reference §5.2): every preset of ``actors.planner.presets`` replays the history
ending at the window's end one interval at a time and is scored by its mean one-step loss after
a common warm-up (the error measure: a weighted |log1p(forecast) - log1p(actual)| of the
interval's token volumes (0.8) and mean lengths (0.2)); the lowest loss wins, ties to the earlier
preset, the current predictor's preset when nothing scores. One forecast task per preset.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from aisim.actors.planner.presets import PRESETS, common_warmup, preset_loss
from aisim.simulator.planning import interval_buckets

__all__ = ["interval_history", "presweep", "preset_fields", "preset_of"]


def interval_history(history, workload, speedup: float, interval_s: float, end_virtual_ms: float,
                     history_s: float) -> tuple[tuple[float, float, float], ...]:
    """The per-interval history up to ``end_virtual_ms`` of replay time (a multiple of the interval
    is assumed; a partial last interval is dropped), at most ``history_s`` of it. ``history``: the
    recorded history as a ``Workload`` (or None); ``workload``: the replayed one."""
    width = interval_s * 1000.0 * speedup  # trace ms per interval
    zero = workload.origin_ms + float(np.nanmin(workload.timestamp_ms)) if len(workload) else workload.origin_ms
    hi = int(math.floor(end_virtual_ms * speedup / width + 1e-9))
    lo = hi - max(1, int(math.floor(history_s / interval_s + 1e-9)))
    parts_t, parts_i, parts_o = [], [], []
    for w in (history, workload):
        if w is None or not len(w):
            continue
        parts_t.append(w.origin_ms + np.nan_to_num(w.timestamp_ms))
        parts_i.append(w.input_len.astype(np.float64))
        parts_o.append(w.output_len.astype(np.float64))
    if not parts_t:
        return ()
    t = np.concatenate(parts_t)
    first = int(math.floor((float(t.min()) - zero) / width))
    lo = max(lo, first)
    if lo >= hi:
        return ()
    return tuple(interval_buckets(t, np.concatenate(parts_i), np.concatenate(parts_o), zero, width, lo, hi))


def preset_fields(name: str) -> dict:
    """A preset as the Planner's runtime fields (``load_predictor``, ``load_predictor_log1p`` and the
    family's parameters)."""
    return PRESETS[name].describe()


def preset_of(fields: dict) -> str | None:
    """The preset whose fields ``fields`` hold (the family's own parameters compared), or None."""
    for name, spec in PRESETS.items():
        d = spec.describe()
        if all(fields.get(k) == v for k, v in d.items()):
            return name
    return None


def presweep(history: tuple, interval_s: float, fan=None, timeout_s: float | None = None) -> tuple[str | None, dict]:
    """(the winning preset or None when none scores, every preset's loss): one forecast task per
    preset, through ``fan`` (a ``search.fanout`` Fanout) when given, else in this process."""
    names = tuple(PRESETS)
    task = partial(preset_loss, history=list(history), interval_s=interval_s, warmup=common_warmup(names))
    out = fan.map(task, names, timeout_s) if fan is not None else [task(n) for n in names]
    losses = {n: (v if isinstance(v, float) else math.inf) for n, v in zip(names, out)}
    finite = [(loss, i, n) for i, (n, loss) in enumerate(losses.items()) if math.isfinite(loss)]
    return (min(finite)[2] if finite else None), losses

