"""A window's candidate points, proposed by an Optuna sampler through one ask/tell loop.

``grid`` (the default) enumerates the Cartesian product of the knobs' domains: the points are
enqueued (``Study.enqueue_trial``) into the same ask/tell loop (Optuna's ``GridSampler`` stops the
study when its grid is exhausted, which only works inside ``Study.optimize``, not with ask/tell);
``tpe`` and ``random`` propose ``max_candidates`` points, for domains too large to enumerate or
continuous. Every sampler is seeded, so a sweep proposes the same points on every run.
Pinned knobs (one value) appear in every point and are not searched. A point proposed twice is
evaluated once (the sampler is told the cached score). A candidate whose evaluation failed
(score None) is told as failed and never wins.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

from aisim.simulator.config.retune import Domain

Point = dict[str, object]


def _distribution(domain: Domain, sampler: str):
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if domain.values is not None:
        return CategoricalDistribution(list(domain.values))
    if sampler == "grid":
        return CategoricalDistribution(list(domain.points()))
    if domain.step is not None and all(isinstance(x, int) for x in (domain.low, domain.high, domain.step)):
        return IntDistribution(domain.low, domain.high, step=domain.step)
    return FloatDistribution(float(domain.low), float(domain.high), step=domain.step, log=domain.log)


def point_key(point: Point) -> tuple:
    """A canonical order for points (records list candidates in it; ties go to the earlier)."""
    return tuple((k, repr(point[k])) for k in sorted(point))


class CandidateSearch:
    def __init__(self, domains: dict[str, Domain], sampler: str = "grid", max_candidates: int | None = None,
                 seed: int = 42) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.pinned = {k: d.values[0] for k, d in domains.items() if d.pinned}
        searched = {k: d for k, d in sorted(domains.items()) if not d.pinned}
        self.distributions = {k: _distribution(d, sampler) for k, d in searched.items()}
        grid_points: list[dict] = []
        if sampler == "grid":
            names = list(self.distributions)
            grid_points = [dict(zip(names, combo)) for combo in
                           itertools.product(*(self.distributions[k].choices for k in names))]
            self.budget = len(grid_points)
            opt_sampler = optuna.samplers.RandomSampler(seed=seed)  # never consulted: every point is enqueued
        else:
            if max_candidates is None:
                raise ValueError("tpe and random samplers need max_candidates")
            self.budget = max_candidates if self.distributions else 1
            opt_sampler = (optuna.samplers.TPESampler(seed=seed) if sampler == "tpe"
                           else optuna.samplers.RandomSampler(seed=seed))
        self.study = optuna.create_study(direction="maximize", sampler=opt_sampler)
        for params in grid_points:
            self.study.enqueue_trial(params)
        self.scores: dict[tuple, float | None] = {}
        self.points: dict[tuple, Point] = {}
        self._asked = 0
        self._pending: dict[tuple, list] = {}  # point being evaluated elsewhere -> trials waiting for its score

    @property
    def done(self) -> bool:
        return self._asked >= self.budget

    def ask(self, k: int) -> list:
        """Up to ``k`` more (trial, point) pairs; a point already scored is told at once and skipped."""
        out = []
        while len(out) < k and not self.done:
            trial = self.study.ask(self.distributions)
            self._asked += 1
            point = {**self.pinned, **trial.params}
            key = point_key(point)
            if key in self.scores:  # already scored (e.g. the current point): listed, told, not re-run
                self.points[key] = point
                self.tell(trial, self.scores[key])
                continue
            if key in self._pending:  # being evaluated (the current point): told when its score comes
                self.points[key] = point
                self._pending[key].append(trial)
                continue
            if any(point_key(p) == key for _, p in out):
                self.tell(trial, None)
                continue
            out.append((trial, point))
        return out

    def hold(self, point: Point) -> None:
        """``point`` is being evaluated outside this search: a trial proposing it waits for ``settle``."""
        self._pending.setdefault(point_key(point), [])

    def settle(self, point: Point, score: float | None) -> None:
        """The score of a held point: recorded, and told to the trials that proposed it."""
        key = point_key(point)
        self.scores[key] = score
        for trial in self._pending.pop(key, []):
            self.tell(trial, score)

    def record(self, asked: list, scores: list) -> None:
        """Record and tell the scores of ``asked`` (trial, point) pairs."""
        for (trial, point), score in zip(asked, scores):
            key = point_key(point)
            self.points[key] = point
            self.scores[key] = score
            self.tell(trial, score)

    def tell(self, trial, score: float | None) -> None:
        from optuna.trial import TrialState

        if score is None or not math.isfinite(score):
            self.study.tell(trial, state=TrialState.FAIL)
        else:
            self.study.tell(trial, score)

    def run(self, evaluate: Callable[[list[Point]], list[float | None]], batch: int) -> list[tuple[Point, float | None]]:
        """Ask, evaluate ``batch`` points at a time, tell; every distinct point with its score, in
        canonical order."""
        while not self.done:
            asked = self.ask(batch)
            if not asked:
                continue
            self.record(asked, evaluate([p for _, p in asked]))
        return [(self.points[k], self.scores[k]) for k in sorted(self.points)]


def best(scored: list[tuple[Point, float | None]]) -> tuple[Point, float] | None:
    """The highest-scoring point (ties: the earliest in canonical order); None when every one failed."""
    ok = [(p, s) for p, s in scored if s is not None and math.isfinite(s)]
    if not ok:
        return None
    top = max(s for _, s in ok)
    return next((p, s) for p, s in ok if s == top)
