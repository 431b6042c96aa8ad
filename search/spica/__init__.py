"""Spica: the deployment-configuration search (seed "Spica Unrolled Samples", reference §7).

``space`` holds the ``search_space:`` section (``SearchSpace.from_dict``: defaults, the three
override mechanisms, every rejection), ``presets`` the reference's tables and the composite
expansions, ``shapes`` the parallel-shape checks and derived fields, and ``unroll`` the pure
``unroll_sample`` that turns one trial (selection, parallel shape, load-predictor winner) into the
flat candidate config.
"""

from search.spica.space import SearchSpace
from search.spica.unroll import unroll_sample

__all__ = ["SearchSpace", "unroll_sample"]
