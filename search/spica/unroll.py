"""``unroll_sample``: one trial's point in the search space as a flat, self-contained config dict.

A trial is a ``selection`` (knob -> chosen value, as a sampler draws it in one branch: see
``SearchSpace.branch_choices``; a composite's value is a preset id or the dict itself), the
``parallel_config`` the sampler selected or projected (all six shape keys; disagg one shape per
role) and the ``load_predictor`` pre-sweep result (``{"best_by_interval": {"180": winner}}`` or
None). A pinned knob (one choice) may be left out of the selection; ``kv_load_ratio`` (a number
> 0) may ride along for the candidate's KV-load step and is not emitted; a knob the branch does not
search, a value that is not one of the space's choices, or a missing searched knob is rejected
(``InputError`` with ``where`` ``selection.<knob>``, ``parallel_config...`` or ``load_predictor...``).

The flat dict holds only what the trial's mode, router and planner state use (irrelevant keys are
absent, never sentinels), in the seed's order:

1. ``deployment_mode``, ``backend``;
2. pinned scalars, always: ``model_name``, ``hardware_sku``, ``gpu_budget``, ``min_gpu_budget``,
   ``min_endpoint``, ``context_length``, ``startup_time``, ``aic_nextn``, then the KV-manager offload
   fields ``num_g2_blocks``, ``kv_bytes_per_token``, ``bandwidth_g1_to_g2_gbps``,
   ``bandwidth_g2_to_g1_gbps``, ``offload_batch_size`` (the seed's ``_DEPLOYMENT_PINNED`` +
   ``_KV_MANAGER`` in the space's field order). They are deployment-level fields, emitted once;
   applying the G2 offload to agg and prefill workers but never to disaggregated decode is the
   deployment generator's job;
3. parallel fields (``search.spica.shapes``) with the derived ``strategy`` and ``used_gpus``;
4. the active branch's engine knobs: its batching knobs (selection), then its pinned per-role
   scalars (space);
5. ``router_mode``; under ``kv_router`` only: ``overlap_score_credit``, ``prefill_load_scale``, the
   cache-hit weights when selected, ``router_temperature`` (the space's field order), then the four
   pinned admission fields;
6. ``planner_scaling_policy`` (the raw entry: preset id or dict), ``enable_throughput_scaling``,
   ``enable_load_scaling``; when either is on also both intervals, the fpm pair and the
   sensitivity pair (stop after the flags when both are off);
7. under throughput scaling only, the predictor winner for the policy's throughput interval
   (``best_by_interval[str(interval)]``; missing or null: no predictor fields): ``load_predictor``,
   ``load_predictor_log1p`` (default false) and the family's own knobs (missing ones default;
   another family's keys and any other key of the winner record are never emitted).

Pure: plain JSON in and out, no I/O; the same arguments give the same dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aisim.search.spica.domains import Range
from aisim.search.spica.presets import (
    PREDICTOR_FAMILY_KEYS,
    fpm_fields,
    load_sensitivity_fields,
    predictor_fields,
    scaling_fields,
)
from aisim.search.spica.shapes import check_parallel_config, parallel_fields
from aisim.search.spica.space import (
    BATCHING_KNOBS,
    CACHE_HIT_WEIGHTS,
    DEPLOYMENT_PINNED,
    ENGINE_PINNED,
    KV_MANAGER,
    KV_ROUTER_KNOBS,
    MODES,
    PLANNER_TUNING,
    ROUTER_ADMISSION,
    SearchSpace,
    check_field_value,
    same_value,
    show,
)
from aisim.simulator.errors import InputError

__all__ = ["unroll_sample", "resolve_selection"]


def unroll_sample(space: SearchSpace, selection: Mapping[str, Any], parallel_config: Mapping[str, Any],
                  load_predictor: Mapping[str, Any] | None) -> dict[str, Any]:
    """The flat config dict of one trial (see the module docstring for its keys and order)."""
    if not isinstance(space, SearchSpace):
        raise TypeError(f"space must be a SearchSpace (SearchSpace.from_dict), not {type(space).__name__}")
    chosen = resolve_selection(space, selection)
    mode = chosen["deployment_mode"]
    shape = _checked_shape(space, mode, parallel_config)
    winners = _winners(load_predictor)
    flat: dict[str, Any] = {"deployment_mode": mode, "backend": chosen["backend"]}
    flat.update({knob: getattr(space, knob) for knob in (*DEPLOYMENT_PINNED, *KV_MANAGER)})
    flat.update(parallel_fields(mode, shape))
    flat.update(_engine_fields(space, chosen, mode))
    flat.update(_router_fields(space, chosen))
    flat.update(_planner_fields(chosen))
    if flat["enable_throughput_scaling"]:
        flat.update(_predictor_fields(winners, flat["throughput_adjustment_interval_seconds"]))
    return flat


# -- the selection ---------------------------------------------------------------------------
def resolve_selection(space: SearchSpace, selection: Mapping[str, Any]) -> dict[str, Any]:
    """Every knob of the trial's branch with its chosen value (the space's own copy of it), in
    emission order; a pinned knob left out takes its one value."""
    if not isinstance(selection, Mapping):
        raise InputError("selection", f"must be a mapping of knob -> chosen value, not {type(selection).__name__}")
    mode = _selected_mode(space, selection)
    choices = space.branch_choices(mode)
    for knob in selection:
        if knob == "kv_load_ratio":  # the candidate's KV-load step consumes it (materialize.resolve_load)
            ratio = selection[knob]
            if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio < float("inf"):
                raise InputError("selection.kv_load_ratio", f"must be a number > 0, got {ratio!r}")
            continue
        if knob not in choices:
            raise InputError(f"selection.{knob}", _not_searched(space, knob, mode))
    return {knob: _chosen(knob, options, selection) for knob, options in choices.items()}


def _selected_mode(space: SearchSpace, selection: Mapping[str, Any]) -> str:
    if "deployment_mode" not in selection and len(space.deployment_mode) == 1:
        return space.deployment_mode[0]
    return _chosen("deployment_mode", space.deployment_mode, selection)


def _chosen(knob: str, options: tuple | Range, selection: Mapping[str, Any]) -> Any:
    if isinstance(options, Range):
        if knob not in selection:
            raise InputError(f"selection.{knob}", f"is missing: this branch searches it in {options.to_dict()}")
        value = selection[knob]
        if not options.contains(value):
            raise InputError(f"selection.{knob}", f"{value!r} is outside search_space.{knob} {options.to_dict()}")
        return int(value) if options.integer else float(value)
    if knob not in selection:
        if len(options) == 1:
            return options[0]
        raise InputError(f"selection.{knob}", f"is missing: this branch searches it; give one of {show(options)}")
    value = selection[knob]
    for option in options:
        if same_value(value, option):
            return option
    raise InputError(f"selection.{knob}", f"{show([value])} is not a choice of search_space.{knob} "
                                          f"({show(options)}); give one of them")


def _not_searched(space: SearchSpace, knob: str, mode: str) -> str:
    """Why the ``mode`` branch does not search ``knob``."""
    if knob in CACHE_HIT_WEIGHTS and space.kv_router_searched:
        return "is searched only with multi-tier offload (num_g2_blocks > 0), which this space leaves off; remove it"
    if knob in KV_ROUTER_KNOBS:
        return "is a kv_router knob, but this space routes round_robin only; remove it"
    if knob in PLANNER_TUNING:
        return "is searched only when a planner_scaling_policy turns scaling on (every policy here is disabled); " \
               "remove it"
    other = [m for m in MODES if m != mode and knob in BATCHING_KNOBS[m]]
    if other:
        return f"is a {other[0]} knob; the {mode} branch does not search it; remove it"
    if knob == "load_predictor_candidates":
        return "is chosen by the load-predictor pre-sweep, not the sampler; pass its result as load_predictor"
    if knob in type(space).model_fields:
        return "is pinned by the search space, never searched; remove it"
    return f"is not searched in the {mode} branch ({', '.join(space.branch_choices(mode))}); remove it"


# -- the parallel shape ----------------------------------------------------------------------
def _checked_shape(space: SearchSpace, mode: str, parallel_config: Any) -> dict[str, Any]:
    shape = check_parallel_config(mode, parallel_config, "parallel_config")
    if space.parallel_configs and not any(shape == pinned for pinned in space.parallel_configs):
        raise InputError("parallel_config", "is not one of the shapes search_space.parallel_configs pins; pass one "
                                            "of them (omitted dims there are 1)")
    return shape


# -- sections --------------------------------------------------------------------------------
def _engine_fields(space: SearchSpace, chosen: Mapping[str, Any], mode: str) -> dict[str, Any]:
    out = {knob: chosen[knob] for knob in BATCHING_KNOBS[mode]}
    out.update({knob: getattr(space, knob) for knob in ENGINE_PINNED[mode]})
    return out


def _router_fields(space: SearchSpace, chosen: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"router_mode": chosen["router_mode"]}
    if chosen["router_mode"] != "kv_router":
        return out
    out.update({knob: chosen[knob] for knob in KV_ROUTER_KNOBS if knob in chosen})
    out.update({knob: getattr(space, knob) for knob in ROUTER_ADMISSION})
    return out


def _planner_fields(chosen: Mapping[str, Any]) -> dict[str, Any]:
    policy = chosen["planner_scaling_policy"]
    scaling = scaling_fields(policy)
    out: dict[str, Any] = {
        "planner_scaling_policy": policy if isinstance(policy, str) else dict(policy),
        "enable_throughput_scaling": scaling["enable_throughput_scaling"],
        "enable_load_scaling": scaling["enable_load_scaling"],
    }
    if not (out["enable_throughput_scaling"] or out["enable_load_scaling"]):
        return out
    out["throughput_adjustment_interval_seconds"] = scaling["throughput_adjustment_interval_seconds"]
    out["load_adjustment_interval_seconds"] = scaling["load_adjustment_interval_seconds"]
    out.update(fpm_fields(chosen["planner_fpm_sampling"]))
    out.update(load_sensitivity_fields(chosen["planner_load_sensitivity"]))
    return out


# -- the load predictor ----------------------------------------------------------------------
def _winners(load_predictor: Any) -> Mapping[str, Any]:
    """``load_predictor.best_by_interval`` (empty when there is no pre-sweep result). Other keys of
    the result (scores, timings) are ignored."""
    if load_predictor is None:
        return {}
    if not isinstance(load_predictor, Mapping) or not isinstance(load_predictor.get("best_by_interval"), Mapping):
        raise InputError("load_predictor.best_by_interval", "is missing or not a mapping; give "
                                                            "{best_by_interval: {'<throughput interval>': winner}} or "
                                                            "None (no pre-sweep)")
    winners = load_predictor["best_by_interval"]
    for key in winners:
        if not isinstance(key, str):
            raise InputError("load_predictor.best_by_interval", f"keys are throughput intervals in seconds as strings "
                                                                f"('180'), got {key!r}")
    return winners


def _predictor_fields(winners: Mapping[str, Any], interval_s: int) -> dict[str, Any]:
    winner = winners.get(str(interval_s))
    if winner is None:
        return {}
    where = f"load_predictor.best_by_interval.{interval_s}"
    if not isinstance(winner, Mapping):
        raise InputError(where, f"must be the winner's fields (load_predictor, ...), not {winner!r}")
    if "load_predictor" not in winner:
        raise InputError(f"{where}.load_predictor", "is missing: a predictor winner names its family "
                                                    "(constant, arima, prophet, kalman)")
    family = check_field_value("load_predictor", winner["load_predictor"], f"{where}.load_predictor")
    own = ("load_predictor_log1p", *PREDICTOR_FAMILY_KEYS[family])
    checked = {key: check_field_value(key, winner[key], f"{where}.{key}") for key in own if key in winner}
    return predictor_fields({"load_predictor": family, **checked})
