"""Retune: the Planner re-tunes router and Planner knobs window by window (``planner.retune``).

``windows`` holds the window arithmetic, ``candidates`` the ask/tell search over the knobs'
domains, ``scoring`` the score and the keep rule, ``history`` the predictor pre-sweep, and
``sweep`` the sweeps themselves: ``RetuneSweeper`` answers the Planner's sweep protocol
(``actors.planner.retune``); ``simulator.run.run_plan`` finds it through the ``aisim.sweepers``
entry point (``make_sweeper``).
"""

from aisim.search.retune.sweep import RetuneSweeper, make_sweeper

__all__ = ["RetuneSweeper", "make_sweeper"]
