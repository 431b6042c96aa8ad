"""What each deployment-mode branch of a search config searches, before any study exists.

``plan_branches(cfg)`` is the one place that decides a branch's knob choices (the planner target
filters the scaling policies), its worker shapes (``parallel_configs`` as given, or the shapes
that fit the GPU band) and, when nothing is left, why the branch is skipped. The search loop
(``search.spica.loop``) opens a study per branch it returns unskipped; ``aisim validate`` shows the
same list without touching a study.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aisim.search.spica.domains import has_range, upper

__all__ = ["BranchPlan", "plan_branches"]


@dataclass(frozen=True)
class BranchPlan:
    mode: str  # agg | disagg
    index: int  # the branch's position in the config (its sampler stream)
    choices: dict  # knob -> its choices (after the planner-target filter)
    shapes: list  # worker shapes (dicts in the seed's names); [] when skipped
    skipped: str | None  # why the branch has no candidate, or None

    def grid_size(self, continuous: bool) -> int | None:
        """Points of the branch's grid (None when skipped or a knob is continuous)."""
        if self.skipped is not None or continuous or has_range(self.choices):
            return None
        return int(math.prod(len(v) for v in self.choices.values()) * max(1, len(self.shapes)))


def plan_branches(cfg) -> list[BranchPlan]:
    """One ``BranchPlan`` per mode of ``cfg.branches`` (a validated search config), in order."""
    from aisim.search.spica.presets import scaling_fields

    space = cfg.search_space
    out = []
    for index, mode in enumerate(cfg.branches):
        choices = dict(space.branch_choices(mode))
        skipped = None
        if cfg.planner_target != "sla":  # throughput scaling needs the SLA target: drop those policies
            kept = tuple(p for p in choices["planner_scaling_policy"]
                         if not scaling_fields(p)["enable_throughput_scaling"])
            if not kept:
                skipped = (f"every planner_scaling_policy needs throughput scaling, which only the goodput "
                           f"targets run (target {cfg.optimization.target})")
            choices["planner_scaling_policy"] = kept
        shapes: list = []
        if skipped is None:
            shapes, skipped = (list(space.parallel_configs), None) if space.parallel_configs else _shape_pool(cfg, mode)
        out.append(BranchPlan(mode, index, choices, shapes, skipped))
    return out


def _shape_pool(cfg, mode: str) -> tuple[list, str | None]:
    from aisim.search.spica.shapes import num_gpus_per_worker, shape_pool, worker_shapes

    space = cfg.search_space
    model, hardware = cfg.model_name, cfg.hardware_sku
    roles = ("agg",) if mode == "agg" else ("prefill", "decode")
    by_role = {}
    for role in roles:
        tokens = upper(getattr(space, f"{role}_max_num_batched_tokens"))
        by_role[role] = worker_shapes(model, hardware, tokens, getattr(space, f"{role}_gpu_memory_utilization"),
                                      getattr(space, f"{role}_block_size"))
    lo = space.min_gpu_budget or 1
    c = cfg.optimization.constraints
    if c is not None and getattr(c, "min_candidate_gpus", None):
        lo = max(lo, c.min_candidate_gpus)
    hi = space.gpu_budget
    if c is not None and getattr(c, "max_candidate_gpus", None):
        hi = min(hi, c.max_candidate_gpus)
    pool = shape_pool(mode, by_role, lo, hi)
    if pool:
        return pool, None
    empty = [r for r in roles if not by_role[r]]
    if empty:
        return [], (f"no {empty[0]} worker of {model} on {hardware} holds its weights and a KV cache (at any "
                    "tensor/data split up to 16 GPUs)")
    least = sum(min(num_gpus_per_worker(s) for s in by_role[r]) for r in roles)
    band = f"the GPU budget of {hi}" if lo <= 1 else f"the GPU band {lo}-{hi}"
    return [], f"no {mode} worker shape fits {band} (the smallest {mode} deployment needs {least} GPUs)"
