"""Spica pruning: a candidate's replay reports an intermediate objective at checkpoints, and Optuna's
median or Hyperband pruner stops the candidates that cannot win (docs/early-stopping.md).

- Checkpoints: ``CHECKPOINTS`` per candidate, step ``k`` once ``k/CHECKPOINTS`` of the offered
  requests have ended (``simulator.checkpoints.Monitor``; a step an edge jumps over is reported with
  the value of that edge). The intermediate value is the search's target on the requests ended so
  far (``PruneMonitor.value``), signed as the final score: higher is better.
- The pruners are Optuna's own (``make_pruner``): ``median`` = ``MedianPruner(n_startup_trials=5,
  n_warmup_steps=0)``, ``hyperband`` = ``HyperbandPruner(min_resource=1, max_resource=CHECKPOINTS,
  reduction_factor=3)``.
- Determinism: candidates are asked in rounds of fixed size (the search's batch), and a candidate of
  round ``r`` is judged against the trials of rounds before ``r`` only (``snapshot``). The worker
  that replays it rebuilds that view as an in-memory study (same study name, the candidate's own
  trial number: Hyperband's brackets are Optuna's), asks the pruner there at each checkpoint, and
  returns its intermediate values and the rungs it completed; the parent writes both onto the real
  trial before telling it COMPLETE or PRUNED. No decision depends on which replay finishes first or
  on the backend.
"""

from __future__ import annotations

import math
import warnings

from aisim.simulator.checkpoints import Monitor, RunningMetrics, as_row

__all__ = ["PRUNERS", "CHECKPOINTS", "make_pruner", "snapshot", "PruneMonitor"]

PRUNERS = ("median", "successive_halving", "hyperband")
CHECKPOINTS = 10  # intermediate values per candidate (our choice: a tenth of the offered requests each)
MEDIAN_STARTUP_TRIALS = 5  # completed trials before the median pruner prunes (Optuna's default)
HYPERBAND_REDUCTION = 3  # Optuna's default
_RUNG = "completed_rung_"  # Optuna's successive-halving system attributes


def make_pruner(name: str):
    import optuna

    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=MEDIAN_STARTUP_TRIALS, n_warmup_steps=0)
    if name == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=HYPERBAND_REDUCTION)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=CHECKPOINTS,
                                              reduction_factor=HYPERBAND_REDUCTION)
    raise ValueError(f"unknown pruner {name!r}; expected one of {', '.join(PRUNERS)}")


def snapshot(study, before_round: int) -> list[dict]:
    """What the pruner may see of ``study`` for a candidate of round ``before_round``: its finished
    trials of earlier rounds (user attribute ``round``) that a pruner reads (completed ones, and any
    that completed a successive-halving rung), as plain data."""
    from optuna.trial import TrialState

    out = []
    for t in study.get_trials(deepcopy=False):
        r = t.user_attrs.get("round")
        if r is None or r >= before_round or not t.state.is_finished():
            continue
        rungs = {k: v for k, v in t.system_attrs.items() if k.startswith(_RUNG)}
        if t.state != TrialState.COMPLETE and not rungs:
            continue
        out.append({"number": t.number, "state": t.state.name, "value": t.value if t.state == TrialState.COMPLETE
                    else None, "intermediate": sorted(t.intermediate_values.items()), "rungs": rungs})
    return out


def _pruner_trial(spec: dict):
    """An in-memory study holding ``spec["snapshot"]`` under the branch study's name and the
    candidate's trial (numbered as the real one), with the search's pruner."""
    import optuna
    from optuna.trial import TrialState, create_trial

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=spec["study_name"], storage=optuna.storages.InMemoryStorage(),
                                direction="maximize", pruner=make_pruner(spec["pruner"]))
    known = {t["number"]: t for t in spec["snapshot"]}
    # (numbers matter to Hyperband's brackets only: other trials stand in as failed ones)
    numbers = range(spec["number"]) if spec["pruner"] == "hyperband" else sorted(known)
    trials = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (create_trial is experimental in some Optuna versions)
        for n in numbers:
            t = known.get(n)
            if t is None:
                trials.append(create_trial(state=TrialState.FAIL))
                continue
            trials.append(create_trial(state=TrialState[t["state"]], value=t["value"],
                                       intermediate_values={int(s): float(v) for s, v in t["intermediate"]},
                                       system_attrs=dict(t["rungs"])))
        study.add_trials(trials)
    trial = study.ask()
    return study, trial


class PruneMonitor(Monitor):
    """A candidate's checkpoints: its intermediate value reported to the pruner, the replay stopped
    when the pruner says so. ``spec``: {pruner, study_name, number, snapshot, target, sla,
    used_gpus}."""

    def __init__(self, spec: dict, num_requests: int) -> None:
        super().__init__(num_requests, checkpoints=CHECKPOINTS)
        self.name = spec["pruner"]
        self.target = spec["target"]
        self.gpus = max(1, int(spec.get("used_gpus") or 1))
        sla = spec.get("sla") or {}
        self.metrics = RunningMetrics((sla.get("ttft_ms"), sla.get("itl_ms"), sla.get("e2e_ms")))
        self.study, self.trial = _pruner_trial(spec)
        self.values: list[list] = []  # [step, value] reported
        self.pruned: dict | None = None

    def observe(self, record: dict, row: tuple | None = None) -> None:
        self.metrics.observe(as_row(record, row))

    def value(self, now_ms: float) -> float | None:
        """The target on the requests ended by ``now_ms`` (None: not defined yet): throughputs are
        output tokens of completed requests (goodput: those within every SLA limit, per request) per
        second of virtual time, per GPU divided by the candidate's GPUs; throughput_per_user the
        mean of 1000 / TPOT; ttft and e2e_latency the negated means of the completed requests."""
        t, m = self.target, self.metrics
        if t in ("ttft", "e2e_latency"):
            mean = m.mean("ttft_ms" if t == "ttft" else "e2e_latency_ms")
            return None if mean is None else -mean
        if t == "throughput_per_user":
            return m.per_user_sum / m.per_user_n if m.per_user_n else None
        if now_ms <= 0:
            return None
        tokens = m.good_tokens if t.startswith("goodput") else m.output_tokens
        v = tokens / (now_ms / 1000.0)
        return v / self.gpus if t.endswith("_per_gpu") else v

    def at_checkpoint(self, now_ms: float, ended: int, in_flight) -> str | None:
        step = min(ended // self.every, CHECKPOINTS)
        v = self.value(now_ms)
        if v is None or not math.isfinite(v):
            return None
        last = self.values[-1][0] if self.values else 0
        for s in range(last + 1, step + 1):  # (a step an edge jumped over: the value of that edge)
            self.trial.report(v, s)
            self.values.append([s, v])
        if step <= last or not self.trial.should_prune():
            return None
        self.pruned = {"step": step, "checkpoints": CHECKPOINTS, "at_s": now_ms / 1000.0, "ended_requests": ended,
                       "value": v}
        return f"pruned by the {self.name} pruner at checkpoint {step}/{CHECKPOINTS}: {self.target} so far {v:.6g}"

    def outcome(self) -> dict:
        """What the parent writes onto the real trial: the values reported, the rungs completed,
        and the pruning (None: the replay ran to its end)."""
        attrs = self.study._storage.get_trial_system_attrs(self.trial._trial_id)
        return {"values": self.values, "rungs": {k: v for k, v in attrs.items() if k.startswith(_RUNG)},
                "pruned": self.pruned}
