"""Retune scoring and the keep rule (reference §6.4, our choices where it is open).

- Score of a window replay = goodput output tokens per GPU-hour under the scoring SLA (it ranks
  like goodput when the replicas are fixed, and charges a candidate the GPUs its Planner adds).
- Improvement % = (best - current) / current x 100; any positive best beats a current score of 0.
- The current point is kept unless the best candidate's improvement is strictly more than
  ``min_improvement_percentage``.
"""

from __future__ import annotations

import math


def score(summary: dict) -> float:
    """Goodput output tokens per GPU-hour of a window replay's summary (0 when nothing met the SLA)."""
    tokens = summary.get("goodput_output_tokens") or 0
    gpu_hours = summary.get("gpu_hours") or 0.0
    return tokens / gpu_hours if gpu_hours > 0 else 0.0


def improvement_pct(current: float, best: float) -> float:
    if current > 0:
        return (best - current) / current * 100.0
    return math.inf if best > 0 else 0.0


def should_switch(current: float, best: float, min_improvement_percentage: float) -> bool:
    if current > 0:  # (best - current) / current x 100 > threshold, without the division's rounding
        return (best - current) * 100.0 > min_improvement_percentage * current
    return best > 0
