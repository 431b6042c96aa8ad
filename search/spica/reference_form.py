"""The reference's recommend form: a predict config whose fields may hold search domains, plus
``optimization`` and ``optimizer`` sections (AISimulate 0.13 ``recommend``). ``lower(data)``
turns it into the ``search_space:`` form (the seed's), which ``SearchConfig`` validates: one search
space, one loop, one ledger whichever way a search is written. docs/recommend-forms.md has the
field-by-field table; what follows is the contract.

Telling the forms apart (``is_reference_form``): a config with a ``search_space`` section is the
seed's form; one without it but with ``optimization`` or ``optimizer`` is the reference's.

Domains (``search.spica.domains``): ``{choices: [...]}`` anywhere a field is searched, ``{range:
...}`` on numeric fields; a bare list is never a domain. Lowered field by field:

- ``engine.mode`` -> ``deployment_mode`` (aggregated -> agg, disaggregated -> disagg; omitted: both,
  the reference's default domain); ``engine.backend`` -> ``backend`` (omitted: vllm and sglang);
  ``engine.model`` / ``hardware`` / ``timing`` / ``backend_version`` / ``enable_chunked_prefill`` /
  ``kv_transfer`` / ``nextn_accepted`` stay in ``engine``; ``context_length`` (a number) ->
  ``context_length``, ``nextn`` -> ``aic_nextn``. ``hardware: auto`` takes the one GPU named in
  ``optimization.hardware``.
- ``engine.workers.<role>`` (aggregated -> ``agg_``, ``prefill_``, ``decode_``):
  ``scheduler.max_batched_tokens`` / ``max_sequences`` -> ``<role>_max_num_batched_tokens`` /
  ``_max_num_seqs`` (omitted: the seed's default grids, which are the reference's default domains);
  ``kv_cache.block_size``, ``prefix_caching``, ``capacity.memory_fraction`` -> the role's pinned
  ``_block_size``, ``_enable_prefix_caching``, ``_gpu_memory_utilization`` (one value each);
  ``startup_seconds`` -> ``startup_time``; ``timing`` -> ``engine.timing`` (one for every role).
- ``parallelism.preset``: ``default`` (or no ``parallelism``) enumerates the valid shapes (empty
  ``parallel_configs``); a list of complete shapes pins them; ``false`` takes the dims given
  (``replicas``, ``tensor``, ``pipeline``, ``attention_data``, ``moe_tensor``, ``moe_expert``, each
  a value or an integer domain) as filters on the enumerated shapes - an omitted dim is free, as in
  the reference - and the shapes that pass become ``parallel_configs`` (which pins shapes for one
  deployment mode, so ``false`` with dims needs one ``engine.mode``).
- ``router.policy`` -> ``router_mode`` (omitted: round_robin and kv_router);
  ``overlap_score_credit``, ``prefill_load_scale``, ``temperature`` -> the kv-router knobs (omitted:
  their default grids); ``prefill_load_model.type`` must be ``none`` (the ``aic`` backlog model
  is not modelled: our choice is to search ``none`` only where the reference also tries ``aic``).
- No ``planner`` section: static pools (``planner_scaling_policy: [disabled]``). A ``planner``
  section: ``policy`` (disabled, enabled; default both) and each group's ``preset`` list
  (``scaling_policy``, ``fpm_sampling``, ``load_sensitivity``, ``load_predictor``: preset ids or
  dicts of their fields; ``default`` or omitted: the seed's lists, the reference's defaults) ->
  ``planner_scaling_policy`` (a disabled entry kept when the policy lists disabled, only scaling
  entries when it is enabled only), ``planner_fpm_sampling``, ``planner_load_sensitivity``,
  ``load_predictor_candidates``.
- ``optimization`` (``target``, ``strict_sla``, ``constraints``; ``hardware``) and ``optimizer``,
  ``traffic``, ``evaluation``, ``execution``, ``study``, ``dgd`` carry over;
  ``constraints.max_candidate_gpus`` is also the space's ``gpu_budget`` (the reference's budget).

Refused with a one-line error naming the key (the seed form, or a predict run, is the way): a
domain where no search reads one (traffic load fields, per-role block size or memory fraction,
scheduler fields other than the two batching limits), the planner's independent knobs (write
their values as dicts in the seed's composites), host offload and n-gram speculation,
per-role hardware other than the engine's, fixed KV capacities.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aisim.search.spica.domains import Range, is_domain, parse_domain
from aisim.simulator.errors import InputError

__all__ = ["is_reference_form", "lower", "search_space_form"]

SECTIONS = ("engine", "router", "planner", "traffic", "evaluation", "execution", "optimization", "optimizer",
            "study", "dgd")
MODE = {"aggregated": "agg", "disaggregated": "disagg"}
ROLE_PREFIX = {"aggregated": "agg", "prefill": "prefill", "decode": "decode"}
ROLES_OF = {"agg": ("aggregated",), "disagg": ("prefill", "decode")}
DIMS = {"replicas": "replicas", "tensor": "tp", "pipeline": "pp", "attention_data": "attention_dp",
        "moe_tensor": "moe_tp", "moe_expert": "moe_ep"}
ROUTER_KNOBS = {"overlap_score_credit": "overlap_score_credit", "prefill_load_scale": "prefill_load_scale",
                "temperature": "router_temperature"}
_ENGINE_KEYS = {"mode", "model", "hardware", "backend", "backend_version", "context_length", "workers", "kv_transfer",
                "enable_chunked_prefill", "nextn", "nextn_accepted", "speculation"}
_WORKER_KEYS = {"hardware", "context_length", "parallelism", "scheduler", "kv_cache", "timing", "startup_seconds"}


def is_reference_form(data: Mapping) -> bool:
    """A recommend config written in the reference's form (no ``search_space``, but a search's
    ``optimization`` or ``optimizer`` section)."""
    return "search_space" not in data and ("optimization" in data or "optimizer" in data)


def _mapping(value: Any, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InputError(where, f"must be a mapping, got {type(value).__name__}")
    return dict(value)


def _unknown(section: Mapping, allowed: set[str], where: str, hint: str = "") -> None:
    for key in section:
        if key not in allowed:
            raise InputError(f"{where}.{key}", f"unknown key (allowed: {', '.join(sorted(allowed))}){hint}")


def _choices(value: Any, where: str, allowed: Mapping[str, str] | None = None) -> list:
    """A categorical field's value or ``{choices}`` -> the list (mapped through ``allowed``)."""
    got = parse_domain(value, where, integer=None)
    if allowed is None:
        return list(got)
    for v in got:
        if v not in allowed:
            raise InputError(where, f"{v!r} is not one of {', '.join(allowed)}")
    return [allowed[v] for v in got]


def _numeric(value: Any, where: str, *, integer: bool) -> list | dict:
    """A numeric field's value or domain -> the seed's list, or ``{range: ...}`` when continuous."""
    got = parse_domain(value, where, integer=integer)
    return got.to_dict() if isinstance(got, Range) else list(got)


def _one(value: Any, where: str, what: str) -> Any:
    """A field aisim's search pins: one value (a one-choice domain is that value)."""
    if is_domain(value):
        got = parse_domain(value, where, integer=False)
        if isinstance(got, Range) or len(got) != 1:
            raise InputError(where, f"aisim's search pins {what}: give one value (run one search per value to "
                                    "compare them)")
        return got[0]
    return value


def _no_domains(node: Any, where: str, why: str) -> None:
    if is_domain(node):
        raise InputError(where, f"holds a search domain, but {why}; give one value")
    if isinstance(node, Mapping):
        for k, v in node.items():
            _no_domains(v, f"{where}.{k}", why)


# -- the engine ------------------------------------------------------------------------------
def _engine(engine: dict, optimization: dict, space: dict) -> tuple[dict, dict]:
    """(the seed's ``engine`` section, the worker sections by role); fills ``space``."""
    _unknown(engine, _ENGINE_KEYS, "engine")
    out: dict[str, Any] = {}
    space["deployment_mode"] = _choices(engine.get("mode", {"choices": ["aggregated", "disaggregated"]}),
                                        "engine.mode", MODE)
    space["backend"] = _choices(engine.get("backend", {"choices": ["vllm", "sglang"]}), "engine.backend",
                                {b: b for b in ("vllm", "sglang", "trtllm")})
    if "model" not in engine:
        raise InputError("engine.model", "is missing: name the model (a Hugging Face id or a local directory)")
    out["model"] = engine["model"]
    out["hardware"] = _hardware(engine.get("hardware"), optimization)
    for key in ("backend_version", "enable_chunked_prefill", "kv_transfer", "nextn_accepted"):
        if key in engine:
            if key == "backend_version" and isinstance(engine[key], Mapping):
                raise InputError("engine.backend_version", "give one version (text); aisim's search runs one "
                                                           "version per backend")
            _no_domains(engine[key], f"engine.{key}", "aisim does not search it")
            out[key] = engine[key]
    ctx = _one(engine.get("context_length", "max"), "engine.context_length", "the context length")
    if ctx != "max":
        space["context_length"] = ctx
    nextn = _one(engine.get("nextn", 0), "engine.nextn", "the MTP draft count")
    if nextn:
        space["aic_nextn"] = nextn
    if engine.get("speculation") is not None:
        raise InputError("engine.speculation", "n-gram speculation is not searched; run its candidates with aisim "
                                               "predict, or remove it")
    workers = _mapping(engine.get("workers"), "engine.workers")
    _unknown(workers, set(ROLE_PREFIX), "engine.workers")
    modes = space["deployment_mode"]
    for role in workers:
        if not any(role in ROLES_OF[m] for m in modes):
            raise InputError(f"engine.workers.{role}", f"is a role of another mode than engine.mode "
                                                       f"({', '.join(modes)}); remove it")
    return out, {role: _mapping(w, f"engine.workers.{role}") for role, w in workers.items()}


def _hardware(value: Any, optimization: dict) -> str:
    named = optimization.pop("hardware", None)
    if value is None:
        raise InputError("engine.hardware", "is missing: name the GPU (e.g. h200_sxm), or auto with "
                                            "optimization.hardware")
    if value != "auto":
        if named is not None and named not in (value, [value]):
            raise InputError("optimization.hardware", f"names {named!r} but engine.hardware is {value!r}; "
                                                      "keep one of them")
        return value
    gpus = [named] if isinstance(named, str) else list(named) if isinstance(named, (list, tuple)) else []
    if len(gpus) != 1:
        raise InputError("optimization.hardware", "engine.hardware auto needs the GPU here; aisim's search runs one "
                                                  "GPU type, so name one (run one search per GPU to compare them)")
    return gpus[0]


def _workers(workers: dict[str, dict], space: dict, engine_out: dict) -> dict[str, dict]:
    """Fill the per-role knobs; return each role's parallelism filter (dim -> choices) or pinned
    shapes (``{"shapes": [...]}``)."""
    timings, startups, filters = {}, {}, {}
    for role, w in workers.items():
        where = f"engine.workers.{role}"
        p = ROLE_PREFIX[role]
        _unknown(w, _WORKER_KEYS, where)
        hw = w.get("hardware")
        if hw is not None and hw != engine_out["hardware"]:
            raise InputError(f"{where}.hardware", f"aisim's search runs one GPU type ({engine_out['hardware']}); "
                                                  "remove the per-role hardware")
        if w.get("context_length") is not None:
            raise InputError(f"{where}.context_length", "set the context length once, in engine.context_length")
        sched = _mapping(w.get("scheduler"), f"{where}.scheduler")
        for key, knob in (("max_batched_tokens", "max_num_batched_tokens"), ("max_sequences", "max_num_seqs")):
            if key in sched:
                space[f"{p}_{knob}"] = _numeric(sched.pop(key), f"{where}.scheduler.{key}", integer=True)
        for key in sched:
            raise InputError(f"{where}.scheduler.{key}", "is not searched (aisim's search varies max_batched_tokens "
                                                         "and max_sequences); remove it")
        _kv_cache(_mapping(w.get("kv_cache"), f"{where}.kv_cache"), f"{where}.kv_cache", p, space)
        if "timing" in w:
            _no_domains(w["timing"], f"{where}.timing", "timing is not searched")
            timings[role] = w["timing"]
        if "startup_seconds" in w:
            startups[role] = _one(w["startup_seconds"], f"{where}.startup_seconds", "the startup delay")
        filters[role] = _parallelism(_mapping(w.get("parallelism"), f"{where}.parallelism"), f"{where}.parallelism")
    for what, got, key in (("timing", timings, "timing"), ("startup_seconds", startups, "startup")):
        values = list(got.values())
        if any(v != values[0] for v in values):
            first, other = list(got)[0], next(r for r, v in got.items() if v != values[0])
            raise InputError(f"engine.workers.{other}.{what}", f"differs from engine.workers.{first}.{what}; aisim's "
                                                               f"search gives every role one {what}")
        if values and key == "timing":
            engine_out["timing"] = values[0]
        elif values and values[0]:
            space["startup_time"] = values[0]
    return filters


def _kv_cache(kv: dict, where: str, p: str, space: dict) -> None:
    for key, value in kv.items():
        if key == "block_size":
            space[f"{p}_block_size"] = _one(value, f"{where}.block_size", "the KV block size per role")
        elif key == "prefix_caching":
            space[f"{p}_enable_prefix_caching"] = value
        elif key == "bytes_per_token":
            if value != "auto":
                raise InputError(f"{where}.bytes_per_token", "aisim's search derives it from the model; remove it")
        elif key == "capacity":
            cap = _mapping(value, f"{where}.capacity")
            if cap.get("type", "default") != "default" or set(cap) - {"type", "memory_fraction"}:
                raise InputError(f"{where}.capacity", "aisim's search sizes each candidate's KV cache from its memory "
                                                      "(type default); give only memory_fraction")
            if "memory_fraction" in cap:
                space[f"{p}_gpu_memory_utilization"] = _one(cap["memory_fraction"], f"{where}.capacity.memory_fraction",
                                                            "the memory fraction per role")
        elif key == "host_offload":
            raise InputError(f"{where}.host_offload", "write the offload tier in the search_space form "
                                                      "(num_g2_blocks, bandwidth_g1_to_g2_gbps, ...)")
        else:
            raise InputError(f"{where}.{key}", "unknown key (allowed: block_size, bytes_per_token, capacity, "
                                               "host_offload, prefix_caching)")


def _parallelism(par: dict, where: str) -> dict:
    """``{}`` (enumerate), ``{"shapes": [...]}`` (a preset list) or ``{"filter": {dim: choices}}``."""
    preset = par.pop("preset", "default")
    for key in ("prefill_context", "decode_context"):
        if par.pop(key, 1) != 1:
            raise InputError(f"{where}.{key}", "context parallelism is not searched; remove it")
    _unknown(par, set(DIMS), where)
    if preset == "default":
        if par:
            raise InputError(f"{where}.{next(iter(par))}", "cannot be combined with preset default (which "
                                                           "enumerates the shapes); set preset: false to filter them")
        return {}
    if isinstance(preset, list):
        if par:
            raise InputError(f"{where}.{next(iter(par))}", "cannot be combined with a preset list; put it in "
                                                           "the list's entries")
        if not preset:
            raise InputError(f"{where}.preset", "an empty list pins nothing; list shapes or use default")
        shapes = []
        for i, entry in enumerate(preset):
            e = _mapping(entry, f"{where}.preset.{i}")
            missing = [k for k in DIMS if k not in e]
            if missing:
                raise InputError(f"{where}.preset.{i}.{missing[0]}", f"is missing: a preset entry gives every dim "
                                                                     f"({', '.join(DIMS)})")
            _unknown(e, set(DIMS) | {"prefill_context", "decode_context"}, f"{where}.preset.{i}")
            shapes.append({DIMS[k]: e[k] for k in DIMS})
        return {"shapes": shapes}
    if preset not in (False, {}):
        raise InputError(f"{where}.preset", f"must be default, false or a list of shapes, got {preset!r}")
    out = {}
    for key, value in par.items():
        got = parse_domain(value, f"{where}.{key}", integer=True)
        for v in ([got.low, got.high] if isinstance(got, Range) else got):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(f"{where}.{key}", f"must be a positive integer, got {v!r}")
        out[DIMS[key]] = got
    return {"filter": out} if out else {}


def _router(router: dict, space: dict) -> None:
    _unknown(router, {"policy", "prefill_load_model", *ROUTER_KNOBS}, "router")
    space["router_mode"] = _choices(router.get("policy", {"choices": ["round_robin", "kv_router"]}), "router.policy",
                                    {"round_robin": "round_robin", "kv_router": "kv_router"})
    load = _mapping(router.get("prefill_load_model"), "router.prefill_load_model")
    _unknown(load, {"type"}, "router.prefill_load_model")
    types = _choices(load.get("type", "none"), "router.prefill_load_model.type")
    if types != ["none"]:
        raise InputError("router.prefill_load_model.type", "aisim models only none (the aic prefill-backlog model is "
                                                           "not modelled); set none or remove it")
    given = [k for k in ROUTER_KNOBS if k in router]
    if space["router_mode"] == ["round_robin"] and given:
        raise InputError(f"router.{given[0]}", "is a kv_router knob, but router.policy is round_robin only; remove "
                                               "it or add kv_router")
    for key in given:
        space[ROUTER_KNOBS[key]] = _numeric(router[key], f"router.{key}", integer=False)


_PLANNER_GROUPS = {"scaling_policy": "planner_scaling_policy", "fpm_sampling": "planner_fpm_sampling",
                   "load_sensitivity": "planner_load_sensitivity", "load_predictor": "load_predictor_candidates"}


def _planner(planner: Any, space: dict) -> None:
    """No section: static pools. A section: ``policy`` (disabled / enabled; default both) and each
    composite group's ``preset`` (default: the seed's preset list, the reference's default; a list
    of preset ids or dicts of their fields) lower to the seed's composites; ``disabled`` in the
    policy keeps a disabled entry, ``enabled`` the entries that scale."""
    if planner is None:
        space["planner_scaling_policy"] = ["disabled"]
        return
    p = _mapping(planner, "planner")
    for key in p:
        if key not in ("policy", *_PLANNER_GROUPS):
            raise InputError(f"planner.{key}", "is not read in the recommend form (only policy and the preset "
                                               "groups scaling_policy, fpm_sampling, load_sensitivity, "
                                               "load_predictor); write the search in the search_space form")
    policies = _choices(p.get("policy", {"choices": ["disabled", "enabled"]}), "planner.policy",
                        {"disabled": "disabled", "enabled": "enabled"})
    if "enabled" not in policies:
        space["planner_scaling_policy"] = ["disabled"]
        return
    for group, knob in _PLANNER_GROUPS.items():
        control = _mapping(p.get(group), f"planner.{group}")
        for key in control:
            if key != "preset":
                raise InputError(f"planner.{group}.{key}", "only a preset list is read in the recommend form; write "
                                                           f"independent values as dicts in search_space.{knob}")
        preset = control.get("preset", "default")
        if preset == "default":
            continue
        if not isinstance(preset, list) or not preset:
            raise InputError(f"planner.{group}.preset", "give default or a non-empty list of preset ids or dicts "
                                                        "(independent knobs: write the search_space form)")
        from aisim.search.spica.space import check_composite_entry

        space[knob] = [check_composite_entry(knob, e, f"planner.{group}.preset.{i}") for i, e in enumerate(preset)]
    from aisim.search.spica.presets import DEFAULTS, scaling_is_on

    entries = list(space.get("planner_scaling_policy", DEFAULTS["planner_scaling_policy"]))
    if "disabled" not in policies:
        entries = [e for e in entries if not _off(e, scaling_is_on)]
        if not entries:
            raise InputError("planner.scaling_policy.preset", "planner.policy is enabled only, but no preset turns "
                                                              "scaling on; list one that does")
    elif not any(_off(e, scaling_is_on) for e in entries):
        entries = ["disabled", *entries]
    space["planner_scaling_policy"] = entries


def _off(entry: Any, scaling_is_on) -> bool:
    try:
        return not scaling_is_on(entry)
    except (KeyError, TypeError):
        return False  # a malformed entry: the search space's own check names it


# -- the whole config ------------------------------------------------------------------------
def lower(data: Mapping) -> dict:
    """The reference-form config ``data`` in the seed's ``search_space:`` form (plain data, the
    sections ``SearchConfig`` reads)."""
    for key in data:
        if key not in SECTIONS:
            raise InputError(str(key), f"unknown section of a recommend config (allowed: {', '.join(SECTIONS)})")
    optimization = _mapping(data.get("optimization"), "optimization")
    space: dict[str, Any] = {}
    engine, workers = _engine(_mapping(data.get("engine"), "engine"), optimization, space)
    filters = _workers(workers, space, engine)
    _router(_mapping(data.get("router"), "router"), space)
    _planner(data.get("planner"), space)
    budget = _mapping(optimization.get("constraints"), "optimization.constraints").get("max_candidate_gpus")
    if budget is not None:
        space["gpu_budget"] = budget
    if "traffic" in data:
        _no_domains(data["traffic"], "traffic", "aisim's search replays one load (searching the load is "
                                                "kv_capacity_fraction's job)")
    out = {"engine": engine, **{k: data[k] for k in ("traffic", "evaluation", "execution") if k in data},
           "search_space": space, "optimization": optimization,
           **{k: data[k] for k in ("optimizer", "study", "dgd") if k in data}}
    shapes = _pinned_shapes(out, filters)
    if shapes is not None:
        space["parallel_configs"] = shapes
    return out


def _pinned_shapes(out: dict, filters: dict[str, dict]) -> list | None:
    """``parallel_configs`` from the roles' presets (None: every shape enumerated)."""
    pinned = {role: f for role, f in filters.items() if f}
    if not pinned:
        return None
    modes = out["search_space"]["deployment_mode"]
    role = next(iter(pinned))
    if len(modes) != 1:
        raise InputError(f"engine.workers.{role}.parallelism", "pins or filters shapes, which aisim does for one "
                                                               "deployment mode: set engine.mode to one mode")
    mode = modes[0]
    roles = ROLES_OF[mode]
    if mode == "disagg" and len(pinned) == 1 and "shapes" in pinned[role]:
        other = next(r for r in roles if r != role)
        raise InputError(f"engine.workers.{other}.parallelism.preset", f"the {role} shapes are pinned, so list the "
                                                                       f"{other} shapes too (or use preset: false)")
    if all("shapes" in f for f in pinned.values()):
        if mode == "agg":
            return pinned["aggregated"]["shapes"]
        return [{"prefill": p, "decode": d} for p in pinned["prefill"]["shapes"] for d in pinned["decode"]["shapes"]]
    from aisim.search.spica.branches import _shape_pool
    from aisim.search.spica.config import SearchConfig

    cfg = SearchConfig.from_dict(out)  # every other field checked; the pool the search would enumerate
    pool, skipped = _shape_pool(cfg, mode)
    if skipped is not None:
        raise InputError(f"engine.workers.{role}.parallelism", f"no shape to filter: {skipped}")

    def keep(role: str, shape: Mapping[str, int]) -> bool:
        f = filters.get(role, {})
        if "shapes" in f:
            return dict(shape) in f["shapes"]
        for dim, domain in f.get("filter", {}).items():
            ok = domain.contains(shape[dim]) if isinstance(domain, Range) else shape[dim] in domain
            if not ok:
                return False
        return True

    kept = [s for s in pool if (keep("aggregated", s) if mode == "agg"
                                else keep("prefill", s["prefill"]) and keep("decode", s["decode"]))]
    if not kept:
        raise InputError(f"engine.workers.{role}.parallelism", f"no valid {mode} shape within the GPU budget matches "
                                                               "these dims; widen them")
    return kept


def search_space_form(data: Mapping) -> dict:
    """What ``aisim recommend --print-search-space`` prints: a reference-form config lowered (the
    seed form of the same search), a seed-form config as given. Validated either way."""
    from aisim.search.spica.config import SearchConfig

    out = lower(data) if is_reference_form(data) else dict(data)
    SearchConfig.from_dict(out)
    return out
