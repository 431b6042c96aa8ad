"""Capacity search: the highest QPS a deployment sustains under an SLA (``aisim capacity``).

``algorithms`` holds the pure adaptive (doubling, then bisection) and linear searches over an
``evaluate(qps)`` callback; ``sla`` holds the SLA rules and their evaluation over a trial's
``request_metrics.csv`` and ``worker_timeline.csv`` rows.
"""
