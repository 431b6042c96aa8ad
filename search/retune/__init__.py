"""Retune: the Planner re-tunes router and Planner knobs window by window (``planner.retune``).

``windows`` holds the window and decision-time arithmetic; the sweep (candidates, replays, scoring)
builds on it.
"""
