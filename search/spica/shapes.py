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
dense/MoE splits) is the enumerator's, not checked by ``check_parallel_config``.

Enumeration and projection (one pool per branch, i.e. per deployment mode):

- ``worker_shapes(model, hardware, ...)``: the per-worker shapes (``SHAPE_DIMS``, pp 1) the model
  allows and that are KV-feasible, worker sizes 1, 2, 4, 8, 16 GPUs. KV-feasible: the replay's own
  ``kv_cache.capacity.type: default`` sizing (``simulator.catalog.kv_capacity.default_capacity``:
  weights, activation reserve, runtime overhead and NCCL reserve inside memory_fraction x GPU
  memory) leaves at least one KV block per rank, so a pool shape never fails the replay's
  ``kv_capacity`` check. Strategies per size, in this order:

  * dense models: ``tp`` (tp = size, when the attention heads split: ``tensor_split_ok``) and, for
    size > 1, ``dtp`` (attention_dp = size, tp 1). Our choice: dtp *is* enumerated for dense models.
    The reference names tp, tep, dep and dtp as the enumerated strategies and tep/dep are the MoE
    ones, so dtp only ever arises from a dense model; and the simulator models attention-DP ranks
    as ranks of one worker (one lifecycle, the router sees the ranks), not as independent replicas.
  * MoE models (the geometry has experts): size 1 is the single-GPU ``tp`` shape; for size > 1
    ``tep`` (tp = moe_ep = size, heads split) and ``dep`` (attention_dp = moe_ep = size), each when
    the expert count divides by the size. moe_tp stays 1 (no expert tensor split is enumerated).

- ``shape_pool(mode, worker_shapes_by_role, min_gpus, max_gpus)``: every ``parallel_config`` of
  the branch (worker shape x replicas; disagg: prefill x decode) with min_gpus <= used_gpus <=
  max_gpus, ordered by used_gpus, then ``canonical_order``.
- ``shape_key`` / ``shape_from_key``: a canonical string id (the search's one categorical choice
  per branch) and back. Agg: ``tp2-pp1-adp1-mtp1-mep1-x3`` (x = replicas); disagg:
  ``prefill:<shape>/decode:<shape>``.
- ``project(suggestion, pool)``: the nearest pool member to a possibly infeasible suggestion
  (``shape_distance``: L1 over log2 of every dim and the replicas, summed over roles; ties go to
  the member whose used_gpus is closest in log2, then to the pool's order). An empty pool raises
  ``ShapeProjectionError`` (reason_category ``parallel_projection``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from numbers import Integral
from typing import Any

from aisim.simulator.errors import InputError

SHAPE_DIMS: tuple[str, ...] = ("tp", "pp", "attention_dp", "moe_tp", "moe_ep")
SHAPE_KEYS: tuple[str, ...] = (*SHAPE_DIMS, "replicas")
ROLES: tuple[str, ...] = ("prefill", "decode")
STRATEGIES: tuple[str, ...] = ("tp", "tep", "dep", "dtp", "mixed")  # the canonical order (mixed: never enumerated)
WORKER_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16)


def strategy(shape: Mapping[str, int]) -> str:
    """``tp`` / ``tep`` / ``dep`` / ``dtp``, or ``mixed`` when both tp and attention_dp exceed 1."""
    tp, attention_dp, moe_ep = shape["tp"], shape["attention_dp"], shape["moe_ep"]
    if attention_dp == 1:
        return "tep" if moe_ep > 1 else "tp"
    if tp == 1:
        return "dep" if moe_ep > 1 else "dtp"
    return "mixed"


def num_gpus_per_worker(shape: Mapping[str, int]) -> int:
    """GPUs per worker of a shape in the seed's names (``simulator.deployment.gpus_per_worker``)."""
    from aisim.simulator.deployment import gpus_per_worker

    return gpus_per_worker(tensor=shape["tp"], pipeline=shape["pp"], attention_data=shape["attention_dp"])


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


# -- enumeration -----------------------------------------------------------------------------
class ShapeProjectionError(InputError):
    """No feasible shape to project a suggestion onto (an empty pool). A Spica candidate that fails
    this way is recorded with ``reason_category`` ``parallel_projection``; the error's ``category``
    stays InputError's ``invalid_config`` (``simulator.errors.CATEGORIES`` has no projection kind)."""

    reason_category = "parallel_projection"


def _worker(tp: int = 1, attention_dp: int = 1, moe_tp: int = 1, moe_ep: int = 1) -> tuple[int, ...]:
    return (tp, 1, attention_dp, moe_tp, moe_ep)  # SHAPE_DIMS order, pp 1


def _candidates(num_experts: int, config: Mapping[str, Any], size: int) -> list[tuple[int, ...]]:
    """The shapes of ``size`` GPUs the model allows, in strategy order (tp, tep, dep, dtp)."""
    from aisim.simulator.catalog.models import tensor_split_ok

    heads_split = size == 1 or tensor_split_ok(dict(config), size) is not False  # None: heads unknown, allowed
    if size == 1:
        return [_worker()]
    out: list[tuple[int, ...]] = []
    if num_experts:
        if num_experts % size == 0:
            if heads_split:
                out.append(_worker(tp=size, moe_ep=size))  # tep
            out.append(_worker(attention_dp=size, moe_ep=size))  # dep
    else:
        if heads_split:
            out.append(_worker(tp=size))  # tp
        out.append(_worker(attention_dp=size))  # dtp
    return out


@lru_cache(maxsize=256)
def _worker_shapes(model: str, hardware: str, max_batched_tokens: int, memory_fraction: float, block_size: int,
                   sizes: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    from aisim.simulator.catalog.hardware import get_hardware
    from aisim.simulator.catalog.models import geometry_of, resolve_model
    from aisim.simulator.deployment import ParallelShape, size_kv

    src = resolve_model(model, "search_space.model_name")
    geometry = geometry_of(src, "search_space.model_name")
    hw = get_hardware(hardware, "search_space.hardware_sku")
    out = []
    for size in sizes:
        for dims in _candidates(geometry.num_experts, src.config, size):
            tp, pp, attention_dp, moe_tp, moe_ep = dims
            shape = ParallelShape(tensor=tp, pipeline=pp, attention_data=attention_dp, moe_tensor=moe_tp,
                                  moe_expert=moe_ep)
            sizing = size_kv(geometry, hw, backend="vllm", block_size=block_size, max_batched_tokens=max_batched_tokens,
                             shape=shape, memory_fraction=memory_fraction)
            if sizing.blocks_per_rank >= 1:
                out.append(dims)
    return tuple(out)


def worker_shapes(model: str, hardware: str, max_batched_tokens: int = 8192, memory_fraction: float = 0.9,
                  block_size: int = 64, sizes: Iterable[int] = WORKER_SIZES) -> list[dict[str, int]]:
    """The KV-feasible per-worker shapes (``SHAPE_DIMS``, pp 1) of ``model`` on ``hardware``, by GPUs
    per worker, then strategy (tp, tep, dep, dtp); see the module docstring for which strategies.
    ``max_batched_tokens`` sizes the activation reserve, ``memory_fraction`` is the engine's
    ``gpu_memory_utilization``. Memoised per arguments (each call returns fresh dicts)."""
    mbt = _positive_int(max_batched_tokens, "max_batched_tokens")
    bs = _positive_int(block_size, "block_size")
    if isinstance(memory_fraction, bool) or not isinstance(memory_fraction, (int, float)) \
            or not 0 < memory_fraction <= 1:
        raise InputError("memory_fraction", f"must be in (0, 1] (got {memory_fraction!r})")
    size_list = sorted({_positive_int(s, "sizes") for s in sizes})
    found = _worker_shapes(model, hardware, mbt, float(memory_fraction), bs, tuple(size_list))
    return [dict(zip(SHAPE_DIMS, dims)) for dims in found]


def canonical_order(parallel_config: Mapping[str, Any]) -> tuple[int, ...]:
    """The sort key after used_gpus: per role (prefill first) GPUs per worker, strategy (tp, tep,
    dep, dtp, mixed), then the dims and replicas."""
    shapes = [parallel_config[r] for r in ROLES] if any(r in parallel_config for r in ROLES) else [parallel_config]
    return tuple(v for s in shapes for v in (num_gpus_per_worker(s), STRATEGIES.index(strategy(s)),
                                             *(s[k] for k in SHAPE_KEYS)))


def _role_options(shapes: Sequence[Mapping[str, int]], role: str, cap: int, max_replicas: int) -> list[dict[str, int]]:
    """Every (worker shape x replicas) of one role using at most ``cap`` GPUs, by GPUs then canonical order."""
    seen: set[tuple[int, ...]] = set()
    out = []
    for i, raw in enumerate(shapes):
        where = f"worker_shapes.{role}.{i}"
        if isinstance(raw, Mapping) and "replicas" in raw:
            raise InputError(f"{where}.replicas", "a worker shape has no replicas; the pool adds them")
        shape = _shape(raw, where, fill=True)
        dims = tuple(shape[d] for d in SHAPE_DIMS)
        if dims in seen:
            continue
        seen.add(dims)
        gpus = num_gpus_per_worker(shape)
        for replicas in range(1, max_replicas + 1):
            if gpus * replicas > cap:
                break
            out.append({**shape, "replicas": replicas})
    out.sort(key=lambda s: (num_gpus_per_worker(s) * s["replicas"], canonical_order(s)))
    return out


def shape_pool(mode: str, worker_shapes_by_role: Mapping[str, Sequence[Mapping[str, int]]], min_gpus: int | None,
               max_gpus: int, max_replicas: int = 64) -> list[dict[str, Any]]:
    """Every ``parallel_config`` of the ``mode`` branch with ``min_gpus`` (None: 1) <= used_gpus <=
    ``max_gpus``, replicas 1 .. ``max_replicas`` per role: agg reads ``worker_shapes_by_role["agg"]``,
    disagg ``["prefill"]`` and ``["decode"]``. Ordered by used_gpus, then ``canonical_order``."""
    if mode not in ("agg", "disagg"):
        raise InputError("deployment_mode", f"must be agg or disagg (got {mode!r})")
    lo = 1 if min_gpus is None else _positive_int(min_gpus, "min_gpu_budget")
    hi = _positive_int(max_gpus, "gpu_budget")
    max_replicas = _positive_int(max_replicas, "max_replicas")
    roles = ("agg",) if mode == "agg" else ROLES
    missing = [role for role in roles if role not in worker_shapes_by_role]
    if missing:
        raise ValueError(f"shape_pool({mode!r}) needs worker shapes for {', '.join(roles)}; "
                         f"missing {', '.join(missing)}")
    if mode == "agg":
        options = _role_options(worker_shapes_by_role["agg"], "agg", hi, max_replicas)
        return [s for s in options if used_gpus("agg", s) >= lo]
    prefill = _role_options(worker_shapes_by_role["prefill"], "prefill", hi - 1, max_replicas)
    decode = _role_options(worker_shapes_by_role["decode"], "decode", hi - 1, max_replicas)
    pool = []
    for p in prefill:
        p_gpus = used_gpus("agg", p)
        for d in decode:
            total = p_gpus + used_gpus("agg", d)
            if total > hi:
                break  # decode options ascend in GPUs
            if total >= lo:
                pool.append({"prefill": dict(p), "decode": dict(d)})
    pool.sort(key=lambda c: (used_gpus("disagg", c), canonical_order(c)))
    return pool


# -- keys ------------------------------------------------------------------------------------
_KEY_ABBREV: tuple[tuple[str, str], ...] = (("tp", "tp"), ("pp", "pp"), ("attention_dp", "adp"), ("moe_tp", "mtp"),
                                            ("moe_ep", "mep"), ("replicas", "x"))
_ROLE_KEY = re.compile("-".join(f"{abbrev}([1-9][0-9]*)" for _, abbrev in _KEY_ABBREV))
_DISAGG_KEY = re.compile(r"prefill:([^/]*)/decode:([^/]*)")
KEY_FORMAT = "tp<n>-pp<n>-adp<n>-mtp<n>-mep<n>-x<replicas>, or prefill:<that>/decode:<that> for disagg"


def _role_key(shape: Mapping[str, int]) -> str:
    return "-".join(f"{abbrev}{shape[key]}" for key, abbrev in _KEY_ABBREV)


def shape_key(parallel_config: Mapping[str, Any]) -> str:
    """The canonical string id of a shape (omitted dims are 1, as in a pinned shape):
    ``tp2-pp1-adp1-mtp1-mep1-x3``; disagg ``prefill:<shape>/decode:<shape>``."""
    if isinstance(parallel_config, Mapping) and any(role in parallel_config for role in ROLES):
        checked = check_parallel_config("disagg", parallel_config, "parallel_config", fill=True)
        return "/".join(f"{role}:{_role_key(checked[role])}" for role in ROLES)
    return _role_key(check_parallel_config("agg", parallel_config, "parallel_config", fill=True))


def _role_from_key(text: str, key: str) -> dict[str, int]:
    match = _ROLE_KEY.fullmatch(text)
    if match is None:
        raise InputError("parallel_config", f"{key!r} is not a shape key; expected {KEY_FORMAT}")
    return {name: int(value) for (name, _), value in zip(_KEY_ABBREV, match.groups())}


def shape_from_key(key: str) -> dict[str, Any]:
    """The ``parallel_config`` ``key`` names (the inverse of ``shape_key``)."""
    if not isinstance(key, str):
        raise InputError("parallel_config", f"a shape key is a string (got {key!r})")
    disagg = _DISAGG_KEY.fullmatch(key)
    if disagg is not None:
        return {role: _role_from_key(text, key) for role, text in zip(ROLES, disagg.groups())}
    return _role_from_key(key, key)


# -- projection ------------------------------------------------------------------------------
def _mode_of(parallel_config: Any) -> str:
    return "disagg" if isinstance(parallel_config, Mapping) and any(r in parallel_config for r in ROLES) else "agg"


def _shapes_of(parallel_config: Mapping[str, Any]) -> list[Mapping[str, int]]:
    return [parallel_config[r] for r in ROLES] if _mode_of(parallel_config) == "disagg" else [parallel_config]


def shape_distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """L1 distance over log2 of every dim and the replicas (``SHAPE_KEYS``), summed over the roles;
    a factor of 2 in one dim counts 1. Rounded to 1e-9 so equal sums tie exactly."""
    total = 0.0
    for x, y in zip(_shapes_of(a), _shapes_of(b)):
        total += sum(abs(math.log2(x[k]) - math.log2(y[k])) for k in SHAPE_KEYS)
    return round(total, 9)


def project(suggestion: Mapping[str, Any], pool: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The member of ``pool`` nearest to ``suggestion`` (omitted dims are 1): least ``shape_distance``,
    then used_gpus closest in log2, then first in the pool's order (``shape_pool``'s: fewer GPUs
    first). A suggestion of the other mode, or malformed, raises InputError; an empty pool raises
    ``ShapeProjectionError`` (reason_category ``parallel_projection``)."""
    mode = _mode_of(pool[0]) if pool else _mode_of(suggestion)
    target = check_parallel_config(mode, suggestion, "parallel_config", fill=True)
    if not pool:
        raise ShapeProjectionError(
            "parallel_config",
            f"no feasible {mode} parallel shape to project {shape_key(target)} onto: the branch's pool is empty (no "
            "KV-feasible worker shape fits between min_gpu_budget and gpu_budget); raise gpu_budget, lower "
            "min_gpu_budget, or pick a GPU with more memory")
    target_gpus = math.log2(used_gpus(mode, target))

    def rank(item: tuple[int, Mapping[str, Any]]) -> tuple[float, float, int]:
        index, member = item
        gap = round(abs(math.log2(used_gpus(mode, member)) - target_gpus), 9)
        return shape_distance(target, member), gap, index

    _, best = min(enumerate(pool), key=rank)
    return check_parallel_config(mode, best, "parallel_config")
