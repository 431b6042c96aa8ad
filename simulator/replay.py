"""The replay's public Python surface in one import (kept for existing code and docs):

    from simulator.replay import run_trace_replay, run_synthetic_trace_replay, run_config
    from simulator.replay import plan_from_config, run_plan, ReplayPlan, ReplayReport

Plans live in ``simulator.plan``, running them in ``simulator.run``, the API in ``simulator.api``.
"""

from simulator.api import run_config, run_synthetic_trace_replay, run_trace_replay
from simulator.plan import ExecutionPlan, PoolPlan, ReplayPlan, plan_from_config
from simulator.run import ReplayReport, run_plan

__all__ = ["ReplayReport", "run_trace_replay", "run_synthetic_trace_replay", "run_config", "run_plan",
           "plan_from_config", "ReplayPlan", "PoolPlan", "ExecutionPlan"]
