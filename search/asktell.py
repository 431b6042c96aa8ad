"""The one Optuna ask/tell helper of the searches (Spica's branch studies, retune's window sweeps).

An ``AskTell`` wraps one study and its distributions. ``ask`` returns the next point that is
neither evaluated nor in flight, keyed canonically (``point_key``); a suggestion already
evaluated is told its cached outcome at once (``cache_hits``) and asked again; one in flight is
told failed, or, when the caller ``hold``s its key (a point evaluated outside the study), waits and
is told when ``settle`` brings the outcome. The helper knows when to stop: the budget of asks
spent, or every point of a finite space seen (``exhausted``). Outcomes: None (or a non-finite
value) is a failed trial, a number one objective, a sequence several.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Container, Mapping, Sequence
from typing import Any

from aisim.search.cache import TrialCache

__all__ = ["AskTell", "point_key", "PRUNED"]

PRUNED = "pruned"  # an outcome: the trial was pruned (told PRUNED, its intermediate values already reported)


def point_key(point: Mapping) -> str:
    """The canonical key of a point: its JSON with sorted keys (a value JSON cannot hold by its str)."""
    return json.dumps(point, sort_keys=True, default=str)


class AskTell:
    def __init__(self, study, distributions: Mapping, *, size: float = math.inf, budget: int | None = None,
                 pinned: Mapping | None = None, cache: TrialCache | None = None) -> None:
        self.study = study
        self.distributions = dict(distributions)
        self.size = size  # points in the space (inf: continuous or unknown)
        self.budget = budget  # asks at most (None: no limit)
        self.pinned = dict(pinned or {})  # knobs in every point, not searched
        self.seen = cache if cache is not None else TrialCache()  # key -> the caller's record of the point
        self.asked = 0
        self.cache_hits = 0
        self.last_point: dict | None = None  # the latest suggestion (new or known)
        self._waiting: dict[str, list] = {}  # held key -> trials told when its outcome arrives

    @property
    def spent(self) -> bool:
        """The budget of asks is used up."""
        return self.budget is not None and self.asked >= self.budget

    @property
    def exhausted(self) -> bool:
        """Nothing new to ask: the budget spent, or every point of a finite space seen."""
        return self.spent or len(self.seen) >= self.size

    def ask(self, *, in_flight: Container[str] = (), outcome_of: Callable[[Any], Any] = lambda rec: rec,
            on_duplicate: Callable[[Any, Any], None] | None = None, before_ask: Callable[[], bool] | None = None,
            attempts: int = 200) -> tuple[Any, dict, str] | None:
        """``(trial, point, key)`` of the next new point, or None (the budget spent, ``before_ask`` said
        so, or ``attempts`` suggestions in a row were all known: ``exhausted`` then tells whether the
        space is). ``outcome_of(record)``: what a cached
        record tells a duplicate; ``on_duplicate(trial, record)`` runs before it is told;
        ``before_ask()`` runs before each suggestion (False: nothing more to ask)."""
        for _ in range(attempts):
            if self.spent or (before_ask is not None and not before_ask()):
                return None
            trial = self.study.ask(self.distributions)
            self.asked += 1
            point = self.last_point = {**self.pinned, **trial.params}
            key = point_key(point)
            if key in self.seen:  # evaluated: told its outcome, not re-run
                record = self.seen[key]
                if on_duplicate is not None:
                    on_duplicate(trial, record)
                self.tell(trial, outcome_of(record))
                self.cache_hits += 1
                continue
            if key in self._waiting:  # evaluated elsewhere right now: told when it settles
                self._waiting[key].append(trial)
                continue
            if key in in_flight:
                self.tell(trial, None)
                continue
            return trial, point, key
        return None

    def hold(self, key: str) -> None:
        """``key`` is being evaluated outside this study: suggestions of it wait for ``settle``."""
        self._waiting.setdefault(key, [])

    def settle(self, key: str, record: Any, outcome: Any) -> None:
        """A held point's record: cached, and its outcome told to the trials that waited for it."""
        self.seen[key] = record
        for trial in self._waiting.pop(key, []):
            self.tell(trial, outcome)

    def record(self, trial, key: str, record: Any, outcome: Any) -> None:
        """An asked point evaluated: cached, and ``trial`` told its outcome."""
        self.seen[key] = record
        self.tell(trial, outcome)

    def tell(self, trial, outcome: Any) -> None:
        from optuna.trial import TrialState

        if outcome is PRUNED:
            self.study.tell(trial, state=TrialState.PRUNED)
        elif outcome is None or (isinstance(outcome, (int, float)) and not math.isfinite(outcome)):
            self.study.tell(trial, state=TrialState.FAIL)
        elif isinstance(outcome, Sequence) and not isinstance(outcome, str):
            self.study.tell(trial, list(outcome))
        else:
            self.study.tell(trial, outcome)
