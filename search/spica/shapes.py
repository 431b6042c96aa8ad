"""Parallel shapes: checking them and unrolling them into the flat sample's parallel fields.

A shape is one worker's parallelism plus its replica count: ``tp``, ``pp``, ``attention_dp``,
``moe_tp``, ``moe_ep``, ``replicas`` (``SHAPE_KEYS``, positive integers). An agg
``parallel_config`` is one shape; a disagg one is ``{"prefill": shape, "decode": shape}``.

Derived, never settable:

- ``strategy`` per role: ``attention_dp`` 1 -> ``tep`` if ``moe_ep`` > 1 else ``tp``; ``tp`` 1 and
  ``attention_dp`` > 1 -> ``dep`` if ``moe_ep`` > 1 else ``dtp``; both > 1 -> ``mixed`` (a fallback
  the enumerator never emits).
- ``used_gpus`` = tp x pp x attention_dp x replicas (GPUs per worker x replicas), summed over roles.

Unrolled keys: agg ``tp``, ``pp``, ``attention_dp``, ``moe_tp``, ``moe_ep``, ``strategy``,
``replicas``, ``used_gpus``; disagg the same per role with ``prefill_`` / ``decode_`` prefixes
(``replicas`` included) and one top-level ``used_gpus``.

A pinned shape (``search_space.parallel_configs`` entry) may omit dims: they default to 1. A trial's
``parallel_config`` carries all six keys per role. Model-dependent legality (KV feasibility,
dense/MoE splits) is the enumerator's, not checked here.
"""

from __future__ import annotations

from numbers import Integral
from typing import Any, Mapping

from simulator.errors import InputError

SHAPE_DIMS: tuple[str, ...] = ("tp", "pp", "attention_dp", "moe_tp", "moe_ep")
SHAPE_KEYS: tuple[str, ...] = (*SHAPE_DIMS, "replicas")
ROLES: tuple[str, ...] = ("prefill", "decode")


def strategy(shape: Mapping[str, int]) -> str:
    """``tp`` / ``tep`` / ``dep`` / ``dtp``, or ``mixed`` when both tp and attention_dp exceed 1."""
    tp, attention_dp, moe_ep = shape["tp"], shape["attention_dp"], shape["moe_ep"]
    if attention_dp == 1:
        return "tep" if moe_ep > 1 else "tp"
    if tp == 1:
        return "dep" if moe_ep > 1 else "dtp"
    return "mixed"


def num_gpus_per_worker(shape: Mapping[str, int]) -> int:
    return shape["tp"] * shape["pp"] * shape["attention_dp"]


def used_gpus(mode: str, parallel_config: Mapping[str, Any]) -> int:
    """GPUs per worker x replicas, summed over the roles (disagg)."""
    shapes = [parallel_config] if mode == "agg" else [parallel_config[role] for role in ROLES]
    return sum(num_gpus_per_worker(s) * s["replicas"] for s in shapes)


def shape_fields(shape: Mapping[str, int], prefix: str = "") -> dict[str, Any]:
    """One role's keys in emission order: the five dims, ``strategy``, ``replicas``."""
    out: dict[str, Any] = {f"{prefix}{dim}": shape[dim] for dim in SHAPE_DIMS}
    out[f"{prefix}strategy"] = strategy(shape)
    out[f"{prefix}replicas"] = shape["replicas"]
    return out


def parallel_fields(mode: str, parallel_config: Mapping[str, Any]) -> dict[str, Any]:
    """The flat sample's parallel fields of a checked ``parallel_config``."""
    if mode == "agg":
        out = shape_fields(parallel_config)
    else:
        out = {}
        for role in ROLES:
            out.update(shape_fields(parallel_config[role], f"{role}_"))
    out["used_gpus"] = used_gpus(mode, parallel_config)
    return out


# -- checks ----------------------------------------------------------------------------------
def _positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise InputError(where, f"must be a positive integer (got {value!r})")
    return int(value)


def _shape(raw: Any, where: str, *, fill: bool) -> dict[str, int]:
    """One role's shape with every key; ``fill``: omitted dims default to 1 (a pinned shape)."""
    if not isinstance(raw, Mapping):
        raise InputError(where, f"must be a mapping of {', '.join(SHAPE_KEYS)} (got {raw!r})")
    for key in raw:
        if key not in SHAPE_KEYS:
            derived = " (derived from the shape, not settable)" if key in ("strategy", "used_gpus") else ""
            raise InputError(f"{where}.{key}", f"unknown shape key{derived}; a shape takes {', '.join(SHAPE_KEYS)}")
    missing = [key for key in SHAPE_KEYS if key not in raw]
    if missing and not fill:
        raise InputError(f"{where}.{missing[0]}", f"is missing; a trial's parallel_config gives all of "
                                                  f"{', '.join(SHAPE_KEYS)}")
    return {key: _positive_int(raw.get(key, 1), f"{where}.{key}") for key in SHAPE_KEYS}


def check_parallel_config(mode: str, raw: Any, where: str, *, fill: bool = False) -> dict[str, Any]:
    """``raw`` as a complete ``parallel_config`` of ``mode`` (agg: a shape; disagg: one per role)."""
    if mode == "agg":
        if isinstance(raw, Mapping) and any(role in raw for role in ROLES):
            raise InputError(where, "is a disagg (prefill/decode) shape, but the mode is agg; give one shape "
                                    f"({', '.join(SHAPE_KEYS)})")
        return _shape(raw, where, fill=fill)
    if not isinstance(raw, Mapping):
        raise InputError(where, f"must be a mapping {{prefill: shape, decode: shape}} (got {raw!r})")
    for key in raw:
        if key not in ROLES:
            raise InputError(f"{where}.{key}", "a disagg shape takes only prefill and decode, each a mapping of "
                                               f"{', '.join(SHAPE_KEYS)}")
    for role in ROLES:
        if role not in raw:
            raise InputError(f"{where}.{role}", "is missing; a disagg shape gives both prefill and decode")
    return {role: _shape(raw[role], f"{where}.{role}", fill=fill) for role in ROLES}
