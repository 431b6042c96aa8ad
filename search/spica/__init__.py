"""Spica: the deployment-configuration search (seed "Spica Unrolled Samples", reference §7).

``space`` holds the ``search_space:`` section (``SearchSpace.from_dict``: defaults, the three
override mechanisms, every rejection), ``presets`` the reference's tables and the composite
expansions, ``shapes`` the parallel-shape checks and derived fields, and ``unroll`` the pure
``unroll_sample`` that turns one trial (selection, parallel shape, load-predictor winner) into the
flat candidate config. ``plan_branches`` says what each mode branch searches; ``run_search`` and
``resume_search`` run a search (``aisim recommend``).
"""

from aisim.search.spica.branches import BranchPlan, plan_branches
from aisim.search.spica.config import load_search_config
from aisim.search.spica.loop import SearchResult, resume_search, run_search
from aisim.search.spica.space import SearchSpace
from aisim.search.spica.unroll import unroll_sample

__all__ = ["SearchSpace", "unroll_sample", "load_search_config", "plan_branches", "BranchPlan", "run_search",
           "resume_search", "SearchResult"]
