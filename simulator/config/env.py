"""Environment settings (``AISIM_*``), validated like config keys: a bad value is one line naming
the variable (an ``InputError``, exit code 2), never a traceback. Read them when they are needed,
not at import, so importing a module never fails on one."""

from __future__ import annotations

import math
import os

from aisim.simulator.errors import InputError


def env_float(name: str, default: float, *, minimum: float = 0.0, inclusive: bool = False,
              unit: str = "seconds") -> float:
    """``$name`` as a finite float > ``minimum`` (>= with ``inclusive``); ``default`` when unset
    or empty."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    bound = f"{'>=' if inclusive else '>'} {minimum:g}"
    try:
        value = float(raw.strip())
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < minimum or (value == minimum and not inclusive):
        raise InputError(name, f"must be a number of {unit} {bound}, got {raw!r}")
    return value
