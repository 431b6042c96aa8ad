"""Capacity search: the highest QPS a deployment sustains under an SLA (``aisim capacity``).

``algorithms`` holds the pure adaptive (doubling, then bisection) and linear searches over an
``evaluate(qps)`` callback; ``sla`` the SLA rules and their evaluation over a trial's
``request_metrics.csv`` and ``worker_timeline.csv`` rows; ``config`` the strict config;
``runner`` the jobs, trials (replays through ``search.fanout``), the trial cache and the outputs.

    from aisim.search.capacity import run_capacity_search
    result = run_capacity_search("configs/capacity-search.yaml", "out/capacity")
    result.jobs[0].max_qps_under_sla
"""

from aisim.search.capacity.runner import CapacityResult, JobResult, run_capacity_search

__all__ = ["run_capacity_search", "CapacityResult", "JobResult"]
