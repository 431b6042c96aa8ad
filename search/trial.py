"""One trial: a replay plan run once, its outcome as plain data.

A search runs many replays and decides from their outcomes, so a trial never raises: whatever a run
raises becomes a ``TrialResult`` with status ``failed``, the error's ``category`` (see
``simulator.errors``) and its one-line message. Results are plain types (str, float, dicts of
numbers), so they pickle, msgpack (``to_dict``) and cache as they are.

A trial is deterministic: the same plan gives the same ``metrics``. The wall-time fields of the
report's summary (``WALL_TIME_FIELDS``) are left out of ``metrics``; the trial's own wall time is
``wall_s``, which ``==`` ignores, so two results of the same plan compare equal.

``plan_with_overrides`` builds a plan from a ``predict`` config mapping plus dotted overrides (the
candidate a search proposes); a bad candidate raises ``InputError`` with its category, which the
caller turns into a failed trial with ``TrialResult.from_exception``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (imported where used: a search's parent process need not load the simulator)
    from aisim.simulator.plan import ReplayPlan

__all__ = ["TrialResult", "run_trial", "run_dumped_trial", "run_monitored_trial", "plan_with_overrides", "one_line",
           "STATUSES"]

STATUSES = ("ok", "failed", "timeout")
_MAX_MESSAGE = 1000  # characters of a failure's message (one line)


def one_line(exc: BaseException) -> str:
    """The first non-empty line of an error's text, at most ``_MAX_MESSAGE`` characters. aisim's own
    errors are already user-facing one-liners; any other exception is prefixed with its type."""
    from aisim.simulator.errors import AisimError

    text = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
    if not isinstance(exc, AisimError):
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


@dataclass(frozen=True)
class TrialResult:
    """The outcome of one trial.

    - ``status``: ``ok`` (the replay finished), ``failed`` (it raised) or ``timeout`` (it did not
      finish within its limit; ``category`` is then ``timeout``);
    - ``category``: None when ok, else one of ``simulator.errors.CATEGORIES``;
    - ``message``: None when ok, else one line (never a traceback);
    - ``metrics``: the report's summary without its wall-time fields (or only ``metrics_keys``),
      None unless ok;
    - ``wall_s``: seconds the trial took (not compared by ``==``).
    """

    status: str
    category: str | None = None
    message: str | None = None
    metrics: dict | None = None
    wall_s: float = field(default=0.0, compare=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def from_exception(cls, exc: BaseException, wall_s: float = 0.0) -> "TrialResult":
        """A failed result: the error's category (``runtime`` for an exception that has none) and
        one line of its message."""
        category = getattr(exc, "category", None)
        if not isinstance(category, str):
            category = "runtime"
        return cls("failed", category, one_line(exc), None, float(wall_s))

    @classmethod
    def timed_out(cls, limit_s: float | None, wall_s: float = 0.0) -> "TrialResult":
        limit = f"the {limit_s:g} s limit" if limit_s is not None else "its time limit"
        return cls("timeout", "timeout", f"did not finish within {limit}", None, float(wall_s))

    def to_dict(self) -> dict:
        """Plain data (msgpack/JSON): ``TrialResult.from_dict(r.to_dict()) == r``."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> "TrialResult":
        return cls(**dict(data))


def _metrics(summary: dict, keys: tuple[str, ...] | None) -> dict:
    if keys is None:
        from aisim.simulator.metrics.summary import WALL_TIME_FIELDS

        return {k: v for k, v in summary.items() if k not in WALL_TIME_FIELDS}
    missing = [k for k in keys if k not in summary]
    if missing:
        raise KeyError(f"the report's summary has no {', '.join(map(repr, missing))}")
    return {k: summary[k] for k in keys}


def run_trial(plan: ReplayPlan, metrics_keys: tuple[str, ...] | None = None, **run_options) -> TrialResult:
    """Run ``plan`` once (``simulator.run.run_plan``, given ``run_options``: a ``monitor``, ...).
    Never raises an ``Exception``: a failure is a ``failed`` result carrying the error's category
    and one line. ``metrics_keys`` keeps only those summary keys (a key the summary lacks fails the
    trial, category ``runtime``)."""
    from aisim.simulator.run import run_plan

    t0 = time.perf_counter()
    try:
        report = run_plan(plan, **run_options)
        metrics = _metrics(report.summary, tuple(metrics_keys) if metrics_keys is not None else None)
    except Exception as exc:  # noqa: BLE001 - a trial classifies every failure
        return TrialResult.from_exception(exc, time.perf_counter() - t0)
    return TrialResult("ok", None, None, metrics, time.perf_counter() - t0)


def run_dumped_trial(data: bytes, metrics_keys: tuple[str, ...] | None = None) -> TrialResult:
    """``run_trial`` of a plan shipped as ``dump_plan`` bytes (by reference: its workload must be
    registered in this process; a missing one is a failed trial). What fan-out workers run."""
    t0 = time.perf_counter()
    try:
        from aisim.simulator.plan import load_plan

        plan = load_plan(data)
    except Exception as exc:  # noqa: BLE001
        return TrialResult.from_exception(exc, time.perf_counter() - t0)
    return run_trial(plan, metrics_keys)


def run_monitored_trial(item: Mapping) -> TrialResult:
    """``run_dumped_trial`` under a checkpoint monitor: ``item["monitor"]`` is a picklable spec
    whose ``monitor(plan)`` builds it here (e.g. ``search.retune.early.DropSpec``; None: no
    monitor). ``item``: {"plan": dump_plan bytes, "metrics_keys": keys or None, "monitor": spec}. A
    replay the monitor stopped carries ``stopped_early`` ({at_s, reason}) and the monitor's
    ``decision`` in its metrics."""
    t0 = time.perf_counter()
    spec = item.get("monitor")
    try:
        from aisim.simulator.plan import load_plan

        plan = load_plan(item["plan"])
        if spec is None:
            return run_trial(plan, item.get("metrics_keys"))
        from dataclasses import replace

        plan = replace(plan, capture_per_request=True)
        monitor = spec.monitor(plan)
    except Exception as exc:  # noqa: BLE001
        return TrialResult.from_exception(exc, time.perf_counter() - t0)
    result = run_trial(plan, None, monitor=monitor, request_rows=True)
    if not result.ok:
        return result
    keys = item.get("metrics_keys")
    metrics = dict(result.metrics) if keys is None else {k: result.metrics[k] for k in keys}
    if "stopped_early" in result.metrics:
        metrics["stopped_early"] = result.metrics["stopped_early"]
        metrics["decision"] = monitor.decision
    return TrialResult("ok", None, None, metrics, result.wall_s)


def plan_with_overrides(cfg_mapping: Mapping, overrides: Mapping[str, Any], config_dir: Path | str | None,
                        **plan_options) -> ReplayPlan:
    """The plan of a ``predict`` config mapping (as read from YAML, before validation) with dotted
    ``overrides`` applied (``{"router.policy": "kv_router", ...}``, in order; ``cfg_mapping`` is not
    changed), validated once. ``config_dir`` resolves relative trace paths. ``plan_options`` go to
    ``plan_from_config`` (``capture_per_request``, ...). Raises ``InputError`` (with its category:
    ``invalid_config``, ``kv_capacity``, ``unsupported``, ...) for a candidate that cannot run."""
    from aisim.simulator.config.loading import validate_config
    from aisim.simulator.config.paths import with_paths

    data = with_paths(cfg_mapping, overrides)
    cfg = validate_config(data)
    from aisim.simulator.plan import plan_from_config

    return plan_from_config(cfg, Path(config_dir) if config_dir is not None else None, **plan_options)
