"""A window's candidate points, proposed by an Optuna sampler through one ask/tell loop
(``search.asktell.AskTell``, the helper Spica's branches use too).

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

from aisim.search.asktell import AskTell, point_key
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


def point_order(point: Point) -> tuple:
    """The order records list candidates in (ties go to the earlier)."""
    return tuple((k, repr(point[k])) for k in sorted(point))


class CandidateSearch:
    def __init__(self, domains: dict[str, Domain], sampler: str = "grid", max_candidates: int | None = None,
                 seed: int = 42) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        pinned = {k: d.values[0] for k, d in domains.items() if d.pinned}
        searched = {k: d for k, d in sorted(domains.items()) if not d.pinned}
        distributions = {k: _distribution(d, sampler) for k, d in searched.items()}
        grid_points: list[dict] = []
        if sampler == "grid":
            names = list(distributions)
            grid_points = [dict(zip(names, combo)) for combo in
                           itertools.product(*(distributions[k].choices for k in names))]
            budget = len(grid_points)
            opt_sampler = optuna.samplers.RandomSampler(seed=seed)  # never consulted: every point is enqueued
        else:
            if max_candidates is None:
                raise ValueError("tpe and random samplers need max_candidates")
            budget = max_candidates if distributions else 1
            opt_sampler = (optuna.samplers.TPESampler(seed=seed) if sampler == "tpe"
                           else optuna.samplers.RandomSampler(seed=seed))
        study = optuna.create_study(direction="maximize", sampler=opt_sampler)
        for params in grid_points:
            study.enqueue_trial(params)
        self.loop = AskTell(study, distributions, budget=budget, pinned=pinned)  # seen: key -> (point, score)
        self.pinned = pinned
        self.distributions = distributions
        self.budget = budget
        self.study = study
        self.points: dict[str, Point] = {}  # every point proposed (duplicates included), by key

    @property
    def done(self) -> bool:
        return self.loop.spent

    @property
    def scores(self) -> dict[str, float | None]:
        return {k: rec[1] for k, rec in ((k, self.loop.seen[k]) for k in self.loop.seen)}

    def ask(self, k: int) -> list:
        """Up to ``k`` more (trial, point) pairs; a point already scored is told at once and skipped."""
        out: list = []
        keys: set[str] = set()
        while len(out) < k and not self.done:
            before = self.loop.asked
            got = self.loop.ask(in_flight=keys, outcome_of=lambda rec: rec[1], attempts=1)
            if got is None:
                point = self.loop.last_point
                if self.loop.asked > before and point_key(point) not in keys:  # known: told, or waiting for its score
                    self.points[point_key(point)] = point
                continue
            trial, point, key = got
            keys.add(key)
            out.append((trial, point))
        return out

    def hold(self, point: Point) -> None:
        """``point`` is being evaluated outside this search: a trial proposing it waits for ``settle``."""
        self.loop.hold(point_key(point))

    def settle(self, point: Point, score: float | None) -> None:
        """The score of a held point: recorded, and told to the trials that proposed it."""
        self.loop.settle(point_key(point), (point, score), score)

    def record(self, asked: list, scores: list) -> None:
        """Record and tell the scores of ``asked`` (trial, point) pairs."""
        for (trial, point), score in zip(asked, scores):
            key = point_key(point)
            self.points[key] = point
            self.loop.record(trial, key, (point, score), score)

    def run(self, evaluate: Callable[[list[Point]], list[float | None]], batch: int) -> list[tuple[Point, float | None]]:
        """Ask, evaluate ``batch`` points at a time, tell; every distinct point with its score, in
        canonical order."""
        while not self.done:
            asked = self.ask(batch)
            if not asked:
                continue
            self.record(asked, evaluate([p for _, p in asked]))
        scores = self.scores
        return sorted(((self.points[k], scores[k]) for k in self.points if k in scores),
                      key=lambda ps: point_order(ps[0]))


def best(scored: list[tuple[Point, float | None]]) -> tuple[Point, float] | None:
    """The highest-scoring point (ties: the earliest in canonical order); None when every one failed."""
    ok = [(p, s) for p, s in scored if s is not None and math.isfinite(s)]
    if not ok:
        return None
    top = max(s for _, s in ok)
    return next((p, s) for p, s in ok if s == top)
