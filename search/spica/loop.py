"""The Spica search loop: one Optuna study per deployment mode (branch), driven by ask/tell,
candidates replayed through ``search.fanout``, every trial recorded in Optuna storage.

Per asked trial: decode the sampler's params into a ``selection`` and a parallel shape -> the
load predictor's winners (``presweep``) -> ``unroll_sample`` -> the candidate's KV load
(``materialize.resolve_load``) -> GPU-band check -> a concrete ``aisim predict`` config
(``materialize.prediction_config``) -> replayed in a worker (``candidate_timeout_seconds``) ->
metrics -> ``objectives.score`` (signed so higher is better) -> tell. Infeasible, unsupported,
failed and timed-out candidates are told as FAIL with their ``reason_category`` in the trial's
user attributes, never as good scores.

- Batches: a guided sampler (tpe, nsga2) asks ``BATCH_ROUNDS`` candidates per worker, which are
  replayed together, before it asks again (a round barrier, as the reference); ``random``'s draws do
  not depend on results, so it asks the whole remaining budget at once (no barrier). Each candidate
  is told to its study as its replay ends; candidate ids follow the asked order, so the ledger is the
  same for any ``parallelism``, on any backend and whichever replay finishes first.
- Pruning (``optimizer.pruner``): every sampler asks in rounds of one candidate per worker; a
  candidate's replay reports its intermediate target at checkpoints to Optuna's pruner, judged
  against the rounds before its own, and a pruned one is told PRUNED (``search.spica.pruning``,
  docs/early-stopping.md): the decisions are the same on every backend for one parallelism.
- Duplicates: a suggestion equal to one already evaluated (same branch, same params) is told the
  cached result, counted in ``counts.cache_hits`` and re-asked. ``random`` draws unseen points
  only, in one seeded order per branch (``_draw_random``): a 16-point space with
  ``max_trials: 16`` evaluates every point once; a search ends at ``max_trials`` evaluated
  candidates or when every branch is exhausted.
- Storage, claims and resume: ``search.spica.study`` and docs/spica-studies.md (one study per
  branch named ``<study.name>-<mode>``; the ledger is rebuilt from storage on resume, finished
  trials are never re-run, trials left RUNNING by a killed process become FAIL and are asked again).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import math
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from aisim.search.asktell import PRUNED, AskTell, point_key
from aisim.search.cache import TrialCache
from aisim.search.spica.domains import Range, has_range
from aisim.search.spica.study import STUDY_FILE
from aisim.simulator.errors import InputError

__all__ = ["SearchResult", "run_search", "resume_search", "STUDY_FILE", "REPORT_FILE"]

REPORT_FILE = "recommendation.html"  # report=True / --report

BATCH_ROUNDS = 4  # a guided sampler's candidates asked per batch = workers x this
MAX_RANDOM_BATCH = 1024  # ``random`` asks the remaining budget at once, at most this many
_MAX_ENUMERATED = 200_000  # a branch grid larger than this is sampled by rejection, not enumerated
_STATUS_OF_CATEGORY = {"kv_capacity": ("infeasible", "kv_capacity"), "gpu_budget": ("infeasible", "gpu_budget"),
                       "context_length": ("infeasible", "kv_capacity"), "unsupported": ("unsupported", "backend_topology"),
                       "invalid_config": ("failed", "candidate_materialization"),
                       "timeout": ("timed_out", "runtime_timeout"), "resource_limit": ("resource_limited", "resource_limit")}
COUNT_KEYS = ("evaluated", "feasible", "infeasible", "unsupported", "timed_out", "failed", "resource_limited", "cache_hits")


@contextlib.contextmanager
def _storage_writes():
    """Study storage writes that a Ctrl-C or SIGTERM must not cut in half (a journal lock left
    behind, a trial half told): the signals wait until the writes are done (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    blocked = (signal.SIGINT, signal.SIGTERM)
    old = signal.pthread_sigmask(signal.SIG_BLOCK, set(blocked))
    # A signal that arrived just before the mask has already run its C-level handler; Python runs
    # the Python-level one at a later bytecode, which could fall inside a write (a journal lock
    # half released). Until the writes are done, such a signal is only noted, then re-raised.
    deferred: list[int] = []
    handlers = {s: signal.signal(s, lambda signum, frame: deferred.append(signum)) for s in blocked}
    try:
        yield
    finally:
        for s, h in handlers.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        for s in deferred[:1]:
            h = handlers[s]
            if callable(h):
                h(s, None)
            elif h == signal.SIG_DFL and s == signal.SIGINT:
                raise KeyboardInterrupt
            elif h == signal.SIG_DFL:
                signal.raise_signal(s)


def _label(value: Any) -> Any:
    """A choice as an Optuna categorical value (dict composites as canonical JSON)."""
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return value


@dataclass
class _Branch:
    mode: str
    study: Any
    choices: dict[str, tuple]  # knob -> choices (pinned: one)
    labels: dict[str, dict]  # knob -> label -> value
    shapes: list[dict]
    shape_keys: list[str]
    ratio: tuple[float, float] | None  # kv_load_ratio searched over [min, max]
    index: int = 0  # the mode's position in search_space.deployment_mode (its seeds derive from it)
    seen: TrialCache = field(default_factory=TrialCache)  # params key -> ledger record
    exhausted: bool = False
    grid: list[tuple[str, dict]] | None = None  # ``random``: every (params key, point) of an enumerable branch
    order: Any = None  # ``random``: the grid's seeded permutation (an enumerable branch)
    cursor: int = 0  # ``random``: the next position in ``order`` (or the next draw's index)
    _loop: AskTell | None = field(default=None, repr=False)

    def distributions(self) -> dict:
        from optuna.distributions import CategoricalDistribution, FloatDistribution

        out = {k: (c.distribution() if isinstance(c, Range) else CategoricalDistribution(list(self.labels[k])))
               for k, c in self.choices.items() if isinstance(c, Range) or len(c) > 1}
        if len(self.shape_keys) > 1:
            out["parallel_config"] = CategoricalDistribution(self.shape_keys)
        if self.ratio is not None:
            out["kv_load_ratio"] = FloatDistribution(*self.ratio)
        return out

    def size(self) -> float:
        if self.ratio is not None or has_range(self.choices):
            return math.inf
        return math.prod(len(c) for c in self.choices.values()) * max(1, len(self.shape_keys))

    def loop(self) -> AskTell:
        """The branch's ask/tell helper (over its study; its cache is ``seen``)."""
        if self._loop is None:
            self._loop = AskTell(self.study, self.distributions(), size=self.size(), cache=self.seen)
        return self._loop


_params_key = point_key  # a candidate's params key (stored in the journal as ``params_key``)


@dataclass
class SearchResult:
    """What a search produced: the recommendation (``recommendation.json``), its counts, where."""

    recommendation: dict
    counts: dict
    output_dir: Path
    study_names: list[str]
    resumed: bool = False
    dgd_paths: list = field(default_factory=list)  # the DynamoGraphDeployment files written (a ``dgd`` section)
    storage: str = ""  # where the study lives (the journal file or the storage URL)
    skipped: dict = field(default_factory=dict)  # deployment mode -> why it has no candidate at all

    @property
    def reasons(self) -> dict[str, dict[str, int]]:
        """Status -> reason category -> candidates, for every candidate that is not feasible."""
        out: dict[str, dict[str, int]] = {}
        for c in self.recommendation["candidates"]:
            if c["status"] != "feasible":
                per = out.setdefault(c["status"], {})
                key = c.get("reason_category") or "unknown"
                per[key] = per.get(key, 0) + 1
        return out

    @property
    def decided(self) -> str | None:
        """None when the search found a feasible candidate; else why it decided nothing (one line)."""
        if self.best is not None:
            return None
        if not self.recommendation["candidates"]:
            why = "; ".join(f"{m}: {r}" for m, r in self.skipped.items()) or "the search space holds no point"
            return f"no candidate to evaluate: {why}"
        from aisim.search.spica.summary import reason_parts

        return f"no feasible candidate among {len(self.recommendation['candidates'])}: {reason_parts(self.reasons)}"

    @property
    def best(self) -> dict | None:
        top = self.recommendation["views"]["top_n"]
        if not top:
            return None
        return next(c for c in self.recommendation["candidates"] if c["candidate_id"] == top[0])


class _Search:
    def __init__(self, cfg, config_dir: Path | None, output_dir: Path, *, resume: bool, storage: str | None,
                 fan, progress: Callable[[dict], None] | None, overwrite: bool = False, report: bool = False) -> None:
        from aisim.search.spica.study import locate

        self.cfg = cfg
        self.config_dir = config_dir
        self.output_dir = output_dir
        self.resume = resume
        self.overwrite = overwrite
        self.report = report
        self.fan = fan
        self.progress = progress
        self.location = locate(storage or cfg.study.storage, output_dir)
        self.ledger: list[dict] = []
        self.next_id = 0
        self.counts = dict.fromkeys(COUNT_KEYS + (("pruned",) if cfg.optimizer.pruner else ()), 0)
        self.round = 0  # with a pruner: the round of the candidates being asked (search.spica.pruning)
        self.t0 = time.perf_counter()
        self.resumed = False
        self.claim = None
        self.skipped: dict[str, str] = {}  # mode -> why the branch has no candidate
        self._predictors: dict | None = None

    # -- setup -----------------------------------------------------------------------------------
    def open_study(self):
        """Claim the search, check what the storage already holds (refuse a second run of an existing
        search unless resuming or overwriting; refuse resuming another config), and open the storage."""
        from aisim.search.spica.study import Claim, differing_keys, find_search, identity, identity_view

        cfg = self.cfg
        name = cfg.study.name
        self.claim = Claim(self.location, name, 2 * cfg.optimizer.candidate_timeout_seconds + 60)
        self.claim.lock()
        if self.overwrite and self.location.default and self.location.file.exists():
            self.location.file.unlink()  # under the claim: nobody else writes it
        storage = self.location.open()
        found = find_search(storage, name)
        if found is not None:
            self.claim.check(storage, found.studies)
            if self.overwrite:
                import optuna

                for study_name in found.study_names:
                    optuna.delete_study(study_name=study_name, storage=storage)
            elif not self.resume:
                raise InputError("study", f"search {name!r} already exists in {self.location.label} "
                                          f"({found.trials} trials): pass --resume (resume=True) to continue it, "
                                          "--overwrite (overwrite=True) to start over, or give study.name another "
                                          "name")
            elif found.attrs is not None and found.attrs.get("identity") != identity(self.config_json) and (
                    diff := differing_keys(identity_view(found.attrs.get("config") or {}),
                                           identity_view(self.config_json))):
                shown = ", ".join(diff[:4]) + (f" and {len(diff) - 4} more" if len(diff) > 4 else "")
                raise InputError("study", f"search {name!r} in {self.location.label} was started with another "
                                          f"config (differs at {shown}); resume it with the config "
                                          "it was started with (search.spica.resume_search reads it from the "
                                          "study), or give study.name another name")
        return storage

    @property
    def extra_metrics(self) -> tuple[str, ...]:
        """The summary fields a percentile SLA reads, kept with each candidate's metrics."""
        from aisim.search.spica.objectives import sla_fields, sla_statistic

        stat = sla_statistic(self.cfg.evaluation.sla.model_dump())
        return () if stat == "mean" else (*(f for _, f in sla_fields(stat)), "sla_percentile", "sla_met")

    @property
    def config_json(self) -> dict:
        return self.cfg.dump()

    def search_attr(self, mode: str) -> dict:
        """The ``aisim_search`` attribute of the branch study of ``mode``."""
        from aisim import __version__
        from aisim.search.spica.study import identity

        cfg_json = self.config_json
        return {"search": self.cfg.study.name, "mode": mode, "config": cfg_json, "identity": identity(cfg_json),
                "config_dir": str(self.config_dir) if self.config_dir else None,
                "output_dir": str(Path(self.output_dir).resolve()), "aisim_version": __version__}

    def sampler(self, mode_index: int):
        import optuna

        opt = self.cfg.optimizer
        seed = int(np.random.SeedSequence([opt.seed, mode_index]).generate_state(1)[0])
        algo = opt.algorithm
        if algo in ("tpe", "bayesian"):
            return optuna.samplers.TPESampler(seed=seed)
        if algo == "nsga2":
            return optuna.samplers.NSGAIISampler(seed=seed)
        return optuna.samplers.RandomSampler(seed=seed)  # (its draws are ours: every point is enqueued)

    def branches(self, storage) -> list[_Branch]:
        import optuna

        from aisim.search.spica.branches import plan_branches
        from aisim.search.spica.objectives import directions
        from aisim.search.spica.shapes import shape_key
        from aisim.search.spica.study import SEARCH_ATTR

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        cfg = self.cfg
        out = []
        for b in plan_branches(cfg):
            if b.skipped is not None:
                self.skipped[b.mode] = b.skipped
                continue
            labels = {k: {_label(v): v for v in vs} for k, vs in b.choices.items() if not isinstance(vs, Range)}
            name = f"{cfg.study.name}-{b.mode}"
            study = optuna.create_study(study_name=name, storage=storage, sampler=self.sampler(b.index),
                                        directions=directions(cfg.optimization.target), load_if_exists=True)
            study.set_user_attr(SEARCH_ATTR, self.search_attr(b.mode))
            out.append(_Branch(b.mode, study, b.choices, labels, b.shapes, [shape_key(s) for s in b.shapes],
                               cfg.kv_load_ratio_range, index=b.index))
        return out

    # -- resume ----------------------------------------------------------------------------------
    def restore(self, branches: list[_Branch]) -> None:
        """The ledger rebuilt from storage. A trial left RUNNING by a killed run becomes FAIL (its
        candidate attributes kept, ``status: interrupted``) and its point is asked again: ``random``
        reaches it in its own order, other samplers get it enqueued."""
        from optuna.trial import TrialState

        records, interrupted = [], []
        for b in branches:
            for t in b.study.get_trials(deepcopy=False):
                if t.state == TrialState.RUNNING:  # left by a killed process
                    b.study._storage.set_trial_user_attr(t._trial_id, "status", "interrupted")
                    b.study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
                    interrupted.append((b, t))
                    continue
                rec = t.user_attrs.get("record")
                if rec is None:
                    if t.user_attrs.get("duplicate_of"):
                        self.counts["cache_hits"] += 1
                    continue
                b.seen[t.user_attrs["params_key"]] = rec
                records.append(rec)
        for b, t in interrupted:
            if self.cfg.optimizer.algorithm != "random" and t.params and _params_key(t.params) not in b.seen:
                b.study.enqueue_trial(dict(t.params), skip_if_exists=False)
        records.sort(key=lambda r: r["candidate_id"])
        for rec in records:
            self._count(rec)
        self.ledger = records
        self.next_id = records[-1]["candidate_id"] + 1 if records else 0
        self.resumed = bool(records or interrupted)

    # -- asking ------------------------------------------------------------------------------------
    def _draw_random(self, b: _Branch, pending: set[str]) -> dict | None:
        """The next point of ``b`` for ``random`` that is neither evaluated nor in flight, None when
        the branch is exhausted. The points come in one seeded order per branch (a permutation of an
        enumerable grid; else the j-th draw from a stream keyed by (seed, branch, j)), so a search
        evaluates the first points of that order whatever ran at once, and a resumed search the same
        ones as an uninterrupted run."""
        seed = self.cfg.optimizer.seed
        if b.size() <= _MAX_ENUMERATED:
            if b.grid is None:  # enumerated once per branch: (key, point) in a fixed order
                dists = b.distributions()
                names = sorted(dists)
                points = (dict(zip(names, combo)) for combo in itertools.product(*(dists[n].choices for n in names)))
                b.grid = [(_params_key(p), p) for p in points]
                b.order = np.random.default_rng(np.random.SeedSequence([seed, 11, b.index])).permutation(len(b.grid))
            while b.cursor < len(b.grid):
                key, point = b.grid[int(b.order[b.cursor])]
                b.cursor += 1
                if key not in b.seen and key not in pending:
                    return point
            return None
        dists = b.distributions()
        for _ in range(1000):  # consecutive repeats before the branch counts as exhausted
            rng = np.random.default_rng(np.random.SeedSequence([seed, 13, b.index, b.cursor]))
            b.cursor += 1
            point = {}
            for n in sorted(dists):
                d = dists[n]
                if hasattr(d, "choices"):
                    point[n] = d.choices[int(rng.integers(len(d.choices)))]
                elif n == "kv_load_ratio":
                    point[n] = float(rng.uniform(d.low, d.high))
                else:  # a continuous knob (search.spica.domains.Range)
                    point[n] = b.choices[n].draw(rng)
            key = _params_key(point)
            if key not in b.seen and key not in pending:
                return point
        return None

    def ask(self, b: _Branch, pending: set[str]):
        """(trial, params) of an unseen, not pending suggestion of ``b``, or None when exhausted.
        A duplicate is told its cached result (``duplicate_of``) and re-asked (``search.asktell``)."""
        loop = b.loop()

        def draw() -> bool:  # random: the branch's next unseen point, enqueued for the ask
            point = self._draw_random(b, pending)
            if point is None:
                b.exhausted = True
                return False
            b.study.enqueue_trial(point, skip_if_exists=False)
            return True

        hits = loop.cache_hits
        def on_duplicate(trial, rec) -> None:
            trial.set_user_attr("duplicate_of", rec["candidate_id"])
            if self.cfg.optimizer.pruner:
                trial.set_user_attr("round", self.round)

        got = loop.ask(in_flight=pending, outcome_of=lambda rec: rec.get("_values"), on_duplicate=on_duplicate,
                       before_ask=draw if self.cfg.optimizer.algorithm == "random" else None)
        self.counts["cache_hits"] += loop.cache_hits - hits
        if got is None:
            b.exhausted = b.exhausted or loop.exhausted
            return None
        trial, params, _ = got
        return trial, params

    @staticmethod
    def next_branch(branches: list[_Branch], in_batch: dict[int, int]) -> _Branch | None:
        """The branch asked next: the one with the fewest candidates so far (evaluated and in this
        batch), the first in the space's order on a tie, so the split over branches depends on the
        count alone (a resumed search splits as an uninterrupted one)."""
        open_ = [b for b in branches if not b.exhausted]
        if not open_:
            return None
        return min(open_, key=lambda b: (len(b.seen) + in_batch.get(b.index, 0), b.index))

    # -- one candidate -------------------------------------------------------------------------------
    def predictors(self) -> dict | None:
        """The load predictor's winner per throughput interval of the space's scaling policies (the
        pre-sweep over ``load_predictor_candidates``), or None without throughput scaling."""
        if self._predictors is None:
            from aisim.search.spica.presweep import predictor_winners

            self._predictors = {"best_by_interval": predictor_winners(self.cfg, self.config_dir)}
        return self._predictors

    def materialize(self, b: _Branch, params: dict) -> dict:
        """The ledger record of one suggestion before its replay (``prediction_config`` None when
        it cannot run: status and reason set)."""
        from aisim.search.spica.materialize import prediction_config, resolve_load
        from aisim.search.spica.shapes import shape_from_key
        from aisim.search.spica.unroll import unroll_sample
        from aisim.simulator.errors import AisimError

        selection = {k: params[k] if isinstance(vs, Range) else b.labels[k][params[k]] if k in params else vs[0]
                     for k, vs in b.choices.items()}
        shape = shape_from_key(params["parallel_config"]) if "parallel_config" in params else b.shapes[0]
        rec: dict = {"branch": b.mode, "params": params, "status": None, "config": None, "prediction_config": None,
                     "used_gpus": None, "reason_category": None, "reason": None}
        try:
            needs_predictor = any(_throughput(p) for p in b.choices["planner_scaling_policy"])
            flat = unroll_sample(self.cfg.search_space, selection, shape,
                                 self.predictors() if needs_predictor else None)
            flat.update(resolve_load(self.cfg, flat, params.get("kv_load_ratio")))
            rec["config"] = flat
            rec["used_gpus"] = flat.get("used_gpus")
            rec["prediction_config"] = prediction_config(self.cfg, flat)
        except AisimError as exc:
            status, reason = _STATUS_OF_CATEGORY.get(exc.category, ("failed", "candidate_materialization"))
            rec.update(status=status, reason_category=getattr(exc, "reason_category", reason), reason=str(exc))
        return rec

    def finish(self, rec: dict, result: dict) -> None:
        """Fill a record from its replay's ``TrialResult`` dict and score it."""
        from aisim.search.spica.objectives import score

        cfg = self.cfg
        if result["status"] != "ok":
            status, reason = _STATUS_OF_CATEGORY.get(result.get("category"), ("failed", "replay_runtime"))
            rec.update(status=status, reason_category=reason, reason=result.get("message"))
            return
        metrics = result["metrics"]
        rec["replay_wall_s"] = result.get("wall_s")
        pruning = result.get("pruning")
        if pruning is not None:
            rec["intermediate_values"] = pruning["values"]
            rec["rungs"] = pruning["rungs"]
            rec["replayed_requests"] = metrics["completed_requests"] + metrics["rejected_requests"]
            if pruning["pruned"] is not None:  # stopped at a checkpoint: no final metrics, never scored
                rec.update(status="pruned", reason_category="pruned", reason=metrics["stopped_early"]["reason"],
                           pruned=pruning["pruned"])
                return
        rec["metrics"] = metrics
        sla = cfg.evaluation.sla.model_dump(exclude_none=True) if cfg.evaluation is not None else None
        constraints = cfg.optimization.constraints.model_dump() if cfg.optimization.constraints is not None else None
        s = score(cfg.optimization.target, metrics, rec["used_gpus"] or 0, sla=sla or None,
                  strict_sla=cfg.optimization.strict_sla, constraints=constraints)
        rec["score"] = list(s.values) if s.values is not None else None
        rec["objectives"] = s.objectives
        rec.update(status=s.status, reason_category=s.reason_category, reason=s.reason)
        rec["_values"] = list(s.values) if s.values is not None else None

    def prune_spec(self, b: _Branch, trial, rec: dict, snap: list) -> dict:
        """What a candidate's worker needs to ask the pruner (search.spica.pruning.PruneMonitor)."""
        from aisim.search.spica.objectives import _sla_limits

        cfg = self.cfg
        sla = cfg.evaluation.sla.model_dump(exclude_none=True) if cfg.evaluation is not None else {}
        return {"pruner": cfg.optimizer.pruner, "study_name": b.study.study_name, "number": trial.number,
                "snapshot": snap, "target": cfg.optimization.target, "sla": _sla_limits(sla),
                "used_gpus": rec["used_gpus"]}

    def _count(self, rec: dict) -> None:
        self.counts["evaluated"] += 1
        self.counts[rec["status"]] = self.counts.get(rec["status"], 0) + 1

    # -- the loop ------------------------------------------------------------------------------------
    def run(self) -> SearchResult:
        try:
            with _storage_writes():
                storage = self.open_study()
                branches = self.branches(storage)
                self.claim.take(storage, [b.study._study_id for b in branches])
                if self.resume:
                    self.restore(branches)
            return self._loop(branches)
        finally:
            if self.claim is not None:
                with _storage_writes():
                    self.claim.release()

    def _loop(self, branches: list[_Branch]) -> SearchResult:
        from optuna.trial import TrialState

        from aisim.search.spica.trial import replay_candidate

        opt = self.cfg.optimizer
        budget = opt.max_trials
        workers = self.fan.max_parallel if self.fan is not None else 1
        # with a pruner: rounds of one candidate per worker (the freshest bar a barrier allows)
        round_size = workers if opt.pruner else workers * BATCH_ROUNDS
        while self.counts["evaluated"] < budget and any(not b.exhausted for b in branches):
            # ``random``'s draws do not depend on results: the whole remaining budget is asked at once
            # (no barrier); a guided sampler asks a few rounds per worker, then learns from them. With
            # a pruner every sampler asks in rounds of one candidate per worker (candidate ids r x
            # workers on), and a candidate is judged against the rounds before its own
            # (search.spica.pruning)
            per_batch = min(budget - self.counts["evaluated"],
                            MAX_RANDOM_BATCH if opt.algorithm == "random" and not opt.pruner else round_size)
            snapshots: dict[int, list] = {}
            if opt.pruner:
                from aisim.search.spica.pruning import snapshot

                self.round = self.next_id // round_size
                per_batch = min(per_batch, (self.round + 1) * round_size - self.next_id)
                snapshots = {b.index: snapshot(b.study, self.round) for b in branches}
            asked = []
            pending: set[str] = set()
            in_batch: dict[int, int] = {}
            stalled: set[int] = set()  # branches whose sampler proposed nothing new this batch
            while len(asked) < per_batch:
                b = self.next_branch([b for b in branches if b.index not in stalled], in_batch)
                if b is None:
                    break
                with _storage_writes():
                    got = self.ask(b, pending)
                if got is None:
                    stalled.add(b.index)
                    continue
                trial, params = got
                key = _params_key(params)
                pending.add(key)
                in_batch[b.index] = in_batch.get(b.index, 0) + 1
                rec = self.materialize(b, params)
                rec["candidate_id"] = self.next_id  # ids in asked order: the same whatever finishes first
                self.next_id += 1
                with _storage_writes():  # a run killed now leaves the trial RUNNING with its candidate
                    trial.set_user_attr("params_key", key)
                    trial.set_user_attr("config", rec["config"])
                    if opt.pruner:
                        trial.set_user_attr("round", self.round)
                asked.append((b, trial, params, rec))
            if not asked:
                break
            told: set[int] = set()

            def tell(i: int) -> None:
                with _storage_writes():  # (a signal meanwhile is raised at its end: told is then complete)
                    self.claim.refresh()  # still ours (and its heartbeat renewed) however long the batch
                    self.record(asked[i])
                    told.add(i)
                if self.progress is not None:
                    self.progress(self.snapshot(budget))

            runnable = [i for i, (_, _, _, rec) in enumerate(asked) if rec["prediction_config"] is not None]
            for i in range(len(asked)):
                if i not in runnable:
                    tell(i)  # not runnable: its status and reason are known already

            def on_result(j: int, res) -> None:
                i = runnable[j]
                self.finish(asked[i][3], res if isinstance(res, dict) else res.to_dict())
                tell(i)

            items = [{"prediction_config": asked[i][3]["prediction_config"], "extra_metrics": self.extra_metrics,
                      "config_dir": str(self.config_dir) if self.config_dir else None} for i in runnable]
            if opt.pruner:
                for item, i in zip(items, runnable):
                    b, trial, _, rec = asked[i]
                    item["prune"] = self.prune_spec(b, trial, rec, snapshots[b.index])
            try:
                if items:
                    self.fan.map(replay_candidate, items, item_timeout_s=opt.candidate_timeout_seconds,
                                 on_result=on_result)
            except BaseException:
                with _storage_writes():
                    for i, (b, trial, _, _) in enumerate(asked):  # stopped: the in-flight trials end as failed
                        if i not in told and not b.study._storage.get_trial(trial._trial_id).state.is_finished():
                            trial.set_user_attr("status", "interrupted")
                            b.study.tell(trial, state=TrialState.FAIL)
                raise
        for b in branches:
            b.exhausted = b.exhausted or len(b.seen) >= b.size()
        self.ledger.sort(key=lambda r: r["candidate_id"])
        return self.result([b.study.study_name for b in branches], bool(branches) and all(b.exhausted for b in branches))

    def record(self, one: tuple) -> None:
        """One candidate into the ledger and told to its study (with its record)."""

        b, trial, params, rec = one
        self._count(rec)
        self.ledger.append(rec)
        trial.set_user_attr("candidate_id", f"candidate-{rec['candidate_id']:06d}")
        trial.set_user_attr("status", rec["status"])
        trial.set_user_attr("reason_category", rec["reason_category"])
        trial.set_user_attr("used_gpus", rec["used_gpus"])
        for k in ("goodput_output_throughput_tok_s", "output_throughput_tok_s", "mean_ttft_ms", "gpu_hours"):
            if rec.get("metrics") and k in rec["metrics"]:
                trial.set_user_attr(k, rec["metrics"][k])
        for step, value in rec.get("intermediate_values") or ():  # (what the pruner saw, for later rounds)
            trial.report(value, step)
        for key, value in (rec.get("rungs") or {}).items():
            b.study._storage.set_trial_system_attr(trial._trial_id, key, value)
        if rec["status"] == "pruned":
            trial.set_user_attr("pruned_at", rec["pruned"])
        trial.set_user_attr("record", rec)
        b.loop().record(trial, _params_key(params), rec, PRUNED if rec["status"] == "pruned" else rec.get("_values"))

    def snapshot(self, budget: int) -> dict:
        feasible = [r for r in self.ledger if r["status"] == "feasible" and r.get("score") is not None]
        best = max((r["score"][0] for r in feasible), default=None)
        wall = time.perf_counter() - self.t0
        return {"done": self.counts["evaluated"], "total": budget, "feasible": len(feasible), "best": best,
                "trials_per_s": self.counts["evaluated"] / wall if wall > 0 else 0.0, "counts": dict(self.counts)}

    def result(self, names: list[str], exhausted: bool) -> SearchResult:
        from aisim.search.spica.outputs import build_recommendation, candidate_record, write_outputs

        cfg = self.cfg
        provenance = {"model": cfg.model_name, "hardware": cfg.hardware_sku, "objective": cfg.optimization.target}
        candidates = []
        from aisim.search.spica.objectives import Score

        for rec in self.ledger:
            s = None
            if rec.get("score") is not None:
                s = Score(tuple(rec["score"]), rec.get("objectives") or {}, rec["status"], rec["reason_category"],
                          rec["reason"])
            candidates.append(candidate_record(rec["candidate_id"], rec["status"], rec["config"] or {},
                                               rec["prediction_config"], rec["used_gpus"], s, rec.get("metrics"),
                                               rec["reason_category"], rec["reason"],
                                               {**provenance, "branch": rec["branch"]}, rec.get("pruned")))
        fingerprint = cfg.fingerprint()
        run_id = hashlib.sha256(f"{fingerprint}:{cfg.study.name}".encode()).hexdigest()[:16]
        strategy = "exhaustive" if exhausted else "optimizer_guided"
        rec = build_recommendation(candidates, target=cfg.optimization.target, counts=dict(self.counts),
                                   search_strategy=strategy, run_id=run_id, input_fingerprint=fingerprint,
                                   config=cfg.dump())
        write_outputs(self.output_dir, rec)
        dgd_paths = []
        if cfg.dgd is not None:  # the winner's (pareto: every front member's) DynamoGraphDeployment
            from aisim.search.spica.dgd import write_dgd

            dgd_paths = write_dgd(self.output_dir, rec["candidates"], cfg.dgd, cfg.optimization.target,
                                  rec["views"]["pareto_front"])
        result = SearchResult(rec, dict(self.counts), self.output_dir, names, self.resumed, dgd_paths,
                              self.location.label, dict(self.skipped))
        if self.report:
            from aisim.search.spica.report import render_search_html
            from aisim.simulator.metrics.output import atomic_write_text

            atomic_write_text(self.output_dir / REPORT_FILE, render_search_html(rec, result.reasons, result.decided))
        return result


def _throughput(policy) -> bool:
    from aisim.search.spica.presets import scaling_fields

    return bool(scaling_fields(policy)["enable_throughput_scaling"])


def run_search(config, output_dir: Path | str, *, resume: bool = False, overwrite: bool = False,
               backend: str = "local", ray_address: str | None = None, parallelism: int | None = None,
               storage: str | None = None, overrides: list[str] | None = None,
               progress: Callable[[dict], None] | None = None, config_dir: Path | str | None = None,
               report: bool = False) -> SearchResult:
    """Run (or, with ``resume``, continue) a Spica search. ``config``: a path to a search YAML or a
    ``SearchConfig`` (``config_dir``: where its relative paths start). Writes ``recommendation.json``,
    ``recommendation.csv`` and ``recommendations/`` into ``output_dir`` and keeps the study in
    ``output_dir/study.journal`` (or ``storage``: a URL or a journal file path). A search that already
    exists in the storage is continued only with ``resume`` (else InputError, exit 2), or started over
    with ``overwrite``; the output directory is locked and the search claimed while it runs
    (``search.spica.study``). ``report``: also write ``recommendation.html`` (needs matplotlib)."""
    from aisim.search.fanout import fanout
    from aisim.search.spica.config import SearchConfig, load_search_config
    from aisim.simulator.metrics.output import lock_output_dir

    if resume and overwrite:
        raise InputError("--overwrite", "cannot be combined with --resume: continue the study or start over")
    if report:
        from aisim.simulator.metrics.report_html import require_matplotlib

        require_matplotlib("--report")
    if isinstance(config, SearchConfig):
        cfg = config
        config_dir = Path(config_dir) if config_dir is not None else None
    else:
        cfg, config_dir = load_search_config(Path(config), overrides or [])
    out = Path(output_dir)
    lock = lock_output_dir(out)
    try:
        n = parallelism or cfg.optimizer.parallelism
        with fanout(backend, n, ray_address) as fan:
            fan.start()  # the workers import the simulator while the study and the first batch are prepared
            search = _Search(cfg, config_dir, out, resume=resume, storage=storage, fan=fan, progress=progress,
                             overwrite=overwrite, report=report)
            return search.run()
    finally:
        lock.release()


def resume_search(name: str, storage: str | None = None, output_dir: Path | str | None = None, *,
                  backend: str = "local", ray_address: str | None = None, parallelism: int | None = None,
                  max_trials: int | None = None, progress: Callable[[dict], None] | None = None,
                  report: bool = False) -> SearchResult:
    """Continue the search ``name`` from its storage alone: the config it was started with is stored
    with its studies (``storage``: a URL or a journal file path; None: ``output_dir/study.journal``).
    The outputs go to ``output_dir`` (default: the directory the search was started with);
    ``max_trials`` raises (or lowers) the total to stop at."""
    from aisim.search.spica.config import SearchConfig
    from aisim.search.spica.study import find_search, locate

    if storage is None and output_dir is None:
        raise InputError("storage", "give the storage URL (or journal file) or the output directory of the search")
    where = locate(storage, Path(output_dir) if output_dir is not None else Path("."))
    if where.url is None and not where.file.exists():
        raise InputError("storage", f"{where.label} does not exist: give the journal file (or URL) the search "
                                    "was run with")
    found = find_search(where.open(), name)
    if found is None:
        raise InputError("study", f"no search {name!r} in {where.label}: name the search as its config's "
                                  "study.name (its studies are NAME-agg / NAME-disagg)")
    if found.attrs is None or not found.attrs.get("config"):
        raise InputError("study", f"search {name!r} in {where.label} was written by an aisim that did not store its "
                                  "config: resume it with its YAML (run_search(config, dir, resume=True))")
    data = found.attrs["config"]
    if max_trials is not None:
        data = {**data, "optimizer": {**data["optimizer"], "max_trials": max_trials}}
    cfg = SearchConfig.from_dict(data)
    out = Path(output_dir) if output_dir is not None else Path(found.attrs["output_dir"])
    return run_search(cfg, out, resume=True, backend=backend, ray_address=ray_address, parallelism=parallelism,
                      storage=storage, progress=progress, config_dir=found.attrs.get("config_dir"), report=report)
