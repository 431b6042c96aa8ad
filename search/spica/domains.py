"""Search domains: the reference's ``{choices: [...]}`` and ``{range: {min, max, step, scale}}``.

A field of a search holds one value, or one domain:

- ``{choices: [...]}``: a non-empty list of distinct values (a bare YAML list is never a domain in
  the reference form; in the ``search_space:`` form a list *is* the choices).
- ``{range: {min, max, step?, scale: linear|log}}`` (scale defaults to linear): ``min <= max``;
  an integer field's linear range needs ``step``; a log range takes no step and needs ``min > 0``.
  A range with a step is a finite set and becomes its choices (``min, min + step, ...`` up to
  ``max``; floats rounded to 12 significant digits so 0.1-steps print as written); a range
  without one is continuous (``Range``: Optuna's ``FloatDistribution`` / ``IntDistribution``,
  log-uniform when ``scale: log``; ``random`` draws uniformly in the scale).

``parse_domain`` turns either form into a tuple of choices or a ``Range``; every bad domain is one
``InputError`` naming the key and the fix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

from aisim.simulator.errors import InputError

__all__ = ["Range", "parse_domain", "parse_range", "is_domain", "upper", "has_range"]

_RANGE_KEYS = frozenset({"min", "max", "step", "scale"})


@dataclass(frozen=True)
class Range:
    """A continuous search domain (no step): ``low``..``high``, integers or floats, linear or log."""

    low: float
    high: float
    log: bool = False
    integer: bool = False

    def distribution(self):
        from optuna.distributions import FloatDistribution, IntDistribution

        if self.integer:
            return IntDistribution(int(self.low), int(self.high), log=self.log)
        return FloatDistribution(float(self.low), float(self.high), log=self.log)

    def to_dict(self) -> dict:
        """The domain as written (``{range: {min, max, scale}}``)."""
        return {"range": {"min": self.low, "max": self.high, "scale": "log" if self.log else "linear"}}

    def contains(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, Real):
            return False
        if self.integer and not float(value).is_integer():
            return False
        return self.low <= value <= self.high

    def draw(self, rng) -> float | int:
        """One uniform draw (in the log scale for ``log``) from a numpy ``Generator``."""
        if self.log:
            x = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        else:
            x = float(rng.uniform(self.low, self.high))
        if self.integer:
            return int(min(self.high, max(self.low, round(x))))
        return x


def upper(domain: Any) -> Any:
    """The largest value of a domain (a tuple of choices or a ``Range``)."""
    return domain.high if isinstance(domain, Range) else max(domain)


def has_range(choices: dict) -> bool:
    """Some knob of ``choices`` (knob -> choices or ``Range``) is continuous."""
    return any(isinstance(v, Range) for v in choices.values())


def is_domain(value: Any) -> bool:
    """``value`` is written as a domain (``{choices}`` or ``{range}``), not as a value."""
    return isinstance(value, Mapping) and len(value) == 1 and next(iter(value)) in ("choices", "range")


def _number(value: Any, where: str, integer: bool) -> float | int:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise InputError(where, f"must be a finite number, got {value!r}")
    if integer:
        if not isinstance(value, Integral) and not float(value).is_integer():
            raise InputError(where, f"must be an integer (the field takes integers), got {value!r}")
        return int(value)
    return float(value)


def _tidy(x: float) -> float:
    return float(f"{x:.12g}")


def parse_range(spec: Any, where: str, *, integer: bool) -> tuple | Range:
    """``{min, max, step?, scale?}`` (the mapping under ``range``) -> its choices, or a ``Range``."""
    if not isinstance(spec, Mapping):
        raise InputError(where, f"a range is a mapping {{min, max, step, scale}}, got {spec!r}")
    for key in spec:
        if key not in _RANGE_KEYS:
            raise InputError(f"{where}.{key}", "unknown range key; a range takes min, max, step and scale")
    for key in ("min", "max"):
        if key not in spec:
            raise InputError(f"{where}.{key}", "is missing: a range needs min and max")
    lo = _number(spec["min"], f"{where}.min", integer)
    hi = _number(spec["max"], f"{where}.max", integer)
    scale = spec.get("scale", "linear")
    if scale not in ("linear", "log"):
        raise InputError(f"{where}.scale", f"must be linear or log, got {scale!r}")
    step = spec.get("step")
    if lo > hi:
        raise InputError(where, f"needs min <= max (got min {lo}, max {hi})")
    if scale == "log":
        if step is not None:
            raise InputError(f"{where}.step", "a log range takes no step; remove it (or use scale: linear)")
        if lo <= 0:
            raise InputError(f"{where}.min", f"a log range needs min > 0 (got {lo})")
    if step is not None:
        step = _number(step, f"{where}.step", integer)
        if step <= 0:
            raise InputError(f"{where}.step", f"must be > 0 (got {step})")
    elif integer and scale == "linear":
        raise InputError(f"{where}.step", "is missing: an integer linear range needs a step (or use scale: log)")
    if lo == hi:
        return (lo,)
    if step is None:
        return Range(lo, hi, log=scale == "log", integer=integer)
    count = int(math.floor((hi - lo) / step + 1e-9)) + 1
    if count > 10_000:
        raise InputError(f"{where}.step", f"makes {count} choices; use a larger step (at most 10,000 choices) or drop "
                                          "the step for a continuous range")
    if integer:
        return tuple(int(lo + i * step) for i in range(count))
    return tuple(_tidy(lo + i * step) for i in range(count))


def parse_domain(value: Any, where: str, *, integer: bool | None) -> tuple | Range:
    """A value or a domain -> its choices (a tuple; one value: a one-tuple) or a ``Range``.
    ``integer`` None: the field takes no range (only values and ``{choices}``)."""
    if isinstance(value, Mapping):
        if not is_domain(value):
            raise InputError(where, f"a domain is {{choices: [...]}} or {{range: {{min, max, step, scale}}}}, got "
                                    f"{dict(value)!r}")
        key, body = next(iter(value.items()))
        if key == "choices":
            if not isinstance(body, (list, tuple)) or not body:
                raise InputError(f"{where}.choices", "must be a non-empty list of values")
            seen = []
            for v in body:
                if any(type(v) is type(w) and v == w for w in seen):
                    raise InputError(f"{where}.choices", f"lists {v!r} twice; list each value once")
                seen.append(v)
            return tuple(body)
        if integer is None:
            raise InputError(f"{where}.range", "this field takes a value or {choices: [...]}, not a range")
        return parse_range(body, f"{where}.range", integer=integer)
    if isinstance(value, (list, tuple)):
        raise InputError(where, "a bare list is not a domain here: write {choices: [...]} to search the values")
    return (value,)
